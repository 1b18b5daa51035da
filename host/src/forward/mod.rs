//! The forward: the indexer's score at each query row's selected slots,
//! the input the backward consumes as `index_score` (`docs/spec.md`,
//! "Forward").
//!
//! - Sparse ([`Plan`], [`cpu::execute`]): `logit[b,s,t] = sum_h w[b,s,h] *
//!   relu(sm_scale * q[b,s,h,:] . k[n_t,:])` over the row's valid slots,
//!   then its softmax: `index_score (B, S_q, topk)` as probabilities (0 at
//!   padding) or log-probabilities (`-inf` at padding), and `lse (B,
//!   S_q)`, each row's log-sum-exp (`-inf` for a row without a valid
//!   slot). Ids as in the backward: either convention, i32 or i64, any
//!   invalid id padding.
//! - Dense ([`DensePlan`], [`cpu::dense_execute`]): the raw logits over
//!   each row's visible causal keys (0 past them) and their log-sum-exp:
//!   exactly dense mode's `index_score` and `index_lse`.
//!
//! On compute capability 9.0 the plans run the wgmma kernel (every H x D
//! of the envelope); other GPUs of compute capability 9.0 or newer run the
//! portable kernel ([`Kernel::Portable`] asks for it anywhere). Both write
//! bitwise reproducible outputs and allocate nothing per call.

pub mod cpu;
mod plan;

pub use plan::{DenseInputs, DenseOutputs, DensePlan, Inputs, Outputs, Plan, RawDense, RawForward};

use crate::error::{Error, Result};
use crate::shape::{check_finite, KeyIds, ScoreKind, Shape};

/// Which forward kernel a plan runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kernel {
    /// The fastest for the GPU: the wgmma kernel on compute capability 9.0,
    /// the portable kernel elsewhere.
    #[default]
    Auto,
    /// The portable kernel (no tensor cores) on every GPU: what GPUs
    /// without a wgmma module run, for tests and comparison.
    Portable,
}

/// Options of a forward plan.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Options {
    /// Scale applied to `q . k` (finite).
    pub sm_scale: f32,
    /// Key-id convention (sparse only).
    pub key_ids: KeyIds,
    /// Probabilities or log-probabilities in `index_score` (sparse only;
    /// dense mode writes raw logits).
    pub score: ScoreKind,
    /// The kernel.
    pub kernel: Kernel,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            sm_scale: 1.0,
            key_ids: KeyIds::Global,
            score: ScoreKind::Probs,
            kernel: Kernel::Auto,
        }
    }
}

impl Options {
    /// Checks that `sm_scale` is finite.
    pub fn validate(&self) -> Result<()> {
        check_finite("sm_scale", self.sm_scale)
    }
}

/// The sparse envelope: the backward's ([`Shape::validate`]) and one CTA
/// per query row.
pub(crate) fn validate_shape(shape: &Shape) -> Result<()> {
    shape.validate()?;
    if !kernels_gpu::portable::forward::supports(shape.rows() as u64, shape.topk as u64) {
        return Err(Error::Shape {
            name: "batch * seq_q",
            value: shape.rows(),
            expected: "<= 2^31 - 1 query rows",
        });
    }
    Ok(())
}
