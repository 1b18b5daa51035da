//! One small case per kernel family that runs on this GPU, for
//! compute-sanitizer: each case builds a plan, executes once, synchronises
//! and checks every output against the CPU reference (SPEC's tolerances).
//!
//! ```text
//! compute-sanitizer --tool synccheck --error-exitcode 1 indexer-sanitize [--list] [WORD...]
//! ```
//!
//! With words, only the cases whose names contain one of them run (the
//! forward's under the word `forward`).
//!
//! `bash run.sh --sanitize` in the GPU bundle runs it under memcheck,
//! racecheck, synccheck and initcheck. The cases are sized to take seconds
//! under the slowest tool. Exit status 0 only when every case ran and
//! matched the reference; the sanitizer's own exit code reports its
//! findings.

use dsa_indexer_bwd::{dense, Backend, GradDtype, KeyIds, Options, Plan, ScoreKind, Shape};
use indexer_tests::dense::{compare_dense, DenseDevice, DenseProblem};
use indexer_tests::{
    check_against_reference, gpu, run_gpu, shape, Gen, Padding, Problem, Values, CONTINUOUS_FLOORS,
};
use kernels_gpu::sm90::bwd::ids_pair_up;
use rand::rngs::StdRng;
use rand::SeedableRng;

/// One case: what it exercises and how it is built.
struct Case {
    name: &'static str,
    shape: Shape,
    opts: Options,
    gen: Gen,
    /// Rows 2i + 1 copy rows 2i (the paired kernel's test accepts).
    paired: bool,
    /// i64 ids (`Problem::widen_ids`: padding as i64 values outside the
    /// i32 range too), which the kernels read 8 bytes at a time.
    wide: bool,
}

fn opts(key_ids: KeyIds, score: ScoreKind, dk: GradDtype, dw: GradDtype) -> Options {
    Options {
        sm_scale: 0.5,
        key_ids,
        score,
        d_index_k: dk,
        d_weights: dw,
        backend: Backend::Auto,
        deterministic: false,
    }
}

/// [`opts`] in deterministic mode.
fn det(o: Options) -> Options {
    Options {
        deterministic: true,
        ..o
    }
}

fn gen(padding: Padding, trailing: bool) -> Gen {
    Gen {
        values: Values::Grid,
        padding,
        short_rows: 0.3,
        trailing,
        duplicates: true,
        masked: 0.05,
    }
}

fn cases() -> Vec<Case> {
    use GradDtype::{Bf16, F32};
    use KeyIds::{Global, Local};
    use ScoreKind::{LogProbs, Probs};
    vec![
        Case {
            // Odd rows: stage 1, then the wgmma row kernel alone; topk over
            // SKIP_MIN_TOPK with trailing padding, so rows skip chunks.
            name: "stage1 + wgmma row kernel (chunk skip), i64 ids",
            shape: shape(1, 33, 640, 64, 128, 576),
            opts: opts(Global, Probs, F32, GradDtype::Bf16),
            gen: gen(Padding::NegOne, true),
            paired: false,
            wide: true,
        },
        Case {
            name: "stage1 + wgmma paired kernel computing (row kernel exits)",
            shape: shape(2, 24, 192, 64, 128, 256),
            opts: opts(Local, LogProbs, F32, F32),
            gen: gen(Padding::OutOfRange, false),
            paired: true,
            wide: false,
        },
        Case {
            // i64 local ids, bf16 dK (cast), a row pair across the batch
            // boundary (odd S_q), duplicates, padding.
            name: "stage1 + wgmma row kernel + cast, i64 local ids, odd S_q",
            shape: shape(2, 9, 150, 64, 128, 300),
            opts: opts(Local, Probs, Bf16, F32),
            gen: gen(Padding::OutOfRange, true),
            paired: false,
            wide: true,
        },
        Case {
            name: "stage1 + wgmma paired kernel exiting (row kernel computes) + cast",
            shape: shape(1, 32, 512, 64, 128, 192),
            opts: opts(Global, Probs, Bf16, GradDtype::Bf16),
            gen: gen(Padding::NegOne, false),
            paired: false,
            wide: false,
        },
        Case {
            // D = 64: its own stage 1 and wgmma row kernel (no paired
            // kernel), even rows, bf16 dK (cast), i64 ids, chunk skip.
            name: "stage1 d64 + wgmma row kernel H=64 D=64 (chunk skip) + cast, i64 ids",
            shape: shape(2, 17, 300, 64, 64, 520),
            opts: opts(Local, Probs, Bf16, F32),
            gen: gen(Padding::NegOne, true),
            paired: false,
            wide: true,
        },
        Case {
            // H = 32, D = 128: the M = 64 head tile padded (q rows 32..63
            // zero-filled, no reads past the row's 32 heads), the D = 128
            // stage 1, no paired kernel; odd rows, bf16 dK (cast), i64
            // ids, out-of-range padding.
            name: "stage1 + wgmma row kernel H=32 D=128 (padded heads) + cast, i64 ids",
            shape: shape(1, 21, 300, 32, 128, 200),
            opts: opts(Global, LogProbs, Bf16, F32),
            gen: gen(Padding::OutOfRange, true),
            paired: false,
            wide: true,
        },
        Case {
            // H = 128, D = 128: both halves of each CTA on one row (heads
            // 0..63 and 64..127), every item fused; the chunk skip over
            // 128-head d_weights rows (topk 576, trailing padding); odd
            // rows, f32 dK, bf16 d_weights.
            name: "stage1 + wgmma H=128 D=128 (head halves, chunk skip)",
            shape: shape(1, 19, 400, 128, 128, 576),
            opts: opts(Global, Probs, F32, Bf16),
            gen: gen(Padding::NegOne, true),
            paired: false,
            wide: false,
        },
        Case {
            // H = 128, D = 64: the head halves on the D = 64 body (the
            // computing half's warpgroup 1 takes the fused dK), local ids,
            // even rows, bf16 dK (cast).
            name: "stage1 d64 + wgmma H=128 D=64 (head halves) + cast",
            shape: shape(2, 10, 200, 128, 64, 320),
            opts: opts(Local, LogProbs, Bf16, F32),
            gen: gen(Padding::OutOfRange, true),
            paired: false,
            wide: false,
        },
        Case {
            // H = 32, D = 64: the padded head tile on the D = 64 body,
            // chunk skip, i64 ids.
            name: "stage1 d64 + wgmma row kernel H=32 D=64 (chunk skip), i64 ids",
            shape: shape(1, 15, 300, 32, 64, 600),
            opts: opts(Global, Probs, F32, Bf16),
            gen: gen(Padding::NegOne, true),
            paired: false,
            wide: true,
        },
        Case {
            // H = 16, D = 128 with the chunk skip over 16-head d_weights
            // rows (32 bytes, bf16), bf16 dK (cast), i64 ids.
            name: "stage1 + wgmma row kernel H=16 D=128 (chunk skip) + cast, i64 ids",
            shape: shape(1, 13, 300, 16, 128, 640),
            opts: opts(Local, Probs, Bf16, Bf16),
            gen: gen(Padding::NegOne, true),
            paired: false,
            wide: true,
        },
        Case {
            // Deterministic mode: the memset, stage 1, both bound phases,
            // the exponents, the paired kernel's twin computing (the row
            // kernel's twin exits) and the finish into f32.
            name: "deterministic: stage1 + bounds + key sums + scales + wgmma paired twin + finish",
            shape: shape(2, 24, 192, 64, 128, 256),
            opts: det(opts(Local, LogProbs, F32, F32)),
            gen: gen(Padding::OutOfRange, false),
            paired: true,
            wide: false,
        },
        Case {
            name: "deterministic: wgmma row twin (chunk skip), finish into bf16, i64 ids",
            shape: shape(1, 33, 640, 64, 128, 576),
            opts: det(opts(Global, Probs, Bf16, GradDtype::Bf16)),
            gen: gen(Padding::NegOne, true),
            paired: false,
            wide: true,
        },
        Case {
            name: "deterministic: wgmma H=128 D=64 twin (head halves), finish into bf16",
            shape: shape(2, 10, 200, 128, 64, 320),
            opts: det(opts(Local, LogProbs, Bf16, F32)),
            gen: gen(Padding::OutOfRange, true),
            paired: false,
            wide: false,
        },
        Case {
            // Rows of three stage-1 passes (topk > 2048), the bound passes
            // over several batches of slots per thread.
            name: "deterministic: stage1 of three passes + bounds, wgmma row twin H=64 D=64",
            shape: shape(1, 5, 700, 64, 64, 4200),
            opts: det(opts(Global, Probs, F32, F32)),
            gen: gen(Padding::NegOne, true),
            paired: false,
            wide: true,
        },
        Case {
            name: "deterministic: wgmma row twin H=16 D=64",
            shape: shape(2, 17, 300, 16, 64, 520),
            opts: det(opts(Local, Probs, F32, F32)),
            gen: gen(Padding::NegOne, true),
            paired: false,
            wide: true,
        },
        Case {
            // topk 64 (one chunk): still the mma.sync kernel on Hopper.
            name: "mma.sync row kernel H=32 D=128 + cast, i64 ids",
            shape: shape(1, 20, 160, 32, 128, 64),
            opts: opts(Global, Probs, Bf16, GradDtype::Bf16),
            gen: gen(Padding::OutOfRange, false),
            paired: false,
            wide: true,
        },
        Case {
            name: "mma.sync row kernel H=16 D=64",
            shape: shape(2, 9, 96, 16, 64, 40),
            opts: opts(Local, LogProbs, F32, F32),
            gen: gen(Padding::NegOne, false),
            paired: false,
            wide: false,
        },
        Case {
            name: "mma.sync row kernel H=128 D=64",
            shape: shape(1, 6, 80, 128, 64, 60),
            opts: opts(Global, Probs, F32, GradDtype::Bf16),
            gen: gen(Padding::NegOne, false),
            paired: false,
            wide: false,
        },
        Case {
            name: "mma.sync row kernel H=64 D=128 (topk <= 64)",
            shape: shape(1, 10, 64, 64, 128, 48),
            opts: opts(Global, Probs, F32, GradDtype::Bf16),
            gen: gen(Padding::NegOne, false),
            paired: false,
            wide: false,
        },
    ]
}

fn main() {
    // `indexer-sanitize [--list] [WORD...]`: with words, only the cases
    // whose names contain one of them.
    let words: Vec<String> = std::env::args().skip(1).filter(|a| a != "--list").collect();
    let keep = |name: &str| words.is_empty() || words.iter().any(|w| name.contains(w.as_str()));
    let cases: Vec<Case> = cases().into_iter().filter(|c| keep(c.name)).collect();
    if std::env::args().any(|a| a == "--list") {
        for c in &cases {
            println!("{}", c.name);
        }
        return;
    }
    // Problems first (host only): each case's ids must take the path its
    // name says.
    let problems: Vec<Problem> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut rng = StdRng::seed_from_u64(0x5a71 + i as u64);
            let mut p = Problem::random(&mut rng, c.shape, c.opts, c.gen);
            if c.paired {
                p.pair_rows(&mut rng, 1.0, 2);
            }
            if c.wide {
                p.widen_ids(&mut rng);
            }
            let (rows, topk) = (c.shape.rows() as u32, c.shape.topk as u32);
            assert_eq!(
                ids_pair_up(&p.ids, rows, topk),
                c.paired,
                "{}: the dispatch test",
                c.name
            );
            p
        })
        .collect();
    let Some(ctx) = gpu("indexer-sanitize") else {
        return;
    };
    for (i, (c, p)) in cases.iter().zip(&problems).enumerate() {
        let plan = Plan::new(&ctx, c.shape, c.opts).expect("plan");
        let out = run_gpu(&ctx, p);
        let e = check_against_reference(p, &out);
        println!(
            "case {}/{}: {}: kernels {:?}; errors dq {:.2e} dw {:.2e} dk {:.2e}: ok",
            i + 1,
            cases.len(),
            c.name,
            plan.kernels(),
            e.d_index_q,
            e.d_weights,
            e.d_index_k
        );
    }
    let dense: Vec<_> = dense_cases()
        .into_iter()
        .filter(|(name, _)| keep(name))
        .collect();
    for (i, (name, p)) in dense.iter().enumerate() {
        let plan = dense::Plan::new(&ctx, p.shape.clone(), p.opts).expect("dense plan");
        assert!(plan.on_gpu(), "{name}: the dense GPU path");
        let stream = ctx.default_stream();
        let mut d = DenseDevice::upload(&stream, p, plan.workspace_bytes());
        d.execute(&plan, &stream, p.loss_coeff)
            .expect("dense execute");
        let out = d.download(&stream, &p.opts);
        let e = compare_dense(p, &out, CONTINUOUS_FLOORS).unwrap_or_else(|e| panic!("{e}"));
        println!(
            "dense case {}/{}: {name}: errors dq {:.2e} dw {:.2e} dk {:.2e}: ok",
            i + 1,
            dense.len(),
            e.d_index_q,
            e.d_weights,
            e.d_index_k
        );
    }
    let fwd = if keep("forward") {
        forward_cases(&ctx)
    } else {
        0
    };
    println!(
        "indexer-sanitize: {} cases ok",
        cases.len() + dense.len() + fwd
    );
}

/// The forward kernels: the wgmma and the portable kernel on a sparse
/// problem (local i64 ids with padding, log-probabilities, topk past two
/// chunks) and on a dense packed one, each checked against the reference.
fn forward_cases(ctx: &std::sync::Arc<cudarc::driver::CudaContext>) -> usize {
    use dsa_indexer_bwd::forward::{self, cpu, Kernel};
    let stream = ctx.default_stream();
    let mut n = 0;
    // The wgmma kernel of one CTA per row (topk 300), the portable one,
    // then the persistent wgmma kernel (topk 150, H * D = 4096) on more
    // rows than its grid holds CTAs (each CTA walks several rows, loading
    // the next row's while one ends).
    for (kernel, seq_q, topk) in [
        (Kernel::Auto, 9, 300),
        (Kernel::Portable, 9, 150),
        (Kernel::Auto, 1300, 150),
    ] {
        let s = shape(2, seq_q, 90, 32, 128, topk);
        let bopts = opts(
            KeyIds::Local,
            ScoreKind::LogProbs,
            GradDtype::F32,
            GradDtype::Bf16,
        );
        let mut rng = StdRng::seed_from_u64(0xf0 + n as u64);
        let mut p = Problem::random(&mut rng, s, bopts, gen(Padding::OutOfRange, false));
        p.widen_ids(&mut rng);
        let fo = forward::Options {
            sm_scale: 0.5,
            key_ids: KeyIds::Local,
            score: ScoreKind::LogProbs,
            kernel,
        };
        let plan = forward::Plan::new(ctx, s, fo).expect("forward plan");
        let ids = stream.clone_htod(p.ids64.as_ref().unwrap()).unwrap();
        let (q, w, k) = (
            stream.clone_htod(&p.q).unwrap(),
            stream.clone_htod(&p.w).unwrap(),
            stream.clone_htod(&p.k).unwrap(),
        );
        let mut score = stream.alloc_zeros::<f32>(s.slots()).unwrap();
        let mut lse = stream.alloc_zeros::<f32>(s.rows()).unwrap();
        plan.execute(
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
        )
        .expect("forward execute");
        let got = stream.clone_dtoh(&lse).unwrap();
        let x = cpu::HostInputs {
            index_q: &p.q,
            weights: &p.w,
            index_k: &p.k,
            topk_indices: &p.ids,
        };
        let r = cpu::reference(&s, &fo, &x).unwrap();
        let got_s = stream.clone_dtoh(&score).unwrap();
        let err = |name, g: &[f32], w: &[f64]| {
            indexer_tests::finite_rel_err(name, g, w).unwrap_or_else(|e| panic!("{e}"))
        };
        let e = err("index_score", &got_s, &r.score);
        let el = err("lse", &got, &r.lse);
        assert!(
            e <= 1e-5 && el <= 1e-5,
            "forward {}: errors {e:.2e} {el:.2e}",
            plan.kernel()
        );
        n += 1;
        println!(
            "forward case {n}: {}: errors score {e:.2e} lse {el:.2e}: ok",
            plan.kernel()
        );
        // Dense, packed with offsets.
        let ds = dense::Shape::varlen(vec![0, 40, 71], vec![0, 100, 170], 32, 128)
            .with_q_offset(vec![50, -2]);
        let dopts = forward::Options { kernel, ..fo };
        let dplan = forward::DensePlan::new(ctx, ds.clone(), dopts).expect("dense forward plan");
        let b = |n: usize| -> Vec<dsa_indexer_bwd::bf16> {
            (0..n)
                .map(|i| dsa_indexer_bwd::bf16::from_f32(((i * 37 % 17) as f32 - 8.0) / 8.0))
                .collect()
        };
        let (hq, hw, hk) = (b(ds.q_len()), b(ds.w_len()), b(ds.k_len()));
        let (q, w, k) = (
            stream.clone_htod(&hq).unwrap(),
            stream.clone_htod(&hw).unwrap(),
            stream.clone_htod(&hk).unwrap(),
        );
        let mut score = stream.alloc_zeros::<f32>(ds.score_len()).unwrap();
        let mut lse = stream.alloc_zeros::<f32>(ds.rows()).unwrap();
        dplan
            .execute(
                &stream,
                &forward::DenseInputs {
                    index_q: q.as_view(),
                    weights: w.as_view(),
                    index_k: k.as_view(),
                },
                &mut forward::DenseOutputs {
                    index_score: score.as_view_mut(),
                    index_lse: lse.as_view_mut(),
                },
            )
            .expect("dense forward execute");
        let r = cpu::dense_reference(
            &ds,
            &dopts,
            &cpu::DenseHostInputs {
                index_q: &hq,
                weights: &hw,
                index_k: &hk,
            },
        )
        .unwrap();
        let got_s = stream.clone_dtoh(&score).unwrap();
        let e = err("index_score", &got_s, &r.score);
        let el = err("index_lse", &stream.clone_dtoh(&lse).unwrap(), &r.lse);
        assert!(
            el <= 1e-5,
            "dense forward {}: lse error {el:.2e}",
            dplan.kernel()
        );
        assert!(e <= 1e-5, "dense forward {}: error {e:.2e}", dplan.kernel());
        n += 1;
        println!(
            "forward case {n}: dense {}: error {e:.2e}: ok",
            dplan.kernel()
        );
    }
    n
}

/// Dense mode's cases: its stage 1, then at H = 64, D = 128 dense mode's
/// tile kernel (BSHD with bf16 dK; packed with an odd batch, offsets,
/// ratio 2 and f32 outputs), and on H = 16, D = 64 the wgmma kernels of
/// the equivalent sparse problem (packed, offsets, ratio 2); and both in
/// deterministic mode (the tile twin's chains, the sparse twins' passes).
fn dense_cases() -> Vec<(&'static str, DenseProblem)> {
    let bf16_dk = Options {
        sm_scale: 0.5,
        d_index_k: GradDtype::Bf16,
        ..Options::default()
    };
    let f32_all = Options {
        sm_scale: 0.5,
        d_weights: GradDtype::F32,
        ..Options::default()
    };
    let cases = [
        (
            "dense stage1 + tiles H=64 D=128 (BSHD, offsets, bf16 dK)",
            dense::Shape::bshd(2, 40, 130, 64, 128).with_q_offset(vec![0, 50]),
            bf16_dk,
        ),
        (
            "dense stage1 + tiles H=64 D=128 (packed, odd batch, offsets, ratio 2)",
            dense::Shape::varlen(vec![0, 33, 50], vec![0, 150, 200], 64, 128)
                .with_q_offset(vec![100, -3])
                .with_ratio(2),
            f32_all,
        ),
        (
            "dense stage1 + wgmma H=16 D=64 (packed, offsets, ratio 2)",
            dense::Shape::varlen(vec![0, 30, 47], vec![0, 150, 230], 16, 64)
                .with_q_offset(vec![100, 7])
                .with_ratio(2),
            f32_all,
        ),
        (
            "dense deterministic: stage1 + tile twin H=64 D=128 (chains of two turns)",
            dense::Shape::bshd(1, 300, 300, 64, 128),
            Options {
                deterministic: true,
                ..f32_all
            },
        ),
        (
            "dense deterministic: stage1 + bounds + key sums + wgmma H=16 D=64 twin + finish into bf16",
            dense::Shape::varlen(vec![0, 30, 47], vec![0, 150, 230], 16, 64)
                .with_q_offset(vec![100, 7]),
            Options {
                deterministic: true,
                ..bf16_dk
            },
        ),
    ];
    cases
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape, opts))| {
            let mut rng = StdRng::seed_from_u64(0xde5e + i as u64);
            (name, DenseProblem::random(&mut rng, shape, opts, 0.05))
        })
        .collect()
}
