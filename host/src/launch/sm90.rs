//! The Hopper fast path: stage 1 (grad_signal, zeroing of the f32 dK
//! accumulator, per-row chunk counts), then the persistent warpgroup-MMA
//! (wgmma) kernels as its programmatic dependents, so their prologue
//! overlaps stage 1's tail.
//!
//! Chosen ([`crate::select::PathKind::Sm90`]) on compute capability 9.0,
//! whose `sm_90a` module alone holds these kernels, for H = 64 with D = 128
//! or 64, and H = 128, 32 or 16 with D = 128 (`kernels_gpu::sm90::bwd::wg_row`:
//! each its own kernel, layout, launch shape and stage 1) and more than
//! one 64-slot chunk per row (`kernels_gpu::sm90::bwd::supports`), under
//! `Backend::Auto` or `Backend::Hopper`. With H = 64, D = 128 and an even
//! number of rows the paired kernel (`registry::SM90_WG_PAIR`, two rows that
//! share keys per CTA) is launched too, between stage 1 and the row
//! kernel: a test on the ids inside both picks the one that computes, the
//! other exits at once (`FLAG_PAIR_DISPATCH`).

use super::common::{launch_stage1, DetOut, Run};
use crate::error::Result;
use crate::gpu;
use crate::modules::Loaded;
use crate::shape::Shape;
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaStream};
use kernels_gpu::abi::{
    DetLayout, DetParams, GradParams, DET_CTAS_PER_SM, DET_KEY_SUM_THREADS, DET_THREADS,
    FLAG_PAIR_DISPATCH,
};
use kernels_gpu::det::{self, KeySumGrid};
use kernels_gpu::registry::{self, DET_BOUNDS, DET_FINISH, DET_KEY_SUMS, DET_SCALES, DET_SMEM};
use kernels_gpu::sm90::bwd;
use std::sync::Arc;

/// Whether stage 1 counts each row's live chunks (over its `d_weights`
/// block, `abi::row_chunks_at`) so that the wgmma kernel skips the rest:
/// from `bwd::SKIP_MIN_TOPK` slots per row on (every H of the path has
/// at least `abi::ROW_CHUNK_MIN_HEADS` d_weights elements per row).
pub(crate) fn row_chunks(shape: &Shape) -> bool {
    shape.topk >= bwd::SKIP_MIN_TOPK as usize
        && shape.heads >= kernels_gpu::abi::ROW_CHUNK_MIN_HEADS as usize
}

/// The loaded kernels of the fast path and their grids.
pub(crate) struct Wgmma {
    stage1: CudaFunction,
    /// The persistent wgmma kernel of the shape (`bwd::WgRow::kernel`).
    row: CudaFunction,
    /// Its threads per CTA (`bwd::WgRow::threads`).
    row_threads: u32,
    /// Its dynamic shared memory (`bwd::WgRow::bytes`).
    row_smem: u32,
    /// CTAs of `row` (`bwd::WgRow::grid`).
    grid: u32,
    /// The paired kernel and its grid, with an even number of rows.
    pair: Option<(CudaFunction, u32)>,
    /// The deterministic mode's kernels, when the plan asks for it.
    det: Option<DetKernels>,
}

/// The deterministic mode's kernels (`kernels_gpu::det`): its passes and
/// the deterministic twins of the plan's wgmma kernels.
pub(crate) struct DetKernels {
    bounds: CudaFunction,
    key_sums: CudaFunction,
    /// The launch of `key_sums` (`kernels_gpu::det::key_sum_grid`).
    key_grid: KeySumGrid,
    scales: CudaFunction,
    finish: CudaFunction,
    /// The twin of `Wgmma::row`.
    row: CudaFunction,
    /// The twin of the paired kernel, when the plan launches it.
    pair: Option<CudaFunction>,
    /// CTAs of the grid-stride passes.
    stride_grid: u32,
    /// The tables' offsets in the workspace (`Shape::det_layout`).
    layout: DetLayout,
}

impl Wgmma {
    /// Loads stage 1 and the wgmma row kernel of `wg` (the shape's head
    /// dimension) and, when `paired` (D = 128 only), the paired
    /// kernel, sizes their persistent grids to the GPU's SMs, and raises
    /// their shared-memory limits; with `deterministic`, also the
    /// deterministic mode's passes and twins.
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        module: &Loaded,
        shape: &Shape,
        wg: bwd::WgRow,
        paired: bool,
        deterministic: bool,
    ) -> Result<Wgmma> {
        let sms =
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let sms = sms.max(1) as u32;
        let rows = shape.rows() as u32;
        let pair = if paired && wg.paired {
            let f = module
                .kernel_with_smem(kernels_gpu::registry::SM90_WG_PAIR.name, bwd::PAIR.bytes)?;
            Some((f, bwd::pair_grid(rows, sms)))
        } else {
            None
        };
        let row = module.kernel_with_smem(wg.kernel, wg.bytes)?;
        let stage1 = module.kernel(wg.stage1)?;
        let det = if deterministic {
            let twin = |base: &str, bytes: u32| -> Result<CudaFunction> {
                // Every wgmma kernel has a twin (`registry::SM90_WG_DET`).
                let k = registry::det_twin(base).ok_or(crate::Error::NotImplemented {
                    what: "deterministic mode for this wgmma kernel",
                })?;
                module.kernel_with_smem(k.name, bytes)
            };
            let key_grid = det::key_sum_grid(
                shape.rows() as u32,
                shape.topk as u32,
                (shape.batch * shape.seq_k) as u32,
                sms,
            )
            .ok_or(crate::Error::Shape {
                name: "topk",
                value: shape.topk,
                expected: "at most 2^21 in deterministic mode",
            })?;
            Some(DetKernels {
                bounds: module.kernel(DET_BOUNDS.name)?,
                key_sums: module.kernel_with_smem(DET_KEY_SUMS.name, key_grid.smem_bytes())?,
                key_grid,
                scales: module.kernel(DET_SCALES.name)?,
                finish: module.kernel(DET_FINISH.name)?,
                row: twin(wg.kernel, wg.bytes)?,
                pair: match pair {
                    Some(_) => Some(twin(registry::SM90_WG_PAIR.name, bwd::PAIR.bytes)?),
                    None => None,
                },
                stride_grid: sms * DET_CTAS_PER_SM,
                layout: shape.det_layout(),
            })
        } else {
            None
        };
        Ok(Wgmma {
            stage1,
            row,
            row_threads: wg.threads,
            row_smem: wg.bytes,
            grid: wg.grid(rows, sms),
            pair,
            det,
        })
    }

    /// Stage 1 (`zeroed` mark), then the wgmma kernels (`launch_stage2`;
    /// `gradients` mark).
    ///
    /// # Safety
    /// `run.params` passed `args::check` for this plan's shape.
    pub(crate) unsafe fn launch(&self, run: &Run<'_>) -> Result<()> {
        if let (Some(det), Some(out)) = (&self.det, run.det) {
            // SAFETY: forwarded.
            return unsafe { self.launch_det(run, det, out) };
        }
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
    pub(crate) unsafe fn launch_stage2(&self, stream: &CudaStream, p: GradParams) -> Result<()> {
        let pair = self.pair.as_ref().map(|(f, g)| (f, *g));
        // SAFETY: forwarded; the row and paired kernels take `GradParams`.
        unsafe {
            self.launch_pair_then_row(stream, pair, &self.row, p, |p| {
                p.flags |= FLAG_PAIR_DISPATCH
            })
        }
    }

    /// The paired kernel `pair` (with its grid) when there is one, then the
    /// row kernel `row`, both as programmatic dependents, on parameters
    /// `p`; `dispatch` sets `FLAG_PAIR_DISPATCH` in `p` for the row kernel
    /// after a paired one.
    ///
    /// # Safety
    /// `pair` and `row` are this plan's paired and row kernels (or their
    /// deterministic twins), taking a `P`; as [`Wgmma::launch_stage2`].
    unsafe fn launch_pair_then_row<P>(
        &self,
        stream: &CudaStream,
        pair: Option<(&CudaFunction, u32)>,
        row: &CudaFunction,
        mut p: P,
        dispatch: impl Fn(&mut P),
    ) -> Result<()> {
        // SAFETY: the paired kernel runs `bwd::PAIR`'s CTAs on `pair`'s
        // grid, the row kernel `row_threads` on `grid` with `row_smem`
        // bytes, its `WgRow`'s (limits raised in `new`). Both are
        // programmatic dependents: each executes griddepcontrol.wait before
        // it reads what the launch before them writes, and the paired
        // kernel exits only after that wait, so the row kernel's wait also
        // covers it.
        unsafe {
            if let Some((pair_fn, pair_grid)) = pair {
                gpu::launch_pdl(
                    stream,
                    pair_fn,
                    pair_grid,
                    bwd::PAIR.threads,
                    bwd::PAIR.bytes,
                    &p,
                )?;
                // Tells the row kernel that the paired kernel ran: it
                // repeats the dispatch test and exits at once where the
                // paired kernel computes.
                dispatch(&mut p);
            }
            gpu::launch_pdl(stream, row, self.grid, self.row_threads, self.row_smem, &p)
        }
    }

    /// Deterministic mode (`kernels_gpu::det`, whose note gives the
    /// order): stage 1 (`zeroed` mark; it zeroes the fixed-point
    /// accumulator at `run.params.dk_accum`), then [`Wgmma::launch_det_stage2`]
    /// (`gradients` mark).
    ///
    /// # Safety
    /// As [`Wgmma::launch`]; `run.params.dk_accum` is the start of a
    /// workspace of `det.layout`'s bytes, `out` the checked `d_index_k`.
    unsafe fn launch_det(&self, run: &Run<'_>, det: &DetKernels, out: DetOut) -> Result<()> {
        // SAFETY: the key tables inside the checked workspace, zeroed
        // before stage 1 so that `det_bounds` follows stage 1 directly as
        // its programmatic dependent; stage 1 as in `launch`; the rest
        // forwarded.
        unsafe {
            zero_key_tables(run.stream, &det.layout, run.params.dk_accum)?;
            launch_stage1(run.stream, &self.stage1, run.shape, &run.params)?;
            run.mark(|e| &e.zeroed)?;
            self.det_passes(run.stream, run.shape, det, run.params, out)?;
        }
        run.mark(|e| &e.gradients)
    }

    /// Deterministic mode after dense mode's stage 1 (which zeroes the
    /// same accumulator): the memset of the key tables,
    /// the bounds and their sums per key row, the exponents, the twins of
    /// the wgmma kernels, and the finish into `out`, each pass the
    /// programmatic dependent of the launch before it. `shape` is this
    /// plan's; fails with
    /// [`crate::Error::NotImplemented`] when the plan was built without
    /// the deterministic kernels.
    ///
    /// # Safety
    /// As [`Wgmma::launch_stage2`]; `p.dk_accum` is the start of a
    /// zeroed-accumulator workspace of `shape.det_layout()`'s bytes, `out`
    /// the checked `d_index_k`.
    pub(crate) unsafe fn launch_det_stage2(
        &self,
        stream: &CudaStream,
        shape: &Shape,
        p: GradParams,
        out: DetOut,
    ) -> Result<()> {
        let Some(det) = &self.det else {
            return Err(crate::Error::NotImplemented {
                what: "deterministic mode on a plan built without it",
            });
        };
        // SAFETY: the key tables inside the checked workspace (the passes
        // follow this memset, not stage 1, and start after it); the rest
        // forwarded.
        unsafe {
            zero_key_tables(stream, &det.layout, p.dk_accum)?;
            self.det_passes(stream, shape, det, p, out)
        }
    }

    /// The passes of [`Wgmma::launch_det_stage2`], each as the
    /// programmatic dependent of the launch before it (every pass waits
    /// before it reads what an earlier one wrote).
    ///
    /// # Safety
    /// As [`Wgmma::launch_det_stage2`], `det` this plan's; the key tables
    /// zeroed on `stream` before (before stage 1, or after it as
    /// [`Wgmma::launch_det_stage2`] does).
    unsafe fn det_passes(
        &self,
        stream: &CudaStream,
        s: &Shape,
        det: &DetKernels,
        p: GradParams,
        out: DetOut,
    ) -> Result<()> {
        let l = &det.layout;
        let ws = p.dk_accum;
        let dp = DetParams {
            grad: p,
            key_sum: ws + l.key_sum,
            bound_max: ws + l.bound_max,
            specials: ws + l.specials,
            key_exp: ws + l.key_exp,
            row_bound: ws + l.row_bound,
            d_index_k: out.d_index_k,
            rows: det.key_grid.rows,
            out_bf16: out.bf16 as u32,
            dim: s.head_dim as u32,
            window: det.key_grid.window,
        };
        let rows = s.rows() as u32;
        // SAFETY: the workspace holds `l.bytes` (checked); every pass's
        // launch contract (`kernels_gpu::det`): `det_bounds` one CTA of
        // DET_THREADS per row with DET_SMEM bytes, `det_key_sums` the
        // grid of `key_grid` (from this shape) with its bins, the
        // grid-stride passes any grid of DET_THREADS; each a programmatic
        // dependent of the launch before it, and each executes
        // griddepcontrol.wait before it reads what an earlier launch
        // writes (`sm90::det`); the twins as the wgmma kernels
        // (`launch_pair_then_row`).
        unsafe {
            gpu::launch_pdl(stream, &det.bounds, rows, DET_THREADS, DET_SMEM, &dp)?;
            let g = &det.key_grid;
            let bins = g.smem_bytes();
            gpu::launch_pdl(
                stream,
                &det.key_sums,
                g.ctas,
                DET_KEY_SUM_THREADS,
                bins,
                &dp,
            )?;
            gpu::launch_pdl(stream, &det.scales, det.stride_grid, DET_THREADS, 0, &dp)?;
            let pair = det
                .pair
                .as_ref()
                .zip(self.pair.as_ref())
                .map(|(f, (_, g))| (f, *g));
            self.launch_pair_then_row(stream, pair, &det.row, dp, |p| {
                p.grad.flags |= FLAG_PAIR_DISPATCH
            })?;
            gpu::launch_pdl(stream, &det.finish, det.stride_grid, DET_THREADS, 0, &dp)
        }
    }
}

/// Zeroes deterministic mode's key tables (bound sums, the largest bound,
/// the non-finite flags) in the workspace at `ws` of layout `l`.
///
/// # Safety
/// `ws` is the start of a workspace of at least `l.bytes`, not in use by
/// earlier work on `stream` that this call must not disturb.
unsafe fn zero_key_tables(stream: &CudaStream, l: &DetLayout, ws: u64) -> Result<()> {
    // SAFETY: the caller's contract; key_sum..key_exp lies inside l.bytes.
    unsafe { gpu::memset_zero(stream, ws + l.key_sum, (l.key_exp - l.key_sum) as usize) }
}
