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
    unsafe { wait_parity_tagged(bar, parity, crate::abi::WATCHDOG_NO_TAG) }
}

/// [`wait_parity`] carrying a tag (`abi::watchdog_tag`) that a watchdog
/// build reports when this wait gives up (the `watchdog` below); ordinary
/// builds ignore it.
///
/// # Safety
/// As [`wait_parity`].
#[inline(always)]
pub unsafe fn wait_parity_tagged(bar: SmemAddr, parity: u32, tag: u32) {
    #[cfg(kernels_watchdog)]
    // SAFETY: forwarded.
    unsafe {
        watchdog::bounded_wait(bar, parity, tag)
    }
    #[cfg(not(kernels_watchdog))]
    {
        let _ = tag;
        // SAFETY: forwarded.
        while !unsafe { try_wait_parity(bar, parity) } {}
    }
}

/// The watchdog of bring-up builds (`--cfg kernels_watchdog`): every wait
/// gives up after `abi::WatchdogConfig::limit_ns`, records which thread
/// waited on which barrier in host-mapped memory (`abi::WatchdogRecord`),
/// and traps, so a protocol bug fails loudly instead of hanging the GPU.
/// Part of the wait it bounds; its self-test kernel is `crate::watchdog`.
#[cfg(kernels_watchdog)]
mod watchdog {
    use crate::abi::{WatchdogConfig, WatchdogRecord, WATCHDOG_MAGIC};
    use crate::ptx::smem::{self, SmemAddr};
    use crate::ptx::{global, sreg, sync};
    use core::ptr::{addr_of, addr_of_mut, read_volatile};

    /// The configuration the host writes after loading the module
    /// (`abi::WATCHDOG_SYMBOL`); all zero means unbounded waits.
    #[no_mangle]
    pub static mut INDEXER_WATCHDOG: WatchdogConfig = WatchdogConfig {
        record: 0,
        limit_ns: 0,
        claimed: 0,
        _pad: 0,
    };

    /// Polls between two reads of the clock.
    const POLLS_PER_CHECK: u32 = 64;

    /// [`super::wait_parity`] with a time limit (see the module docs).
    ///
    /// # Safety
    /// As [`super::wait_parity`].
    #[inline(always)]
    pub unsafe fn bounded_wait(bar: SmemAddr, parity: u32, tag: u32) {
        // SAFETY: a module global, read without forming a reference.
        let limit = unsafe { read_volatile(addr_of!(INDEXER_WATCHDOG.limit_ns)) };
        let mut start = 0u64;
        let mut polls = 0u32;
        // SAFETY: forwarded.
        while !unsafe { super::try_wait_parity(bar, parity) } {
            polls += 1;
            if limit == 0 || polls % POLLS_PER_CHECK != 0 {
                continue;
            }
            let now = sreg::global_timer_ns();
            if start == 0 {
                start = now;
            } else if now.wrapping_sub(start) > limit {
                // SAFETY: forwarded.
                unsafe { fire(bar, parity, tag, now.wrapping_sub(start)) }
            }
        }
    }

    /// The first thread to fire writes the record and traps; the others wait
    /// for the trap.
    ///
    /// # Safety
    /// Called from [`bounded_wait`].
    #[cold]
    unsafe fn fire(bar: SmemAddr, parity: u32, tag: u32, elapsed_ns: u64) -> ! {
        let cfg = addr_of_mut!(INDEXER_WATCHDOG);
        // SAFETY: module globals, accessed by address; the record pointer is
        // 0 or a host-mapped WatchdogRecord (set by the host before launch).
        unsafe {
            if global::atom_cas_u32(addr_of_mut!((*cfg).claimed), 0, 1) == 0 {
                let rec = read_volatile(addr_of!((*cfg).record)) as *mut WatchdogRecord;
                if !rec.is_null() {
                    let tid = sreg::thread_idx_x();
                    let fields = [
                        (addr_of_mut!((*rec).cta), sreg::block_idx_x()),
                        (addr_of_mut!((*rec).warp), tid / 32),
                        (addr_of_mut!((*rec).lane), tid % 32),
                        (addr_of_mut!((*rec).sm), sreg::sm_id()),
                        (addr_of_mut!((*rec).barrier_offset), bar.0 - smem::base().0),
                        (addr_of_mut!((*rec).parity), parity),
                        (addr_of_mut!((*rec).tag), tag),
                        (addr_of_mut!((*rec).elapsed_us), (elapsed_ns / 1000) as u32),
                    ];
                    for (p, v) in fields {
                        global::st_volatile_u32(p, v);
                    }
                    // The fields land before the magic that marks them complete.
                    global::fence_sc_sys();
                    global::st_volatile_u32(addr_of_mut!((*rec).magic), WATCHDOG_MAGIC);
                    global::fence_sc_sys();
                }
                sync::trap()
            }
        }
        loop {
            global::nanosleep(1 << 20);
        }
    }
}
