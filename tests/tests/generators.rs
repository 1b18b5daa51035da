//! The benchmark's id generators (SPEC, "Performance workload"): "ragged"
//! ([`Problem::make_ragged`]) and "topk" ([`Problem::make_topk`]) against
//! their documented recipes, in both id conventions.

use dsa_indexer_bwd::{KeyIds, Options, Shape};
use indexer_tests::{shape, Gen, Padding, Problem, TopkScore, Values};
use rand::SeedableRng;
use std::collections::HashSet;

fn problem(rng: &mut rand::rngs::StdRng, s: Shape, key_ids: KeyIds) -> Problem {
    let g = Gen {
        values: Values::Grid,
        padding: Padding::NegOne,
        short_rows: 0.0,
        trailing: false,
        duplicates: false,
        masked: 0.0,
    };
    let opts = Options {
        key_ids,
        ..Options::default()
    };
    Problem::random(rng, s, opts, g)
}

/// The keys (local indices within the batch) of row `r`'s first `n` slots,
/// checking the id convention; panics on an invalid id there.
fn keys(p: &Problem, r: usize, n: usize) -> Vec<usize> {
    let s = p.shape;
    let b = r / s.seq_q;
    (0..n)
        .map(|t| {
            let id = p.ids[r * s.topk + t];
            let key = p
                .opts
                .resolve(&s, b, id)
                .unwrap_or_else(|| panic!("row {r} slot {t}: invalid id {id}"));
            assert!(
                key / s.seq_k == b,
                "row {r} slot {t}: id {id} is not a key of batch {b}"
            );
            if p.opts.key_ids == KeyIds::Local {
                assert!((id as usize) < s.seq_k);
            }
            key % s.seq_k
        })
        .collect()
}

/// Slots `n..topk` of row `r` are -1 and marked invalid, slots `..n` valid.
fn padded_after(p: &Problem, r: usize, n: usize) {
    let topk = p.shape.topk;
    for t in 0..topk {
        let i = r * topk + t;
        assert_eq!(p.valid[i], t < n, "row {r} slot {t}: valid flag");
        if t >= n {
            assert_eq!(p.ids[i], -1, "row {r} slot {t}: padding");
        }
    }
}

#[test]
fn ragged_rows_draw_distinct_visible_keys_in_random_order() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for key_ids in [KeyIds::Global, KeyIds::Local] {
        let s = shape(2, 300, 100, 1, 8, 64);
        let mut p = problem(&mut rng, s, key_ids);
        p.make_ragged(&mut rng);
        let (mut long_rows, mut sorted_rows, mut same_as_prev) = (0, 0, 0);
        for r in 0..s.rows() {
            let row = r % s.seq_q;
            let v = (row / 2 + 1).min(s.seq_k);
            let n = v.min(s.topk);
            let k = keys(&p, r, n);
            padded_after(&p, r, n);
            let set: HashSet<usize> = k.iter().copied().collect();
            assert_eq!(set.len(), n, "row {r}: duplicate keys");
            assert!(k.iter().all(|&j| j < v), "row {r}: key beyond {v}");
            if v <= s.topk {
                assert_eq!(set, (0..v).collect(), "row {r}: not every visible key");
            }
            if n >= 32 {
                long_rows += 1;
                sorted_rows += k.windows(2).all(|w| w[0] < w[1]) as usize;
                if row % 2 == 1 {
                    same_as_prev += (p.ids[r * s.topk..(r + 1) * s.topk]
                        == p.ids[(r - 1) * s.topk..r * s.topk])
                        as usize;
                }
            }
        }
        assert!(long_rows > 300);
        assert_eq!(sorted_rows, 0, "slots in key order: not a random order");
        assert_eq!(
            same_as_prev, 0,
            "rows 2i and 2i + 1 identical slot for slot"
        );
        // Rows that see more keys than topk pick different subsets.
        let last = s.seq_q - 1;
        let a: HashSet<usize> = keys(&p, last, s.topk).into_iter().collect();
        let b: HashSet<usize> = keys(&p, last - 2, s.topk).into_iter().collect();
        assert_ne!(a, b);
    }
}

/// Checks every row of a "topk" problem against the recipe; returns per
/// pair of neighbouring full rows (both with `topk` keys): the fraction of
/// keys they share and whether they are identical slot for slot.
fn check_topk_rows(p: &Problem, score: &TopkScore) -> Vec<(f64, bool)> {
    let s = p.shape;
    let mut pairs = Vec::new();
    let mut prev: Option<Vec<usize>> = None;
    for r in 0..s.rows() {
        let (b, row) = (r / s.seq_q, r % s.seq_q);
        let visible = score.visible(row);
        assert_eq!(
            visible as i64,
            (s.seq_k as i64 - s.seq_q as i64 + row as i64 + 1).clamp(0, s.seq_k as i64)
        );
        let n = visible.min(s.topk);
        let k = keys(p, r, n);
        padded_after(p, r, n);
        let set: HashSet<usize> = k.iter().copied().collect();
        assert_eq!(set.len(), n, "row {r}: duplicate keys");
        assert!(k.iter().all(|&j| j < visible), "row {r}: a future key");
        let sc: Vec<f32> = k.iter().map(|&j| score.score(b, row, j).unwrap()).collect();
        assert!(
            sc.windows(2).all(|w| w[0] >= w[1]),
            "row {r}: slots not in descending score order"
        );
        // The selection is the top of all visible keys.
        if let Some(&lowest) = sc.last() {
            let best_left = (0..visible)
                .filter(|j| !set.contains(j))
                .map(|j| score.score(b, row, j).unwrap())
                .fold(f32::NEG_INFINITY, f32::max);
            assert!(best_left <= lowest, "row {r}: a better key left out");
        }
        assert!(score.score(b, row, visible).is_none());
        // Sinks first, then the local window.
        let sinks = TopkScore::SINKS.min(n);
        assert!(
            k[..sinks].iter().all(|&j| j < TopkScore::SINKS),
            "row {r}: sinks not on top: {:?}",
            &k[..sinks]
        );
        if n >= TopkScore::SINKS + TopkScore::WINDOW && visible > TopkScore::WINDOW {
            let p_pos = visible - 1;
            for d in 0..TopkScore::WINDOW {
                assert!(
                    set.contains(&(p_pos - d)),
                    "row {r}: window key {d} missing"
                );
            }
        }
        if let (Some(a), true) = (&prev, n == s.topk && row > 0) {
            let shared = a.iter().filter(|j| set.contains(j)).count();
            pairs.push((shared as f64 / n as f64, *a == k));
        }
        prev = (n == s.topk).then_some(k);
    }
    pairs
}

#[test]
fn topk_rows_are_the_documented_top_k_in_descending_order() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(6);
    for key_ids in [KeyIds::Global, KeyIds::Local] {
        // Every row sees hundreds of keys, more than topk.
        let s = shape(2, 256, 1024, 1, 8, 160);
        let mut p = problem(&mut rng, s, key_ids);
        let score = p.make_topk(&mut rng);
        let pairs = check_topk_rows(&p, &score);
        assert_eq!(pairs.len(), s.rows() - 2);
        let mean = pairs.iter().map(|x| x.0).sum::<f64>() / pairs.len() as f64;
        let worst = pairs.iter().map(|x| x.0).fold(1.0, f64::min);
        let identical = pairs.iter().filter(|x| x.1).count();
        println!("{key_ids:?}: neighbours share {mean:.3} of keys (worst {worst:.3}); {identical} identical");
        assert!(mean > 0.75 && worst > 0.5, "mean {mean} worst {worst}");
        assert!(mean < 0.999, "rows share every key: no noise");
        assert!(
            identical * 10 < pairs.len(),
            "{identical} of {} neighbours identical slot for slot",
            pairs.len()
        );
        // Content matters: rows pick keys beyond sinks and window, and
        // not all of them the same ones.
        let content: HashSet<i32> = (0..s.rows())
            .flat_map(|r| p.ids[r * s.topk + 68..(r + 1) * s.topk].to_vec())
            .collect();
        assert!(content.len() > 3 * (s.topk - 68), "{}", content.len());
    }
}

#[test]
fn topk_rows_before_the_keys_are_padding() {
    // S_q > S_k as in the headline shape: row s sits at key position
    // s - (S_q - S_k), so the first S_q - S_k rows see no key at all.
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for key_ids in [KeyIds::Global, KeyIds::Local] {
        let s = shape(2, 200, 64, 1, 8, 32);
        let mut p = problem(&mut rng, s, key_ids);
        let score = p.make_topk(&mut rng);
        check_topk_rows(&p, &score);
        for r in 0..s.rows() {
            let row = r % s.seq_q;
            let valid = p.valid[r * s.topk..(r + 1) * s.topk]
                .iter()
                .filter(|&&v| v)
                .count();
            let want = (row + 1).saturating_sub(s.seq_q - s.seq_k).min(s.topk);
            assert_eq!(valid, want, "row {r}");
        }
    }
}

#[test]
fn topk_scores_are_reproducible_and_the_ids_a_function_of_them() {
    let s = shape(1, 64, 512, 1, 8, 48);
    let draw = |seed| {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut p = problem(&mut rng, s, KeyIds::Global);
        p.make_topk(&mut rng);
        p.ids
    };
    assert_eq!(draw(3), draw(3));
    assert_ne!(draw(3), draw(4));
}

/// The long-context workload's ids in reasonable time (release:
/// `cargo test --release -p indexer-tests --test generators -- --ignored`).
#[test]
#[ignore = "seconds in release; run by hand"]
fn topk_generator_is_fast_enough_for_long_context() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    for (sq, sk, topk) in [(4096, 131072, 2048), (8192, 4096, 2048)] {
        let s = shape(1, sq, sk, 1, 8, topk);
        let mut p = problem(&mut rng, s, KeyIds::Global);
        let t = std::time::Instant::now();
        p.make_topk(&mut rng);
        println!("S_q {sq} S_k {sk} topk {topk}: make_topk {:?}", t.elapsed());
        let t = std::time::Instant::now();
        p.make_ragged(&mut rng);
        println!(
            "S_q {sq} S_k {sk} topk {topk}: make_ragged {:?}",
            t.elapsed()
        );
    }
}
