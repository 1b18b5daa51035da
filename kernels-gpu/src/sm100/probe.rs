//! Bring-up probes of the stage-2 GEMMs: one CTA runs one GEMM of a chunk
//! exactly as stage 2 does, and writes the accumulator out for the host
//! to compare with a CPU product. **Compiled and assembled for sm_100f,
//! not executed** (no such GPU has been available).
//!
//! A wrong layout or descriptor in stage 2 shows up as a wrong gradient
//! with no hint of its cause; a probe isolates one GEMM, so the mismatch
//! is a tile whose pattern names the cause (`host/src/lab/bringup.rs` reads
//! it). What a probe shares with stage 2, so that it tests the real thing:
//! - operand placement: K stage 0, q buffer 0 and the dS tile at their
//!   stage-2 offsets (`budget::OFF_K`, `OFF_Q`, `OFF_DS`), elements where
//!   `operands::{k_at, q_at, ds_at}` put them; or, by flag, the K stage
//!   filled by stage 2's `tile::gather4` loads (`operands::gather4_dst`,
//!   one gather4 per lane and column half, as `load.rs` issues them) and
//!   the q buffer by its TMA tile loads, through tensor maps passed in the
//!   kernel parameter as stage 2 receives them;
//! - the MMA step sequence with `operands::{s_descs, dq_descs, dk_descs}`
//!   and `IDESC_S` / `IDESC_DQ` / `IDESC_DK`, into the stage-2 accumulator
//!   columns (`TMEM_S`, `TMEM_DQ`, `TMEM_DK`) of a 512-column allocation;
//! - the read-back: `tcgen05.ld.32x32b` by warp `w` from sub-partition
//!   `w % 4`, rows by `tmem::m64_row_of` (M = 64) or `tmem::m128_row_of`
//!   (M = 128), as the compute and reduce roles read S, dQ and dK.
//!
//! What it adds for diagnosis: before the MMA every accumulator cell of
//! the 128 lanes is set to `SM100_PROBE_TMEM_FILL` (`tcgen05.st`), and
//! every lane is also written out raw (`lanes`), so the host can tell
//! where the MMA really put each row (and which lanes it left alone)
//! independently of the lane mapping under test. Barrier waits give up
//! after a time limit ([`TMA_WAIT_NS`], [`COMMIT_WAIT_NS`]), so a TMA load
//! or MMA commit that never completes is reported instead of hanging the
//! probe: the thread that gives up sets its word of `status` (host-mapped
//! memory) and traps ([`give_up`]). It never reads or frees tensor memory,
//! and the CTA never exits, while the work it gave up on may still write.

use super::budget::{
    OFF_DK, OFF_DS, OFF_K, OFF_Q, SM100_CHUNK, SM100_DIM, SM100_HEAD_TILE, SM100_PROBE_SMEM,
    SMEM_K_STAGE, SMEM_Q, SMEM_Q_REGION, TMEM_ALLOC, TMEM_DK, TMEM_DQ, TMEM_S,
};
use super::operands::{
    dk_descs, dk_steps, dq_descs, ds_at, gather4_dst, k_at, q_at, s_descs, DQ_STEPS, IDESC_DK,
    IDESC_DQ, IDESC_S, S_STEPS,
};
use super::tmem::{m128_row_of, m64_row_of, warp_lane_base};
use crate::abi::{
    Sm100ProbeParams, PROBE_K_GATHER4, PROBE_Q_TMA, PROBE_STATUS_MMA, PROBE_STATUS_TMA,
    SM100_K_MAP_OFFSET, SM100_PROBE_HEADS, SM100_PROBE_TMEM_FILL, SM100_Q_MAP_OFFSET,
};
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::tcgen05::{self, TmemAddr};
use crate::ptx::{bulk, global, mbarrier, sreg, sync, tma};

/// The GEMM of a probe (const parameter of [`probe`]): S = q K^T.
const S: u32 = 0;
/// dQ = dS K.
const DQ: u32 = 1;
/// dK = dS^T q.
const DK: u32 = 2;

/// N of all three GEMMs (slots for S, D for dQ and dK): accumulator
/// columns, and the row length of every probe operand.
const N: u32 = SM100_CHUNK;
const _: () = assert!(SM100_CHUNK == SM100_DIM);
/// Threads of the CTA: one warp per tensor-memory sub-partition.
const THREADS: u32 = crate::abi::SM100_PROBE_THREADS;
const _: () = assert!(THREADS == 4 * 32);
/// Columns one `tcgen05.ld` / `tcgen05.st` `.32x32b.x16` moves.
const COLS_PER_ACCESS: u32 = 16;

/// Barriers and the tensor-memory slot, after the dS tile (where stage 2
/// stages dK, which no probe uses).
const BAR_MMA: u32 = OFF_DK;
/// See [`BAR_MMA`].
const BAR_TMA: u32 = BAR_MMA + 8;
/// See [`BAR_MMA`].
const TMEM_SLOT: u32 = BAR_TMA + 8;
const _: () = assert!(BAR_MMA.is_multiple_of(8) && TMEM_SLOT + 4 <= SM100_PROBE_SMEM);

/// Longest wait for the TMA bytes before the probe gives up (the loads
/// take microseconds).
const TMA_WAIT_NS: u64 = 1_000_000_000;
/// Longest wait for the MMA commit. Every thread but thread 0 starts
/// waiting while thread 0 may still spend up to [`TMA_WAIT_NS`] on the TMA
/// bytes before it issues the MMA, so the limit covers both waits (the
/// MMA itself takes microseconds).
const COMMIT_WAIT_NS: u64 = 2 * TMA_WAIT_NS;

/// Accumulator column of a GEMM: stage 2's.
const fn acc_col(g: u32) -> u32 {
    match g {
        S => TMEM_S,
        DQ => TMEM_DQ,
        _ => TMEM_DK,
    }
}

/// Waits for phase `parity` of `bar` for at most `limit_ns`; whether it
/// completed. A caller that gets `false` must [`give_up`].
///
/// # Safety
/// `bar` is an initialised mbarrier of this CTA.
#[inline(always)]
unsafe fn wait_bounded(bar: SmemAddr, parity: u32, limit_ns: u64) -> bool {
    let start = sreg::global_timer_ns();
    loop {
        // SAFETY: forwarded.
        if unsafe { mbarrier::try_wait_parity(bar, parity) } {
            return true;
        }
        if sreg::global_timer_ns().wrapping_sub(start) > limit_ns {
            return false;
        }
    }
}

/// Ends the probe after a wait that gave up: sets word `word` of the
/// host-mapped `status` to 1, makes it visible to the host, and traps.
///
/// Invariant: the TMA load or MMA that the wait was for may still be in
/// flight, and may still write this CTA's shared memory (the TMA bytes)
/// or tensor memory (the accumulator). Reading the accumulator would race
/// with it; freeing the columns, or letting the CTA exit, would hand that
/// memory to the next CTA placed on this SM while the write can still
/// land there. `trap` does neither: it aborts the grid, the launch fails
/// and the CUDA context stops accepting work, so no later CTA of it runs
/// (the same end as the watchdog's, `ptx::mbarrier`). The lanes that did
/// not give up are aborted with it wherever they are, so a trap on some
/// lanes only leaves no collective waiting for them.
///
/// # Safety
/// `status` is the probe's host-mapped status block of
/// `PROBE_STATUS_WORDS` words and `word` one of its indices.
#[inline(always)]
unsafe fn give_up(status: *mut u32, word: usize) -> ! {
    // SAFETY: the caller's contract. Several threads may store the same
    // value to the same word; the host reads it only after the launch
    // failed.
    unsafe { global::st_volatile_u32(status.add(word), 1) };
    // The word reaches the host before the trap ends the grid.
    global::fence_sc_sys();
    sync::trap()
}

/// Copies `rows` rows of `N` bf16 into shared memory by 4-byte stores:
/// operand row `r` is global row `src_row(r)` of `src`, and element
/// `(r, c)` lands at `dst + at(r, c)`. All threads of the CTA take part.
///
/// # Safety
/// `src` holds the rows `src_row` names; `dst + at(..)` lies in the
/// launch's shared memory and no other thread writes it meanwhile.
#[inline(always)]
unsafe fn stage(
    dst: SmemAddr,
    src: *const u16,
    rows: u32,
    src_row: impl Fn(u32) -> u32,
    at: impl Fn(u32, u32) -> u32,
) {
    let pairs = N / 2;
    let mut e = sreg::thread_idx_x();
    while e < rows * pairs {
        let (r, c) = (e / pairs, 2 * (e % pairs));
        // SAFETY: forwarded; `c` is even, so the bf16 pair is 4-byte
        // aligned in global memory and stays in one 16-byte chunk of the
        // swizzled row in shared memory.
        unsafe {
            let w = *(src.add((src_row(r) * N + c) as usize) as *const u32);
            smem::st_u32(dst.add(at(r, c)), w);
        }
        e += THREADS;
    }
}

/// Warp 0 fills the K stage (`k`) and/or the q buffer (`q`) by TMA, as
/// stage 2's load warp does: one arrival expecting every byte, then lane
/// `l` gathers slots `4l .. 4l + 4` (two column halves), lane 0 loads the
/// two q boxes.
///
/// # Safety
/// Called by all of warp 0 only; the maps in `p` are valid (see
/// [`Sm100ProbeParams`]) at the generic address `param_addr`; the ids are
/// valid key rows; `BAR_TMA` is initialised.
#[inline(always)]
unsafe fn load_tma(p: &Sm100ProbeParams, param_addr: u64, base: SmemAddr, k: bool, q: bool) {
    let lane = sreg::thread_idx_x() % 32;
    let bar = base.add(BAR_TMA);
    let bytes = if k { SMEM_K_STAGE } else { 0 } + if q { SMEM_Q } else { 0 };
    // SAFETY: see the function contract.
    unsafe {
        if lane == 0 {
            tma::arrive_expect_tx(bar, bytes);
        }
        // The expected bytes precede every load's completion.
        sync::warp_sync();
        if k {
            let ids = (p.ids as *const i32).add(4 * lane as usize);
            let rows = [*ids, *ids.add(1), *ids.add(2), *ids.add(3)];
            let map = (param_addr + SM100_K_MAP_OFFSET as u64) as *const u8;
            for half in 0..2 {
                let dst = base.add(OFF_K + gather4_dst(lane, half));
                tma::gather4(dst, map, (64 * half) as i32, rows, bar);
            }
        }
        if q && lane == 0 {
            let map = param_addr + SM100_Q_MAP_OFFSET as u64;
            for half in 0..2 {
                let dst = base.add(OFF_Q + half * SMEM_Q_REGION);
                tma::load_2d(dst, map, (64 * half) as i32, 0, bar);
            }
        }
    }
}

/// Issues GEMM `G`'s stage-2 MMA steps into `acc` (one thread).
///
/// # Safety
/// Its operands are staged and visible to the async proxy; `acc` is the
/// GEMM's accumulator in this CTA's allocation.
#[inline(always)]
unsafe fn issue<const G: u32>(base: SmemAddr, acc: TmemAddr) {
    let (q, k, ds) = (base.add(OFF_Q).0, base.add(OFF_K).0, base.add(OFF_DS).0);
    match G {
        S => {
            for st in 0..S_STEPS {
                let (a, b) = s_descs(q, k, st);
                // SAFETY: see the function contract.
                unsafe { tcgen05::mma_f16(acc, a, b, IDESC_S, st > 0) };
            }
        }
        DQ => {
            for st in 0..DQ_STEPS {
                let (a, b) = dq_descs(ds, k, st);
                // SAFETY: see the function contract.
                unsafe { tcgen05::mma_f16(acc, a, b, IDESC_DQ, st > 0) };
            }
        }
        _ => {
            for st in 0..dk_steps(SM100_PROBE_HEADS) {
                let (a, b) = dk_descs(ds, q, st);
                // SAFETY: see the function contract.
                unsafe { tcgen05::mma_f16(acc, a, b, IDESC_DK, st > 0) };
            }
        }
    }
}

/// The warp's sub-partition of the accumulator: every cell set to
/// [`SM100_PROBE_TMEM_FILL`] (`fill`), or read out to `lanes` (raw) and
/// `out` (the rows stage 2's lane mapping gives this lane).
///
/// # Safety
/// Called by whole warps; `acc` lies in this CTA's allocation with `N`
/// columns; for a read, the MMA has completed and `p.out` / `p.lanes` are
/// as documented on [`Sm100ProbeParams`].
#[inline(always)]
unsafe fn tmem_pass<const G: u32>(p: &Sm100ProbeParams, acc: TmemAddr, fill: bool) {
    let tid = sreg::thread_idx_x();
    let (warp, lane) = (tid / 32, tid % 32);
    let sub = warp_lane_base(warp);
    let row = if G == DK {
        Some(m128_row_of(warp, lane))
    } else {
        m64_row_of(warp, lane)
    };
    let lanes = p.lanes as *mut u8;
    let out = p.out as *mut u8;
    // Kept as a loop (opaque trip count) so the loads are not all hoisted.
    for j in 0..sync::opaque_u32(N / COLS_PER_ACCESS) {
        let col = COLS_PER_ACCESS * j;
        let at = acc.offset(sub, col);
        // SAFETY: see the function contract; 16-byte aligned f32 rows.
        unsafe {
            if fill {
                tcgen05::st_32x32b_x16(at, [SM100_PROBE_TMEM_FILL; 16]);
                continue;
            }
            let v = tcgen05::ld_32x32b_x16(at);
            tcgen05::wait_ld();
            let raw = lanes.add((((sub + lane) * N + col) * 4) as usize);
            for i in 0..4 {
                let x = [v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]];
                global::st_v4(raw.add(16 * i), x);
                if let Some(r) = row {
                    global::st_v4(out.add(((r * N + col) * 4) as usize + 16 * i), x);
                }
            }
        }
    }
    if fill {
        tcgen05::wait_st();
    }
}

/// The probe of GEMM `G` (see the module docs).
///
/// # Safety
/// One CTA of `SM100_PROBE_THREADS` threads with `SM100_PROBE_SMEM` bytes
/// of dynamic shared memory on an sm_100-family GPU; `p` as documented on
/// [`Sm100ProbeParams`]; `param_addr` the generic address of the kernel's
/// parameter.
#[inline(always)]
unsafe fn probe<const G: u32>(p: &Sm100ProbeParams, param_addr: u64) {
    let tid = sreg::thread_idx_x();
    let warp = tid / 32;
    let base = smem::base();
    let (bar_mma, bar_tma) = (base.add(BAR_MMA), base.add(BAR_TMA));
    let k_tma = G != DK && p.flags & PROBE_K_GATHER4 != 0;
    let q_tma = G != DQ && p.flags & PROBE_Q_TMA != 0;
    // SAFETY (setup): one thread initialises the barriers, one whole warp
    // allocates tensor memory, a CTA barrier publishes both.
    unsafe {
        if tid == 0 {
            mbarrier::init(bar_mma, 1);
            mbarrier::init(bar_tma, 1);
            mbarrier::fence_init();
        }
        if warp == 0 {
            tcgen05::alloc(base.add(TMEM_SLOT), TMEM_ALLOC);
            tcgen05::relinquish_alloc_permit();
        }
        tcgen05::fence_before_thread_sync();
        sync::bar_sync();
        tcgen05::fence_after_thread_sync();
    }
    // SAFETY: written by tcgen05.alloc before the barrier.
    let tmem = TmemAddr(unsafe { smem::ld_u32(base.add(TMEM_SLOT)) });
    let acc = tmem.offset(0, acc_col(G));
    // SAFETY (staging): every thread writes disjoint operand bytes (or warp
    // 0 has TMA write them); the fences and the barrier hand the operands
    // and the filled accumulator to the MMA thread.
    unsafe {
        tmem_pass::<G>(p, acc, true);
        if warp == 0 && (k_tma || q_tma) {
            load_tma(p, param_addr, base, k_tma, q_tma);
        }
        let ids = p.ids as *const i32;
        if G != DK && !k_tma {
            let row = |t: u32| *ids.add(t as usize) as u32;
            stage(base.add(OFF_K), p.k as *const u16, SM100_CHUNK, row, k_at);
        }
        if G != DQ && !q_tma {
            stage(
                base.add(OFF_Q),
                p.q as *const u16,
                SM100_HEAD_TILE,
                |h| h,
                q_at,
            );
        }
        if G != S {
            stage(
                base.add(OFF_DS),
                p.ds as *const u16,
                SM100_HEAD_TILE,
                |h| h,
                ds_at,
            );
        }
        // Generic writes read by the tensor cores (async proxy).
        bulk::fence_proxy_async_shared();
        tcgen05::fence_before_thread_sync();
        sync::bar_sync();
        tcgen05::fence_after_thread_sync();
    }
    // SAFETY (MMA and read-back): thread 0 sees the TMA bytes land before it
    // issues; everyone waits for the commit before reading the accumulator.
    // A wait that gives up never reaches the read-back or the dealloc below
    // (`give_up` traps), since the work it waited for may still write.
    unsafe {
        let status = p.status as *mut u32;
        if tid == 0 {
            if (k_tma || q_tma) && !wait_bounded(bar_tma, 0, TMA_WAIT_NS) {
                give_up(status, PROBE_STATUS_TMA);
            }
            issue::<G>(base, acc);
            tcgen05::commit(bar_mma);
        }
        if !wait_bounded(bar_mma, 0, COMMIT_WAIT_NS) {
            give_up(status, PROBE_STATUS_MMA);
        }
        // The lanes left the spin at different polls; the loads are
        // `.sync.aligned`.
        sync::warp_sync();
        tcgen05::fence_after_thread_sync();
        tmem_pass::<G>(p, acc, false);
        tcgen05::fence_before_thread_sync();
        sync::bar_sync();
        if warp == 0 {
            tcgen05::fence_after_thread_sync();
            tcgen05::dealloc(tmem, TMEM_ALLOC);
        }
    }
}

macro_rules! probe_kernel {
    ($name:ident, $gemm:expr, $what:literal) => {
        #[doc = concat!("Bring-up probe of ", $what, "; see [`probe`].")]
        ///
        /// # Safety
        /// As [`probe`].
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $name(p: Sm100ProbeParams) {
            let addr = crate::ptx::tma::param0_generic_addr!(stringify!($name));
            // SAFETY: forwarded launch contract.
            unsafe { probe::<{ $gemm }>(&p, addr) }
        }
    };
}

probe_kernel!(sm100_probe_s, S, "S = q K^T (M = 64)");
probe_kernel!(sm100_probe_dq, DQ, "dQ = dS K (M = 64)");
probe_kernel!(sm100_probe_dk, DK, "dK = dS^T q (M = 128)");

// The names the host launches are these kernels' (`registry::SM100_PROBES`).
const _: () = {
    use crate::registry::{const_eq, SM100_PROBES};
    assert!(const_eq(SM100_PROBES[0].name, "sm100_probe_s"));
    assert!(const_eq(SM100_PROBES[1].name, "sm100_probe_dq"));
    assert!(const_eq(SM100_PROBES[2].name, "sm100_probe_dk"));
    assert!(SM100_PROBES[0].threads == THREADS);
};
