//! The forward's CPU reference (`forward::cpu`, the oracle of the GPU
//! tests) against an independent direct computation, and against itself
//! across modes: softmax rows sum to one, log-probabilities are the logs
//! of the probabilities, the local and global conventions agree, dense
//! mode's raw logits are the sparse mode's `logprob + lse` on the same
//! keys, and the backward of the forward's own predict as target is zero.

use dsa_indexer_bwd::cpu::{self as bwd, HostGrad, HostInputs, HostOutputs};
use dsa_indexer_bwd::forward::{self, cpu};
use dsa_indexer_bwd::{bf16, dense, Error, KeyIds, Options, ScoreKind, Shape};
use rand::{Rng, SeedableRng};

fn draw(rng: &mut impl Rng, n: usize) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
        .collect()
}

struct Case {
    s: Shape,
    q: Vec<bf16>,
    w: Vec<bf16>,
    k: Vec<bf16>,
    /// Global ids, -1 padding.
    ids: Vec<i32>,
}

fn case(seed: u64) -> Case {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let s = Shape {
        batch: 2,
        seq_q: 5,
        seq_k: 30,
        heads: 16,
        head_dim: 64,
        topk: 9,
    };
    let ids = (0..s.slots())
        .map(|i| {
            let b = i / (s.seq_q * s.topk);
            if rng.random_bool(0.2) || i % 45 < 9 && b == 1 {
                -1
            } else {
                (b * s.seq_k + rng.random_range(0..s.seq_k)) as i32
            }
        })
        .collect();
    Case {
        q: draw(&mut rng, s.q_len()),
        w: draw(&mut rng, s.w_len()),
        k: draw(&mut rng, s.k_len()),
        ids,
        s,
    }
}

fn inputs(c: &Case) -> cpu::HostInputs<'_> {
    cpu::HostInputs {
        index_q: &c.q,
        weights: &c.w,
        index_k: &c.k,
        topk_indices: &c.ids,
    }
}

/// The logit of slot `t` of row `r`, computed directly.
fn direct_logit(c: &Case, sm: f64, r: usize, key: usize) -> f64 {
    let (h, d) = (c.s.heads, c.s.head_dim);
    (0..h)
        .map(|hh| {
            let s: f64 = (0..d)
                .map(|j| c.q[(r * h + hh) * d + j].to_f64() * c.k[key * d + j].to_f64())
                .sum::<f64>()
                * sm;
            c.w[r * h + hh].to_f64() * s.max(0.0)
        })
        .sum()
}

#[test]
fn probabilities_match_a_direct_softmax_and_padding_is_exact() {
    let c = case(1);
    let opts = forward::Options {
        sm_scale: 0.3,
        ..Default::default()
    };
    let r = cpu::reference(&c.s, &opts, &inputs(&c)).unwrap();
    let topk = c.s.topk;
    let mut rows_with_slots = 0;
    for row in 0..c.s.rows() {
        let ids = &c.ids[row * topk..(row + 1) * topk];
        let logits: Vec<Option<f64>> = ids
            .iter()
            .map(|&id| (id >= 0).then(|| direct_logit(&c, 0.3f32 as f64, row, id as usize)))
            .collect();
        let m = logits
            .iter()
            .flatten()
            .cloned()
            .fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = logits.iter().flatten().map(|l| (l - m).exp()).sum();
        if z == 0.0 {
            assert_eq!(r.lse[row], f64::NEG_INFINITY, "row {row} has no valid slot");
        } else {
            rows_with_slots += 1;
            assert!((r.lse[row] - (m + z.ln())).abs() < 1e-12);
            let sum: f64 = r.score[row * topk..(row + 1) * topk].iter().sum();
            assert!((sum - 1.0).abs() < 1e-12, "row {row} sums to {sum}");
        }
        for (t, l) in logits.iter().enumerate() {
            let got = r.score[row * topk + t];
            match l {
                Some(l) => assert!((got - (l - r.lse[row]).exp()).abs() < 1e-12),
                None => assert_eq!(got, 0.0),
            }
        }
    }
    assert!(
        rows_with_slots > 5 && rows_with_slots < c.s.rows(),
        "{rows_with_slots}"
    );
}

#[test]
fn log_probabilities_local_ids_and_i64_ids_agree() {
    let c = case(2);
    let probs = forward::Options {
        sm_scale: 0.125,
        ..Default::default()
    };
    let logs = forward::Options {
        score: ScoreKind::LogProbs,
        ..probs
    };
    let p = cpu::reference(&c.s, &probs, &inputs(&c)).unwrap();
    let l = cpu::reference(&c.s, &logs, &inputs(&c)).unwrap();
    assert_eq!(p.lse, l.lse);
    for (a, b) in p.score.iter().zip(&l.score) {
        if *a == 0.0 {
            assert_eq!(*b, f64::NEG_INFINITY);
        } else {
            assert!((a.ln() - b).abs() < 1e-12);
        }
    }
    // The same keys as local ids (padding as S_k, which must not alias the
    // next batch).
    let per = c.s.seq_q * c.s.topk;
    let local: Vec<i32> = c
        .ids
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            if id < 0 {
                c.s.seq_k as i32
            } else {
                id - ((i / per) * c.s.seq_k) as i32
            }
        })
        .collect();
    let x = cpu::HostInputs {
        topk_indices: &local,
        ..inputs(&c)
    };
    let lo = forward::Options {
        key_ids: KeyIds::Local,
        ..probs
    };
    assert_eq!(cpu::reference(&c.s, &lo, &x).unwrap(), p);
    let wide: Vec<i64> = c
        .ids
        .iter()
        .map(|&id| if id < 0 { (1i64 << 32) + 3 } else { id as i64 })
        .collect();
    let x = cpu::HostInputs {
        index_q: &c.q,
        weights: &c.w,
        index_k: &c.k,
        topk_indices: &wide[..],
    };
    assert_eq!(cpu::reference(&c.s, &probs, &x).unwrap(), p);
}

#[test]
fn dense_logits_are_the_sparse_logprobs_plus_lse_on_the_visible_keys() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let ds = dense::Shape::bshd(2, 6, 8, 32, 64).with_q_offset(vec![1, -2]);
    let (rows, h, d, cols) = (ds.rows(), 32, 64, ds.score_cols());
    let (q, w, k) = (
        draw(&mut rng, rows * h * d),
        draw(&mut rng, rows * h),
        draw(&mut rng, ds.key_rows() * d),
    );
    let opts = forward::Options {
        sm_scale: 0.2,
        ..Default::default()
    };
    let x = cpu::DenseHostInputs {
        index_q: &q,
        weights: &w,
        index_k: &k,
    };
    let dr = cpu::dense_reference(&ds, &opts, &x).unwrap();
    let mut ids = vec![-1i32; rows * cols];
    for r in 0..rows {
        let at = ds.row(r);
        for j in 0..at.visible {
            ids[r * cols + j] = (at.key_start + j) as i32;
        }
    }
    let s = Shape {
        batch: 1,
        seq_q: rows,
        seq_k: ds.key_rows(),
        heads: h,
        head_dim: d,
        topk: cols,
    };
    let logs = forward::Options {
        score: ScoreKind::LogProbs,
        ..opts
    };
    let sx = cpu::HostInputs {
        index_q: &q,
        weights: &w,
        index_k: &k,
        topk_indices: &ids,
    };
    let sr = cpu::reference(&s, &logs, &sx).unwrap();
    assert_eq!(dr.lse, sr.lse);
    let mut empty = 0;
    for r in 0..rows {
        let v = ds.row(r).visible;
        empty += (v == 0) as usize;
        for j in 0..cols {
            let got = dr.score[r * cols + j];
            if j < v {
                assert!((got - (sr.score[r * cols + j] + sr.lse[r])).abs() < 1e-9);
            } else {
                assert_eq!(got, 0.0);
            }
        }
    }
    assert!(empty > 0, "a row before the first key sees nothing");
}

#[test]
fn the_backward_of_the_forwards_own_predict_as_target_is_zero() {
    let c = case(4);
    let opts = forward::Options {
        sm_scale: 0.25,
        ..Default::default()
    };
    let mut score = vec![0.0f32; c.s.slots()];
    let mut lse = vec![0.0f32; c.s.rows()];
    cpu::execute(&c.s, &opts, &inputs(&c), &mut score, &mut lse).unwrap();
    // KL(p || p) has zero gradient: grad_signal = 0 in every valid slot.
    let bopts = Options {
        sm_scale: 0.25,
        ..Options::default()
    };
    let x = HostInputs {
        index_q: &c.q,
        weights: &c.w,
        index_k: &c.k,
        attn_score: &score,
        index_score: &score,
        topk_indices: &c.ids,
        grad_loss: 1.0,
        loss_coeff: 1.0,
    };
    let mut gs = score.clone();
    let mut dq = vec![bf16::ZERO; c.s.q_len()];
    let mut dw = vec![bf16::ZERO; c.s.w_len()];
    let mut dk = vec![0.0f32; c.s.k_len()];
    bwd::execute(
        &c.s,
        &bopts,
        &x,
        HostOutputs {
            attn_score: &mut gs,
            d_index_q: &mut dq,
            d_weights: HostGrad::Bf16(&mut dw),
            d_index_k: HostGrad::F32(&mut dk),
        },
    )
    .unwrap();
    let biggest = gs.iter().fold(0.0f32, |a, &g| a.max(g.abs()));
    assert!(biggest < 1e-8, "{biggest}");
}

#[test]
fn bad_host_inputs_are_refused_before_writing() {
    let c = case(5);
    let opts = forward::Options::default();
    let mut score = vec![7.0f32; c.s.slots()];
    let mut lse = vec![7.0f32; c.s.rows() + 1];
    let e = cpu::execute(&c.s, &opts, &inputs(&c), &mut score, &mut lse);
    assert!(
        matches!(e, Err(Error::Length { tensor: "lse", .. })),
        "{e:?}"
    );
    let x = cpu::HostInputs {
        topk_indices: &c.ids[1..],
        ..inputs(&c)
    };
    let mut lse = vec![7.0f32; c.s.rows()];
    let e = cpu::execute(&c.s, &opts, &x, &mut score, &mut lse);
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
    let bad = forward::Options {
        sm_scale: f32::INFINITY,
        ..opts
    };
    assert!(matches!(
        cpu::execute(&c.s, &bad, &inputs(&c), &mut score, &mut lse),
        Err(Error::NonFinite { .. })
    ));
    assert!(score.iter().chain(&lse).all(|&v| v == 7.0));
}
