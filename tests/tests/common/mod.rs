//! Proptest strategies the GPU property suites share (each suite uses
//! some of them).
#![allow(dead_code)]

use dsa_indexer_bwd::{GradDtype, KeyIds, Options, ScoreKind, Shape};
use proptest::prelude::*;
use std::ops::RangeInclusive;

/// Shapes of B in 1..=3, H from `heads`, D from `dims` and the other sizes
/// in the ranges.
pub fn shapes(
    heads: Vec<usize>,
    dims: Vec<usize>,
    seq_q: RangeInclusive<usize>,
    seq_k: RangeInclusive<usize>,
    topk: RangeInclusive<usize>,
) -> impl Strategy<Value = Shape> {
    (
        1usize..=3,
        seq_q,
        seq_k,
        prop::sample::select(heads),
        prop::sample::select(dims),
        topk,
    )
        .prop_map(|(batch, seq_q, seq_k, heads, head_dim, topk)| Shape {
            batch,
            seq_q,
            seq_k,
            heads,
            head_dim,
            topk,
        })
}

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
