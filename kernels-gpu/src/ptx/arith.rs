//! Floating-point arithmetic the compiler would not otherwise emit.

use core::arch::asm;

/// `a * b + c` rounded once (`fma.rn.f32`). Rust does not contract a
/// multiply and an add into one instruction by itself.
#[inline(always)]
pub fn fma_rn(a: f32, b: f32, c: f32) -> f32 {
    let d: f32;
    // SAFETY: register arithmetic, defined for every input.
    unsafe {
        asm!(
            "fma.rn.f32 {d}, {a}, {b}, {c};",
            d = out(reg32) d,
            a = in(reg32) a,
            b = in(reg32) b,
            c = in(reg32) c,
            options(pure, nomem, nostack),
        )
    }
    d
}

/// `2^x` by the special-function unit (`ex2.approx.ftz.f32`): relative
/// error about 2^-22, subnormal inputs and results flushed to zero, `-inf`
/// gives `+0`, NaN gives NaN.
#[inline(always)]
pub fn ex2_approx_ftz(x: f32) -> f32 {
    let d: f32;
    // SAFETY: register arithmetic, defined for every input.
    unsafe {
        asm!(
            "ex2.approx.ftz.f32 {d}, {x};",
            d = out(reg32) d,
            x = in(reg32) x,
            options(pure, nomem, nostack),
        )
    }
    d
}
