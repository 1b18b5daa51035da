//! The names the host has always imported, in one place: the kernel/host
//! contract ([`crate::abi`]), the kernel names and specializations of
//! [`crate::registry`], and the probes' shared-memory size
//! ([`crate::sm100::budget::SM100_PROBE_SMEM`]). Nothing in this crate uses
//! it; new code imports from those modules.

pub use crate::abi::*;
pub use crate::registry::{
    grad_kernel_name, sm100_stage2_kernel_name, CAST_KERNEL, CEIL_COPY, CEIL_GATHER,
    CEIL_GATHER_REDUCE, CEIL_MMA, CEIL_SCATTER_BULK, CEIL_SCATTER_RED, SM100_HEADS, SM100_PROBE_DK,
    SM100_PROBE_DQ, SM100_PROBE_S, SM100_SMOKE_KERNEL, SM100_TOPKS, SMOKE_KERNEL, STAGE1_KERNEL,
    SUPPORTED_DIMS, SUPPORTED_HEADS, WATCHDOG_PROBE_KERNEL,
};
pub use crate::sm100::budget::SM100_PROBE_SMEM;
