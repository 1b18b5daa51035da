//! Score-gradient math shared by the `mma.sync` row kernels
//! (`portable::rows`) and stage 1 (`portable::stage1`): the clip constant, an f32 `exp`, the per-slot
//! terms of stage 1, key-id loading (i32 or i64) and resolution. Plain Rust, so the host unit
//! tests below check it against `std` as well.

use crate::abi::{GradParams, FLAG_IDS_I64, FLAG_LOCAL_IDS};

/// `exp(-100)` rounded to f32: 27 * 2^-149, a subnormal. For every f32 `x`,
/// `x >= CLIP` agrees with `x >= exp(-100)` computed exactly, because
/// `exp(-100)` lies between 26 and 27 units of 2^-149.
pub const CLIP: f32 = f32::from_bits(27);

/// `exp(x)` in f32 to about 1 ulp (no fast-math `ex2.approx`): Cody-Waite
/// reduction `x = n ln2 + r`, a degree-7 polynomial for `e^r`, then scaling
/// by `2^n` in two steps so subnormal results stay exact enough.
#[inline(always)]
pub fn expf(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x > 88.72283 {
        return f32::INFINITY;
    }
    if x < -103.97208 {
        return 0.0;
    }
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let t = x * core::f32::consts::LOG2_E;
    let n = if t >= 0.0 {
        (t + 0.5) as i32
    } else {
        (t - 0.5) as i32
    };
    let nf = n as f32;
    let r = (x - nf * LN2_HI) - nf * LN2_LO;
    // e^r on |r| <= 0.35: Taylor to r^7 (truncation < 3e-9 relative).
    let mut e = 1.0 / 5040.0;
    e = e * r + 1.0 / 720.0;
    e = e * r + 1.0 / 120.0;
    e = e * r + 1.0 / 24.0;
    e = e * r + 1.0 / 6.0;
    e = e * r + 0.5;
    e = e * r + 1.0;
    e = e * r + 1.0;
    let n1 = n / 2;
    let n2 = n - n1;
    e * pow2(n1) * pow2(n2)
}

/// `2^k` for `-126 <= k <= 127`.
#[inline(always)]
fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// Stage 1 terms of one slot: `(g_t, predict_t)` with
/// `g_t = -max(target, CLIP) * [predict >= CLIP] * c`.
#[inline(always)]
pub fn score_terms(target: f32, score: f32, log: bool, c: f32) -> (f32, f32) {
    let (predict, keep) = if log {
        (expf(score), score >= -100.0)
    } else {
        (score, score >= CLIP)
    };
    let g = if keep {
        -(if target > CLIP { target } else { CLIP }) * c
    } else {
        0.0
    };
    (g, predict)
}

/// Narrows a 64-bit key id ([`FLAG_IDS_I64`]) to the i32 that [`resolve`]
/// takes: ids in `0..=i32::MAX` are kept, every other value becomes -1.
/// No valid id is lost (valid ids are below `B*S_k <= i32::MAX`) and no
/// invalid one becomes valid: `2^32 + 5` is -1, not 5, and every negative
/// value stays negative. One unsigned compare and a select.
#[inline(always)]
pub const fn narrow_id(id: i64) -> i32 {
    if id as u64 <= i32::MAX as u64 {
        id as i32
    } else {
        -1
    }
}

/// [`narrow_id`] of an i64 id held as its two little-endian words (as
/// loaded from shared memory).
#[inline(always)]
pub const fn narrow_id_words(w: [u32; 2]) -> i32 {
    narrow_id(((w[1] as u64) << 32 | w[0] as u64) as i64)
}

/// Whether `p.topk_indices` holds i64 ids ([`FLAG_IDS_I64`]).
#[inline(always)]
pub const fn ids_i64(p: &GradParams) -> bool {
    p.flags & FLAG_IDS_I64 != 0
}

/// Key id of flat slot `i` of `topk_indices` as an i32: read as i32, or
/// as i64 and narrowed ([`narrow_id`]) with [`FLAG_IDS_I64`]. The branch
/// is on a launch-uniform flag.
///
/// # Safety
/// `i < B*S_q*topk` and `p.topk_indices` a device pointer to that many
/// ids of the flag's width, aligned to it (host-checked).
#[inline(always)]
pub unsafe fn load_id(p: &GradParams, i: usize) -> i32 {
    // SAFETY: the caller's contract.
    unsafe {
        if ids_i64(p) {
            narrow_id(*(p.topk_indices as *const i64).add(i))
        } else {
            *(p.topk_indices as *const i32).add(i)
        }
    }
}

/// Resolves a slot's key id to a row of the flat `(B*S_k, D)` view of
/// `index_k`, or -1 for padding (negative or out of range; a local id never
/// aliases another batch). The host guarantees `B*S_k <= i32::MAX`.
#[inline(always)]
pub fn resolve(id: i32, b: u32, p: &GradParams) -> i32 {
    if id < 0 {
        return -1;
    }
    if p.flags & FLAG_LOCAL_IDS != 0 {
        if (id as u32) < p.seq_k {
            (b * p.seq_k + id as u32) as i32
        } else {
            -1
        }
    } else if (id as u64) < p.batch as u64 * p.seq_k as u64 {
        id
    } else {
        -1
    }
}

/// Stage-2 gate of one (head, slot) pair, from the raw accumulator
/// `acc = q . k`: with `s = sm_scale * acc`, returns
/// `(dS, d_weights term) = (gs * w, gs * s)` when the slot is valid and
/// `s > 0`, else `(0, 0)` (SPEC, stage 2).
#[inline(always)]
pub fn gate(acc: f32, sm_scale: f32, gs: f32, w: f32, valid: bool) -> (f32, f32) {
    let s = acc * sm_scale;
    if valid && s > 0.0 {
        (gs * w, gs * s)
    } else {
        (0.0, 0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_is_exp_minus_100_rounded() {
        let exact = (-100.0f64).exp();
        // exp(-100) lies strictly between 26 and 27 units of 2^-149, so
        // `x >= CLIP` is `x >= exp(-100)` for every f32 x.
        assert!((f32::from_bits(26) as f64) < exact && exact < CLIP as f64);
    }

    #[test]
    fn expf_is_within_two_ulp_of_std() {
        let mut x = -103.9f32;
        while x < 88.7 {
            let want = (x as f64).exp();
            let got = expf(x) as f64;
            let ulp = (want as f32).abs() * f32::EPSILON;
            let tol = if want < f32::MIN_POSITIVE as f64 {
                f32::from_bits(2) as f64
            } else {
                2.0 * ulp as f64
            };
            assert!((got - want).abs() <= tol, "exp({x}) = {got}, want {want}");
            x += 0.0371;
        }
        assert_eq!(expf(100.0), f32::INFINITY);
        assert_eq!(expf(-200.0), 0.0);
        assert!(expf(f32::NAN).is_nan());
    }

    #[test]
    fn score_terms_follow_the_spec() {
        let c = 0.5f32;
        assert_eq!(score_terms(0.25, 0.5, false, c), (-0.125, 0.5));
        // Predict below CLIP: masked.
        assert_eq!(score_terms(0.25, 0.0, false, c), (0.0, 0.0));
        // Target below CLIP is clipped.
        assert_eq!(score_terms(0.0, 0.5, false, c).0, -CLIP * c);
        // Log variant: predict = exp(logp), mask logp >= -100.
        let (g, p) = score_terms(0.25, -1.0, true, c);
        assert_eq!(g, -0.125);
        assert!((p as f64 - (-1.0f64).exp()).abs() < 1e-7);
        assert_eq!(score_terms(0.25, -100.5, true, c).0, 0.0);
    }

    #[test]
    fn resolve_maps_padding_to_minus_one() {
        let mut p = GradParams {
            batch: 2,
            seq_k: 5,
            ..GradParams::default()
        };
        assert_eq!(resolve(7, 1, &p), 7);
        assert_eq!(resolve(10, 1, &p), -1);
        assert_eq!(resolve(-1, 0, &p), -1);
        p.flags = FLAG_LOCAL_IDS;
        assert_eq!(resolve(4, 1, &p), 9);
        assert_eq!(resolve(5, 0, &p), -1);
    }

    #[test]
    fn narrowing_keeps_exactly_the_i32_range() {
        for (v, want) in [
            (0i64, 0i32),
            (5, 5),
            (i32::MAX as i64, i32::MAX),
            (-1, -1),
            (-2, -1),
            (i64::MIN, -1),
            (i32::MIN as i64, -1),
            (1 << 31, -1),
            ((1 << 32) + 5, -1),
            ((1 << 32) - 1, -1),
            (i64::MAX, -1),
            (-(1i64 << 32) + 5, -1),
        ] {
            assert_eq!(narrow_id(v), want, "{v}");
            let b = v.to_le_bytes();
            let words = [
                u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            ];
            assert_eq!(narrow_id_words(words), want, "{v}");
        }
        // Narrowed, every id resolves exactly as the i64 value would.
        let p = GradParams {
            batch: 2,
            seq_k: 5,
            ..GradParams::default()
        };
        for v in [-7i64, -1, 0, 9, 10, (1 << 32) + 5, (1 << 32) + 9] {
            let valid = (0..10).contains(&v);
            assert_eq!(resolve(narrow_id(v), 1, &p) >= 0, valid, "{v}");
        }
    }

    #[test]
    fn load_id_reads_either_width() {
        let ids32 = [3i32, -1, 7];
        let ids64 = [3i64, (1 << 32) + 5, -9];
        let mut p = GradParams {
            topk_indices: ids32.as_ptr() as u64,
            ..GradParams::default()
        };
        // SAFETY: host pointers to three ids of the flag's width.
        unsafe {
            assert_eq!([load_id(&p, 0), load_id(&p, 1), load_id(&p, 2)], [3, -1, 7]);
            p.topk_indices = ids64.as_ptr() as u64;
            p.flags = FLAG_IDS_I64;
            assert_eq!(
                [load_id(&p, 0), load_id(&p, 1), load_id(&p, 2)],
                [3, -1, -1]
            );
        }
        assert!(ids_i64(&p));
    }

    #[test]
    fn gate_passes_only_valid_positive_scores() {
        assert_eq!(gate(2.0, 0.5, 3.0, 4.0, true), (12.0, 3.0));
        assert_eq!(gate(2.0, 0.5, 3.0, 4.0, false), (0.0, 0.0));
        assert_eq!(gate(0.0, 0.5, 3.0, 4.0, true), (0.0, 0.0));
        assert_eq!(gate(-1.0, 0.5, 3.0, 4.0, true), (0.0, 0.0));
        // A negative sm_scale flips the sign of S before the gate.
        assert_eq!(gate(-2.0, -0.5, 3.0, 4.0, true), (12.0, 3.0));
    }
}
