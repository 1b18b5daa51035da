//! `mbarrier` objects in shared memory (8 bytes each, 8-byte aligned).

use super::smem::SmemAddr;
use core::arch::asm;

/// `mbarrier.init.shared::cta.b64`: expect `count` arrivals per phase.
///
/// # Safety
/// `bar` must be an 8-byte aligned shared address not in use as a barrier by
/// any thread; exactly one thread initialises it, and the others may use it
/// only after [`fence_init`] and a CTA barrier.
#[inline(always)]
pub unsafe fn init(bar: SmemAddr, count: u32) {
    // SAFETY: the caller guarantees exclusive access during initialisation.
    unsafe {
        asm!("mbarrier.init.shared::cta.b64 [{b}], {c};", b = in(reg32) bar.0, c = in(reg32) count,
             options(nostack))
    }
}

/// `fence.mbarrier_init.release.cluster`: makes a preceding [`init`]
/// visible before the barrier is used.
#[inline(always)]
pub fn fence_init() {
    // SAFETY: a fence has no operands and no preconditions.
    unsafe { asm!("fence.mbarrier_init.release.cluster;", options(nostack)) }
}

/// `mbarrier.arrive.shared::cta.b64` (release semantics): one arrival.
///
/// # Safety
/// `bar` must be an initialised mbarrier of this CTA whose current phase still
/// expects an arrival from the caller.
#[inline(always)]
pub unsafe fn arrive(bar: SmemAddr) {
    // SAFETY: the caller guarantees an initialised barrier.
    unsafe {
        asm!("{{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [{b}]; }}", b = in(reg32) bar.0,
             options(nostack))
    }
}

/// `mbarrier.try_wait.parity.shared::cta.b64`: whether the phase with parity
/// `parity` has completed (may suspend for a while before answering false).
///
/// # Safety
/// `bar` must be an initialised mbarrier of this CTA.
#[inline(always)]
pub unsafe fn try_wait_parity(bar: SmemAddr, parity: u32) -> bool {
    let done: u32;
    // SAFETY: the caller guarantees an initialised barrier.
    unsafe {
        asm!(
            "{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [{b}], {ph}; selp.u32 {d}, 1, 0, p; }}",
            d = out(reg32) done, b = in(reg32) bar.0, ph = in(reg32) parity,
            options(nostack),
        )
    }
    done != 0
}

/// Spins on [`try_wait_parity`] until the phase with `parity` completes
/// (acquire semantics: writes released by the arrivals are then visible).
///
/// # Safety
/// As [`try_wait_parity`]; the phase must eventually complete.
#[inline(always)]
pub unsafe fn wait_parity(bar: SmemAddr, parity: u32) {
    // SAFETY: forwarded.
    unsafe { wait_parity_tagged(bar, parity, crate::params::WATCHDOG_NO_TAG) }
}

/// [`wait_parity`] carrying a tag (`params::watchdog_tag`) that a watchdog
/// build reports when this wait gives up (`crate::watchdog`); ordinary
/// builds ignore it.
///
/// # Safety
/// As [`wait_parity`].
#[inline(always)]
pub unsafe fn wait_parity_tagged(bar: SmemAddr, parity: u32, tag: u32) {
    #[cfg(kernels_watchdog)]
    // SAFETY: forwarded.
    unsafe {
        crate::watchdog::bounded_wait(bar, parity, tag)
    }
    #[cfg(not(kernels_watchdog))]
    {
        let _ = tag;
        // SAFETY: forwarded.
        while !unsafe { try_wait_parity(bar, parity) } {}
    }
}
