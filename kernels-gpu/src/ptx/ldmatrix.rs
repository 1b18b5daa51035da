//! `ldmatrix` (sm_75+): warp-collective loads of 8x8 b16 matrices from
//! shared memory straight into `mma.sync` fragment registers.
//!
//! Lanes 8i..8i+7 give the 16-byte-aligned row addresses of matrix i. Plain:
//! register i of lane l holds matrix i's elements (row l/4, cols 2(l%4),
//! 2(l%4)+1). `.trans`: (rows 2(l%4), 2(l%4)+1, col l/4), i.e. the
//! transposed pair, which is the "col" operand layout of `mma.sync`.
//!
//! Not `pure`: a warp collective must not be moved into a lane-dependent branch.

use super::smem::SmemAddr;
use core::arch::asm;

macro_rules! ldmatrix {
    ($(#[$doc:meta])* $name:ident, $instr:literal, 4) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// All 32 lanes execute it; each lane's address is a 16-byte aligned
        /// row inside the launch's dynamic shared memory.
        #[inline(always)]
        pub unsafe fn $name(row: SmemAddr) -> [u32; 4] {
            let (a, b, c, d): (u32, u32, u32, u32);
            // SAFETY: forwarded from the caller.
            unsafe {
                asm!(concat!($instr, " {{{a}, {b}, {c}, {d}}}, [{p}];"),
                     a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
                     p = in(reg32) row.0, options(readonly, nostack))
            }
            [a, b, c, d]
        }
    };
    ($(#[$doc:meta])* $name:ident, $instr:literal, 2) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// All 32 lanes execute it; lanes 0..16 give 16-byte aligned row
        /// addresses inside the launch's dynamic shared memory (the others
        /// must still be valid shared addresses).
        #[inline(always)]
        pub unsafe fn $name(row: SmemAddr) -> [u32; 2] {
            let (a, b): (u32, u32);
            // SAFETY: forwarded from the caller.
            unsafe {
                asm!(concat!($instr, " {{{a}, {b}}}, [{p}];"),
                     a = out(reg32) a, b = out(reg32) b, p = in(reg32) row.0, options(readonly, nostack))
            }
            [a, b]
        }
    };
}

ldmatrix!(
    /// `ldmatrix.sync.aligned.m8n8.x4.shared.b16`: four 8x8 matrices.
    x4, "ldmatrix.sync.aligned.m8n8.x4.shared.b16", 4
);
ldmatrix!(
    /// `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16`: four transposed 8x8 matrices.
    x4_trans, "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16", 4
);
ldmatrix!(
    /// `ldmatrix.sync.aligned.m8n8.x2.shared.b16`: two 8x8 matrices.
    x2, "ldmatrix.sync.aligned.m8n8.x2.shared.b16", 2
);
ldmatrix!(
    /// `ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16`: two transposed 8x8 matrices.
    x2_trans, "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16", 2
);
