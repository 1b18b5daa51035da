//! Blackwell (sm_100a) building blocks. **Compiled and assembled for
//! sm_100a, not executed** (no such GPU has been available).
//!
//! Everything here that can be checked without the GPU is plain Rust that
//! also builds for the host and is unit-tested there: descriptor encodings
//! ([`desc`]), tensor-memory and shared-memory budgets ([`budget`]), the
//! persistent scheduler's arithmetic ([`sched`]), TMA gather4 row
//! coordinates ([`gather`]) and tensor-map geometry and swizzled tile
//! offsets ([`tmap`]). The device-only smoke kernel in `smoke`
//! exercises the tcgen05 wrappers of `crate::ptx::tcgen05` so that ptxas
//! checks them in every CI run.

pub mod budget;
pub mod desc;
pub mod gather;
pub mod operands;
pub mod sched;
pub mod tmap;
pub mod tmem;

#[cfg(all(target_arch = "nvptx64", kernels_arch = "sm_100a"))]
mod compute;
#[cfg(all(target_arch = "nvptx64", kernels_arch = "sm_100a"))]
mod load;
#[cfg(all(target_arch = "nvptx64", kernels_arch = "sm_100a"))]
mod mma;
#[cfg(all(target_arch = "nvptx64", kernels_arch = "sm_100a"))]
mod reduce;
#[cfg(all(target_arch = "nvptx64", kernels_arch = "sm_100a"))]
mod smoke;
#[cfg(all(target_arch = "nvptx64", kernels_arch = "sm_100a"))]
mod stage1;
#[cfg(all(target_arch = "nvptx64", kernels_arch = "sm_100a"))]
mod stage2;
