//! The context every role of the dense tile kernel receives (built once
//! by the entry) and the ring's mbarriers: a stage is "full" when the
//! producer's lanes stored its scalars and TMA landed its tile, "empty"
//! when every active consumer thread released it. A leaf of its own so
//! that the roles and the entry that runs them do not use each other.

use super::{phase_of, stage_of, FULL_ARRIVALS, SMEM, STAGES};
use crate::abi::DenseTileParams;
use crate::ptx::mbarrier;
use crate::ptx::smem::SmemAddr;

/// What every role reads: the parameters, this thread's place, the
/// shared-memory map.
pub(super) struct Ctx<'a> {
    /// The launch's parameters.
    pub p: &'a DenseTileParams,
    /// Generic address of the parameter (its tensor maps, for TMA).
    pub maps: u64,
    /// Thread index in the CTA.
    pub tid: u32,
    /// This thread's warpgroup (the producer warp's is `WARPGROUPS`).
    pub wg: u32,
    /// Thread index in its warpgroup.
    pub t: u32,
    /// The 1024-aligned base of dynamic shared memory.
    pub base: SmemAddr,
    /// The deterministic twin's turn table (`super::turns`); 0 in the
    /// default kernel, which never reads it.
    pub turns: u64,
}

impl Ctx<'_> {
    /// Fixed tile `i` (one per consumer).
    #[inline(always)]
    pub fn fixed(&self, i: u32) -> SmemAddr {
        self.base.add(SMEM.fixed + i * super::TILE_BYTES)
    }

    /// The buffer of streamed tile `t` (its tile; scalars at `SMEM.gs`,
    /// `SMEM.w` from there).
    #[inline(always)]
    pub fn stage(&self, t: u32) -> SmemAddr {
        self.base.add(SMEM.ring + stage_of(t) * SMEM.stage)
    }

    /// The "full" mbarrier of streamed tile `t`'s buffer.
    #[inline(always)]
    pub fn full(&self, t: u32) -> SmemAddr {
        self.base.add(SMEM.bars + 8 * stage_of(t))
    }

    /// The "empty" mbarrier of streamed tile `t`'s buffer.
    #[inline(always)]
    pub fn empty(&self, t: u32) -> SmemAddr {
        self.base.add(SMEM.bars + 8 * (STAGES + stage_of(t)))
    }

    /// The mbarrier of the fixed tiles (one phase per CTA).
    #[inline(always)]
    pub fn fixed_bar(&self) -> SmemAddr {
        self.base.add(SMEM.bars + 16 * STAGES)
    }

    /// Initialises the mbarriers for `consumers` active consumer
    /// warpgroups.
    ///
    /// # Safety
    /// One thread, before any use, followed by `mbarrier::fence_init` and a
    /// CTA barrier.
    #[inline(always)]
    pub unsafe fn init_bars(&self, consumers: u32) {
        for s in 0..STAGES {
            // SAFETY: the caller's contract; 8-byte aligned slots of the
            // layout.
            unsafe {
                mbarrier::init(self.full(s), FULL_ARRIVALS);
                mbarrier::init(self.empty(s), 128 * consumers);
            }
        }
        // SAFETY: as above.
        unsafe { mbarrier::init(self.fixed_bar(), 1) };
        mbarrier::fence_init();
    }

    /// Waits until streamed tile `t` is in its buffer (tile and scalars).
    ///
    /// # Safety
    /// The producer fills tile `t` (it is below the item's count).
    #[inline(always)]
    pub unsafe fn wait_full(&self, t: u32) {
        // SAFETY: an initialised barrier whose phase completes.
        unsafe { mbarrier::wait_parity(self.full(t), phase_of(t)) }
    }

    /// This thread is done with streamed tile `t`'s buffer: every read of
    /// it, by its products too, completed before.
    ///
    /// # Safety
    /// Called once per tile by every thread of an active consumer.
    #[inline(always)]
    pub unsafe fn release(&self, t: u32) {
        // SAFETY: an initialised barrier expecting this arrival.
        unsafe { mbarrier::arrive(self.empty(t)) }
    }

    /// The producer's wait until tile `t`'s buffer is free: the consumers
    /// released tile `t - STAGES` (no wait for the first use).
    ///
    /// # Safety
    /// Producer only; the consumers release every tile they were given.
    #[inline(always)]
    pub unsafe fn wait_empty(&self, t: u32) {
        if t >= STAGES {
            // SAFETY: an initialised barrier whose phase completes.
            unsafe { mbarrier::wait_parity(self.empty(t), phase_of(t - STAGES)) }
        }
    }

    /// Waits for the fixed tiles.
    ///
    /// # Safety
    /// The producer loads them (the item has at least one streamed tile).
    #[inline(always)]
    pub unsafe fn wait_fixed(&self) {
        // SAFETY: an initialised barrier whose phase completes.
        unsafe { mbarrier::wait_parity(self.fixed_bar(), 0) }
    }
}
