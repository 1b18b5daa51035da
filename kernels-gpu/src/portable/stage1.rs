//! Stage 1 of the two-launch paths (the Hopper fast path, and the
//! Blackwell path, compiled and assembled for sm_100f but not executed):
//! the score gradient (grad_signal, written in place over `attn_score`),
//! with the zeroing of the f32 dK accumulator fused into the same launch.
//! The persistent stage-2 kernels are launched as its programmatic
//! dependents: they set up and load q and their first K rows while this
//! grid runs, and wait (`griddepcontrol.wait`) before they read
//! grad_signal or add into dK. With `FLAG_ROW_CHUNKS` (Hopper fast path,
//! topk >= 512) each row's live chunk count is also written for the
//! stage-2 kernel (see that flag).
//!
//! A row is shared by [`stage1_warps_per_row`] warps, enough that each
//! thread holds its [`STAGE1_UNROLL`] slots' scores in registers from the
//! load that sums G to the store of grad_signal: every score is read from
//! memory once (a second pass that reloads them reads them from DRAM
//! again at large topk, where they no longer stay in L2). Rows longer than
//! a CTA holds make two passes.
//!
//! `G = sum_t g_t` is summed per thread in slot order, across each warp by
//! a fixed butterfly and across the row's warps in warp order, so
//! grad_signal is bitwise reproducible run to run.

use crate::abi::{
    row_chunks_at, stage1_warps_per_row, GradParams, FLAG_LOG_SCORE, FLAG_ROW_CHUNKS,
    ROW_CHUNK_SLOTS, STAGE1_DIM, STAGE1_THREADS, STAGE1_UNROLL, STAGE1_WARPS,
};
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{global, griddep, sreg, sync};
use crate::score::{load_id, resolve, score_terms};

/// Slots per thread and pass.
const UNROLL: usize = STAGE1_UNROLL as usize;

/// Defines a stage-1 entry `$name` for head dimension `$dim` (only the
/// zeroing of the `B*S_k*$dim` accumulator depends on it; the score
/// gradient does not involve D). A macro, not a generic body, so that
/// each entry is compiled from one function as the D = 128 one always was.
macro_rules! score_grad_kernel {
    ($(#[$doc:meta])* $name:ident, $dim:expr) => {
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $name(p: GradParams) {
            const DIM: u32 = $dim;
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

            // ---- one query row per group of `wpr` warps ----
            // Every thread goes on to the barriers below (a CTA-uniform count);
            // threads whose row is past the last read and write no slot data.
            let wpr = stage1_warps_per_row(p.topk);
            let tpr = 32 * wpr as usize; // threads per row
            let row = cta * (STAGE1_WARPS / wpr) + warp / wpr;
            let live_row = row < p.batch * p.seq_q;
            let first_warp = warp - warp % wpr; // the row's first warp
            let rt = (warp % wpr) as usize * 32 + lane as usize; // thread in the row
            let topk = p.topk as usize;
            let span = tpr * UNROLL; // slots per pass
            let passes = topk.div_ceil(span);
            let base = row as usize * topk;
            let log = p.flags & FLAG_LOG_SCORE != 0;
            let attn = p.attn_score as *mut f32;
            let score = p.index_score as *const f32;
            // SAFETY: grad_loss is one f32 on the device (host-checked).
            let coeff = p.coeff * unsafe { *(p.grad_loss as *const f32) };
            // Word `w` (a warp) of per-warp partial array `k` (G, the last slots'
            // count, the full scan's count).
            let part_at = |k: u32, w: u32| SmemAddr(smem::base().0 + 4 * (k * STAGE1_WARPS + w));
            // Slot `u` of pass `b` of this thread (consecutive threads, consecutive
            // slots: coalesced).
            let slot = |b: usize, u: usize| b * span + u * tpr + rt;
            // This thread's slots of pass `b`: all loads issue back to back
            // (clamped instead of branched, which took more registers; callers
            // ignore slots past topk).
            let load = |b: usize| {
                let mut v = [(0.0f32, 0.0f32); UNROLL];
                if live_row {
                    for (u, x) in v.iter_mut().enumerate() {
                        let t = slot(b, u).min(topk - 1);
                        // SAFETY: t < topk (topk >= 1), inside this row's slots.
                        *x = unsafe {
                            (
                                global::ld_f32_eager(attn.add(base + t)),
                                global::ld_f32_eager(score.add(base + t)),
                            )
                        };
                    }
                }
                v
            };
            let row_chunks = p.flags & FLAG_ROW_CHUNKS != 0 && live_row;
            let b = row / p.seq_q.max(1);
            // The id of the row's slot `topk - 1 - rt` (the row's last `tpr`
            // slots), loaded before the scores so its latency overlaps theirs.
            let last_id = if row_chunks && rt < topk {
                // SAFETY: topk - 1 - rt < topk, inside this row's slots.
                unsafe { load_id(&p, base + topk - 1 - rt) }
            } else {
                -1
            };

            // ---- pass 1: G (and the last slots' count) ----
            let mut v = load(0);
            let mut part = 0.0f32;
            for pass in 0..passes {
                if pass > 0 {
                    v = load(pass);
                }
                for (u, &(a, sc)) in v.iter().enumerate() {
                    if slot(pass, u) < topk {
                        part += score_terms(a, sc, log, coeff).0;
                    }
                }
            }
            let tail = if resolve(last_id, b, &p) >= 0 {
                (topk - rt) as u32
            } else {
                0
            };
            // SAFETY: `row` is uniform across each warp, so all 32 lanes are here.
            let (part, tail) = unsafe { (sync::warp_sum_f32(part), sync::warp_max_u32(tail)) };
            if lane == 0 {
                // SAFETY: this warp's own words, inside STAGE1_SMEM.
                unsafe {
                    smem::st_f32(part_at(0, warp), part);
                    smem::st_u32(part_at(1, warp), tail);
                }
            }
            // SAFETY: every thread of the CTA reaches it (no early exit above).
            unsafe { sync::bar_sync() };
            let (mut big_g, mut live) = (0.0f32, 0u32);
            for w in first_warp..first_warp + wpr {
                // SAFETY: written before the barrier.
                unsafe {
                    big_g += smem::ld_f32(part_at(0, w));
                    live = live.max(smem::ld_u32(part_at(1, w)));
                }
            }

            // ---- pass 2: grad_signal (from registers when one pass holds the row) ----
            for pass in 0..passes {
                if passes > 1 {
                    v = load(pass);
                }
                for (u, &(a, sc)) in v.iter().enumerate() {
                    let t = slot(pass, u);
                    if live_row && t < topk {
                        let (g, pr) = score_terms(a, sc, log, coeff);
                        // SAFETY: as above; this thread alone touches slot t, and
                        // every read of it (this thread's) came before.
                        unsafe { *attn.add(base + t) = g - pr * big_g };
                    }
                }
            }

            // ---- chunk count for the stage-2 kernel (FLAG_ROW_CHUNKS) ----
            if p.flags & FLAG_ROW_CHUNKS != 0 {
                // Rows whose last `tpr` slots are all padding (causal selections
                // padded at the end) scan all their ids for the last valid one.
                let mut best = 0u32;
                if row_chunks && live == 0 {
                    for pass in 0..passes {
                        let mut id = [0i32; UNROLL];
                        for (u, x) in id.iter_mut().enumerate() {
                            let t = slot(pass, u).min(topk - 1);
                            // SAFETY: t < topk, inside this row's slots.
                            *x = unsafe { load_id(&p, base + t) };
                        }
                        for (u, &x) in id.iter().enumerate() {
                            let t = slot(pass, u);
                            if t < topk && resolve(x, b, &p) >= 0 {
                                best = best.max(t as u32 + 1);
                            }
                        }
                    }
                }
                // SAFETY: `row` is uniform across each warp.
                let best = unsafe { sync::warp_max_u32(best) };
                if lane == 0 {
                    // SAFETY: this warp's own word, inside STAGE1_SMEM.
                    unsafe { smem::st_u32(part_at(2, warp), best) };
                }
                // SAFETY: every thread of the CTA reaches it (the flag is uniform).
                unsafe { sync::bar_sync() };
                if row_chunks && rt == 0 {
                    for w in first_warp..first_warp + wpr {
                        // SAFETY: written before the barrier.
                        live = live.max(unsafe { smem::ld_u32(part_at(2, w)) });
                    }
                    let at = row_chunks_at(row, p.heads, p.flags);
                    // SAFETY: the host sets the flag only for H >= ROW_CHUNK_MIN_HEADS
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
    };
}

score_grad_kernel!(
    /// Launch: grid `stage1_grid(B*S_q, topk)` of [`STAGE1_THREADS`]
    /// threads, `STAGE1_SMEM` bytes of dynamic shared memory.
    ///
    /// # Safety
    /// `p` validated by the host as for the row kernel, `D = STAGE1_DIM`,
    /// `topk >= 1`; `dk_accum` holds `B*S_k*D` f32 and is 16-byte aligned.
    indexer_score_grad_d128,
    STAGE1_DIM
);

#[cfg(kernels_arch = "sm_90a")]
score_grad_kernel!(
    /// Stage 1 ahead of the D = 64 wgmma row kernel
    /// (`indexer_bwd_wg_h64_d64`): as `indexer_score_grad_d128`, zeroing a
    /// `B*S_k*64` accumulator.
    ///
    /// # Safety
    /// As `indexer_score_grad_d128` with `D = 64`.
    indexer_score_grad_d64,
    64
);
