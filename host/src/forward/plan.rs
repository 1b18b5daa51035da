//! The forward's GPU plans: [`Plan`] (sparse) and [`DensePlan`], each
//! one kernel launch per call (one CTA per query row), checked before it
//! is queued as the backward's `execute` is (context, element counts,
//! alignment, overlap of each output with every other tensor).

use super::{validate_shape, Kernel, Options};
use crate::args::{self, Arg, TopkId};
use crate::dense;
use crate::error::{Error, Result};
use crate::gpu::{self, PtxModule};
use crate::raw::{check_stream, on_device, raw_arg};
use crate::shape::{KeyIds, ScoreKind, Shape};
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, SyncOnDrop,
};
use half::bf16;
use kernels_gpu::abi::{FwdParams, FLAG_FWD_DENSE, FLAG_IDS_I64, FLAG_LOCAL_IDS, FLAG_LOG_SCORE};
use kernels_gpu::portable::forward::{persistent, rows_smem, smem, supports, THREADS};
use kernels_gpu::registry::FwdKind;
use kernels_gpu::sched::persistent_grid;
use std::sync::Arc;

/// Device inputs of [`Plan::execute`]; `I` (`i32` or `i64`) is inferred
/// from `topk_indices`.
pub struct Inputs<'a, I = i32> {
    /// bf16 `(B, S_q, H, D)`, 16-byte aligned.
    pub index_q: CudaView<'a, bf16>,
    /// bf16 `(B, S_q, H)`.
    pub weights: CudaView<'a, bf16>,
    /// bf16 `(B, S_k, D)`, 16-byte aligned.
    pub index_k: CudaView<'a, bf16>,
    /// `(B, S_q, topk)` key ids (invalid ids are padding).
    pub topk_indices: CudaView<'a, I>,
}

/// Device outputs of [`Plan::execute`].
pub struct Outputs<'a> {
    /// f32 `(B, S_q, topk)`: probabilities or log-probabilities.
    pub index_score: CudaViewMut<'a, f32>,
    /// f32 `(B, S_q)`: each row's log-sum-exp.
    pub lse: CudaViewMut<'a, f32>,
}

/// Device inputs of [`DensePlan::execute`], in the dense shape's layout.
pub struct DenseInputs<'a> {
    /// bf16 `(rows, H, D)`, 16-byte aligned.
    pub index_q: CudaView<'a, bf16>,
    /// bf16 `(rows, H)`.
    pub weights: CudaView<'a, bf16>,
    /// bf16 `(key rows, D)`, 16-byte aligned.
    pub index_k: CudaView<'a, bf16>,
}

/// Device outputs of [`DensePlan::execute`].
pub struct DenseOutputs<'a> {
    /// f32 `(rows, score_cols)`: raw logits over the visible columns, 0
    /// beyond (dense mode's `index_score`).
    pub index_score: CudaViewMut<'a, f32>,
    /// f32 `(rows,)`: each row's log-sum-exp (dense mode's `index_lse`).
    pub index_lse: CudaViewMut<'a, f32>,
}

/// Raw device addresses of one [`Plan::execute_raw`] call (PyTorch's
/// `data_ptr()`s), each holding the element count the plan's shape implies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawForward {
    /// bf16 `(B, S_q, H, D)`, 16-byte aligned.
    pub index_q: u64,
    /// bf16 `(B, S_q, H)`.
    pub weights: u64,
    /// bf16 `(B, S_k, D)`, 16-byte aligned.
    pub index_k: u64,
    /// `(B, S_q, topk)`, i64 when `topk_indices_i64`, else i32.
    pub topk_indices: u64,
    /// f32 `(B, S_q, topk)`, written.
    pub index_score: u64,
    /// f32 `(B, S_q)`, written.
    pub lse: u64,
    /// `topk_indices` holds i64 ids.
    pub topk_indices_i64: bool,
}

/// Raw device addresses of one [`DensePlan::execute_raw`] call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawDense {
    /// bf16 `(rows, H, D)`, 16-byte aligned.
    pub index_q: u64,
    /// bf16 `(rows, H)`.
    pub weights: u64,
    /// bf16 `(key rows, D)`, 16-byte aligned.
    pub index_k: u64,
    /// f32 `(rows, score_cols)`, written.
    pub index_score: u64,
    /// f32 `(rows,)`, written.
    pub index_lse: u64,
}

/// The loaded kernel of a plan and what it is launched with.
struct Launch {
    ctx: Arc<CudaContext>,
    function: CudaFunction,
    name: &'static str,
    smem: u32,
    /// The persistent wgmma kernel's SMs and CTAs that reside on one at
    /// once (its grid: `kernels_gpu::sched::persistent_grid`); `None` for
    /// the kernels of one CTA per row.
    resident: Option<(u32, u32)>,
    module: Arc<crate::modules::Loaded>,
}

impl Launch {
    /// The forward kernel for `heads` x `dim` on `ctx`'s GPU; `sparse_cols`
    /// the slots of a sparse row (`None` in dense mode), which with the
    /// shape picks the persistent wgmma kernel
    /// (`kernels_gpu::portable::forward::persistent`).
    fn new(
        ctx: &Arc<CudaContext>,
        heads: usize,
        dim: usize,
        kernel: Kernel,
        sparse_cols: Option<usize>,
    ) -> Result<Launch> {
        let (major, minor) = ctx.compute_capability()?;
        let which = PtxModule::for_capability(major, minor)?;
        let wgmma = which.has_wgmma() && kernel == Kernel::Auto;
        let (h, d) = (heads as u32, dim as u32);
        let kind = match sparse_cols {
            _ if !wgmma => FwdKind::Portable,
            Some(cols) if persistent(h, d, u32::try_from(cols).unwrap_or(u32::MAX)) => {
                FwdKind::Persistent
            }
            _ => FwdKind::Wgmma,
        };
        let k = kernels_gpu::registry::fwd_kernel(h, d, kind).ok_or(Error::Shape {
            name: "heads",
            value: heads,
            expected: "one of 16, 32, 64, 128 with head_dim 64 or 128",
        })?;
        let bytes = if wgmma {
            smem(h, d).bytes
        } else {
            rows_smem(h, d).bytes
        };
        let module = crate::modules::get(ctx, which)?;
        let function = module.kernel_with_smem(k.name, bytes)?;
        let resident = if kind == FwdKind::Persistent {
            let sms =
                ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
            let per_sm = function.occupancy_max_active_blocks_per_multiprocessor(
                THREADS,
                bytes as usize,
                None,
            )?;
            Some((sms.max(0) as u32, per_sm))
        } else {
            None
        };
        Ok(Launch {
            ctx: ctx.clone(),
            function,
            name: k.name,
            smem: bytes,
            resident,
            module,
        })
    }

    /// Checks `list` (context, counts, alignment, overlap) on `stream`.
    fn check(&self, stream: &CudaStream, list: &[Arg]) -> Result<()> {
        let ordinal = self.ctx.ordinal();
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(Error::Device {
                tensor: "stream",
                expected: ordinal,
            });
        }
        args::check_args(list, self.ctx.cu_ctx(), ordinal, 0, 0)
    }

    /// The checks of a raw call: the stream's context, every non-empty
    /// address on the plan's device, then `check_args`.
    ///
    /// # Safety
    /// `stream` is a valid stream handle.
    unsafe fn check_raw(&self, stream: sys::CUstream, list: &[Arg]) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { check_stream(&self.ctx, stream)? };
        let ordinal = self.ctx.ordinal();
        on_device(list, ordinal)?;
        args::check_args(list, self.ctx.cu_ctx(), ordinal, 0, 0)
    }

    /// Queues the kernel on `stream` for `p`.
    ///
    /// # Safety
    /// `p`'s addresses passed the checks for the plan's shape.
    unsafe fn launch(&self, stream: &CudaStream, p: &FwdParams) -> Result<()> {
        let grid = match self.resident {
            Some((sms, per_sm)) => persistent_grid(p.rows, sms, per_sm).max(1),
            None => p.rows,
        };
        // SAFETY: the caller's contract; CTAs of THREADS with the layout's
        // shared memory, one per row (the portable kernel) or at most one
        // per row (the wgmma kernel walks rows `blockIdx.x + k gridDim.x`).
        unsafe { gpu::launch(stream, &self.function, grid, THREADS, self.smem, p) }
    }

    /// Queues the kernel on the raw stream `stream`.
    ///
    /// # Safety
    /// As [`Launch::launch`]; `stream` valid, on the plan's context.
    unsafe fn launch_raw(&self, stream: sys::CUstream, p: &FwdParams) -> Result<()> {
        // SAFETY: the caller's contract; the wrapper does not own it.
        let s = unsafe { self.ctx.wrap_borrowed_stream(stream) };
        // SAFETY: forwarded.
        unsafe { self.launch(&s, p) }
    }
}

/// A sparse forward plan for one shape and set of options on one CUDA
/// context: its kernel loaded once (from the context's shared module),
/// nothing allocated per call.
pub struct Plan {
    shape: Shape,
    opts: Options,
    launch: Launch,
}

impl Plan {
    /// Builds a plan: checks the shape (the backward's envelope) and
    /// `sm_scale`, and takes the kernel for the context's GPU. Fails with
    /// [`Error::UnsupportedDevice`] below compute capability 9.0.
    pub fn new(ctx: &Arc<CudaContext>, shape: Shape, opts: Options) -> Result<Plan> {
        validate_shape(&shape)?;
        opts.validate()?;
        let launch = Launch::new(
            ctx,
            shape.heads,
            shape.head_dim,
            opts.kernel,
            Some(shape.topk),
        )?;
        Ok(Plan {
            shape,
            opts,
            launch,
        })
    }

    /// The plan's shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The plan's options.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// The kernel `execute` launches.
    pub fn kernel(&self) -> &'static str {
        self.launch.name
    }

    /// What the plan's kernel module was loaded from.
    pub fn module_image(&self) -> crate::ModuleImage {
        self.launch.module.image()
    }

    /// The kernel's parameter for the addresses `b`.
    fn params(&self, b: &RawForward) -> FwdParams {
        let s = &self.shape;
        let mut flags = 0;
        if self.opts.key_ids == KeyIds::Local {
            flags |= FLAG_LOCAL_IDS;
        }
        if self.opts.score == ScoreKind::LogProbs {
            flags |= FLAG_LOG_SCORE;
        }
        if b.topk_indices_i64 {
            flags |= FLAG_IDS_I64;
        }
        FwdParams {
            index_q: b.index_q,
            weights: b.weights,
            index_k: b.index_k,
            topk_indices: b.topk_indices,
            visible: 0,
            key_start: 0,
            score: b.index_score,
            lse: b.lse,
            rows: s.rows() as u32,
            seq_q: s.seq_q as u32,
            seq_k: s.seq_k as u32,
            cols: s.topk as u32,
            batch: s.batch as u32,
            sm_scale: self.opts.sm_scale,
            flags,
            _pad: 0,
        }
    }

    /// Runs the forward on `stream` and returns without synchronising; any
    /// thread may call it (the plan's context is bound for the call).
    /// Everything is checked first; a failed check returns an [`Error`]
    /// naming the tensor before anything is queued.
    pub fn execute<I: TopkId>(
        &self,
        stream: &CudaStream,
        inputs: &Inputs<'_, I>,
        outputs: &mut Outputs<'_>,
    ) -> Result<()> {
        let _bound = gpu::Bound::new(&self.launch.ctx)?;
        let s = &self.shape;
        let Outputs { index_score, lse } = outputs;
        let held: [(Arg, SyncOnDrop<'_>); 6] = [
            args::input("index_q", &inputs.index_q, stream, s.q_len(), 16),
            args::input("weights", &inputs.weights, stream, s.w_len(), 2),
            args::input("index_k", &inputs.index_k, stream, s.k_len(), 16),
            args::ids_input(&inputs.topk_indices, stream, s.slots()),
            args::output("index_score", index_score, stream, s.slots(), 4),
            args::output("lse", lse, stream, s.rows(), 4),
        ];
        let list = held.each_ref().map(|(a, _)| *a);
        self.launch.check(stream, &list)?;
        let p = self.params(&RawForward {
            index_q: list[0].ptr,
            weights: list[1].ptr,
            index_k: list[2].ptr,
            topk_indices: list[3].ptr,
            index_score: list[4].ptr,
            lse: list[5].ptr,
            topk_indices_i64: I::I64,
        });
        // SAFETY: every address passed the checks for this shape.
        unsafe { self.launch.launch(stream, &p) }
    }

    /// [`Plan::execute`] on raw device addresses queued on the raw stream
    /// `stream` (PyTorch's current stream; null is the legacy default
    /// stream): the checks an address allows (the stream's context, each
    /// address on the plan's device, alignment, overlap), then the launch.
    ///
    /// # Safety
    /// Each address is the start of a live device allocation (or part of
    /// one) on the plan's context holding the element count the shape
    /// implies in the documented type; `stream` is valid and stays so
    /// while the kernel runs.
    pub unsafe fn execute_raw(&self, stream: sys::CUstream, b: &RawForward) -> Result<()> {
        let _bound = gpu::Bound::new(&self.launch.ctx)?;
        let (s, ctx) = (&self.shape, self.launch.ctx.cu_ctx());
        let id = if b.topk_indices_i64 { 8 } else { 4 };
        let list = [
            raw_arg("index_q", b.index_q, s.q_len(), 2, 16, false, ctx),
            raw_arg("weights", b.weights, s.w_len(), 2, 2, false, ctx),
            raw_arg("index_k", b.index_k, s.k_len(), 2, 16, false, ctx),
            raw_arg(
                "topk_indices",
                b.topk_indices,
                s.slots(),
                id,
                id as u64,
                false,
                ctx,
            ),
            raw_arg("index_score", b.index_score, s.slots(), 4, 4, true, ctx),
            raw_arg("lse", b.lse, s.rows(), 4, 4, true, ctx),
        ];
        // SAFETY: the caller's promise on `stream`.
        unsafe { self.launch.check_raw(stream, &list)? };
        let p = self.params(b);
        // SAFETY: checked above; counts and types are the caller's promise.
        unsafe { self.launch.launch_raw(stream, &p) }
    }
}

/// A dense forward plan for one dense shape on one CUDA context: its
/// kernel, and each row's visible count and first key row on the device
/// (8 bytes per query row, uploaded once).
pub struct DensePlan {
    shape: dense::Shape,
    opts: Options,
    launch: Launch,
    visible: CudaSlice<u32>,
    key_start: CudaSlice<u32>,
}

impl DensePlan {
    /// Builds a plan: checks the dense shape and `sm_scale` (`key_ids` and
    /// `score` do not apply: the outputs are raw logits), takes the kernel
    /// and uploads the rows' visibility.
    pub fn new(ctx: &Arc<CudaContext>, shape: dense::Shape, opts: Options) -> Result<DensePlan> {
        shape.validate()?;
        opts.validate()?;
        let (rows, cols) = (shape.rows(), shape.score_cols());
        if !supports(rows as u64, cols as u64) || shape.key_rows() > i32::MAX as usize {
            return Err(Error::Shape {
                name: "rows",
                value: rows,
                expected: "<= 2^31 - 1 query and key rows, score_cols >= 1",
            });
        }
        let launch = Launch::new(ctx, shape.heads, shape.head_dim, opts.kernel, None)?;
        let mut visible = crate::cpu::try_vec(rows, 0u32, "dense visible counts")?;
        let mut key_start = crate::cpu::try_vec(rows, 0u32, "dense key starts")?;
        for r in 0..rows {
            let at = shape.row(r);
            visible[r] = at.visible as u32;
            key_start[r] = at.key_start as u32;
        }
        let stream = ctx.default_stream();
        let visible = stream.clone_htod(&visible)?;
        let key_start = stream.clone_htod(&key_start)?;
        stream.synchronize()?;
        Ok(DensePlan {
            shape,
            opts,
            launch,
            visible,
            key_start,
        })
    }

    /// The plan's shape.
    pub fn shape(&self) -> &dense::Shape {
        &self.shape
    }

    /// The kernel `execute` launches.
    pub fn kernel(&self) -> &'static str {
        self.launch.name
    }

    fn params(
        &self,
        q: u64,
        w: u64,
        k: u64,
        score: u64,
        lse: u64,
        stream: &CudaStream,
    ) -> FwdParams {
        use cudarc::driver::DevicePtr;
        let s = &self.shape;
        let (v, _g1) = self.visible.device_ptr(stream);
        let (ks, _g2) = self.key_start.device_ptr(stream);
        FwdParams {
            index_q: q,
            weights: w,
            index_k: k,
            topk_indices: 0,
            visible: v,
            key_start: ks,
            score,
            lse,
            rows: s.rows() as u32,
            seq_q: s.rows() as u32,
            seq_k: s.key_rows() as u32,
            cols: s.score_cols() as u32,
            batch: 1,
            sm_scale: self.opts.sm_scale,
            flags: FLAG_FWD_DENSE,
            _pad: 0,
        }
    }

    /// Runs the dense forward on `stream` without synchronising, after the
    /// same checks as [`Plan::execute`].
    pub fn execute(
        &self,
        stream: &CudaStream,
        inputs: &DenseInputs<'_>,
        outputs: &mut DenseOutputs<'_>,
    ) -> Result<()> {
        let _bound = gpu::Bound::new(&self.launch.ctx)?;
        let s = &self.shape;
        let (rows, h, d) = (s.rows(), s.heads, s.head_dim);
        let DenseOutputs {
            index_score,
            index_lse,
        } = outputs;
        let held: [(Arg, SyncOnDrop<'_>); 5] = [
            args::input("index_q", &inputs.index_q, stream, rows * h * d, 16),
            args::input("weights", &inputs.weights, stream, rows * h, 2),
            args::input("index_k", &inputs.index_k, stream, s.key_rows() * d, 16),
            args::output("index_score", index_score, stream, s.score_len(), 4),
            args::output("index_lse", index_lse, stream, rows, 4),
        ];
        let list = held.each_ref().map(|(a, _)| *a);
        self.launch.check(stream, &list)?;
        let p = self.params(
            list[0].ptr,
            list[1].ptr,
            list[2].ptr,
            list[3].ptr,
            list[4].ptr,
            stream,
        );
        // SAFETY: every address passed the checks for this shape; the
        // plan's visibility arrays hold one u32 per row.
        unsafe { self.launch.launch(stream, &p) }
    }

    /// [`DensePlan::execute`] on raw addresses, as [`Plan::execute_raw`].
    ///
    /// # Safety
    /// As [`Plan::execute_raw`].
    pub unsafe fn execute_raw(&self, stream: sys::CUstream, b: &RawDense) -> Result<()> {
        let _bound = gpu::Bound::new(&self.launch.ctx)?;
        let s = &self.shape;
        let (rows, h, d, ctx) = (s.rows(), s.heads, s.head_dim, self.launch.ctx.cu_ctx());
        let list = [
            raw_arg("index_q", b.index_q, rows * h * d, 2, 16, false, ctx),
            raw_arg("weights", b.weights, rows * h, 2, 2, false, ctx),
            raw_arg("index_k", b.index_k, s.key_rows() * d, 2, 16, false, ctx),
            raw_arg("index_score", b.index_score, s.score_len(), 4, 4, true, ctx),
            raw_arg("index_lse", b.index_lse, rows, 4, 4, true, ctx),
        ];
        // SAFETY: the caller's promise on `stream`.
        unsafe { self.launch.check_raw(stream, &list)? };
        // SAFETY: the caller's promise; the wrapper does not own it.
        let st = unsafe { self.launch.ctx.wrap_borrowed_stream(stream) };
        let p = self.params(
            b.index_q,
            b.weights,
            b.index_k,
            b.index_score,
            b.index_lse,
            &st,
        );
        // SAFETY: checked above.
        unsafe { self.launch.launch(&st, &p) }
    }
}
