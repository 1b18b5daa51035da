//! One dense problem held on the host: computed on the CPU (dense mode has
//! no GPU kernel yet).

use super::cpu::{self, HostInputs, HostOutputs};
use super::shape::Shape;
use crate::cpu::{try_vec, Progress};
use crate::error::Result;
use crate::oneshot::{GradVec, HostResult};
use crate::shape::Options;
use half::bf16;

/// Runs the dense backward on host data and returns the outputs
/// (`grad_signal` is what `index_score` holds afterwards, `(rows, cols)`).
///
/// Today this always runs the CPU fallback ([`cpu::execute`]) and
/// `backend` is `"cpu"`: dense mode has no GPU kernel yet. `allow_gpu` is
/// there so that callers need not change when it gets one; it has no
/// effect now.
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
    _allow_gpu: bool,
    progress: &mut dyn FnMut(Progress),
) -> Result<HostResult> {
    cpu::validate_host(shape, opts, x)?;
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
