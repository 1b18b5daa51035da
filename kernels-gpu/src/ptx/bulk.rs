//! Bulk asynchronous copies/reductions between shared and global memory
//! (the TMA unit, sm_90+), tracked per thread by bulk async-groups.

use super::smem::SmemAddr;
use core::arch::asm;

/// `cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32`: adds
/// `bytes / 4` f32 from shared memory into global memory, element-wise and
/// atomically per element, asynchronously.
///
/// # Safety
/// `dst` must be a 16-byte aligned global f32 range of `bytes` bytes the
/// kernel may update; `src` a 16-byte aligned shared range of `bytes` bytes
/// whose contents were written before a `fence.proxy.async.shared::cta`
/// ([`fence_proxy_async_shared`]) and a barrier, and left untouched until this
/// thread's [`wait_group_read_0`]; `bytes` a multiple of 16.
#[inline(always)]
pub unsafe fn reduce_add_f32(dst: *mut f32, src: SmemAddr, bytes: u32) {
    // SAFETY: the caller guarantees the ranges, alignment and ordering.
    unsafe {
        asm!(
            "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [{d}], [{s}], {n};",
            d = in(reg64) dst, s = in(reg32) src.0, n = in(reg32) bytes,
            options(nostack),
        )
    }
}

/// `cp.async.bulk.commit_group`: closes this thread's pending bulk
/// operations into one group.
#[inline(always)]
pub fn commit_group() {
    // SAFETY: no operands; only affects this thread's group bookkeeping.
    unsafe { asm!("cp.async.bulk.commit_group;", options(nostack)) }
}

/// `cp.async.bulk.wait_group.read 0`: waits until every committed bulk group
/// of this thread has finished reading its shared-memory source (the
/// source may then be overwritten).
#[inline(always)]
pub fn wait_group_read_0() {
    // SAFETY: no operands; a wait.
    unsafe { asm!("cp.async.bulk.wait_group.read 0;", options(nostack)) }
}

/// `cp.async.bulk.wait_group 0`: waits until every committed bulk group of
/// this thread has completed (its global writes are done).
#[inline(always)]
pub fn wait_group_0() {
    // SAFETY: no operands; a wait.
    unsafe { asm!("cp.async.bulk.wait_group 0;", options(nostack)) }
}

/// `fence.proxy.async.shared::cta`: orders this thread's ordinary
/// shared-memory writes before later async-proxy (bulk/TMA) reads of them.
#[inline(always)]
pub fn fence_proxy_async_shared() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) }
}
