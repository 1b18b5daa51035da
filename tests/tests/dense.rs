//! Dense mode on the CPU (runs everywhere): the dense reference against the
//! sparse reference on the equivalent sparse problem, hand-computed rows,
//! rows that see no key, the fallback against the reference, and every
//! check before the first write.

use dsa_indexer_bwd::cpu::{self, Grads, HostGrad};
use dsa_indexer_bwd::dense::{self, cpu::HostInputs, cpu::HostOutputs, Layout};
use dsa_indexer_bwd::{bf16, Error, GradDtype, KeyIds, Options, ScoreKind};
use indexer_tests::dense::DenseProblem;
use indexer_tests::rel_err;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

/// Key counts around the 64-key tile of the kernels (a last tile that is
/// full, one short, one key long) and small ones.
const SEQ_K: [usize; 8] = [1, 2, 5, 17, 63, 64, 65, 70];

/// A random BSHD or packed shape: 1-3 batches, up to 8 query rows and 70
/// keys each (packed batches may be empty), random offsets in [-6, 12]
/// (or none), the given ratio, H = 16, D = 64.
fn random_shape(rng: &mut impl Rng, varlen: bool, ratio: usize) -> dense::Shape {
    let batch = rng.random_range(1..=3usize);
    let shape = if varlen {
        let (mut cq, mut ck) = (vec![0usize], vec![0usize]);
        for _ in 0..batch {
            cq.push(cq.last().unwrap() + rng.random_range(0..=6usize));
            let k = if rng.random_bool(0.2) {
                0
            } else {
                SEQ_K[rng.random_range(0..SEQ_K.len())]
            };
            ck.push(ck.last().unwrap() + k);
        }
        // At least one query row and one key row in all.
        *cq.last_mut().unwrap() += 1;
        *ck.last_mut().unwrap() += 1;
        let mut s = dense::Shape::varlen(cq, ck, 16, 64);
        if rng.random_bool(0.3) {
            // A padded score width (max_seqlen_k of an allocation).
            if let Layout::Varlen { score_cols, .. } = &mut s.layout {
                *score_cols += rng.random_range(1..=5usize);
            }
        }
        s
    } else {
        let seq_q = rng.random_range(1..=8usize);
        let seq_k = SEQ_K[rng.random_range(0..SEQ_K.len())];
        dense::Shape::bshd(batch, seq_q, seq_k, 16, 64)
    };
    let offsets = if rng.random_bool(0.25) {
        Vec::new()
    } else {
        (0..batch).map(|_| rng.random_range(-6..=12i64)).collect()
    };
    shape.with_q_offset(offsets).with_ratio(ratio)
}

fn opts(dk_bf16: bool, dw_f32: bool) -> Options {
    Options {
        sm_scale: 0.75,
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
        ..Options::default()
    }
}

/// The four relative errors of `a` against `b`.
fn errors(a: &Grads, b: &Grads) -> [f64; 4] {
    [
        err(&a.grad_signal, &b.grad_signal),
        err(&a.d_index_q, &b.d_index_q),
        err(&a.d_weights, &b.d_weights),
        err(&a.d_index_k, &b.d_index_k),
    ]
}

/// `rel_err`, except against a reference whose norm is below 1e-30 (a
/// row whose only visible logit is masked leaves gradients of about
/// 1e-44, which the sparse side's f32 subnormal predict carries with a
/// few percent of relative error): then the absolute error.
fn err(got: &[f64], want: &[f64]) -> f64 {
    let norm = want.iter().map(|w| w * w).sum::<f64>().sqrt();
    if norm >= 1e-30 {
        return rel_err(got, want);
    }
    let abs = got
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w) * (g - w))
        .sum::<f64>()
        .sqrt();
    if abs.is_finite() {
        abs
    } else {
        f64::INFINITY
    }
}

/// Runs the fallback into fresh outputs filled with NaN.
fn fallback(p: &DenseProblem) -> (Vec<f32>, Vec<bf16>, Vec<f64>, Vec<f64>) {
    let s = &p.shape;
    let mut gs = p.logits.clone();
    let mut dq = vec![bf16::NAN; s.q_len()];
    let (mut dw32, mut dw16) = (vec![f32::NAN; s.w_len()], vec![bf16::NAN; s.w_len()]);
    let (mut dk32, mut dk16) = (vec![f32::NAN; s.k_len()], vec![bf16::NAN; s.k_len()]);
    let out = HostOutputs {
        index_score: &mut gs,
        d_index_q: &mut dq,
        d_weights: match p.opts.d_weights {
            GradDtype::F32 => HostGrad::F32(&mut dw32),
            GradDtype::Bf16 => HostGrad::Bf16(&mut dw16),
        },
        d_index_k: match p.opts.d_index_k {
            GradDtype::F32 => HostGrad::F32(&mut dk32),
            GradDtype::Bf16 => HostGrad::Bf16(&mut dk16),
        },
    };
    dense::cpu::execute(s, &p.opts, &p.host(), out).unwrap();
    let wide = |f: &[f32], h: &[bf16], t| -> Vec<f64> {
        match t {
            GradDtype::F32 => f.iter().map(|&v| v as f64).collect(),
            GradDtype::Bf16 => h.iter().map(|v| v.to_f64()).collect(),
        }
    };
    let dw = wide(&dw32, &dw16, p.opts.d_weights);
    let dk = wide(&dk32, &dk16, p.opts.d_index_k);
    (gs, dq, dw, dk)
}

fn round(v: &[f64], t: GradDtype) -> Vec<f64> {
    indexer_tests::round_to(v, t)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]

    /// SPEC's dense math is the sparse math on the equivalent sparse
    /// problem (slot j = key j of the row's batch for j < L, padding
    /// beyond): the two f64 references agree to the f32 rounding of the
    /// sparse side's targets (and predicts, as probabilities), over BSHD and packed shapes, offsets, ratios 1, 2, 4, key
    /// counts around the 64-key tile, both id conventions and both score
    /// kinds of the sparse side. Columns a row does not see hold NaN and
    /// must not be read.
    #[test]
    fn dense_reference_is_the_sparse_reference_on_the_equivalent_problem(
        seed in any::<u64>(), varlen in any::<bool>(), ratio in prop::sample::select(vec![1usize, 2, 4]),
        local in any::<bool>(), log in any::<bool>(),
    ) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let shape = random_shape(&mut rng, varlen, ratio);
        let p = DenseProblem::random(&mut rng, shape.clone(), opts(false, false), 0.05);
        let d = dense::cpu::reference(&shape, &p.opts, &p.host()).unwrap();
        let key_ids = if local { KeyIds::Local } else { KeyIds::Global };
        let kind = if log { ScoreKind::LogProbs } else { ScoreKind::Probs };
        let sp = p.to_sparse(key_ids, kind);
        let s = cpu::reference(&sp.shape, &sp.opts, &sp.host(&p)).unwrap();
        let e = errors(&d, &s);
        // The sparse side holds targets rounded to f32 and, as
        // probabilities, predicts rounded to f32 too: in grad_signal =
        // g - p G that rounding is amplified where the two terms nearly
        // cancel (seen up to 1.02e-6 on five-row problems).
        let limit = if log { 1e-6 } else { 1e-5 };
        prop_assert!(e.iter().all(|&v| v <= limit), "{shape:?}: errors {e:?}");
        // Beyond L: exactly zero on both sides.
        let cols = shape.score_cols();
        for (r, (_, l)) in indexer_tests::dense::spec_rows(&shape).into_iter().enumerate() {
            prop_assert!(d.grad_signal[r * cols + l..(r + 1) * cols].iter().all(|&v| v == 0.0));
        }
        let finite = |g: &Grads| [&g.grad_signal, &g.d_index_q, &g.d_weights, &g.d_index_k]
            .iter().all(|v| v.iter().all(|x| x.is_finite()));
        prop_assert!(finite(&d), "NaN columns beyond L were read");
    }

    /// The fallback writes the reference rounded once to each output type
    /// (grad_signal over index_score, zeros beyond L), and `dense::run`
    /// returns the same on the CPU.
    #[test]
    fn fallback_is_the_reference_rounded(
        seed in any::<u64>(), varlen in any::<bool>(), dk_bf16 in any::<bool>(), dw_f32 in any::<bool>(),
    ) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let ratio = [1, 2, 4][rng.random_range(0..3)];
        let shape = random_shape(&mut rng, varlen, ratio);
        let p = DenseProblem::random(&mut rng, shape.clone(), opts(dk_bf16, dw_f32), 0.05);
        let r = dense::cpu::reference(&shape, &p.opts, &p.host()).unwrap();
        let (gs, dq, dw, dk) = fallback(&p);
        for (g, w) in gs.iter().zip(&r.grad_signal) {
            prop_assert_eq!(g.to_bits(), (*w as f32).to_bits());
        }
        for (g, w) in dq.iter().zip(&r.d_index_q) {
            prop_assert_eq!(g.to_bits(), bf16::from_f64(*w).to_bits());
        }
        prop_assert_eq!(dw, round(&r.d_weights, p.opts.d_weights));
        prop_assert_eq!(dk, round(&r.d_index_k, p.opts.d_index_k));
        let one = dense::run(&shape, &p.opts, &p.host(), true).unwrap();
        prop_assert_eq!(one.backend, "cpu");
        prop_assert_eq!(&one.grad_signal, &gs);
        prop_assert_eq!(&one.d_index_q, &dq);
        prop_assert_eq!(one.d_weights.to_f64(), round(&r.d_weights, p.opts.d_weights));
        prop_assert_eq!(one.d_index_k.to_f64(), round(&r.d_index_k, p.opts.d_index_k));
    }
}

/// A tiny problem: 1 batch, `seq_q` rows, 2 keys, H = 16, D = 64, with
/// head 0 of q = e0, head 1 of q = 2 e1, key 0 = 0.5 e0, key 1 = -e1, all
/// weights 3 (the sparse hand-computed row's tensors).
fn tiny(seq_q: usize) -> (dense::Shape, Vec<bf16>, Vec<bf16>, Vec<bf16>) {
    let shape = dense::Shape::bshd(1, seq_q, 2, 16, 64);
    let mut q = vec![bf16::ZERO; shape.q_len()];
    for r in 0..seq_q {
        q[r * 16 * 64] = bf16::from_f32(1.0);
        q[r * 16 * 64 + 64 + 1] = bf16::from_f32(2.0);
    }
    let mut k = vec![bf16::ZERO; 2 * 64];
    k[0] = bf16::from_f32(0.5);
    k[64 + 1] = bf16::from_f32(-1.0);
    let w = vec![bf16::from_f32(3.0); shape.w_len()];
    (shape, q, w, k)
}

fn close(got: f64, want: f64, tol: f64) -> bool {
    (got - want).abs() <= tol * want.abs().max(1e-300)
}

/// One row, two keys, by hand. Row 0 with `q_offset` 1 sees both keys:
/// target = attn / (l1 + 1e-10) = [0.25, 0.75] (to 1e-10), predict =
/// exp(logit - lse) = [0.5, 0.5] (lse = ln 2 in f32), c = 1 * 2 / 1 = 2,
/// g = [-0.5, -1.5], G = -2, grad_signal = g - p G = [0.5, -0.5]. Head 0:
/// S = [0.5, 0], only key 0 passes the gate: dW = 0.5 * 0.5, dQ = 0.5 * 3 *
/// k0 = 0.75 e0, dK[0] = 1.5 e0; head 1: S = [0, -2], nothing passes.
#[test]
fn hand_computed_row_sees_both_keys() {
    let (shape, q, w, k) = tiny(1);
    let shape = shape.with_q_offset(vec![1]);
    let ln2 = std::f32::consts::LN_2;
    let x = HostInputs {
        index_q: &q,
        weights: &w,
        index_k: &k,
        attn_score: &[1.0, 3.0],
        attn_l1norm: &[4.0],
        index_score: &[0.0, 0.0],
        index_lse: &[ln2],
        grad_loss: 2.0,
        loss_coeff: 1.0,
    };
    let r = dense::cpu::reference(&shape, &Options::default(), &x).unwrap();
    // exp(-f32(ln 2)) is 0.5 to 3e-8; target 0.25 to 1e-10.
    assert!(close(r.grad_signal[0], 0.5, 1e-7), "{}", r.grad_signal[0]);
    assert!(close(r.grad_signal[1], -0.5, 1e-7), "{}", r.grad_signal[1]);
    let gs0 = r.grad_signal[0];
    assert!(close(r.d_weights[0], gs0 * 0.5, 1e-12));
    assert_eq!(r.d_weights[1], 0.0);
    assert!(close(r.d_index_q[0], gs0 * 3.0 * 0.5, 1e-12));
    assert!(r.d_index_q[1..].iter().all(|&v| v == 0.0));
    assert!(close(r.d_index_k[0], gs0 * 3.0, 1e-12));
    assert!(r.d_index_k[1..].iter().all(|&v| v == 0.0));
    assert!(close(gs0 * 3.0, 1.5, 1e-7));
}

/// The same tensors with ratio 2 and two rows: row 0 sees no key, row 1
/// sees key 0 only (L = 2 / 2 = 1). Row 1: target [1/4] (l1 = 4), logit 0,
/// lse 1: predict e^-1; g = -0.25 * c with c = 1 * 1 / 2; G = g;
/// grad_signal = g (1 - e^-1), column 1 zero. A masked column: row 1 of a
/// third run with `logit - lse = -200` gets `g = 0` but still
/// `-predict * G`.
#[test]
fn hand_computed_ratio_and_mask() {
    let (shape, q, w, k) = tiny(2);
    let shape = shape.with_ratio(2);
    let x = HostInputs {
        index_q: &q,
        weights: &w,
        index_k: &k,
        attn_score: &[f32::NAN, f32::NAN, 1.0, f32::NAN],
        attn_l1norm: &[0.0, 4.0],
        index_score: &[f32::NAN, f32::NAN, 0.0, f32::NAN],
        index_lse: &[0.0, 1.0],
        grad_loss: 1.0,
        loss_coeff: 1.0,
    };
    let r = dense::cpu::reference(&shape, &Options::default(), &x).unwrap();
    let g = -0.25 / (4.0 + 1e-10) * 4.0 * 0.5;
    let want = g * (1.0 - (-1.0f64).exp());
    assert_eq!(&r.grad_signal[..2], &[0.0, 0.0]);
    assert!(close(r.grad_signal[2], want, 1e-12), "{}", r.grad_signal[2]);
    assert_eq!(r.grad_signal[3], 0.0);
    // Row 0 contributes nothing; row 1 through key 0 on head 0 only.
    assert!(r.d_index_q[..16 * 64].iter().all(|&v| v == 0.0));
    assert!(close(r.d_index_q[16 * 64], want * 3.0 * 0.5, 1e-12));
    assert!(close(r.d_index_k[0], want * 3.0, 1e-12));

    // Row 0 with q_offset 3 sees both keys ((3 + 0 + 1) / 2 = 2); column 1
    // is masked (logit - lse = -200), its target 0 is clipped to CLIP but
    // masked anyway: g = [-0.5 c, 0] with c = 1/2, G = -0.25, grad_signal =
    // [g0 - 1 * G, 0 - e^-200 * G] = [0, 0.25 e^-200].
    let shape = dense::Shape::bshd(1, 2, 2, 16, 64)
        .with_ratio(2)
        .with_q_offset(vec![3]);
    let x = HostInputs {
        attn_score: &[1.0, 0.0, 1.0, 0.0],
        attn_l1norm: &[2.0, 2.0],
        index_score: &[0.0, -200.0, 0.0, -200.0],
        index_lse: &[0.0, 0.0],
        ..x
    };
    let r = dense::cpu::reference(&shape, &Options::default(), &x).unwrap();
    assert!(r.grad_signal[0].abs() < 1e-10, "{}", r.grad_signal[0]);
    assert!(close(r.grad_signal[1], 0.25 * (-200.0f64).exp(), 1e-9));
}

/// Rows whose offset and ratio leave no key visible (and a packed batch
/// with no keys) write zeros everywhere they own, whatever their score
/// rows hold; a problem where no row sees a key has all-zero outputs.
#[test]
fn rows_that_see_no_key_give_zeros() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    // Batch 0: ratio 4, offset 0: rows 0-2 see nothing, rows 3-5 one key.
    // Batch 1: offset -10: no row sees anything.
    let shape = dense::Shape::bshd(2, 6, 9, 16, 64)
        .with_ratio(4)
        .with_q_offset(vec![0, -10]);
    let mut p = DenseProblem::random(&mut rng, shape.clone(), opts(false, true), 0.0);
    // Unnormalised predicts, so that rows seeing one key have a gradient.
    p.lse.iter_mut().for_each(|v| *v += 0.5);
    // Garbage (not NaN) in the invisible columns, as well.
    for v in p.attn.iter_mut().chain(p.logits.iter_mut()) {
        if v.is_nan() {
            *v = 1e30;
        }
    }
    let r = dense::cpu::reference(&shape, &p.opts, &p.host()).unwrap();
    let dead = |row: usize| shape.row(row).visible == 0;
    assert_eq!((0..12).filter(|&r| dead(r)).count(), 9);
    for row in (0..12).filter(|&r| dead(r)) {
        assert!(r.grad_signal[row * 9..(row + 1) * 9]
            .iter()
            .all(|&v| v == 0.0));
        assert!(r.d_index_q[row * 1024..(row + 1) * 1024]
            .iter()
            .all(|&v| v == 0.0));
        assert!(r.d_weights[row * 16..(row + 1) * 16]
            .iter()
            .all(|&v| v == 0.0));
    }
    // Only key 0 of batch 0 is ever visible.
    assert!(r.d_index_k[64..].iter().all(|&v| v == 0.0));
    assert!(r.d_index_k[..64].iter().any(|&v| v != 0.0));

    let none =
        dense::Shape::varlen(vec![0, 3, 5], vec![0, 0, 4], 16, 64).with_q_offset(vec![5, -2]);
    let p = DenseProblem::random(&mut rng, none.clone(), opts(true, false), 0.0);
    assert!((0..5).all(|r| none.row(r).visible == 0));
    let (gs, dq, dw, dk) = fallback(&p);
    assert!(gs.iter().all(|&v| v == 0.0) && dq.iter().all(|v| v.to_f32() == 0.0));
    assert!(dw.iter().all(|&v| v == 0.0) && dk.iter().all(|&v| v == 0.0));
}

/// The f32 variant that rounds dS to bf16 differs from the f64 reference
/// at bf16 scale in dQ and dK only: the yardstick a dense GPU kernel will
/// be held to (at most twice its error).
#[test]
fn f32_bf16_ds_variant_has_bf16_scale_error() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let shape = dense::Shape::bshd(1, 24, 96, 32, 128).with_q_offset(vec![72]);
    let p = DenseProblem::random(&mut rng, shape.clone(), Options::default(), 0.02);
    let r = dense::cpu::reference(&shape, &p.opts, &p.host()).unwrap();
    let f = dense::cpu::reference_f32_bf16_ds(&shape, &p.opts, &p.host()).unwrap();
    let [eg, eq, ew, ek] = errors(&f, &r);
    println!("dense f32/bf16-dS vs f64: gs {eg:.2e} dq {eq:.2e} dw {ew:.2e} dk {ek:.2e}");
    assert!(eq > 1e-5 && eq < 4e-3, "dq {eq}");
    assert!(ek > 1e-5 && ek < 4e-3, "dk {ek}");
    assert!(ew < 1e-5, "dw does not involve dS rounding: {ew}");
    assert!(eg < 1e-6, "gs {eg}");
}

/// Outputs filled with sentinels, and a check that a call left them so.
struct Sentinels {
    gs: Vec<f32>,
    dq: Vec<bf16>,
    dw: Vec<bf16>,
    dk: Vec<f32>,
}

impl Sentinels {
    fn new(s: &dense::Shape) -> Sentinels {
        Sentinels {
            gs: vec![7.0; s.score_len()],
            dq: vec![bf16::from_f32(7.0); s.q_len()],
            dw: vec![bf16::from_f32(7.0); s.w_len()],
            dk: vec![7.0; s.k_len()],
        }
    }
    fn out(&mut self) -> HostOutputs<'_> {
        HostOutputs {
            index_score: &mut self.gs,
            d_index_q: &mut self.dq,
            d_weights: HostGrad::Bf16(&mut self.dw),
            d_index_k: HostGrad::F32(&mut self.dk),
        }
    }
    fn untouched(&self) -> bool {
        self.gs.iter().all(|&v| v == 7.0)
            && self.dq.iter().all(|v| v.to_f32() == 7.0)
            && self.dw.iter().all(|v| v.to_f32() == 7.0)
            && self.dk.iter().all(|&v| v == 7.0)
    }
}

/// Every bad input of the host path gets its typed error, naming the
/// tensor or parameter, from the fallback, the reference and `dense::run`
/// alike, and the fallback's outputs stay untouched.
#[test]
fn bad_inputs_are_typed_errors_and_write_nothing() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    for varlen in [false, true] {
        let shape = if varlen {
            dense::Shape::varlen(vec![0, 3, 7], vec![0, 5, 11], 16, 64)
        } else {
            dense::Shape::bshd(2, 3, 6, 16, 64)
        }
        .with_q_offset(vec![2, 0])
        .with_ratio(2);
        let p = DenseProblem::random(&mut rng, shape.clone(), Options::default(), 0.0);
        let (o, x) = (p.opts, p.host());
        let short_q = &p.q[1..];
        let long_l1: Vec<f32> = p.l1.iter().copied().chain([1.0]).collect();
        type Case<'a> = (&'static str, dense::Shape, Options, HostInputs<'a>);
        let mut cases: Vec<Case> = vec![
            (
                "index_q",
                shape.clone(),
                o,
                HostInputs {
                    index_q: short_q,
                    ..x
                },
            ),
            (
                "weights",
                shape.clone(),
                o,
                HostInputs {
                    weights: &p.w[..3],
                    ..x
                },
            ),
            (
                "index_k",
                shape.clone(),
                o,
                HostInputs {
                    index_k: &p.k[64..],
                    ..x
                },
            ),
            (
                "attn_score",
                shape.clone(),
                o,
                HostInputs {
                    attn_score: &p.attn[1..],
                    ..x
                },
            ),
            (
                "attn_l1norm",
                shape.clone(),
                o,
                HostInputs {
                    attn_l1norm: &long_l1,
                    ..x
                },
            ),
            (
                "index_score",
                shape.clone(),
                o,
                HostInputs {
                    index_score: &[],
                    ..x
                },
            ),
            (
                "index_lse",
                shape.clone(),
                o,
                HostInputs {
                    index_lse: &p.lse[1..],
                    ..x
                },
            ),
            (
                "loss_coeff",
                shape.clone(),
                o,
                HostInputs {
                    loss_coeff: f32::NAN,
                    ..x
                },
            ),
            (
                "grad_loss",
                shape.clone(),
                o,
                HostInputs {
                    grad_loss: f32::INFINITY,
                    ..x
                },
            ),
            (
                "sm_scale",
                shape.clone(),
                Options {
                    sm_scale: f32::NEG_INFINITY,
                    ..o
                },
                x,
            ),
            ("ratio", shape.clone().with_ratio(0), o, x),
            ("q_offset", shape.clone().with_q_offset(vec![1, 2, 3]), o, x),
            (
                "heads",
                dense::Shape {
                    heads: 8,
                    ..shape.clone()
                },
                o,
                x,
            ),
        ];
        if varlen {
            let cu = |q: Vec<usize>, k: Vec<usize>| dense::Shape {
                layout: Layout::Varlen {
                    cu_seqlens_q: q,
                    cu_seqlens_k: k,
                    score_cols: 6,
                },
                ..shape.clone()
            };
            cases.push(("cu_seqlens_q", cu(vec![1, 3, 7], vec![0, 5, 11]), o, x));
            cases.push(("cu_seqlens_k", cu(vec![0, 3, 7], vec![0, 5, 4]), o, x));
            cases.push(("cu_seqlens_k", cu(vec![0, 3, 7], vec![0, 11]), o, x));
            cases.push((
                "score_cols",
                dense::Shape {
                    layout: Layout::Varlen {
                        cu_seqlens_q: vec![0, 3, 7],
                        cu_seqlens_k: vec![0, 5, 11],
                        score_cols: 5,
                    },
                    ..shape.clone()
                },
                o,
                x,
            ));
            // Lengths follow the packed totals (7 query rows, 11 key rows).
            cases.push(("index_k", cu(vec![0, 3, 7], vec![0, 6, 12]), o, x));
            cases.push(("index_q", cu(vec![0, 3, 8], vec![0, 5, 11]), o, x));
        } else {
            cases.push(("seq_k", dense::Shape::bshd(2, 3, 0, 16, 64), o, x));
            cases.push(("index_k", dense::Shape::bshd(2, 3, 7, 16, 64), o, x));
        }
        for (name, s, opts, x) in cases {
            let mut out = Sentinels::new(&shape);
            let e = dense::cpu::execute(&s, &opts, &x, out.out()).unwrap_err();
            let named = match &e {
                Error::Length { tensor, .. } | Error::CuSeqlens { tensor, .. } => *tensor,
                Error::NonFinite { name, .. } | Error::Shape { name, .. } => *name,
                other => panic!("{name}: unexpected {other:?}"),
            };
            assert_eq!(named, name, "varlen {varlen}: {e}");
            assert!(out.untouched(), "{name}: an output was written");
            let r = dense::cpu::reference(&s, &opts, &x).unwrap_err();
            assert_eq!(r.to_string(), e.to_string());
            let r = dense::run(&s, &opts, &x, false).unwrap_err();
            assert_eq!(r.to_string(), e.to_string());
        }
        // Outputs: element types, then lengths, in the order of HostOutputs.
        let mut out = Sentinels::new(&shape);
        let mut dw32 = vec![7.0f32; shape.w_len()];
        let bad = HostOutputs {
            d_weights: HostGrad::F32(&mut dw32),
            ..out.out()
        };
        let e = dense::cpu::execute(&shape, &o, &x, bad).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Dtype {
                    tensor: "d_weights",
                    expected: "bf16",
                    actual: "f32"
                }
            ),
            "{e}"
        );
        assert!(out.untouched() && dw32.iter().all(|&v| v == 7.0));
        let mut short = vec![7.0f32; shape.score_len() - 1];
        let bad = HostOutputs {
            index_score: &mut short,
            ..out.out()
        };
        let e = dense::cpu::execute(&shape, &o, &x, bad).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Length {
                    tensor: "index_score",
                    ..
                }
            ),
            "{e}"
        );
        let mut dk = vec![7.0f32; shape.k_len() + 64];
        let bad = HostOutputs {
            d_index_k: HostGrad::F32(&mut dk),
            ..out.out()
        };
        let e = dense::cpu::execute(&shape, &o, &x, bad).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Length {
                    tensor: "d_index_k",
                    ..
                }
            ),
            "{e}"
        );
        assert!(out.untouched() && short.iter().all(|&v| v == 7.0) && dk.iter().all(|&v| v == 7.0));
        // And the well-formed call goes through.
        dense::cpu::execute(&shape, &o, &x, out.out()).unwrap();
        assert!(!out.untouched());
    }
}

/// The dense replay binary end to end, BSHD and packed: a random case
/// written to a file, replayed, outputs read back bitwise equal to
/// `dense::run` on the same tensors; a file whose `cu_seqlens_k` decreases
/// is refused with the typed error's message and leaves OUT alone.
#[test]
fn dense_replay_roundtrips_a_case() {
    use indexer_tests::dense_io::write_dense_case;
    use safetensors::SafeTensors;
    let dir = std::env::temp_dir().join(format!("dense-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = env!("CARGO_BIN_EXE_indexer-dense-replay");
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    for varlen in [false, true] {
        let shape = random_shape(&mut rng, varlen, 2);
        let mut p = DenseProblem::random(&mut rng, shape.clone(), opts(true, false), 0.05);
        p.opts.sm_scale = 0.5;
        let (inp, out) = (dir.join("in.safetensors"), dir.join("out.safetensors"));
        write_dense_case(&p, &inp).unwrap();
        let run = std::process::Command::new(exe)
            .args([inp.as_os_str(), out.as_os_str()])
            .args(["--ratio", "2", "--sm-scale", "0.5", "--dk", "bf16"])
            .args(["--loss-coeff", &p.loss_coeff.to_string()])
            .output()
            .unwrap();
        let say = String::from_utf8_lossy(&run.stdout).to_string()
            + &String::from_utf8_lossy(&run.stderr);
        assert!(run.status.success(), "{say}");
        assert!(say.contains("ran on the cpu"), "{say}");
        let want = dense::run(&shape, &p.opts, &p.host(), false).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let raw = |name: &str| st.tensor(name).unwrap().data().to_vec();
        let f32s: Vec<u8> = want
            .grad_signal
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let bf =
            |v: &[bf16]| -> Vec<u8> { v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect() };
        assert_eq!(raw("grad_signal"), f32s);
        assert_eq!(raw("d_index_q"), bf(&want.d_index_q));
        let dk = match &want.d_index_k {
            dsa_indexer_bwd::oneshot::GradVec::Bf16(v) => bf(v),
            other => panic!("d_index_k should be bf16: {other:?}"),
        };
        assert_eq!(raw("d_index_k"), dk);
        let (sq, dims) = match &shape.layout {
            Layout::Bshd {
                batch,
                seq_q,
                seq_k,
            } => (vec![*batch, *seq_q, *seq_k], vec![*batch, *seq_k, 64]),
            Layout::Varlen { score_cols, .. } => {
                (vec![shape.rows(), *score_cols], vec![shape.key_rows(), 64])
            }
        };
        assert_eq!(st.tensor("grad_signal").unwrap().shape(), sq.as_slice());
        assert_eq!(st.tensor("d_index_k").unwrap().shape(), dims.as_slice());
    }
    // A bad cu_seqlens_k: the typed error's message, exit status 1, OUT kept.
    let shape = dense::Shape::varlen(vec![0, 2, 4], vec![0, 3, 5], 16, 64);
    let mut p = DenseProblem::random(&mut rng, shape, Options::default(), 0.0);
    if let Layout::Varlen { cu_seqlens_k, .. } = &mut p.shape.layout {
        cu_seqlens_k[1] = 6; // 0, 6, 5: decreasing
    }
    let (inp, out) = (dir.join("bad.safetensors"), dir.join("out.safetensors"));
    write_dense_case(&p, &inp).unwrap();
    let before = std::fs::read(&out).unwrap();
    let run = std::process::Command::new(exe)
        .args([inp.as_os_str(), out.as_os_str()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{err}");
    assert!(err.contains("cu_seqlens_k[2] = 5"), "{err}");
    assert_eq!(std::fs::read(&out).unwrap(), before);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The dense replay's usage errors and warnings match the sparse one's:
/// negative values are parsed as values (then judged), and non-finite
/// input values are reported before they propagate.
#[test]
fn dense_replay_parses_negative_values_and_reports_non_finite_inputs() {
    use indexer_tests::dense_io::write_dense_case;
    let dir = std::env::temp_dir().join(format!("dense-replay-args-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = env!("CARGO_BIN_EXE_indexer-dense-replay");
    let run = |args: &[&std::ffi::OsStr]| {
        let o = std::process::Command::new(exe).args(args).output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (inp, out) = (dir.join("in.safetensors"), dir.join("out.safetensors"));
    for (flag, value, want) in [
        ("--ratio", "-1", "'-1'"),
        ("--ratio", "0", "'0'"),
        ("--grad-loss", "-inf", "not finite"),
        ("--sm-scale", "-inf", "not finite"),
    ] {
        let (rc, _, err) = run(&[
            inp.as_os_str(),
            out.as_os_str(),
            flag.as_ref(),
            value.as_ref(),
        ]);
        assert_eq!(rc, Some(2), "{flag} {value}: {err}");
        assert!(err.contains(want), "{flag} {value}: {err}");
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let shape = dense::Shape::bshd(1, 4, 6, 16, 64);
    let mut p = DenseProblem::random(&mut rng, shape, Options::default(), 0.0);
    p.k[3] = bf16::NAN;
    p.k[70] = bf16::INFINITY;
    write_dense_case(&p, &inp).unwrap();
    let (rc, out_text, err) = run(&[
        inp.as_os_str(),
        out.as_os_str(),
        "--sm-scale".as_ref(),
        "-0.5".as_ref(),
    ]);
    assert_eq!(rc, Some(0), "{err}");
    assert!(
        err.contains("index_k holds 1 NaN and 1 infinite values"),
        "{err}"
    );
    assert!(out_text.contains("sm_scale flag"), "{out_text}");
    std::fs::remove_dir_all(&dir).unwrap();
}
