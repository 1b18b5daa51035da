//! Row items, consumer side: dQ and d_weights of one query row per
//! consumer warpgroup, over the key tiles of its visible keys (module
//! note of `super`).

use super::ctx::Ctx;
use super::{gate, load, mma, HEADS, SMEM, TILE_KEYS};
use crate::abi::FLAG_DW_F32;
use crate::ptx::cvt::{bf16_to_f32, pack_bf16x2};
use crate::ptx::{smem, sync};

/// Runs the row item `[ROWS, row0, nrows, key_start, tiles]` on this
/// consumer's row `row0 + wg` (if it has one).
///
/// # Safety
/// The kernel's launch contract; every thread of a consumer warpgroup
/// calls it.
#[inline(always)]
pub(super) unsafe fn run(c: &Ctx<'_>, row0: u32, nrows: u32, tiles: u32) {
    if c.wg >= nrows {
        return;
    }
    let p = c.p;
    let row = row0 + c.wg;
    let (warp, lane) = (c.t / 32, c.t % 32);
    let (g, c2) = (lane / 4, 2 * (lane % 4));
    let mine = load::visible(c, row);
    let wt = p.weights as *const u16;
    let head = |h: u32| (row * HEADS + 16 * warp + g + 8 * h) as usize;
    // SAFETY: this row's weights.
    let w = unsafe { [bf16_to_f32(*wt.add(head(0))), bf16_to_f32(*wt.add(head(1)))] };
    let (mut dq0, mut dq1, mut dw) = ([0.0f32; 32], [0.0f32; 32], [0.0f32; 2]);
    if tiles > 0 {
        // SAFETY: the producer loads the fixed tiles and `tiles` K tiles;
        // whole warpgroup; the grad_signal words are this row's (stored
        // before the tile's "full" phase).
        unsafe {
            c.wait_fixed();
            // (Inlined by force: as a call, the pipeline would cross a
            // function boundary, which ptxas serialises.)
            mma::pipeline(c, c.fixed(c.wg), tiles, &mut dq0, &mut dq1, #[inline(always)]
            |t, s| {
                let gs = c.stage(t).add(SMEM.gs + 4 * TILE_KEYS * c.wg);
                let gs = |j: u32| smem::ld_v2_f32(gs.add(4 * (8 * j + c2)));
                // Keys this row sees in the tile (uniform in the warpgroup).
                let lim = mine.saturating_sub(TILE_KEYS * t);
                if lim >= TILE_KEYS {
                    gate::rows::<false>(s, p.sm_scale, gs, lim, c2, &mut dw)
                } else {
                    gate::rows::<true>(s, p.sm_scale, gs, lim, c2, &mut dw)
                }
            });
        }
    }
    // SAFETY: whole warps.
    let dw = unsafe { [sync::quad_sum_f32(dw[0]), sync::quad_sum_f32(dw[1])] };
    // SAFETY: this row's outputs, written by this warpgroup only.
    unsafe { store(c, &dq0, &dq1, dw, w, head) };
}

/// Writes the row's dQ (`sm_scale` times the sums times the head's weight
/// `w`, bf16 pairs) and this quad's d_weights (lane 0 of each quad).
///
/// # Safety
/// `head(h)` indexes a query row of the launch (this thread's head `h`);
/// the row's outputs are this warpgroup's.
#[inline(always)]
unsafe fn store(
    c: &Ctx<'_>,
    dq0: &[f32; 32],
    dq1: &[f32; 32],
    dw: [f32; 2],
    w: [f32; 2],
    head: impl Fn(u32) -> usize,
) {
    let p = c.p;
    let lane = c.t % 32;
    let c2 = 2 * (lane % 4);
    let out = p.d_index_q as *mut u32;
    for blk in 0..2usize {
        // (A select, not an array of references: that would live in
        // local memory.)
        let acc = if blk == 0 { dq0 } else { dq1 };
        for j in 0..8u32 {
            for h in 0..2u32 {
                let r = (4 * j + 2 * h) as usize;
                let d = 64 * blk + (8 * j + c2) as usize;
                let f = p.sm_scale * if h == 0 { w[0] } else { w[1] };
                let v = pack_bf16x2(f * acc[r], f * acc[r + 1]);
                // SAFETY: element (head, d) of the row's dQ, 4-byte
                // aligned (d even, d_index_q 4-byte aligned).
                unsafe { *out.add((head(h) * 128 + d) / 2) = v };
            }
        }
    }
    if lane % 4 == 0 {
        for h in 0..2u32 {
            let (at, v) = (head(h), if h == 0 { dw[0] } else { dw[1] });
            // SAFETY: the row's d_weights element of this head.
            unsafe {
                if p.flags & FLAG_DW_F32 != 0 {
                    *(p.d_weights as *mut f32).add(at) = v;
                } else {
                    *(p.d_weights as *mut u16).add(at) = pack_bf16x2(v, 0.0) as u16;
                }
            }
        }
    }
}
