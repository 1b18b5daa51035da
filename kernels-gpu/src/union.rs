//! Groups of adjacent query rows whose top-k lists share keys: the sorted
//! union of the key rows a group selects, and per row its grad_signal
//! summed over the slots that hold each union key. Plain Rust, the index
//! handling of a union *tile* kernel over groups of R rows,
//! host-tested here so that a device builder can be checked against it.
//! No kernel uses it: the two-row union walk that exists
//! (`sm90::unite`, opt-in) keeps one entry per slot instead and never
//! multiplies by a zero it does not own. The measured bounds and the
//! constraints such a kernel faces are in docs/perf-notes.md ("Beyond the
//! scatter wall").
//!
//! Why the summed grad_signal is enough: stage 2's terms of a slot depend
//! on its key row only through `S`, and are linear in its grad_signal
//! (`dS = [S > 0] gs w`, `d_weights += [S > 0] gs S`). A row's slots that
//! hold the same key row (duplicates, which SPEC allows) therefore add up
//! to one term with the sum of their grad_signals, and a group's products
//! can run over its union with a zero for every union key a row does not
//! select. That zero is exact for finite inputs only: see
//! `tests::a_union_tile_spreads_an_unselected_inf`.

/// The union of a group of `rows` query rows, written by [`build`] into
/// caller-owned storage.
pub struct Union<'a> {
    /// Distinct key rows the group selects, ascending: the first `n`, `n`
    /// returned by [`build`].
    pub keys: &'a mut [u32],
    /// `sum[r * cap + j]`: the sum of row `r`'s grad_signal over its slots
    /// holding `keys[j]`, in slot order (0 where it holds none).
    pub sum: &'a mut [f32],
    /// `count[r * cap + j]`: how many of row `r`'s slots hold `keys[j]`.
    pub count: &'a mut [u32],
    /// Capacity per row: `keys.len()`, at least `rows * topk`.
    pub cap: usize,
}

/// Builds the union of `rows` rows of `topk` slots. `key_rows[r * topk +
/// t]` is row `r`'s slot `t` resolved to a key row (`score::resolve`: -1
/// for padding, which the union leaves out) and `gs` the slot's
/// grad_signal at the same index. `scratch` holds at least `rows * topk`
/// entries. Returns the number of union keys, written to the front of
/// `out.keys`; the first `rows * out.cap` entries of `out.sum` and
/// `out.count` are overwritten.
///
/// # Panics
/// When a slice is shorter than the sizes above require, or `rows * topk`
/// exceeds `u32::MAX` (caller bugs, not user input).
pub fn build(
    key_rows: &[i32],
    gs: &[f32],
    rows: usize,
    topk: usize,
    scratch: &mut [u64],
    out: &mut Union<'_>,
) -> usize {
    let slots = rows * topk;
    assert!(slots <= u32::MAX as usize);
    assert!(key_rows.len() >= slots && gs.len() >= slots && scratch.len() >= slots);
    assert!(out.cap >= slots && out.keys.len() >= out.cap);
    assert!(out.sum.len() >= rows * out.cap && out.count.len() >= rows * out.cap);
    // (key row, flat slot) pairs of the valid slots: sorted, equal keys
    // sit together in slot order, so each sum runs in slot order.
    let mut n = 0;
    for (i, &k) in key_rows[..slots].iter().enumerate() {
        if k >= 0 {
            scratch[n] = ((k as u64) << 32) | i as u64;
            n += 1;
        }
    }
    let pairs = &mut scratch[..n];
    pairs.sort_unstable();
    out.sum[..rows * out.cap].fill(0.0);
    out.count[..rows * out.cap].fill(0);
    let mut len = 0usize;
    for (i, &e) in pairs.iter().enumerate() {
        let key = (e >> 32) as u32;
        if i == 0 || (pairs[i - 1] >> 32) as u32 != key {
            out.keys[len] = key;
            len += 1;
        }
        let slot = (e & 0xffff_ffff) as usize;
        let at = (slot / topk) * out.cap + len - 1;
        out.sum[at] += gs[slot];
        out.count[at] += 1;
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;
    use std::vec::Vec;

    /// An owned union for `rows` rows of `topk` slots.
    struct Owned {
        keys: Vec<u32>,
        sum: Vec<f32>,
        count: Vec<u32>,
        len: usize,
        cap: usize,
    }

    fn union_of(key_rows: &[i32], gs: &[f32], rows: usize, topk: usize) -> Owned {
        let cap = rows * topk;
        let (mut keys, mut sum, mut count) =
            (vec![0; cap], vec![7.0; rows * cap], vec![9; rows * cap]);
        let mut scratch = vec![0u64; cap];
        let mut u = Union {
            keys: &mut keys,
            sum: &mut sum,
            count: &mut count,
            cap,
        };
        let len = build(key_rows, gs, rows, topk, &mut scratch, &mut u);
        Owned {
            keys,
            sum,
            count,
            len,
            cap,
        }
    }

    #[test]
    fn sorts_merges_and_sums_duplicates_in_slot_order() {
        // Two rows of four slots: row 0 holds key 5 twice and padding,
        // row 1 shares key 3 and adds key 9.
        let key_rows = [5, 3, -1, 5, 9, 3, -1, -1];
        let gs = [0.5, 0.25, 100.0, 1.5, -2.0, 0.125, 100.0, 100.0];
        let u = union_of(&key_rows, &gs, 2, 4);
        assert_eq!(&u.keys[..u.len], &[3, 5, 9]);
        let row = |r: usize| {
            (
                &u.sum[r * u.cap..r * u.cap + 3],
                &u.count[r * u.cap..r * u.cap + 3],
            )
        };
        assert_eq!(row(0), (&[0.25, 2.0, 0.0][..], &[1, 2, 0][..]));
        assert_eq!(row(1), (&[0.125, 0.0, -2.0][..], &[1, 0, 1][..]));
        // Everything past the union is cleared, not left as it was.
        assert!(u.sum[3..u.cap].iter().all(|&x| x == 0.0));
    }

    #[test]
    fn an_all_padding_group_has_an_empty_union() {
        let u = union_of(&[-1, -1, -1], &[1.0; 3], 3, 1);
        assert_eq!(u.len, 0);
        assert!(u.count.iter().all(|&c| c == 0));
    }

    /// A small linear congruential generator (no dependencies here).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) as u32
        }
        fn unit(&mut self) -> f64 {
            self.next() as f64 / (1u64 << 31) as f64 * 2.0 - 1.0
        }
    }

    /// A group's problem: `rows` rows of `heads` x `dim` q, weights, the
    /// key rows of their slots (-1 padding), grad_signal, and `keys` K rows.
    struct Group {
        rows: usize,
        topk: usize,
        heads: usize,
        dim: usize,
        q: Vec<f64>,
        w: Vec<f64>,
        k: Vec<f64>,
        key_rows: Vec<i32>,
        gs: Vec<f32>,
    }

    fn group(seed: u64, rows: usize, topk: usize, keys: usize) -> Group {
        let (heads, dim) = (3, 5);
        let mut g = Lcg(seed);
        let q = (0..rows * heads * dim).map(|_| g.unit()).collect();
        let w = (0..rows * heads).map(|_| g.unit()).collect();
        let k = (0..keys * dim).map(|_| g.unit()).collect();
        // Few keys, so rows share them and hold duplicates; 1 in 8 padding.
        let key_rows = (0..rows * topk)
            .map(|_| {
                if g.next().is_multiple_of(8) {
                    -1
                } else {
                    (g.next() % keys as u32) as i32
                }
            })
            .collect();
        // Multiples of 1/64 in [-1, 1]: their f32 sums are exact, so the
        // union's f32 sums match the f64 slot-by-slot ones.
        let gs = (0..rows * topk)
            .map(|_| (g.next() % 129) as f32 / 64.0 - 1.0)
            .collect();
        Group {
            rows,
            topk,
            heads,
            dim,
            q,
            w,
            k,
            key_rows,
            gs,
        }
    }

    /// (d_index_q, d_weights, d_index_k) of a group with sm_scale 1, in
    /// f64. `union`: through the union tile (every union key for every
    /// row, zero where the row holds none); else slot by slot as SPEC
    /// writes stage 2.
    fn grads(p: &Group, union: bool) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let (h, d) = (p.heads, p.dim);
        let mut dq = vec![0.0; p.rows * h * d];
        let mut dw = vec![0.0; p.rows * h];
        let mut dk = vec![0.0; p.k.len()];
        let u = union_of(&p.key_rows, &p.gs, p.rows, p.topk);
        for r in 0..p.rows {
            // (key row, grad_signal, selected) per term.
            let terms: Vec<(usize, f64, bool)> = if union {
                (0..u.len)
                    .map(|j| {
                        let at = r * u.cap + j;
                        (u.keys[j] as usize, u.sum[at] as f64, u.count[at] > 0)
                    })
                    .collect()
            } else {
                (0..p.topk)
                    .map(|t| (p.key_rows[r * p.topk + t], p.gs[r * p.topk + t] as f64))
                    .filter(|&(key, _)| key >= 0)
                    .map(|(key, g)| (key as usize, g, true))
                    .collect()
            };
            for (key, g, selected) in terms {
                let kr = &p.k[key * d..key * d + d];
                for hh in 0..h {
                    let qr = &p.q[(r * h + hh) * d..(r * h + hh + 1) * d];
                    let s: f64 = qr.iter().zip(kr).map(|(a, b)| a * b).sum();
                    let ds = if s > 0.0 { g * p.w[r * h + hh] } else { 0.0 };
                    if selected && s > 0.0 {
                        dw[r * h + hh] += g * s;
                    }
                    // The union tile multiplies by ds even where it is the
                    // zero of an unselected key.
                    for c in 0..d {
                        dq[(r * h + hh) * d + c] += ds * kr[c];
                        dk[key * d + c] += ds * qr[c];
                    }
                }
            }
        }
        (dq, dw, dk)
    }

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-9 * (1.0 + y.abs()))
    }

    #[test]
    fn union_tile_gradients_equal_the_slot_by_slot_ones() {
        for seed in 0..40 {
            let rows = 1 + seed as usize % 4;
            let p = group(
                seed,
                rows,
                1 + (seed as usize * 7) % 9,
                1 + seed as usize % 6,
            );
            let (a, b) = (grads(&p, true), grads(&p, false));
            assert!(
                close(&a.0, &b.0) && close(&a.1, &b.1) && close(&a.2, &b.2),
                "seed {seed}"
            );
        }
    }

    #[test]
    fn a_union_tile_spreads_an_unselected_inf() {
        // Row 0 selects keys 0 and 1, row 1 only key 0; key 1's K row
        // holds an inf. Slot by slot, row 1's d_index_q never touches it.
        let mut p = group(3, 2, 2, 2);
        p.key_rows = vec![0, 1, 0, -1];
        p.k[p.dim] = f64::INFINITY;
        let (union_dq, _, _) = grads(&p, true);
        let (slot_dq, _, _) = grads(&p, false);
        let row1 = p.heads * p.dim..2 * p.heads * p.dim;
        assert!(slot_dq[row1.clone()].iter().all(|x| x.is_finite()));
        assert!(union_dq[row1].iter().any(|x| x.is_nan()));
    }
}
