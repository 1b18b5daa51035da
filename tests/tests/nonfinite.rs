//! The NaN/Inf policy (SPEC, "Non-finite inputs"; the rules in
//! `dsa_indexer_bwd::cpu`): values are never scanned for or rejected in
//! tensors, they propagate, and the CPU and GPU paths make the same outputs
//! non-finite. For each input (q, k, w, targets, predict scores, grad_loss
//! on the device) and NaN / +Inf: the CPU path against the documented
//! rules (and the plain consequences stated there), then the GPU's
//! element-wise pattern against the CPU's.

use dsa_indexer_bwd::cpu::{self, HostGrad, HostOutputs};
use dsa_indexer_bwd::{bf16, Error, GradDtype, KeyIds, Options, ScoreKind, Shape};
use indexer_tests::{
    gpu, predicted_masks, run_gpu, shape, Gen, Inject, Injected, Masks, Padding, Problem, Values,
    INJECT_ALL,
};
use rand::SeedableRng;

/// One configuration: what it exercises, shape and options, rows paired
/// (rows 2i + 1 copy the ids of rows 2i: the paired kernel on the GPU).
struct Config {
    name: &'static str,
    shape: Shape,
    opts: Options,
    paired: bool,
    /// Rows 2i + 1 take most of the keys of rows 2i in another slot order
    /// (`Problem::share_rows`).
    shared: bool,
}

/// Small shapes for the CPU-only test; on the GPU the same plus the fast
/// path's kernels.
fn configs(gpu: bool) -> Vec<Config> {
    let mut v = vec![
        Config {
            name: "row kernel, local ids, bf16 dK, f32 dW",
            shape: shape(2, 5, 40, 16, 64, 20),
            opts: Options {
                sm_scale: 0.5,
                key_ids: KeyIds::Local,
                d_index_k: GradDtype::Bf16,
                d_weights: GradDtype::F32,
                ..Options::default()
            },
            paired: false,
            shared: false,
        },
        Config {
            name: "row kernel, log-probs",
            shape: shape(1, 4, 64, 32, 128, 24),
            opts: Options {
                score: ScoreKind::LogProbs,
                ..Options::default()
            },
            paired: false,
            shared: false,
        },
    ];
    if gpu {
        v.extend([
            Config {
                name: "fast path (wgmma row kernel), odd rows",
                shape: shape(1, 7, 300, 64, 128, 130),
                opts: Options::default(),
                paired: false,
                shared: false,
            },
            Config {
                name: "fast path, paired kernel, log-probs, bf16 dK",
                shape: shape(1, 8, 200, 64, 128, 96),
                opts: Options {
                    score: ScoreKind::LogProbs,
                    d_index_k: GradDtype::Bf16,
                    ..Options::default()
                },
                paired: true,
                shared: false,
            },
            Config {
                name: "fast path, rows sharing keys out of slot order, f32 dW",
                shape: shape(2, 6, 300, 64, 128, 200),
                opts: Options {
                    d_weights: GradDtype::F32,
                    ..Options::default()
                },
                paired: false,
                shared: true,
            },
            Config {
                name: "fast path with the chunk skip (topk >= 512)",
                shape: shape(1, 3, 700, 64, 128, 520),
                opts: Options {
                    key_ids: KeyIds::Local,
                    ..Options::default()
                },
                paired: false,
                shared: false,
            },
        ]);
    }
    v
}

fn problem(c: &Config, seed: u64) -> (Problem, rand::rngs::StdRng) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let g = Gen {
        values: Values::Grid,
        padding: Padding::NegOne,
        short_rows: 0.3,
        trailing: true,
        duplicates: true,
        masked: 0.05,
    };
    let mut p = Problem::random(&mut rng, c.shape, c.opts, g);
    if c.paired {
        p.pair_rows(&mut rng, 1.0, 0);
    }
    if c.shared {
        p.share_rows(&mut rng, 1.0, 0.7);
    }
    (p, rng)
}

/// The CPU path's masks: reference, f32/bf16-dS variant and fallback agree.
fn cpu_masks(p: &Problem) -> Masks {
    let r = cpu::reference(&p.shape, &p.opts, &p.host()).unwrap();
    let m = Masks::of_grads(&r);
    let f = cpu::reference_f32_bf16_ds(&p.shape, &p.opts, &p.host()).unwrap();
    Masks::of_grads(&f)
        .compare(&m, "f32 reference", "f64 reference")
        .unwrap();
    let s = p.shape;
    let mut gs = p.target.clone();
    let mut dq = vec![bf16::ZERO; s.q_len()];
    let mut dw32 = vec![0f32; s.w_len()];
    let mut dw16 = vec![bf16::ZERO; s.w_len()];
    let mut dk32 = vec![0f32; s.k_len()];
    let mut dk16 = vec![bf16::ZERO; s.k_len()];
    let out = HostOutputs {
        attn_score: &mut gs,
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
    cpu::execute(&p.shape, &p.opts, &p.host(), out).unwrap();
    let wide = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
    let g = cpu::Grads {
        grad_signal: gs.iter().map(|&x| x as f64).collect(),
        d_index_q: wide(&dq),
        d_weights: match p.opts.d_weights {
            GradDtype::F32 => dw32.iter().map(|&x| x as f64).collect(),
            GradDtype::Bf16 => wide(&dw16),
        },
        d_index_k: match p.opts.d_index_k {
            GradDtype::F32 => dk32.iter().map(|&x| x as f64).collect(),
            GradDtype::Bf16 => wide(&dk16),
        },
    };
    Masks::of_grads(&g)
        .compare(&m, "fallback", "reference")
        .unwrap();
    m
}

/// Rows (flat query rows) that select key row `n` in a valid slot.
fn rows_selecting(p: &Problem, n: usize) -> Vec<usize> {
    let s = p.shape;
    (0..s.rows())
        .filter(|&r| {
            (0..s.topk).any(|t| p.opts.resolve(&s, r / s.seq_q, p.ids[r * s.topk + t]) == Some(n))
        })
        .collect()
}

/// Key rows row `r` selects in a valid slot.
fn keys_of(p: &Problem, r: usize) -> Vec<usize> {
    let s = p.shape;
    (0..s.topk)
        .filter_map(|t| p.opts.resolve(&s, r / s.seq_q, p.ids[r * s.topk + t]))
        .collect()
}

fn positions(m: &[bool]) -> Vec<usize> {
    (0..m.len()).filter(|&i| m[i]).collect()
}

/// The plain consequences the rules state for one bad element (the
/// module docs of `dsa_indexer_bwd::cpu`), checked on the CPU's masks.
fn check_consequences(p: &Problem, which: Inject, value: f32, at: &Injected, m: &Masks) {
    let s = p.shape;
    let (h_n, d_n, topk) = (s.heads, s.head_dim, s.topk);
    let all_finite = |v: &[bool]| v.iter().all(|b| !b);
    let ctx = format!("{which:?} = {value} at {at:?}");
    match (which, value.is_nan()) {
        (Inject::K, nan) => {
            assert!(
                all_finite(&m.grad_signal) && all_finite(&m.d_index_k),
                "{ctx}"
            );
            // Column d of every head of every row selecting the key.
            let mut want: Vec<usize> = rows_selecting(p, at.key)
                .iter()
                .flat_map(|&r| (0..h_n).map(move |h| (r * h_n + h) * d_n + at.d))
                .collect();
            want.sort();
            assert_eq!(positions(&m.d_index_q), want, "{ctx}");
            if nan {
                assert!(all_finite(&m.d_weights), "{ctx}");
            }
        }
        (Inject::Q, nan) => {
            assert!(
                all_finite(&m.grad_signal) && all_finite(&m.d_index_q),
                "{ctx}"
            );
            let mut want: Vec<usize> = keys_of(p, at.row).iter().map(|&n| n * d_n + at.d).collect();
            want.sort();
            want.dedup();
            assert_eq!(positions(&m.d_index_k), want, "{ctx}");
            let dw = positions(&m.d_weights);
            if nan {
                assert!(dw.is_empty(), "{ctx}");
            } else {
                assert!(dw.iter().all(|&i| i == at.row * h_n + at.head), "{ctx}");
            }
        }
        (Inject::W, _) => {
            assert!(
                all_finite(&m.grad_signal) && all_finite(&m.d_weights),
                "{ctx}"
            );
            // All of d_index_q[r, h, :] or none of it.
            let dq = positions(&m.d_index_q);
            let block = (at.row * h_n + at.head) * d_n;
            assert!(
                dq.is_empty() || dq == (block..block + d_n).collect::<Vec<_>>(),
                "{ctx}"
            );
            let keys = keys_of(p, at.row);
            assert!(
                positions(&m.d_index_k)
                    .iter()
                    .all(|&i| keys.contains(&(i / d_n))),
                "{ctx}"
            );
            assert_eq!(dq.is_empty(), all_finite(&m.d_index_k), "{ctx}");
        }
        (Inject::Target, true) => {
            // max(NaN, CLIP) = CLIP: nothing becomes non-finite.
            assert_eq!(m.counts(), [0; 4], "{ctx}");
        }
        (Inject::Target, false) => {
            // An infinite g_t: the whole row's grad_signal through G.
            let row = (at.row * topk..(at.row + 1) * topk).collect::<Vec<_>>();
            assert_eq!(positions(&m.grad_signal), row, "{ctx}");
        }
        (Inject::Score, _) => {
            // A non-finite predict: its own slot only (masked when NaN).
            assert_eq!(positions(&m.grad_signal), vec![at.at], "{ctx}");
            let rows = h_n * d_n;
            assert!(
                positions(&m.d_index_q).iter().all(|&i| i / rows == at.row),
                "{ctx}"
            );
            assert!(
                positions(&m.d_weights).iter().all(|&i| i / h_n == at.row),
                "{ctx}"
            );
            let dk = positions(&m.d_index_k);
            assert!(dk.iter().all(|&i| i / d_n == at.key), "{ctx}");
        }
        (Inject::GradLoss, _) => {
            // Every row with an unmasked slot: all of its grad_signal.
            for r in 0..s.rows() {
                let kept = (0..topk).any(|t| {
                    let v = p.score[r * topk + t];
                    match p.opts.score {
                        ScoreKind::Probs => v >= (-100f32).exp().max(f32::from_bits(27)),
                        ScoreKind::LogProbs => v >= -100.0,
                    }
                });
                let row = &m.grad_signal[r * topk..(r + 1) * topk];
                assert!(row.iter().all(|&b| b == kept), "{ctx}: row {r}");
            }
        }
    }
}

#[test]
fn cpu_path_follows_the_documented_rules() {
    let mut seen = [0usize; 4];
    for (ci, c) in configs(false).iter().enumerate() {
        for (ii, which) in INJECT_ALL.into_iter().enumerate() {
            for value in [f32::NAN, f32::INFINITY] {
                let (mut p, mut rng) = problem(c, 100 * ci as u64 + ii as u64);
                assert_eq!(predicted_masks(&p).counts(), [0; 4], "clean problem");
                let at = p.inject(&mut rng, which, value);
                let want = predicted_masks(&p);
                if which == Inject::GradLoss {
                    // A host scalar on the CPU path: rejected, never run.
                    let r = cpu::reference(&p.shape, &p.opts, &p.host());
                    assert!(
                        matches!(
                            r,
                            Err(Error::NonFinite {
                                name: "grad_loss",
                                ..
                            })
                        ),
                        "{r:?}"
                    );
                    check_consequences(&p, which, value, &at, &want);
                    continue;
                }
                let got = cpu_masks(&p);
                got.compare(&want, "cpu", "rules")
                    .unwrap_or_else(|e| panic!("{}: {which:?} = {value}: {e}", c.name));
                check_consequences(&p, which, value, &at, &got);
                for (s, n) in seen.iter_mut().zip(got.counts()) {
                    *s += n;
                }
                println!(
                    "{}: {which:?} = {value} at {at:?}: non-finite {:?}",
                    c.name,
                    got.counts()
                );
            }
        }
    }
    // Every output was reached by some case.
    assert!(seen.iter().all(|&n| n > 0), "{seen:?}");
}

/// The GPU's non-finite pattern equals the CPU's (the rules' for a
/// grad_loss on the device), element by element, on every kernel family
/// of the Hopper path. Differences are reported per output with positions
/// before the test fails.
#[test]
fn gpu_makes_the_same_outputs_non_finite_as_the_cpu() {
    let Some(ctx) = gpu("gpu_makes_the_same_outputs_non_finite_as_the_cpu") else {
        return;
    };
    let mut failures = Vec::new();
    let mut runs = 0;
    for (ci, c) in configs(true).iter().enumerate() {
        for (ii, which) in INJECT_ALL.into_iter().enumerate() {
            for value in [f32::NAN, f32::INFINITY] {
                let (mut p, mut rng) = problem(c, 1000 + 100 * ci as u64 + ii as u64);
                let at = p.inject(&mut rng, which, value);
                let want = if which == Inject::GradLoss {
                    predicted_masks(&p)
                } else {
                    cpu_masks(&p)
                };
                let got = Masks::of_gpu(&run_gpu(&ctx, &p));
                runs += 1;
                let label = format!("{}: {which:?} = {value} at {at:?}", c.name);
                match got.compare(&want, "gpu", "cpu") {
                    Ok(()) => println!("{label}: same, non-finite {:?}", got.counts()),
                    Err(e) => {
                        println!("{label}: DIFFERENT: {e}");
                        failures.push(format!("{label}: {e}"));
                    }
                }
            }
        }
    }
    println!("{} of {runs} GPU runs differ from the CPU", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
