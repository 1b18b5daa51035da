//! One-shot convenience: run the backward on host data, on the GPU when
//! one is present, else on the CPU fallback. Allocates and synchronises;
//! for training loops build a [`Plan`] once and call `execute`.

use crate::args::{GradOut, Inputs, Outputs, TopkId};
use crate::cpu::{self, HostGrad, HostInputs, HostOutputs};
use crate::error::Result;
use crate::plan::Plan;
use crate::shape::{GradDtype, Options, Shape};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use half::bf16;
use std::sync::Arc;

/// A gradient returned to the host in the plan's element type.
#[derive(Clone, Debug, PartialEq)]
pub enum GradVec {
    /// f32 elements.
    F32(Vec<f32>),
    /// bf16 elements.
    Bf16(Vec<bf16>),
}

impl GradVec {
    pub(crate) fn zeros(dtype: GradDtype, n: usize, what: &'static str) -> Result<GradVec> {
        Ok(match dtype {
            GradDtype::F32 => GradVec::F32(cpu::try_vec(n, 0.0, what)?),
            GradDtype::Bf16 => GradVec::Bf16(cpu::try_vec(n, bf16::ZERO, what)?),
        })
    }
    pub(crate) fn as_host(&mut self) -> HostGrad<'_> {
        match self {
            GradVec::F32(v) => HostGrad::F32(v),
            GradVec::Bf16(v) => HostGrad::Bf16(v),
        }
    }
    /// Values widened to f64.
    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            GradVec::F32(v) => v.iter().map(|&x| x as f64).collect(),
            GradVec::Bf16(v) => v.iter().map(|x| x.to_f64()).collect(),
        }
    }
}

/// A gradient on the device in the options' element type (the GPU half
/// of [`run`] and `dense::run`).
pub(crate) enum DeviceGrad {
    F32(CudaSlice<f32>),
    Bf16(CudaSlice<bf16>),
}

impl DeviceGrad {
    fn zeros(stream: &Arc<CudaStream>, dtype: GradDtype, n: usize) -> Result<DeviceGrad> {
        Ok(match dtype {
            GradDtype::F32 => DeviceGrad::F32(stream.alloc_zeros(n)?),
            GradDtype::Bf16 => DeviceGrad::Bf16(stream.alloc_zeros(n)?),
        })
    }

    /// The output view `execute` takes.
    pub(crate) fn view_mut(&mut self) -> GradOut<'_> {
        match self {
            DeviceGrad::F32(v) => GradOut::F32(v.as_view_mut()),
            DeviceGrad::Bf16(v) => GradOut::Bf16(v.as_view_mut()),
        }
    }

    fn download(&self, stream: &Arc<CudaStream>) -> Result<GradVec> {
        Ok(match self {
            DeviceGrad::F32(v) => GradVec::F32(stream.clone_dtoh(v)?),
            DeviceGrad::Bf16(v) => GradVec::Bf16(stream.clone_dtoh(v)?),
        })
    }
}

/// The device outputs of a one-shot GPU run besides grad_signal, and the
/// workspace (sparse [`run`] and `dense::run`).
pub(crate) struct DeviceOutputs {
    pub dq: CudaSlice<bf16>,
    pub dw: DeviceGrad,
    pub dk: DeviceGrad,
    pub ws: CudaSlice<u8>,
}

impl DeviceOutputs {
    /// Zeroed outputs of `q_len`, `w_len`, `k_len` elements in `opts`'
    /// types and a workspace of `ws_bytes` (at least 16).
    pub(crate) fn new(
        stream: &Arc<CudaStream>,
        opts: &Options,
        [q_len, w_len, k_len]: [usize; 3],
        ws_bytes: usize,
    ) -> Result<DeviceOutputs> {
        Ok(DeviceOutputs {
            dq: stream.alloc_zeros(q_len)?,
            dw: DeviceGrad::zeros(stream, opts.d_weights, w_len)?,
            dk: DeviceGrad::zeros(stream, opts.d_index_k, k_len)?,
            ws: stream.alloc_zeros(ws_bytes.max(16))?,
        })
    }

    /// Waits for `stream` and downloads the outputs, grad_signal from
    /// `grad_signal`.
    pub(crate) fn finish(
        &self,
        stream: &Arc<CudaStream>,
        grad_signal: &CudaSlice<f32>,
    ) -> Result<HostResult> {
        stream.synchronize()?;
        Ok(HostResult {
            grad_signal: stream.clone_dtoh(grad_signal)?,
            d_index_q: stream.clone_dtoh(&self.dq)?,
            d_weights: self.dw.download(stream)?,
            d_index_k: self.dk.download(stream)?,
            backend: "gpu",
        })
    }
}

/// Outputs of [`run`].
#[derive(Clone, Debug, PartialEq)]
pub struct HostResult {
    /// grad_signal (what `attn_score` holds afterwards).
    pub grad_signal: Vec<f32>,
    /// `d_index_q`.
    pub d_index_q: Vec<bf16>,
    /// `d_weights` in the options' type.
    pub d_weights: GradVec,
    /// `d_index_k` in the options' type.
    pub d_index_k: GradVec,
    /// `"gpu"` or `"cpu"`.
    pub backend: &'static str,
}

/// Runs the whole backward on host data: GPU 0 when present and
/// `allow_gpu`, else the CPU fallback. Host scalars are checked on both
/// paths (a non-finite `grad_loss` is rejected); non-finite tensor values
/// propagate the same way on both (see [`crate::cpu`]). `topk_indices`
/// may be i32 or i64: the GPU reads i64 ids as they are; the CPU fallback
/// narrows them first ([`HostInputs::narrowed_ids`]).
pub fn run<I: TopkId>(
    shape: &Shape,
    opts: &Options,
    x: &HostInputs<'_, I>,
    allow_gpu: bool,
) -> Result<HostResult> {
    run_with_progress(shape, opts, x, allow_gpu, &mut |_| {})
}

/// [`run`], calling `progress` after each block of rows when it runs on
/// the CPU (see [`cpu::stderr_progress`]).
pub fn run_with_progress<I: TopkId>(
    shape: &Shape,
    opts: &Options,
    x: &HostInputs<'_, I>,
    allow_gpu: bool,
    progress: &mut dyn FnMut(cpu::Progress),
) -> Result<HostResult> {
    cpu::validate_host(shape, opts, x)?;
    if allow_gpu && crate::cuda_device_count() > 0 {
        let ctx = CudaContext::new(0)?;
        return run_gpu(&ctx, &ctx.default_stream(), shape, opts, x);
    }
    // The CPU path computes with i32 ids (a copy, small next to its work).
    let ids = x.narrowed_ids()?;
    let x = &x.with_ids(&ids);
    let mut grad_signal = cpu::try_vec(shape.slots(), 0.0f32, "grad_signal")?;
    grad_signal.copy_from_slice(x.attn_score);
    let mut r = HostResult {
        grad_signal,
        d_index_q: cpu::try_vec(shape.q_len(), bf16::ZERO, "d_index_q")?,
        d_weights: GradVec::zeros(opts.d_weights, shape.w_len(), "d_weights")?,
        d_index_k: GradVec::zeros(opts.d_index_k, shape.k_len(), "d_index_k")?,
        backend: "cpu",
    };
    let out = HostOutputs {
        attn_score: &mut r.grad_signal,
        d_index_q: &mut r.d_index_q,
        d_weights: r.d_weights.as_host(),
        d_index_k: r.d_index_k.as_host(),
    };
    cpu::execute_with_progress(shape, opts, x, out, progress)?;
    Ok(r)
}

fn run_gpu<I: TopkId>(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    shape: &Shape,
    opts: &Options,
    x: &HostInputs<'_, I>,
) -> Result<HostResult> {
    let plan = Plan::new(ctx, *shape, *opts)?;
    let q = stream.clone_htod(x.index_q)?;
    let w = stream.clone_htod(x.weights)?;
    let k = stream.clone_htod(x.index_k)?;
    let score = stream.clone_htod(x.index_score)?;
    let ids = stream.clone_htod(x.topk_indices)?;
    let gl = stream.clone_htod(&[x.grad_loss])?;
    let mut attn = stream.clone_htod(x.attn_score)?;
    let lens = [shape.q_len(), shape.w_len(), shape.k_len()];
    let mut out = DeviceOutputs::new(stream, opts, lens, plan.workspace_bytes())?;
    {
        let DeviceOutputs { dq, dw, dk, ws } = &mut out;
        let inputs = Inputs {
            index_q: q.as_view(),
            weights: w.as_view(),
            index_k: k.as_view(),
            index_score: score.as_view(),
            topk_indices: ids.as_view(),
            grad_loss: gl.as_view(),
        };
        let mut outputs = Outputs {
            attn_score: attn.as_view_mut(),
            d_index_q: dq.as_view_mut(),
            d_weights: dw.view_mut(),
            d_index_k: dk.view_mut(),
            workspace: Some(ws.as_view_mut()),
        };
        plan.execute(stream, &inputs, &mut outputs, x.loss_coeff)?;
    }
    out.finish(stream, &attn)
}
