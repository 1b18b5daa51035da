//! The outputs of a row, at its last item: d_index_q (bf16 pairs, from the
//! dQ accumulators) and d_weights (the threads' partials summed over lanes
//! and warps in a fixed order, so both outputs are bitwise reproducible).

use super::ctx::Ctx;
use super::{DIM, HEADS, Q_HEADS, SPLIT, THREADS};
use crate::abi::FLAG_DW_F32;
use crate::ptx::{cvt, smem, sync};

/// Stores d_index_q of query row `row` from this thread's dQ accumulators
/// and parks its d_weights partials (`dw`, summed over the lanes of each
/// quad) in shared memory for [`sum_dw`]; clears both. D = 64 (`SPLIT`):
/// only warpgroup 0 holds dQ and stores it. Fewer heads than the tile's
/// rows (`Q_HEADS < HEADS`): only the warps of real heads store (each
/// warp's 16 heads are all real or all padding).
///
/// # Safety
/// Full warps (the shuffles), uniform control flow; the partials' region
/// was last read before this item's B2 (pipeline note).
#[rustc_force_inline]
pub(super) unsafe fn store_dq_park_dw<const PAIRED: bool, const HALF: u32>(
    c: &Ctx<'_, PAIRED, HALF>,
    row: usize,
    acc_q: &mut [f32; 32],
    dw: &mut [f32; 2],
) {
    const H: usize = Q_HEADS as usize;
    const D: usize = DIM as usize;
    let (p, wi, g, sm_scale) = (c.p, c.wi, c.g, c.sm_scale);
    if (!SPLIT || c.wg == 0) && (Q_HEADS >= HEADS || 16 * wi < Q_HEADS) {
        // This thread's first (head, column) pair of the row (of this
        // half's heads with HEAD_HALVES); the others are constant offsets
        // from it (keeps one live address).
        let head = c.head0() + 16 * wi + g;
        let dq = (p.d_index_q as *mut u32)
            .wrapping_add((row * H * D + head as usize * D + (c.dcol0 + c.c) as usize) / 2);
        let mut packed = [0u32; 16];
        for (i, w) in packed.iter_mut().enumerate() {
            *w = cvt::pack_bf16x2(acc_q[2 * i] * sm_scale, acc_q[2 * i + 1] * sm_scale);
        }
        for j in 0..8usize {
            for half in 0..2usize {
                // Register 4j + 2half holds (head 16 wi + g + 8 half,
                // column dcol0 + 8j + c).
                // SAFETY: inside this row's H x D block; the column is even.
                unsafe { *dq.add(half * 8 * D / 2 + 4 * j) = packed[2 * j + half] };
            }
        }
    }
    *acc_q = [0.0; 32];
    // SAFETY: the caller's contract.
    unsafe {
        let quad = [sync::quad_sum_f32(dw[0]), sync::quad_sum_f32(dw[1])];
        if c.lane % 4 == 0 {
            for (half, &v) in quad.iter().enumerate() {
                let h = 16 * wi + g + 8 * half as u32;
                smem::st_f32(c.sred.add(4 * (c.warp * HEADS + h)), v);
            }
        }
    }
    *dw = [0.0; 2];
}

/// Sums the parked d_weights partials of query row `row` (the two
/// warpgroups' slot halves, in order) and stores those of its `Q_HEADS`
/// heads (with `HEAD_HALVES`, of this half's 64).
///
/// # Safety
/// After the barrier M that follows [`store_dq_park_dw`].
#[rustc_force_inline]
pub(super) unsafe fn sum_dw<const PAIRED: bool, const HALF: u32>(
    c: &Ctx<'_, PAIRED, HALF>,
    row: usize,
) {
    const H: usize = Q_HEADS as usize;
    let p = c.p;
    let h0 = c.head0() as usize;
    let mut h = c.tid;
    // Real heads only (the padded ones' partials are 0, never stored).
    while h < Q_HEADS.min(HEADS) {
        // Head h lives in warp h / 16 of each warpgroup: sum the
        // two warpgroups' partials (slot halves) in order.
        // SAFETY: partials written before barrier M.
        let sum = unsafe {
            let mut sum = 0.0f32;
            for wgi in 0..THREADS / 128 {
                let w = wgi * 4 + h / 16;
                sum += smem::ld_f32(c.sred.add(4 * (w * HEADS + h)));
            }
            sum
        };
        let idx = row * H + h0 + h as usize;
        // SAFETY: idx < B*S_q*H, the d_weights length (host-checked).
        unsafe {
            if p.flags & FLAG_DW_F32 != 0 {
                *(p.d_weights as *mut f32).add(idx) = sum;
            } else {
                *(p.d_weights as *mut u16).add(idx) = cvt::pack_bf16x2(sum, 0.0) as u16;
            }
        }
        h += THREADS;
    }
}
