//! Tensor Memory Accelerator loads completing on mbarriers.

use super::smem::SmemAddr;
use core::arch::asm;

/// `mbarrier.arrive.expect_tx.shared::cta.b64`: one arrival that also
/// expects `bytes` more transaction bytes in the current phase.
///
/// # Safety
/// `bar` is an initialised mbarrier of this CTA whose phase still expects
/// an arrival from the caller.
#[inline(always)]
pub unsafe fn arrive_expect_tx(bar: SmemAddr, bytes: u32) {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!("mbarrier.arrive.expect_tx.shared::cta.b64 _, [{b}], {n};",
             b = in(reg32) bar.0, n = in(reg32) bytes, options(nostack))
    }
}

/// `cp.async.bulk.tensor.2d.shared::cta.global.tile::gather4.mbarrier::complete_tx::bytes`
/// (sm_100f): four rows `rows` of a 2D tensor map, starting at column `col`,
/// land contiguously at `dst`; out-of-bounds rows are zero-filled. The bytes
/// count toward `bar`'s transaction count. **Compiled for sm_100f, not
/// executed.**
///
/// # Safety
/// `tmap` points to a valid 64-byte aligned `CUtensorMap` (box height 1) in
/// global memory written before the launch; `dst` is shared memory of the
/// box size x 4, aligned as the map's swizzle requires; `bar` expects the
/// bytes ([`arrive_expect_tx`]).
#[inline(always)]
pub unsafe fn gather4(dst: SmemAddr, tmap: *const u8, col: i32, rows: [i32; 4], bar: SmemAddr) {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!(
            "cp.async.bulk.tensor.2d.shared::cta.global.tile::gather4.mbarrier::complete_tx::bytes [{d}], [{m}, {{{c}, {r0}, {r1}, {r2}, {r3}}}], [{b}];",
            d = in(reg32) dst.0, m = in(reg64) tmap, c = in(reg32) col,
            r0 = in(reg32) rows[0], r1 = in(reg32) rows[1], r2 = in(reg32) rows[2], r3 = in(reg32) rows[3],
            b = in(reg32) bar.0, options(nostack),
        )
    }
}

/// `cp.async.bulk.tensor.2d.shared::cta.global.tile.mbarrier::complete_tx::bytes`:
/// one box of a 2D tensor map whose first element is at `(c0, c1)`
/// (innermost coordinate first) lands at `dst`, laid out (and swizzled) as
/// the map says; out-of-bounds elements are zero-filled. The bytes count
/// toward `bar`'s transaction count. Executed on sm_90a (dense mode's tile
/// kernel); compiled for sm_100f, not executed there.
///
/// # Safety
/// `tmap` is the generic address of a valid 64-byte aligned `CUtensorMap`
/// (kernel parameter, constant or global memory) that stays unchanged while
/// the grid runs; `dst` is shared memory of the box size, aligned as the
/// map's swizzle requires (1024 bytes for the 128-byte swizzle); `bar`
/// expects the bytes ([`arrive_expect_tx`]).
#[inline(always)]
pub unsafe fn load_2d(dst: SmemAddr, tmap: u64, c0: i32, c1: i32, bar: SmemAddr) {
    // The `.shared::cta` destination needs PTX ISA 8.6, newer than the
    // sm_90a module's; there the CTA's own window of `.shared::cluster`
    // (which a CTA address is, without clusters) names the same bytes.
    #[cfg(kernels_arch = "sm_90a")]
    macro_rules! dst_space {
        () => {
            "shared::cluster"
        };
    }
    #[cfg(not(kernels_arch = "sm_90a"))]
    macro_rules! dst_space {
        () => {
            "shared::cta"
        };
    }
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!(
            concat!("cp.async.bulk.tensor.2d.", dst_space!(), ".global.tile.mbarrier::complete_tx::bytes [{d}], [{m}, {{{c0}, {c1}}}], [{b}];"),
            d = in(reg32) dst.0, m = in(reg64) tmap, c0 = in(reg32) c0, c1 = in(reg32) c1,
            b = in(reg32) bar.0, options(nostack),
        )
    }
}

/// Generic address of the first by-value parameter of the kernel named by
/// the string literal `$kernel` (`<kernel>_param_0` in the PTX, the name
/// LLVM gives it): `mov.b64` of the parameter symbol, then
/// `cvta.param.u64`. This is how a `CUtensorMap` passed by value (CUDA's
/// `__grid_constant__`) is handed to `cp.async.bulk.tensor`, whose
/// `tensorMap` operand is a generic address into the parameter space.
/// Use it only inside the kernel it names; the result is read-only memory.
#[cfg(any(kernels_arch = "sm_100f", kernels_arch = "sm_90a"))]
macro_rules! param0_generic_addr {
    ($kernel:expr) => {{
        let r: u64;
        // SAFETY: takes the address of this kernel's own parameter; no
        // memory is accessed.
        unsafe {
            core::arch::asm!(
                concat!("mov.b64 {r}, ", $kernel, "_param_0;\n\tcvta.param.u64 {r}, {r};"),
                r = out(reg64) r,
                options(pure, nomem, nostack),
            )
        };
        r
    }};
}
#[cfg(any(kernels_arch = "sm_100f", kernels_arch = "sm_90a"))]
pub(crate) use param0_generic_addr;
