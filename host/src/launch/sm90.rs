//! The Hopper fast path: stage 1 (grad_signal, zeroing of the f32 dK
//! accumulator, per-row chunk counts), then the persistent warpgroup-MMA
//! (wgmma) kernels as its programmatic dependents, so their prologue
//! overlaps stage 1's tail.
//!
//! Chosen ([`crate::select::PathKind::Sm90`]) on compute capability 9.0,
//! whose `sm_90a` module alone holds these kernels, for H = 64 with D = 128
//! or 64, and H = 128, 32 or 16 with D = 128 (`kernels_gpu::sm90::wg_row`:
//! each its own kernel, layout, launch shape and stage 1) and more than
//! one 64-slot chunk per row (`kernels_gpu::sm90::supports`), under
//! `Backend::Auto` or `Backend::Hopper`. With H = 64, D = 128 and an even
//! number of rows the paired kernel (`registry::SM90_WG_PAIR`, two rows that
//! share keys per CTA) is launched too, between stage 1 and the row
//! kernel: a test on the ids inside both picks the one that computes, the
//! other exits at once (`FLAG_PAIR_DISPATCH`).

use super::common::{launch_stage1, Run};
use crate::error::Result;
use crate::gpu;
use crate::modules::Loaded;
use crate::shape::Shape;
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaStream};
use kernels_gpu::abi::{GradParams, FLAG_PAIR_DISPATCH};
use kernels_gpu::sm90;
use std::sync::Arc;

/// Whether stage 1 counts each row's live chunks (over its `d_weights`
/// block, `abi::row_chunks_at`) so that the wgmma kernel skips the rest:
/// from `sm90::SKIP_MIN_TOPK` slots per row on (every H of the path has
/// at least `abi::ROW_CHUNK_MIN_HEADS` d_weights elements per row).
pub(crate) fn row_chunks(shape: &Shape) -> bool {
    shape.topk >= sm90::SKIP_MIN_TOPK as usize
        && shape.heads >= kernels_gpu::abi::ROW_CHUNK_MIN_HEADS as usize
}

/// The loaded kernels of the fast path and their grids.
pub(crate) struct Wgmma {
    stage1: CudaFunction,
    /// The persistent wgmma kernel of the shape (`sm90::WgRow::kernel`).
    row: CudaFunction,
    /// Its threads per CTA (`sm90::WgRow::threads`).
    row_threads: u32,
    /// Its dynamic shared memory (`sm90::WgRow::bytes`).
    row_smem: u32,
    /// CTAs of `row` (`sm90::WgRow::grid`).
    grid: u32,
    /// The paired kernel and its grid, with an even number of rows.
    pair: Option<(CudaFunction, u32)>,
}

impl Wgmma {
    /// Loads stage 1 and the wgmma row kernel of `wg` (the shape's head
    /// dimension) and, when `paired` (D = 128 only), the paired
    /// kernel, sizes their persistent grids to the GPU's SMs, and raises
    /// their shared-memory limits.
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        module: &Loaded,
        shape: &Shape,
        wg: sm90::WgRow,
        paired: bool,
    ) -> Result<Wgmma> {
        let sms =
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let sms = sms.max(1) as u32;
        let rows = shape.rows() as u32;
        let pair = if paired && wg.paired {
            let f = module
                .kernel_with_smem(kernels_gpu::registry::SM90_WG_PAIR.name, sm90::PAIR.bytes)?;
            Some((f, sm90::pair_grid(rows, sms)))
        } else {
            None
        };
        let row = module.kernel_with_smem(wg.kernel, wg.bytes)?;
        let stage1 = module.kernel(wg.stage1)?;
        Ok(Wgmma {
            stage1,
            row,
            row_threads: wg.threads,
            row_smem: wg.bytes,
            grid: wg.grid(rows, sms),
            pair,
        })
    }

    /// Stage 1 (`zeroed` mark), then the wgmma kernels (`launch_stage2`;
    /// `gradients` mark).
    ///
    /// # Safety
    /// `run.params` passed `args::check` for this plan's shape.
    pub(crate) unsafe fn launch(&self, run: &Run<'_>) -> Result<()> {
        // SAFETY: `run.params` checked for the shape; stage 1's contract is
        // kept by `launch_stage1` (it is the one of the row kernel's D: it
        // zeroes `B*S_k*D`); stage 2's by `launch_stage2`.
        unsafe {
            launch_stage1(run.stream, &self.stage1, run.shape, &run.params)?;
            run.mark(|e| &e.zeroed)?;
            self.launch_stage2(run.stream, run.params)?;
        }
        run.mark(|e| &e.gradients)
    }

    /// The wgmma kernels alone, as programmatic dependents of the stage 1
    /// launched just before on `stream` (this path's, or dense mode's).
    ///
    /// # Safety
    /// `p` holds checked addresses for this plan's shape, and the previous
    /// launch on `stream` is a stage 1 for them (grad_signal, zeroed
    /// accumulator, chunk counts when `p.flags` asks for them).
    pub(crate) unsafe fn launch_stage2(
        &self,
        stream: &CudaStream,
        mut p: GradParams,
    ) -> Result<()> {
        // SAFETY: the paired kernel runs `sm90::PAIR`'s CTAs on `pair`'s
        // grid, the row kernel `row_threads` on `grid` with `row_smem`
        // bytes, its `WgRow`'s (limits raised in `new`). Both are
        // programmatic dependents: each executes griddepcontrol.wait before
        // it reads what stage 1 writes, and the paired kernel exits only
        // after that wait, so the row kernel's wait also covers stage 1.
        unsafe {
            if let Some((pair_fn, pair_grid)) = &self.pair {
                gpu::launch_pdl(
                    stream,
                    pair_fn,
                    *pair_grid,
                    sm90::PAIR.threads,
                    sm90::PAIR.bytes,
                    &p,
                )?;
                // Tells the row kernel that the paired kernel ran: it
                // repeats the dispatch test and exits at once where the
                // paired kernel computes.
                p.flags |= FLAG_PAIR_DISPATCH;
            }
            gpu::launch_pdl(
                stream,
                &self.row,
                self.grid,
                self.row_threads,
                self.row_smem,
                &p,
            )
        }
    }
}
