//! The forward on the GPU against the f64 CPU reference
//! (`forward::cpu`): random sparse problems over every H x D, both id
//! conventions, B up to 3, padding by -1 and by out-of-range ids (spread
//! or trailing, whole rows of it included), i32 and i64 ids, probabilities
//! and log-probabilities, both kernels, sm_scale zero and negative
//! included; long rows; dense problems (BSHD and packed, query offsets,
//! key ratios). Each output within SPEC's 1e-5 (relative Frobenius error
//! over the finite entries), padding exactly 0 or `-inf`, every run
//! bitwise equal to the last, -1 and out-of-range padding and i32 and i64
//! ids bitwise equal; a rejected call writes nothing.

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use dsa_indexer_bwd::forward::{self, cpu, DenseInputs, DenseOutputs, DensePlan, Kernel, Plan};
use dsa_indexer_bwd::{bf16, dense, Error, KeyIds, Options, ScoreKind, Shape};
use indexer_tests::{finite_rel_err, gpu, same_bits, Gen, Padding, Problem, Values};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use rand::{Rng, SeedableRng};
use std::sync::Arc;

mod common;

/// SPEC's bound on `index_score` and `lse` (relative to f64).
const TOL: f64 = 1e-5;

/// The forward's options from the backward problem's and the knobs.
fn fwd_opts(p: &Problem, portable: bool) -> forward::Options {
    forward::Options {
        sm_scale: p.opts.sm_scale,
        key_ids: p.opts.key_ids,
        score: p.opts.score,
        kernel: if portable {
            Kernel::Portable
        } else {
            Kernel::Auto
        },
    }
}

/// One GPU run: `(index_score, lse)`, outputs pre-filled with 7.
fn run_sparse(ctx: &Arc<CudaContext>, plan: &Plan, p: &Problem) -> (Vec<f32>, Vec<f32>) {
    let stream = ctx.default_stream();
    let s = p.shape;
    let q = stream.clone_htod(&p.q).unwrap();
    let w = stream.clone_htod(&p.w).unwrap();
    let k = stream.clone_htod(&p.k).unwrap();
    let mut score = stream.clone_htod(&vec![7.0f32; s.slots()]).unwrap();
    let mut lse = stream.clone_htod(&vec![7.0f32; s.rows()]).unwrap();
    let mut outs = forward::Outputs {
        index_score: score.as_view_mut(),
        lse: lse.as_view_mut(),
    };
    match &p.ids64 {
        Some(ids) => {
            let ids = stream.clone_htod(ids).unwrap();
            let x = forward::Inputs {
                index_q: q.as_view(),
                weights: w.as_view(),
                index_k: k.as_view(),
                topk_indices: ids.as_view(),
            };
            plan.execute(&stream, &x, &mut outs).unwrap();
        }
        None => {
            let ids = stream.clone_htod(&p.ids).unwrap();
            let x = forward::Inputs {
                index_q: q.as_view(),
                weights: w.as_view(),
                index_k: k.as_view(),
                topk_indices: ids.as_view(),
            };
            plan.execute(&stream, &x, &mut outs).unwrap();
        }
    }
    stream.synchronize().unwrap();
    (
        stream.clone_dtoh(&score).unwrap(),
        stream.clone_dtoh(&lse).unwrap(),
    )
}

/// The forward's comparison ([`finite_rel_err`]) against SPEC's bound.
fn compare(name: &str, got: &[f32], want: &[f64]) -> Result<f64, String> {
    let e = finite_rel_err(name, got, want)?;
    if e > TOL {
        return Err(format!("{name}: error {e:.3e} > {TOL:.0e}"));
    }
    Ok(e)
}

/// Padding slots hold exactly 0 (probabilities) or `-inf` (log).
fn padding_exact(p: &Problem, score: &[f32]) -> Result<(), String> {
    let pad = match p.opts.score {
        ScoreKind::Probs => 0.0f32,
        ScoreKind::LogProbs => f32::NEG_INFINITY,
    };
    for (i, (&v, &ok)) in score.iter().zip(&p.valid).enumerate() {
        if !ok && v != pad {
            return Err(format!("padding slot {i}: {v}, expected {pad}"));
        }
    }
    Ok(())
}

/// The whole check of one sparse case.
fn sparse_case(
    ctx: &Arc<CudaContext>,
    p: &mut Problem,
    rng: &mut impl Rng,
    portable: bool,
) -> Result<(f64, f64), TestCaseError> {
    let opts = fwd_opts(p, portable);
    let plan = Plan::new(ctx, p.shape, opts).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let host = cpu::HostInputs {
        index_q: &p.q,
        weights: &p.w,
        index_k: &p.k,
        topk_indices: &p.ids,
    };
    let r = cpu::reference(&p.shape, &opts, &host).unwrap();
    let ctx_msg = format!("shape {:?} opts {opts:?} kernel {}", p.shape, plan.kernel());
    let (a_score, a_lse) = run_sparse(ctx, &plan, p);
    let es = compare("index_score", &a_score, &r.score).map_err(|e| fail(&e, &ctx_msg))?;
    let el = compare("lse", &a_lse, &r.lse).map_err(|e| fail(&e, &ctx_msg))?;
    padding_exact(p, &a_score).map_err(|e| fail(&e, &ctx_msg))?;
    // Run to run, other padding, i64 ids: the same bits.
    let again = run_sparse(ctx, &plan, p);
    prop_assert!(
        same_bits(&a_score, &again.0) && same_bits(&a_lse, &again.1),
        "rerun differs; {ctx_msg}"
    );
    p.repad(rng, Padding::OutOfRange);
    let b = run_sparse(ctx, &plan, p);
    prop_assert!(
        same_bits(&a_score, &b.0) && same_bits(&a_lse, &b.1),
        "out-of-range padding differs; {ctx_msg}"
    );
    p.widen_ids(rng);
    let c = run_sparse(ctx, &plan, p);
    prop_assert!(
        same_bits(&a_score, &c.0) && same_bits(&a_lse, &c.1),
        "i64 ids differ; {ctx_msg}"
    );
    Ok((es, el))
}

fn fail(e: &str, ctx: &str) -> TestCaseError {
    TestCaseError::fail(format!("{e}; {ctx}"))
}

/// Random sparse cases: `(shape, sm_scale, local, log, portable, seed,
/// short rows, trailing padding, duplicates, grid values)`.
type Case = (Shape, f32, bool, bool, bool, u64, bool, bool, bool, bool);

fn cases(
    seq_q: std::ops::RangeInclusive<usize>,
    seq_k: std::ops::RangeInclusive<usize>,
    topk: std::ops::RangeInclusive<usize>,
) -> impl Strategy<Value = Case> {
    cases_of(vec![16, 32, 64, 128], vec![64, 128], seq_q, seq_k, topk)
}

/// [`cases`] of the given heads and head dimensions.
fn cases_of(
    heads: Vec<usize>,
    dims: Vec<usize>,
    seq_q: std::ops::RangeInclusive<usize>,
    seq_k: std::ops::RangeInclusive<usize>,
    topk: std::ops::RangeInclusive<usize>,
) -> impl Strategy<Value = Case> {
    let shape = common::shapes(heads, dims, seq_q, seq_k, topk);
    (
        shape,
        prop::sample::select(vec![0.088f32, 0.125, 0.05, 0.3, 0.0, -0.1]),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<u64>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
}

fn run_cases(name: &str, n: u32, strategy: impl Strategy<Value = Case>) {
    let Some(ctx) = gpu(name) else { return };
    let mut runner = TestRunner::new(Config {
        cases: n,
        failure_persistence: None,
        ..Config::default()
    });
    let worst = std::cell::Cell::new((0.0f64, 0.0f64));
    let passed = std::cell::Cell::new(0u32);
    runner
        .run(
            &strategy,
            |(shape, sm_scale, local, log, portable, seed, short, trailing, dups, grid)| {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                let opts = Options {
                    sm_scale,
                    key_ids: if local { KeyIds::Local } else { KeyIds::Global },
                    score: if log {
                        ScoreKind::LogProbs
                    } else {
                        ScoreKind::Probs
                    },
                    ..Options::default()
                };
                let gen = Gen {
                    values: if grid {
                        Values::Grid
                    } else {
                        Values::Continuous
                    },
                    padding: Padding::NegOne,
                    short_rows: if short { 0.4 } else { 0.0 },
                    trailing,
                    duplicates: dups,
                    masked: 0.0,
                };
                let mut p = Problem::random(&mut rng, shape, opts, gen);
                let (es, el) = sparse_case(&ctx, &mut p, &mut rng, portable)?;
                let (s0, l0) = worst.get();
                worst.set((s0.max(es), l0.max(el)));
                passed.set(passed.get() + 1);
                Ok(())
            },
        )
        .unwrap();
    let (ws, wl) = worst.get();
    assert_eq!(passed.get(), n);
    println!("{name}: {n} cases passed; worst errors index_score {ws:.2e}, lse {wl:.2e}");
}

#[test]
fn gpu_forward_matches_reference_on_random_problems() {
    run_cases("gpu_forward_random", 160, cases(1..=24, 1..=300, 1..=300));
}

#[test]
fn gpu_forward_on_long_rows_matches_reference() {
    run_cases(
        "gpu_forward_long_rows",
        16,
        cases(1..=4, 2048..=4096, 1000..=3000),
    );
}

/// The persistent wgmma kernel (`kernels_gpu::portable::forward::persistent`: rows
/// of at most 256 slots, `H * D >= 4096`) on more rows than its grid holds
/// CTAs (about 530 of H = 64, D = 128 on an H100 or H200): each CTA walks
/// several rows, loading the next row's q tile, weights and first ids
/// before the row before it ends.
#[test]
fn gpu_forward_rows_past_the_persistent_grid_match_reference() {
    run_cases(
        "gpu_forward_many_rows",
        12,
        cases_of(vec![64, 128], vec![64, 128], 1100..=1500, 1..=300, 1..=256),
    );
}

/// One dense GPU run: `(index_score, index_lse)`.
/// Non-finite weights and a non-positive scale take the kernels' exact
/// gate (`w * relu(sm_scale * s)`, the reference's), finite ones with a
/// positive scale the scaled head sum: rows with a `+inf`, `-inf` or NaN
/// weight give the reference's non-finite outputs and leave the other rows
/// within SPEC's bound, with both kernels.
#[test]
fn gpu_forward_non_finite_weights_match_reference() {
    let Some(ctx) = gpu("gpu_forward_non_finite_weights_match_reference") else {
        return;
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(44);
    let g = Gen {
        values: Values::Continuous,
        padding: Padding::NegOne,
        short_rows: 0.2,
        trailing: false,
        duplicates: false,
        masked: 0.0,
    };
    for (h, d) in [(64, 128), (128, 64), (16, 128)] {
        let shape = Shape {
            batch: 1,
            seq_q: 6,
            seq_k: 300,
            heads: h,
            head_dim: d,
            topk: 200,
        };
        for sm_scale in [0.1f32, -0.1] {
            let opts = Options {
                sm_scale,
                ..Options::default()
            };
            let mut p = Problem::random(&mut rng, shape, opts, g);
            // Row 1: +inf at one head, row 2: -inf, row 3: NaN; rows 0, 4
            // and 5 finite.
            p.w[h + 3] = bf16::INFINITY;
            p.w[2 * h + 5] = bf16::NEG_INFINITY;
            p.w[3 * h + 7] = bf16::NAN;
            for portable in [false, true] {
                let fo = fwd_opts(&p, portable);
                let plan = Plan::new(&ctx, shape, fo).unwrap();
                let host = cpu::HostInputs {
                    index_q: &p.q,
                    weights: &p.w,
                    index_k: &p.k,
                    topk_indices: &p.ids,
                };
                let r = cpu::reference(&shape, &fo, &host).unwrap();
                let (score, lse) = run_sparse(&ctx, &plan, &p);
                let msg = format!("H={h} D={d} sm_scale={sm_scale} {}", plan.kernel());
                compare("index_score", &score, &r.score).unwrap_or_else(|e| panic!("{e}; {msg}"));
                compare("lse", &lse, &r.lse).unwrap_or_else(|e| panic!("{e}; {msg}"));
                assert!(
                    r.lse[1..4].iter().any(|v| !v.is_finite()),
                    "the planted weights make some lse non-finite; {msg}"
                );
            }
        }
    }
}

fn run_dense(
    stream: &Arc<CudaStream>,
    plan: &DensePlan,
    q: &CudaSlice<bf16>,
    w: &CudaSlice<bf16>,
    k: &CudaSlice<bf16>,
) -> (Vec<f32>, Vec<f32>) {
    let s = plan.shape();
    let mut score = stream.clone_htod(&vec![7.0f32; s.score_len()]).unwrap();
    let mut lse = stream.clone_htod(&vec![7.0f32; s.rows()]).unwrap();
    plan.execute(
        stream,
        &DenseInputs {
            index_q: q.as_view(),
            weights: w.as_view(),
            index_k: k.as_view(),
        },
        &mut DenseOutputs {
            index_score: score.as_view_mut(),
            index_lse: lse.as_view_mut(),
        },
    )
    .unwrap();
    stream.synchronize().unwrap();
    (
        stream.clone_dtoh(&score).unwrap(),
        stream.clone_dtoh(&lse).unwrap(),
    )
}

#[test]
fn gpu_dense_forward_matches_reference() {
    let Some(ctx) = gpu("gpu_dense_forward") else {
        return;
    };
    let stream = ctx.default_stream();
    let mut rng = rand::rngs::StdRng::seed_from_u64(2026);
    let mut shapes = Vec::new();
    for (h, d) in [(64, 128), (16, 64), (128, 128), (32, 128)] {
        shapes.push(dense::Shape::bshd(2, 150, 200, h, d));
        shapes.push(dense::Shape::bshd(1, 300, 300, h, d).with_ratio(2));
        shapes.push(
            dense::Shape::varlen(vec![0, 70, 70, 333], vec![0, 90, 150, 400], h, d)
                .with_q_offset(vec![20, 0, -5]),
        );
    }

    let mut n = 0;
    for s in shapes {
        let (rows, h, d) = (s.rows(), s.heads, s.head_dim);
        let draw = |rng: &mut rand::rngs::StdRng, n: usize| -> Vec<bf16> {
            (0..n)
                .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
                .collect()
        };
        let (q, w, k) = (
            draw(&mut rng, rows * h * d),
            draw(&mut rng, rows * h),
            draw(&mut rng, s.key_rows() * d),
        );
        for kernel in [Kernel::Auto, Kernel::Portable] {
            let opts = forward::Options {
                sm_scale: (d as f32).powf(-0.5),
                kernel,
                ..forward::Options::default()
            };
            let plan = DensePlan::new(&ctx, s.clone(), opts).unwrap();
            let x = cpu::DenseHostInputs {
                index_q: &q,
                weights: &w,
                index_k: &k,
            };
            let r = cpu::dense_reference(&s, &opts, &x).unwrap();
            let (dq, dw, dk) = (
                stream.clone_htod(&q).unwrap(),
                stream.clone_htod(&w).unwrap(),
                stream.clone_htod(&k).unwrap(),
            );
            let (score, lse) = run_dense(&stream, &plan, &dq, &dw, &dk);
            let msg = format!("{s:?} {}", plan.kernel());
            let es =
                compare("index_score", &score, &r.score).unwrap_or_else(|e| panic!("{e}; {msg}"));
            let el = compare("index_lse", &lse, &r.lse).unwrap_or_else(|e| panic!("{e}; {msg}"));
            // Columns past each row's visible ones are exactly 0.
            let cols = s.score_cols();
            for rr in 0..rows {
                let v = s.row(rr).visible;
                assert!(
                    score[rr * cols + v..(rr + 1) * cols]
                        .iter()
                        .all(|&x| x == 0.0),
                    "{msg}"
                );
            }
            let again = run_dense(&stream, &plan, &dq, &dw, &dk);
            assert!(
                same_bits(&score, &again.0) && same_bits(&lse, &again.1),
                "{msg}"
            );
            println!("dense {msg}: errors {es:.2e} / {el:.2e}");
            n += 1;
        }
    }
    println!("gpu_dense_forward: {n} problems passed");
}

#[test]
fn gpu_forward_rejects_bad_calls_without_writing() {
    let Some(ctx) = gpu("gpu_forward_rejects") else {
        return;
    };
    let stream = ctx.default_stream();
    let s = Shape {
        batch: 2,
        seq_q: 5,
        seq_k: 40,
        heads: 64,
        head_dim: 128,
        topk: 70,
    };
    let plan = Plan::new(&ctx, s, forward::Options::default()).unwrap();
    let b = |n: usize| stream.clone_htod(&vec![bf16::from_f32(0.5); n]).unwrap();
    let (q, w, k) = (b(s.q_len()), b(s.w_len()), b(s.k_len()));
    let ids = stream.clone_htod(&vec![1i32; s.slots()]).unwrap();
    let short_ids = stream.clone_htod(&vec![1i32; s.slots() - 1]).unwrap();
    let mut score = stream.clone_htod(&vec![7.0f32; s.slots() + 8]).unwrap();
    let mut lse = stream.clone_htod(&vec![7.0f32; s.rows()]).unwrap();
    let untouched = |v: &CudaSlice<f32>| stream.clone_dtoh(v).unwrap().iter().all(|&x| x == 7.0);
    // Too few ids.
    let e = plan.execute(
        &stream,
        &forward::Inputs {
            index_q: q.as_view(),
            weights: w.as_view(),
            index_k: k.as_view(),
            topk_indices: short_ids.as_view(),
        },
        &mut forward::Outputs {
            index_score: score.slice_mut(..s.slots()),
            lse: lse.as_view_mut(),
        },
    );
    assert!(
        matches!(
            e,
            Err(Error::Length {
                tensor: "topk_indices",
                ..
            })
        ),
        "{e:?}"
    );
    // Misaligned index_q.
    let e = plan.execute(
        &stream,
        &forward::Inputs {
            index_q: q.slice(1..),
            weights: w.as_view(),
            index_k: k.as_view(),
            topk_indices: ids.as_view(),
        },
        &mut forward::Outputs {
            index_score: score.slice_mut(..s.slots()),
            lse: lse.as_view_mut(),
        },
    );
    assert!(
        matches!(
            e,
            Err(Error::Length {
                tensor: "index_q",
                ..
            }) | Err(Error::Alignment {
                tensor: "index_q",
                ..
            })
        ),
        "{e:?}"
    );
    // Wrong score length.
    let e = plan.execute(
        &stream,
        &forward::Inputs {
            index_q: q.as_view(),
            weights: w.as_view(),
            index_k: k.as_view(),
            topk_indices: ids.as_view(),
        },
        &mut forward::Outputs {
            index_score: score.as_view_mut(),
            lse: lse.as_view_mut(),
        },
    );
    assert!(
        matches!(
            e,
            Err(Error::Length {
                tensor: "index_score",
                ..
            })
        ),
        "{e:?}"
    );
    stream.synchronize().unwrap();
    assert!(untouched(&score) && untouched(&lse));
    // A shape outside the envelope and a non-finite scale are refused at
    // plan creation.
    assert!(matches!(
        Plan::new(&ctx, Shape { heads: 48, ..s }, forward::Options::default()),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        Plan::new(
            &ctx,
            s,
            forward::Options {
                sm_scale: f32::NAN,
                ..Default::default()
            }
        ),
        Err(Error::NonFinite { .. })
    ));
    println!("gpu_forward_rejects: 5 rejections, nothing written");
}
