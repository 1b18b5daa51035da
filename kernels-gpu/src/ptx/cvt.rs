//! Conversions between f32 and bf16.

use core::arch::asm;

/// Packs two f32 into a bf16x2 word (round to nearest even): `lo` in bits
/// 0..16, `hi` in bits 16..32. One `cvt.rn.bf16x2.f32`.
#[inline(always)]
pub fn pack_bf16x2(lo: f32, hi: f32) -> u32 {
    let r: u32;
    // SAFETY: a register-to-register conversion, defined for every input.
    unsafe {
        asm!(
            "cvt.rn.bf16x2.f32 {r}, {hi}, {lo};",
            r = out(reg32) r,
            hi = in(reg32) hi,
            lo = in(reg32) lo,
            options(pure, nomem, nostack),
        )
    }
    r
}

/// bf16 bits to f32 (exact).
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 to i32, rounded to the nearest integer, ties to even
/// (`cvt.rni.s32.f32`; out-of-range values saturate, NaN gives 0).
#[inline(always)]
pub fn f32_to_s32_rni(x: f32) -> i32 {
    let r: i32;
    // SAFETY: a register-to-register conversion, defined for every input.
    unsafe {
        asm!("cvt.rni.s32.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x,
             options(pure, nomem, nostack))
    }
    r
}

/// f64 to u64, rounded up to an integer (`cvt.rpi.u64.f64`; out-of-range
/// values saturate, NaN gives 0).
#[inline(always)]
pub fn f64_to_u64_rpi(x: f64) -> u64 {
    let r: u64;
    // SAFETY: a register-to-register conversion, defined for every input.
    unsafe {
        asm!("cvt.rpi.u64.f64 {r}, {x};", r = out(reg64) r, x = in(reg64) x,
             options(pure, nomem, nostack))
    }
    r
}
