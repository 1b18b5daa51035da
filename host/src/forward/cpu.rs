//! The forward on the host: the f64 reference (the test oracle) and the
//! fallback [`execute`] / [`dense_execute`] where no GPU is present.
//! Multi-threaded over query rows; results do not depend on the number of
//! threads.
//!
//! Per query row, over its valid slots in slot order (dense: its visible
//! columns): `logit = sum_h w[h] * [s > 0] * s` with `s = sm_scale * q[h,:]
//! . k[n,:]` (a NaN `s` closes the gate, as in the backward), then the
//! row's normaliser as the kernels keep it (`kernels_gpu::portable::forward::Lse`:
//! a logit of `-inf` adds no mass; a NaN or `+inf` one makes the
//! log-sum-exp NaN), `lse = m + ln(s)`, and the outputs
//! (`kernels_gpu::portable::forward::output`). So both paths make the same outputs
//! non-finite.

use super::Options;
use crate::args::TopkId;
use crate::cpu::{check_lengths, threads_for, try_vec};
use crate::dense;
use crate::error::Result;
use crate::shape::{ScoreKind, Shape};
use half::bf16;

/// Host-side inputs of the sparse forward (dense row-major, shapes as in
/// the spec): `index_q (B, S_q, H, D)`, `weights (B, S_q, H)`, `index_k
/// (B, S_k, D)`, `topk_indices (B, S_q, topk)` as i32 or i64.
#[derive(Clone, Copy, Debug)]
pub struct HostInputs<'a, I = i32> {
    /// `(B, S_q, H, D)`.
    pub index_q: &'a [bf16],
    /// `(B, S_q, H)`.
    pub weights: &'a [bf16],
    /// `(B, S_k, D)`.
    pub index_k: &'a [bf16],
    /// `(B, S_q, topk)`.
    pub topk_indices: &'a [I],
}

/// Host-side inputs of the dense forward: `index_q (rows, H, D)`,
/// `weights (rows, H)`, `index_k (key rows, D)` in the dense shape's
/// layout.
#[derive(Clone, Copy, Debug)]
pub struct DenseHostInputs<'a> {
    /// `(rows, H, D)`.
    pub index_q: &'a [bf16],
    /// `(rows, H)`.
    pub weights: &'a [bf16],
    /// `(key rows, D)`.
    pub index_k: &'a [bf16],
}

/// The reference's outputs in f64.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scores {
    /// `(rows, cols)`: probabilities, log-probabilities or (dense) raw
    /// logits.
    pub score: Vec<f64>,
    /// `(rows,)`: each row's log-sum-exp (`-inf` without a valid slot).
    pub lse: Vec<f64>,
}

/// A running normaliser in f64 under the kernels' rules
/// (`kernels_gpu::portable::forward::Lse`).
#[derive(Clone, Copy)]
struct Lse {
    m: f64,
    s: f64,
}

impl Lse {
    const EMPTY: Lse = Lse {
        m: f64::NEG_INFINITY,
        s: 0.0,
    };
    fn push(&mut self, x: f64) {
        if x == f64::NEG_INFINITY {
            return;
        }
        if self.m == f64::NEG_INFINITY && self.s == 0.0 {
            *self = Lse { m: x, s: 1.0 };
            return;
        }
        let m = if x > self.m || self.m.is_nan() {
            x
        } else {
            self.m
        };
        self.s = self.s * (self.m - m).exp() + (x - m).exp();
        self.m = m;
    }
    fn value(&self) -> f64 {
        self.m + self.s.ln()
    }
}

/// One query row: its q (`H x D`), weights, and the key row of each slot
/// (`None`: padding).
struct RowWork<'a> {
    q: &'a [bf16],
    w: &'a [bf16],
    keys: &'a mut dyn Iterator<Item = Option<usize>>,
}

/// The row's outputs into `score` (its `cols` slots) and its lse.
fn row(
    x: RowWork<'_>,
    k: &[bf16],
    d: usize,
    opts: &Options,
    dense: bool,
    score: &mut [f64],
) -> f64 {
    let h = x.w.len();
    let sm = opts.sm_scale as f64;
    let mut lse = Lse::EMPTY;
    let mut keys: Vec<Option<usize>> = Vec::with_capacity(score.len());
    for (t, key) in x.keys.enumerate() {
        keys.push(key);
        let Some(n) = key else { continue };
        let kr = &k[n * d..(n + 1) * d];
        let mut l = 0.0f64;
        for hh in 0..h {
            let qh = &x.q[hh * d..(hh + 1) * d];
            let dot: f64 = qh
                .iter()
                .zip(kr)
                .map(|(a, b)| a.to_f64() * b.to_f64())
                .sum();
            let s = sm * dot;
            if s > 0.0 {
                l += x.w[hh].to_f64() * s;
            }
        }
        score[t] = l;
        lse.push(l);
    }
    let v = lse.value();
    let log = opts.score == ScoreKind::LogProbs;
    for (t, out) in score.iter_mut().enumerate() {
        let valid = keys.get(t).copied().flatten().is_some();
        *out = match (dense, valid, log) {
            (true, true, _) => *out,
            (true, false, _) => 0.0,
            (false, true, true) => *out - v,
            (false, true, false) => (*out - v).exp(),
            (false, false, true) => f64::NEG_INFINITY,
            (false, false, false) => 0.0,
        };
    }
    v
}

/// Checks the host inputs of the sparse forward against `shape`.
fn validate<I>(shape: &Shape, opts: &Options, x: &HostInputs<'_, I>) -> Result<()> {
    super::validate_shape(shape)?;
    opts.validate()?;
    check_lengths(&[
        ("index_q", shape.q_len(), x.index_q.len()),
        ("weights", shape.w_len(), x.weights.len()),
        ("index_k", shape.k_len(), x.index_k.len()),
        ("topk_indices", shape.slots(), x.topk_indices.len()),
    ])
}

/// Runs `f(r, score_row) -> lse` over every row on up to the machine's
/// threads (results independent of the split).
fn rows(
    n_rows: usize,
    cols: usize,
    f: &(dyn Fn(usize, &mut [f64]) -> f64 + Sync),
) -> Result<Scores> {
    let mut score = try_vec(n_rows * cols, 0.0f64, "forward scores")?;
    let mut lse = try_vec(n_rows, 0.0f64, "forward lse")?;
    let threads = threads_for(n_rows);
    let per = n_rows.div_ceil(threads).max(1);
    std::thread::scope(|sc| {
        for (i, (s_blk, l_blk)) in score
            .chunks_mut(per * cols.max(1))
            .zip(lse.chunks_mut(per))
            .enumerate()
        {
            sc.spawn(move || {
                for (j, l) in l_blk.iter_mut().enumerate() {
                    let r = i * per + j;
                    *l = f(r, &mut s_blk[j * cols..(j + 1) * cols]);
                }
            });
        }
    });
    Ok(Scores { score, lse })
}

/// The f64 reference of the sparse forward (`docs/spec.md`, "Forward").
pub fn reference<I: TopkId>(
    shape: &Shape,
    opts: &Options,
    x: &HostInputs<'_, I>,
) -> Result<Scores> {
    validate(shape, opts, x)?;
    let (h, d, topk) = (shape.heads, shape.head_dim, shape.topk);
    let key_opts = crate::shape::Options {
        key_ids: opts.key_ids,
        ..crate::shape::Options::default()
    };
    rows(shape.rows(), topk, &|r, out| {
        let b = r / shape.seq_q;
        let ids = &x.topk_indices[r * topk..(r + 1) * topk];
        let mut keys = ids.iter().map(|id| key_opts.resolve(shape, b, id.narrow()));
        let work = RowWork {
            q: &x.index_q[r * h * d..(r + 1) * h * d],
            w: &x.weights[r * h..(r + 1) * h],
            keys: &mut keys,
        };
        row(work, x.index_k, d, opts, false, out)
    })
}

/// The sparse forward on the host: [`reference()`] rounded to f32 into
/// `index_score (B, S_q, topk)` and `lse (B, S_q)`. Everything is checked
/// before the first write.
pub fn execute<I: TopkId>(
    shape: &Shape,
    opts: &Options,
    x: &HostInputs<'_, I>,
    index_score: &mut [f32],
    lse: &mut [f32],
) -> Result<()> {
    validate(shape, opts, x)?;
    check_out(index_score.len(), shape.slots(), lse.len(), shape.rows())?;
    let r = reference(shape, opts, x)?;
    write(&r, index_score, lse);
    Ok(())
}

/// Checks the host inputs of the dense forward against `shape`.
fn validate_dense(shape: &dense::Shape, opts: &Options, x: &DenseHostInputs<'_>) -> Result<()> {
    shape.validate()?;
    opts.validate()?;
    let (h, d) = (shape.heads, shape.head_dim);
    check_lengths(&[
        ("index_q", shape.rows() * h * d, x.index_q.len()),
        ("weights", shape.rows() * h, x.weights.len()),
        ("index_k", shape.key_rows() * d, x.index_k.len()),
    ])
}

/// The f64 reference of the dense forward: raw logits over each row's
/// visible columns (0 beyond) and their log-sum-exp.
pub fn dense_reference(
    shape: &dense::Shape,
    opts: &Options,
    x: &DenseHostInputs<'_>,
) -> Result<Scores> {
    validate_dense(shape, opts, x)?;
    let (h, d, cols) = (shape.heads, shape.head_dim, shape.score_cols());
    rows(shape.rows(), cols, &|r, out| {
        let at = shape.row(r);
        let mut keys = (0..cols).map(|j| (j < at.visible).then_some(at.key_start + j));
        let work = RowWork {
            q: &x.index_q[r * h * d..(r + 1) * h * d],
            w: &x.weights[r * h..(r + 1) * h],
            keys: &mut keys,
        };
        row(work, x.index_k, d, opts, true, out)
    })
}

/// The dense forward on the host: [`dense_reference`] rounded to f32 into
/// `index_score (rows, score_cols)` and `index_lse (rows,)`.
pub fn dense_execute(
    shape: &dense::Shape,
    opts: &Options,
    x: &DenseHostInputs<'_>,
    index_score: &mut [f32],
    index_lse: &mut [f32],
) -> Result<()> {
    validate_dense(shape, opts, x)?;
    check_out(
        index_score.len(),
        shape.score_len(),
        index_lse.len(),
        shape.rows(),
    )?;
    let r = dense_reference(shape, opts, x)?;
    write(&r, index_score, index_lse);
    Ok(())
}

fn check_out(score: usize, want_score: usize, lse: usize, want_lse: usize) -> Result<()> {
    check_lengths(&[("index_score", want_score, score), ("lse", want_lse, lse)])
}

fn write(r: &Scores, score: &mut [f32], lse: &mut [f32]) {
    for (o, v) in score.iter_mut().zip(&r.score) {
        *o = *v as f32;
    }
    for (o, v) in lse.iter_mut().zip(&r.lse) {
        *o = *v as f32;
    }
}
