//! Dynamic shared memory: the `smem` symbol and typed 32-bit addresses.
//!
//! TMA, mbarrier, ldmatrix and tensor-core instructions take 32-bit
//! shared-window addresses, so shared memory is addressed by [`SmemAddr`]
//! and accessed through `ld.shared`/`st.shared` wrappers.

use core::arch::{asm, global_asm};

// The kernels' dynamic shared memory; its size is set at launch.
global_asm!(".extern .shared .align 1024 .b8 smem[];");

/// A byte address in the CTA's shared-memory window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub struct SmemAddr(pub u32);

impl SmemAddr {
    /// This address plus `bytes`.
    #[inline(always)]
    pub const fn add(self, bytes: u32) -> SmemAddr {
        SmemAddr(self.0 + bytes)
    }
}

/// Address of the start of dynamic shared memory (1024-byte aligned).
#[inline(always)]
pub fn base() -> SmemAddr {
    let r: u32;
    // SAFETY: takes the address of a symbol; no memory is touched.
    unsafe { asm!("mov.u32 {r}, smem;", r = out(reg32) r, options(pure, nomem, nostack)) }
    SmemAddr(r)
}

/// `ld.shared.b32`.
///
/// # Safety
/// `a` must be 4-byte aligned and inside the launch's dynamic shared memory.
#[inline(always)]
pub unsafe fn ld_u32(a: SmemAddr) -> u32 {
    let r: u32;
    // SAFETY: the caller guarantees an aligned in-bounds address.
    unsafe {
        asm!("ld.shared.b32 {r}, [{a}];", r = out(reg32) r, a = in(reg32) a.0,
             options(pure, readonly, nostack))
    }
    r
}

/// `ld.shared.f32`.
///
/// # Safety
/// As [`ld_u32`].
#[inline(always)]
pub unsafe fn ld_f32(a: SmemAddr) -> f32 {
    // SAFETY: forwarded.
    f32::from_bits(unsafe { ld_u32(a) })
}

/// `st.shared.b32`.
///
/// # Safety
/// `a` must be 4-byte aligned and inside the launch's dynamic shared memory,
/// and no other thread may access the word concurrently.
#[inline(always)]
pub unsafe fn st_u32(a: SmemAddr, v: u32) {
    // SAFETY: the caller guarantees an aligned in-bounds, unshared address.
    unsafe {
        asm!("st.shared.b32 [{a}], {v};", a = in(reg32) a.0, v = in(reg32) v, options(nostack))
    }
}

/// `atom.shared.cas.b32`: writes `new` where the word holds `cmp`;
/// returns the word as it was.
///
/// # Safety
/// `a` must be 4-byte aligned and inside the launch's dynamic shared memory.
#[inline(always)]
pub unsafe fn atom_cas_u32(a: SmemAddr, cmp: u32, new: u32) -> u32 {
    let r: u32;
    // SAFETY: the caller guarantees an aligned in-bounds address; the
    // atomic makes concurrent access defined.
    unsafe {
        asm!("atom.shared.cas.b32 {r}, [{a}], {c}, {n};", r = out(reg32) r, a = in(reg32) a.0,
             c = in(reg32) cmp, n = in(reg32) new, options(nostack))
    }
    r
}

/// `red.shared.min.u32`: the word becomes the smaller of itself and `v`.
///
/// # Safety
/// As [`atom_cas_u32`].
#[inline(always)]
pub unsafe fn red_min_u32(a: SmemAddr, v: u32) {
    // SAFETY: as `atom_cas_u32`.
    unsafe {
        asm!("red.shared.min.u32 [{a}], {v};", a = in(reg32) a.0, v = in(reg32) v,
             options(nostack))
    }
}

/// `red.shared.add.u32`: the word becomes itself plus `v` (mod 2^32).
///
/// # Safety
/// As [`atom_cas_u32`].
#[inline(always)]
pub unsafe fn red_add_u32(a: SmemAddr, v: u32) {
    // SAFETY: as `atom_cas_u32`.
    unsafe {
        asm!("red.shared.add.u32 [{a}], {v};", a = in(reg32) a.0, v = in(reg32) v,
             options(nostack))
    }
}

/// `st.shared.v4.b32`: 16 bytes.
///
/// # Safety
/// `a` must be 16-byte aligned and inside the launch's dynamic shared
/// memory, and no other thread may access those bytes concurrently.
#[inline(always)]
pub unsafe fn st_v4_u32(a: SmemAddr, v: [u32; 4]) {
    // SAFETY: the caller guarantees an aligned in-bounds, unshared address.
    unsafe {
        asm!("st.shared.v4.b32 [{a}], {{{x}, {y}, {z}, {w}}};", a = in(reg32) a.0,
             x = in(reg32) v[0], y = in(reg32) v[1], z = in(reg32) v[2], w = in(reg32) v[3],
             options(nostack))
    }
}

/// `st.shared.f32`.
///
/// # Safety
/// As [`st_u32`].
#[inline(always)]
pub unsafe fn st_f32(a: SmemAddr, v: f32) {
    // SAFETY: forwarded.
    unsafe { st_u32(a, v.to_bits()) }
}

/// `st.shared.v2.f32`: 8 bytes.
///
/// # Safety
/// `a` must be 8-byte aligned and inside the launch's dynamic shared memory,
/// and no other thread may access those bytes concurrently.
#[inline(always)]
pub unsafe fn st_v2_f32(a: SmemAddr, x: f32, y: f32) {
    // SAFETY: the caller guarantees an aligned in-bounds, unshared address.
    unsafe {
        asm!("st.shared.v2.f32 [{a}], {{{x}, {y}}};", a = in(reg32) a.0, x = in(reg32) x, y = in(reg32) y,
             options(nostack))
    }
}

/// `ld.shared.v4.f32`: 16 bytes.
///
/// # Safety
/// `a` must be 16-byte aligned and inside the launch's dynamic shared memory.
#[inline(always)]
pub unsafe fn ld_v4_f32(a: SmemAddr) -> [f32; 4] {
    let (x, y, z, w): (f32, f32, f32, f32);
    // SAFETY: the caller guarantees an aligned in-bounds address.
    unsafe {
        asm!("ld.shared.v4.f32 {{{x}, {y}, {z}, {w}}}, [{a}];",
             x = out(reg32) x, y = out(reg32) y, z = out(reg32) z, w = out(reg32) w,
             a = in(reg32) a.0, options(pure, readonly, nostack))
    }
    [x, y, z, w]
}

/// `ld.shared.v2.b32`: 8 bytes as two words (lower address first).
///
/// # Safety
/// `a` must be 8-byte aligned and inside the launch's dynamic shared memory.
#[inline(always)]
pub unsafe fn ld_v2_u32(a: SmemAddr) -> [u32; 2] {
    let (x, y): (u32, u32);
    // SAFETY: the caller guarantees an aligned in-bounds address.
    unsafe {
        asm!("ld.shared.v2.b32 {{{x}, {y}}}, [{a}];", x = out(reg32) x, y = out(reg32) y,
             a = in(reg32) a.0, options(pure, readonly, nostack))
    }
    [x, y]
}

/// `ld.shared.v2.f32`: 8 bytes.
///
/// # Safety
/// `a` must be 8-byte aligned and inside the launch's dynamic shared memory.
#[inline(always)]
pub unsafe fn ld_v2_f32(a: SmemAddr) -> [f32; 2] {
    let (x, y): (f32, f32);
    // SAFETY: the caller guarantees an aligned in-bounds address.
    unsafe {
        asm!("ld.shared.v2.f32 {{{x}, {y}}}, [{a}];", x = out(reg32) x, y = out(reg32) y,
             a = in(reg32) a.0, options(pure, readonly, nostack))
    }
    [x, y]
}
