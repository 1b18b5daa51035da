//! The device implementation of [`Machine`]: every operation of the
//! protocol skeletons (`proto`) is the real instruction. **Not executed.**
//!
//! `Dev<R>` carries the kernel context, the lane, and the role's own state
//! `R`, whose module implements the role's work trait on `Dev<R>`.

use super::ctx::Ctx;
use super::proto::Machine;
use super::sched::parity;
use crate::abi::watchdog_tag;
use crate::ptx::{bulk, mbarrier, sreg, sync, tcgen05, tma};

/// One actor of the stage-2 kernel on the device (see the module docs).
pub(super) struct Dev<'a, R> {
    /// Parameters, shared-memory map, tensor memory.
    pub c: &'a Ctx<'a>,
    /// This thread's lane.
    pub lane: u32,
    /// The role's state.
    pub role: R,
}

impl<'a, R> Dev<'a, R> {
    /// # Safety
    /// Called inside the stage-2 kernel after the prologue (barriers
    /// initialised, tensor memory allocated), by the threads of the role
    /// whose skeleton (`proto`) then drives it: its methods issue the
    /// skeleton's barrier operations, which are only sound in that order.
    #[inline(always)]
    pub unsafe fn new(c: &'a Ctx<'a>, role: R) -> Self {
        Dev {
            c,
            lane: sreg::thread_idx_x() % 32,
            role,
        }
    }
}

// SAFETY (every method below): `Dev::new`'s contract: the barriers are
// initialised, and the calls come from the role skeletons in `proto`,
// whose waits name phases that the protocol completes, whose arrivals each
// phase expects (both checked on the host by `sm100::model`), and whose
// commits follow the MMAs they release.
impl<R> Machine for Dev<'_, R> {
    #[inline(always)]
    fn wait(&mut self, bar: u32, phase: u32) {
        // SAFETY: see the impl.
        unsafe {
            mbarrier::wait_parity_tagged(self.c.bar(bar), parity(phase), watchdog_tag(bar, phase))
        }
    }
    #[inline(always)]
    fn arrive(&mut self, bar: u32, _phase: u32) {
        // SAFETY: see the impl.
        unsafe { mbarrier::arrive(self.c.bar(bar)) }
    }
    #[inline(always)]
    fn arrive_expect_tx(&mut self, bar: u32, _phase: u32, bytes: u32) {
        // SAFETY: see the impl.
        unsafe { tma::arrive_expect_tx(self.c.bar(bar), bytes) }
    }
    #[inline(always)]
    fn commit(&mut self, bar: u32, _phase: u32) {
        // SAFETY: see the impl.
        unsafe { tcgen05::commit(self.c.bar(bar)) }
    }
    #[inline(always)]
    fn bulk_wait_read(&mut self) {
        bulk::wait_group_read_0();
    }
    #[inline(always)]
    fn bulk_wait(&mut self) {
        bulk::wait_group_0();
    }
    #[inline(always)]
    fn tc_fence_before(&mut self) {
        tcgen05::fence_before_thread_sync();
    }
    #[inline(always)]
    fn tc_fence_after(&mut self) {
        tcgen05::fence_after_thread_sync();
    }
    #[inline(always)]
    fn proxy_fence(&mut self) {
        bulk::fence_proxy_async_shared();
    }
    #[inline(always)]
    fn warp_sync(&mut self) {
        // SAFETY: the skeletons call it outside lane-dependent branches,
        // and every role runs on whole warps (the MMA role, one lane, never
        // calls it).
        unsafe { sync::warp_sync() }
    }
    #[inline(always)]
    fn lane0(&mut self, f: impl FnOnce(&mut Self)) {
        if self.lane == 0 {
            f(self);
        }
    }
    #[inline(always)]
    fn lane0_else(&mut self, f: impl FnOnce(&mut Self), others: impl FnOnce(&mut Self)) {
        if self.lane == 0 {
            f(self);
        } else {
            others(self);
        }
    }
}
