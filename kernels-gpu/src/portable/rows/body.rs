//! The fused row kernel: stage 1 (score gradient, written in place over
//! `attn_score`) and stage 2 (S, gate, dS, d_weights, d_index_q, scatter-add
//! into the f32 `d_index_k` accumulator) for one query row per CTA.
//!
//! Roles inside a CTA (all threads take part in each, separated by
//! `bar.sync`), one module each: `load` (q, w, stage 1, then per chunk the
//! gathered K rows), `mma` (S, dQ, dK on `mma.sync` tensor cores),
//! `reduce` (gate and dS, the dK staging and its bulk reduction, the final
//! dQ/dW stores). [`Row`] is the CTA's view of its row that they share;
//! [`rows`] is the chunk loop.
//!
//! Determinism: every sum that feeds `d_index_q`, `d_weights` or
//! grad_signal is taken in a fixed order inside one CTA, so those outputs
//! are bitwise reproducible; only `d_index_k` uses atomics.

use super::{RowSmem, CHUNK, DK_PAD, GRAD_WARPS, MMA_M, MMA_N, ROW_PAD};
use crate::abi::{GradParams, FLAG_LOG_SCORE};
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{bulk, cp_async, sreg, sync};

/// Byte address of bf16 element `(r, col)` of a shared tile with `cols`
/// logical columns (rows padded by [`ROW_PAD`]).
#[inline(always)]
pub(super) fn at(tile: SmemAddr, cols: u32, r: u32, col: u32) -> SmemAddr {
    tile.add((r * (cols + ROW_PAD) + col) * 2)
}

/// dK accumulator tiles of a chunk: its slots in m-tiles.
pub(super) const SLOT_TILES: usize = (CHUNK / MMA_M) as usize;

/// One CTA's view of its query row for `H` heads and head dimension `D`
/// (`MT = H / 16` m-tiles of heads, `NQ = D / 64` n-tiles of D columns per
/// warp; the S tiling: `SHG` head groups x `GRAD_WARPS / SHG` slot groups,
/// a warp owning `SMT` m-tiles of heads and `SHG` n-tiles of 8 slots):
/// the shared tiles, this thread's coordinates and the row's tensors.
pub(super) struct Row<
    'a,
    const H: usize,
    const D: usize,
    const MT: usize,
    const NQ: usize,
    const SHG: usize,
    const SMT: usize,
> {
    pub(super) p: &'a GradParams,
    /// Shared tiles: q, the two K buffers, dS, per-slot grad_signal and
    /// key rows (two sets each), weights, the cross-warp sums, dK staging.
    pub(super) sq: SmemAddr,
    pub(super) sk: SmemAddr,
    pub(super) sds: SmemAddr,
    pub(super) sgs: SmemAddr,
    pub(super) srows: SmemAddr,
    pub(super) sw: SmemAddr,
    pub(super) sred: SmemAddr,
    pub(super) sdk: SmemAddr,
    /// Bytes per staged dK row.
    pub(super) dk_stride: u32,
    pub(super) tid: u32,
    pub(super) warp: u32,
    pub(super) lane: u32,
    /// `mma.sync` fragment coordinates: group `lane / 4`, column pair
    /// `2 * (lane % 4)`.
    pub(super) g: u32,
    pub(super) c: u32,
    /// `ldmatrix` addressing: lane gives row `lj` of 8x8 matrix `li`.
    pub(super) li: u32,
    pub(super) lj: u32,
    /// The query row (`B * S_q` of them), its batch and first slot.
    pub(super) row: u32,
    pub(super) b: u32,
    pub(super) row_slots: usize,
    pub(super) topk: usize,
    pub(super) log: bool,
    pub(super) sm_scale: f32,
    /// This warp's first head and first slot in S, its D columns for dQ
    /// and dK.
    pub(super) h_base: u32,
    pub(super) s_base: u32,
    pub(super) dbase: u32,
}

impl<
        'a,
        const H: usize,
        const D: usize,
        const MT: usize,
        const NQ: usize,
        const SHG: usize,
        const SMT: usize,
    > Row<'a, H, D, MT, NQ, SHG, SMT>
{
    pub(super) const H_U: u32 = H as u32;
    pub(super) const D_U: u32 = D as u32;
    /// 16-byte vectors per bf16 row of D.
    pub(super) const VEC_PER_ROW: u32 = Self::D_U / 8;

    #[inline(always)]
    fn new(p: &'a GradParams) -> Self {
        const { assert!(MT * MMA_M as usize == H && NQ * (MMA_N * GRAD_WARPS) as usize == D) };
        const { assert!(SMT * SHG == MT && (GRAD_WARPS as usize).is_multiple_of(SHG)) };
        let l = RowSmem::new(Self::H_U, Self::D_U);
        let base = smem::base();
        let (sq, sk, sds) = (base.add(l.q), base.add(l.k), base.add(l.ds));
        let (sgs, srows, sw, sred) = (
            base.add(l.gs),
            base.add(l.rows),
            base.add(l.w),
            base.add(l.red),
        );
        let sdk = base.add(l.dk);
        let dk_stride = (Self::D_U + DK_PAD) * 4;
        let tid = sreg::thread_idx_x();
        let warp = tid / 32;
        let lane = tid % 32;
        let g = lane / 4;
        let c = 2 * (lane % 4);
        let (li, lj) = (lane / 8, lane % 8);
        let row = sreg::block_idx_x();
        let b = row / p.seq_q.max(1); // seq_q >= 1 (host-checked); max avoids a panic path
        let topk = p.topk as usize;
        let log = p.flags & FLAG_LOG_SCORE != 0;
        let sm_scale = p.sm_scale;
        let row_slots = row as usize * topk;
        Row {
            p,
            sq,
            sk,
            sds,
            sgs,
            srows,
            sw,
            sred,
            sdk,
            dk_stride,
            tid,
            warp,
            lane,
            g,
            c,
            li,
            lj,
            row,
            b,
            row_slots,
            topk,
            log,
            sm_scale,
            h_base: (warp as usize % SHG * SMT) as u32 * MMA_M,
            s_base: (warp as usize / SHG * SHG) as u32 * MMA_N,
            dbase: warp * (Self::D_U / GRAD_WARPS),
        }
    }

    /// K buffer `set`.
    #[inline(always)]
    pub(super) fn k_buf(&self, set: u32) -> SmemAddr {
        self.sk.add(set * RowSmem::k_bytes(Self::D_U))
    }
}

/// The kernel body: the row's inputs, stage 1's sum, then per 64-slot
/// chunk S, gate, dQ, dK and the dK reduction, then d_index_q and
/// d_weights.
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
    let r = Row::<H, D, MT, NQ, SHG, SMT>::new(p);
    r.load_q_weights();
    // SAFETY: grad_loss is one f32 on the device (host-checked).
    let coeff = p.coeff * unsafe { *(p.grad_loss as *const f32) };
    // SAFETY: every thread of the CTA, uniform control flow.
    let big_g = unsafe { r.score_sum(coeff) };
    let mut acc_q = [[[0.0f32; 4]; NQ]; MT];
    let mut dw = [[0.0f32; 2]; SMT];

    // Pipeline: chunk c's K rows are gathered while chunk c-1 is computed.
    // Per chunk: prepare(c+1) | wait own copies | B1 (`Barrier::KRows`) |
    // gather(c+1) | S, gate | B2 (`Ds`) | dQ, dK | staging, B3
    // (`StagingFree`) and B4 (`DkStaged`) | bulk reduce.
    // Buffer reuse is safe: set/buffer (c+1)%2 was last read in chunk c-1,
    // before its B3, and is rewritten only after chunk c's B1.
    let nchunks = r.topk.div_ceil(CHUNK as usize);
    r.prepare(0, 0, coeff, big_g);
    // SAFETY: uniform barrier (row ids of chunk 0 visible to all).
    unsafe { sync::bar_sync() };
    r.gather(0);
    for ch in 0..nchunks {
        let cur = (ch % 2) as u32;
        let nxt = 1 - cur;
        if ch + 1 < nchunks {
            r.prepare((ch + 1) * CHUNK as usize, nxt, coeff, big_g);
        }
        cp_async::wait_all();
        // SAFETY: uniform barrier: chunk ch's K rows (and q) complete.
        unsafe { barrier(Barrier::KRows) };
        if ch + 1 < nchunks {
            r.gather(nxt);
        }
        let skc = r.k_buf(cur);
        let (sgs, srows) = (r.sgs.add(4 * cur * CHUNK), r.srows.add(4 * cur * CHUNK));
        let s = r.s_tile(skc);
        // SAFETY: uniform control flow; the chunk's slot data was written
        // before a barrier.
        unsafe { r.gate(&s, sgs, srows, &mut dw) };
        r.dq(skc, &mut acc_q);
        let kacc = r.dk();
        // SAFETY: uniform control flow; `srows` written before a barrier.
        unsafe { r.reduce_dk(&kacc, srows) };
    }

    if r.tid < CHUNK {
        // Bulk reductions must finish reading shared memory (and land)
        // before the CTA exits.
        bulk::wait_group_0();
    }
    r.store_dq(&acc_q);
    // SAFETY: every thread of the CTA, uniform control flow.
    unsafe { r.store_dw(&dw) };
}

/// The CTA barriers of one chunk, in order (`barrier.sync 0`, all
/// threads; docs/architecture.md names them B1 to B4).
#[derive(Clone, Copy)]
pub(super) enum Barrier {
    /// B1: the chunk's K rows and slot data are complete; the other K
    /// buffer and slot set may be refilled.
    KRows,
    /// B2: dS is complete in shared memory for the dQ and dK products.
    Ds,
    /// B3: the dK staging tile is free (each reducing thread waited for
    /// its previous bulk reduction to finish reading it).
    StagingFree,
    /// B4: the chunk's dK rows are staged and fenced for the async proxy.
    DkStaged,
}

/// Waits at barrier `_b` with every thread of the CTA.
///
/// # Safety
/// Every thread of the CTA calls it, in uniform control flow.
#[inline(always)]
pub(super) unsafe fn barrier(_b: Barrier) {
    // SAFETY: the caller's contract.
    unsafe { sync::bar_sync() }
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
