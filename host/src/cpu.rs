//! CPU implementation of the whole backward: the test oracle (f64), an f32
//! variant that rounds dS to bf16 exactly like the tensor-core kernel (to
//! bound how much worse the GPU may be), and the fallback [`execute`] used
//! where no GPU is present. Multi-threaded over query rows.

use crate::error::{Error, Result};
use crate::shape::{check_finite, GradDtype, Options, ScoreKind, Shape};
use half::bf16;

/// Host-side inputs (all dense row-major, shapes as in SPEC).
#[derive(Clone, Copy, Debug)]
pub struct HostInputs<'a> {
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
    pub topk_indices: &'a [i32],
    /// Upstream gradient of the loss.
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

/// Arithmetic of one reference variant.
trait Real:
    Copy
    + Send
    + Sync
    + Default
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
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
struct F32Bf16Ds(f32);

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

/// Checks the lengths of host inputs against `shape`, and the scalars.
pub fn validate_host(shape: &Shape, opts: &Options, x: &HostInputs) -> Result<()> {
    shape.validate()?;
    opts.validate()?;
    check_finite("loss_coeff", x.loss_coeff)?;
    let checks = [
        ("index_q", shape.q_len(), x.index_q.len()),
        ("weights", shape.w_len(), x.weights.len()),
        ("index_k", shape.k_len(), x.index_k.len()),
        ("attn_score", shape.slots(), x.attn_score.len()),
        ("index_score", shape.slots(), x.index_score.len()),
        ("topk_indices", shape.slots(), x.topk_indices.len()),
    ];
    for (tensor, expected, actual) in checks {
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
    validate_host(shape, opts, x)?;
    Ok(compute::<f64>(shape, opts, x))
}

/// f32 computation that rounds dS to bf16 before the dQ/dK products, as the
/// tensor-core kernel does; the GPU must be no worse than twice its error.
pub fn reference_f32_bf16_ds(shape: &Shape, opts: &Options, x: &HostInputs) -> Result<Grads> {
    validate_host(shape, opts, x)?;
    Ok(compute::<F32Bf16Ds>(shape, opts, x))
}

fn threads_for(rows: usize) -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(rows)
        .max(1)
}

// Index loops mirror the math (several arrays share the slot index t).
#[allow(clippy::needless_range_loop)]
fn compute<T: Real>(shape: &Shape, opts: &Options, x: &HostInputs) -> Grads {
    let (h_n, d_n, topk) = (shape.heads, shape.head_dim, shape.topk);
    let rows = shape.rows();
    let clip = T::of((-100.0f64).exp());
    let c = T::of(x.loss_coeff as f64 / rows as f64) * T::of32(x.grad_loss);
    let scale = T::of32(opts.sm_scale);
    let zero = T::default();
    let nthreads = threads_for(rows);
    let per = rows.div_ceil(nthreads);

    let mut grad_signal = vec![0.0f64; shape.slots()];
    let mut d_index_q = vec![0.0f64; shape.q_len()];
    let mut d_weights = vec![0.0f64; shape.w_len()];
    let mut dk_parts: Vec<Vec<T>> = Vec::new();

    std::thread::scope(|s| {
        let mut handles = Vec::new();
        let chunks = grad_signal
            .chunks_mut(per * topk)
            .zip(d_index_q.chunks_mut(per * h_n * d_n))
            .zip(d_weights.chunks_mut(per * h_n));
        for (i, ((gs_out, dq_out), dw_out)) in chunks.enumerate() {
            handles.push(s.spawn(move || {
                let mut dk = vec![zero; shape.k_len()];
                let mut g = vec![zero; topk];
                let mut gsig = vec![zero; topk];
                let mut k_rows: Vec<Option<usize>> = vec![None; topk];
                for (local, row) in (i * per..rows.min((i + 1) * per)).enumerate() {
                    let b = row / shape.seq_q;
                    let base = row * topk;
                    // Stage 1.
                    let mut big_g = zero;
                    for t in 0..topk {
                        let sc = x.index_score[base + t];
                        let (keep, _) = predict::<T>(opts, sc, clip);
                        let target = T::of32(x.attn_score[base + t]);
                        let tmax = if target > clip { target } else { clip };
                        g[t] = if keep { -tmax * c } else { zero };
                        big_g += g[t];
                    }
                    for t in 0..topk {
                        let (_, p) = predict::<T>(opts, x.index_score[base + t], clip);
                        gsig[t] = g[t] - p * big_g;
                        gs_out[local * topk + t] = gsig[t].f64();
                        k_rows[t] = opts.resolve(shape, b, x.topk_indices[base + t]);
                    }
                    // Stage 2.
                    let q = &x.index_q[row * h_n * d_n..(row + 1) * h_n * d_n];
                    for h in 0..h_n {
                        let qh = &q[h * d_n..(h + 1) * d_n];
                        let wh = T::of32(x.weights[row * h_n + h].to_f32());
                        let mut dw = zero;
                        let mut dq = vec![zero; d_n];
                        for t in 0..topk {
                            let Some(n) = k_rows[t] else { continue };
                            let kn = &x.index_k[n * d_n..(n + 1) * d_n];
                            let mut dot = zero;
                            for d in 0..d_n {
                                dot += T::of32(qh[d].to_f32()) * T::of32(kn[d].to_f32());
                            }
                            let sv = scale * dot;
                            if sv > zero {
                                dw += gsig[t] * sv;
                                let ds = (gsig[t] * wh).round_ds();
                                let dsk = dk[n * d_n..(n + 1) * d_n].iter_mut();
                                for (d, acc) in dsk.enumerate() {
                                    dq[d] += ds * T::of32(kn[d].to_f32());
                                    *acc += scale * ds * T::of32(qh[d].to_f32());
                                }
                            }
                        }
                        dw_out[local * h_n + h] = dw.f64();
                        for d in 0..d_n {
                            dq_out[(local * h_n + h) * d_n + d] = (scale * dq[d]).f64();
                        }
                    }
                }
                dk
            }));
        }
        dk_parts = handles
            .into_iter()
            .map(|h| h.join().expect("reference worker panicked"))
            .collect();
    });

    let mut d_index_k = vec![0.0f64; shape.k_len()];
    for part in &dk_parts {
        for (o, v) in d_index_k.iter_mut().zip(part) {
            *o += v.f64();
        }
    }
    Grads {
        grad_signal,
        d_index_q,
        d_weights,
        d_index_k,
    }
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
    fn dtype(&self) -> GradDtype {
        match self {
            HostGrad::F32(_) => GradDtype::F32,
            HostGrad::Bf16(_) => GradDtype::Bf16,
        }
    }
    fn len(&self) -> usize {
        match self {
            HostGrad::F32(v) => v.len(),
            HostGrad::Bf16(v) => v.len(),
        }
    }
    fn store(&mut self, src: &[f64]) {
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
/// grad_signal. Everything is checked before anything is written.
pub fn execute(shape: &Shape, opts: &Options, x: &HostInputs, out: HostOutputs) -> Result<()> {
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
    let g = compute::<f64>(shape, opts, x);
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
