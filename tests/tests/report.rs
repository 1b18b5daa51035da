//! The benchmark report renders (table and SVG chart) from synthetic
//! points, so `--markdown`/`--plot` cannot fail first on the GPU machine.

use dsa_indexer_bwd::{GradDtype, KeyIds, Options, StageTimes};
use indexer_tests::report::{
    ceilings_json, markdown, paired_kernel_computes, parse_json_lines, plot, point_json, Ceilings,
    Computes, IdStats, Point, Workload, HEADLINE,
};
use indexer_tests::shape;

fn point(topk: usize, ids: &'static str, dk: GradDtype, us: f64) -> Point {
    Point {
        topk,
        ids,
        workload: HEADLINE,
        dk,
        median_us: us,
        min_us: us * 0.99,
        p90_us: us * 1.01,
        stages: StageTimes {
            zeroing_us: 2.0,
            gradients_us: us - 3.0,
            cast_us: 1.0,
            total_us: us,
        },
        tflops: 50.0,
        scatter_gbs: 600.0,
        bound_us: us / 5.0,
        binding: "dK scatter",
        traffic_us: us / 2.0,
        stats: IdStats {
            valid_slots: (8192 * topk) as f64,
            distinct_keys: 4096.0,
            pair_aligned: 0.0,
            pair_shared: 0.0,
            union2: 1.5,
            union3: 2.25,
            union4: 2.5,
            union8: 3.75,
        },
        reductions_per_slot: 1.0,
    }
}

fn ceilings() -> Ceilings {
    Ceilings {
        mma_flops: 6e14,
        scatter_red: 1e12,
        scatter_bulk: 3.5e12,
        gather: 7e12,
        copy: 4e12,
        slots_gather: 2.5e10,
        slots_reduce: 7e9,
        slots_both: 5e9,
    }
}

#[test]
fn markdown_and_svg_render() {
    let mut pts = Vec::new();
    for (i, t) in [128usize, 256, 512, 1024, 2048].into_iter().enumerate() {
        let us = 1000.0 * (i + 1) as f64;
        pts.push(point(t, "uniform", GradDtype::F32, us));
        pts.push(point(t, "ragged", GradDtype::F32, us * 0.9));
        pts.push(point(t, "uniform", GradDtype::Bf16, us * 1.01));
        pts.push(point(t, "topk", GradDtype::F32, us * 0.7));
    }
    // A long-context point: in the table, not in the chart (other shape).
    let mut long = point(2048, "topk", GradDtype::F32, 9000.0);
    long.workload = Workload {
        seq_q: 4096,
        seq_k: 131072,
        ..HEADLINE
    };
    long.stats = IdStats {
        valid_slots: 4096.0 * 2048.0,
        distinct_keys: 65536.0,
        pair_aligned: 0.0,
        pair_shared: 0.0,
        union2: 1.0625,
        union3: 1.1875,
        union4: 1.25,
        union8: 1.5,
    };
    pts.push(long);
    let c = ceilings();
    let md = markdown(&pts, "test GPU", &c);
    assert_eq!(
        md.lines().filter(|l| l.starts_with("| 2048 |")).count(),
        5,
        "{md}"
    );
    assert!(md.contains("mma.sync bf16 600 TFLOP/s"), "{md}");
    assert!(md.contains("both 5.00 G slots/s (3.84 TB/s)"), "{md}");
    assert!(md.contains("| 20% | 500 |"), "{md}");
    assert!(
        md.contains("| 2048 | topk | 4096x131072 | f32 | 9000 |"),
        "{md}"
    );
    // 8.39 M valid slots over 65536 keys: 128 slots per key; then the
    // union sharing of groups of 2, 3, 4 and 8 rows and reductions per
    // slot.
    assert!(
        md.contains("| 8.39 | 128.0 | 0.00 | 1.06 | 1.19 | 1.25 | 1.50 | 1.000 |"),
        "{md}"
    );
    assert!(
        md.contains("| sel/union key R=2 | R=3 | R=4 | R=8 | reductions/slot |"),
        "{md}"
    );
    assert!(
        md.contains("| 0.00 | 1.50 | 2.25 | 2.50 | 3.75 | 1.000 |"),
        "{md}"
    );
    assert!(md.contains("B = 1, H = 64, D = 128."), "{md}");
    // Two heads x head dimensions in one run: each row names its shape.
    let mut h128 = point(512, "uniform", GradDtype::F32, 1500.0);
    h128.workload.heads = 128;
    let two = markdown(
        &[point(512, "uniform", GradDtype::F32, 800.0), h128],
        "test GPU",
        &c,
    );
    assert!(
        two.contains("| 512 | uniform | 8192x4096 H64 D128 | f32 | 800 |"),
        "{two}"
    );
    assert!(
        two.contains("| 512 | uniform | 8192x4096 H128 D128 | f32 | 1500 |"),
        "{two}"
    );
    assert!(!two.contains("B = 1, H ="), "{two}");
    let path = std::env::temp_dir().join(format!("bench-{}.svg", std::process::id()));
    plot(path.to_str().unwrap(), &pts, &c).unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert!(
        svg.starts_with("<svg") && svg.contains("cuDNN-frontend") && svg.contains("topk"),
        "{}",
        &svg[..200.min(svg.len())]
    );
    // Headline points only: 4 series of 5.
    assert_eq!(svg.matches("<circle").count(), 20, "circles");
    assert!(svg.contains("topk ids"));
}

/// JSON lines round-trip: what the bench writes is what --from-json reads.
#[test]
fn json_lines_round_trip_with_the_new_fields() {
    let c = ceilings();
    let mut p = point(512, "topk", GradDtype::Bf16, 777.0);
    p.workload = Workload {
        seq_q: 4096,
        seq_k: 32768,
        ..HEADLINE
    };
    p.stats.pair_shared = 0.25;
    p.reductions_per_slot = 0.75;
    let text = format!("{}\nnot json\n{}\n", ceilings_json("g", &c), point_json(&p));
    let (gpu, c2, pts) = parse_json_lines(&text).unwrap();
    assert_eq!(gpu, "g");
    assert_eq!(c2.slots_both, 5e9);
    assert_eq!(pts.len(), 1);
    let q = &pts[0];
    assert_eq!(
        (q.topk, q.ids, q.workload, q.dk),
        (512, "topk", p.workload, GradDtype::Bf16)
    );
    assert_eq!(q.stats, p.stats);
    assert_eq!(q.reductions_per_slot, 0.75);
    assert_eq!(q.median_us, 777.0);
    // Not-finite numbers are written as null and read back as NaN.
    p.traffic_us = f64::NAN;
    p.stats = IdStats::UNKNOWN;
    p.reductions_per_slot = f64::NAN;
    let line = point_json(&p);
    assert!(line.contains("\"traffic_us\":null"), "{line}");
    assert!(
        line.contains("\"union8\":null,\"reductions_per_slot\":null}"),
        "{line}"
    );
    let (_, _, pts) = parse_json_lines(&format!("{}\n{line}\n", ceilings_json("g", &c))).unwrap();
    assert!(pts[0].traffic_us.is_nan() && pts[0].stats.valid_slots.is_nan());
    assert!(pts[0].stats.union4.is_nan() && pts[0].reductions_per_slot.is_nan());
    let md = markdown(&pts, "g", &c);
    assert!(md.contains("| - | - | - | - | - | - | - | - |"), "{md}");
}

/// Every bench run in docs/runs still renders: the headline shape (runs
/// before the "topk" workload), several H x D in one run ("-shapes"), and
/// unknown id counts for fields those runs did not write. (Side-by-side
/// runs live in docs/runs/side-by-side/.)
#[test]
fn earlier_runs_still_parse_and_render() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/runs");
    let mut files = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.extension().is_none_or(|x| x != "jsonl") || !name.contains("-bench") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let (gpu, c, pts) =
            parse_json_lines(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!pts.is_empty(), "{}", path.display());
        for p in &pts {
            assert!(["uniform", "ragged", "topk"].contains(&p.ids), "{}", p.ids);
            // Runs before the "topk" and long-context workloads timed the
            // headline shape only (the "-shapes" runs time several H x D
            // on purpose).
            if !pts.iter().any(|q| q.ids == "topk") && !name.contains("-shapes") {
                assert_eq!(p.workload, HEADLINE, "{}", path.display());
            }
        }
        // Runs before the union sharing was counted: unknown, not 0.
        if !text.contains("\"union4\"") {
            assert!(pts.iter().all(|p| p.stats.union4.is_nan()
                && p.stats.union8.is_nan()
                && p.reductions_per_slot.is_nan()));
        }
        let md = markdown(&pts, &gpu, &c);
        assert_eq!(
            md.lines().filter(|l| l.starts_with("| ")).count(),
            pts.len() + 1
        );
        files += 1;
    }
    assert!(files > 0);
}

/// The id counts on small hand-made ids.
#[test]
fn id_stats_count_valid_distinct_and_aligned_slots() {
    // B = 2, S_q = 2, S_k = 4, topk = 3.
    let s = shape(2, 2, 4, 1, 8, 3);
    let local = Options {
        key_ids: KeyIds::Local,
        ..Options::default()
    };
    #[rustfmt::skip]
    let ids = [
        0, 1, -1, // batch 0, row 0
        0, 2, 1,  // row 1: slot 0 aligned with row 0; slot 1 not
        3, 4, 3,  // batch 1, row 0 (local 4 is padding)
        2, 3, -1, // row 1: nothing aligned (3 under padding)
    ];
    let st = IdStats::count(&s, &local, &ids);
    assert_eq!(st.valid_slots, 9.0);
    // Batch 0 keys {0, 1, 2}, batch 1 keys {3, 2} -> rows 7, 6: 5 keys.
    assert_eq!(st.distinct_keys, 5.0);
    assert!((st.slots_per_key() - 1.8).abs() < 1e-12);
    // Odd rows hold 3 + 2 valid slots; aligned: row 1 slot 0 only.
    assert!((st.pair_aligned - 0.2).abs() < 1e-12, "{st:?}");
    // As global ids, 4 is a valid key (of batch 1).
    let st = IdStats::count(&s, &Options::default(), &ids);
    assert_eq!(st.valid_slots, 10.0);
}

/// `IdStats::count` of `ids` with local (`true`) or global key ids.
fn count(s: &dsa_indexer_bwd::Shape, local: bool, ids: &[i32]) -> IdStats {
    let opts = Options {
        key_ids: if local { KeyIds::Local } else { KeyIds::Global },
        ..Options::default()
    };
    IdStats::count(s, &opts, ids)
}

/// Union sharing of groups of 4 and 8 adjacent rows on ids where it is
/// known exactly.
#[test]
fn union_sharing_counts_each_groups_distinct_keys() {
    // 8 identical rows: every key of a group of R rows selected R times.
    let s = shape(1, 8, 16, 1, 8, 3);
    let same: Vec<i32> = (0..8).flat_map(|_| [0, 1, 2]).collect();
    let st = count(&s, false, &same);
    assert_eq!((st.union4, st.union8), (4.0, 8.0), "{st:?}");
    // Groups of 2 (four of them) and of 3 (rows 0-2, 3-5 and the short
    // 6-7): 24 slots over 4 x 3 and over 3 x 3 union keys.
    assert_eq!(st.union2, 2.0, "{st:?}");
    assert!((st.union3 - 24.0 / 9.0).abs() < 1e-12, "{st:?}");
    // Disjoint rows: one selection per union key.
    let s = shape(1, 8, 32, 1, 8, 4);
    let disjoint: Vec<i32> = (0..32).collect();
    let st = count(&s, false, &disjoint);
    assert_eq!(
        (st.union2, st.union3, st.union4, st.union8),
        (1.0, 1.0, 1.0, 1.0),
        "{st:?}"
    );
    // S_q = 6: groups of 4 rows are rows 0-3 and the short 4-5 (two keys
    // each: 12 slots over 4 union keys); one group of 8 (12 over 2).
    let s = shape(1, 6, 8, 1, 8, 2);
    let st = count(&s, true, &[0, 1].repeat(6));
    assert_eq!((st.union4, st.union8), (3.0, 6.0), "{st:?}");
    // Three groups of 2 and two of 3, each with the two keys.
    assert_eq!((st.union2, st.union3), (2.0, 3.0), "{st:?}");
    // Padding and ids outside the key range are not slots: row 0 holds
    // one valid slot, rows 1-3 two (key 9 of S_k = 8 is outside).
    let s = shape(1, 4, 8, 1, 8, 3);
    #[rustfmt::skip]
    let ids = [
        -1, 9, 0,
        0, 1, -1,
        1, 0, 9,
        -5, 0, 1,
    ];
    let st = count(&s, false, &ids);
    assert_eq!(st.valid_slots, 7.0);
    assert_eq!((st.union4, st.union8), (3.5, 3.5), "{st:?}");
}

/// Groups never span two batches, and the key-id convention decides
/// which key row (if any) a slot names.
#[test]
fn union_groups_stay_in_their_batch_under_both_conventions() {
    // B = 2, S_q = 3 (global ids): batch 0 selects keys {0, 1}, batch 1
    // keys {2, 3}. Per batch: one group each, 2 + 2 union keys for 12
    // slots; groups of the flattened rows (0-3, 4-5) would give 4 + 2.
    let s = shape(2, 3, 4, 1, 8, 2);
    let ids = [[0, 1].repeat(3), [2, 3].repeat(3)].concat();
    let st = count(&s, false, &ids);
    assert_eq!((st.union4, st.union8), (3.0, 3.0), "{st:?}");
    // The same ids in both batches as global ids name the same key rows,
    // yet each batch counts its own union: 12 / (2 + 2) (one group of the
    // flattened rows would give 12 / 2 at R = 8).
    let st = count(&s, false, &[0, 1].repeat(6));
    assert_eq!(
        (st.union4, st.union8, st.distinct_keys),
        (3.0, 3.0, 2.0),
        "{st:?}"
    );
    // B = 2, S_q = 2, S_k = 4, topk = 2. Local ids: 5 is outside every
    // batch; batch 0 keys {0}, {0} (union 1), batch 1 keys {4}, {5}
    // (union 2): 4 slots over 3. Global ids: all valid (< 8); batch 0
    // {0, 5} twice (union 2), batch 1 {0, 5}, {1, 5} (union 3): 8 over 5.
    let s = shape(2, 2, 4, 1, 8, 2);
    let ids = [0, 5, 0, 5, 0, 5, 1, 5];
    let local = count(&s, true, &ids);
    assert_eq!(local.valid_slots, 4.0);
    assert!((local.union4 - 4.0 / 3.0).abs() < 1e-12, "{local:?}");
    assert_eq!(local.union8, local.union4);
    let global = count(&s, false, &ids);
    assert_eq!((global.union4, global.union8), (1.6, 1.6), "{global:?}");
}

/// The slots the paired kernel reduces once for both rows of a pair, and
/// the reductions per slot with and without it.
#[test]
fn reductions_per_slot_halve_only_shared_slots_of_the_paired_kernel() {
    // Pairs (0, 1): slot 0 shared; (2, 3): both slots. Within-batch
    // alignment over odd rows: 3 of 4; over all valid slots: 3 of 8.
    let s = shape(1, 4, 8, 1, 8, 2);
    let st = count(&s, false, &[0, 1, 0, 2, 3, 4, 3, 4]);
    assert_eq!((st.pair_aligned, st.pair_shared), (0.75, 0.375), "{st:?}");
    assert_eq!(st.reductions_per_slot(Computes::Paired), 0.625);
    assert_eq!(st.reductions_per_slot(Computes::Rows), 1.0);
    // S_q = 3, B = 2: the kernel pairs flattened rows (0, 1), (2, 3),
    // (4, 5), across the batch boundary; within a batch nothing aligns.
    let s = shape(2, 3, 8, 1, 8, 1);
    let st = count(&s, false, &[0, 1, 2, 2, 5, 5]);
    assert_eq!(st.pair_aligned, 0.0, "{st:?}");
    assert!((st.pair_shared - 2.0 / 6.0).abs() < 1e-12, "{st:?}");
    // Whether the paired kernel computes: launched by the plan and picked
    // by the dispatch test on sampled pairs (H = 64, D = 128, topk > 64).
    use kernels_gpu::registry::{SM90_WG, SM90_WG_PAIR};
    let (rows, topk) = (32usize, 128usize);
    let s = shape(1, rows, 4096, 64, 128, topk);
    // Rows 2p and 2p + 1 identical, slot for slot: every odd row's slot
    // shared, half of all reductions saved.
    let twins: Vec<i32> = (0..rows * topk)
        .map(|i| ((i / (2 * topk)) * 3 + i % topk) as i32)
        .collect();
    let launched = [SM90_WG_PAIR.name, SM90_WG.name];
    assert!(paired_kernel_computes(&launched, &s, &twins));
    assert!(!paired_kernel_computes(&[SM90_WG.name], &s, &twins));
    let st = count(&s, false, &twins);
    assert_eq!(st.pair_shared, 0.5);
    assert_eq!(st.reductions_per_slot(Computes::Paired), 0.5);
    // Every pair's two rows hold the same keys: two selections per key
    // of a pair's union.
    assert_eq!(st.union2, 2.0);
    // Each row's ids shifted by one slot from its partner's: no sampled
    // slot matches, the row kernel computes, one reduction per slot.
    let shifted: Vec<i32> = (0..rows * topk)
        .map(|i| ((i / topk) + i % topk) as i32)
        .collect();
    assert!(!paired_kernel_computes(&launched, &s, &shifted));
    let st = count(&s, false, &shifted);
    assert_eq!(st.pair_shared, 0.0);
}

/// The committed benchmark page is exactly what `indexer-bench --from-json
/// ... --page` renders from the JSON lines its first line names (so the
/// page cannot drift from the run's data), and that JSON is a GPU run
/// with both d_index_k types at every point.
#[test]
fn the_benchmark_page_is_the_render_of_its_json() {
    use indexer_tests::report::{benchmark_page, page_args, parse_json_lines};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let page =
        std::fs::read_to_string(root.join("docs/benchmarks.md")).expect("docs/benchmarks.md");
    let (source, chart) = page_args(&page).expect("a generated page");
    let text = std::fs::read_to_string(root.join(&source)).expect("the page's JSON lines");
    let (gpu, ceil, points) = parse_json_lines(&text).expect("JSON lines");
    assert!(!points.is_empty() && gpu.contains("H200"), "{gpu}");
    let again = benchmark_page(&source, chart.as_deref(), &gpu, &ceil, &points);
    assert!(
        again == page,
        "docs/benchmarks.md is not the render of {source}: run `cargo run -p indexer-tests --bin indexer-bench -- --from-json {source} --page docs/benchmarks.md{}` from the repository root",
        chart.map_or(String::new(), |c| format!(" --plot {c}"))
    );
    // A changed time changes the page.
    let mut edited = points.clone();
    edited[0].median_us += 1000.0;
    assert_ne!(
        benchmark_page(&source, chart.as_deref(), &gpu, &ceil, &edited),
        page
    );
}

#[test]
fn page_args_read_back_what_the_page_was_rendered_from() {
    use indexer_tests::report::{benchmark_page, page_args};
    let c = ceilings();
    let p = benchmark_page("docs/runs/r/bench.jsonl", Some("docs/c.svg"), "G", &c, &[]);
    assert_eq!(
        page_args(&p),
        Some(("docs/runs/r/bench.jsonl".into(), Some("docs/c.svg".into())))
    );
    assert!(p.contains("](runs/r/bench.jsonl)") && p.contains("](c.svg)"));
    let p = benchmark_page("docs/runs/r/bench.jsonl", None, "G", &c, &[]);
    assert_eq!(
        page_args(&p),
        Some(("docs/runs/r/bench.jsonl".into(), None))
    );
    assert_eq!(page_args("# Not generated"), None);
}
