//! Deterministic mode: `d_index_k` accumulated in fixed point, so that
//! the order in which the scatter's atomic additions land cannot change a
//! bit of the result.
//!
//! Integer addition is associative; f32 addition is not. Each key row `k`
//! gets its own power-of-two scale `2^s_k`, chosen before the gradient
//! kernel runs from an upper bound on what its slots can add, and every
//! contribution `v` is added as the integer `round(v * 2^s_k)` into an
//! i32 accumulator (two per u64 word). The passes, all on the call's
//! stream:
//! 1. stage 1 (unchanged): `grad_signal`, and zeroes the accumulator;
//! 2. `det_bounds`: per query row the factor
//!    `R = |sm_scale| * sum_h |w_h| * max_d |q_hd|`, per valid slot its
//!    bound `b = |grad_signal| * R` (no element of the slot's dK row
//!    exceeds `b` by more than the tensor cores' rounding), and the
//!    call's largest bound (an integer maximum of the f32 bits);
//! 3. `det_key_sums`: per key row the sum of its slots' bounds, each
//!    rounded up to a multiple of `2^(E - QUANT_BITS)` (`E` the
//!    exponent of the largest bound), as an integer sum (a slot's bound
//!    far below the largest counts as one unit: a coarser scale for key
//!    rows whose gradients are tiny against the largest); binned per CTA
//!    in shared memory ([`split_units`], [`key_sum_grid`]), then one u64
//!    reduction per key row and CTA;
//! 4. `det_scales`: per key row the exponent `s_k` ([`key_exp`]) that
//!    puts twice that sum below `2^ACC_BITS`;
//! 5. the gradient kernel's deterministic twin: each staged dK element
//!    `v` of key row `k` is rounded to the integer `round(v * 2^s_k)`
//!    (one fma, [`ROUND_MAGIC`]), and two neighbouring elements go to one
//!    `red.global.add.u64` ([`pack_pair`]); a non-finite `v` sets a flag
//!    instead;
//! 6. `det_finish`: `d_index_k = acc * 2^-s_k` (one rounding, from f64,
//!    [`unpack_pair`]), or the IEEE outcome of the flags (NaN, +inf,
//!    -inf).
//!
//! Every step is either order-independent integer arithmetic or a fixed
//! sequence per thread, so every output bit is reproducible. No partial
//! sum overflows: `|sum round(v 2^s)| <= 2^s sum |v| + N/2 < 2^30 + N/2`
//! with `N` the key row's slot count, below `2^31` for the
//! [`MAX_SLOTS`] the host allows ([`fixed_sums_fit`] is the
//! host-tested form of that bound).

use crate::abi::DetParams;

/// Flag bit of an element's byte in [`DetParams::specials`]: a `+inf`
/// contribution.
pub const POS_INF: u8 = 1;
/// Flag bit: a `-inf` contribution.
pub const NEG_INF: u8 = 2;
/// Flag bit: a NaN contribution.
pub const NAN: u8 = 4;
/// A slot's bound is rounded up to a multiple of `2^-QUANT_BITS` of the
/// call's largest bound before the integer sum.
pub const QUANT_BITS: i32 = 20;
/// Twice a key row's bound, scaled, stays below `2^ACC_BITS`: the factor
/// two covers the kernels' rounding (bf16 dS, f32 products), and the
/// rounding of each term to an integer adds at most `N/2`.
pub const ACC_BITS: i32 = 29;
/// Most slots (B*S_q*topk) a deterministic call may have: the rounding
/// terms (`N/2 <= 2^29`) keep the sums below `2^31`.
pub const MAX_SLOTS: u64 = 1 << 30;

/// `e` with `x < 2^(e+1)` for the non-negative finite f32 with bits
/// `bits` (its exponent; -127 for subnormals and zero).
pub const fn floor_exp(bits: u32) -> i32 {
    let e = ((bits >> 23) & 0xff) as i32;
    if e == 0 {
        -127
    } else {
        e - 127
    }
}

/// `2^k` as an f64, for `-1022 <= k <= 1023` (exact).
pub const fn pow2_f64(k: i32) -> f64 {
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// `2^s` as an f32, for `-126 <= s <= 127` (exact).
pub const fn pow2_f32(s: i32) -> f32 {
    f32::from_bits(((s + 127) as u32) << 23)
}

/// The bound of one slot's dK row, `|grad_signal| * R` (`R`: its query
/// row's factor), or `None` when it adds nothing to a fixed-point sum: a
/// zero bound (every element exactly 0), or a non-finite `grad_signal`
/// (its elements are non-finite and go to the flags). A product that
/// overflows is `f32::MAX`.
pub fn slot_bound(grad_signal: f32, r: f32) -> Option<f32> {
    if !grad_signal.is_finite() {
        return None;
    }
    let b = grad_signal.abs() * r;
    if b == 0.0 {
        None
    } else if b.is_finite() {
        Some(b)
    } else {
        Some(f32::MAX)
    }
}

/// `b` in units of `2^(e - QUANT_BITS)` (`e`: [`floor_exp`] of the
/// largest bound), before rounding up: at most `2^(QUANT_BITS+1)`.
pub fn quant_units(b: f32, e: i32) -> f64 {
    b as f64 * pow2_f64(QUANT_BITS - e)
}

/// The fixed-point exponent `s_k` of a key row whose quantized bounds sum
/// to `sum` units of `2^(floor_exp(max_bits) - QUANT_BITS)` (`max_bits`:
/// the largest bound's): the bound is
/// below `2^(L + E - QUANT_BITS)` with `L` the bit length of `sum`, so
/// `s = ACC_BITS + QUANT_BITS - L - E` puts it below `2^ACC_BITS`;
/// clamped to f32's normal exponents (a smaller scale only costs
/// precision). 0 for a row no slot bounds (nothing is added to it).
pub const fn key_exp(sum: u64, max_bits: u32) -> i32 {
    if sum == 0 {
        return 0;
    }
    let l = 64 - sum.leading_zeros() as i32;
    let s = ACC_BITS + QUANT_BITS - l - floor_exp(max_bits);
    if s < -126 {
        -126
    } else if s > 126 {
        126
    } else {
        s
    }
}

/// The flag bit of a non-finite contribution.
pub fn special_bit(v: f32) -> u8 {
    if v.is_nan() {
        NAN
    } else if v > 0.0 {
        POS_INF
    } else {
        NEG_INF
    }
}

/// An output element from its fixed-point sum, its key row's exponent and
/// its flags: the IEEE sum's class where a contribution was non-finite
/// (NaN if one was NaN or both infinities occurred, else the infinity),
/// else `acc * 2^-s` rounded once to f32.
pub fn finish(acc: i32, s: i32, flags: u8) -> f32 {
    let both = POS_INF | NEG_INF;
    if flags & NAN != 0 || flags & both == both {
        f32::NAN
    } else if flags & POS_INF != 0 {
        f32::INFINITY
    } else if flags & NEG_INF != 0 {
        f32::NEG_INFINITY
    } else {
        (acc as f64 * pow2_f64(-s)) as f32
    }
}

/// Low bits of a slot's quantized bound that `det_key_sums` adds into
/// one u32 bin, the rest going to a second (shared memory has no native
/// 64-bit atomic addition): a slot's units are at most
/// `2^(QUANT_BITS+1)`, so both bins stay below `2^32` for up to
/// [`MAX_BIN_SLOTS`] slots per CTA.
pub const BIN_LO_BITS: u32 = 11;
/// Most slots one CTA of `det_key_sums` bins: `2^32 / 2^BIN_LO_BITS`.
pub const MAX_BIN_SLOTS: u32 = 1 << (32 - BIN_LO_BITS);
/// Most key rows in one CTA's bins (two u32 each: 64 KiB of shared
/// memory); wider key ranges are split into windows, one CTA each.
pub const MAX_WINDOW: u32 = 8192;
const _: () = assert!(
    (1u64 << (QUANT_BITS as u32 + 1 - BIN_LO_BITS)) * MAX_BIN_SLOTS as u64 <= u32::MAX as u64,
    "a CTA's high bins fit 32 bits"
);

/// A slot's quantized bound as the two bin terms of `det_key_sums`:
/// `(units mod 2^BIN_LO_BITS, units >> BIN_LO_BITS)`.
pub const fn split_units(units: u64) -> (u32, u32) {
    (
        (units & ((1 << BIN_LO_BITS) - 1)) as u32,
        (units >> BIN_LO_BITS) as u32,
    )
}

/// A key row's bound units from its two bins (the sums of
/// [`split_units`] over its slots).
pub const fn join_units(lo: u32, hi: u32) -> u64 {
    ((hi as u64) << BIN_LO_BITS) + lo as u64
}

/// The launch of `det_key_sums`: CTA `c` takes query rows
/// `(c / windows) * rows ..` (at most `rows`) and the key rows of window
/// `c % windows` (`window` wide).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeySumGrid {
    /// Query rows per CTA.
    pub rows: u32,
    /// Key rows per window (the bins of one CTA).
    pub window: u32,
    /// Windows over the `B*S_k` key rows.
    pub windows: u32,
    /// CTAs: row chunks times windows.
    pub ctas: u32,
}

impl KeySumGrid {
    /// Dynamic shared memory of a CTA: two u32 bins per key row of its
    /// window.
    pub const fn smem_bytes(&self) -> u32 {
        8 * self.window
    }
}

/// [`KeySumGrid`] for `query_rows` (B*S_q) rows of `topk` slots over
/// `key_rows` (B*S_k) keys on `sms` SMs: about two CTAs per SM in row
/// chunks (fewer rows, more flushes of the bins; more rows, fewer CTAs),
/// at most [`MAX_BIN_SLOTS`] slots a CTA. `None` where one row alone has
/// more slots than a CTA may bin.
pub fn key_sum_grid(query_rows: u32, topk: u32, key_rows: u32, sms: u32) -> Option<KeySumGrid> {
    if topk == 0 || topk > MAX_BIN_SLOTS || query_rows == 0 || key_rows == 0 {
        return None;
    }
    let window = key_rows.min(MAX_WINDOW);
    let windows = key_rows.div_ceil(window);
    let want = query_rows.div_ceil((2 * sms.max(1)).div_ceil(windows).max(1));
    let rows = want.clamp(1, MAX_BIN_SLOTS / topk);
    let ctas = query_rows.div_ceil(rows).checked_mul(windows)?;
    Some(KeySumGrid {
        rows,
        window,
        windows,
        ctas,
    })
}

/// `1.5 * 2^23`: where `x + ROUND_MAGIC`, rounded once to f32, lands in
/// `[2^23, 2^24)` (f32's spacing there is 1), it is `round(x) +
/// ROUND_MAGIC` exactly, ties to even: one fused multiply-add rounds a
/// scaled contribution to an integer on the FMA pipe instead of the
/// conversion unit ([`magic_int`] reads it back).
pub const ROUND_MAGIC: f32 = 12_582_912.0;

/// The integer `round(x)` held by `y = x + ROUND_MAGIC` (rounded once),
/// or `None` where `y` lies outside `[2^23, 2^24)`: `|x|` near `2^22`
/// or beyond, or `x` not finite, where the caller rounds `x` itself.
pub const fn magic_int(y: f32) -> Option<i32> {
    let i = (y.to_bits() as i32).wrapping_sub(ROUND_MAGIC.to_bits() as i32);
    if (i.wrapping_add(1 << 22) as u32) < (1 << 23) {
        Some(i)
    } else {
        None
    }
}

/// Two fixed-point elements in one u64 accumulator word, `hi * 2^32 +
/// lo` as a two's-complement integer, so that one `red.global.add.u64`
/// adds both. Integer addition mod `2^64` is associative, so the word's
/// sum is `(sum hi) * 2^32 + sum lo` in any order, and [`unpack_pair`]
/// recovers both sums wherever each fits an i32 (the bound of the module
/// note).
pub const fn pack_pair(lo: i32, hi: i32) -> u64 {
    ((hi as i64) << 32).wrapping_add(lo as i64) as u64
}

/// The two i32 sums of an accumulator word of [`pack_pair`]s: `lo` is
/// its low 32 bits (as the sum of the `lo`s fits an i32), `hi` what is
/// left, shifted down.
pub const fn unpack_pair(w: u64) -> (i32, i32) {
    let lo = w as u32 as i32;
    let hi = ((w as i64).wrapping_sub(lo as i64) >> 32) as i32;
    (lo, hi)
}

/// Whether every partial sum of `round(v * 2^s)` over `vs` fits an i32,
/// for contributions bounded by `bounds` (`|vs[i]| <= 2 * bounds[i]`), the
/// scale [`key_exp`] picks for them when the call's largest bound has
/// bits `max` (at least the largest of `bounds`): the claim of the module
/// note, as host tests check it (sums of absolute values bound every
/// partial sum).
pub fn fixed_sums_fit(bounds: &[f32], max: u32, vs: &[f32], round: impl Fn(f64) -> f64) -> bool {
    let e = floor_exp(max);
    let sum: u64 = bounds.iter().map(|&b| round_up(quant_units(b, e))).sum();
    let s = key_exp(sum, max);
    let total: f64 = vs
        .iter()
        .map(|&v| round(v as f64 * pow2_f64(s)).abs())
        .sum();
    total < 2147483648.0
}

/// `ceil(x)` for `0 <= x < 2^53` (the host's form of `cvt.rpi`).
fn round_up(x: f64) -> u64 {
    let t = x as u64;
    if (t as f64) < x {
        t + 1
    } else {
        t
    }
}

/// The tables the gradient kernels' deterministic twins read.
#[derive(Clone, Copy)]
pub struct DetTables {
    /// i32 per key row: `s_k`.
    pub key_exp: *const i32,
    /// The flag bytes, one per accumulator element.
    pub specials: *mut u32,
}

impl DetTables {
    /// No tables: the default kernels, which never read them.
    pub const NONE: DetTables = DetTables {
        key_exp: core::ptr::null(),
        specials: core::ptr::null_mut(),
    };

    /// The tables of `p`.
    pub fn of(p: &DetParams) -> DetTables {
        DetTables {
            key_exp: p.key_exp as *const i32,
            specials: p.specials as *mut u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Rng;
    use std::vec::Vec;

    #[test]
    fn exponents_bound_their_values() {
        for x in [1.0f32, 1.5, 2.0, 3.9e-39, 1e-45, 6.5e4, f32::MAX, 0.75] {
            let e = floor_exp(x.to_bits());
            assert!((x as f64) < pow2_f64(e + 1), "{x}: {e}");
            if x >= f32::MIN_POSITIVE {
                assert!((x as f64) >= pow2_f64(e), "{x}: {e}");
            }
        }
        assert_eq!(pow2_f32(-126), f32::MIN_POSITIVE);
        assert_eq!(pow2_f32(0), 1.0);
        assert_eq!(pow2_f64(-1), 0.5);
    }

    #[test]
    fn fixed_sums_fit_for_random_rows() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for case in 0..400 {
            let n = 1 + (rng.next() % 3000) as usize;
            // Bounds over a wide range of magnitudes around a random scale.
            let scale = pow2_f64((rng.next() % 200) as i32 - 100);
            let bounds: Vec<f32> = (0..n)
                .map(|_| {
                    (scale * pow2_f64(-((rng.next() % 30) as i32)) * (0.5 + rng.unit())) as f32
                })
                .collect();
            // Contributions at the worst: twice their bound, one sign; the
            // call's largest bound this row's or far beyond it.
            let vs: Vec<f32> = bounds.iter().map(|b| 2.0 * b).collect();
            let own = bounds.iter().fold(0u32, |m, b| m.max(b.to_bits()));
            let other = (f32::from_bits(own) as f64 * pow2_f64((rng.next() % 60) as i32)) as f32;
            for max in [own, other.to_bits()] {
                assert!(
                    fixed_sums_fit(&bounds, max, &vs, f64::round),
                    "case {case}, n {n}"
                );
            }
        }
    }

    #[test]
    fn scales_leave_at_most_two_bits_unused() {
        // At the worst case the bound documents (every contribution twice
        // its bound, one sign, bounds at a power-of-two edge), the sum
        // fills at least 2^29: a scale two steps larger would overflow,
        // so the precision given away is at most two bits.
        let n = 1024;
        let bounds = std::vec![1.999_999_9f32; n];
        let max = bounds[0].to_bits();
        let e = floor_exp(max);
        let sum: u64 = bounds.iter().map(|&b| round_up(quant_units(b, e))).sum();
        let s = key_exp(sum, max);
        let total: f64 = bounds
            .iter()
            .map(|&b| (2.0 * b as f64 * pow2_f64(s)).round())
            .sum();
        assert!(total >= 2f64.powi(29), "{total}");
        assert!(total < 2f64.powi(31), "{total}");
    }

    #[test]
    fn magic_rounding_is_round_ties_even_where_it_claims_to_be() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let edge = pow2_f64(22) as f32;
        let mut xs: Vec<f32> = std::vec![
            0.0,
            -0.0,
            0.5,
            -0.5,
            1.5,
            2.5,
            -2.5,
            edge,
            -edge,
            edge - 0.5,
            edge - 1.0,
            -edge - 0.25,
            -edge - 0.5,
            edge + 0.5,
            2.0 * edge,
            1e-40,
            -1e-45,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
        ];
        for _ in 0..20000 {
            let mag = pow2_f64((rng.next() % 30) as i32 - 4);
            let sign = if rng.next().is_multiple_of(2) {
                1.0
            } else {
                -1.0
            };
            xs.push((sign * mag * (0.5 + rng.unit())) as f32);
            // Exact ties, and values one spacing from the edges.
            xs.push((sign * ((rng.next() % (1 << 22)) as f64 + 0.5)) as f32);
        }
        for x in xs {
            let y = x + ROUND_MAGIC;
            let exact = x.is_finite() && (x.abs() as f64) < pow2_f64(22) - 0.5;
            match magic_int(y) {
                Some(i) => assert_eq!(i as f32, x.round_ties_even(), "{x}"),
                None => assert!(!exact, "{x}: in range but refused"),
            }
        }
    }

    #[test]
    fn packed_pairs_sum_in_any_order() {
        let mut rng = Rng(0x5851_f42d_4c95_7f2d);
        for case in 0..200 {
            let n = 1 + (rng.next() % 500) as usize;
            // Terms whose sums (and partial sums) stay inside the i32 range.
            let lim = (1u64 << 31) / n as u64;
            let mut term = || (rng.next() % (2 * lim)) as i64 - lim as i64;
            let pairs: Vec<(i32, i32)> = (0..n).map(|_| (term() as i32, term() as i32)).collect();
            let (lo, hi) = pairs
                .iter()
                .fold((0i64, 0i64), |(a, b), &(l, h)| (a + l as i64, b + h as i64));
            let mut words: Vec<u64> = pairs.iter().map(|&(l, h)| pack_pair(l, h)).collect();
            for _ in 0..3 {
                let sum = words.iter().fold(0u64, |s, &w| s.wrapping_add(w));
                assert_eq!(unpack_pair(sum), (lo as i32, hi as i32), "case {case}");
                // Another order of the same additions.
                let k = words.len();
                for i in (1..k).rev() {
                    words.swap(i, (rng.next() % (i as u64 + 1)) as usize);
                }
            }
        }
        assert_eq!(
            unpack_pair(pack_pair(i32::MIN, i32::MAX)),
            (i32::MIN, i32::MAX)
        );
        assert_eq!(unpack_pair(pack_pair(-1, -1)), (-1, -1));
    }

    #[test]
    fn split_bins_sum_to_the_units_without_overflow() {
        let mut rng = Rng(0x1405_7b7e_f767_814f);
        let max_units = 1u64 << (QUANT_BITS + 1);
        for case in 0..100 {
            let n = 1 + (rng.next() % 5000) as usize;
            let units: Vec<u64> = (0..n).map(|_| 1 + rng.next() % max_units).collect();
            let (lo, hi) = units.iter().fold((0u32, 0u32), |(l, h), &u| {
                let (a, b) = split_units(u);
                (l.checked_add(a).unwrap(), h.checked_add(b).unwrap())
            });
            assert_eq!(join_units(lo, hi), units.iter().sum::<u64>(), "case {case}");
        }
        // A CTA's worst case: MAX_BIN_SLOTS slots of the largest units.
        let (a, b) = split_units(max_units);
        assert!(a as u64 * MAX_BIN_SLOTS as u64 <= u32::MAX as u64);
        assert!(b as u64 * MAX_BIN_SLOTS as u64 <= u32::MAX as u64);
        assert!((((1u64 << BIN_LO_BITS) - 1) * MAX_BIN_SLOTS as u64) <= u32::MAX as u64);
    }

    #[test]
    fn key_sum_grids_cover_every_row_and_key_within_the_bin_limits() {
        for &(rows, topk, keys, sms) in &[
            (8192u32, 2048u32, 4096u32, 132u32),
            (8192, 128, 8192, 132),
            (4096, 2048, 131072, 132),
            (1, 1, 1, 1),
            (3, 1 << 21, 5, 7),
            (100_000, 64, 9000, 132),
        ] {
            let g = key_sum_grid(rows, topk, keys, sms).unwrap();
            assert!(g.rows >= 1 && g.rows as u64 * topk as u64 <= MAX_BIN_SLOTS as u64);
            assert!(g.window <= MAX_WINDOW && g.window as u64 * g.windows as u64 >= keys as u64);
            assert!((g.windows - 1) * g.window < keys);
            assert_eq!(g.ctas, rows.div_ceil(g.rows) * g.windows);
        }
        assert_eq!(key_sum_grid(8192, 2048, 4096, 132).unwrap().rows, 32);
        assert_eq!(key_sum_grid(4, (1 << 21) + 1, 8, 1), None);
        assert_eq!(key_sum_grid(0, 8, 8, 1), None);
    }

    #[test]
    fn finish_follows_ieee_sums_of_specials() {
        assert!(finish(5, 0, NAN).is_nan());
        assert!(finish(5, 0, POS_INF | NEG_INF).is_nan());
        assert_eq!(finish(5, 0, POS_INF), f32::INFINITY);
        assert_eq!(finish(-5, 3, NEG_INF), f32::NEG_INFINITY);
        assert_eq!(finish(-5, 3, 0), -0.625);
        assert_eq!(finish(3, -2, 0), 12.0);
        assert_eq!(special_bit(f32::NAN), NAN);
        assert_eq!(special_bit(f32::NEG_INFINITY), NEG_INF);
        assert_eq!(slot_bound(f32::INFINITY, 1.0), None);
        assert_eq!(slot_bound(0.0, 3.0), None);
        assert_eq!(slot_bound(-2.0, 3.0), Some(6.0));
        assert_eq!(slot_bound(3e38, 3e38), Some(f32::MAX));
    }

    #[test]
    fn empty_rows_get_exponent_zero_and_tiny_rows_a_clamped_one() {
        assert_eq!(key_exp(0, 0), 0);
        // A tiny bound: the scale is clamped to f32's normal range.
        assert_eq!(key_exp(1, 1), 126);
        // A bound near 1 with one slot: below 2^29 after scaling.
        let s = key_exp(1 << QUANT_BITS, 1.0f32.to_bits());
        assert_eq!(s, ACC_BITS - 1);
    }
}
