//! The self-test kernel of the watchdog of bring-up builds (`--cfg
//! kernels_watchdog`), in which every mbarrier wait gives up after
//! `abi::WatchdogConfig::limit_ns`, records which thread waited on which
//! barrier in host-mapped memory, and traps, so a protocol bug fails loudly
//! instead of hanging the GPU (and any CUDA graph it was captured in). The
//! bounded wait itself is part of the mbarrier wrapper
//! (`ptx::mbarrier::wait_parity_tagged`). Ordinary builds (the committed
//! PTX) wait without a bound and contain none of this.

use crate::ptx::{mbarrier, smem, sreg, sync};

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
