//! The elementwise gate between the two products, in registers, for both
//! item kinds: `S = sm_scale * acc`; dS is `gs` (row items: the weight is
//! applied to dQ's rows at the end instead) or `gs * w` (key items) where
//! S > 0 and the key is visible, else 0, rounded to the bf16 A operand of
//! the next product; row items also sum d_weights, `gs * relu(S)` over
//! the visible keys. The A operand is `super::pack_a`'s packing of dS,
//! written out pair by pair.
//!
//! Selections, not products with a mask, so what a row does not see never
//! reaches an output, whatever the inputs hold there. The producer stores
//! grad_signal as 0 where the key is not visible, so dS needs no
//! visibility test of its own in row items; d_weights (and key items'
//! dS, whose weights may be anything) select on it, which `MASKED` gates
//! elide for tiles the row sees whole.

use crate::ptx::arith::fma_rn;
use crate::ptx::cvt::pack_bf16x2;

/// Row item, one key tile: `acc` is S/sm_scale for 64 heads x 64 keys
/// (rows: heads, this thread's `16 w + g` and `+ 8`; columns: keys);
/// `gs(j)` the grad_signal of keys `8 j + c2` and `+ 1` (`c2 = 2 (lane %
/// 4)`), 0 where not visible; with `MASKED`, keys at `lim` and beyond are
/// not visible (else all are). Adds to this thread's d_weights sums
/// `dw`. dS is returned without the weights (dQ's rows take them).
#[inline(always)]
pub(super) fn rows<const MASKED: bool>(
    acc: &[f32; 32],
    scale: f32,
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
                let relu = if s > 0.0 { s } else { 0.0 };
                let seen = !MASKED || 8 * j + c2 + k < lim;
                let x = if seen { relu } else { 0.0 };
                dw[h as usize] = fma_rn(g[k as usize], x, dw[h as usize]);
                ds[k as usize] = if s > 0.0 { g[k as usize] } else { 0.0 };
            }
            a[(2 * j + h) as usize] = pack_bf16x2(ds[0], ds[1]);
        }
    }
    a
}

/// Key item, one query row: `acc` is S^T/sm_scale for 64 keys x 64 heads
/// (rows: keys, this thread's `16 w + g` and `+ 8`; columns: heads);
/// `gs` and `vis` the grad_signal and visibility of this thread's two
/// keys (`vis` read only with `MASKED`, else both are visible); `w(j)` the
/// weights of heads `8 j + c2` and `+ 1`.
#[inline(always)]
pub(super) fn keys<const MASKED: bool>(
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
                let on = (!MASKED || vis[k as usize]) && scale * acc[r] > 0.0;
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
