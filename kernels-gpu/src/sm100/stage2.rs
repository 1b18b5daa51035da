//! sm_100f stage 2: the persistent, warp-specialized tcgen05 kernel.
//! **Compiled and assembled for sm_100f, not executed** (no such GPU has
//! been available).
//!
//! One CTA per SM walks its query rows (`crate::sched::rows_of`), each row in
//! `NCH = topk / 128` chunks of 128 slots. Roles, by warp (uniform inside a
//! warp, so warp-collective instructions always run on whole warps):
//!
//! | warps | role | module |
//! |---|---|---|
//! | 0-3 | compute: gate S, dS (bf16, swizzled smem), d_weights; dQ epilogue | [`super::compute`] |
//! | 4-7 | reduce: dK from tensor memory -> smem -> `cp.reduce.async.bulk` | [`super::reduce`] |
//! | 8 | K load: slot ids, grad_signal, `tile::gather4` of K rows; q by TMA tile | [`super::load`] |
//! | 9 | MMA: one lane issues every `tcgen05.mma` and `tcgen05.commit` | [`super::mma`] |
//!
//! The compute and reduce roles are whole warpgroups because a warp can only
//! reach the tensor-memory sub-partition `warp % 4` (see `sm100::tmem`).
//!
//! The order of every role's barrier operations is written once, in
//! [`super::proto`] (with the table of barriers, their arrival counts and
//! phases), and model-checked on the host by `sm100::model`; the role
//! modules implement its operations on the device ([`super::dev`]).

use super::budget::{
    K_STAGES, OFF_BARS, OFF_Q, Q_STAGES, SM100_HEAD_TILE, SMEM_Q_REGION, TMEM_ALLOC,
};
use super::ctx::Ctx;
use super::proto::{
    arrivals, COMPUTE_WARPS, LOAD_WARP, MMA_WARP, NUM_BARS, REDUCE_WARP0, REDUCE_WARPS,
};
use super::proto::{
    DK_FREE, DK_READY, DQ_FREE, DQ_READY, DS_READY, EMPTY, FULL, Q_EMPTY, Q_FULL, S_READY,
};
use super::{compute, load, mma, reduce};
use crate::abi::{GradParams, Sm100Params, SM100_K_MAP_OFFSET, SM100_Q_MAP_OFFSET};
use crate::ptx::smem;
use crate::ptx::tcgen05::{self, TmemAddr};
use crate::ptx::{bulk, griddep, mbarrier, sreg, sync};

/// The 4-byte slot `tcgen05.alloc` writes the tensor-memory address to.
const TMEM_SLOT: u32 = OFF_BARS + 8 * NUM_BARS;
const _: () = assert!(TMEM_SLOT + 4 <= super::budget::SM100_SMEM);

const _: () = assert!((MMA_WARP + 1) * 32 == crate::abi::SM100_STAGE2_THREADS);

/// The kernel body for `NCH` chunks per row and `H` heads.
///
/// # Safety
/// Launched with `SM100_STAGE2_THREADS` threads, `budget::SM100_SMEM` bytes
/// of dynamic shared memory, a grid of at most `min(#SMs, B*S_q)` CTAs, as
/// the programmatic dependent of the stage-1 kernel of the same `execute`;
/// `p` validated by the host for this specialization (topk = 128 NCH,
/// H, D = 128, B*S_q*H < 2^31); the tensor maps as documented on
/// [`Sm100Params`].
#[inline(always)]
unsafe fn stage2<const NCH: u32, const H: u32>(p: &GradParams, param_addr: u64) {
    let tid = sreg::thread_idx_x();
    let warp = tid / 32;
    let base = smem::base();
    let c = Ctx {
        p,
        base,
        tmem: TmemAddr(0),
        k_map: param_addr + SM100_K_MAP_OFFSET as u64,
        q_map: param_addr + SM100_Q_MAP_OFFSET as u64,
        cta: sreg::block_idx_x(),
        ctas: sreg::grid_dim_x(),
        rows: p.batch * p.seq_q,
    };
    // SAFETY (setup): one thread initialises the barriers; every thread
    // zeroes its share of the q padding; one whole warp, reconverged by
    // `bar.warp.sync`, allocates tensor memory; a CTA barrier publishes all
    // of it.
    unsafe {
        if tid == 0 {
            for s in 0..K_STAGES {
                mbarrier::init(c.bar(FULL + s), arrivals(FULL + s));
                mbarrier::init(c.bar(EMPTY + s), arrivals(EMPTY + s));
            }
            for b in 0..Q_STAGES {
                mbarrier::init(c.bar(Q_FULL + b), arrivals(Q_FULL + b));
                mbarrier::init(c.bar(Q_EMPTY + b), arrivals(Q_EMPTY + b));
            }
            for i in [S_READY, DS_READY, DK_READY, DK_FREE, DQ_READY, DQ_FREE] {
                mbarrier::init(c.bar(i), arrivals(i));
            }
            mbarrier::fence_init();
        }
        if H < SM100_HEAD_TILE {
            // Rows H..64 of every q region are the M = 64 tile's zero
            // padding; the q loads (box of H rows) never write them.
            let pad = (SM100_HEAD_TILE - H) * 128;
            let mut i = tid * 4;
            while i < 2 * Q_STAGES * pad {
                let (region, off) = (i / pad, i % pad);
                smem::st_u32(base.add(OFF_Q + region * SMEM_Q_REGION + H * 128 + off), 0);
                i += crate::abi::SM100_STAGE2_THREADS * 4;
            }
            // The zeros are read by the tensor cores (async proxy).
            bulk::fence_proxy_async_shared();
        }
        if warp == MMA_WARP {
            // The q padding loop above (H = 32) has a trip count that
            // depends on the thread index, so the lanes leave it at
            // different iterations; `alloc` and `relinquish_alloc_permit`
            // are `.sync.aligned` and need all 32 lanes at the same
            // instruction, which `bar.warp.sync` guarantees (the PTX
            // promises nothing about where ptxas reconverges a loop).
            sync::warp_sync();
            tcgen05::alloc(base.add(TMEM_SLOT), TMEM_ALLOC);
            tcgen05::relinquish_alloc_permit();
        }
        tcgen05::fence_before_thread_sync();
        sync::bar_sync();
        tcgen05::fence_after_thread_sync();
    }
    // SAFETY: written by tcgen05.alloc before the barrier.
    let c = Ctx {
        tmem: TmemAddr(unsafe { smem::ld_u32(base.add(TMEM_SLOT)) }),
        ..c
    };
    // Everything above overlapped the stage-1 grid; from here on the roles
    // read grad_signal and add into dK, both of which stage 1 writes.
    // SAFETY: device code.
    unsafe { griddep::wait() };

    // SAFETY: each role's contract is this kernel's launch contract; the
    // dispatch is by warp index, uniform inside each warp.
    unsafe {
        if warp < COMPUTE_WARPS {
            compute::run::<NCH, H>(&c, warp);
        } else if warp < REDUCE_WARP0 + REDUCE_WARPS {
            reduce::run::<NCH>(&c, warp);
        } else if warp == LOAD_WARP {
            load::run::<NCH, H>(&c);
        } else {
            mma::run::<NCH, H>(&c);
        }
    }

    // SAFETY (teardown): every role has waited for the tensor-memory
    // accesses it depends on; after the barrier the allocating warp frees
    // the columns.
    unsafe {
        tcgen05::fence_before_thread_sync();
        sync::bar_sync();
        if warp == MMA_WARP {
            // The MMA warp's lanes diverged (lane 0 issued); dealloc is a
            // warp-collective `.sync.aligned` instruction.
            sync::warp_sync();
            tcgen05::fence_after_thread_sync();
            tcgen05::dealloc(c.tmem, TMEM_ALLOC);
        }
    }
}

macro_rules! stage2_kernel {
    ($name:ident, $topk:literal, $h:literal) => {
        /// Stage-2 entry for this topk x heads (D = 128); see [`stage2`].
        ///
        /// # Safety
        /// As [`stage2`].
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $name(p: Sm100Params) {
            // The registry names this specialization so.
            const _: () = assert!(crate::registry::const_eq(
                stringify!($name),
                crate::registry::sm100_stage2_kernel_name($topk, $h).unwrap()
            ));
            let addr = crate::ptx::tma::param0_generic_addr!(stringify!($name));
            // SAFETY: forwarded launch contract.
            unsafe { stage2::<{ $topk / 128 }, $h>(&p.p, addr) }
        }
    };
}

stage2_kernel!(sm100_stage2_t128_h32, 128, 32);
stage2_kernel!(sm100_stage2_t128_h64, 128, 64);
stage2_kernel!(sm100_stage2_t256_h32, 256, 32);
stage2_kernel!(sm100_stage2_t256_h64, 256, 64);
stage2_kernel!(sm100_stage2_t384_h32, 384, 32);
stage2_kernel!(sm100_stage2_t384_h64, 384, 64);
