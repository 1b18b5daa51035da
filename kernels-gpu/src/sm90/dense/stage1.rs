//! Stage 1 of dense mode on the GPU (`indexer_dense_score_grad`): the
//! score gradient of raw dense scores, one query row per CTA, written over
//! `index_score`, with the zeroing of the f32 dK accumulator and the
//! row's chunk count fused into the same launch. The wgmma kernel that
//! follows (the sparse path's, on the slots `0..cols` of each row with
//! key ids the plan built once: column j is key j of the row's batch for
//! `j < L`, padding beyond) is its programmatic dependent and reads what
//! this kernel writes only after `griddepcontrol.wait`.
//!
//! Per row (SPEC, "Dense mode"; `L` from [`DenseParams::visible`]):
//! `target_j = max(attn_j / (l1 + 1e-10), CLIP)`, `lp_j = logit_j - lse`,
//! `g_j = -target_j * [lp_j >= -100] * c`, `G = sum_{j<L} g_j`,
//! `grad_signal_j = g_j - exp(lp_j) * G` for `j < L`, 0 beyond. `G` is
//! summed per thread in column order, across each warp by a fixed
//! butterfly and across warps in warp order, so grad_signal is bitwise
//! reproducible. Each column is read and written by one thread only.

use crate::abi::{
    row_chunks_at, DenseParams, DENSE_STAGE1_THREADS, FLAG_ROW_CHUNKS, ROW_CHUNK_SLOTS,
};
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{global, griddep, sreg, sync};
use crate::score::{expf, CLIP};

const THREADS: usize = DENSE_STAGE1_THREADS as usize;
const WARPS: u32 = DENSE_STAGE1_THREADS / 32;

/// `(g_j, lp_j)` of one visible column (module note).
#[inline(always)]
fn terms(attn: f32, logit: f32, denom: f32, lse: f32, c: f32) -> (f32, f32) {
    let lp = logit - lse;
    let t = attn / denom;
    let g = if lp >= -100.0 {
        -(if t > CLIP { t } else { CLIP }) * c
    } else {
        0.0
    };
    (g, lp)
}

/// Dense stage 1. Launch: grid `rows` of [`DENSE_STAGE1_THREADS`]
/// threads, `DENSE_STAGE1_SMEM` bytes of dynamic shared memory.
///
/// # Safety
/// `p` built by the dense plan from validated buffers: `attn_score` and
/// `index_score` hold `rows * cols` f32, `attn_l1norm`, `index_lse` and
/// `visible` `rows` values (`visible[r] <= cols`), `dk_accum` `dk_len` f32
/// (16-byte aligned, `dk_len` a multiple of 4), `d_weights` `rows * heads`
/// elements of the type `flags` names; `FLAG_ROW_CHUNKS` only with
/// `heads >= ROW_CHUNK_MIN_HEADS` and `cols <= ROW_CHUNK_MAX_TOPK`.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn indexer_dense_score_grad(p: DenseParams) {
    // The dependent grid may be scheduled from now on; its
    // griddepcontrol.wait still waits for this whole grid and its writes.
    // SAFETY: a scheduling hint.
    unsafe { griddep::launch_dependents() };
    let tid = sreg::thread_idx_x();
    let (warp, lane) = (tid / 32, tid % 32);
    let (row, ctas) = (sreg::block_idx_x(), sreg::grid_dim_x());

    // ---- zero the f32 dK accumulator (grid-stride, 16-byte stores) ----
    let vecs = p.dk_len as usize / 4;
    let dk = p.dk_accum as *mut u8;
    let mut i = row as usize * THREADS + tid as usize;
    while i < vecs {
        // SAFETY: i < dk_len / 4 vectors of the 16-byte aligned
        // accumulator; each vector is written by one thread.
        unsafe { global::st_v4(dk.add(16 * i), [0; 4]) };
        i += ctas as usize * THREADS;
    }

    // ---- this CTA's row ----
    let (r, cols) = (row as usize, p.cols as usize);
    let base = r * cols;
    let (attn, score) = (p.attn_score as *const f32, p.index_score as *mut f32);
    // SAFETY: r < rows (the grid), inside each per-row input; grad_loss
    // is one f32 on the device.
    let (l, denom, lse, c) = unsafe {
        (
            *(p.visible as *const u32).add(r) as usize,
            *(p.attn_l1norm as *const f32).add(r) + 1e-10,
            *(p.index_lse as *const f32).add(r),
            p.coeff * *(p.grad_loss as *const f32),
        )
    };
    // SAFETY (both loads): j < L <= cols, inside this row's columns.
    let term = |j: usize| unsafe {
        terms(
            global::ld_f32_eager(attn.add(base + j)),
            global::ld_f32_eager(score.add(base + j)),
            denom,
            lse,
            c,
        )
    };

    // ---- pass 1: G ----
    let mut part = 0.0f32;
    let mut j = tid as usize;
    while j < l {
        part += term(j).0;
        j += THREADS;
    }
    let part_at = |w: u32| SmemAddr(smem::base().0 + 4 * w);
    // SAFETY: the whole warp is here (no lane-dependent exit above).
    let part = unsafe { sync::warp_sum_f32(part) };
    if lane == 0 {
        // SAFETY: this warp's own word, inside DENSE_STAGE1_SMEM.
        unsafe { smem::st_f32(part_at(warp), part) };
    }
    // SAFETY: every thread of the CTA reaches it.
    unsafe { sync::bar_sync() };
    let mut big_g = 0.0f32;
    for w in 0..WARPS {
        // SAFETY: written before the barrier.
        big_g += unsafe { smem::ld_f32(part_at(w)) };
    }

    // ---- pass 2: grad_signal over the logits, 0 past L ----
    let mut j = tid as usize;
    while j < cols {
        let gs = if j < l {
            let (g, lp) = term(j);
            g - expf(lp) * big_g
        } else {
            0.0
        };
        // SAFETY: j < cols, this row's column j, read (above, in pass 1
        // and in `term`) only by this thread.
        unsafe { *score.add(base + j) = gs };
        j += THREADS;
    }

    // ---- chunk count for the wgmma kernel (FLAG_ROW_CHUNKS) ----
    if p.flags & FLAG_ROW_CHUNKS != 0 && tid == 0 {
        let at = row_chunks_at(row, p.heads, p.flags);
        // SAFETY: the row's d_weights block has `heads >= 16` elements of
        // 2 or 4 bytes (the launch contract), which the wgmma kernel
        // overwrites after reading this count.
        unsafe {
            *(p.d_weights as *mut u8).add(at).cast::<u16>() =
                l.div_ceil(ROW_CHUNK_SLOTS as usize) as u16
        };
    }
}
