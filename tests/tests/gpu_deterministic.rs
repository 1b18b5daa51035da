//! Deterministic mode on the GPU (`Options::deterministic`): every output
//! bitwise the same whatever order the scatter's additions land in (runs,
//! streams, concurrent work on other streams, i32 or i64 ids, padding by
//! -1 or by out-of-range ids, CUDA-graph replays), and within SPEC's
//! tolerances of the CPU reference; random shapes over the whole envelope
//! of the Hopper fast path (H in {16, 32, 64, 128}, D in {64, 128},
//! topk > 64), both id conventions, B > 1, duplicates, paired rows, f32
//! and bf16 outputs; dense mode on both of its strategies; and, where the
//! machine has two GPUs of one model, the same bits on each.

mod common;

use dsa_indexer_bwd::cudarc::driver::CudaContext;
use dsa_indexer_bwd::{dense, Error, GradDtype, KeyIds, Options, Plan, Shape};
use indexer_tests::{
    compare_with_reference, gpu, run_gpu, same_bits, DeviceProblem, Gen, GpuOut, Padding, Problem,
    Values, GRID_FLOORS,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use rand::SeedableRng;
use std::sync::Arc;

/// Whether two runs wrote the same bits into every output.
fn same_outputs(a: &GpuOut, b: &GpuOut) -> Result<(), String> {
    let f64_bits = |x: &[f64], y: &[f64]| {
        x.len() == y.len() && x.iter().zip(y).all(|(u, v)| u.to_bits() == v.to_bits())
    };
    let mut bad = Vec::new();
    if !same_bits(&a.grad_signal, &b.grad_signal) {
        bad.push("grad_signal");
    }
    if !same_bits(&a.d_index_q, &b.d_index_q) {
        bad.push("d_index_q");
    }
    if a.d_weights_bits != b.d_weights_bits {
        bad.push("d_weights");
    }
    if !f64_bits(&a.d_index_k, &b.d_index_k) {
        bad.push("d_index_k");
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!("outputs differ: {}", bad.join(", ")))
    }
}

/// Number of `d_index_k` elements whose bits differ between two runs.
fn dk_differences(a: &GpuOut, b: &GpuOut) -> usize {
    a.d_index_k
        .iter()
        .zip(&b.d_index_k)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count()
}

/// Shapes of the fast path's envelope with topk > 64, deterministic
/// options of every kind.
fn cases() -> impl Strategy<Value = (Shape, Options, u64, bool, bool)> {
    let shape = common::shapes(
        vec![16, 32, 64, 128],
        vec![64, 128],
        1..=40,
        1..=300,
        65..=700,
    );
    let opts = common::options(vec![1.0f32, 0.125, 0.37, -0.5, 2.5], true);
    (shape, opts, any::<u64>(), any::<bool>(), any::<bool>())
}

/// Runs random case `(shape, opts, seed, dups, paired)` four times on the
/// GPU (padding by -1, again, out-of-range padding, i64 ids) and checks
/// the first run against the reference (SPEC tolerances and the 2x-of-f32
/// bound) and all four runs bit for bit against each other. `dups` lets
/// rows repeat ids; `paired` pairs the rows up where their number is even
/// (the paired kernel's twin, shared keys reduced once).
fn check_case(
    ctx: &Arc<CudaContext>,
    (shape, opts, seed, dups, paired): (Shape, Options, u64, bool, bool),
) -> Result<(), TestCaseError> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let gen = Gen {
        values: Values::Grid,
        padding: Padding::NegOne,
        short_rows: 0.3,
        trailing: seed % 2 == 0,
        duplicates: dups,
        masked: 0.05,
    };
    let mut p = Problem::random(&mut rng, shape, opts, gen);
    if paired && shape.rows() % 2 == 0 {
        p.pair_rows(&mut rng, 1.0, 2);
    }
    p.repad(&mut rng, Padding::NegOne);
    let a = run_gpu(ctx, &p);
    let e = compare_with_reference(&p, &a, GRID_FLOORS);
    prop_assert!(e.is_ok(), "{shape:?}: {}", e.unwrap_err());
    let again = run_gpu(ctx, &p);
    prop_assert!(
        same_outputs(&a, &again).is_ok(),
        "rerun: {:?}",
        same_outputs(&a, &again)
    );
    p.repad(&mut rng, Padding::OutOfRange);
    let b = run_gpu(ctx, &p);
    prop_assert!(
        same_outputs(&a, &b).is_ok(),
        "padding: {:?}",
        same_outputs(&a, &b)
    );
    p.widen_ids(&mut rng);
    let c = run_gpu(ctx, &p);
    prop_assert!(
        same_outputs(&a, &c).is_ok(),
        "i64 ids: {:?}",
        same_outputs(&a, &c)
    );
    Ok(())
}

/// 96 random cases of [`cases`], each checked by [`check_case`]; half the
/// cases with an even number of rows pair their rows up.
#[test]
fn gpu_deterministic_matches_reference_and_itself_on_random_problems() {
    let Some(ctx) = gpu("gpu_deterministic_matches_reference_and_itself_on_random_problems") else {
        return;
    };
    let mut runner = TestRunner::new(Config {
        cases: 96,
        failure_persistence: None,
        ..Config::default()
    });
    runner.run(&cases(), |c| check_case(&ctx, c)).unwrap();
}

/// Rows longer than stage 1 holds in registers (topk > 2048: stage 1
/// reads a row's scores in two or three passes, and the bound passes walk
/// its slots in several batches per thread): 12 random cases over the
/// envelope with repeated ids, each checked by [`check_case`].
#[test]
fn gpu_deterministic_long_rows_match_reference_and_itself() {
    let Some(ctx) = gpu("gpu_deterministic_long_rows_match_reference_and_itself") else {
        return;
    };
    let mut runner = TestRunner::new(Config {
        cases: 12,
        failure_persistence: None,
        ..Config::default()
    });
    let shape = common::shapes(
        vec![16, 32, 64, 128],
        vec![64, 128],
        1..=6,
        1..=700,
        2049..=6200,
    );
    let opts = common::options(vec![1.0f32, 0.37, -0.5], true);
    let long = (shape, opts, any::<u64>(), Just(true), Just(false));
    runner.run(&long, |c| check_case(&ctx, c)).unwrap();
}

/// One problem where many rows select the same keys (so the scatter's
/// additions into a key row race), run on the default stream, on fresh
/// streams, and twice concurrently on two streams with a default-mode
/// plan of the same problem running on a third between them: every
/// deterministic run writes the same bits. The default mode's own runs
/// are printed for comparison (its d_index_k usually differs run to run;
/// not asserted).
#[test]
fn gpu_deterministic_outputs_do_not_depend_on_streams_or_interleaving() {
    let Some(ctx) = gpu("gpu_deterministic_outputs_do_not_depend_on_streams_or_interleaving")
    else {
        return;
    };
    for (heads, dim, dk) in [
        (64usize, 128usize, GradDtype::F32),
        (128, 128, GradDtype::Bf16),
        (64, 64, GradDtype::F32),
    ] {
        let shape = Shape {
            batch: 2,
            seq_q: 300,
            seq_k: 96,
            heads,
            head_dim: dim,
            topk: 512,
        };
        let opts = Options {
            d_index_k: dk,
            key_ids: KeyIds::Local,
            deterministic: true,
            ..Options::default()
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(7 + heads as u64 + dim as u64);
        let gen = Gen {
            values: Values::Continuous,
            padding: Padding::NegOne,
            short_rows: 0.2,
            trailing: false,
            duplicates: true,
            masked: 0.05,
        };
        let p = Problem::random(&mut rng, shape, opts, gen);
        let first = run_gpu(&ctx, &p);
        let det_err = compare_with_reference(&p, &first, indexer_tests::CONTINUOUS_FLOORS)
            .unwrap_or_else(|e| panic!("H={heads} D={dim}: {e}"));
        let plan = Plan::new(&ctx, shape, opts).expect("plan");
        let fast = Plan::new(
            &ctx,
            shape,
            Options {
                deterministic: false,
                ..opts
            },
        )
        .expect("default plan");
        let (s1, s2, s3) = (
            ctx.new_stream().unwrap(),
            ctx.new_stream().unwrap(),
            ctx.new_stream().unwrap(),
        );
        let mut runs = Vec::new();
        for round in 0..3 {
            let mut d1 = DeviceProblem::upload(&s1, &p, plan.workspace_bytes());
            let mut d2 = DeviceProblem::upload(&s2, &p, plan.workspace_bytes());
            let mut d3 = DeviceProblem::upload(&s3, &p, fast.workspace_bytes());
            s1.synchronize().unwrap();
            s2.synchronize().unwrap();
            s3.synchronize().unwrap();
            // Queued back to back on three streams: the GPU runs them
            // concurrently, in an order that changes from round to round.
            queue_round(
                round,
                |i| match i {
                    0 => d1.execute(&plan, &s1, p.loss_coeff).unwrap(),
                    _ => d2.execute(&plan, &s2, p.loss_coeff).unwrap(),
                },
                || d3.execute(&fast, &s3, p.loss_coeff).unwrap(),
            );
            s1.synchronize().unwrap();
            s2.synchronize().unwrap();
            s3.synchronize().unwrap();
            runs.push((
                d1.download(&s1, &opts),
                d2.download(&s2, &opts),
                d3.download(&s3, &opts),
            ));
        }
        let mut default_diffs = Vec::new();
        for (i, (r1, r2, r3)) in runs.iter().enumerate() {
            for (which, r) in [("stream 1", r1), ("stream 2", r2)] {
                if let Err(e) = same_outputs(&first, r) {
                    panic!("H={heads} D={dim} {dk:?}: round {i}, {which}: {e}");
                }
            }
            default_diffs.push(dk_differences(&runs[0].2, r3));
        }
        let default_err = compare_with_reference(&p, &runs[0].2, indexer_tests::CONTINUOUS_FLOORS)
            .unwrap_or_else(|e| panic!("H={heads} D={dim}, default mode: {e}"));
        println!(
            "H={heads} D={dim} {dk:?}: deterministic runs bitwise equal (7 runs); default mode's \
             d_index_k elements differing from its first run: {default_diffs:?} of {}; \
             d_index_k error against the f64 reference: deterministic {:.3e}, default {:.3e}",
            first.d_index_k.len(),
            det_err.d_index_k,
            default_err.d_index_k
        );
    }
}

/// Queues round `round` of an interleaving test: the deterministic runs
/// `det(0)` and `det(1)` (one stream each) and the default-mode run
/// `fast()` (a third), in an order that changes from round to round.
fn queue_round(round: usize, mut det: impl FnMut(usize), mut fast: impl FnMut()) {
    match round % 3 {
        0 => {
            det(0);
            fast();
            det(1);
        }
        1 => {
            fast();
            det(1);
            det(0);
        }
        _ => {
            det(1);
            det(0);
            fast();
        }
    }
}

/// Dense mode: long causal sequences, so that each key tile's sums come
/// from several runs of query rows (the tile twin's chains of up to five
/// turns) and, at other H x D, from every visible row (the sparse
/// strategy's twins). Each problem runs on the default stream, then three
/// rounds of two deterministic runs on two streams with a default-mode
/// run on a third between them, queued in changing orders: every
/// deterministic run writes the bits of the first, which is within the
/// dense reference's tolerances. The default mode's d_index_k differences
/// are printed (not asserted).
#[test]
fn gpu_deterministic_dense_mode_does_not_depend_on_streams_or_interleaving() {
    use indexer_tests::dense::{compare_dense, DenseDevice, DenseProblem};
    let Some(ctx) = gpu("gpu_deterministic_dense_mode_does_not_depend_on_streams_or_interleaving")
    else {
        return;
    };
    if ctx.compute_capability().unwrap() != (9, 0) {
        return;
    }
    let cases = [
        (dense::Shape::bshd(1, 1100, 1100, 64, 128), GradDtype::F32),
        (
            dense::Shape::varlen(vec![0, 700, 1000], vec![0, 600, 1300], 64, 128)
                .with_q_offset(vec![0, 250])
                .with_ratio(2),
            GradDtype::Bf16,
        ),
        (dense::Shape::bshd(2, 300, 260, 32, 128), GradDtype::F32),
        (dense::Shape::bshd(1, 400, 400, 64, 64), GradDtype::Bf16),
    ];
    for (i, (shape, dk)) in cases.into_iter().enumerate() {
        let opts = Options {
            d_index_k: dk,
            d_weights: GradDtype::F32,
            deterministic: true,
            ..Options::default()
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(40 + i as u64);
        let p = DenseProblem::random(&mut rng, shape.clone(), opts, 0.05);
        let plan = dense::Plan::new(&ctx, shape.clone(), opts).expect("plan");
        let fast_opts = Options {
            deterministic: false,
            ..opts
        };
        let fast = dense::Plan::new(&ctx, shape.clone(), fast_opts).expect("default plan");
        assert!(plan.on_gpu() && fast.on_gpu());
        let stream = ctx.default_stream();
        let mut d = DenseDevice::upload(&stream, &p, plan.workspace_bytes());
        d.execute(&plan, &stream, p.loss_coeff).unwrap();
        let first = d.download(&stream, &opts);
        let det_err = compare_dense(&p, &first, indexer_tests::CONTINUOUS_FLOORS)
            .unwrap_or_else(|e| panic!("case {i}: {e}"));
        let (s1, s2, s3) = (
            ctx.new_stream().unwrap(),
            ctx.new_stream().unwrap(),
            ctx.new_stream().unwrap(),
        );
        let mut default_runs = Vec::new();
        for round in 0..3 {
            let mut d1 = DenseDevice::upload(&s1, &p, plan.workspace_bytes());
            let mut d2 = DenseDevice::upload(&s2, &p, plan.workspace_bytes());
            let mut d3 = DenseDevice::upload(&s3, &p, fast.workspace_bytes());
            for s in [&s1, &s2, &s3] {
                s.synchronize().unwrap();
            }
            queue_round(
                round,
                |i| match i {
                    0 => d1.execute(&plan, &s1, p.loss_coeff).unwrap(),
                    _ => d2.execute(&plan, &s2, p.loss_coeff).unwrap(),
                },
                || d3.execute(&fast, &s3, p.loss_coeff).unwrap(),
            );
            for s in [&s1, &s2, &s3] {
                s.synchronize().unwrap();
            }
            for (which, r) in [
                ("stream 1", d1.download(&s1, &opts)),
                ("stream 2", d2.download(&s2, &opts)),
            ] {
                if let Err(e) = same_outputs(&first, &r) {
                    panic!("case {i} {dk:?}: round {round}, {which}: {e}");
                }
            }
            default_runs.push(d3.download(&s3, &fast_opts));
        }
        let diffs: Vec<usize> = default_runs
            .iter()
            .map(|r| dk_differences(&default_runs[0], r))
            .collect();
        let default_err = compare_dense(&p, &default_runs[0], indexer_tests::CONTINUOUS_FLOORS)
            .unwrap_or_else(|e| panic!("case {i}, default mode: {e}"));
        println!(
            "dense case {i} (H={} D={} {dk:?}): deterministic runs bitwise equal (7 runs); \
             default mode's d_index_k elements differing from its first run: {diffs:?} of {}; \
             d_index_k error against the f64 reference: deterministic {:.3e}, default {:.3e}",
            shape.heads,
            shape.head_dim,
            first.d_index_k.len(),
            det_err.d_index_k,
            default_err.d_index_k
        );
    }
}

/// A 64-bit FNV-1a digest of every output's bits (for comparing runs on
/// different machines by their printed digests).
fn digest(o: &GpuOut) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut eat = |bits: u64| {
        for b in bits.to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    };
    o.grad_signal.iter().for_each(|x| eat(x.to_bits() as u64));
    o.d_index_q.iter().for_each(|x| eat(x.to_bits() as u64));
    o.d_weights_bits.iter().for_each(|&x| eat(x as u64));
    o.d_index_k.iter().for_each(|x| eat(x.to_bits()));
    h
}

/// Every GPU of the machine of the same model as GPU 0 writes the bits GPU
/// 0 writes, for a sparse problem (the fixed-point passes and twins) and a
/// dense one (the tile twin's chains). Prints GPU 0's digests of both (so
/// that runs on other machines can be compared); with one GPU it compares
/// nothing and says so.
#[test]
fn gpu_deterministic_outputs_are_equal_across_the_machine_s_gpus() {
    use indexer_tests::dense::{DenseDevice, DenseProblem};
    let name = "gpu_deterministic_outputs_are_equal_across_the_machine_s_gpus";
    let Some(ctx0) = gpu(name) else {
        return;
    };
    if ctx0.compute_capability().unwrap() != (9, 0) {
        return;
    }
    let n = dsa_indexer_bwd::cuda_device_count();
    let mut ctxs = vec![ctx0];
    ctxs.extend((1..n).map(|i| cudarc::driver::CudaContext::new(i).expect("CUDA device")));
    let model = ctxs[0].name().unwrap();
    let shape = Shape {
        batch: 2,
        seq_q: 300,
        seq_k: 96,
        heads: 64,
        head_dim: 128,
        topk: 512,
    };
    let opts = Options {
        key_ids: KeyIds::Local,
        deterministic: true,
        ..Options::default()
    };
    let gen = Gen {
        values: Values::Continuous,
        padding: Padding::NegOne,
        short_rows: 0.2,
        trailing: false,
        duplicates: true,
        masked: 0.05,
    };
    let p = Problem::random(&mut rand::rngs::StdRng::seed_from_u64(5), shape, opts, gen);
    let dshape = dense::Shape::bshd(1, 900, 900, 64, 128);
    let dp = DenseProblem::random(
        &mut rand::rngs::StdRng::seed_from_u64(6),
        dshape.clone(),
        opts,
        0.05,
    );
    let dense_run = |ctx: &std::sync::Arc<cudarc::driver::CudaContext>| {
        let plan = dense::Plan::new(ctx, dshape.clone(), opts).expect("dense plan");
        let stream = ctx.default_stream();
        let mut d = DenseDevice::upload(&stream, &dp, plan.workspace_bytes());
        d.execute(&plan, &stream, dp.loss_coeff).unwrap();
        d.download(&stream, &opts)
    };
    let (first, first_dense) = (run_gpu(&ctxs[0], &p), dense_run(&ctxs[0]));
    println!(
        "GPU 0 ({model}): digest of the outputs, sparse {:016x}, dense {:016x}",
        digest(&first),
        digest(&first_dense)
    );
    if n < 2 {
        println!("{name}: one GPU: nothing compared across GPUs");
        return;
    }
    let mut compared = 0;
    for (i, ctx) in ctxs.iter().enumerate().skip(1) {
        if ctx.name().unwrap() != model {
            println!("GPU {i} is not a {model}: not compared");
            continue;
        }
        if let Err(e) = same_outputs(&first, &run_gpu(ctx, &p)) {
            panic!("GPU {i} against GPU 0, sparse: {e}");
        }
        if let Err(e) = same_outputs(&first_dense, &dense_run(ctx)) {
            panic!("GPU {i} against GPU 0, dense: {e}");
        }
        compared += 1;
    }
    println!("{compared} GPU(s) of model {model} wrote GPU 0's bits (sparse and dense)");
}

/// Non-finite inputs: a NaN in one query row's q, an infinity in one
/// weight. The deterministic d_index_k is non-finite exactly where the
/// reference's is, and equal to itself from run to run (NaN payloads
/// included).
#[test]
fn gpu_deterministic_non_finite_outputs_follow_the_reference() {
    let Some(ctx) = gpu("gpu_deterministic_non_finite_outputs_follow_the_reference") else {
        return;
    };
    let shape = Shape {
        batch: 1,
        seq_q: 24,
        seq_k: 80,
        heads: 64,
        head_dim: 128,
        topk: 192,
    };
    let opts = Options {
        deterministic: true,
        ..Options::default()
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    let gen = Gen {
        values: Values::Grid,
        padding: Padding::NegOne,
        short_rows: 0.1,
        trailing: false,
        duplicates: true,
        masked: 0.0,
    };
    let mut p = Problem::random(&mut rng, shape, opts, gen);
    p.q[3 * 64 * 128 + 5 * 128 + 17] = half::bf16::NAN;
    p.w[9 * 64 + 2] = half::bf16::INFINITY;
    let a = run_gpu(&ctx, &p);
    let b = run_gpu(&ctx, &p);
    same_outputs(&a, &b).expect("non-finite inputs: runs differ");
    let r = dsa_indexer_bwd::cpu::reference(&p.shape, &p.opts, &p.host()).expect("reference");
    let got: Vec<bool> = a.d_index_k.iter().map(|x| x.is_finite()).collect();
    let want: Vec<bool> = r.d_index_k.iter().map(|x| x.is_finite()).collect();
    assert!(want.iter().any(|f| !f), "the inputs reach d_index_k");
    assert!(want.iter().any(|f| *f), "some of d_index_k stays finite");
    assert_eq!(got, want, "which d_index_k elements are non-finite");
}

/// Where deterministic mode does not run, `Plan::new` says so
/// (`Error::NotImplemented`): topk <= 64 (the mma.sync kernels), dense
/// mode where it has no GPU path.
#[test]
fn gpu_deterministic_mode_is_refused_where_it_does_not_run() {
    let Some(ctx) = gpu("gpu_deterministic_mode_is_refused_where_it_does_not_run") else {
        return;
    };
    let det = Options {
        deterministic: true,
        ..Options::default()
    };
    let short = Shape {
        batch: 1,
        seq_q: 8,
        seq_k: 64,
        heads: 64,
        head_dim: 128,
        topk: 64,
    };
    let e = Plan::new(&ctx, short, det).err().expect("topk 64 refused");
    assert!(matches!(e, Error::NotImplemented { .. }), "{e}");
    // Dense mode without a GPU path (H = 32 over 16 key columns).
    let d = dense::Shape::bshd(1, 16, 16, 32, 128);
    let e = dense::Plan::new(&ctx, d, det).err().expect("dense refused");
    assert!(matches!(e, Error::NotImplemented { .. }), "{e}");
    // Dense mode's tile kernel takes it: its workspace holds the turn
    // table (a ticket and a counter per 64 keys: 13 words, 64 bytes)
    // after the bf16
    // output's accumulator.
    let d = dense::Shape::bshd(2, 16, 300, 64, 128);
    let bf16 = Options {
        d_index_k: GradDtype::Bf16,
        ..det
    };
    let plan = dense::Plan::new(&ctx, d.clone(), bf16).expect("dense tiles");
    assert_eq!(plan.workspace_bytes(), d.k_len() * 4 + 64);
    // The fast path takes it, and its workspace holds the tables.
    let long = Shape { topk: 128, ..short };
    let plan = Plan::new(&ctx, long, det).expect("the fast path");
    assert!(plan.workspace_bytes() >= long.k_len() * 5);
    assert!(
        plan.kernels().contains(&"det_finish"),
        "{:?}",
        plan.kernels()
    );
}

/// Deterministic mode captured in a CUDA graph (its memset and passes are
/// graph nodes, nothing is allocated): two replays write the bits of the
/// eager call, within the tolerances of the reference.
#[test]
fn gpu_deterministic_mode_replays_in_a_cuda_graph() {
    let Some(ctx) = gpu("gpu_deterministic_mode_replays_in_a_cuda_graph") else {
        return;
    };
    let stream = ctx.new_stream().unwrap();
    // Capture must not wait on events recorded outside it.
    // SAFETY: this test uses one stream, so no cross-stream ordering is lost.
    unsafe { ctx.disable_event_tracking() };
    let shape = Shape {
        batch: 2,
        seq_q: 32,
        seq_k: 96,
        heads: 64,
        head_dim: 128,
        topk: 192,
    };
    let opts = Options {
        key_ids: KeyIds::Local,
        d_index_k: GradDtype::Bf16,
        deterministic: true,
        ..Options::default()
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    let gen = Gen {
        values: Values::Continuous,
        padding: Padding::NegOne,
        short_rows: 0.2,
        trailing: true,
        duplicates: true,
        masked: 0.05,
    };
    let p = Problem::random(&mut rng, shape, opts, gen);
    let plan = Plan::new(&ctx, shape, opts).unwrap();
    let mut d = DeviceProblem::upload(&stream, &p, plan.workspace_bytes());
    d.execute(&plan, &stream, p.loss_coeff).unwrap(); // eager, outside capture
    stream.synchronize().unwrap();
    let eager = d.download(&stream, &opts);
    compare_with_reference(&p, &eager, indexer_tests::CONTINUOUS_FLOORS).expect("eager");

    let graph = d.capture(&plan, &stream, p.loss_coeff).expect("graph");
    for replay in 0..2 {
        d.reset_targets(&stream, &p);
        graph.launch().unwrap();
        stream.synchronize().unwrap();
        let out = d.download(&stream, &opts);
        if let Err(e) = same_outputs(&eager, &out) {
            panic!("replay {replay}: {e}");
        }
    }
}
