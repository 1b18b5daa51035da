//! The deterministic twin's ordering (`indexer_dense_bwd_wg_det_h64_d128`):
//! every accumulator element of `d_index_k` receives one f32 addition per
//! key item that covers its key (one per run of up to
//! `ITEM_MAX_ROWS` query rows), and f32 addition is not associative, so
//! the default kernel's result depends on the order in which the runs'
//! reductions land. The twin fixes that order.
//!
//! - **Chains.** The runs of one 128-key tile form two chains (its first
//!   and its second 64 keys, one per consumer warpgroup; item words 6 and
//!   7 name the chain and the run's turn in it, `abi::DENSE_ITEM_KEYS`).
//!   A warpgroup adds its sums only once the chain's counter (word
//!   `1 + chain` of the turn table) equals its turn, and then raises it:
//!   each element sums its runs in turn order, on every run and GPU.
//! - **Tickets.** The twin takes its item from word 0 of the turn table
//!   (an atomic increment per CTA) instead of its block index, so item `i`
//!   runs only in a CTA that started after the CTAs of every item before
//!   it. The host lists each chain's turns in increasing order
//!   (`dense::tiles` in the host crate, with a test), so a warpgroup only
//!   ever waits for a CTA that is already resident and that waits, by
//!   induction, for nothing that has not started: no deadlock, whatever
//!   the hardware's block order and however many CTAs fit.
//! - **Memory order.** The waiting thread's acquire load and the passing
//!   thread's fence and release store, each next to a barrier of the
//!   warpgroup, order every reduction of turn `t` before every reduction
//!   of turn `t + 1` on the device.

use super::ctx::Ctx;
use super::SMEM;
use crate::ptx::global::{
    atom_add_u32, fence_acq_rel_gpu, ld_acquire_gpu_u32, nanosleep, st_release_gpu_u32,
};
use crate::ptx::smem;
use crate::ptx::sync;

/// Named barrier of consumer warpgroup `wg` (id 0 is the CTA's).
const fn barrier(wg: u32) -> u32 {
    1 + wg
}

/// Nanoseconds between two polls of a chain's counter.
const POLL_NS: u32 = 64;

/// This CTA's work item: the next ticket of the turn table.
///
/// # Safety
/// Every thread of the CTA, converged, before any other use of shared
/// memory (it passes the ticket through stage 0's visible-count word,
/// which the producer writes only after the CTA's start barrier); the
/// turn table of the launch contract.
#[inline(always)]
pub(super) unsafe fn ticket(c: &Ctx<'_>) -> u32 {
    let slot = c.base.add(SMEM.ring + SMEM.lim);
    if c.tid == 0 {
        // SAFETY: word 0 of the turn table (valid, aligned); a word of
        // stage 0 no one else touches before the barrier.
        unsafe { smem::st_u32(slot, atom_add_u32(c.turns as *mut u32, 1)) };
    }
    // SAFETY: every thread reaches it once; it orders the store above
    // before the loads below.
    unsafe { sync::bar_sync() };
    // SAFETY: the word stored above.
    let t = unsafe { smem::ld_u32(slot) };
    // SAFETY: every thread, converged; the same value in every thread.
    unsafe { sync::uniform_u32(t) }
}

/// The counter word of `chain` in the turn table.
#[inline(always)]
fn counter(c: &Ctx<'_>, chain: u32) -> *mut u32 {
    (c.turns as *mut u32).wrapping_add(1 + chain as usize)
}

/// Waits until the turns before `turn` of `chain` added their sums.
///
/// # Safety
/// Every thread of this consumer warpgroup, converged; `chain` is one of
/// the launch's chains and its earlier turns belong to items listed
/// before this CTA's (module note).
#[inline(always)]
pub(super) unsafe fn wait(c: &Ctx<'_>, chain: u32, turn: u32) {
    if c.t == 0 && turn > 0 {
        // SAFETY: a word of the turn table; the spin contains no
        // collective (one thread).
        while unsafe { ld_acquire_gpu_u32(counter(c, chain)) } != turn {
            nanosleep(POLL_NS);
        }
    }
    // SAFETY: the warpgroup's 128 threads, converged (the caller).
    unsafe { sync::bar_sync_named(barrier(c.wg), 128) };
}

/// Hands `chain` to its next turn once this warpgroup's reductions of
/// `turn` are done.
///
/// # Safety
/// As [`wait`], after this warpgroup's reductions of the item.
#[inline(always)]
pub(super) unsafe fn pass(c: &Ctx<'_>, chain: u32, turn: u32) {
    // SAFETY: as `wait`.
    unsafe { sync::bar_sync_named(barrier(c.wg), 128) };
    if c.t == 0 {
        fence_acq_rel_gpu();
        // SAFETY: a word of the turn table.
        unsafe { st_release_gpu_u32(counter(c, chain), turn + 1) };
    }
}
