//! CPU implementation of the whole backward: the test oracle (f64), an f32
//! variant that rounds dS to bf16 exactly like the tensor-core kernel (to
//! bound how much worse the GPU may be), and the fallback [`execute`] used
//! where no GPU is present. Multi-threaded over query rows; results do not
//! depend on the number of threads.
//!
//! # Non-finite inputs
//!
//! Nothing is scanned for or rejected but the host scalars (`sm_scale`,
//! `loss_coeff`, [`HostInputs::grad_loss`]: [`Error::NonFinite`]). A NaN or
//! an infinity in a tensor propagates by IEEE arithmetic through exactly
//! the operations the GPU kernels perform, so both paths make the same
//! outputs non-finite (element by element; NaN and infinity are not told
//! apart, and finite inputs so large that f32 intermediates overflow are
//! outside this promise). The operations, per query row:
//!
//! - `g_t = [predict_t >= CLIP] * -max(target_t, CLIP) * c`: a NaN target
//!   is clipped (`max(NaN, CLIP) = CLIP`, as the kernels compare); a NaN
//!   predict masks the slot (`g_t = 0`). `G = sum_t g_t` over all slots,
//!   padding included; `grad_signal_t = g_t - predict_t * G`. So a
//!   non-finite `g_t` (an infinite target in an unmasked slot, or a
//!   non-finite `grad_loss` on the device in a row with an unmasked slot)
//!   makes the whole row's grad_signal non-finite, and a non-finite
//!   predict only its own slot.
//! - `S[h,t] = sm_scale * q[h,:] . k[n_t,:]` for valid slots; the gate
//!   `S > 0` is false for a NaN `S`. `dS = gate ? grad_signal_t * w[h] : 0`;
//!   `d_weights[h] = sum_t gate ? grad_signal_t * S : 0`.
//! - `d_index_q[h,:] = sm_scale * sum_t dS[h,t] k[n_t,:]` over **every
//!   valid slot**, and `d_index_k[n_t,:] += sm_scale * sum_h dS[h,t] q[h,:]`
//!   over **every head**: closed gates contribute `0 * k` and `0 * q`,
//!   which are NaN where `k` or `q` is not finite (the tensor-core
//!   products of the kernels do the same). Padding slots contribute
//!   nothing.
//!
//! Consequences, for one bad element (`tests/tests/nonfinite.rs` checks
//! each, on both paths): a NaN in `k[n,d]` makes `d_index_q[r,:,d]`
//! non-finite for every row `r` that selects key `n`, and nothing else; an
//! infinity there also the `d_weights[r,h]` whose `S` becomes `+inf`. A NaN
//! in `q[r,h,d]` makes `d_index_k[n,d]` non-finite for every key `n` row
//! `r` selects; an infinity also `d_weights[r,h]` where `S` becomes
//! `+inf`. A non-finite `w[r,h]` makes `d_index_q[r,h,:]` and the
//! `d_index_k` rows of the slots with an open gate of head `h` non-finite.
//! A non-finite grad_signal slot does the same for every head whose gate
//! is open there, plus `d_weights[r,h]`.
//!
//! # Memory
//!
//! Besides the f64 outputs, a run holds one block of per-slot dK partials
//! (`rows x topk x D` values of the variant's type, at most 64 MiB or two
//! rows per thread) and per-thread scratch of `O(topk + D)`; no thread
//! holds a copy of `d_index_k`. Allocation failures are returned as
//! [`Error::HostMemory`].

use crate::args::TopkId;
use crate::error::{Error, Result};
use crate::shape::{check_finite, GradDtype, Options, ScoreKind, Shape};
use half::bf16;

/// Host-side inputs (all dense row-major, shapes as in SPEC). `I`, the
/// element type of `topk_indices`, is `i32` (what the CPU path computes
/// with) or `i64` (accepted by [`crate::oneshot`], which hands i64 ids to
/// the GPU as they are and narrows them for the CPU fallback,
/// [`HostInputs::narrowed_ids`]).
#[derive(Clone, Copy, Debug)]
pub struct HostInputs<'a, I = i32> {
    /// `(B, S_q, H, D)`.
    pub index_q: &'a [bf16],
    /// `(B, S_q, H)`.
    pub weights: &'a [bf16],
    /// `(B, S_k, D)`.
    pub index_k: &'a [bf16],
    /// Target probabilities `(B, S_q, topk)`.
    pub attn_score: &'a [f32],
    /// Predict probabilities or log-probabilities `(B, S_q, topk)`.
    pub index_score: &'a [f32],
    /// Key ids `(B, S_q, topk)`.
    pub topk_indices: &'a [I],
    /// Upstream gradient of the loss (read on the host here, so a NaN or
    /// an infinity is rejected with [`Error::NonFinite`]).
    pub grad_loss: f32,
    /// Loss coefficient.
    pub loss_coeff: f32,
}

/// All outputs in f64 (or the precision of the variant, widened).
#[derive(Clone, Debug, Default)]
pub struct Grads {
    /// grad_signal `(B, S_q, topk)`.
    pub grad_signal: Vec<f64>,
    /// `(B, S_q, H, D)`.
    pub d_index_q: Vec<f64>,
    /// `(B, S_q, H)`.
    pub d_weights: Vec<f64>,
    /// `(B, S_k, D)`.
    pub d_index_k: Vec<f64>,
}

/// Arithmetic of one reference variant (also used by [`crate::dense::cpu`]).
pub(crate) trait Real:
    Copy
    + Send
    + Sync
    + Default
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
    + PartialOrd
    + std::ops::AddAssign
{
    fn of(x: f64) -> Self;
    fn of32(x: f32) -> Self;
    fn f64(self) -> f64;
    fn exp(self) -> Self;
    /// dS as the products consume it.
    fn round_ds(self) -> Self;
}

impl Real for f64 {
    fn of(x: f64) -> Self {
        x
    }
    fn of32(x: f32) -> Self {
        x as f64
    }
    fn f64(self) -> f64 {
        self
    }
    fn exp(self) -> Self {
        f64::exp(self)
    }
    fn round_ds(self) -> Self {
        self
    }
}

/// f32 arithmetic with dS rounded to bf16 (the tensor-core kernel's rounding).
#[derive(Clone, Copy, Default, PartialEq, PartialOrd)]
pub(crate) struct F32Bf16Ds(f32);

impl std::ops::Add for F32Bf16Ds {
    type Output = Self;
    fn add(self, o: Self) -> Self {
        F32Bf16Ds(self.0 + o.0)
    }
}
impl std::ops::Sub for F32Bf16Ds {
    type Output = Self;
    fn sub(self, o: Self) -> Self {
        F32Bf16Ds(self.0 - o.0)
    }
}
impl std::ops::Mul for F32Bf16Ds {
    type Output = Self;
    fn mul(self, o: Self) -> Self {
        F32Bf16Ds(self.0 * o.0)
    }
}
impl std::ops::Div for F32Bf16Ds {
    type Output = Self;
    fn div(self, o: Self) -> Self {
        F32Bf16Ds(self.0 / o.0)
    }
}
impl std::ops::Neg for F32Bf16Ds {
    type Output = Self;
    fn neg(self) -> Self {
        F32Bf16Ds(-self.0)
    }
}
impl std::ops::AddAssign for F32Bf16Ds {
    fn add_assign(&mut self, o: Self) {
        self.0 += o.0
    }
}
impl Real for F32Bf16Ds {
    fn of(x: f64) -> Self {
        F32Bf16Ds(x as f32)
    }
    fn of32(x: f32) -> Self {
        F32Bf16Ds(x)
    }
    fn f64(self) -> f64 {
        self.0 as f64
    }
    fn exp(self) -> Self {
        F32Bf16Ds(self.0.exp())
    }
    fn round_ds(self) -> Self {
        F32Bf16Ds(bf16::from_f32(self.0).to_f32())
    }
}

impl<'a, I: TopkId> HostInputs<'a, I> {
    /// The ids as the CPU path takes them: each narrowed by
    /// [`TopkId::narrow`] (an i64 id outside `0..=i32::MAX` becomes -1,
    /// padding either way).
    pub fn narrowed_ids(&self) -> Result<Vec<i32>> {
        let mut v = try_vec(self.topk_indices.len(), 0i32, "topk_indices")?;
        for (d, s) in v.iter_mut().zip(self.topk_indices) {
            *d = s.narrow();
        }
        Ok(v)
    }

    /// These inputs with `ids` as `topk_indices`.
    pub fn with_ids<'b>(&self, ids: &'b [i32]) -> HostInputs<'b, i32>
    where
        'a: 'b,
    {
        HostInputs {
            index_q: self.index_q,
            weights: self.weights,
            index_k: self.index_k,
            attn_score: self.attn_score,
            index_score: self.index_score,
            topk_indices: ids,
            grad_loss: self.grad_loss,
            loss_coeff: self.loss_coeff,
        }
    }
}

/// Checks the lengths of host inputs against `shape`, and the scalars.
pub fn validate_host<I>(shape: &Shape, opts: &Options, x: &HostInputs<'_, I>) -> Result<()> {
    shape.validate()?;
    opts.validate()?;
    check_finite("loss_coeff", x.loss_coeff)?;
    check_finite("grad_loss", x.grad_loss)?;
    let checks = [
        ("index_q", shape.q_len(), x.index_q.len()),
        ("weights", shape.w_len(), x.weights.len()),
        ("index_k", shape.k_len(), x.index_k.len()),
        ("attn_score", shape.slots(), x.attn_score.len()),
        ("index_score", shape.slots(), x.index_score.len()),
        ("topk_indices", shape.slots(), x.topk_indices.len()),
    ];
    check_lengths(&checks)
}

/// [`Error::Length`] for the first `(tensor, expected, actual)` whose
/// element counts differ.
pub(crate) fn check_lengths(checks: &[(&'static str, usize, usize)]) -> Result<()> {
    for &(tensor, expected, actual) in checks {
        if expected != actual {
            return Err(Error::Length {
                tensor,
                expected,
                actual,
            });
        }
    }
    Ok(())
}

/// The f64 reference of SPEC's math (the test oracle).
pub fn reference(shape: &Shape, opts: &Options, x: &HostInputs) -> Result<Grads> {
    reference_with_progress(shape, opts, x, &mut |_| {})
}

/// [`reference()`], calling `progress` after each block of rows (for long
/// runs; see [`stderr_progress`]).
pub fn reference_with_progress(
    shape: &Shape,
    opts: &Options,
    x: &HostInputs,
    progress: &mut dyn FnMut(Progress),
) -> Result<Grads> {
    validate_host(shape, opts, x)?;
    compute::<f64>(shape, opts, x, Tuning::for_rows(shape.rows()), progress)
}

/// f32 computation that rounds dS to bf16 before the dQ/dK products, as the
/// tensor-core kernel does; the GPU must be no worse than twice its error.
pub fn reference_f32_bf16_ds(shape: &Shape, opts: &Options, x: &HostInputs) -> Result<Grads> {
    validate_host(shape, opts, x)?;
    compute::<F32Bf16Ds>(shape, opts, x, Tuning::for_rows(shape.rows()), &mut |_| {})
}

pub(crate) fn threads_for(rows: usize) -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(rows)
        .max(1)
}

/// Bytes of per-slot dK partials a run holds at once (see "Memory" in the
/// module docs); more only when the thread count needs it.
const BLOCK_BYTES: usize = 64 << 20;

/// How a run is split: worker threads, and the budget of one block's
/// per-slot dK partials. Results do not depend on either.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tuning {
    pub(crate) threads: usize,
    pub(crate) block_bytes: usize,
}

impl Tuning {
    pub(crate) fn for_rows(rows: usize) -> Tuning {
        Tuning {
            threads: threads_for(rows),
            block_bytes: BLOCK_BYTES,
        }
    }
}

/// `n` copies of `v`, or [`Error::HostMemory`] naming `what` when the
/// allocation fails (instead of aborting the process).
pub fn try_vec<T: Clone>(n: usize, v: T, what: &'static str) -> Result<Vec<T>> {
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| Error::HostMemory {
        what,
        bytes: n.saturating_mul(std::mem::size_of::<T>()),
    })?;
    out.resize(n, v);
    Ok(out)
}

/// Progress of a CPU run, reported after each block of query rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Progress {
    /// Query rows finished.
    pub rows_done: usize,
    /// Query rows in all (`B * S_q`).
    pub rows: usize,
    /// Time since the run started.
    pub elapsed: std::time::Duration,
}

/// A progress callback for long CPU runs: prints `label: done/total rows
/// (pct), elapsed, about N s left` to stderr, first after 3 s, then at most
/// every 2 s, so short runs stay quiet.
pub fn stderr_progress(label: &str) -> impl FnMut(Progress) + '_ {
    let mut last = None::<std::time::Duration>;
    move |p: Progress| {
        let due = match last {
            None => p.elapsed.as_secs_f64() >= 3.0,
            Some(t) => (p.elapsed - t).as_secs_f64() >= 2.0,
        };
        if !due || p.rows == 0 {
            return;
        }
        last = Some(p.elapsed);
        let frac = p.rows_done as f64 / p.rows as f64;
        let secs = p.elapsed.as_secs_f64();
        let left = if frac > 0.0 {
            secs / frac - secs
        } else {
            f64::NAN
        };
        eprintln!(
            "{label}: {}/{} rows ({:.0}%), {secs:.1} s, about {left:.0} s left",
            p.rows_done,
            p.rows,
            100.0 * frac
        );
    }
}

/// What every row of a run reads.
struct Ctx<'a, T> {
    shape: &'a Shape,
    opts: &'a Options,
    x: &'a HostInputs<'a>,
    clip: T,
    c: T,
    /// The keys of the flat `(B*S_k, D)` view, for stage 2.
    keys: Keys<'a, T>,
}

/// What the stage-2 math of every query row reads: the key rows, which of
/// them hold a NaN or an infinity (so a closed gate still reaches dQ
/// through `0 * k`), and `sm_scale`. Shared by the sparse and the dense
/// paths ([`crate::dense::cpu`]), which differ only in which key row each
/// slot names and in stage 1.
pub(crate) struct Keys<'a, T> {
    index_k: &'a [bf16],
    bad: Vec<bool>,
    scale: T,
    dim: usize,
}

/// Per-worker scratch of [`Keys::row`]: one head row of q and its dQ sum
/// (`D` each).
pub(crate) struct HeadScratch<T> {
    qt: Vec<T>,
    dq: Vec<T>,
}

impl<T: Real> HeadScratch<T> {
    pub(crate) fn new(dim: usize) -> HeadScratch<T> {
        HeadScratch {
            qt: vec![T::default(); dim],
            dq: vec![T::default(); dim],
        }
    }
}

/// One query row's stage-2 outputs: d_index_q `(H, D)` and d_weights
/// `(H)` in f64, and the per-slot dK partials `sum_h dS[h,t] q[h,:]`
/// (`slots x D`, in `T`, unscaled).
pub(crate) struct RowGrads<'o, T> {
    pub(crate) dq: &'o mut [f64],
    pub(crate) dw: &'o mut [f64],
    pub(crate) dk: &'o mut [T],
}

impl<'a, T: Real> Keys<'a, T> {
    /// The `key_rows` rows of `D = dim` of `index_k`, flagged.
    pub(crate) fn new(
        index_k: &'a [bf16],
        key_rows: usize,
        dim: usize,
        sm_scale: f32,
    ) -> Result<Keys<'a, T>> {
        let mut bad = try_vec(key_rows, false, "index_k row flags")?;
        for (flag, kr) in bad.iter_mut().zip(index_k.chunks_exact(dim)) {
            *flag = kr.iter().any(|v| !v.to_f32().is_finite());
        }
        Ok(Keys {
            index_k,
            bad,
            scale: T::of32(sm_scale),
            dim,
        })
    }

    /// Stage 2 of one query row (the module docs' operations): `q` its
    /// `(H, D)`, `w` its `(H)`, `gsig` its grad_signal per slot, `key(t)`
    /// the key row of slot `t` (`None` for padding, which contributes
    /// nothing). Writes all of `o`.
    // Index loops mirror the math (several arrays share the index d).
    #[allow(clippy::needless_range_loop)]
    pub(crate) fn row(
        &self,
        q: &[bf16],
        w: &[bf16],
        gsig: &[T],
        key: impl Fn(usize) -> Option<usize>,
        sc: &mut HeadScratch<T>,
        o: RowGrads<'_, T>,
    ) {
        let d_n = self.dim;
        let zero = T::default();
        o.dk.iter_mut().for_each(|v| *v = zero);
        for (h, wh) in w.iter().enumerate() {
            let qh = &q[h * d_n..(h + 1) * d_n];
            // A non-finite q element reaches dK through `0 * q` even where
            // every gate of the head is closed (the kernels' dS^T q product
            // spans all heads).
            let mut q_bad = false;
            for (t, v) in sc.qt.iter_mut().zip(qh) {
                let f = v.to_f32();
                q_bad |= !f.is_finite();
                *t = T::of32(f);
            }
            let wh = T::of32(wh.to_f32());
            let mut dw = zero;
            sc.dq.iter_mut().for_each(|v| *v = zero);
            for (t, &gs) in gsig.iter().enumerate() {
                let Some(n) = key(t) else { continue };
                let kn = &self.index_k[n * d_n..(n + 1) * d_n];
                let mut dot = zero;
                for d in 0..d_n {
                    dot += sc.qt[d] * T::of32(kn[d].to_f32());
                }
                let sv = self.scale * dot;
                // The gate: false for a NaN S.
                let open = sv > zero;
                let ds = if open {
                    dw += gs * sv;
                    (gs * wh).round_ds()
                } else {
                    zero
                };
                // Closed gates add exact zeros, skipped unless a non-finite
                // factor turns `0 * x` into NaN (as in the kernels' products).
                if open || self.bad[n] {
                    for d in 0..d_n {
                        sc.dq[d] += ds * T::of32(kn[d].to_f32());
                    }
                }
                if open || q_bad {
                    let v = &mut o.dk[t * d_n..(t + 1) * d_n];
                    for d in 0..d_n {
                        v[d] += ds * sc.qt[d];
                    }
                }
            }
            o.dw[h] = dw.f64();
            for d in 0..d_n {
                o.dq[h * d_n + d] = (self.scale * sc.dq[d]).f64();
            }
        }
    }

    /// Adds one slot's dK partial `part` (`D`, unscaled), times `sm_scale`,
    /// into key row `n` of the f64 `d_index_k`.
    pub(crate) fn add(&self, part: &[T], n: usize, d_index_k: &mut [f64]) {
        let d_n = self.dim;
        for (a, &v) in d_index_k[n * d_n..(n + 1) * d_n].iter_mut().zip(part) {
            *a += (self.scale * v).f64();
        }
    }
}

/// Runs `f` over `items` on up to `threads` worker threads, one item at a
/// time from a shared queue (items of unequal cost balance over threads),
/// each worker with its own scratch from `scratch`. Which worker takes an
/// item changes nothing an item computes.
pub(crate) fn run_queue<I: Send, S>(
    items: Vec<I>,
    threads: usize,
    scratch: impl Fn() -> S + Sync,
    f: impl Fn(I, &mut S) + Sync,
) {
    let workers = threads.min(items.len()).max(1);
    let queue = std::sync::Mutex::new(items.into_iter());
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut sc = scratch();
                    loop {
                        let next = queue.lock().expect("row queue").next();
                        let Some(item) = next else { break };
                        f(item, &mut sc);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("CPU worker panicked");
        }
    });
}

/// One query row's outputs: grad_signal (f64) and its stage-2 outputs.
struct RowOut<'a, T> {
    row: usize,
    gs: &'a mut [f64],
    grads: RowGrads<'a, T>,
}

/// Per-worker scratch.
struct Scratch<T> {
    g: Vec<T>,
    p: Vec<T>,
    gsig: Vec<T>,
    k_rows: Vec<Option<usize>>,
    heads: HeadScratch<T>,
}

fn compute_row<T: Real>(ctx: &Ctx<T>, o: RowOut<T>, sc: &mut Scratch<T>) {
    let (shape, opts, x) = (ctx.shape, ctx.opts, ctx.x);
    let (h_n, d_n, topk) = (shape.heads, shape.head_dim, shape.topk);
    let zero = T::default();
    let row = o.row;
    let b = row / shape.seq_q;
    let base = row * topk;
    // Stage 1 (G over all slots, padding included).
    let mut big_g = zero;
    for t in 0..topk {
        let (keep, p) = predict::<T>(opts, x.index_score[base + t], ctx.clip);
        let target = T::of32(x.attn_score[base + t]);
        // max(target, CLIP) as the kernels compute it: a NaN target is
        // clipped (the comparison is false).
        let tmax = if target > ctx.clip { target } else { ctx.clip };
        sc.g[t] = if keep { -tmax * ctx.c } else { zero };
        sc.p[t] = p;
        big_g += sc.g[t];
    }
    for t in 0..topk {
        sc.gsig[t] = sc.g[t] - sc.p[t] * big_g;
        o.gs[t] = sc.gsig[t].f64();
        sc.k_rows[t] = opts.resolve(shape, b, x.topk_indices[base + t]);
    }
    // Stage 2.
    let k_rows = &sc.k_rows;
    ctx.keys.row(
        &x.index_q[row * h_n * d_n..(row + 1) * h_n * d_n],
        &x.weights[row * h_n..(row + 1) * h_n],
        &sc.gsig,
        |t| k_rows[t],
        &mut sc.heads,
        o.grads,
    );
}

/// The whole backward in `T`, in blocks of query rows: the rows of a block
/// are shared among worker threads (each row computed by one thread, so
/// the split does not change any result), then the block's per-slot dK
/// partials are added into the f64 `d_index_k` in row and slot order by
/// one thread. Results are bitwise independent of `tune`.
fn compute<T: Real>(
    shape: &Shape,
    opts: &Options,
    x: &HostInputs,
    tune: Tuning,
    progress: &mut dyn FnMut(Progress),
) -> Result<Grads> {
    let started = std::time::Instant::now();
    let (h_n, d_n, topk) = (shape.heads, shape.head_dim, shape.topk);
    let rows = shape.rows();
    let mut grad_signal = try_vec(shape.slots(), 0.0f64, "grad_signal")?;
    let mut d_index_q = try_vec(shape.q_len(), 0.0f64, "d_index_q")?;
    let mut d_weights = try_vec(shape.w_len(), 0.0f64, "d_weights")?;
    let mut d_index_k = try_vec(shape.k_len(), 0.0f64, "d_index_k")?;
    let ctx = Ctx {
        shape,
        opts,
        x,
        clip: T::of((-100.0f64).exp()),
        c: T::of(x.loss_coeff as f64 / rows as f64) * T::of32(x.grad_loss),
        keys: Keys::new(x.index_k, shape.batch * shape.seq_k, d_n, opts.sm_scale)?,
    };
    let threads = tune.threads.clamp(1, rows);
    let row_bytes = (topk * d_n * std::mem::size_of::<T>()).max(1);
    let block_rows = (tune.block_bytes / row_bytes)
        .max(2 * threads)
        .clamp(1, rows);
    let mut block_dk = try_vec(block_rows * topk * d_n, T::default(), "d_index_k partials")?;
    let zero = T::default();
    for r0 in (0..rows).step_by(block_rows) {
        let r1 = (r0 + block_rows).min(rows);
        let items: Vec<RowOut<T>> = grad_signal[r0 * topk..r1 * topk]
            .chunks_mut(topk)
            .zip(d_index_q[r0 * h_n * d_n..r1 * h_n * d_n].chunks_mut(h_n * d_n))
            .zip(d_weights[r0 * h_n..r1 * h_n].chunks_mut(h_n))
            .zip(block_dk.chunks_mut(topk * d_n))
            .enumerate()
            .map(|(i, (((gs, dq), dw), dk))| RowOut {
                row: r0 + i,
                gs,
                grads: RowGrads { dq, dw, dk },
            })
            .collect();
        run_queue(
            items,
            threads,
            || Scratch {
                g: vec![zero; topk],
                p: vec![zero; topk],
                gsig: vec![zero; topk],
                k_rows: vec![None; topk],
                heads: HeadScratch::new(d_n),
            },
            |o, sc| compute_row(&ctx, o, sc),
        );
        // Scatter the block's dK partials: fixed order, one thread.
        for (i, row) in (r0..r1).enumerate() {
            let b = row / shape.seq_q;
            for t in 0..topk {
                let Some(n) = opts.resolve(shape, b, x.topk_indices[row * topk + t]) else {
                    continue;
                };
                let part = &block_dk[(i * topk + t) * d_n..(i * topk + t + 1) * d_n];
                ctx.keys.add(part, n, &mut d_index_k);
            }
        }
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

/// `(mask, predict)` of one slot.
fn predict<T: Real>(opts: &Options, score: f32, clip: T) -> (bool, T) {
    match opts.score {
        ScoreKind::Probs => {
            let p = T::of32(score);
            (p >= clip, p)
        }
        ScoreKind::LogProbs => (score >= -100.0, T::of32(score).exp()),
    }
}

/// Host-side outputs of the CPU fallback, typed like the GPU outputs.
#[derive(Debug)]
pub struct HostOutputs<'a> {
    /// Overwritten with grad_signal (it holds the targets on entry; pass the
    /// same values as `HostInputs::attn_score`).
    pub attn_score: &'a mut [f32],
    /// `(B, S_q, H, D)`.
    pub d_index_q: &'a mut [bf16],
    /// `(B, S_q, H)` in the plan's `d_weights` type.
    pub d_weights: HostGrad<'a>,
    /// `(B, S_k, D)` in the plan's `d_index_k` type.
    pub d_index_k: HostGrad<'a>,
}

/// A host gradient buffer in one of the two output types.
#[derive(Debug)]
pub enum HostGrad<'a> {
    /// f32 elements.
    F32(&'a mut [f32]),
    /// bf16 elements.
    Bf16(&'a mut [bf16]),
}

impl HostGrad<'_> {
    pub(crate) fn dtype(&self) -> GradDtype {
        match self {
            HostGrad::F32(_) => GradDtype::F32,
            HostGrad::Bf16(_) => GradDtype::Bf16,
        }
    }
    pub(crate) fn len(&self) -> usize {
        match self {
            HostGrad::F32(v) => v.len(),
            HostGrad::Bf16(v) => v.len(),
        }
    }
    pub(crate) fn store(&mut self, src: &[f64]) {
        match self {
            HostGrad::F32(v) => v.iter_mut().zip(src).for_each(|(o, &s)| *o = s as f32),
            HostGrad::Bf16(v) => v
                .iter_mut()
                .zip(src)
                .for_each(|(o, &s)| *o = bf16::from_f64(s)),
        }
    }
}

/// The CPU fallback of the whole backward (f64 math, outputs rounded once).
/// `targets` are the `attn_score` values on entry; `out.attn_score` receives
/// grad_signal. Everything is checked, and all memory allocated, before
/// anything is written: an error leaves every output untouched.
pub fn execute(shape: &Shape, opts: &Options, x: &HostInputs, out: HostOutputs) -> Result<()> {
    execute_with_progress(shape, opts, x, out, &mut |_| {})
}

/// [`execute`], calling `progress` after each block of rows (for long
/// runs; see [`stderr_progress`]).
pub fn execute_with_progress(
    shape: &Shape,
    opts: &Options,
    x: &HostInputs,
    out: HostOutputs,
    progress: &mut dyn FnMut(Progress),
) -> Result<()> {
    validate_host(shape, opts, x)?;
    let grads = [
        ("d_weights", &out.d_weights, opts.d_weights, shape.w_len()),
        ("d_index_k", &out.d_index_k, opts.d_index_k, shape.k_len()),
    ];
    for (tensor, buf, want, expected) in grads {
        if buf.dtype() != want {
            return Err(Error::Dtype {
                tensor,
                expected: want.name(),
                actual: buf.dtype().name(),
            });
        }
        if buf.len() != expected {
            return Err(Error::Length {
                tensor,
                expected,
                actual: buf.len(),
            });
        }
    }
    for (tensor, expected, actual) in [
        ("attn_score", shape.slots(), out.attn_score.len()),
        ("d_index_q", shape.q_len(), out.d_index_q.len()),
    ] {
        if expected != actual {
            return Err(Error::Length {
                tensor,
                expected,
                actual,
            });
        }
    }
    let g = compute::<f64>(shape, opts, x, Tuning::for_rows(shape.rows()), progress)?;
    let HostOutputs {
        attn_score,
        d_index_q,
        mut d_weights,
        mut d_index_k,
    } = out;
    attn_score
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

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The block size and the thread count change no bit of any output
    /// (dK partials are merged in a fixed order), for both variants, and
    /// non-finite inputs included.
    #[test]
    fn results_do_not_depend_on_blocks_or_threads() {
        let shape = Shape {
            batch: 2,
            seq_q: 7,
            seq_k: 9,
            heads: 16,
            head_dim: 64,
            topk: 11,
        };
        let opts = Options {
            key_ids: crate::KeyIds::Local,
            ..Options::default()
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let mut bf = |n: usize| -> Vec<bf16> {
            (0..n)
                .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
                .collect()
        };
        let (mut q, w, k) = (bf(shape.q_len()), bf(shape.w_len()), bf(shape.k_len()));
        q[5 * 64 + 3] = bf16::NAN;
        let mut rng = rand::rngs::StdRng::seed_from_u64(10);
        let n = shape.slots();
        let target: Vec<f32> = (0..n).map(|_| rng.random_range(0.0..0.2)).collect();
        let score: Vec<f32> = (0..n).map(|_| rng.random_range(0.0..0.2)).collect();
        // Duplicates, -1 and out-of-range ids included.
        let ids: Vec<i32> = (0..n).map(|_| rng.random_range(-1..11)).collect();
        let x = HostInputs {
            index_q: &q,
            weights: &w,
            index_k: &k,
            attn_score: &target,
            index_score: &score,
            topk_indices: &ids,
            grad_loss: 0.7,
            loss_coeff: 1.3,
        };
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
        for (threads, block) in [(3, 1), (2, 3 * 11 * 64 * 8), (4, usize::MAX / 2)] {
            let (b64, b32) = run(threads, block);
            assert_eq!(
                bits(&a64),
                bits(&b64),
                "f64, {threads} threads, {block} bytes"
            );
            assert_eq!(
                bits(&a32),
                bits(&b32),
                "f32, {threads} threads, {block} bytes"
            );
        }
        let mut calls = Vec::new();
        let t = Tuning {
            threads: 2,
            block_bytes: 1,
        };
        compute::<f64>(&shape, &opts, &x, t, &mut |p| calls.push(p.rows_done)).unwrap();
        // Blocks of at least two rows per thread: 4 rows per block.
        assert_eq!(calls, vec![4, 8, 12, 14]);
    }

    #[test]
    fn failed_allocations_are_errors() {
        let r = try_vec(usize::MAX / 4, 0.0f64, "huge");
        assert!(
            matches!(r, Err(Error::HostMemory { what: "huge", bytes }) if bytes == usize::MAX),
            "{r:?}"
        );
        assert_eq!(try_vec(3, 1u8, "small").unwrap(), vec![1, 1, 1]);
    }

    /// A hand-computed single-row case: one head, D = 64, two slots.
    #[test]
    fn matches_a_hand_computed_row() {
        let shape = Shape {
            batch: 1,
            seq_q: 1,
            seq_k: 2,
            heads: 16,
            head_dim: 64,
            topk: 2,
        };
        let opts = Options::default();
        let mut q = vec![bf16::ZERO; 16 * 64];
        q[0] = bf16::from_f32(1.0); // head 0: q = e0
        q[64 + 1] = bf16::from_f32(2.0); // head 1: q = 2 e1
        let mut k = vec![bf16::ZERO; 2 * 64];
        k[0] = bf16::from_f32(0.5); // key 0 = 0.5 e0
        k[64 + 1] = bf16::from_f32(-1.0); // key 1 = -e1
        let w = vec![bf16::from_f32(3.0); 16];
        let target = [0.25f32, 0.75];
        let predict = [0.5f32, 0.5];
        let ids = [0i32, 1];
        let x = HostInputs {
            index_q: &q,
            weights: &w,
            index_k: &k,
            attn_score: &target,
            index_score: &predict,
            topk_indices: &ids,
            grad_loss: 2.0,
            loss_coeff: 1.0,
        };
        let r = reference(&shape, &opts, &x).unwrap();
        // c = 1/1 * 2 = 2; g = [-0.5, -1.5]; G = -2; gs = g - p G = [0.5, -0.5].
        assert!((r.grad_signal[0] - 0.5).abs() < 1e-12 && (r.grad_signal[1] + 0.5).abs() < 1e-12);
        // head 0: S = [0.5, 0]; only slot 0 passes: dW0 = 0.5*0.5, dQ0 = 0.5*3*k0 = 0.75 e0.
        assert!((r.d_weights[0] - 0.25).abs() < 1e-12);
        assert!((r.d_index_q[0] - 0.75).abs() < 1e-12);
        // head 1: S = [0, -2]: nothing passes.
        assert_eq!(r.d_weights[1], 0.0);
        // dK[0] = dS[0,0] * q0 = 1.5 e0; key 1 gets nothing.
        assert!((r.d_index_k[0] - 1.5).abs() < 1e-12);
        assert!(r.d_index_k[64..].iter().all(|&v| v == 0.0));
    }
}
