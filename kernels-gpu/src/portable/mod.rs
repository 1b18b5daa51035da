//! The kernels every target builds (the portable `sm_90` PTX, sm_90a and
//! sm_100f), one module each:
//! - `stage1`: stage 1 of the two-launch backward paths (Hopper's wgmma
//!   kernels, Blackwell's tcgen05 kernel);
//! - [`rows`]: the `mma.sync` row kernels, both stages fused, for every
//!   GPU without a faster path;
//! - `cast`: the f32 dK accumulator into a bf16 `d_index_k`;
//! - [`forward`]: the forward's sizes and the portable forward kernel.

#[cfg(all(target_arch = "nvptx64", not(kernels_lab)))]
mod cast;
pub mod forward;
pub mod rows;
#[cfg(all(target_arch = "nvptx64", not(kernels_lab)))]
mod stage1;
