//! The dense plan on device buffers: every check of the sparse `execute`
//! contract, then the launches of [`super::gpu`] (Hopper, compute
//! capability 9.0), or [`Error::NotImplemented`] where that path does not
//! run.

use super::gpu::{DenseGpu, Ptrs};
use super::shape::Shape;
use crate::args::{self, dk_align, Arg, GradOut};
use crate::error::{Error, Result};
use crate::shape::{check_finite, GradDtype, Options};
use cudarc::driver::{sys, CudaContext, CudaStream, CudaView, CudaViewMut};
use half::bf16;
use std::sync::Arc;

/// What [`Plan::execute`] returns after its checks pass where the GPU
/// path does not run.
pub(super) const NO_KERNEL: &str = "dense mode on this GPU or shape: it runs on compute \
capability 9.0 with more than 64 key columns and at most 2^29 score elements \
(dense::cpu::execute and dense::run compute it on the CPU)";

/// Read-only device inputs of [`Plan::execute`] (`rows` and `cols` as in
/// [`super::cpu::HostInputs`]).
pub struct Inputs<'a> {
    /// bf16 `(rows, H, D)`, 16-byte aligned.
    pub index_q: CudaView<'a, bf16>,
    /// bf16 `(rows, H)`.
    pub weights: CudaView<'a, bf16>,
    /// bf16 `(key rows, D)`, 16-byte aligned.
    pub index_k: CudaView<'a, bf16>,
    /// f32 `(rows, cols)`: attention mass.
    pub attn_score: CudaView<'a, f32>,
    /// f32 `(rows,)`: its row sums.
    pub attn_l1norm: CudaView<'a, f32>,
    /// f32 `(rows,)`: row log-sum-exp of the logits.
    pub index_lse: CudaView<'a, f32>,
    /// One f32: upstream gradient of the loss, to be read on the device.
    pub grad_loss: CudaView<'a, f32>,
}

/// Device outputs of [`Plan::execute`].
pub struct Outputs<'a> {
    /// f32 `(rows, cols)`: raw logits on entry, grad_signal on return (0
    /// at the columns a row does not see).
    pub index_score: CudaViewMut<'a, f32>,
    /// bf16 `(rows, H, D)`, 4-byte aligned.
    pub d_index_q: CudaViewMut<'a, bf16>,
    /// `(rows, H)` in the plan's `d_weights` type.
    pub d_weights: GradOut<'a>,
    /// `(key rows, D)` in the plan's `d_index_k` type.
    pub d_index_k: GradOut<'a>,
    /// At least [`Plan::workspace_bytes`] bytes, 16-byte aligned (`None`
    /// allowed when that is zero).
    pub workspace: Option<CudaViewMut<'a, u8>>,
}

/// A dense backward plan for one [`Shape`] and [`Options`] on one CUDA
/// context.
///
/// On compute capability 9.0 (H100, H200), [`Plan::execute`] runs dense
/// mode's stage 1 and then stage 2: for H = 64, D = 128 dense mode's own
/// tile kernel (K and q tiles loaded whole, dQ and d_weights written once
/// per row, dK reduced once per 128 keys and run of up to 256 rows; the
/// plan holds its work items, about 30 bytes per query row); for the other
/// shapes, with more than 64 key columns and at most
/// [`super::MAX_GPU_SCORES`] score elements, the sparse path's wgmma
/// kernels on the equivalent sparse problem (`topk` = the key columns),
/// whose key ids the plan builds once and holds on the device (4 bytes
/// per score element, plus 4 per row). See [`Plan::on_gpu`].
/// Elsewhere `execute` makes every check and returns
/// [`Error::NotImplemented`] without writing anything; use
/// [`super::cpu::execute`] or [`super::run`] (host data) there.
///
/// Of [`Options`], `sm_scale`, `d_index_k`, `d_weights` and
/// `deterministic` apply (deterministic mode: [`Plan::new`] fails with
/// [`Error::NotImplemented`] where the GPU path does not run); `key_ids`
/// (dense keys are the causal columns), `score` (dense takes raw logits and
/// their log-sum-exp) and `backend` are ignored.
pub struct Plan {
    shape: Shape,
    opts: Options,
    pub(super) ctx: Arc<CudaContext>,
    /// The GPU path, where it runs.
    pub(super) gpu: Option<DenseGpu>,
}

impl Plan {
    /// Checks the shape envelope ([`Shape::validate`]) and the options'
    /// scalars, binds the plan to `ctx` and, where the GPU path runs,
    /// loads its kernels and uploads the shape's work items or key ids (synchronously,
    /// on the context's default stream).
    pub fn new(ctx: &Arc<CudaContext>, shape: Shape, opts: Options) -> Result<Plan> {
        shape.validate()?;
        opts.validate()?;
        let gpu = DenseGpu::new(ctx, &shape, opts.deterministic)?;
        if opts.deterministic && gpu.is_none() {
            return Err(Error::NotImplemented {
                what: "deterministic mode in dense mode outside its GPU path (compute \
                       capability 9.0)",
            });
        }
        Ok(Plan {
            shape,
            opts,
            ctx: ctx.clone(),
            gpu,
        })
    }

    /// Whether [`Plan::execute`] runs on the GPU (else it returns
    /// [`Error::NotImplemented`] after its checks).
    pub fn on_gpu(&self) -> bool {
        self.gpu.is_some()
    }

    /// What the GPU path's kernel module was loaded from (the shipped
    /// machine code of the GPU, or JIT-compiled PTX), `None` where the plan
    /// runs on the CPU. The module is shared with every plan on the context
    /// ([`crate::Plan::new`]).
    pub fn module_image(&self) -> Option<crate::ModuleImage> {
        self.gpu.as_ref().map(DenseGpu::module_image)
    }

    /// The plan's shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The plan's options.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Device workspace `execute` needs: the f32 accumulator of
    /// `d_index_k` when that output is bf16, zero otherwise (as in the
    /// sparse plan). In deterministic mode also the tile kernel's turn
    /// table (4 bytes per 64 keys), or, for the shapes that run the
    /// sparse path's kernels, its deterministic tables instead
    /// (`Plan::workspace_bytes` of the sparse plan: about 5 bytes per
    /// `d_index_k` element).
    pub fn workspace_bytes(&self) -> usize {
        match &self.gpu {
            Some(gpu) => gpu.workspace_bytes(&self.opts),
            None => match self.opts.d_index_k {
                GradDtype::F32 => 0,
                GradDtype::Bf16 => self.shape.k_len() * 4,
            },
        }
    }

    /// Checks the call as the sparse [`crate::Plan::execute`] does (in the
    /// same order: `loss_coeff`, the stream's context, the two typed
    /// outputs' element types, then context, length, workspace, alignment
    /// and overlap over the tensors in the order of [`Inputs`] and
    /// [`Outputs`]) and returns the first failure, with nothing launched
    /// or written. Then runs on `stream` and returns without
    /// synchronising: `index_score` <- grad_signal (0 past each row's
    /// visible columns), `d_index_q`, `d_weights`, `d_index_k` written; no
    /// device memory is allocated. Where the GPU path does not run
    /// ([`Plan::on_gpu`]), a call that passes every check gets
    /// [`Error::NotImplemented`] instead, with nothing written.
    pub fn execute(
        &self,
        stream: &CudaStream,
        inputs: &Inputs<'_>,
        outputs: &mut Outputs<'_>,
        loss_coeff: f32,
    ) -> Result<()> {
        self.check_and_run(stream, inputs, outputs, loss_coeff)
    }

    fn check_and_run(
        &self,
        stream: &CudaStream,
        inputs: &Inputs<'_>,
        outputs: &mut Outputs<'_>,
        loss_coeff: f32,
    ) -> Result<()> {
        check_finite("loss_coeff", loss_coeff)?;
        // The plan's context current on this thread for the launches.
        let _bound = crate::gpu::Bound::new(&self.ctx)?;
        let ordinal = self.ctx.ordinal();
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(Error::Device {
                tensor: "stream",
                expected: ordinal,
            });
        }
        args::grad_dtypes(
            &self.opts,
            outputs.d_weights.dtype(),
            outputs.d_index_k.dtype(),
        )?;
        let (s, ctx) = (&self.shape, self.ctx.cu_ctx());
        let (score, rows) = (s.score_len(), s.rows());
        let dk = dk_align(self.opts.d_index_k);
        let Outputs {
            index_score,
            d_index_q,
            d_weights,
            d_index_k,
            workspace,
        } = outputs;
        // The guards order `stream` after earlier writers of each buffer;
        // they drop at the end of this call (nothing is launched).
        let held = [
            args::input("index_q", &inputs.index_q, stream, s.q_len(), 16),
            args::input("weights", &inputs.weights, stream, s.w_len(), 2),
            args::input("index_k", &inputs.index_k, stream, s.k_len(), 16),
            args::input("attn_score", &inputs.attn_score, stream, score, 4),
            args::input("attn_l1norm", &inputs.attn_l1norm, stream, rows, 4),
            args::input("index_lse", &inputs.index_lse, stream, rows, 4),
            args::input("grad_loss", &inputs.grad_loss, stream, 1, 4),
            args::output("index_score", index_score, stream, score, 4),
            args::output("d_index_q", d_index_q, stream, s.q_len(), 4),
            args::grad("d_weights", d_weights, stream, s.w_len(), 4),
            args::grad("d_index_k", d_index_k, stream, s.k_len(), dk),
        ];
        let ws_len = workspace.as_ref().map_or(0, |w| w.len());
        let ws = workspace
            .as_mut()
            .map(|w| args::output("workspace", w, stream, ws_len, 16));
        let ws_arg = ws.as_ref().map_or_else(|| no_workspace(ctx), |(a, _)| *a);
        let list: [Arg; 12] = std::array::from_fn(|i| held.get(i).map_or(ws_arg, |(a, _)| *a));
        args::check_args(&list, ctx, ordinal, ws_len, self.workspace_bytes())?;
        let Some(gpu) = &self.gpu else {
            return Err(Error::NotImplemented { what: NO_KERNEL });
        };
        let ptr = |i: usize| list[i].ptr;
        let p = Ptrs {
            q: ptr(0),
            w: ptr(1),
            k: ptr(2),
            attn: ptr(3),
            l1: ptr(4),
            lse: ptr(5),
            grad_loss: ptr(6),
            score: ptr(7),
            dq: ptr(8),
            dw: ptr(9),
            dk: ptr(10),
            ws: ptr(11),
        };
        // SAFETY: every address passed the checks above for this plan's
        // shape on `stream`'s context, the workspace included (the
        // accumulator when d_index_k is bf16); the guards in `held` and
        // `ws` stay alive until the launches are queued.
        unsafe { gpu.launch(stream, &p, &self.opts, loss_coeff) }
    }
}

/// The [`Arg`] of an absent workspace (no bytes: never misaligned, never
/// overlapping).
fn no_workspace(ctx: sys::CUcontext) -> Arg {
    Arg {
        name: "workspace",
        ptr: 0,
        bytes: 0,
        len: 0,
        expected: 0,
        align: 16,
        output: true,
        ctx,
    }
}
