//! Global-memory accesses with explicit state spaces and cache hints.

use core::arch::asm;

/// `ld.global.nc.v4.b32`: 16 bytes through the read-only path.
///
/// # Safety
/// `p` must be 16-byte aligned, point into global memory that stays
/// unmodified for the whole kernel, and be valid for 16 bytes.
#[inline(always)]
pub unsafe fn ld_nc_v4(p: *const u8) -> [u32; 4] {
    let (x, y, z, w): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees alignment, validity and immutability.
    unsafe {
        asm!("ld.global.nc.v4.b32 {{{x}, {y}, {z}, {w}}}, [{p}];",
             x = out(reg32) x, y = out(reg32) y, z = out(reg32) z, w = out(reg32) w,
             p = in(reg64) p, options(pure, readonly, nostack))
    }
    [x, y, z, w]
}

/// `st.global.v4.b32`: 16 bytes.
///
/// # Safety
/// `p` must be 16-byte aligned global memory, valid for 16 bytes of writes
/// that no other thread accesses concurrently.
#[inline(always)]
pub unsafe fn st_v4(p: *mut u8, v: [u32; 4]) {
    // SAFETY: the caller guarantees alignment and validity.
    unsafe {
        asm!("st.global.v4.b32 [{p}], {{{x}, {y}, {z}, {w}}};", p = in(reg64) p,
             x = in(reg32) v[0], y = in(reg32) v[1], z = in(reg32) v[2], w = in(reg32) v[3],
             options(nostack))
    }
}

/// `red.global.add.f32`: atomic add without a return value.
///
/// # Safety
/// `p` must be a 4-byte aligned f32 in global memory, valid for writes.
#[inline(always)]
pub unsafe fn red_add_f32(p: *mut f32, v: f32) {
    // SAFETY: the caller guarantees a valid global f32 address; the
    // reduction is atomic, so concurrent adds from other threads are fine.
    unsafe {
        asm!("red.global.add.f32 [{p}], {v};", p = in(reg64) p, v = in(reg32) v, options(nostack))
    }
}

/// `red.global.add.v4.f32`: atomic adds of four consecutive f32 without a
/// return value (PTX ISA 8.1; each element is atomic on its own).
///
/// # Safety
/// `p` must be a 16-byte aligned group of four f32 in global memory, valid
/// for writes.
#[inline(always)]
pub unsafe fn red_add_v4_f32(p: *mut f32, v: [f32; 4]) {
    // SAFETY: the caller guarantees a valid, aligned global address; the
    // reductions are atomic, so concurrent adds from other threads are fine.
    unsafe {
        asm!("red.global.add.v4.f32 [{p}], {{{x}, {y}, {z}, {w}}};",
             p = in(reg64) p, x = in(reg32) v[0], y = in(reg32) v[1], z = in(reg32) v[2],
             w = in(reg32) v[3], options(nostack))
    }
}

/// `red.global.add.v2.f32`: atomic adds of two consecutive f32 without a
/// return value (PTX ISA 8.1; each element is atomic on its own).
///
/// # Safety
/// `p` must be an 8-byte aligned pair of f32 in global memory, valid for
/// writes.
#[inline(always)]
pub unsafe fn red_add_v2_f32(p: *mut f32, v: [f32; 2]) {
    // SAFETY: the caller guarantees a valid, aligned global address; the
    // reductions are atomic, so concurrent adds from other threads are fine.
    unsafe {
        asm!("red.global.add.v2.f32 [{p}], {{{x}, {y}}};",
             p = in(reg64) p, x = in(reg32) v[0], y = in(reg32) v[1], options(nostack))
    }
}

/// `red.global.add.u64`: atomic 64-bit integer add without a return value
/// (integer addition is associative, so the final sum does not depend on
/// the order the additions land in).
///
/// # Safety
/// `p` must be an 8-byte aligned u64 in global memory, valid for writes.
#[inline(always)]
pub unsafe fn red_add_u64(p: *mut u64, v: u64) {
    // SAFETY: the caller guarantees a valid, aligned global address; the
    // reduction is atomic.
    unsafe {
        asm!("red.global.add.u64 [{p}], {v};", p = in(reg64) p, v = in(reg64) v, options(nostack))
    }
}

/// `red.global.max.u32`: atomic unsigned maximum without a return value.
///
/// # Safety
/// `p` must be a 4-byte aligned u32 in global memory, valid for writes.
#[inline(always)]
pub unsafe fn red_max_u32(p: *mut u32, v: u32) {
    // SAFETY: the caller guarantees a valid, aligned global address; the
    // reduction is atomic.
    unsafe {
        asm!("red.global.max.u32 [{p}], {v};", p = in(reg64) p, v = in(reg32) v, options(nostack))
    }
}

/// `red.global.or.b32`: atomic bitwise or without a return value.
///
/// # Safety
/// `p` must be a 4-byte aligned u32 in global memory, valid for writes.
#[inline(always)]
pub unsafe fn red_or_b32(p: *mut u32, v: u32) {
    // SAFETY: the caller guarantees a valid, aligned global address; the
    // reduction is atomic.
    unsafe {
        asm!("red.global.or.b32 [{p}], {v};", p = in(reg64) p, v = in(reg32) v, options(nostack))
    }
}

/// `ld.global.f32`, kept where it is written: not `pure`, so the compiler
/// neither sinks it into the branch that uses it nor merges it away, and a
/// run of these issues back to back (memory-level parallelism).
///
/// # Safety
/// `p` must be a 4-byte aligned f32 in global memory, valid for reads.
#[inline(always)]
pub unsafe fn ld_f32_eager(p: *const f32) -> f32 {
    let v: f32;
    // SAFETY: the caller guarantees a valid, aligned global address.
    unsafe {
        asm!("ld.global.f32 {v}, [{p}];", v = out(reg32) v, p = in(reg64) p,
             options(readonly, nostack))
    }
    v
}

/// `atom.global.cas.b32` (device scope, relaxed): stores `new` at `p` if it
/// holds `cmp`; returns the old value.
///
/// # Safety
/// `p` must be a valid, 4-byte aligned global address.
#[inline(always)]
pub unsafe fn atom_cas_u32(p: *mut u32, cmp: u32, new: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees a valid global address.
    unsafe {
        core::arch::asm!(
            "atom.global.cas.b32 {o}, [{p}], {c}, {n};",
            o = out(reg32) old, p = in(reg64) p, c = in(reg32) cmp, n = in(reg32) new,
            options(nostack),
        )
    }
    old
}

/// `atom.global.add.u32` (device scope, relaxed): adds `v` at `p` and
/// returns the old value, e.g. to hand out tickets in arrival order.
///
/// # Safety
/// `p` must be a valid, 4-byte aligned global address.
#[inline(always)]
pub unsafe fn atom_add_u32(p: *mut u32, v: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees a valid global address.
    unsafe {
        core::arch::asm!(
            "atom.global.add.u32 {o}, [{p}], {v};",
            o = out(reg32) old, p = in(reg64) p, v = in(reg32) v,
            options(nostack),
        )
    }
    old
}

/// `ld.acquire.gpu.global.u32`: a load after which this thread's later
/// accesses observe everything the releasing writer's release store
/// ([`st_release_gpu_u32`]) ordered before it.
///
/// # Safety
/// `p` must be a valid, 4-byte aligned global address.
#[inline(always)]
pub unsafe fn ld_acquire_gpu_u32(p: *const u32) -> u32 {
    let v: u32;
    // SAFETY: the caller guarantees a valid global address. Not
    // `readonly`/`pure`: the load is an ordering point and is re-issued in
    // a spin loop.
    unsafe {
        core::arch::asm!("ld.acquire.gpu.global.u32 {v}, [{p}];", v = out(reg32) v,
                         p = in(reg64) p, options(nostack))
    }
    v
}

/// `st.release.gpu.global.u32`: a store that an acquiring load on the
/// device ([`ld_acquire_gpu_u32`]) can observe only after this thread's
/// earlier accesses (and those ordered before them, e.g. by a barrier).
///
/// # Safety
/// `p` must be a valid, 4-byte aligned global address.
#[inline(always)]
pub unsafe fn st_release_gpu_u32(p: *mut u32, v: u32) {
    // SAFETY: the caller guarantees a valid global address.
    unsafe {
        core::arch::asm!("st.release.gpu.global.u32 [{p}], {v};", p = in(reg64) p,
                         v = in(reg32) v, options(nostack))
    }
}

/// `fence.acq_rel.gpu`: orders this thread's earlier memory accesses (and
/// those a barrier ordered before them) before its later ones, for every
/// observer on the device.
#[inline(always)]
pub fn fence_acq_rel_gpu() {
    // SAFETY: a fence has no operands and no preconditions.
    unsafe { core::arch::asm!("fence.acq_rel.gpu;", options(nostack)) }
}

/// `st.volatile.global.u32`: a store that is performed (not merged or
/// dropped), for records that another agent (the host) reads.
///
/// # Safety
/// `p` must be a valid, 4-byte aligned global (or host-mapped) address.
#[inline(always)]
pub unsafe fn st_volatile_u32(p: *mut u32, v: u32) {
    // SAFETY: the caller guarantees a valid address.
    unsafe {
        core::arch::asm!("st.volatile.global.u32 [{p}], {v};", p = in(reg64) p, v = in(reg32) v,
                         options(nostack))
    }
}

/// `fence.sc.sys`: orders this thread's earlier memory accesses before its
/// later ones for every observer, the host included.
#[inline(always)]
pub fn fence_sc_sys() {
    // SAFETY: a fence has no operands and no preconditions.
    unsafe { core::arch::asm!("fence.sc.sys;", options(nostack)) }
}

/// `nanosleep.u32`: suspends the thread for about `ns` nanoseconds.
#[inline(always)]
pub fn nanosleep(ns: u32) {
    // SAFETY: no memory is touched.
    unsafe { core::arch::asm!("nanosleep.u32 {n};", n = in(reg32) ns, options(nomem, nostack)) }
}
