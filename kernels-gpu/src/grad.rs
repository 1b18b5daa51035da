//! The fused row kernel: stage 1 (score gradient, written in place over
//! `attn_score`) and stage 2 (S, gate, dS, d_weights, d_index_q, scatter-add
//! into the f32 `d_index_k` accumulator) for one query row per CTA.
//!
//! Roles inside a CTA (all threads take part in each, separated by
//! `bar.sync`): load (q, w, then per chunk the gathered K rows), MMA (S, dQ,
//! dK on `mma.sync` tensor cores), epilogue/reduce (gate and dS, d_weights,
//! the dK scatter with `red.global.add.f32`, final dQ/dW stores).
//!
//! Determinism: every sum that feeds `d_index_q`, `d_weights` or
//! grad_signal is taken in a fixed order inside one CTA, so those outputs
//! are bitwise reproducible; only `d_index_k` uses atomics.

use crate::abi::{GradParams, FLAG_DW_F32, FLAG_LOG_SCORE};
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{bulk, cp_async, cvt, ldmatrix, mma, sreg, sync};
// Re-exported for other kernels that use them through `crate::grad`.
pub(crate) use crate::score::{load_id, resolve, score_terms};
use crate::tiles::{
    RowSmem, CHUNK, DK_PAD, GRAD_THREADS, GRAD_WARPS, MMA_K, MMA_M, MMA_N, ROW_PAD,
};

/// Byte address of bf16 element `(r, col)` of a shared tile with `cols`
/// logical columns (rows padded by [`ROW_PAD`]).
#[inline(always)]
fn at(tile: SmemAddr, cols: u32, r: u32, col: u32) -> SmemAddr {
    tile.add((r * (cols + ROW_PAD) + col) * 2)
}

/// "col" B operands of `NQ` consecutive 8-column n-tiles starting at column
/// `col0` of `tile`, for reduction rows `row` (this lane's ldmatrix row:
/// `k0 + lj + (li & 1) * 8`): one transposed `ldmatrix` covers both
/// n-tiles when `NQ == 2`.
///
/// # Safety
/// Full warp; rows `k0..k0 + 16` and columns `col0..col0 + 8 * NQ` inside
/// the tile.
#[inline(always)]
unsafe fn col_operand<const NQ: usize>(
    tile: SmemAddr,
    cols: u32,
    row: u32,
    col0: u32,
    li: u32,
) -> [[u32; 2]; NQ] {
    let mut b = [[0u32; 2]; NQ];
    if NQ == 2 {
        // Matrices (k0, col0), (k0 + 8, col0), (k0, col0 + 8), (k0 + 8, col0 + 8).
        // SAFETY: forwarded.
        let r = unsafe { ldmatrix::x4_trans(at(tile, cols, row, col0 + (li >> 1) * 8)) };
        b[0] = [r[0], r[1]];
        b[NQ - 1] = [r[2], r[3]];
    } else {
        // SAFETY: forwarded.
        b[0] = unsafe { ldmatrix::x2_trans(at(tile, cols, row, col0)) };
    }
    b
}

/// The kernel body for `H` heads and head dimension `D`; `MT = H / 16`
/// m-tiles of heads, `NQ = D / 64` n-tiles of D columns per warp.
///
/// # Safety
/// Launched with `GRAD_THREADS` threads, one CTA per query row (grid
/// `B * S_q`), `RowSmem::new(H, D).bytes` of dynamic shared memory, and a
/// `GradParams` whose pointers and sizes the host has validated.
#[inline(always)]
unsafe fn rows<
    const H: usize,
    const D: usize,
    const MT: usize,
    const NQ: usize,
    const SHG: usize,
    const SMT: usize,
>(
    p: &GradParams,
) {
    const { assert!(MT * MMA_M as usize == H && NQ * (MMA_N * GRAD_WARPS) as usize == D) };
    // S tiling: SHG head groups x (GRAD_WARPS / SHG) slot groups; a warp owns
    // SMT m-tiles of heads and SHG n-tiles of 8 slots.
    const { assert!(SMT * SHG == MT && (GRAD_WARPS as usize).is_multiple_of(SHG)) };
    let (h_u, d_u) = (H as u32, D as u32);
    let l = RowSmem::new(h_u, d_u);
    let base = smem::base();
    let (sq, sk, sds) = (base.add(l.q), base.add(l.k), base.add(l.ds));
    let (sgs, srows, sw, sred) = (
        base.add(l.gs),
        base.add(l.rows),
        base.add(l.w),
        base.add(l.red),
    );
    let sdk = base.add(l.dk);
    let dk_stride = (d_u + DK_PAD) * 4; // bytes per staged dK row

    let tid = sreg::thread_idx_x();
    let warp = tid / 32;
    let lane = tid % 32;
    let g = lane / 4;
    let c = 2 * (lane % 4);
    // ldmatrix addressing: lane gives row `lj` of 8x8 matrix `li`.
    let (li, lj) = (lane / 8, lane % 8);
    let row = sreg::block_idx_x();
    let b = row / p.seq_q.max(1); // seq_q >= 1 (host-checked); max avoids a panic path
    let topk = p.topk as usize;
    let log = p.flags & FLAG_LOG_SCORE != 0;
    let sm_scale = p.sm_scale;
    let row_slots = row as usize * topk;
    let attn = p.attn_score as *mut f32;
    let score = p.index_score as *const f32;

    // ---- load: q row (cp.async, waited for with chunk 0's K rows) and
    // weights into shared memory ----
    let vec_per_row = d_u / 8; // 16-byte vectors per bf16 row of D
    let qrow = (p.index_q as *const u8).wrapping_add(row as usize * H * D * 2);
    let mut v = tid;
    while v < h_u * vec_per_row {
        let (h, cc) = (v / vec_per_row, v % vec_per_row);
        // SAFETY: the row has H*D bf16; 16-byte aligned (host-checked base,
        // D*2 a multiple of 16); the destination vector is this thread's and
        // nobody reads it before this thread's wait_all and a barrier.
        unsafe { cp_async::copy_16(at(sq, d_u, h, cc * 8), qrow.add(v as usize * 16), 16) };
        v += GRAD_THREADS;
    }
    let mut h = tid;
    while h < h_u {
        // SAFETY: weights has B*S_q*H bf16; this thread owns slot h of `sw`.
        unsafe {
            let wb = *(p.weights as *const u16).add(row as usize * H + h as usize);
            smem::st_f32(sw.add(4 * h), cvt::bf16_to_f32(wb));
        }
        h += GRAD_THREADS;
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
        t += GRAD_THREADS as usize;
    }
    // SAFETY: every lane of every warp reaches these collectives/barriers.
    let big_g = unsafe {
        let wsum = sync::warp_sum_f32(part);
        if lane == 0 {
            smem::st_f32(sred.add(4 * warp), wsum);
        }
        sync::bar_sync();
        let mut s = 0.0f32;
        for w in 0..GRAD_WARPS {
            s += smem::ld_f32(sred.add(4 * w));
        }
        s
    };

    let mut acc_q = [[[0.0f32; 4]; NQ]; MT];
    let mut dw = [[0.0f32; 2]; SMT];
    let h_base = (warp as usize % SHG * SMT) as u32 * MMA_M; // this warp's first head in S
    let s_base = (warp as usize / SHG * SHG) as u32 * MMA_N; // and first slot
    let dbase = warp * (d_u / GRAD_WARPS); // this warp's D columns for dQ and dK
    let dk = p.dk_accum as *mut f32;

    // Stage 1, pass 2 for the chunk starting at slot `t0`, by threads
    // < CHUNK into buffer set `set`: grad_signal (written in place over
    // attn_score) and the resolved key row of each slot.
    let prepare = |t0: usize, set: u32| {
        if tid < CHUNK {
            let t = t0 + tid as usize;
            let (gs, r) = if t < topk {
                // SAFETY: t < topk; this thread is the only one touching
                // slot t now, and every pass-1 read finished before the
                // barrier that produced G.
                unsafe {
                    let (gt, pr) = score_terms(
                        *attn.add(row_slots + t),
                        *score.add(row_slots + t),
                        log,
                        coeff,
                    );
                    let gs = gt - pr * big_g;
                    *attn.add(row_slots + t) = gs;
                    (gs, resolve(load_id(p, row_slots + t), b, p))
                }
            } else {
                (0.0, -1)
            };
            // SAFETY: slot tid of this buffer set belongs to this thread, and
            // its previous readers passed a barrier since (see the loop).
            unsafe {
                smem::st_f32(sgs.add(4 * (set * CHUNK + tid)), gs);
                smem::st_u32(srows.add(4 * (set * CHUNK + tid)), r as u32);
            }
        }
    };
    // Gather (cp.async, zero-fill for padding) of the K rows listed in
    // buffer set `set` into K buffer `set`; one group per thread.
    let gather = |set: u32| {
        let kbuf = sk.add(set * RowSmem::k_bytes(d_u));
        let mut v = tid;
        while v < CHUNK * vec_per_row {
            let (slot, cc) = (v / vec_per_row, v % vec_per_row);
            // SAFETY: the row ids were written before a barrier; a valid row
            // is < B*S_k so the 16-byte vector lies inside index_k; padding
            // copies 0 bytes (zero fill) from the valid base address.
            unsafe {
                let r = smem::ld_u32(srows.add(4 * (set * CHUNK + slot))) as i32;
                let (src, n) = if r >= 0 {
                    (
                        (p.index_k as *const u8).add((r as usize * D + cc as usize * 8) * 2),
                        16,
                    )
                } else {
                    (p.index_k as *const u8, 0)
                };
                cp_async::copy_16(at(kbuf, d_u, slot, cc * 8), src, n);
            }
            v += GRAD_THREADS;
        }
        cp_async::commit_group();
    };

    // Pipeline: chunk c's K rows are gathered while chunk c-1 is computed.
    // Per chunk: prepare(c+1) | wait own copies | B1 | gather(c+1) | S, gate
    // | B2 | dQ, dK | staging barriers B3, B4 | bulk reduce.
    // Buffer reuse is safe: set/buffer (c+1)%2 was last read in chunk c-1,
    // before its B3, and is rewritten only after chunk c's B1.
    let nchunks = topk.div_ceil(CHUNK as usize);
    prepare(0, 0);
    // SAFETY: uniform barrier (row ids of chunk 0 visible to all).
    unsafe { sync::bar_sync() };
    gather(0);
    for ch in 0..nchunks {
        let cur = (ch % 2) as u32;
        let nxt = 1 - cur;
        if ch + 1 < nchunks {
            prepare((ch + 1) * CHUNK as usize, nxt);
        }
        cp_async::wait_all();
        // SAFETY: uniform barrier: chunk ch's K rows (and q) complete.
        unsafe { sync::bar_sync() };
        if ch + 1 < nchunks {
            gather(nxt);
        }
        let skc = sk.add(cur * RowSmem::k_bytes(d_u));
        let (sgs, srows) = (sgs.add(4 * cur * CHUNK), srows.add(4 * cur * CHUNK));

        // ---- MMA: S = Q K^T, this warp's SMT*16 heads x SHG*8 slots ----
        // Fragments come from `ldmatrix`: lane `l` addresses row `lj` of
        // 8x8 matrix `li` (see `ptx::ldmatrix` and the layouts in `ptx::mma`).
        // The 2D warp tiling reads each q row by GRAD_WARPS / SHG warps
        // instead of all of them (shared-memory traffic is the limit here).
        let mut s = [[[0.0f32; 4]; SHG]; SMT];
        for ks in 0..sync::opaque_u32(d_u / MMA_K) {
            let k0 = ks * MMA_K;
            // SAFETY: every address is a 16-byte aligned row inside the q or
            // K tile (row < 64 or H, column + 8 <= D); full warp.
            unsafe {
                // B[k][n] = K[n0 + n][k0 + k]: matrices (n0, k0), (n0, k0 + 8).
                let mut bf = [[0u32; 2]; SHG];
                for (nt, b) in bf.iter_mut().enumerate() {
                    let n0 = s_base + nt as u32 * MMA_N;
                    *b = ldmatrix::x2(at(skc, d_u, n0 + lj, k0 + (li & 1) * 8));
                }
                for (mt, acc) in s.iter_mut().enumerate() {
                    let h0 = h_base + mt as u32 * MMA_M;
                    // A = q rows h0..h0+16: matrices (h0, k0), (h0+8, k0), (h0, k0+8), (h0+8, k0+8).
                    let af = ldmatrix::x4(at(sq, d_u, h0 + lj + (li & 1) * 8, k0 + (li >> 1) * 8));
                    for nt in 0..SHG {
                        mma::mma_bf16_16816(&mut acc[nt], af, bf[nt]);
                    }
                }
            }
        }

        // ---- epilogue: gate, dS (bf16, shared), d_weights partials ----
        // SAFETY: `sgs`, `srows`, `sw` were written before a barrier; each
        // thread stores its own two dS columns of its own head rows.
        unsafe {
            for nt in 0..SHG {
                let tl = s_base + nt as u32 * MMA_N + c;
                let gs = [
                    smem::ld_f32(sgs.add(4 * tl)),
                    smem::ld_f32(sgs.add(4 * (tl + 1))),
                ];
                let valid = [
                    (smem::ld_u32(srows.add(4 * tl)) as i32) >= 0,
                    (smem::ld_u32(srows.add(4 * (tl + 1))) as i32) >= 0,
                ];
                for mt in 0..SMT {
                    for half in 0..2 {
                        let h = h_base + mt as u32 * MMA_M + g + 8 * half as u32;
                        let wh = smem::ld_f32(sw.add(4 * h));
                        let mut ds = [0.0f32; 2];
                        for j in 0..2 {
                            let sv = s[mt][nt][2 * half + j] * sm_scale;
                            if valid[j] && sv > 0.0 {
                                ds[j] = gs[j] * wh;
                                dw[mt][half] += gs[j] * sv;
                            }
                        }
                        smem::st_u32(at(sds, CHUNK, h, tl), cvt::pack_bf16x2(ds[0], ds[1]));
                    }
                }
            }
            sync::bar_sync();
        }

        // ---- MMA: dQ += dS K (this warp's D columns, all heads) ----
        for ks in 0..sync::opaque_u32(CHUNK / MMA_K) {
            let k0 = ks * MMA_K;
            // SAFETY: every address is a 16-byte aligned row inside the dS or
            // K tile; full warp.
            unsafe {
                // B[k][n] = K[k0 + k][dbase + n], transposed loads: matrices
                // (k0, d), (k0 + 8, d) for each of this warp's n-tiles d.
                let bf = col_operand::<NQ>(skc, d_u, k0 + lj + (li & 1) * 8, dbase, li);
                for (mt, acc) in acc_q.iter_mut().enumerate() {
                    let h0 = mt as u32 * MMA_M;
                    let af =
                        ldmatrix::x4(at(sds, CHUNK, h0 + lj + (li & 1) * 8, k0 + (li >> 1) * 8));
                    for nq in 0..NQ {
                        mma::mma_bf16_16816(&mut acc[nq], af, bf[nq]);
                    }
                }
            }
        }

        // ---- MMA: dK_chunk = dS^T Q (all chunk slots, this warp's D columns) ----
        const SLOT_TILES: usize = (CHUNK / MMA_M) as usize;
        let mut kacc = [[[0.0f32; 4]; NQ]; SLOT_TILES];
        for ks in 0..sync::opaque_u32(h_u / MMA_K) {
            let k0 = ks * MMA_K;
            // SAFETY: every address is a 16-byte aligned row inside the dS or
            // q tile; full warp.
            unsafe {
                // B[k][n] = q[k0 + k][dbase + n], transposed loads.
                let bf = col_operand::<NQ>(sq, d_u, k0 + lj + (li & 1) * 8, dbase, li);
                for (mt, acc) in kacc.iter_mut().enumerate() {
                    // A[slot][h] = dS[h][slot], transposed loads: matrices
                    // (k0, s0), (k0, s0 + 8), (k0 + 8, s0), (k0 + 8, s0 + 8) of dS.
                    let s0 = mt as u32 * MMA_M;
                    let af = ldmatrix::x4_trans(at(
                        sds,
                        CHUNK,
                        k0 + lj + (li >> 1) * 8,
                        s0 + (li & 1) * 8,
                    ));
                    for nq in 0..NQ {
                        mma::mma_bf16_16816(&mut acc[nq], af, bf[nq]);
                    }
                }
            }
        }

        // ---- reduce: stage the chunk's dK rows in shared memory, then one
        // bulk reduction (TMA unit) per valid slot row into the accumulator ----
        if tid < CHUNK {
            // This thread's bulk reduction of the previous chunk has read the tile.
            bulk::wait_group_read_0();
        }
        // SAFETY: uniform barrier; each thread then writes its own fragment
        // elements (distinct (slot, col) pairs) of the staging tile.
        unsafe {
            sync::bar_sync();
            for (mt, acc) in kacc.iter().enumerate() {
                for half in 0..2 {
                    let slot = mt as u32 * MMA_M + g + 8 * half as u32;
                    for (nq, a) in acc.iter().enumerate() {
                        let col = dbase + nq as u32 * MMA_N + c;
                        let at = sdk.add(slot * dk_stride + col * 4);
                        smem::st_v2_f32(at, a[2 * half] * sm_scale, a[2 * half + 1] * sm_scale);
                    }
                }
            }
            bulk::fence_proxy_async_shared();
            sync::bar_sync();
        }
        if tid < CHUNK {
            // SAFETY: `srows` was written before a barrier; a valid row lies
            // inside the (B*S_k, D) accumulator (16-byte aligned rows, host
            // checks the base); the staged row was fenced and is not written
            // again before this thread's next `wait_group_read_0`.
            unsafe {
                let r = smem::ld_u32(srows.add(4 * tid)) as i32;
                if r >= 0 {
                    bulk::reduce_add_f32(dk.add(r as usize * D), sdk.add(tid * dk_stride), d_u * 4);
                    bulk::commit_group();
                }
            }
        }
    }

    if tid < CHUNK {
        // Bulk reductions must finish reading shared memory (and land)
        // before the CTA exits.
        bulk::wait_group_0();
    }

    // ---- epilogue: d_index_q (bf16 pairs) ----
    let dq = (p.d_index_q as *mut u32).wrapping_add(row as usize * H * D / 2);
    for (mt, tiles) in acc_q.iter().enumerate() {
        for (nq, a) in tiles.iter().enumerate() {
            for half in 0..2 {
                let h = mt * MMA_M as usize + g as usize + 8 * half;
                let col = (dbase + nq as u32 * MMA_N + c) as usize;
                let w = cvt::pack_bf16x2(a[2 * half] * sm_scale, a[2 * half + 1] * sm_scale);
                // SAFETY: (h, col) is inside this row's H x D block; col even.
                unsafe { *dq.add((h * D + col) / 2) = w };
            }
        }
    }

    // ---- epilogue: d_weights, fixed-order reduction over lanes and warps ----
    // SAFETY: full warps run the shuffles; `sred` is free (its last readers
    // passed several barriers); uniform barrier before the cross-warp sum.
    unsafe {
        // All shuffles first, at the top level of the warp's control flow,
        // then one lane-conditional block of stores: keeps every lane on the
        // same shfl.sync instructions.
        let mut quad = [[0.0f32; 2]; SMT];
        for (q, pair) in quad.iter_mut().zip(dw.iter()) {
            for (qv, &v) in q.iter_mut().zip(pair.iter()) {
                *qv = sync::quad_sum_f32(v);
            }
        }
        if lane % 4 == 0 {
            for (mt, q) in quad.iter().enumerate() {
                for (half, &v) in q.iter().enumerate() {
                    let h = h_base + mt as u32 * MMA_M + g + 8 * half as u32;
                    smem::st_f32(sred.add(4 * (warp * h_u + h)), v);
                }
            }
        }
        sync::bar_sync();
        let mut h = tid;
        while h < h_u {
            // Head h's partials come from the warps of its head group, one per
            // slot group, summed in slot-group order.
            let hg = h / (h_u / SHG as u32);
            let mut sum = 0.0f32;
            for sg in 0..GRAD_WARPS / SHG as u32 {
                let w = sg * SHG as u32 + hg;
                sum += smem::ld_f32(sred.add(4 * (w * h_u + h)));
            }
            let idx = row as usize * H + h as usize;
            if p.flags & FLAG_DW_F32 != 0 {
                *(p.d_weights as *mut f32).add(idx) = sum;
            } else {
                *(p.d_weights as *mut u16).add(idx) = cvt::pack_bf16x2(sum, 0.0) as u16;
            }
            h += GRAD_THREADS;
        }
    }
}

/// Head groups of the S warp tiling: 2 where each group still holds whole
/// 16-head m-tiles (H >= 32), else 1.
const fn s_head_groups(heads: usize) -> usize {
    if heads >= 32 {
        2
    } else {
        1
    }
}

macro_rules! row_kernel {
    ($name:ident, $h:literal, $d:literal) => {
        /// Row kernel entry for this heads x dim; see [`rows`] for the launch contract.
        ///
        /// # Safety
        /// As [`rows`].
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $name(p: GradParams) {
            // The registry names this specialization so.
            const _: () = assert!(crate::registry::const_eq(
                stringify!($name),
                crate::registry::grad_kernel_name($h, $d).unwrap()
            ));
            // SAFETY: forwarded launch contract.
            unsafe {
                rows::<
                    $h,
                    $d,
                    { $h / 16 },
                    { $d / 64 },
                    { s_head_groups($h) },
                    { $h / 16 / s_head_groups($h) },
                >(&p)
            }
        }
    };
}

row_kernel!(indexer_bwd_rows_h16_d64, 16, 64);
row_kernel!(indexer_bwd_rows_h16_d128, 16, 128);
row_kernel!(indexer_bwd_rows_h32_d64, 32, 64);
row_kernel!(indexer_bwd_rows_h32_d128, 32, 128);
row_kernel!(indexer_bwd_rows_h64_d64, 64, 64);
row_kernel!(indexer_bwd_rows_h64_d128, 64, 128);
row_kernel!(indexer_bwd_rows_h128_d64, 128, 64);
row_kernel!(indexer_bwd_rows_h128_d128, 128, 128);
