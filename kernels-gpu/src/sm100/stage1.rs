//! sm_100a stage 1: the score gradient (grad_signal, written in place over
//! `attn_score`) for [`SM100_STAGE1_ROWS`] query rows per CTA, one warp per
//! row, with the zeroing of the f32 dK accumulator fused into the same
//! launch. The stage-2 kernel is launched as its programmatic dependent and
//! waits (`griddepcontrol.wait`) before reading grad_signal or touching dK.
//! **Compiled and assembled for sm_100a, not executed.**
//!
//! Same math as the row kernel's stage 1 (`crate::score`); `G = sum_t g_t`
//! is summed per lane in slot order, then across the warp by a fixed
//! butterfly, so grad_signal is bitwise reproducible run to run.

use crate::params::{
    GradParams, FLAG_LOG_SCORE, SM100_DIM, SM100_STAGE1_ROWS, SM100_STAGE1_THREADS,
};
use crate::ptx::{global, griddep, sreg, sync};
use crate::score::score_terms;

/// Launch: grid `ceil(B*S_q / SM100_STAGE1_ROWS)` (at least 1) of
/// [`SM100_STAGE1_THREADS`] threads, no dynamic shared memory.
///
/// # Safety
/// `p` validated by the host as for the row kernel; `dk_accum` holds
/// `B*S_k*128` f32 and is 16-byte aligned.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn sm100_score_grad(p: GradParams) {
    // The dependent (stage-2) grid may be scheduled from now on: it only
    // runs its prologue (barriers, tensor memory) before its
    // griddepcontrol.wait, which waits for this whole grid and its writes.
    // SAFETY: a scheduling hint.
    unsafe { griddep::launch_dependents() };
    let tid = sreg::thread_idx_x();
    let (warp, lane) = (tid / 32, tid % 32);
    let (cta, ctas) = (sreg::block_idx_x(), sreg::grid_dim_x());

    // ---- zero the f32 dK accumulator (grid-stride, 16-byte stores) ----
    let vecs = p.batch as usize * p.seq_k as usize * (SM100_DIM as usize / 4);
    let dk = p.dk_accum as *mut u8;
    let stride = ctas as usize * SM100_STAGE1_THREADS as usize;
    let mut i = cta as usize * SM100_STAGE1_THREADS as usize + tid as usize;
    while i < vecs {
        // SAFETY: i < B*S_k*128/4 vectors of the 16-byte aligned accumulator.
        unsafe { global::st_v4(dk.add(16 * i), [0; 4]) };
        i += stride;
    }

    // ---- one query row per warp ----
    let row = cta * SM100_STAGE1_ROWS + warp;
    let rows = p.batch * p.seq_q;
    if row >= rows {
        return;
    }
    let topk = p.topk as usize;
    let base = row as usize * topk;
    let log = p.flags & FLAG_LOG_SCORE != 0;
    let attn = p.attn_score as *mut f32;
    let score = p.index_score as *const f32;
    // SAFETY: grad_loss is one f32 on the device (host-checked).
    let coeff = p.coeff * unsafe { *(p.grad_loss as *const f32) };
    let mut part = 0.0f32;
    let mut t = lane as usize;
    while t < topk {
        // SAFETY: t < topk, inside this row's slots.
        let (g, _) = unsafe { score_terms(*attn.add(base + t), *score.add(base + t), log, coeff) };
        part += g;
        t += 32;
    }
    // SAFETY: `row` is uniform across the warp, so all 32 lanes are here.
    let big_g = unsafe { sync::warp_sum_f32(part) };
    let mut t = lane as usize;
    while t < topk {
        // SAFETY: as above; this lane is the only one touching slot t, and
        // the warp's pass-1 reads of it finished before the shuffles.
        unsafe {
            let (g, pr) = score_terms(*attn.add(base + t), *score.add(base + t), log, coeff);
            *attn.add(base + t) = g - pr * big_g;
        }
        t += 32;
    }
}
