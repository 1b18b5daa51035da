//! Problem shape and options of a plan, and the envelope checks.

use crate::error::{Error, Result};
use kernels_gpu::registry::{SUPPORTED_DIMS, SUPPORTED_HEADS};

/// Sizes of one problem. All tensors are dense row-major.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Batch size B (packed variable-length batches: B = 1 with global ids).
    pub batch: usize,
    /// Query rows per batch, S_q.
    pub seq_q: usize,
    /// Key rows per batch, S_k.
    pub seq_k: usize,
    /// Indexer heads H: 16, 32, 64 or 128.
    pub heads: usize,
    /// Head dimension D: 64 or 128.
    pub head_dim: usize,
    /// Selected keys per query row.
    pub topk: usize,
}

impl Shape {
    /// Deterministic mode's workspace layout for this shape (the key rows
    /// `B * S_k`, the query rows, D).
    pub(crate) fn det_layout(&self) -> kernels_gpu::abi::DetLayout {
        kernels_gpu::abi::det_layout(
            (self.batch * self.seq_k) as u64,
            self.rows() as u64,
            self.head_dim as u64,
        )
    }

    /// Query rows over all batches, `B * S_q`.
    pub fn rows(&self) -> usize {
        self.batch * self.seq_q
    }
    /// Elements of `index_q` / `d_index_q`.
    pub fn q_len(&self) -> usize {
        self.rows() * self.heads * self.head_dim
    }
    /// Elements of `weights` / `d_weights`.
    pub fn w_len(&self) -> usize {
        self.rows() * self.heads
    }
    /// Elements of `index_k` / `d_index_k`.
    pub fn k_len(&self) -> usize {
        self.batch * self.seq_k * self.head_dim
    }
    /// Elements of `attn_score`, `index_score`, `topk_indices`.
    pub fn slots(&self) -> usize {
        self.rows() * self.topk
    }

    /// Checks the envelope: every size >= 1, `heads` in {16, 32, 64, 128},
    /// `head_dim` in {64, 128}, and sizes the kernels' 32-bit indices hold.
    pub fn validate(&self) -> Result<()> {
        let shape_err = |name, value, expected| {
            Err(Error::Shape {
                name,
                value,
                expected,
            })
        };
        for (name, v) in [
            ("batch", self.batch),
            ("seq_q", self.seq_q),
            ("seq_k", self.seq_k),
            ("topk", self.topk),
        ] {
            if v == 0 {
                return shape_err(name, v, ">= 1");
            }
        }
        if !SUPPORTED_HEADS.iter().any(|&h| h as usize == self.heads) {
            return shape_err("heads", self.heads, "one of 16, 32, 64, 128");
        }
        if !SUPPORTED_DIMS.iter().any(|&d| d as usize == self.head_dim) {
            return shape_err("head_dim", self.head_dim, "64 or 128");
        }
        let max = i32::MAX as usize;
        // One CTA per query row (grid.x), key rows addressed by i32 ids.
        let rows = self.batch.checked_mul(self.seq_q).filter(|&r| r <= max);
        if rows.is_none() {
            return shape_err(
                "batch * seq_q",
                self.batch.saturating_mul(self.seq_q),
                "<= 2^31 - 1",
            );
        }
        if self
            .batch
            .checked_mul(self.seq_k)
            .filter(|&r| r <= max)
            .is_none()
        {
            return shape_err(
                "batch * seq_k",
                self.batch.saturating_mul(self.seq_k),
                "<= 2^31 - 1",
            );
        }
        if self.topk > u32::MAX as usize {
            return shape_err("topk", self.topk, "<= 2^32 - 1");
        }
        let sizes = [
            self.rows().checked_mul(self.topk),
            self.rows().checked_mul(self.heads * self.head_dim),
            (self.batch * self.seq_k).checked_mul(self.head_dim * 4),
        ];
        if sizes
            .iter()
            .any(|s| s.is_none_or(|v| v > isize::MAX as usize))
        {
            return shape_err("tensor size", usize::MAX, "addressable");
        }
        Ok(())
    }
}

/// How `topk_indices` address keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KeyIds {
    /// An id is a row of the flat `(B*S_k, D)` view; valid iff `0 <= id < B*S_k`.
    #[default]
    Global,
    /// An id is a row of its own batch; valid iff `0 <= id < S_k`.
    Local,
}

/// What `index_score` holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ScoreKind {
    /// Probabilities.
    #[default]
    Probs,
    /// Log-probabilities.
    LogProbs,
}

/// Element type of a gradient output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GradDtype {
    /// 32-bit float.
    F32,
    /// bfloat16.
    Bf16,
}

impl GradDtype {
    /// Bytes per element.
    pub const fn bytes(self) -> usize {
        match self {
            GradDtype::F32 => 4,
            GradDtype::Bf16 => 2,
        }
    }

    /// Name used in error messages.
    pub fn name(self) -> &'static str {
        match self {
            GradDtype::F32 => "f32",
            GradDtype::Bf16 => "bf16",
        }
    }
}

/// Which kernels a plan runs on the GPU.
///
/// The Blackwell path (tcgen05, tensor memory, TMA gather4; `sm_100f` PTX)
/// is **compiled and assembled, not executed**: no sm_100-family GPU has
/// been available to run it. It is therefore used only when asked for:
/// `Options { backend: Backend::Blackwell, .. }`. [`Backend::Auto`] sends a
/// GPU to it only if that compute capability is listed in
/// [`crate::TCGEN05_VALIDATED`] (a recorded hardware validation; none
/// today). The full table is in [`crate::select()`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// The kernels tested on the H200: on sm_90 (9.0) the wgmma fast path
    /// or the `mma.sync` row kernels by shape, on every other supported GPU
    /// the `mma.sync` row kernels (every module holds them; the same source,
    /// compiled for that GPU's module, not run there so far); the tcgen05
    /// kernels only on a compute capability listed in
    /// [`crate::TCGEN05_VALIDATED`] (none today), for a shape they take
    /// (H in {32, 64}, D = 128, topk in {128, 256, 384}).
    #[default]
    Auto,
    /// The Hopper kernels: on sm_90 the wgmma fast path (stage-1 launch,
    /// then the persistent warpgroup-MMA kernel as its programmatic
    /// dependent) for every H x D at topk > 64, and the `mma.sync` row
    /// kernels (one CTA per query row) at topk <= 64; on every
    /// other GPU the `mma.sync` row kernels.
    Hopper,
    /// Opt-in to the persistent tcgen05 kernels (stage 1 and stage 2 with
    /// programmatic dependent launch), compiled but never executed. Plan
    /// creation fails with [`Error::BackendUnavailable`] on a GPU other than
    /// 10.0 / 10.3 (B200/GB200, B300/GB300) or a shape outside the
    /// specializations.
    Blackwell,
}

impl Backend {
    /// Name used in error messages.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Hopper => "hopper (mma.sync row kernels)",
            Backend::Blackwell => "blackwell (tcgen05)",
        }
    }
}

/// Options fixed when a plan is built.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Options {
    /// Scale applied to `q . k` (finite).
    pub sm_scale: f32,
    /// Key-id convention.
    pub key_ids: KeyIds,
    /// Probabilities or log-probabilities in `index_score`.
    pub score: ScoreKind,
    /// Element type of `d_index_k` (accumulation is f32 either way).
    pub d_index_k: GradDtype,
    /// Element type of `d_weights`.
    pub d_weights: GradDtype,
    /// Kernel path (default [`Backend::Auto`]: the tested kernels for the
    /// GPU; `Backend::Blackwell` opts in to the unexecuted tcgen05 path).
    pub backend: Backend,
    /// Deterministic mode: every output bitwise the same from run to run
    /// (`d_index_k` accumulated in fixed point, `kernels_gpu::det`; the
    /// other outputs are reproducible in either mode). Runs on the Hopper
    /// fast path (compute capability 9.0, `topk > 64`) and on the CPU;
    /// elsewhere, and in dense mode, `Plan::new` returns
    /// [`crate::Error::NotImplemented`]. Needs a workspace
    /// ([`crate::Plan::workspace_bytes`]) whatever `d_index_k`'s type.
    pub deterministic: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            sm_scale: 1.0,
            key_ids: KeyIds::Global,
            score: ScoreKind::Probs,
            d_index_k: GradDtype::F32,
            d_weights: GradDtype::Bf16,
            backend: Backend::Auto,
            deterministic: false,
        }
    }
}

impl Options {
    /// Checks that the scalars are finite.
    pub fn validate(&self) -> Result<()> {
        check_finite("sm_scale", self.sm_scale)
    }

    /// The resolved key row of slot id `id` in batch `b`, or `None` for padding.
    pub fn resolve(&self, shape: &Shape, b: usize, id: i32) -> Option<usize> {
        let id = usize::try_from(id).ok()?;
        match self.key_ids {
            KeyIds::Global => (id < shape.batch * shape.seq_k).then_some(id),
            KeyIds::Local => (id < shape.seq_k).then_some(b * shape.seq_k + id),
        }
    }
}

/// Fails with [`Error::NonFinite`] unless `v` is finite.
pub fn check_finite(name: &'static str, v: f32) -> Result<()> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(Error::NonFinite { name, value: v })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            batch: 2,
            seq_q: 3,
            seq_k: 5,
            heads: 16,
            head_dim: 64,
            topk: 7,
        }
    }

    #[test]
    fn envelope_is_enforced() {
        assert!(shape().validate().is_ok());
        for (h, d) in [(48, 64), (16, 96), (8, 64), (256, 128)] {
            let s = Shape {
                heads: h,
                head_dim: d,
                ..shape()
            };
            assert!(matches!(s.validate(), Err(Error::Shape { .. })), "{h}x{d}");
        }
        for s in [
            Shape {
                batch: 0,
                ..shape()
            },
            Shape { topk: 0, ..shape() },
            Shape {
                seq_k: 0,
                ..shape()
            },
        ] {
            assert!(matches!(s.validate(), Err(Error::Shape { value: 0, .. })));
        }
        let big = Shape {
            batch: 1 << 20,
            seq_k: 1 << 12,
            ..shape()
        };
        assert!(matches!(
            big.validate(),
            Err(Error::Shape {
                name: "batch * seq_k",
                ..
            })
        ));
    }

    #[test]
    fn ids_resolve_per_convention_and_local_never_aliases() {
        let s = shape();
        let g = Options::default();
        let l = Options {
            key_ids: KeyIds::Local,
            ..g
        };
        assert_eq!(g.resolve(&s, 1, 7), Some(7));
        assert_eq!(g.resolve(&s, 1, 10), None);
        assert_eq!(g.resolve(&s, 0, -1), None);
        assert_eq!(l.resolve(&s, 1, 4), Some(9));
        assert_eq!(
            l.resolve(&s, 0, 5),
            None,
            "local id S_k must not alias batch 1"
        );
        assert_eq!(l.resolve(&s, 1, i32::MIN), None);
    }
}
