//! Property tests of the whole backward on the GPU against the CPU
//! reference: random shapes across the envelope, both id conventions, B > 1,
//! padding by -1 and by out-of-range ids (spread over the row or at its
//! end), i64 ids as well as i32 (with padding as any negative i64 or any
//! beyond the i32 range, 2^32 plus a valid key included), short rows,
//! duplicates, sm_scale
//! variants (zero and negative included), the log variant, bf16 and f32
//! outputs, grid and continuous values, S_k up to 4096, targets below CLIP.

mod common;

use dsa_indexer_bwd::{Options, Shape};
use indexer_tests::{
    compare_with_reference, gpu, run_gpu, same_bits, Gen, Padding, Problem, Values,
    CONTINUOUS_FLOORS, GRID_FLOORS,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use rand::SeedableRng;

/// Shape, options, seed, duplicates, short rows, padding at the end.
type Case = (Shape, Options, u64, bool, bool, bool);

/// The sm_scale values of the grid-value suites.
const SCALES: [f32; 5] = [1.0, 0.125, 0.37, 1e-3, 2.5];

/// Random cases over `heads` x `dims`, `seq_q` and `topk` in the ranges,
/// S_k up to 160, sm_scale from [`SCALES`].
fn case(
    heads: Vec<usize>,
    dims: Vec<usize>,
    seq_q: std::ops::RangeInclusive<usize>,
    topk: std::ops::RangeInclusive<usize>,
) -> impl Strategy<Value = Case> {
    case_with(heads, dims, seq_q, 1..=160, topk, SCALES.to_vec())
}

/// [`case`] with the S_k range and the sm_scale values given.
fn case_with(
    heads: Vec<usize>,
    dims: Vec<usize>,
    seq_q: std::ops::RangeInclusive<usize>,
    seq_k: std::ops::RangeInclusive<usize>,
    topk: std::ops::RangeInclusive<usize>,
    scales: Vec<f32>,
) -> impl Strategy<Value = Case> {
    let shape = common::shapes(heads, dims, seq_q, seq_k, topk);
    let opts = common::options(scales, false);
    (
        shape,
        opts,
        any::<u64>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
}

/// 256 random cases; each runs the GPU three times (i32 ids with padding
/// by -1 and by out-of-range ids, then i64 ids, `Problem::widen_ids`) and
/// checks: SPEC tolerances and the 2x-of-f32 bound, index_score
/// untouched, grad_signal in attn_score, and bitwise-identical d_index_q /
/// d_weights across the three runs.
#[test]
fn gpu_matches_reference_on_random_problems() {
    let cases = case(vec![16, 32, 64, 128], vec![64, 128], 1..=24, 1..=300);
    run_cases("gpu_matches_reference_on_random_problems", cases, 256);
}

/// 48 cases whose rows hold one key in every valid slot: the slots'
/// grad_signal sums to zero, so the exact d_index_q, d_weights and
/// d_index_k cancel to the rounding level of the f32 inputs and only the
/// 2x-of-f32 bound judges them (`indexer_tests::within_bounds`); topk up
/// to 600 so the wgmma kernels run them too. Same checks.
#[test]
fn gpu_rows_of_one_repeated_key_match_reference() {
    let cases = case(vec![16, 32, 64, 128], vec![64, 128], 1..=24, 1..=600);
    run_cases_with(
        "gpu_rows_of_one_repeated_key_match_reference",
        cases.prop_map(|c| (c, ())),
        48,
        Values::Grid,
        |p, _, ()| p.repeat_first_key(),
    );
}

/// 128 more cases at H = 64, D = 128 (on Hopper the fast path of the
/// benchmark shape for topk > 64, the mma.sync kernel below), topk up to
/// 600 (up to ten 64-slot chunks), same checks.
#[test]
fn gpu_fast_path_matches_reference_on_random_problems() {
    let cases = case(vec![64], vec![128], 1..=24, 1..=600);
    run_cases(
        "gpu_fast_path_matches_reference_on_random_problems",
        cases,
        128,
    );
}

/// 24 cases at H = 64, D = 128 with 100-600 query rows: more rows than the
/// persistent fast path has CTAs (2 per SM), so CTAs walk several rows and
/// prefetch across row boundaries. Same checks.
#[test]
fn gpu_fast_path_with_more_rows_than_ctas_matches_reference() {
    let cases = case(vec![64], vec![128], 100..=200, 65..=200);
    run_cases(
        "gpu_fast_path_with_more_rows_than_ctas_matches_reference",
        cases,
        24,
    );
}

// The cases below must reach the skip.
const _: () = assert!(kernels_gpu::sm90::bwd::SKIP_MIN_TOPK <= 512);

/// 24 cases at H = 64, D = 128 with topk 512-1000 (where the fast path
/// skips each row's trailing all-padding chunks, `sm90::SKIP_MIN_TOPK`),
/// up to 200 query rows per batch (up to 600 rows: CTAs walk rows of
/// different lengths), padding always at the end of short rows (so rows end
/// early by whole chunks). Same checks.
#[test]
fn gpu_fast_path_skipping_trailing_padding_matches_reference() {
    let cases = case(vec![64], vec![128], 1..=200, 512..=1000)
        .prop_map(|(shape, opts, seed, dups, _, _)| (shape, opts, seed, dups, true, true));
    run_cases(
        "gpu_fast_path_skipping_trailing_padding_matches_reference",
        cases,
        24,
    );
}

/// 10 cases at H = 64, D = 128 with topk 1000-4600 and few rows: stage 1
/// shares each row among four or eight warps (`stage1_warps_per_row`) and
/// makes two passes over rows longer than 2048 slots, and its count of
/// live chunks scans a whole row when the row's last 256 slots are all
/// padding (short rows, padded at the end). Same checks.
#[test]
fn gpu_fast_path_on_long_rows_matches_reference() {
    const _: () = assert!(kernels_gpu::abi::stage1_warps_per_row(4600) == 8);
    const _: () = assert!(kernels_gpu::abi::stage1_warps_per_row(1000) == 4);
    let cases = case(vec![64], vec![128], 1..=8, 1000..=4600).prop_map(
        |(shape, opts, seed, dups, _, trailing)| (shape, opts, seed, dups, true, trailing),
    );
    run_cases("gpu_fast_path_on_long_rows_matches_reference", cases, 10);
}

/// 32 cases at H = 64, D = 128 with an even number of rows (where the fast
/// path launches the paired kernel and the row kernel, and a test on the
/// ids picks one) whose odd rows copy the previous row's ids, all of them
/// or each with probability 1/2 (near the test's threshold, so either
/// kernel runs), with 0-2 pairs of slots swapped (`Problem::pair_rows`):
/// in the paired kernel, slots that hold the same key in both rows reduce
/// its dK once, the rest separately. Up to 600 rows (CTAs walk several
/// pairs), short rows padded at the end in half of the cases (chunk counts
/// then can differ inside a pair). Same checks.
#[test]
fn gpu_fast_path_on_paired_rows_matches_reference() {
    let cases = (
        case(vec![64], vec![128], 1..=200, 65..=700),
        prop::sample::select(vec![1.0f64, 0.5]),
        0usize..=2,
    )
        .prop_map(
            |((mut shape, opts, seed, dups, short, trailing), share, swaps)| {
                if shape.rows() % 2 == 1 {
                    shape.seq_q += 1;
                }
                ((shape, opts, seed, dups, short, trailing), (share, swaps))
            },
        );
    let paired = std::cell::Cell::new(0u32);
    let ran = run_cases_with(
        "gpu_fast_path_on_paired_rows_matches_reference",
        cases,
        32,
        Values::Grid,
        |p, rng, (share, swaps)| {
            p.pair_rows(rng, share, swaps);
            let (rows, topk) = (p.shape.rows() as u32, p.shape.topk as u32);
            if kernels_gpu::sm90::bwd::ids_pair_up(&p.ids, rows, topk) {
                paired.set(paired.get() + 1);
            }
        },
    );
    // Half of the cases pair every row: the dispatch must pick the paired
    // kernel for (nearly) all of those (binomial(32, 1/2) < 4: p ~ 1e-6).
    if ran {
        println!("paired kernel picked in {} of 32 cases", paired.get());
        assert!(
            paired.get() >= 4,
            "paired kernel picked {} times",
            paired.get()
        );
    }
}

/// 40 cases of the fast path on row pairs that share keys in any slot
/// order against the CPU reference: H = 64, D = 128, even rows (pairs
/// across batch boundaries with odd S_q), topk 65-2048, rows 2i + 1
/// taking none, half or nearly all of the keys of rows 2i
/// (`Problem::share_rows`, with or without duplicates and short rows), so
/// the paired kernel's dispatch test and its per-item votes see pairs
/// that share keys in other slots than their own. Same checks as every
/// suite (tolerances, both paddings bit for bit, i64 ids bit for bit).
#[test]
fn gpu_fast_path_rows_sharing_keys_match_reference() {
    let cases = (
        case_with(
            vec![64],
            vec![128],
            1..=40,
            1..=3000,
            65..=2048,
            SCALES.to_vec(),
        ),
        prop::sample::select(vec![0.0f64, 0.5, 1.0]),
        prop::sample::select(vec![0.5f64, 0.97, 1.0]),
    )
        .prop_map(
            |((mut shape, opts, seed, dups, short, trailing), share, keep)| {
                if shape.rows() % 2 == 1 {
                    shape.seq_q += 1;
                }
                ((shape, opts, seed, dups, short, trailing), (share, keep))
            },
        );
    let ran = run_cases_with(
        "gpu_fast_path_rows_sharing_keys_match_reference",
        cases,
        40,
        Values::Grid,
        |p, rng, (share, keep)| p.share_rows(rng, share, keep),
    );
    if ran {
        println!("40 cases of rows sharing keys");
    }
}

/// The D = 64 shapes below run their D = 64 wgmma kernel on Hopper (the
/// D = 64 stage 1, no paired kernel), whatever the row count.
fn assert_d64_fast_path(shape: Shape) {
    let ctx = match gpu("assert_d64_fast_path") {
        Some(c) => c,
        None => return,
    };
    let plan = dsa_indexer_bwd::Plan::new(&ctx, shape, Options::default()).expect("plan");
    let (major, _) = ctx.compute_capability().expect("compute capability");
    if major == 9 {
        let kernel = match shape.heads {
            128 => kernels_gpu::registry::SM90_WG_H128_D64.name,
            32 => kernels_gpu::registry::SM90_WG_H32_D64.name,
            16 => kernels_gpu::registry::SM90_WG_H16_D64.name,
            _ => kernels_gpu::registry::SM90_WG_D64.name,
        };
        assert!(
            plan.kernels().contains(&kernel)
                && plan.kernels().contains(&"indexer_score_grad_d64")
                && !plan
                    .kernels()
                    .contains(&kernels_gpu::registry::SM90_WG_PAIR.name),
            "{shape:?}: {:?}",
            plan.kernels()
        );
    }
}

/// 160 cases at H = 64, 128, 32 and 16, D = 64 with topk 65-700 (the
/// D = 64 wgmma kernels on Hopper: two or more 64-slot chunks, the chunk
/// skip from `SKIP_MIN_TOPK` on), up to 200 query rows per batch (CTAs
/// walk several rows), both id conventions, f32 and bf16 dK, i32 and i64
/// ids (every case runs both, `run_cases`), uniform and short (ragged)
/// rows. Same checks.
#[test]
fn gpu_fast_path_d64_matches_reference_on_random_problems() {
    for heads in [64, 128, 32, 16] {
        assert_d64_fast_path(Shape {
            batch: 1,
            seq_q: 8,
            seq_k: 100,
            heads,
            head_dim: 64,
            topk: 65,
        });
    }
    let cases = case(vec![64, 128, 32, 16], vec![64], 1..=200, 65..=700);
    run_cases(
        "gpu_fast_path_d64_matches_reference_on_random_problems",
        cases,
        160,
    );
}

/// 32 cases at H = 64, 128, 32 and 16, D = 64 with topk 512-2100 and
/// padding at the end of short rows (the D = 64 kernels skipping trailing
/// chunks; stage 1 with several warps per row), and even row counts (where
/// H = 64, D = 128 would launch the paired kernel). Same checks.
#[test]
fn gpu_fast_path_d64_on_long_rows_matches_reference() {
    for heads in [64, 128, 32, 16] {
        assert_d64_fast_path(Shape {
            batch: 2,
            seq_q: 4,
            seq_k: 100,
            heads,
            head_dim: 64,
            topk: 2048,
        });
    }
    let cases = case(vec![64, 128, 32, 16], vec![64], 1..=40, 512..=2100).prop_map(
        |(mut shape, opts, seed, dups, _, trailing)| {
            if shape.rows() % 2 == 1 {
                shape.seq_q += 1;
            }
            (shape, opts, seed, dups, true, trailing)
        },
    );
    run_cases(
        "gpu_fast_path_d64_on_long_rows_matches_reference",
        cases,
        32,
    );
}

/// The H = 128, 32 and 16, D = 128 shapes below run their wgmma kernels
/// on Hopper (H = 128: both halves of a CTA on one row; H = 32 and 16: the
/// M = 64 head tile padded; the D = 128 stage 1, no paired kernel),
/// whatever the row count.
fn assert_own_wgmma_kernel(shape: Shape) {
    let ctx = match gpu("assert_own_wgmma_kernel") {
        Some(c) => c,
        None => return,
    };
    let plan = dsa_indexer_bwd::Plan::new(&ctx, shape, Options::default()).expect("plan");
    let (major, _) = ctx.compute_capability().expect("compute capability");
    if major == 9 {
        let kernel = match shape.heads {
            128 => kernels_gpu::registry::SM90_WG_H128.name,
            32 => kernels_gpu::registry::SM90_WG_H32.name,
            _ => kernels_gpu::registry::SM90_WG_H16.name,
        };
        assert!(
            plan.kernels().contains(&kernel)
                && plan.kernels().contains(&"indexer_score_grad_d128")
                && !plan
                    .kernels()
                    .contains(&kernels_gpu::registry::SM90_WG_PAIR.name),
            "{shape:?}: {:?}",
            plan.kernels()
        );
    }
}

/// 144 cases at H = 128, 32 and 16, D = 128 with topk 65-700 (their own
/// wgmma kernels on Hopper: two or more 64-slot chunks), up to 200
/// query rows per batch (CTAs walk several rows), both id conventions,
/// f32 and bf16 dK, i32 and i64 ids (every case runs both, `run_cases`),
/// -1 and out-of-range padding, uniform and short (ragged) rows. Same
/// checks.
#[test]
fn gpu_fast_path_h128_h32_h16_d128_matches_reference_on_random_problems() {
    for heads in [128, 32, 16] {
        assert_own_wgmma_kernel(Shape {
            batch: 1,
            seq_q: 8,
            seq_k: 100,
            heads,
            head_dim: 128,
            topk: 65,
        });
    }
    let cases = case(vec![128, 32, 16], vec![128], 1..=200, 65..=700);
    run_cases(
        "gpu_fast_path_h128_h32_h16_d128_matches_reference_on_random_problems",
        cases,
        144,
    );
}

/// 24 cases at H = 128, 32 and 16, D = 128 with topk 512-2100 (from
/// `SKIP_MIN_TOPK` on, stage 1 counts each row's chunks and the kernel
/// skips the trailing all-padding ones), padding at the end of short rows,
/// and even row counts (where H = 64 would launch the paired kernel).
/// Same checks.
#[test]
fn gpu_fast_path_h128_h32_h16_d128_on_long_rows_matches_reference() {
    for heads in [128, 32, 16] {
        assert_own_wgmma_kernel(Shape {
            batch: 2,
            seq_q: 4,
            seq_k: 100,
            heads,
            head_dim: 128,
            topk: 2048,
        });
    }
    let cases = case(vec![128, 32, 16], vec![128], 1..=40, 512..=2100).prop_map(
        |(mut shape, opts, seed, dups, _, trailing)| {
            if shape.rows() % 2 == 1 {
                shape.seq_q += 1;
            }
            (shape, opts, seed, dups, true, trailing)
        },
    );
    run_cases(
        "gpu_fast_path_h128_h32_h16_d128_on_long_rows_matches_reference",
        cases,
        24,
    );
}

/// 64 cases with continuous q and k values (not the grid of the suites
/// above, so `S` is rounded and the `S > 0` gate is decided on inexact
/// sums), S_k up to 4096, sm_scale zero and negative as well as positive,
/// and about a tenth of the targets below CLIP (0 or a subnormal, which
/// stage 1 clips), across every H x D (the fast path included). q rows
/// whose `S` with a selected key lies within 1e-4 relative of zero are
/// redrawn (`Problem::avoid_gate_ties`): there the kernel's f32 sum and
/// the f64 reference may legitimately decide the gate differently, a
/// difference the Frobenius tolerance does not absorb at small shapes.
/// Same checks, with the floors of continuous values.
#[test]
fn gpu_continuous_values_match_reference() {
    let cases = case_with(
        vec![16, 32, 64, 128],
        vec![64, 128],
        1..=24,
        1..=4096,
        1..=300,
        vec![1.0, 0.37, 1e-3, 0.0, -0.5, -1.0],
    );
    run_cases_with(
        "gpu_continuous_values_match_reference",
        cases.prop_map(|c| (c, ())),
        64,
        Values::Continuous,
        |p, rng, ()| {
            p.targets_below_clip(rng, 0.1);
            p.avoid_gate_ties(rng, 1e-4);
        },
    );
}

fn run_cases(name: &str, strategy: impl Strategy<Value = Case>, cases: u32) {
    run_cases_with(
        name,
        strategy.prop_map(|c| (c, ())),
        cases,
        Values::Grid,
        |_, _, _| {},
    );
}

/// [`run_cases`] with q and k drawn as `values` and a change to each drawn
/// problem (`edit(problem, rng, extra)`) before its padding is rewritten.
/// Returns whether a GPU ran the cases (false when the test is skipped
/// without one).
fn run_cases_with<E: Clone + std::fmt::Debug>(
    name: &str,
    strategy: impl Strategy<Value = (Case, E)>,
    cases: u32,
    values: Values,
    edit: impl Fn(&mut Problem, &mut rand::rngs::StdRng, E),
) -> bool {
    let Some(ctx) = gpu(name) else {
        return false;
    };
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let n = std::cell::Cell::new(0usize);
    runner
        .run(
            &strategy,
            |((shape, opts, seed, dups, short, trailing), extra)| {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                let gen = Gen {
                    values,
                    padding: Padding::NegOne,
                    short_rows: if short { 0.5 } else { 0.1 },
                    trailing,
                    duplicates: dups,
                    masked: 0.05,
                };
                let mut p = Problem::random(&mut rng, shape, opts, gen);
                edit(&mut p, &mut rng, extra);
                p.repad(&mut rng, Padding::NegOne);
                let floors = match values {
                    Values::Grid => GRID_FLOORS,
                    Values::Continuous => CONTINUOUS_FLOORS,
                };
                let a = run_gpu(&ctx, &p);
                let ea = compare_with_reference(&p, &a, floors);
                prop_assert!(ea.is_ok(), "padding -1: {}", ea.unwrap_err());
                p.repad(&mut rng, Padding::OutOfRange);
                let b = run_gpu(&ctx, &p);
                let eb = compare_with_reference(&p, &b, floors);
                prop_assert!(eb.is_ok(), "out-of-range padding: {}", eb.unwrap_err());
                prop_assert!(
                    same_bits(&a.d_index_q, &b.d_index_q),
                    "d_index_q differs between paddings"
                );
                prop_assert_eq!(
                    &a.d_weights_bits,
                    &b.d_weights_bits,
                    "d_weights differs between paddings"
                );
                prop_assert!(same_bits(&a.grad_signal, &b.grad_signal));
                // i64 ids: valid ids as they are, padding as wide values
                // (2^32 + a valid key included); same results, bit for bit.
                p.widen_ids(&mut rng);
                let c = run_gpu(&ctx, &p);
                let ec = compare_with_reference(&p, &c, floors);
                prop_assert!(ec.is_ok(), "i64 ids: {}", ec.unwrap_err());
                prop_assert!(
                    same_bits(&a.d_index_q, &c.d_index_q),
                    "d_index_q differs between i32 and i64 ids"
                );
                prop_assert_eq!(
                    &a.d_weights_bits,
                    &c.d_weights_bits,
                    "d_weights differs between i32 and i64 ids"
                );
                prop_assert!(same_bits(&a.grad_signal, &c.grad_signal));
                n.set(n.get() + 1);
                Ok::<(), TestCaseError>(())
            },
        )
        .unwrap();
    println!("{name}: {} cases passed", n.get());
    assert_eq!(n.get(), cases as usize);
    true
}
