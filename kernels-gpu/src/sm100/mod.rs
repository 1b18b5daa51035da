//! Blackwell (sm_100f) path. **Compiled and assembled for sm_100f, not
//! executed** (no such GPU has been available).
//!
//! Device kernels (sm_100f builds only; stage 1 is the shared
//! `crate::portable::stage1` kernel, launched first): `stage2` (persistent,
//! warp-specialized tcgen05 kernel), whose roles live one per module, each
//! given the kernel's context (`ctx`): `load` (TMA gather4 of K rows), `mma`
//! (the single issuing thread), `compute` (gate, dS, d_weights, dQ
//! epilogue), `reduce` (dK through shared memory into bulk reductions),
//! each running its loop from [`proto`] on `dev` (the device implementation
//! of its operations); plus the `smoke` kernel and the bring-up `probe`
//! kernels (one stage-2 GEMM each, compared against the CPU by
//! `dsa_indexer_bwd::lab::bringup`).
//!
//! Everything that can be checked without the GPU is plain Rust that also
//! builds for the host and is unit-tested there: descriptor encodings and
//! the canonical-layout address model ([`desc`]), the operand layouts and
//! per-step descriptors of the three GEMMs ([`operands`]), tensor-memory
//! lane mapping ([`tmem`]), tensor-memory and shared-memory budgets
//! ([`budget`]), chunks per row and barrier parities ([`sched`]; the
//! persistent scheduler is the shared `crate::sched`),
//! TMA gather4 row coordinates ([`gather`]; the tensor-map geometry is the
//! crate's, [`crate::tma`]); and the stage-2 barrier protocol ([`proto`]), which a test
//! model-checks (`model`) over every interleaving of small cases.

pub mod budget;
pub mod desc;
#[cfg(test)]
mod emulate;
pub mod gather;
#[cfg(test)]
mod model;
pub mod operands;
pub mod proto;
pub mod sched;
pub mod tmem;

#[cfg(all(target_arch = "nvptx64", kernels_arch = "sm_100f"))]
mod compute;
#[cfg(all(target_arch = "nvptx64", kernels_arch = "sm_100f"))]
mod ctx;
#[cfg(all(target_arch = "nvptx64", kernels_arch = "sm_100f"))]
mod dev;
#[cfg(all(target_arch = "nvptx64", kernels_arch = "sm_100f"))]
mod load;
#[cfg(all(target_arch = "nvptx64", kernels_arch = "sm_100f"))]
mod mma;
// The bring-up kernels are instruments (`crate::lab`): lab builds only.
#[cfg(all(target_arch = "nvptx64", kernels_arch = "sm_100f", kernels_lab))]
mod probe;
#[cfg(all(target_arch = "nvptx64", kernels_arch = "sm_100f"))]
mod reduce;
#[cfg(all(target_arch = "nvptx64", kernels_arch = "sm_100f", kernels_lab))]
mod smoke;
#[cfg(all(target_arch = "nvptx64", kernels_arch = "sm_100f", not(kernels_lab)))]
mod stage2;
