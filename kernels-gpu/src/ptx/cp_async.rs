//! `cp.async` (sm_80+): asynchronous 16-, 8- and 4-byte global -> shared copies,
//! tracked per thread by cp.async groups.

use super::smem::SmemAddr;
use core::arch::asm;

/// `cp.async.cg.shared.global [dst], [src], 16, src_bytes`: copies
/// `src_bytes` (16 or 0) bytes and zero-fills the rest of the 16.
///
/// # Safety
/// `dst` must be a 16-byte aligned shared address no other thread touches
/// until this thread's [`wait_all`] and a following barrier; `src` must be a
/// 16-byte aligned global address valid for `src_bytes` bytes (any valid
/// global address when `src_bytes == 0`).
#[inline(always)]
pub unsafe fn copy_16(dst: SmemAddr, src: *const u8, src_bytes: u32) {
    // SAFETY: the caller guarantees the addresses.
    unsafe {
        asm!(
            "cp.async.cg.shared.global [{d}], [{s}], 16, {n};",
            d = in(reg32) dst.0, s = in(reg64) src, n = in(reg32) src_bytes,
            options(nostack),
        )
    }
}

/// `cp.async.ca.shared.global [dst], [src], 4, src_bytes`: copies
/// `src_bytes` (4 or 0) bytes and zero-fills the rest of the 4.
///
/// # Safety
/// As [`copy_16`], with 4-byte alignment.
#[inline(always)]
pub unsafe fn copy_4(dst: SmemAddr, src: *const u8, src_bytes: u32) {
    // SAFETY: the caller guarantees the addresses.
    unsafe {
        asm!(
            "cp.async.ca.shared.global [{d}], [{s}], 4, {n};",
            d = in(reg32) dst.0, s = in(reg64) src, n = in(reg32) src_bytes,
            options(nostack),
        )
    }
}

/// `cp.async.ca.shared.global [dst], [src], 8, src_bytes`: copies
/// `src_bytes` (8 or 0) bytes and zero-fills the rest of the 8.
///
/// # Safety
/// As [`copy_16`], with 8-byte alignment.
#[inline(always)]
pub unsafe fn copy_8(dst: SmemAddr, src: *const u8, src_bytes: u32) {
    // SAFETY: the caller guarantees the addresses.
    unsafe {
        asm!(
            "cp.async.ca.shared.global [{d}], [{s}], 8, {n};",
            d = in(reg32) dst.0, s = in(reg64) src, n = in(reg32) src_bytes,
            options(nostack),
        )
    }
}

/// `cp.async.commit_group`: closes this thread's pending copies into a group.
#[inline(always)]
pub fn commit_group() {
    // SAFETY: no operands.
    unsafe { asm!("cp.async.commit_group;", options(nostack)) }
}

/// `cp.async.wait_all`: waits for all of this thread's copies (they are then
/// visible to this thread; a barrier makes them visible to the CTA).
#[inline(always)]
pub fn wait_all() {
    // SAFETY: no operands; a wait.
    unsafe { asm!("cp.async.wait_all;", options(nostack)) }
}

/// `cp.async.wait_group N`: waits until at most `N` of this thread's most
/// recently committed groups are still pending (the older ones are then
/// complete and visible to this thread; a barrier makes them visible to
/// the CTA).
#[inline(always)]
pub fn wait_group<const N: u32>() {
    // SAFETY: no operands but an immediate; a wait.
    unsafe { asm!("cp.async.wait_group {n};", n = const N, options(nostack)) }
}

/// `cp.async.mbarrier.arrive.noinc.shared.b64 [bar]`: an arrival on `bar`
/// once every `cp.async` this thread issued before has completed (their
/// bytes then visible to the threads that wait on the phase). `.noinc`:
/// the arrival counts toward the barrier's expected count.
///
/// # Safety
/// `bar` is an initialised mbarrier of this CTA whose current phase
/// expects this arrival.
#[inline(always)]
pub unsafe fn mbarrier_arrive_noinc(bar: SmemAddr) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!(
            "cp.async.mbarrier.arrive.noinc.shared.b64 [{b}];",
            b = in(reg32) bar.0,
            options(nostack),
        )
    }
}
