//! CPU implementation of the dense backward: the f64 reference (test
//! oracle), an f32 variant that rounds dS to bf16 as a tensor-core kernel
//! would, and the fallback [`execute`]. Multi-threaded over query rows like
//! [`crate::cpu`]; results do not depend on the number of threads.
//!
//! Per query row `r` of batch `b` at position `s`, with `L` its visible
//! key count ([`Shape::visible`]), `key(j)` the key row of column `j`
//! (`key_start(b) + j`), `c = loss_coeff / rows * grad_loss`:
//!
//! - stage 1 over `j < L`:
//!   `target_j = max(attn_j / (l1 + 1e-10), CLIP)`,
//!   `predict_j = exp(logit_j - lse)`,
//!   `g_j = -target_j * [logit_j - lse >= -100] * c`,
//!   `G = sum_{j<L} g_j`,
//!   `grad_signal_j = g_j - predict_j * G`;
//!   `grad_signal_j = 0` for `j >= L`. A row with `L = 0` has an
//!   all-zero grad_signal and contributes nothing.
//! - stage 2: the sparse math of [`crate::cpu`] with slot `j` the key
//!   `key(j)` for `j < L` (no padding slots).
//!
//! Non-finite inputs are not scanned for and propagate as in
//! [`crate::cpu`] ("Non-finite inputs"): a NaN target is clipped, a NaN
//! `logit - lse` masks its column (and makes its own grad_signal NaN
//! through `predict * G`), closed gates still pass `0 * k` and `0 * q`.
//! Only columns `j < L` are read from `attn_score` and `index_score`.
//!
//! Memory: besides the f64 outputs (grad_signal is `rows x score_cols`), a
//! run holds the per-column dK partials of one block of rows (rows are
//! grouped until their visible columns fill 64 MiB, at least two rows per
//! thread).

use super::shape::Shape;
use crate::cpu::{run_queue, try_vec, F32Bf16Ds, Grads, HostGrad, Progress, Real, Tuning};
use crate::cpu::{HeadScratch, Keys, RowGrads};
use crate::error::{Error, Result};
use crate::shape::{check_finite, Options};
use half::bf16;

/// Host-side inputs of dense mode (all dense row-major). `rows` is `B *
/// S_q` (BSHD) or `T_q` (packed), `cols` is [`Shape::score_cols`].
#[derive(Clone, Copy, Debug)]
pub struct HostInputs<'a> {
    /// `(rows, H, D)`.
    pub index_q: &'a [bf16],
    /// `(rows, H)`.
    pub weights: &'a [bf16],
    /// `(key rows, D)`.
    pub index_k: &'a [bf16],
    /// `(rows, cols)`: non-negative attention mass (read only).
    pub attn_score: &'a [f32],
    /// `(rows,)`: row sums of `attn_score` (the target's normaliser).
    pub attn_l1norm: &'a [f32],
    /// `(rows, cols)`: raw indexer logits.
    pub index_score: &'a [f32],
    /// `(rows,)`: row log-sum-exp of the logits.
    pub index_lse: &'a [f32],
    /// Upstream gradient of the loss (read on the host: a NaN or an
    /// infinity is [`Error::NonFinite`]).
    pub grad_loss: f32,
    /// Loss coefficient (finite).
    pub loss_coeff: f32,
}

/// Host-side outputs of [`execute`].
#[derive(Debug)]
pub struct HostOutputs<'a> {
    /// `(rows, cols)`: receives grad_signal (0 at `j >= L`). The logits are
    /// read from [`HostInputs::index_score`]; a caller mirroring the GPU
    /// contract passes a copy of them here.
    pub index_score: &'a mut [f32],
    /// `(rows, H, D)`.
    pub d_index_q: &'a mut [bf16],
    /// `(rows, H)` in the options' `d_weights` type.
    pub d_weights: HostGrad<'a>,
    /// `(key rows, D)` in the options' `d_index_k` type.
    pub d_index_k: HostGrad<'a>,
}

/// Checks the shape, the options' scalars, `loss_coeff`, `grad_loss` and
/// the input lengths, in that order.
pub fn validate_host(shape: &Shape, opts: &Options, x: &HostInputs<'_>) -> Result<()> {
    shape.validate()?;
    opts.validate()?;
    check_finite("loss_coeff", x.loss_coeff)?;
    check_finite("grad_loss", x.grad_loss)?;
    let checks = [
        ("index_q", shape.q_len(), x.index_q.len()),
        ("weights", shape.w_len(), x.weights.len()),
        ("index_k", shape.k_len(), x.index_k.len()),
        ("attn_score", shape.score_len(), x.attn_score.len()),
        ("attn_l1norm", shape.rows(), x.attn_l1norm.len()),
        ("index_score", shape.score_len(), x.index_score.len()),
        ("index_lse", shape.rows(), x.index_lse.len()),
    ];
    crate::cpu::check_lengths(&checks)
}

/// The f64 reference of SPEC's dense math (the test oracle).
/// `grad_signal` is `(rows, cols)`.
pub fn reference(shape: &Shape, opts: &Options, x: &HostInputs<'_>) -> Result<Grads> {
    reference_with_progress(shape, opts, x, &mut |_| {})
}

/// [`reference()`], calling `progress` after each block of rows.
pub fn reference_with_progress(
    shape: &Shape,
    opts: &Options,
    x: &HostInputs<'_>,
    progress: &mut dyn FnMut(Progress),
) -> Result<Grads> {
    validate_host(shape, opts, x)?;
    compute::<f64>(shape, opts, x, Tuning::for_rows(shape.rows()), progress)
}

/// f32 computation that rounds dS to bf16 before the dQ/dK products, as
/// a tensor-core kernel does (the scale of the "within 2x" test bound).
pub fn reference_f32_bf16_ds(shape: &Shape, opts: &Options, x: &HostInputs<'_>) -> Result<Grads> {
    validate_host(shape, opts, x)?;
    compute::<F32Bf16Ds>(shape, opts, x, Tuning::for_rows(shape.rows()), &mut |_| {})
}

/// The CPU fallback of the dense backward (f64 math, outputs rounded once):
/// `out.index_score` <- grad_signal, `d_index_q`, `d_weights`,
/// `d_index_k` written. Everything is checked, and all memory allocated,
/// before anything is written: an error leaves every output untouched.
/// Outputs cannot overlap inputs here (the borrow rules forbid it).
pub fn execute(shape: &Shape, opts: &Options, x: &HostInputs<'_>, out: HostOutputs) -> Result<()> {
    execute_with_progress(shape, opts, x, out, &mut |_| {})
}

/// [`execute`], calling `progress` after each block of rows.
pub fn execute_with_progress(
    shape: &Shape,
    opts: &Options,
    x: &HostInputs<'_>,
    out: HostOutputs,
    progress: &mut dyn FnMut(Progress),
) -> Result<()> {
    validate_host(shape, opts, x)?;
    for (tensor, buf, want) in [
        ("d_weights", &out.d_weights, opts.d_weights),
        ("d_index_k", &out.d_index_k, opts.d_index_k),
    ] {
        if buf.dtype() != want {
            return Err(Error::Dtype {
                tensor,
                expected: want.name(),
                actual: buf.dtype().name(),
            });
        }
    }
    crate::cpu::check_lengths(&[
        ("index_score", shape.score_len(), out.index_score.len()),
        ("d_index_q", shape.q_len(), out.d_index_q.len()),
        ("d_weights", shape.w_len(), out.d_weights.len()),
        ("d_index_k", shape.k_len(), out.d_index_k.len()),
    ])?;
    let g = compute::<f64>(shape, opts, x, Tuning::for_rows(shape.rows()), progress)?;
    let HostOutputs {
        index_score,
        d_index_q,
        mut d_weights,
        mut d_index_k,
    } = out;
    index_score
        .iter_mut()
        .zip(&g.grad_signal)
        .for_each(|(o, &s)| *o = s as f32);
    d_index_q
        .iter_mut()
        .zip(&g.d_index_q)
        .for_each(|(o, &s)| *o = bf16::from_f64(s));
    d_weights.store(&g.d_weights);
    d_index_k.store(&g.d_index_k);
    Ok(())
}

/// What every row of a run reads.
struct Ctx<'a, T> {
    shape: &'a Shape,
    x: &'a HostInputs<'a>,
    cols: usize,
    clip: T,
    c: T,
    /// The key rows, for stage 2.
    keys: Keys<'a, T>,
}

/// One query row's outputs: grad_signal (`cols`, f64) and its stage-2
/// outputs, the dK partials of its visible columns (`L * D`).
struct RowOut<'a, T> {
    row: usize,
    gs: &'a mut [f64],
    grads: RowGrads<'a, T>,
}

/// Per-worker scratch (`cols` or `D` long).
struct Scratch<T> {
    g: Vec<T>,
    p: Vec<T>,
    gsig: Vec<T>,
    heads: HeadScratch<T>,
}

/// Stage 1 of one row over its `l` visible columns into `sc.gsig`.
fn score_grad<T: Real>(ctx: &Ctx<T>, row: usize, l: usize, sc: &mut Scratch<T>) {
    let x = ctx.x;
    let base = row * ctx.cols;
    let zero = T::default();
    let denom = T::of32(x.attn_l1norm[row]) + T::of(1e-10);
    let lse = T::of32(x.index_lse[row]);
    let floor = T::of(-100.0);
    let mut big_g = zero;
    for j in 0..l {
        let target = T::of32(x.attn_score[base + j]) / denom;
        // max(target, CLIP) with a NaN target clipped, as in the sparse path.
        let tmax = if target > ctx.clip { target } else { ctx.clip };
        let lp = T::of32(x.index_score[base + j]) - lse;
        sc.g[j] = if lp >= floor { -tmax * ctx.c } else { zero };
        sc.p[j] = lp.exp();
        big_g += sc.g[j];
    }
    for j in 0..l {
        sc.gsig[j] = sc.g[j] - sc.p[j] * big_g;
    }
}

fn compute_row<T: Real>(ctx: &Ctx<T>, o: RowOut<T>, sc: &mut Scratch<T>) {
    let (shape, x) = (ctx.shape, ctx.x);
    let (h_n, d_n) = (shape.heads, shape.head_dim);
    let row = o.row;
    let at = shape.row(row);
    let l = at.visible;
    score_grad(ctx, row, l, sc);
    for (j, v) in o.gs.iter_mut().enumerate() {
        *v = if j < l { sc.gsig[j].f64() } else { 0.0 };
    }
    // Stage 2: column j is key row key_start + j, no padding.
    ctx.keys.row(
        &x.index_q[row * h_n * d_n..(row + 1) * h_n * d_n],
        &x.weights[row * h_n..(row + 1) * h_n],
        &sc.gsig[..l],
        |j| Some(at.key_start + j),
        &mut sc.heads,
        o.grads,
    );
}

/// Blocks of consecutive rows `(r0, r1, partial elements)`: each holds at
/// least `min_rows` rows, and more while their visible columns' dK
/// partials fit in `budget` bytes.
fn blocks(
    shape: &Shape,
    min_rows: usize,
    budget: usize,
    elem: usize,
) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    let (mut r0, mut need) = (0, 0usize);
    for r in 0..shape.rows() {
        let n = shape.row(r).visible * shape.head_dim;
        if r - r0 >= min_rows && (need + n).saturating_mul(elem) > budget {
            out.push((r0, r, need));
            (r0, need) = (r, 0);
        }
        need += n;
    }
    out.push((r0, shape.rows(), need));
    out
}

/// The whole dense backward in `T`, in blocks of rows: the rows of a block
/// are shared among worker threads (each row computed by one thread), then
/// the block's dK partials are added into the f64 `d_index_k` in row and
/// column order by one thread. Results are bitwise independent of `tune`.
fn compute<T: Real>(
    shape: &Shape,
    opts: &Options,
    x: &HostInputs<'_>,
    tune: Tuning,
    progress: &mut dyn FnMut(Progress),
) -> Result<Grads> {
    let started = std::time::Instant::now();
    let (h_n, d_n, cols, rows) = (
        shape.heads,
        shape.head_dim,
        shape.score_cols(),
        shape.rows(),
    );
    let mut grad_signal = try_vec(shape.score_len(), 0.0f64, "grad_signal")?;
    let mut d_index_q = try_vec(shape.q_len(), 0.0f64, "d_index_q")?;
    let mut d_weights = try_vec(shape.w_len(), 0.0f64, "d_weights")?;
    let mut d_index_k = try_vec(shape.k_len(), 0.0f64, "d_index_k")?;
    let ctx = Ctx {
        shape,
        x,
        cols,
        clip: T::of((-100.0f64).exp()),
        c: T::of(x.loss_coeff as f64 / rows as f64) * T::of32(x.grad_loss),
        keys: Keys::new(x.index_k, shape.key_rows(), d_n, opts.sm_scale)?,
    };
    let threads = tune.threads.clamp(1, rows);
    let elem = std::mem::size_of::<T>();
    let plan = blocks(shape, 2 * threads, tune.block_bytes, elem);
    let most = plan.iter().map(|b| b.2).max().unwrap_or(0);
    let mut block_dk = try_vec(most, T::default(), "d_index_k partials")?;
    for &(r0, r1, _) in &plan {
        // Each row's partials: its visible columns, back to back.
        let mut items = Vec::with_capacity(r1 - r0);
        let mut rest = &mut block_dk[..];
        let rows_out = grad_signal[r0 * cols..r1 * cols]
            .chunks_mut(cols.max(1))
            .zip(d_index_q[r0 * h_n * d_n..r1 * h_n * d_n].chunks_mut(h_n * d_n))
            .zip(d_weights[r0 * h_n..r1 * h_n].chunks_mut(h_n));
        for (i, ((gs, dq), dw)) in rows_out.enumerate() {
            let n = shape.row(r0 + i).visible * d_n;
            let (dk, tail) = std::mem::take(&mut rest).split_at_mut(n);
            rest = tail;
            items.push(RowOut {
                row: r0 + i,
                gs,
                grads: RowGrads { dq, dw, dk },
            });
        }
        let zero = T::default();
        run_queue(
            items,
            threads,
            || Scratch {
                g: vec![zero; cols],
                p: vec![zero; cols],
                gsig: vec![zero; cols],
                heads: HeadScratch::new(d_n),
            },
            |o, sc| compute_row(&ctx, o, sc),
        );
        scatter(&ctx, &block_dk, r0, r1, &mut d_index_k);
        progress(Progress {
            rows_done: r1,
            rows,
            elapsed: started.elapsed(),
        });
    }
    Ok(Grads {
        grad_signal,
        d_index_q,
        d_weights,
        d_index_k,
    })
}

/// Adds the dK partials of rows `r0..r1` (back to back in `part`) into
/// `d_index_k`, in row and column order.
fn scatter<T: Real>(ctx: &Ctx<T>, part: &[T], r0: usize, r1: usize, d_index_k: &mut [f64]) {
    let d_n = ctx.shape.head_dim;
    let mut at = 0;
    for row in r0..r1 {
        let info = ctx.shape.row(row);
        for j in 0..info.visible {
            ctx.keys
                .add(&part[at..at + d_n], info.key_start + j, d_index_k);
            at += d_n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Thread count and block budget change no bit of any output, for both
    /// variants, with a NaN in `q`, offsets, a ratio and packed batches.
    #[test]
    fn results_do_not_depend_on_blocks_or_threads() {
        let shape = Shape::varlen(vec![0, 5, 5, 12], vec![0, 9, 10, 17], 16, 64)
            .with_q_offset(vec![3, 0, -2])
            .with_ratio(2);
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        let mut bf = |n: usize| -> Vec<bf16> {
            (0..n)
                .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
                .collect()
        };
        let (mut q, w, k) = (bf(shape.q_len()), bf(shape.w_len()), bf(shape.k_len()));
        q[11 * 16 * 64 + 5] = bf16::NAN; // row 11 sees two keys
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let n = shape.score_len();
        let attn: Vec<f32> = (0..n).map(|_| rng.random_range(0.0..1.0)).collect();
        let logits: Vec<f32> = (0..n).map(|_| rng.random_range(-3.0..3.0)).collect();
        let l1: Vec<f32> = (0..shape.rows())
            .map(|_| rng.random_range(1.0..4.0))
            .collect();
        let lse: Vec<f32> = (0..shape.rows())
            .map(|_| rng.random_range(1.0..4.0))
            .collect();
        let x = HostInputs {
            index_q: &q,
            weights: &w,
            index_k: &k,
            attn_score: &attn,
            attn_l1norm: &l1,
            index_score: &logits,
            index_lse: &lse,
            grad_loss: 0.7,
            loss_coeff: 1.3,
        };
        let opts = Options::default();
        let run = |threads, block_bytes| {
            let t = Tuning {
                threads,
                block_bytes,
            };
            (
                compute::<f64>(&shape, &opts, &x, t, &mut |_| {}).unwrap(),
                compute::<F32Bf16Ds>(&shape, &opts, &x, t, &mut |_| {}).unwrap(),
            )
        };
        let bits = |g: &Grads| -> Vec<u64> {
            [&g.grad_signal, &g.d_index_q, &g.d_weights, &g.d_index_k]
                .iter()
                .flat_map(|v| v.iter().map(|x| x.to_bits()))
                .collect()
        };
        let (a64, a32) = run(1, 1);
        assert!(a64.d_index_k.iter().any(|v| v.is_nan()), "NaN q reaches dK");
        assert!(a64.d_index_k.iter().any(|v| *v != 0.0 && v.is_finite()));
        for (threads, block) in [(3, 1), (2, 4 * 64 * 8), (4, usize::MAX / 2)] {
            let (b64, b32) = run(threads, block);
            assert_eq!(bits(&a64), bits(&b64), "f64, {threads} threads, {block} B");
            assert_eq!(bits(&a32), bits(&b32), "f32, {threads} threads, {block} B");
        }
        let mut calls = Vec::new();
        let t = Tuning {
            threads: 2,
            block_bytes: 1,
        };
        compute::<f64>(&shape, &opts, &x, t, &mut |p| calls.push(p.rows_done)).unwrap();
        // At least two rows per thread per block when the budget is tiny.
        assert_eq!(calls, vec![4, 8, 12]);
    }

    #[test]
    fn blocks_group_rows_by_their_visible_columns() {
        // L = s + 1 for s < 4: partial elements 64, 128, 192, 256 (f64).
        let s = Shape::bshd(1, 4, 4, 16, 64);
        assert_eq!(blocks(&s, 1, usize::MAX, 8), vec![(0, 4, 640)]);
        // 64 * 3 * 8 = 1536 bytes fit rows 0-1; then row 2 alone; then 3.
        assert_eq!(
            blocks(&s, 1, 1536, 8),
            vec![(0, 2, 192), (2, 3, 192), (3, 4, 256)]
        );
        assert_eq!(blocks(&s, 2, 1, 8), vec![(0, 2, 192), (2, 4, 448)]);
    }
}
