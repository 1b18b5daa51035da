//! The warpgroup-MMA row kernel (sm_90a, H = 64, D = 128): one CTA of two
//! warpgroups per query row, stage 1 fused, K rows of the next 64-slot chunk
//! gathered by `cp.async` while the current one is computed, the three
//! products on `wgmma` from 128-byte-swizzled shared memory (layout and
//! descriptors in [`super`]), dK staged in shared memory and added to the
//! f32 accumulator with coalesced `red.global.add.v4.f32` (one 512-byte row
//! per warp instruction; measured faster than `cp.reduce.async.bulk` and
//! than reductions straight from the MMA fragments).
//!
//! Work split per chunk: warpgroup `wg` computes S for slots
//! `32 wg .. 32 wg + 32` (all 64 heads), then dQ and dK for the D columns
//! `64 wg .. 64 wg + 64`. Every sum feeding d_index_q, d_weights and
//! grad_signal runs in a fixed order, so those outputs are bitwise
//! reproducible; only d_index_k is accumulated by reductions.

use super::{
    desc, swizzle, ATOM_BYTES, CHUNK, DIM, DK_STRIDE, HEADS, K_BLOCK, K_BYTES, Q_BLOCK, ROW_BYTES,
    SMEM, THREADS,
};
use crate::grad::{resolve, score_terms};
use crate::params::{GradParams, FLAG_DW_F32, FLAG_LOG_SCORE};
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{bulk, cp_async, cvt, global, sreg, sync, wgmma};

const WARPS: u32 = THREADS / 32;
/// Staged dK rows each warp reduces per chunk.
const ROWS_PER_WARP: u32 = CHUNK / WARPS;
/// 16-byte vectors per bf16 row of D.
const VECS: u32 = DIM / 8;

/// The kernel body.
///
/// # Safety
/// Launched with [`THREADS`] threads, one CTA per query row (grid
/// `B * S_q`), `SMEM.bytes` of dynamic shared memory, `H = 64`, `D = 128`,
/// and a `GradParams` whose pointers and sizes the host has validated.
#[inline(always)]
unsafe fn row_body(p: &GradParams) {
    const H: usize = HEADS as usize;
    const D: usize = DIM as usize;
    let l = SMEM;
    // The tensor cores apply the swizzle to absolute address bits: align the
    // tiles to 1024 bytes whatever the driver's base alignment is.
    let base = SmemAddr((smem::base().0 + 1023) & !1023);
    let (sq, sk, sds, sdk) = (base.add(l.q), base.add(l.k), base.add(l.ds), base.add(l.dk));
    let sred_rows = base.add(l.red_rows);
    let (sgs0, srows0, sw, sred) = (
        base.add(l.gs),
        base.add(l.rows),
        base.add(l.w),
        base.add(l.red),
    );

    let tid = sreg::thread_idx_x();
    let warp = tid / 32;
    let lane = tid % 32;
    let wg = tid / 128; // warpgroup
    let wi = warp % 4; // warp inside the warpgroup: rows 16 wi .. 16 wi + 16
    let g = lane / 4;
    let c = 2 * (lane % 4);
    let row = sreg::block_idx_x();
    let b = row / p.seq_q.max(1); // seq_q >= 1 (host-checked); max avoids a panic path
    let topk = p.topk as usize;
    let log = p.flags & FLAG_LOG_SCORE != 0;
    let sm_scale = p.sm_scale;
    let row_slots = row as usize * topk;
    let attn = p.attn_score as *mut f32;
    let score = p.index_score as *const f32;
    let ids = p.topk_indices as *const i32;

    // Slot data of chunk `ch` for thread `tid < CHUNK` (target, score, id),
    // `None` past topk. Loaded one chunk before it is needed so the global
    // latency hides behind a chunk of work instead of stalling barrier B1.
    let load_raw = |ch: usize| -> Option<(f32, f32, i32)> {
        let t = ch * CHUNK as usize + tid as usize;
        if tid < CHUNK && t < topk {
            // SAFETY: t < topk, inside this row's slots; slot t is written
            // (grad_signal) only by this thread, after this read.
            Some(unsafe {
                (
                    *attn.add(row_slots + t),
                    *score.add(row_slots + t),
                    *ids.add(row_slots + t),
                )
            })
        } else {
            None
        }
    };
    // Resolved key rows of chunk `raw` into buffer set `set` (no G needed).
    let put_rows = |raw: Option<(f32, f32, i32)>, set: u32| {
        if tid < CHUNK {
            let r = raw.map_or(-1, |(_, _, id)| resolve(id, b, p));
            // SAFETY: slot tid of this set belongs to this thread; its
            // previous readers passed a barrier since (see the loop).
            unsafe { smem::st_u32(srows0.add(4 * (set * CHUNK + tid)), r as u32) };
        }
    };

    // Row ids of chunk 0 first: its K gather can start right after the
    // barrier that also completes G (it does not depend on G).
    let raw0 = load_raw(0);
    put_rows(raw0, 0);
    let mut raw_next = load_raw(1);

    // ---- load: q row into its swizzle blocks (cp.async, waited for with
    // chunk 0's K rows), weights as f32 ----
    let qrow = (p.index_q as *const u8).wrapping_add(row as usize * H * D * 2);
    let mut v = tid;
    while v < HEADS * VECS {
        let (h, cc) = (v / VECS, v % VECS);
        let dst = sq.add((cc / 8) * Q_BLOCK + swizzle(h, (cc % 8) * 16));
        // SAFETY: the row has H*D bf16, 16-byte aligned (host-checked base,
        // D*2 a multiple of 16); the destination vector is this thread's and
        // nobody reads it before this thread's wait_all and a barrier.
        unsafe { cp_async::copy_16(dst, qrow.add(v as usize * 16), 16) };
        v += THREADS;
    }
    let mut h = tid;
    while h < HEADS {
        // SAFETY: weights has B*S_q*H bf16; this thread owns slot h of `sw`.
        unsafe {
            let wb = *(p.weights as *const u16).add(row as usize * H + h as usize);
            smem::st_f32(sw.add(4 * h), cvt::bf16_to_f32(wb));
        }
        h += THREADS;
    }

    // ---- stage 1, pass 1: G = sum_t g_t in a fixed order ----
    // SAFETY: grad_loss is one f32 on the device (host-checked).
    let coeff = p.coeff * unsafe { *(p.grad_loss as *const f32) };
    let mut part = 0.0f32;
    let mut t = tid as usize;
    while t < topk {
        // SAFETY: t < topk, inside this row's slots.
        let (gt, _) = unsafe {
            score_terms(
                *attn.add(row_slots + t),
                *score.add(row_slots + t),
                log,
                coeff,
            )
        };
        part += gt;
        t += THREADS as usize;
    }
    // SAFETY: every lane of every warp reaches these collectives/barriers
    // (the barrier also publishes chunk 0's row ids).
    let big_g = unsafe {
        let wsum = sync::warp_sum_f32(part);
        if lane == 0 {
            smem::st_f32(sred.add(4 * warp), wsum);
        }
        sync::bar_sync();
        let mut s = 0.0f32;
        for w in 0..WARPS {
            s += smem::ld_f32(sred.add(4 * w));
        }
        s
    };

    // Stage 1, pass 2 for chunk `ch` (slot data `raw`) into buffer set
    // `set`, by threads < CHUNK: grad_signal, written in place over
    // attn_score (every pass-1 read finished before the barrier that made
    // G) and kept for the gate.
    let put_gs = |raw: Option<(f32, f32, i32)>, ch: usize, set: u32| {
        if tid < CHUNK {
            let gs = match raw {
                Some((target, sc, _)) => {
                    let (gt, pr) = score_terms(target, sc, log, coeff);
                    let gs = gt - pr * big_g;
                    // SAFETY: raw is Some only for t < topk; this thread
                    // alone writes slot t.
                    unsafe { *attn.add(row_slots + ch * CHUNK as usize + tid as usize) = gs };
                    gs
                }
                None => 0.0,
            };
            // SAFETY: as in put_rows.
            unsafe { smem::st_f32(sgs0.add(4 * (set * CHUNK + tid)), gs) };
        }
    };
    // Gather (cp.async, zero fill for padding) of the K rows of buffer set
    // `set` into K buffer `set`, in swizzle blocks; one group per thread.
    let gather = |set: u32| {
        let kbuf = sk.add(set * K_BYTES);
        let mut v = tid;
        while v < CHUNK * VECS {
            let (slot, cc) = (v / VECS, v % VECS);
            // SAFETY: row ids were written before a barrier; a valid row is
            // < B*S_k so the 16-byte vector lies inside index_k; padding
            // copies 0 bytes (zero fill) from the valid base address.
            unsafe {
                let r = smem::ld_u32(srows0.add(4 * (set * CHUNK + slot))) as i32;
                let (src, n) = if r >= 0 {
                    (
                        (p.index_k as *const u8).add((r as usize * D + cc as usize * 8) * 2),
                        16,
                    )
                } else {
                    (p.index_k as *const u8, 0)
                };
                let dst = kbuf.add((cc / 8) * K_BLOCK + swizzle(slot, (cc % 8) * 16));
                cp_async::copy_16(dst, src, n);
            }
            v += THREADS;
        }
        cp_async::commit_group();
    };

    let mut acc_q = [0.0f32; 32]; // dQ, heads x this warpgroup's 64 D columns
    let mut dw = [0.0f32; 2]; // d_weights partials of heads 16 wi + g (+ 8)
    let dk = p.dk_accum as *mut f32;
    let dcol0 = wg * 64; // this warpgroup's D columns for dQ and dK

    // Pipeline, three barriers per chunk: slot data of c+1 from registers,
    // loads of c+2 issued | wait own copies, fence | B1 | gather(c+1) | S,
    // gate, dS, key rows of the reduction | fence, B2 | dQ, dK | stage dK |
    // B3 | vector reductions. K buffer and slot set (c+1)%2 were last read
    // in chunk c-1 (slot data before its B2, K rows by wgmmas that completed
    // before its B3) and are rewritten after that.
    let nchunks = topk.div_ceil(CHUNK as usize);
    // Chunk 0's row ids passed the barrier inside the G reduction.
    gather(0);
    put_gs(raw0, 0, 0);
    for ch in 0..nchunks {
        let cur = (ch % 2) as u32;
        if ch + 1 < nchunks {
            put_rows(raw_next, 1 - cur);
            put_gs(raw_next, ch + 1, 1 - cur);
            raw_next = load_raw(ch + 2);
        }
        cp_async::wait_all();
        // cp.async writes are generic-proxy writes; wgmma reads through the
        // async proxy.
        bulk::fence_proxy_async_shared();
        // SAFETY: uniform barrier: chunk ch's K rows (and q) complete.
        unsafe { sync::bar_sync() };
        if ch + 1 < nchunks {
            gather(1 - cur);
        }
        let kb = sk.add(cur * K_BYTES);
        let (sgs, srows) = (sgs0.add(4 * cur * CHUNK), srows0.add(4 * cur * CHUNK));

        // ---- MMA: S = q K^T for this warpgroup's 32 slots, K over D in
        // eight steps of 16 (32 bytes inside a swizzled row, then the next
        // 64-column block) ----
        let mut s = [0.0f32; 16];
        let mut da = [0u64; 8];
        let mut db = [0u64; 8];
        for ks in 0..8u32 {
            let off = (ks / 4) * Q_BLOCK + (ks % 4) * 32;
            let koff = (ks / 4) * K_BLOCK + wg * 32 * ROW_BYTES + (ks % 4) * 32;
            da[ks as usize] = desc(sq.0 + off, 16, ATOM_BYTES);
            db[ks as usize] = desc(kb.0 + koff, 16, ATOM_BYTES);
        }
        // SAFETY: whole warpgroup; q and K tiles complete, fenced, barrier.
        unsafe { wgmma::m64n32_kmajor_k8(&mut s, da, db) };

        // ---- epilogue: gate, dS (bf16, swizzled), d_weights partials ----
        // SAFETY: `sgs`, `srows`, `sw` were written before a barrier; each
        // thread stores its own dS pairs (distinct (head, slot) pairs).
        unsafe {
            for j in 0..4u32 {
                let tl = wg * 32 + 8 * j + c;
                let gs = [
                    smem::ld_f32(sgs.add(4 * tl)),
                    smem::ld_f32(sgs.add(4 * (tl + 1))),
                ];
                let valid = [
                    (smem::ld_u32(srows.add(4 * tl)) as i32) >= 0,
                    (smem::ld_u32(srows.add(4 * (tl + 1))) as i32) >= 0,
                ];
                for (half, dwh) in dw.iter_mut().enumerate() {
                    let h = 16 * wi + g + 8 * half as u32;
                    let wh = smem::ld_f32(sw.add(4 * h));
                    let mut ds = [0.0f32; 2];
                    for i in 0..2 {
                        let sv = s[(4 * j) as usize + 2 * half + i] * sm_scale;
                        if valid[i] && sv > 0.0 {
                            ds[i] = gs[i] * wh;
                            *dwh += gs[i] * sv;
                        }
                    }
                    smem::st_u32(sds.add(swizzle(h, tl * 2)), cvt::pack_bf16x2(ds[0], ds[1]));
                }
            }
            bulk::fence_proxy_async_shared();
        }
        // Key rows of the chunk for the reductions at its end, copied now:
        // after B2 the next chunk's slot data may overwrite `srows`, while
        // `sred_rows` is next written after the next chunk's B1.
        if tid < CHUNK {
            // SAFETY: written before B1; slot tid belongs to this thread.
            unsafe { smem::st_u32(sred_rows.add(4 * tid), smem::ld_u32(srows.add(4 * tid))) };
        }
        // SAFETY: uniform barrier: dS complete and fenced.
        unsafe { sync::bar_sync() };

        // ---- MMA: dQ += dS K (A = dS K-major: heads x slots; B = K chunk
        // MN-major: slots x this warpgroup's 64 D columns) ----
        let mut da4 = [0u64; 4];
        let mut db4 = [0u64; 4];
        for ks in 0..4u32 {
            da4[ks as usize] = desc(sds.0 + ks * 32, 16, ATOM_BYTES);
            db4[ks as usize] = desc(
                kb.0 + wg * K_BLOCK + ks * 16 * ROW_BYTES,
                K_BLOCK,
                ATOM_BYTES,
            );
        }
        // SAFETY: whole warpgroup; dS fenced and behind barrier B2.
        unsafe { wgmma::m64n64_ak_bmn_k4(&mut acc_q, da4, db4) };

        // ---- MMA: dK = dS^T q (A = dS MN-major: heads x slots read as
        // slots x heads; B = q MN-major: heads x this warpgroup's D) ----
        let mut kacc = [0.0f32; 32];
        for ks in 0..4u32 {
            da4[ks as usize] = desc(sds.0 + ks * 16 * ROW_BYTES, K_BLOCK, ATOM_BYTES);
            db4[ks as usize] = desc(
                sq.0 + wg * Q_BLOCK + ks * 16 * ROW_BYTES,
                Q_BLOCK,
                ATOM_BYTES,
            );
        }
        // SAFETY: as above.
        unsafe { wgmma::m64n64_amn_bmn_k4(&mut kacc, da4, db4) };

        // ---- reduce: stage dK rows (f32, scaled) in shared memory, then
        // each warp adds eight whole rows with coalesced vector reductions
        // (one 512-byte row per warp instruction). The staging tile is free
        // again once every warp has read it, i.e. at the next chunk's B1. ----
        // SAFETY: each thread writes its own fragment elements (distinct
        // (slot, column) pairs); uniform barrier before the reads.
        unsafe {
            for j in 0..8u32 {
                for half in 0..2u32 {
                    let slot = 16 * wi + g + 8 * half;
                    let col = dcol0 + 8 * j + c;
                    let r = (4 * j + 2 * half) as usize;
                    let at = sdk.add(slot * DK_STRIDE + col * 4);
                    smem::st_v2_f32(at, kacc[r] * sm_scale, kacc[r + 1] * sm_scale);
                }
            }
            sync::bar_sync();
        }
        for i in 0..ROWS_PER_WARP {
            let slot = warp * ROWS_PER_WARP + i;
            // SAFETY: the staged row and its key row are complete (barrier
            // above); a valid key row lies inside the (B*S_k, D)
            // accumulator, 16-byte aligned (host-checked base, D*4 a
            // multiple of 16).
            unsafe {
                let r = smem::ld_u32(sred_rows.add(4 * slot)) as i32;
                if r >= 0 {
                    let v = smem::ld_v4_f32(sdk.add(slot * DK_STRIDE + lane * 16));
                    global::red_add_v4_f32(dk.add(r as usize * D + lane as usize * 4), v);
                }
            }
        }
    }

    // ---- epilogue: d_index_q (bf16 pairs) ----
    let dq = (p.d_index_q as *mut u32).wrapping_add(row as usize * H * D / 2);
    for j in 0..8u32 {
        for half in 0..2u32 {
            let h = 16 * wi + g + 8 * half;
            let col = dcol0 + 8 * j + c;
            let r = (4 * j + 2 * half) as usize;
            let w = cvt::pack_bf16x2(acc_q[r] * sm_scale, acc_q[r + 1] * sm_scale);
            // SAFETY: (h, col) is inside this row's H x D block; col even.
            unsafe { *dq.add((h as usize * D + col as usize) / 2) = w };
        }
    }

    // ---- epilogue: d_weights, fixed-order reduction over lanes and the
    // two warpgroups (slot halves) ----
    // SAFETY: full warps run the shuffles; `sred` is free (its last readers
    // passed several barriers); uniform barrier before the cross-warp sum.
    unsafe {
        let quad = [sync::quad_sum_f32(dw[0]), sync::quad_sum_f32(dw[1])];
        if lane % 4 == 0 {
            for (half, &v) in quad.iter().enumerate() {
                let h = 16 * wi + g + 8 * half as u32;
                smem::st_f32(sred.add(4 * (warp * HEADS + h)), v);
            }
        }
        sync::bar_sync();
        let mut h = tid;
        while h < HEADS {
            // Head h lives in warp h / 16 of each warpgroup.
            let mut sum = 0.0f32;
            for wgi in 0..THREADS / 128 {
                let w = wgi * 4 + h / 16;
                sum += smem::ld_f32(sred.add(4 * (w * HEADS + h)));
            }
            let idx = row as usize * H + h as usize;
            if p.flags & FLAG_DW_F32 != 0 {
                *(p.d_weights as *mut f32).add(idx) = sum;
            } else {
                *(p.d_weights as *mut u16).add(idx) = cvt::pack_bf16x2(sum, 0.0) as u16;
            }
            h += THREADS;
        }
    }
}

/// Warpgroup-MMA row kernel for H = 64, D = 128; see [`row_body`] for the
/// launch contract.
///
/// # Safety
/// As [`row_body`].
#[no_mangle]
pub unsafe extern "ptx-kernel" fn indexer_bwd_wg_h64_d128(p: GradParams) {
    // SAFETY: forwarded launch contract.
    unsafe { row_body(&p) }
}
