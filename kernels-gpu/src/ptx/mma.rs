//! Warp-level tensor-core MMA (`mma.sync`, sm_80 and later).
//!
//! Fragment layout of m16n8k16 (lane `l`, `g = l / 4`, `c = 2 * (l % 4)`):
//! - A (16x16, row-major), four bf16x2 words: `a0 = A[g][c..c+2]`,
//!   `a1 = A[g+8][c..c+2]`, `a2 = A[g][c+8..c+10]`, `a3 = A[g+8][c+8..c+10]`;
//! - B (16x8, "col"): `b0 = B[c..c+2][g]`, `b1 = B[c+8..c+10][g]`
//!   (two consecutive K rows of column g, lower K in the low half);
//! - C/D (16x8 f32): `d0, d1 = D[g][c], D[g][c+1]`, `d2, d3 = D[g+8][c], D[g+8][c+1]`.

use core::arch::asm;

/// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`: `d += a * b`.
///
/// # Safety
/// All 32 lanes of the warp must execute it together (`.aligned`).
#[inline(always)]
pub unsafe fn mma_bf16_16816(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
    // SAFETY: full-warp convergence is guaranteed by the caller; the
    // instruction touches registers only.
    unsafe {
        asm!(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{d0}, {d1}, {d2}, {d3}}};",
            d0 = inout(reg32) d[0], d1 = inout(reg32) d[1], d2 = inout(reg32) d[2], d3 = inout(reg32) d[3],
            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
            b0 = in(reg32) b[0], b1 = in(reg32) b[1],
            // Not `pure`: a warp-collective instruction must stay where the
            // whole warp executes it; a pure asm may be sunk into a branch
            // that only some lanes take (e.g. next to a per-lane store).
            options(nomem, nostack),
        )
    }
}
