//! Proptest strategies the GPU property suites share.

use dsa_indexer_bwd::{GradDtype, KeyIds, Options, ScoreKind};
use proptest::prelude::*;

/// Options with `sm_scale` from `scales` and every id convention, score
/// kind and output type, in deterministic mode when `deterministic`.
pub fn options(scales: Vec<f32>, deterministic: bool) -> impl Strategy<Value = Options> {
    (
        prop::sample::select(scales),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(move |(sm_scale, local, log, dk_bf16, dw_f32)| Options {
            sm_scale,
            key_ids: if local { KeyIds::Local } else { KeyIds::Global },
            score: if log {
                ScoreKind::LogProbs
            } else {
                ScoreKind::Probs
            },
            d_index_k: if dk_bf16 {
                GradDtype::Bf16
            } else {
                GradDtype::F32
            },
            d_weights: if dw_f32 {
                GradDtype::F32
            } else {
                GradDtype::Bf16
            },
            deterministic,
            ..Options::default()
        })
}
