//! The only place with raw `asm!`: one `#[inline(always)]` wrapper per PTX
//! instruction family, typed operands, and a `# Safety` section on every
//! `unsafe fn` saying what the caller must guarantee.
//!
//! Kernels call these wrappers and never write PTX themselves.

pub mod arith;
pub mod bulk;
pub mod cp_async;
pub mod cvt;
pub mod global;
pub mod griddep;
pub mod ldmatrix;
pub mod mbarrier;
pub mod mma;
pub mod smem;
pub mod sreg;
pub mod sync;
pub mod tcgen05;
pub mod tma;
pub mod wgmma;
