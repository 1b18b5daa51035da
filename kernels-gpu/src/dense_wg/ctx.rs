//! The context every role of the dense tile kernel receives (built once
//! by the entry), and the CTA barrier that closes each step of the
//! pipeline. A leaf of its own so that the roles and the entry that runs
//! them do not use each other.

use super::SMEM;
use crate::abi::DenseTileParams;
use crate::ptx::smem::SmemAddr;
use crate::ptx::{cp_async, sync};

/// What every role reads: the parameters, this thread's place, the
/// shared-memory map.
pub(super) struct Ctx<'a> {
    /// The launch's parameters.
    pub p: &'a DenseTileParams,
    /// Thread index in the CTA.
    pub tid: u32,
    /// This thread's warpgroup.
    pub wg: u32,
    /// Thread index in its warpgroup.
    pub t: u32,
    /// The 1024-aligned base of dynamic shared memory.
    pub base: SmemAddr,
}

impl Ctx<'_> {
    /// Fixed tile `i` (one per warpgroup).
    #[inline(always)]
    pub fn fixed(&self, i: u32) -> SmemAddr {
        self.base.add(SMEM.fixed + i * super::TILE_BYTES)
    }

    /// Stage `s` of the ring (its tile).
    #[inline(always)]
    pub fn stage(&self, s: u32) -> SmemAddr {
        self.base.add(SMEM.ring + (s % super::STAGES) * SMEM.stage)
    }

    /// Waits for this thread's copies, hands them to the async proxy
    /// (wgmma reads them) and meets the CTA: afterwards every copy issued
    /// before is visible to every warpgroup's products, and every product
    /// and shared read issued before by any thread is complete.
    ///
    /// # Safety
    /// Every thread of the CTA reaches it (uniform control flow).
    #[inline(always)]
    pub unsafe fn landed(&self) {
        cp_async::wait_all();
        crate::ptx::bulk::fence_proxy_async_shared();
        // SAFETY: the caller's contract.
        unsafe { sync::bar_sync() };
    }
}
