//! The `mma.sync` row-kernel path: a memset of the f32 dK accumulator,
//! then one CTA per query row running stage 1 and stage 2 fused (the
//! kernel of the shape's H x D, `grad_kernel_name`), as ordinary launches.
//!
//! Chosen ([`crate::select::PathKind::Rows`]) wherever the other two paths
//! are not: every shape on GPUs other than 9.0 (unless `Backend::Blackwell`
//! is forced on 10.0 / 10.3), and on 9.0 every shape outside the wgmma
//! kernels (H != 64, D != 128, or topk <= 64). Every PTX module holds these
//! kernels, so this is the path of any GPU of compute capability 9.0 or
//! newer.

use super::common::Run;
use crate::error::Result;
use crate::gpu;
use crate::modules::Loaded;
use crate::select::check_shared_memory;
use crate::shape::Shape;
use cudarc::driver::{sys, CudaContext, CudaFunction};
use kernels_gpu::abi::GradParams;
use kernels_gpu::portable::rows::{RowSmem, GRAD_THREADS};
use std::sync::Arc;

/// The loaded row kernel of a plan and its launch shape.
pub(crate) struct RowKernel {
    f: CudaFunction,
    /// One CTA per query row.
    grid: u32,
    /// Dynamic shared memory per CTA (limit raised in `new`).
    smem_bytes: u32,
}

impl RowKernel {
    /// Loads `kernel` (the row kernel of `shape`) on a GPU of compute
    /// capability `cc` and raises its shared-memory limit; fails with
    /// [`crate::Error::SharedMemory`] where the GPU offers a block less
    /// than the kernel needs.
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        module: &Loaded,
        kernel: &'static str,
        shape: &Shape,
        cc: (i32, i32),
    ) -> Result<RowKernel> {
        let smem = RowSmem::new(shape.heads as u32, shape.head_dim as u32);
        // GPUs with less shared memory per block than Hopper (12.x:
        // 99 KiB) cannot run the largest row kernels; say so here rather
        // than let the driver refuse the launch.
        let available = ctx.attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )?;
        check_shared_memory(kernel, smem.bytes, available, cc)?;
        let f = module.kernel_with_smem(kernel, smem.bytes)?;
        Ok(RowKernel {
            f,
            grid: shape.rows() as u32,
            smem_bytes: smem.bytes,
        })
    }

    /// Zeroes the accumulator (`zeroed` mark), then runs the row kernel
    /// (`gradients` mark).
    ///
    /// # Safety
    /// `run.params` passed `args::check` for this plan's shape.
    pub(crate) unsafe fn launch(&self, run: &Run<'_>) -> Result<()> {
        let p = &run.params;
        // SAFETY: `p.dk_accum` is the checked f32 accumulator of
        // `k_len` elements; the row kernel's contract is one CTA of
        // GRAD_THREADS per query row with `smem_bytes` (limit raised in
        // `new`); ordinary launches, so it sees the memset.
        unsafe {
            gpu::memset_zero(run.stream, p.dk_accum, run.shape.k_len() * 4)?;
            run.mark(|e| &e.zeroed)?;
            gpu::launch::<GradParams>(
                run.stream,
                &self.f,
                self.grid,
                GRAD_THREADS,
                self.smem_bytes,
                p,
            )?;
        }
        run.mark(|e| &e.gradients)
    }
}
