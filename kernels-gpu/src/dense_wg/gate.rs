//! The elementwise gate between the two products, in registers, for both
//! item kinds: `S = sm_scale * acc`, `dS = [visible and S > 0] * gs * w`
//! rounded to the bf16 A operand of the next product, and (row items) the
//! d_weights sums `[visible and S > 0] * gs * S`. The A operand is
//! `super::pack_a`'s packing of dS, written out pair by pair. Selections, not
//! products with a mask, so what a row does not see never reaches an
//! output, whatever the inputs hold there.

use crate::ptx::cvt::pack_bf16x2;

/// Row item, one key tile: `acc` is S/sm_scale for 64 heads x 64 keys
/// (rows: heads, this thread's `16 w + g` and `+ 8`; columns: keys);
/// `w` the weights of this thread's two heads; `gs(j)` the grad_signal of
/// keys `8 j + c2` and `+ 1` (`c2 = 2 (lane % 4)`); keys at `lim` and
/// beyond are not visible. Adds to this thread's d_weights sums `dw`.
#[inline(always)]
pub(super) fn rows(
    acc: &[f32; 32],
    scale: f32,
    w: [f32; 2],
    gs: impl Fn(u32) -> [f32; 2],
    lim: u32,
    c2: u32,
    dw: &mut [f32; 2],
) -> [u32; 16] {
    // Each pair of dS is packed as soon as it exists (`pack_a`'s order),
    // so S, dS and the A operand are never all live at once.
    let mut a = [0u32; 16];
    for j in 0..8u32 {
        let g = gs(j);
        for h in 0..2u32 {
            let mut ds = [0.0f32; 2];
            for k in 0..2u32 {
                let r = (4 * j + 2 * h + k) as usize;
                let s = scale * acc[r];
                let on = 8 * j + c2 + k < lim && s > 0.0;
                dw[h as usize] += if on { g[k as usize] * s } else { 0.0 };
                ds[k as usize] = if on {
                    g[k as usize] * w[h as usize]
                } else {
                    0.0
                };
            }
            a[(2 * j + h) as usize] = pack_bf16x2(ds[0], ds[1]);
        }
    }
    a
}

/// Key item, one query row: `acc` is S^T/sm_scale for 64 keys x 64 heads
/// (rows: keys, this thread's `16 w + g` and `+ 8`; columns: heads);
/// `gs` and `vis` the grad_signal and visibility of this thread's two
/// keys; `w(j)` the weights of heads `8 j + c2` and `+ 1`.
#[inline(always)]
pub(super) fn keys(
    acc: &[f32; 32],
    scale: f32,
    gs: [f32; 2],
    vis: [bool; 2],
    w: impl Fn(u32) -> [f32; 2],
) -> [u32; 16] {
    let mut a = [0u32; 16];
    for j in 0..8u32 {
        let wj = w(j);
        for k in 0..2u32 {
            let mut ds = [0.0f32; 2];
            for h in 0..2u32 {
                let r = (4 * j + 2 * k + h) as usize;
                let on = vis[k as usize] && scale * acc[r] > 0.0;
                ds[h as usize] = if on {
                    gs[k as usize] * wj[h as usize]
                } else {
                    0.0
                };
            }
            a[(2 * j + k) as usize] = pack_bf16x2(ds[0], ds[1]);
        }
    }
    a
}
