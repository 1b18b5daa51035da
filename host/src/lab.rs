//! The instruments' host side (feature `lab`, off by default): what the
//! repository's benchmark and bring-up tools use and a plan never does.
//! Not part of the library's API; it may change with any commit.
//!
//! - [`load_module`]: the lab kernel module of the context's GPU (the
//!   benchmark's ceilings, the toolchain smoke kernel, the Blackwell
//!   bring-up kernels; `kernels_gpu::registry::Home::Lab`), loaded apart
//!   from the product module the plans share;
//! - [`product_module`]: that product module, for instruments that live in
//!   its watchdog builds (the watchdog's self-test);
//! - [`row_gather_map`]: the TMA map of the benchmark's ring-gather
//!   ceiling;
//! - [`bringup`]: the Blackwell bring-up checks (compiled, not executed);
//! - [`watchdog`]: the record a watchdog build leaves when a bounded wait
//!   gives up.

pub mod bringup;

use crate::error::{Error, Result};
use crate::gpu::PtxModule;
use cudarc::driver::{CudaContext, CudaModule};
use std::sync::Arc;

/// The watchdog builds' host side (`INDEXER_PTX_DIR` pointing at the GPU
/// bundle's `ptx-watchdog/`): the limit, whether a loaded module was armed,
/// and the record of the wait that gave up.
pub mod watchdog {
    pub use crate::watchdog::{
        is_armed, is_watchdog_build, last_record, limit_ns, DEFAULT_LIMIT_MS, LIMIT_ENV,
    };
}

/// Loads the lab module for the context's GPU: machine code on compute
/// capability 9.0 (`lab_sm_90a`), the sm_100f PTX (JIT-compiled by the
/// driver) on 10.0 and 10.3; [`Error::BackendUnavailable`] elsewhere (the
/// portable target has no instruments). Each call loads a new module,
/// unloaded when the last handle drops.
pub fn load_module(ctx: &Arc<CudaContext>) -> Result<Arc<CudaModule>> {
    let (major, minor) = ctx.compute_capability()?;
    let image = match PtxModule::for_capability(major, minor)? {
        PtxModule::Sm90a => cudarc::nvrtc::Ptx::from_binary(kernels_gpu::SASS_LAB_SM90A.to_vec()),
        PtxModule::Sm100f => cudarc::nvrtc::Ptx::from_src(kernels_gpu::PTX_LAB_SM100F),
        PtxModule::Portable => {
            return Err(Error::BackendUnavailable {
                backend: "lab",
                reason: "the lab module is built for sm_90a and sm_100f only",
                major,
                minor,
            })
        }
    };
    Ok(ctx.load_module(image)?)
}

/// The product module matching the context's GPU
/// ([`PtxModule::for_capability`]): the one the context's plans share
/// (loaded now when none holds it; the `INDEXER_PTX_DIR` override
/// included, which is how watchdog builds are loaded).
pub fn product_module(ctx: &Arc<CudaContext>) -> Result<Arc<CudaModule>> {
    let (major, minor) = ctx.compute_capability()?;
    let which = PtxModule::for_capability(major, minor)?;
    Ok(crate::modules::get(ctx, which)?.module())
}

/// The TMA map (`CUtensorMap` words) over `rows` bf16 rows of `dim`
/// elements at device address `base`, one 64-column row half per box
/// (128-byte swizzle): what the benchmark's ring-gather ceiling
/// (`kernels_gpu::registry::CEIL_GATHER_STREAM`) reads its rows through.
pub fn row_gather_map(base: u64, rows: u64, dim: u32) -> Result<[u64; 16]> {
    let m = kernels_gpu::tma::gather_map(rows, dim, 64).map_err(|_| Error::Shape {
        name: "head_dim",
        value: dim as usize,
        expected: "a TMA-encodable bf16 row (D * 2 a multiple of 16)",
    })?;
    Ok(crate::tma::encode(base, &crate::tma::TiledArgs::of(&m))?.0)
}
