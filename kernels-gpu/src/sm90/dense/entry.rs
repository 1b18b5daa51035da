//! The entry of the dense tile kernel: the context, the mbarriers, and
//! the dispatch of the CTA's work item to the producer warp and the
//! consumer warpgroups of its kind.

use super::ctx::Ctx;
use super::{keys, load, rows, CONSUMER_REGS, PRODUCER_REGS, TILE_KEYS, WARPGROUPS};
use crate::abi::{
    DenseDetTileParams, DenseTileParams, DENSE_ITEM_KEYS, DENSE_ITEM_ROWS, DENSE_ITEM_WORDS,
    DENSE_TILE_THREADS,
};
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::tma::param0_generic_addr;
use crate::ptx::{griddep, sreg, sync};
use crate::registry::{DENSE_WG, DENSE_WG_DET};

const _: () = assert!(DENSE_WG.threads == DENSE_TILE_THREADS);
const _: () = assert!(DENSE_WG_DET.threads == DENSE_TILE_THREADS);

/// Dense stage 2 over key tiles, H = 64, D = 128 (module note). Launch:
/// grid `p.n_items`, [`DENSE_TILE_THREADS`] threads, `SMEM.bytes` of
/// dynamic shared memory, as a programmatic dependent of dense stage 1.
///
/// # Safety
/// `p` built by the dense plan from validated buffers: the tensor maps
/// over `index_k` and `index_q` (`abi::DenseTileParams`), `weights`,
/// grad_signal and `visible` of the shape the items describe
/// (`visible[r] <= cols` and at most the key count of the row's batch),
/// every item well formed (`abi::DENSE_ITEM_*`: in-range rows and keys of
/// one batch; key items covering every key row once, row items every
/// query row once), outputs disjoint from the inputs.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn indexer_dense_bwd_wg_h64_d128(p: DenseTileParams) {
    // grad_signal and the zeroed accumulator are stage 1's outputs:
    // nothing is read or added before this.
    // SAFETY: orders the CTA after stage 1.
    unsafe { griddep::wait() };
    let maps = || param0_generic_addr!("indexer_dense_bwd_wg_h64_d128");
    // SAFETY: the launch contract, forwarded.
    unsafe { body::<false>(&p, maps, 0) }
}

/// The deterministic twin of [`indexer_dense_bwd_wg_h64_d128`]
/// (`super::turns`): the same launch, items taken in arrival order from
/// the turn table, every key item's dK sums added in its chain's turn, so
/// each accumulator element sums its runs in one order on every run.
///
/// # Safety
/// As the default kernel, on `p.tile`; `p.turns` is a zeroed turn table
/// of `1 + chains` u32 for the items' chains, and every chain's turns
/// appear in the item list in increasing order (`super::turns`).
#[no_mangle]
pub unsafe extern "ptx-kernel" fn indexer_dense_bwd_wg_det_h64_d128(p: DenseDetTileParams) {
    // As the default kernel; the turn table is zeroed before stage 1.
    // SAFETY: orders the CTA after stage 1.
    unsafe { griddep::wait() };
    let maps = || param0_generic_addr!("indexer_dense_bwd_wg_det_h64_d128");
    // SAFETY: the launch contract, forwarded; the tile parameter leads
    // the struct, so `maps` gives its tensor maps' address too.
    unsafe { body::<true>(&p.tile, maps, p.turns) }
}

/// The kernel body after the wait for stage 1: with `DET`, the
/// deterministic twin's (module note of `super::turns`); `maps` gives the
/// parameter's generic address (read where the context is built).
///
/// # Safety
/// The launch contract of the kernel that calls it, after its
/// `griddepcontrol.wait`.
#[inline(always)]
unsafe fn body<const DET: bool>(p: &DenseTileParams, maps: impl FnOnce() -> u64, turns: u64) {
    let tid = sreg::thread_idx_x();
    let raw = smem::base().0;
    let c = Ctx {
        p,
        maps: maps(),
        tid,
        // SAFETY: every thread, converged; the warpgroup is warp-uniform.
        wg: unsafe { sync::uniform_u32(tid / 128) },
        t: tid % 128,
        base: SmemAddr((raw + 1023) & !1023),
        turns,
    };
    let index = if DET {
        // SAFETY: every thread, converged, before any other use of shared
        // memory; the turn table of the launch contract.
        unsafe { super::turns::ticket(&c) }
    } else {
        sreg::block_idx_x()
    };
    let item = p.items as *const u32;
    let at = index as usize * DENSE_ITEM_WORDS;
    // SAFETY: index < n_items (the grid, one ticket per CTA), inside the
    // item array; CTA-uniform loads.
    let w = |i: usize| unsafe { *item.add(at + i) };
    let kind = w(0);
    if kind != DENSE_ITEM_ROWS && kind != DENSE_ITEM_KEYS {
        sync::trap();
    }
    // Consumers with work: a row item's rows, a key item's 64-key tiles.
    let active = if kind == DENSE_ITEM_ROWS {
        w(2)
    } else {
        w(3).div_ceil(TILE_KEYS)
    };
    if tid == 0 {
        // SAFETY: one thread, before any use; the barrier below.
        unsafe { c.init_bars(active.min(WARPGROUPS)) };
    }
    // SAFETY: every thread reaches it once.
    unsafe { sync::bar_sync() };
    // The roles: warpgroup-uniform arms, each dominated by its register
    // allocation (the budget is asserted in `super`). Of the producer
    // warpgroup one warp loads.
    // SAFETY: the launch contract.
    unsafe {
        if c.wg == WARPGROUPS {
            sync::setmaxnreg_dec::<PRODUCER_REGS>();
            if c.t < 32 {
                match kind {
                    DENSE_ITEM_ROWS => load::rows(&c, w(1), w(2), w(3), w(4)),
                    _ => load::keys(&c, w(1), w(2), w(3), w(4), w(5)),
                }
            }
        } else {
            sync::setmaxnreg_inc::<CONSUMER_REGS>();
            match kind {
                DENSE_ITEM_ROWS => rows::run(&c, w(1), w(2), w(4)),
                _ => keys::run::<DET>(&c, [w(1), w(2), w(3), w(4), w(5), w(6), w(7)]),
            }
        }
    }
}
