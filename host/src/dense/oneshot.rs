//! One dense problem held on the host: on the GPU where `dense::Plan`
//! runs there (compute capability 9.0), else on the CPU.

use super::cpu::{self, HostInputs, HostOutputs};
use super::plan::{Inputs, Outputs, Plan};
use super::shape::Shape;
use crate::cpu::{try_vec, Progress};
use crate::error::Result;
use crate::oneshot::{DeviceOutputs, GradVec, HostResult};
use crate::shape::Options;
use cudarc::driver::{CudaContext, CudaStream};
use half::bf16;
use std::sync::Arc;

/// Runs the dense backward on host data and returns the outputs
/// (`grad_signal` is what `index_score` holds afterwards, `(rows, cols)`).
///
/// With `allow_gpu`, a CUDA device present and a plan that runs on it
/// ([`Plan::on_gpu`]: compute capability 9.0, more than 64 key columns),
/// it runs on device 0 (`backend` `"gpu"`); otherwise the CPU fallback
/// ([`cpu::execute`], `backend` `"cpu"`).
pub fn run(
    shape: &Shape,
    opts: &Options,
    x: &HostInputs<'_>,
    allow_gpu: bool,
) -> Result<HostResult> {
    run_with_progress(shape, opts, x, allow_gpu, &mut |_| {})
}

/// [`run`], calling `progress` after each block of rows (see
/// [`crate::cpu::stderr_progress`]).
pub fn run_with_progress(
    shape: &Shape,
    opts: &Options,
    x: &HostInputs<'_>,
    allow_gpu: bool,
    progress: &mut dyn FnMut(Progress),
) -> Result<HostResult> {
    cpu::validate_host(shape, opts, x)?;
    if allow_gpu && crate::cuda_device_count() > 0 {
        let ctx = CudaContext::new(0)?;
        let plan = Plan::new(&ctx, shape.clone(), *opts)?;
        if plan.on_gpu() {
            return run_gpu(&plan, &ctx.default_stream(), x);
        }
    }
    let mut grad_signal = try_vec(shape.score_len(), 0.0f32, "grad_signal")?;
    grad_signal.copy_from_slice(x.index_score);
    let mut r = HostResult {
        grad_signal,
        d_index_q: try_vec(shape.q_len(), bf16::ZERO, "d_index_q")?,
        d_weights: GradVec::zeros(opts.d_weights, shape.w_len(), "d_weights")?,
        d_index_k: GradVec::zeros(opts.d_index_k, shape.k_len(), "d_index_k")?,
        backend: "cpu",
    };
    let out = HostOutputs {
        index_score: &mut r.grad_signal,
        d_index_q: &mut r.d_index_q,
        d_weights: r.d_weights.as_host(),
        d_index_k: r.d_index_k.as_host(),
    };
    cpu::execute_with_progress(shape, opts, x, out, progress)?;
    Ok(r)
}

/// Uploads `x`, runs `plan` on `stream`, waits and downloads the outputs.
fn run_gpu(plan: &Plan, stream: &Arc<CudaStream>, x: &HostInputs<'_>) -> Result<HostResult> {
    let (shape, opts) = (plan.shape(), plan.options());
    let q = stream.clone_htod(x.index_q)?;
    let w = stream.clone_htod(x.weights)?;
    let k = stream.clone_htod(x.index_k)?;
    let attn = stream.clone_htod(x.attn_score)?;
    let l1 = stream.clone_htod(x.attn_l1norm)?;
    let lse = stream.clone_htod(x.index_lse)?;
    let gl = stream.clone_htod(&[x.grad_loss])?;
    let mut score = stream.clone_htod(x.index_score)?;
    let lens = [shape.q_len(), shape.w_len(), shape.k_len()];
    let mut out = DeviceOutputs::new(stream, opts, lens, plan.workspace_bytes())?;
    {
        let DeviceOutputs { dq, dw, dk, ws } = &mut out;
        let inputs = Inputs {
            index_q: q.as_view(),
            weights: w.as_view(),
            index_k: k.as_view(),
            attn_score: attn.as_view(),
            attn_l1norm: l1.as_view(),
            index_lse: lse.as_view(),
            grad_loss: gl.as_view(),
        };
        let mut outputs = Outputs {
            index_score: score.as_view_mut(),
            d_index_q: dq.as_view_mut(),
            d_weights: dw.view_mut(),
            d_index_k: dk.view_mut(),
            workspace: Some(ws.as_view_mut()),
        };
        plan.execute(stream, &inputs, &mut outputs, x.loss_coeff)?;
    }
    out.finish(stream, &score)
}
