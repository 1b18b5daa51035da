//! Stage 1 of the two-launch paths (the Hopper fast path, and the
//! Blackwell path, compiled and assembled for sm_100a but not executed):
//! the score gradient (grad_signal,
//! written in place over `attn_score`) for [`STAGE1_ROWS`] query rows per
//! CTA, one warp per row, with the zeroing of the f32 dK accumulator fused
//! into the same launch. The persistent stage-2 kernels are launched as its
//! programmatic dependents: they set up and load q and their first K rows
//! while this grid runs, and wait (`griddepcontrol.wait`) before they read
//! grad_signal or add into dK. With `FLAG_ROW_CHUNKS` (Hopper fast path,
//! topk >= 512) each warp also writes its row's live chunk count for the
//! stage-2 kernel (see that flag).
//!
//! `G = sum_t g_t` is summed per lane in slot order, then across the warp by
//! a fixed butterfly, so grad_signal is bitwise reproducible run to run.

use crate::params::{
    row_chunks_at, GradParams, FLAG_LOG_SCORE, FLAG_ROW_CHUNKS, ROW_CHUNK_SLOTS, STAGE1_DIM as DIM,
    STAGE1_ROWS, STAGE1_THREADS,
};
use crate::ptx::{global, griddep, sreg, sync};
use crate::score::{resolve, score_terms};

/// Launch: grid `ceil(B*S_q / STAGE1_ROWS)` of [`STAGE1_THREADS`] threads,
/// no dynamic shared memory.
///
/// # Safety
/// `p` validated by the host as for the row kernel, `D = DIM`; `dk_accum`
/// holds `B*S_k*D` f32 and is 16-byte aligned.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn indexer_score_grad_d128(p: GradParams) {
    // The dependent grid may be scheduled from now on; its
    // griddepcontrol.wait still waits for this whole grid and its writes.
    // SAFETY: a scheduling hint.
    unsafe { griddep::launch_dependents() };
    let tid = sreg::thread_idx_x();
    let (warp, lane) = (tid / 32, tid % 32);
    let (cta, ctas) = (sreg::block_idx_x(), sreg::grid_dim_x());

    // ---- zero the f32 dK accumulator (grid-stride, 16-byte stores) ----
    let vecs = p.batch as usize * p.seq_k as usize * (DIM as usize / 4);
    let dk = p.dk_accum as *mut u8;
    let stride = ctas as usize * STAGE1_THREADS as usize;
    let mut i = cta as usize * STAGE1_THREADS as usize + tid as usize;
    while i < vecs {
        // SAFETY: i < B*S_k*D/4 vectors of the 16-byte aligned accumulator;
        // each vector is written by one thread.
        unsafe { global::st_v4(dk.add(16 * i), [0; 4]) };
        i += stride;
    }

    // ---- one query row per warp ----
    let row = cta * STAGE1_ROWS + warp;
    if row >= p.batch * p.seq_q {
        return;
    }
    let topk = p.topk as usize;
    let base = row as usize * topk;
    let log = p.flags & FLAG_LOG_SCORE != 0;
    let attn = p.attn_score as *mut f32;
    let score = p.index_score as *const f32;
    // SAFETY: grad_loss is one f32 on the device (host-checked).
    let coeff = p.coeff * unsafe { *(p.grad_loss as *const f32) };
    // Both passes load UNROLL slots per lane before using any, so each lane
    // keeps that many loads in flight (a warp walks a whole row; one load at
    // a time made the kernel latency-bound at large topk). Sums stay in slot
    // order per lane.
    const UNROLL: usize = 8;
    let load = |t0: usize| {
        let mut v = [(0.0f32, 0.0f32); UNROLL];
        for (u, x) in v.iter_mut().enumerate() {
            // Clamped instead of branched so all loads issue back to back;
            // the callers ignore the values of slots past topk.
            let t = (t0 + 32 * u).min(topk - 1);
            // SAFETY: t < topk (topk >= 1), inside this row's slots.
            *x = unsafe {
                (
                    global::ld_f32_eager(attn.add(base + t)),
                    global::ld_f32_eager(score.add(base + t)),
                )
            };
        }
        v
    };
    // Ids of the last UNROLL * 32 slots ending at `end`, for the chunk
    // count below; clamped so the loads issue back to back (slots below the
    // window are ignored there).
    let row_chunks = p.flags & FLAG_ROW_CHUNKS != 0;
    let b = row / p.seq_q;
    let ids = p.topk_indices as *const i32;
    let load_ids = |end: usize| {
        let mut v = [0i32; UNROLL];
        for (u, x) in v.iter_mut().enumerate() {
            let t = end.saturating_sub(1 + lane as usize + 32 * u);
            // SAFETY: t < topk, inside this row's slots.
            *x = unsafe { *ids.add(base + t) };
        }
        v
    };
    // Issued before the score passes so their latency overlaps them.
    let first_ids = if row_chunks {
        load_ids(topk)
    } else {
        [0; UNROLL]
    };
    let mut part = 0.0f32;
    let mut t0 = lane as usize;
    while t0 < topk {
        let v = load(t0);
        for (u, &(a, sc)) in v.iter().enumerate() {
            if t0 + 32 * u < topk {
                part += score_terms(a, sc, log, coeff).0;
            }
        }
        t0 += 32 * UNROLL;
    }
    // SAFETY: `row` is uniform across the warp, so all 32 lanes are here.
    let big_g = unsafe { sync::warp_sum_f32(part) };
    let mut t0 = lane as usize;
    while t0 < topk {
        let v = load(t0);
        for (u, &(a, sc)) in v.iter().enumerate() {
            let t = t0 + 32 * u;
            if t < topk {
                let (g, pr) = score_terms(a, sc, log, coeff);
                // SAFETY: as above; this lane alone touches slot t, and the
                // warp's pass-1 reads of it finished before the shuffles.
                unsafe { *attn.add(base + t) = g - pr * big_g };
            }
        }
        t0 += 32 * UNROLL;
    }

    // ---- chunk count for the stage-2 kernel (FLAG_ROW_CHUNKS) ----
    if row_chunks {
        // The last valid slot, scanning back from the end UNROLL * 32 slots
        // at a time (one step, loaded before the passes above, for a row
        // whose last slot is valid; rows padded at the end, as causal
        // selections are, take a few more).
        let mut live; // slots up to and including the last valid one
        let mut end = topk;
        let mut ids_v = first_ids;
        loop {
            let mut best = 0u32;
            for (u, &id) in ids_v.iter().enumerate() {
                let back = 1 + lane as usize + 32 * u;
                if back <= end && resolve(id, b, &p) >= 0 {
                    best = best.max((end - back + 1) as u32);
                }
            }
            // SAFETY: `row` and `end` are uniform across the warp.
            live = unsafe { sync::warp_max_u32(best) };
            end = end.saturating_sub(32 * UNROLL);
            if live > 0 || end == 0 {
                break;
            }
            ids_v = load_ids(end);
        }
        if lane == 0 {
            let at = row_chunks_at(row, p.flags);
            // SAFETY: the host sets the flag only for H = ROW_CHUNK_HEADS
            // and topk <= ROW_CHUNK_MAX_TOPK; the row's d_weights block has
            // H elements of 2 or 4 bytes (at least 2-byte aligned), which
            // the stage-2 kernel overwrites after reading this count.
            unsafe {
                *(p.d_weights as *mut u8).add(at).cast::<u16>() =
                    live.div_ceil(ROW_CHUNK_SLOTS) as u16;
            }
        }
    }
}
