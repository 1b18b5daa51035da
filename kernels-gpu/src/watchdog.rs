//! The watchdog of bring-up builds (`--cfg kernels_watchdog`): every
//! mbarrier wait gives up after [`WatchdogConfig::limit_ns`], records which
//! thread waited on which barrier in host-mapped memory, and traps, so a
//! protocol bug fails loudly instead of hanging the GPU (and any CUDA
//! graph it was captured in). Ordinary builds (the committed PTX) wait
//! without a bound and contain none of this.

use crate::params::{WatchdogConfig, WatchdogRecord, WATCHDOG_MAGIC};
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{global, mbarrier, sreg, sync};
use core::ptr::{addr_of, addr_of_mut, read_volatile};

/// The configuration the host writes after loading the module
/// ([`crate::params::WATCHDOG_SYMBOL`]); all zero means unbounded waits.
#[no_mangle]
pub static mut INDEXER_WATCHDOG: WatchdogConfig = WatchdogConfig {
    record: 0,
    limit_ns: 0,
    claimed: 0,
    _pad: 0,
};

/// Polls between two reads of the clock.
const POLLS_PER_CHECK: u32 = 64;

/// `mbarrier::wait_parity` with a time limit (see the module docs).
///
/// # Safety
/// As `mbarrier::wait_parity`.
#[inline(always)]
pub unsafe fn bounded_wait(bar: SmemAddr, parity: u32, tag: u32) {
    // SAFETY: a module global, read without forming a reference.
    let limit = unsafe { read_volatile(addr_of!(INDEXER_WATCHDOG.limit_ns)) };
    let mut start = 0u64;
    let mut polls = 0u32;
    // SAFETY: forwarded.
    while !unsafe { mbarrier::try_wait_parity(bar, parity) } {
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

/// The watchdog's self-test: every thread waits on an mbarrier that nobody
/// arrives on; with the watchdog configured the launch fails within the
/// limit and the record names CTA 0, a warp of the probe, the barrier at
/// offset 0 and `tag`.
///
/// # Safety
/// One CTA of `WATCHDOG_PROBE_THREADS` threads with `WATCHDOG_PROBE_SMEM`
/// bytes of dynamic shared memory. Without a configured limit it never
/// returns.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn watchdog_probe(tag: u32) {
    let bar = smem::base();
    // SAFETY: thread 0 initialises the barrier before the CTA barrier; the
    // barrier lies in the launch's dynamic shared memory.
    unsafe {
        if sreg::thread_idx_x() == 0 {
            mbarrier::init(bar, 1);
            mbarrier::fence_init();
        }
        sync::bar_sync();
        mbarrier::wait_parity_tagged(bar, 0, tag);
    }
}
