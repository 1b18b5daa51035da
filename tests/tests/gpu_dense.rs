//! Dense mode's device plan: on compute capability 9.0 it matches the f64
//! dense reference on random problems (BSHD and packed batches, query
//! offsets, key ratios, every H x D, f32 and bf16 outputs) with bitwise
//! reproducible d_index_q and d_weights, and so does the tile kernel of
//! H = 64, D = 128 on its own random problems (down to one key column);
//! every rejected call writes nothing.

use cudarc::driver::{CudaSlice, CudaStream};
use dsa_indexer_bwd::dense::{self, Inputs, Outputs, Plan};
use dsa_indexer_bwd::{bf16, Error, GradDtype, GradOut, Options};
use indexer_tests::dense::{compare_dense, DenseDevice, DenseProblem};
use indexer_tests::{gpu, same_bits, CONTINUOUS_FLOORS};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use rand::SeedableRng;
use std::sync::Arc;

/// Every buffer of a call, filled with 7.
struct Buffers {
    q: CudaSlice<bf16>,
    w: CudaSlice<bf16>,
    k: CudaSlice<bf16>,
    attn: CudaSlice<f32>,
    l1: CudaSlice<f32>,
    lse: CudaSlice<f32>,
    grad_loss: CudaSlice<f32>,
    score: CudaSlice<f32>,
    dq: CudaSlice<bf16>,
    dw: CudaSlice<bf16>,
    dw32: CudaSlice<f32>,
    dk: CudaSlice<bf16>,
    ws: CudaSlice<u8>,
}

impl Buffers {
    fn new(stream: &Arc<CudaStream>, s: &dense::Shape, ws: usize) -> Buffers {
        let b = |n: usize| stream.clone_htod(&vec![bf16::from_f32(7.0); n]).unwrap();
        let f = |n: usize| stream.clone_htod(&vec![7.0f32; n]).unwrap();
        Buffers {
            q: b(s.q_len()),
            w: b(s.w_len()),
            k: b(s.k_len()),
            attn: f(s.score_len()),
            l1: f(s.rows()),
            lse: f(s.rows()),
            grad_loss: f(1),
            score: f(s.score_len()),
            dq: b(s.q_len()),
            dw: b(s.w_len()),
            dw32: f(s.w_len()),
            dk: b(s.k_len()),
            ws: stream.clone_htod(&vec![7u8; ws]).unwrap(),
        }
    }

    /// Whether every output still holds 7.
    fn untouched(&self, stream: &Arc<CudaStream>) -> bool {
        let f = |v: &CudaSlice<f32>| stream.clone_dtoh(v).unwrap().iter().all(|&x| x == 7.0);
        let b = |v: &CudaSlice<bf16>| {
            let h = stream.clone_dtoh(v).unwrap();
            h.iter().all(|x| x.to_f32() == 7.0)
        };
        f(&self.score) && f(&self.dw32) && b(&self.dq) && b(&self.dw) && b(&self.dk)
    }
}

#[test]
fn rejected_dense_calls_leave_every_buffer_untouched() {
    let Some(ctx) = gpu("rejected_dense_calls_leave_every_buffer_untouched") else {
        return;
    };
    let stream = ctx.default_stream();
    let shape = dense::Shape::varlen(vec![0, 3, 8], vec![0, 70, 100], 16, 64)
        .with_q_offset(vec![60, 20])
        .with_ratio(2);
    let opts = Options {
        d_index_k: GradDtype::Bf16,
        ..Options::default()
    };
    let plan = Plan::new(&ctx, shape.clone(), opts).unwrap();
    assert_eq!(plan.workspace_bytes(), 100 * 64 * 4);
    let mut d = Buffers::new(&stream, &shape, plan.workspace_bytes());
    type Edit = fn(&mut Inputs<'_>, &mut Outputs<'_>, &mut f32);
    let cases: [(&str, Edit); 4] = [
        ("loss_coeff", |_, _, c| *c = f32::NAN),
        ("index_k", |i, _, _| i.index_k = i.index_k.slice(64..)),
        ("attn_l1norm", |i, _, _| {
            i.attn_l1norm = i.attn_l1norm.slice(1..)
        }),
        ("workspace", |_, o, _| o.workspace = None),
    ];
    for (name, edit) in cases {
        let mut inputs = Inputs {
            index_q: d.q.as_view(),
            weights: d.w.as_view(),
            index_k: d.k.as_view(),
            attn_score: d.attn.as_view(),
            attn_l1norm: d.l1.as_view(),
            index_lse: d.lse.as_view(),
            grad_loss: d.grad_loss.as_view(),
        };
        let mut outputs = Outputs {
            index_score: d.score.as_view_mut(),
            d_index_q: d.dq.as_view_mut(),
            d_weights: GradOut::Bf16(d.dw.as_view_mut()),
            d_index_k: GradOut::Bf16(d.dk.as_view_mut()),
            workspace: Some(d.ws.as_view_mut()),
        };
        let mut loss_coeff = 1.0;
        edit(&mut inputs, &mut outputs, &mut loss_coeff);
        let e = plan
            .execute(&stream, &inputs, &mut outputs, loss_coeff)
            .unwrap_err();
        println!("{name}: {e}");
        let ok = match name {
            "loss_coeff" => matches!(
                e,
                Error::NonFinite {
                    name: "loss_coeff",
                    ..
                }
            ),
            "workspace" => matches!(e, Error::Workspace { given: 0, .. }),
            t => matches!(e, Error::Length { tensor, .. } if tensor == t),
        };
        assert!(ok, "{name}: unexpected {e:?}");
    }
    // An f32 d_weights where the plan wants bf16.
    let inputs = Inputs {
        index_q: d.q.as_view(),
        weights: d.w.as_view(),
        index_k: d.k.as_view(),
        attn_score: d.attn.as_view(),
        attn_l1norm: d.l1.as_view(),
        index_lse: d.lse.as_view(),
        grad_loss: d.grad_loss.as_view(),
    };
    let mut outputs = Outputs {
        index_score: d.score.as_view_mut(),
        d_index_q: d.dq.as_view_mut(),
        d_weights: GradOut::F32(d.dw32.as_view_mut()),
        d_index_k: GradOut::Bf16(d.dk.as_view_mut()),
        workspace: Some(d.ws.as_view_mut()),
    };
    let e = plan
        .execute(&stream, &inputs, &mut outputs, 1.0)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Dtype {
                tensor: "d_weights",
                ..
            }
        ),
        "{e:?}"
    );
    stream.synchronize().unwrap();
    assert!(d.untouched(&stream), "a rejected call wrote an output");
    // A bad shape is refused when the plan is built.
    let bad = shape.with_ratio(0);
    assert!(matches!(
        Plan::new(&ctx, bad, opts),
        Err(Error::Shape { name: "ratio", .. })
    ));
}

/// The sizes of one random case, drawn by the strategies below.
struct Draw {
    packed: bool,
    batches: usize,
    seq_q: usize,
    seq_k: usize,
    heads: usize,
    dim: usize,
    ratio: usize,
    offsets: Vec<i64>,
    dk16: bool,
    dw32: bool,
}

impl Draw {
    /// The case's shape and options: BSHD, or packed with batch `i`
    /// holding `seq_q - q_step i` query rows (at least one in the first
    /// batch, possibly none later) and `seq_k - k_step i` keys (at least
    /// one); the first `batches` offsets; `sm_scale` as given.
    fn build(self, q_step: usize, k_step: usize, sm_scale: f32) -> (dense::Shape, Options) {
        let (b, h, d) = (self.batches, self.heads, self.dim);
        let shape = if self.packed {
            let (mut cq, mut ck) = (vec![0], vec![0]);
            for i in 0..b {
                let q = self
                    .seq_q
                    .saturating_sub(q_step * i)
                    .max(usize::from(i == 0));
                cq.push(cq[i] + q);
                ck.push(ck[i] + self.seq_k.saturating_sub(k_step * i).max(1));
            }
            dense::Shape::varlen(cq, ck, h, d)
        } else {
            dense::Shape::bshd(b, self.seq_q, self.seq_k, h, d)
        };
        let dtype = |f32: bool| if f32 { GradDtype::F32 } else { GradDtype::Bf16 };
        let opts = Options {
            sm_scale,
            d_index_k: dtype(!self.dk16),
            d_weights: dtype(self.dw32),
            ..Options::default()
        };
        let shape = shape
            .with_q_offset(self.offsets[..b].to_vec())
            .with_ratio(self.ratio);
        (shape, opts)
    }
}

/// A random dense shape: BSHD (1-3 batches) or packed (1-3 batches of
/// different lengths), query offsets, ratio 1, 2 or 4, every H x D; more than
/// 64 key columns (the sparse strategy's floor), so the key tile past the
/// last visible column is padded in most rows.
fn shape_strategy() -> impl Strategy<Value = (dense::Shape, Options, u64)> {
    (
        (any::<bool>(), 1usize..=3, 8usize..=80, 65usize..=300),
        prop::sample::select(vec![16usize, 32, 64, 128]),
        prop::sample::select(vec![64usize, 128]),
        prop::sample::select(vec![1usize, 2, 4]),
        prop::collection::vec(-20i64..=400, 3),
        any::<(bool, bool)>(),
        any::<u64>(),
    )
        .prop_map(
            |((packed, batches, seq_q, seq_k), heads, dim, ratio, offsets, (dk16, dw32), seed)| {
                let draw = Draw {
                    packed,
                    batches,
                    seq_q,
                    seq_k,
                    heads,
                    dim,
                    ratio,
                    offsets,
                    dk16,
                    dw32,
                };
                let (shape, opts) = draw.build(3, 20, 0.125);
                (shape, opts, seed)
            },
        )
}

/// A random shape for dense mode's tile kernel (H = 64, D = 128): BSHD
/// or packed batches of 1-150 query rows over 1-400 keys (a single key,
/// part of a key tile, odd row counts, empty packed batches), query offsets
/// and ratios 1, 2 or 4; `sm_scale` positive, negative (the kernel negates
/// its fixed operand) or zero (it runs no products).
fn tile_shape_strategy() -> impl Strategy<Value = (dense::Shape, Options, u64)> {
    (
        (any::<bool>(), 1usize..=3, 1usize..=150, 1usize..=400),
        prop::sample::select(vec![1usize, 2, 4]),
        prop::collection::vec(-40i64..=300, 3),
        any::<(bool, bool)>(),
        prop::sample::select(vec![0.25f32, 0.25, -0.25, 0.0]),
        any::<u64>(),
    )
        .prop_map(
            |((packed, batches, seq_q, seq_k), ratio, offsets, (dk16, dw32), scale, seed)| {
                let (heads, dim) = (64, 128);
                let draw = Draw {
                    packed,
                    batches,
                    seq_q,
                    seq_k,
                    heads,
                    dim,
                    ratio,
                    offsets,
                    dk16,
                    dw32,
                };
                let (shape, opts) = draw.build(7, 30, scale);
                (shape, opts, seed)
            },
        )
}

/// Runs `cases` problems of `strategy` on the GPU against the f64 dense
/// reference (`compare_dense`: SPEC's tolerances and 2x the f32/bf16-dS
/// reference), each twice with bitwise-equal grad_signal, d_index_q and
/// d_weights (and d_index_k with `deterministic`, which sets the option);
/// the plan must take the GPU path. Nothing on a GPU other than compute
/// capability 9.0.
fn check_random_problems(
    name: &str,
    cases: u32,
    strategy: impl Strategy<Value = (dense::Shape, Options, u64)>,
    deterministic: bool,
) {
    let Some(ctx) = gpu(name) else {
        return;
    };
    if ctx.compute_capability().unwrap() != (9, 0) {
        return;
    }
    let stream = ctx.default_stream();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&strategy, |(shape, opts, seed)| {
            let opts = Options {
                deterministic,
                ..opts
            };
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let p = DenseProblem::random(&mut rng, shape.clone(), opts, 0.05);
            let plan = Plan::new(&ctx, shape, opts).unwrap();
            prop_assert!(plan.on_gpu(), "{:?}", p.shape);
            let mut d = DenseDevice::upload(&stream, &p, plan.workspace_bytes());
            d.execute(&plan, &stream, p.loss_coeff).unwrap();
            let a = d.download(&stream, &opts);
            let e = compare_dense(&p, &a, CONTINUOUS_FLOORS).map_err(TestCaseError::fail)?;
            println!("{:?} ratio {}: {e:?}", p.shape.layout, p.shape.ratio);
            d.reset_logits(&stream, &p);
            d.execute(&plan, &stream, p.loss_coeff).unwrap();
            let b = d.download(&stream, &opts);
            prop_assert!(same_bits(&a.grad_signal, &b.grad_signal));
            prop_assert!(same_bits(&a.d_index_q, &b.d_index_q));
            prop_assert_eq!(&a.d_weights_bits, &b.d_weights_bits);
            if deterministic {
                let dk = |o: &indexer_tests::GpuOut| -> Vec<u64> {
                    o.d_index_k.iter().map(|x| x.to_bits()).collect()
                };
                prop_assert!(dk(&a) == dk(&b), "d_index_k differs between runs");
            }
            Ok(())
        })
        .unwrap();
}

/// 48 random dense problems over every H x D ([`check_random_problems`]).
#[test]
fn dense_gpu_matches_the_reference_on_random_problems() {
    check_random_problems(
        "dense_gpu_matches_the_reference_on_random_problems",
        48,
        shape_strategy(),
        false,
    );
}

/// 40 random problems on dense mode's tile kernel (H = 64, D = 128,
/// [`check_random_problems`]).
#[test]
fn dense_tiles_match_the_reference_on_random_problems() {
    check_random_problems(
        "dense_tiles_match_the_reference_on_random_problems",
        40,
        tile_shape_strategy(),
        false,
    );
}

/// Deterministic mode on 24 random problems of each strategy
/// ([`check_random_problems`]): the tile kernel's twin at H = 64,
/// D = 128, the sparse path's twins elsewhere.
#[test]
fn dense_deterministic_mode_matches_the_reference_on_random_problems() {
    let name = "dense_deterministic_mode_matches_the_reference_on_random_problems";
    check_random_problems(name, 24, shape_strategy(), true);
    check_random_problems(name, 24, tile_shape_strategy(), true);
}

/// `dense::run` with `allow_gpu` on host data: on compute capability 9.0
/// it computes on the GPU and matches the f64 dense reference; without
/// `allow_gpu` it gives the CPU fallback's result.
#[test]
fn dense_run_takes_the_gpu_when_allowed() {
    let Some(ctx) = gpu("dense_run_takes_the_gpu_when_allowed") else {
        return;
    };
    let (major, minor) = ctx.compute_capability().unwrap();
    let shape = dense::Shape::varlen(vec![0, 20, 50], vec![0, 90, 200], 32, 128)
        .with_q_offset(vec![80, 150]);
    let opts = Options {
        d_weights: GradDtype::F32,
        ..Options::default()
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    let p = DenseProblem::random(&mut rng, shape.clone(), opts, 0.05);
    let cpu = dense::run(&shape, &opts, &p.host(), false).unwrap();
    assert_eq!(cpu.backend, "cpu");
    let r = dense::run(&shape, &opts, &p.host(), true).unwrap();
    if (major, minor) != (9, 0) {
        return;
    }
    assert_eq!(r.backend, "gpu");
    let out = indexer_tests::GpuOut {
        grad_signal: r.grad_signal.clone(),
        index_score_after: p.attn.clone(),
        d_index_q: r.d_index_q.clone(),
        d_weights: r.d_weights.to_f64(),
        d_index_k: r.d_index_k.to_f64(),
        d_weights_bits: vec![],
    };
    let e = compare_dense(&p, &out, CONTINUOUS_FLOORS).unwrap_or_else(|e| panic!("{e}"));
    println!("dense::run on the GPU: {e:?}");
}
