//! The Blackwell (sm_100 family) path: stage 1 (grad_signal, zeroing of
//! the f32 dK accumulator), then the persistent tcgen05 stage-2 kernel as
//! its programmatic dependent, with K rows gathered and q tiles loaded by
//! TMA through two tensor maps encoded per call (their geometry is here
//! too, shared with the bring-up probes).
//!
//! Chosen ([`crate::select::PathKind::Sm100`]) only on compute capability
//! 10.0 / 10.3 (`sm_100f` module) for the shapes the stage-2
//! specializations take (`crate::select::blackwell_shape_gap`), and only
//! when `Backend::Blackwell` is forced or the capability is listed in
//! [`crate::TCGEN05_VALIDATED`] (none today). **Compiled and assembled for
//! sm_100f, not executed** (no such GPU has been available); the
//! tensor-map geometry is unit-tested here, the choice in `select.rs`.

use super::common::{launch_stage1, Run};
use crate::error::{Error, Result};
use crate::gpu;
use crate::modules::Loaded;
use crate::shape::Shape;
use crate::tma::{encode, TiledArgs};
use cudarc::driver::{sys, CudaContext, CudaFunction};
use kernels_gpu::abi::{Sm100Params, SM100_STAGE2_THREADS};
use kernels_gpu::registry::STAGE1;
use kernels_gpu::sched;
use kernels_gpu::sm100::budget::SM100_SMEM;
use kernels_gpu::tma::{gather_map, q_tile_map};
use std::sync::Arc;

/// Columns of one TMA box row (the 128-byte swizzle span of bf16).
const BOX_INNER: u32 = 64;

/// Geometry of the two maps of a plan: `(k gather map, q tile map)`.
pub fn map_args(shape: &Shape) -> Result<(TiledArgs, TiledArgs)> {
    let bad = |_| Error::Shape {
        name: "tensor map",
        value: shape.head_dim,
        expected: "a TMA-encodable bf16 row (D * 2 a multiple of 16)",
    };
    let k = gather_map(
        (shape.batch * shape.seq_k) as u64,
        shape.head_dim as u32,
        BOX_INNER,
    )
    .map_err(bad)?;
    let q = q_tile_map(
        (shape.rows() * shape.heads) as u64,
        shape.head_dim as u32,
        BOX_INNER,
        shape.heads as u32,
    )
    .map_err(bad)?;
    Ok((TiledArgs::of(&k), TiledArgs::of(&q)))
}

/// The loaded and configured tcgen05 kernels of one plan.
pub(crate) struct Sm100Kernels {
    stage1: CudaFunction,
    stage2: CudaFunction,
    sms: u32,
    maps: (TiledArgs, TiledArgs),
}

impl Sm100Kernels {
    /// Loads stage 1 and the stage-2 specialization `stage2` for `shape`
    /// (which [`crate::select_backend`] accepted) and raises stage 2's
    /// shared memory.
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        module: &Loaded,
        shape: &Shape,
        stage2: &'static str,
    ) -> Result<Self> {
        let stage2 = module.kernel_with_smem(stage2, SM100_SMEM)?;
        let stage1 = module.kernel(STAGE1.name)?;
        let sms =
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        Ok(Sm100Kernels {
            stage1,
            stage2,
            sms: sms.max(1) as u32,
            maps: map_args(shape)?,
        })
    }

    /// Encodes the two tensor maps over the call's `index_k` and
    /// `index_q`, then launches stage 1 and stage 2 as its programmatic
    /// dependent. Zeroing is fused into stage 1, so the `zeroed` mark
    /// directly follows `start`; `gradients` follows stage 2.
    ///
    /// # Safety
    /// `run.params` passed `args::check` for this plan's shape (pointers,
    /// lengths, 16-byte alignment of `index_q`, `index_k` and `dk_accum`).
    pub(crate) unsafe fn launch(&self, run: &Run<'_>) -> Result<()> {
        run.mark(|e| &e.zeroed)?;
        let p = &run.params;
        let params = Sm100Params {
            k_map: encode(p.index_k, &self.maps.0)?,
            q_map: encode(p.index_q, &self.maps.1)?,
            p: *p,
        };
        let grid2 = sched::persistent_grid(run.shape.rows() as u32, self.sms, 1).max(1);
        // SAFETY: forwarded from the caller; stage 1's contract is kept by
        // `launch_stage1`; stage 2: one persistent CTA per SM at most,
        // SM100_STAGE2_THREADS threads, SM100_SMEM bytes (limit raised in
        // `new`), a dependent of stage 1 that waits with
        // griddepcontrol.wait before touching its outputs.
        unsafe {
            launch_stage1(run.stream, &self.stage1, run.shape, p)?;
            gpu::launch_pdl(
                run.stream,
                &self.stage2,
                grid2,
                SM100_STAGE2_THREADS,
                SM100_SMEM,
                &params,
            )?;
        }
        run.mark(|e| &e.gradients)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels_gpu::sm100::budget::{SMEM_K_STAGE, SMEM_Q_REGION};

    fn shape(heads: usize, head_dim: usize, topk: usize) -> Shape {
        Shape {
            batch: 2,
            seq_q: 100,
            seq_k: 300,
            heads,
            head_dim,
            topk,
        }
    }

    #[test]
    fn tensor_map_geometry_matches_the_kernel() {
        for heads in [32usize, 64] {
            let s = shape(heads, 128, 128);
            let (k, q) = map_args(&s).unwrap();
            assert_eq!(k.dims, [128, 600], "(B*S_k, D) view, innermost first");
            assert_eq!(k.strides, [256]);
            assert_eq!(k.box_dims, [64, 1], "gather4: boxes of one row");
            // 32 gather4 of 4 rows x 2 halves fill one K stage, which is
            // what FULL[s] expects.
            assert_eq!(2 * 32 * 4 * k.box_bytes(), SMEM_K_STAGE);
            assert_eq!(q.dims, [128, (200 * heads) as u64]);
            assert_eq!(q.box_dims, [64, heads as u32]);
            // Two boxes per row (the kernel's Q_FULL tx count 2 * H * 128),
            // each inside one 64-row q region.
            assert_eq!(2 * q.box_bytes(), 2 * heads as u32 * 128);
            assert!(q.box_bytes() <= SMEM_Q_REGION);
            // TMA limits: 16-byte strides, inner box within the swizzle span.
            assert_eq!(k.strides[0] % 16, 0);
            assert!(k.box_dims[0] * 2 <= 128 && q.box_dims[1] <= 256);
        }
    }
}
