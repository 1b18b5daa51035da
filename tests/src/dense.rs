//! Random dense-mode problems, and the sparse problem each one equals
//! (the oracle of the dense CPU path is the sparse CPU reference on it).

use crate::{
    f32_ref_errors, gpu_errors, same_bits, tolerances, within_bounds, Errors, Floors, GpuOut,
};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use dsa_indexer_bwd::dense::{self, cpu::HostInputs};
use dsa_indexer_bwd::{bf16, GradDtype, GradOut, KeyIds, Options, ScoreKind, Shape};
use rand::Rng;
use std::sync::Arc;

/// Logits are multiples of this (and stay within +-2^12 of the row's lse),
/// so `logit - lse` is exact in f32: the sparse equivalent can hold it as
/// a log-probability without rounding.
pub const LOGIT_STEP: f32 = 1.0 / 1024.0;

/// One random dense problem on the host.
#[derive(Clone, Debug)]
pub struct DenseProblem {
    pub shape: dense::Shape,
    pub opts: Options,
    pub q: Vec<bf16>,
    pub w: Vec<bf16>,
    pub k: Vec<bf16>,
    /// `(rows, cols)` attention mass; NaN at every column a row does not
    /// see (never read).
    pub attn: Vec<f32>,
    /// `(rows,)` row sums of `attn` over the visible columns.
    pub l1: Vec<f32>,
    /// `(rows, cols)` logits, multiples of [`LOGIT_STEP`]; NaN at every
    /// column a row does not see.
    pub logits: Vec<f32>,
    /// `(rows,)` log-sum-exp of the visible logits, rounded to a multiple
    /// of [`LOGIT_STEP`] (so predict rows sum to about 1).
    pub lse: Vec<f32>,
    pub grad_loss: f32,
    pub loss_coeff: f32,
}

fn bf(x: f32) -> bf16 {
    bf16::from_f32(x)
}

impl DenseProblem {
    /// Draws a problem for `shape`: q, w, k uniform in [-1, 1] (bf16),
    /// attention mass uniform in [0, 1) with about 10% zeros (targets
    /// clipped to CLIP), logits on the [`LOGIT_STEP`] grid within [-8, 8]
    /// with about `masked` of them 101 below the row's lse (masked columns).
    pub fn random(rng: &mut impl Rng, shape: dense::Shape, opts: Options, masked: f64) -> Self {
        let mut draw = |n: usize| -> Vec<bf16> {
            (0..n).map(|_| bf(rng.random_range(-1.0f32..1.0))).collect()
        };
        let (q, w, k) = (
            draw(shape.q_len()),
            draw(shape.w_len()),
            draw(shape.k_len()),
        );
        let (rows, cols) = (shape.rows(), shape.score_cols());
        let mut attn = vec![f32::NAN; rows * cols];
        let mut logits = vec![f32::NAN; rows * cols];
        let (mut l1, mut lse) = (vec![0.0f32; rows], vec![0.0f32; rows]);
        for (r, (_, l)) in spec_rows(&shape).into_iter().enumerate() {
            let (a, g) = (&mut attn[r * cols..][..l], &mut logits[r * cols..][..l]);
            for v in a.iter_mut() {
                *v = if rng.random_bool(0.1) {
                    0.0
                } else {
                    rng.random_range(0.0f32..1.0)
                };
            }
            for v in g.iter_mut() {
                *v = (rng.random_range(-8.0f32..8.0) / LOGIT_STEP).round() * LOGIT_STEP;
            }
            l1[r] = a.iter().map(|&v| v as f64).sum::<f64>() as f32;
            let m = g.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let s: f64 = g.iter().map(|&v| (v as f64 - m).exp()).sum();
            let exact = if l == 0 { 0.0 } else { m + s.ln() };
            lse[r] = ((exact as f32) / LOGIT_STEP).round() * LOGIT_STEP;
            for v in g.iter_mut() {
                if rng.random_bool(masked) {
                    *v = lse[r] - 101.0;
                }
            }
        }
        DenseProblem {
            shape,
            opts,
            q,
            w,
            k,
            attn,
            l1,
            logits,
            lse,
            grad_loss: rng.random_range(0.5f32..2.0),
            loss_coeff: rng.random_range(0.5f32..2.0),
        }
    }

    /// Host view of the inputs.
    pub fn host(&self) -> HostInputs<'_> {
        HostInputs {
            index_q: &self.q,
            weights: &self.w,
            index_k: &self.k,
            attn_score: &self.attn,
            attn_l1norm: &self.l1,
            index_score: &self.logits,
            index_lse: &self.lse,
            grad_loss: self.grad_loss,
            loss_coeff: self.loss_coeff,
        }
    }

    /// The sparse problem with the same outputs: `topk = cols`, slot `j` of
    /// a row holding key `j` of its batch for `j < L` and padding (-1)
    /// beyond; targets `attn / (l1 + 1e-10)` (rounded to f32, an inexact
    /// step); predicts as log-probabilities `logit - lse` (exact) with
    /// `-inf` in padding slots, or as probabilities `exp(logit - lse)`
    /// (rounded to f32) with 0 there (masked, predict 0: padding adds
    /// nothing to `G`).
    /// BSHD keeps its batches (ids global or local by `key_ids`); a packed
    /// problem becomes one batch of `T_q` rows with global ids.
    pub fn to_sparse(&self, key_ids: KeyIds, score_kind: ScoreKind) -> SparseEquivalent {
        let s = &self.shape;
        let (rows, cols) = (s.rows(), s.score_cols());
        let shape = match &s.layout {
            dense::Layout::Bshd {
                batch,
                seq_q,
                seq_k,
            } => Shape {
                batch: *batch,
                seq_q: *seq_q,
                seq_k: *seq_k,
                heads: s.heads,
                head_dim: s.head_dim,
                topk: cols,
            },
            dense::Layout::Varlen { .. } => Shape {
                batch: 1,
                seq_q: rows,
                seq_k: s.key_rows(),
                heads: s.heads,
                head_dim: s.head_dim,
                topk: cols,
            },
        };
        let local = key_ids == KeyIds::Local && matches!(s.layout, dense::Layout::Bshd { .. });
        let mut target = vec![0.0f32; rows * cols];
        let pad = match score_kind {
            ScoreKind::LogProbs => f32::NEG_INFINITY,
            ScoreKind::Probs => 0.0,
        };
        let mut score = vec![pad; rows * cols];
        let mut ids = vec![-1i32; rows * cols];
        for (r, (key_start, visible)) in spec_rows(s).into_iter().enumerate() {
            let denom = self.l1[r] as f64 + 1e-10;
            for j in 0..visible {
                let i = r * cols + j;
                target[i] = (self.attn[i] as f64 / denom) as f32;
                let lp = self.logits[i] - self.lse[r];
                score[i] = match score_kind {
                    ScoreKind::LogProbs => lp,
                    ScoreKind::Probs => (lp as f64).exp() as f32,
                };
                ids[i] = (if local { j } else { key_start + j }) as i32;
            }
        }
        SparseEquivalent {
            shape,
            opts: Options {
                key_ids: if local { KeyIds::Local } else { KeyIds::Global },
                score: score_kind,
                ..self.opts
            },
            target,
            score,
            ids,
        }
    }
}

/// Per query row: the first key row of its batch and its visible key
/// count, written out from SPEC's rule without [`dense::Shape::row`], so
/// that tests comparing against it also check the library's row mapping:
/// `L = min((q_offset[b] + s + 1) / ratio, S_k(b))`, 0 when
/// `q_offset[b] + s + 1 <= 0`.
pub fn spec_rows(s: &dense::Shape) -> Vec<(usize, usize)> {
    // (query rows, key rows) per batch.
    let batches: Vec<(usize, usize)> = match &s.layout {
        dense::Layout::Bshd {
            batch,
            seq_q,
            seq_k,
        } => vec![(*seq_q, *seq_k); *batch],
        dense::Layout::Varlen {
            cu_seqlens_q,
            cu_seqlens_k,
            ..
        } => cu_seqlens_q
            .windows(2)
            .zip(cu_seqlens_k.windows(2))
            .map(|(q, k)| (q[1] - q[0], k[1] - k[0]))
            .collect(),
    };
    let mut out = Vec::new();
    let mut key_start = 0;
    for (b, &(sq, sk)) in batches.iter().enumerate() {
        let off = s.q_offset.get(b).copied().unwrap_or(0);
        for pos in 0..sq {
            let num = off + pos as i64 + 1;
            let l = if num <= 0 {
                0
            } else {
                ((num as usize) / s.ratio).min(sk)
            };
            out.push((key_start, l));
        }
        key_start += sk;
    }
    out
}

/// The sparse form of a [`DenseProblem`] ([`DenseProblem::to_sparse`]);
/// q, w, k are the dense problem's.
#[derive(Clone, Debug)]
pub struct SparseEquivalent {
    pub shape: Shape,
    pub opts: Options,
    pub target: Vec<f32>,
    pub score: Vec<f32>,
    pub ids: Vec<i32>,
}

impl SparseEquivalent {
    /// Host view, with q, w, k and the scalars from `p`.
    pub fn host<'a>(&'a self, p: &'a DenseProblem) -> dsa_indexer_bwd::cpu::HostInputs<'a> {
        dsa_indexer_bwd::cpu::HostInputs {
            index_q: &p.q,
            weights: &p.w,
            index_k: &p.k,
            attn_score: &self.target,
            index_score: &self.score,
            topk_indices: &self.ids,
            grad_loss: p.grad_loss,
            loss_coeff: p.loss_coeff,
        }
    }
}

/// A [`DenseProblem`] on the device: inputs uploaded once, outputs of the
/// plan's types, a workspace of the plan's size.
pub struct DenseDevice {
    q: CudaSlice<bf16>,
    w: CudaSlice<bf16>,
    k: CudaSlice<bf16>,
    attn: CudaSlice<f32>,
    l1: CudaSlice<f32>,
    lse: CudaSlice<f32>,
    grad_loss: CudaSlice<f32>,
    score: CudaSlice<f32>,
    dq: CudaSlice<bf16>,
    dw_f32: CudaSlice<f32>,
    dw_bf16: CudaSlice<bf16>,
    dk_f32: CudaSlice<f32>,
    dk_bf16: CudaSlice<bf16>,
    ws: CudaSlice<u8>,
}

impl DenseDevice {
    /// Uploads `p` (logits into `index_score`) with a workspace of
    /// `ws_bytes` (at least 16).
    pub fn upload(stream: &Arc<CudaStream>, p: &DenseProblem, ws_bytes: usize) -> Self {
        Self::upload_host(stream, &p.shape, &p.host(), ws_bytes)
    }

    /// Uploads host tensors of `shape` (`x.index_score`, the logits, into
    /// `index_score`; `x.grad_loss` as the device's one f32) with a
    /// workspace of `ws_bytes` (at least 16); outputs of both element types
    /// zeroed. `x.loss_coeff` stays on the host (an `execute` argument).
    pub fn upload_host(
        stream: &Arc<CudaStream>,
        s: &dense::Shape,
        x: &HostInputs<'_>,
        ws_bytes: usize,
    ) -> Self {
        let f32s = |v: &[f32]| stream.clone_htod(v).unwrap();
        DenseDevice {
            q: stream.clone_htod(x.index_q).unwrap(),
            w: stream.clone_htod(x.weights).unwrap(),
            k: stream.clone_htod(x.index_k).unwrap(),
            attn: f32s(x.attn_score),
            l1: f32s(x.attn_l1norm),
            lse: f32s(x.index_lse),
            grad_loss: f32s(&[x.grad_loss]),
            score: f32s(x.index_score),
            dq: stream.alloc_zeros(s.q_len()).unwrap(),
            dw_f32: stream.alloc_zeros(s.w_len()).unwrap(),
            dw_bf16: stream.alloc_zeros(s.w_len()).unwrap(),
            dk_f32: stream.alloc_zeros(s.k_len()).unwrap(),
            dk_bf16: stream.alloc_zeros(s.k_len()).unwrap(),
            ws: stream.alloc_zeros(ws_bytes.max(16)).unwrap(),
        }
    }

    /// Puts the problem's logits back into `index_score` (execute writes
    /// grad_signal over them).
    pub fn reset_logits(&mut self, stream: &Arc<CudaStream>, p: &DenseProblem) {
        self.reset_index_score(stream, &p.logits);
    }

    /// Copies `logits` (`rows * cols` values) into `index_score`.
    pub fn reset_index_score(&mut self, stream: &Arc<CudaStream>, logits: &[f32]) {
        stream.memcpy_htod(logits, &mut self.score).unwrap();
    }

    /// Runs `plan.execute` on these buffers (the output types of the
    /// plan's options).
    pub fn execute(
        &mut self,
        plan: &dense::Plan,
        stream: &Arc<CudaStream>,
        loss_coeff: f32,
    ) -> dsa_indexer_bwd::Result<()> {
        let opts = *plan.options();
        let inputs = dense::Inputs {
            index_q: self.q.as_view(),
            weights: self.w.as_view(),
            index_k: self.k.as_view(),
            attn_score: self.attn.as_view(),
            attn_l1norm: self.l1.as_view(),
            index_lse: self.lse.as_view(),
            grad_loss: self.grad_loss.as_view(),
        };
        let mut outputs = dense::Outputs {
            index_score: self.score.as_view_mut(),
            d_index_q: self.dq.as_view_mut(),
            d_weights: match opts.d_weights {
                GradDtype::F32 => GradOut::F32(self.dw_f32.as_view_mut()),
                GradDtype::Bf16 => GradOut::Bf16(self.dw_bf16.as_view_mut()),
            },
            d_index_k: match opts.d_index_k {
                GradDtype::F32 => GradOut::F32(self.dk_f32.as_view_mut()),
                GradDtype::Bf16 => GradOut::Bf16(self.dk_bf16.as_view_mut()),
            },
            workspace: Some(self.ws.as_view_mut()),
        };
        plan.execute(stream, &inputs, &mut outputs, loss_coeff)
    }

    /// The device addresses of these buffers for `dense::Plan::execute_raw`
    /// with the output types of `opts` and `ws_bytes` of workspace (none
    /// when 0).
    pub fn raw(
        &self,
        stream: &Arc<CudaStream>,
        opts: &Options,
        ws_bytes: usize,
    ) -> dense::DenseRawBuffers {
        fn addr<T>(stream: &Arc<CudaStream>, s: &CudaSlice<T>) -> u64 {
            let (p, _guard) = s.device_ptr(stream);
            p
        }
        dense::DenseRawBuffers {
            index_q: addr(stream, &self.q),
            weights: addr(stream, &self.w),
            index_k: addr(stream, &self.k),
            attn_score: addr(stream, &self.attn),
            attn_l1norm: addr(stream, &self.l1),
            index_lse: addr(stream, &self.lse),
            grad_loss: addr(stream, &self.grad_loss),
            index_score: addr(stream, &self.score),
            d_index_q: addr(stream, &self.dq),
            d_weights: match opts.d_weights {
                GradDtype::F32 => addr(stream, &self.dw_f32),
                GradDtype::Bf16 => addr(stream, &self.dw_bf16),
            },
            d_index_k: match opts.d_index_k {
                GradDtype::F32 => addr(stream, &self.dk_f32),
                GradDtype::Bf16 => addr(stream, &self.dk_bf16),
            },
            workspace: if ws_bytes > 0 {
                addr(stream, &self.ws)
            } else {
                0
            },
            workspace_bytes: ws_bytes,
            d_weights_dtype: opts.d_weights,
            d_index_k_dtype: opts.d_index_k,
        }
    }

    /// The outputs (after the stream's work), widened as [`GpuOut`] holds
    /// them; `index_score_after` is the attention mass read back (it must
    /// be unchanged).
    pub fn download(&self, stream: &Arc<CudaStream>, opts: &Options) -> GpuOut {
        let widen_bf16 = |v: &CudaSlice<bf16>| -> Vec<bf16> { stream.clone_dtoh(v).unwrap() };
        let (d_weights, d_weights_bits) = match opts.d_weights {
            GradDtype::F32 => {
                let v = stream.clone_dtoh(&self.dw_f32).unwrap();
                (
                    v.iter().map(|&x| x as f64).collect(),
                    v.iter().map(|x| x.to_bits()).collect(),
                )
            }
            GradDtype::Bf16 => {
                let v = widen_bf16(&self.dw_bf16);
                (
                    v.iter().map(|x| x.to_f64()).collect(),
                    v.iter().map(|x| x.to_bits() as u32).collect(),
                )
            }
        };
        let d_index_k = match opts.d_index_k {
            GradDtype::F32 => stream
                .clone_dtoh(&self.dk_f32)
                .unwrap()
                .iter()
                .map(|&x| x as f64)
                .collect(),
            GradDtype::Bf16 => widen_bf16(&self.dk_bf16)
                .iter()
                .map(|x| x.to_f64())
                .collect(),
        };
        GpuOut {
            grad_signal: stream.clone_dtoh(&self.score).unwrap(),
            index_score_after: stream.clone_dtoh(&self.attn).unwrap(),
            d_index_q: widen_bf16(&self.dq),
            d_weights,
            d_index_k,
            d_weights_bits,
        }
    }
}

/// Checks dense GPU outputs against the f64 dense reference: SPEC's
/// tolerances, and at most 2x the error of the f32/bf16-dS reference (or
/// 2x `floors`); `attn_score` must be unchanged. Returns the errors, or
/// what failed.
pub fn compare_dense(p: &DenseProblem, out: &GpuOut, floors: Floors) -> Result<Errors, String> {
    let r = dense::cpu::reference(&p.shape, &p.opts, &p.host()).map_err(|e| e.to_string())?;
    let f = dense::cpu::reference_f32_bf16_ds(&p.shape, &p.opts, &p.host())
        .map_err(|e| e.to_string())?;
    let (e, e32) = (gpu_errors(out, &r), f32_ref_errors(&f, &r, &p.opts));
    let ctx = format!(
        "shape {:?} opts {:?}: gpu {e:?} f32-ref {e32:?}",
        p.shape, p.opts
    );
    within_bounds(&e, &e32, &tolerances(&p.opts), floors, &ctx)?;
    if !same_bits(&out.index_score_after, &p.attn) {
        return Err(format!("attn_score changed; {ctx}"));
    }
    Ok(e)
}
