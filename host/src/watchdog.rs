//! The host side of the watchdog build (bring-up kit): arms a loaded module
//! that holds the watchdog's configuration, and reads what it recorded.
//!
//! The committed PTX has no watchdog: [`arm`] does nothing for it. The GPU
//! bundle's `ptx-watchdog/` files (`cargo xtask gpu-bundle`, loaded through
//! `INDEXER_PTX_DIR`) bound every mbarrier wait: a wait that exceeds the
//! limit writes a [`WatchdogRecord`] to host-mapped memory and traps. The
//! trap leaves the CUDA context unusable, but the record is host memory
//! and stays readable ([`last_record`]).

use crate::error::Result;
use cudarc::driver::{result, sys, CudaContext, CudaModule};
use kernels_gpu::abi::{WatchdogConfig, WatchdogRecord, WATCHDOG_MAGIC, WATCHDOG_SYMBOL};
use std::sync::{Arc, Mutex};

/// Environment variable: the limit of one mbarrier wait in milliseconds
/// (default [`DEFAULT_LIMIT_MS`]).
pub const LIMIT_ENV: &str = "INDEXER_WATCHDOG_MS";
/// Default limit of one mbarrier wait: far above any wait of a correct
/// kernel (microseconds), far below a user's patience.
pub const DEFAULT_LIMIT_MS: u64 = 2000;

/// The host-mapped record: host pointer (as an address) and device address.
struct Mapped {
    host: usize,
    device: sys::CUdeviceptr,
}

/// One record per process, allocated at the first arming.
static RECORD: Mutex<Option<Mapped>> = Mutex::new(None);

/// The configured limit in nanoseconds.
pub fn limit_ns() -> u64 {
    let ms = std::env::var(LIMIT_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(DEFAULT_LIMIT_MS);
    ms.max(1) * 1_000_000
}

/// Whether PTX text is a watchdog build (declares the configuration).
pub fn is_watchdog_build(ptx: &str) -> bool {
    ptx.contains(&format!(".global .align 8 .b8 {WATCHDOG_SYMBOL}["))
}

/// Whether a watchdog module has been armed in this process.
pub fn is_armed() -> bool {
    ARMED.load(std::sync::atomic::Ordering::Relaxed)
}

static ARMED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Arms `module`, a watchdog build ([`is_watchdog_build`] of its text):
/// points its configuration at a host-mapped, zeroed record and sets the
/// limit ([`limit_ns`]). Returns whether it did (`false` when the module
/// has no configuration after all).
pub fn arm(ctx: &Arc<CudaContext>, module: &Arc<CudaModule>) -> Result<bool> {
    let stream = ctx.default_stream();
    let Ok(mut global) = module.get_global(WATCHDOG_SYMBOL, &stream) else {
        return Ok(false);
    };
    let mut slot = RECORD.lock().unwrap_or_else(|e| e.into_inner());
    if slot.is_none() {
        ctx.bind_to_thread()?;
        let bytes = std::mem::size_of::<WatchdogRecord>();
        // SAFETY: a fresh pinned allocation of `bytes`, mapped into the
        // device address space (DEVICEMAP); zeroed before any kernel can
        // see it; never freed (one per process, read after a trap).
        unsafe {
            let host = result::malloc_host(
                bytes,
                sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE,
            )?;
            std::ptr::write_bytes(host as *mut u8, 0, bytes);
            let mut dptr: sys::CUdeviceptr = 0;
            sys::cuMemHostGetDevicePointer_v2(&mut dptr, host, 0).result()?;
            *slot = Some(Mapped {
                host: host as usize,
                device: dptr,
            });
        }
    }
    let mapped = slot.as_ref().map(|m| m.device).unwrap_or(0);
    let cfg = WatchdogConfig {
        record: mapped,
        limit_ns: limit_ns(),
        claimed: 0,
        _pad: 0,
    };
    // SAFETY: `WatchdogConfig` is plain `#[repr(C)]` data; its bytes are
    // what the device reads at the symbol.
    let bytes: &[u8] = unsafe {
        std::slice::from_raw_parts(
            &cfg as *const WatchdogConfig as *const u8,
            std::mem::size_of::<WatchdogConfig>(),
        )
    };
    if global.len() < bytes.len() {
        return Ok(false);
    }
    stream.memcpy_htod(bytes, &mut global.slice_mut(..bytes.len()))?;
    stream.synchronize()?;
    ARMED.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(true)
}

/// The record the watchdog wrote, if it fired in this process.
pub fn last_record() -> Option<WatchdogRecord> {
    let slot = RECORD.lock().unwrap_or_else(|e| e.into_inner());
    let host = slot.as_ref()?.host as *const WatchdogRecord;
    // SAFETY: the mapped allocation holds one WatchdogRecord and lives for
    // the process; the device writes it with system-scope fences, the
    // magic last, so a record with the magic is complete.
    let rec = unsafe { std::ptr::read_volatile(host) };
    (rec.magic == WATCHDOG_MAGIC).then_some(rec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_watchdog_builds_are_recognised() {
        for embedded in [
            kernels_gpu::PTX_SM90A,
            kernels_gpu::PTX_SM100F,
            kernels_gpu::PTX_SM90,
        ] {
            assert!(!is_watchdog_build(embedded));
        }
        let decl = format!(".visible .global .align 8 .b8 {WATCHDOG_SYMBOL}[24];\n");
        assert!(is_watchdog_build(&format!(".version 8.1\n{decl}")));
    }
}
