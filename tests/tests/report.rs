//! The benchmark report renders (table and SVG chart) from synthetic
//! points, so `--markdown`/`--plot` cannot fail first on the GPU machine.

use dsa_indexer_bwd::{GradDtype, KeyIds, Options, StageTimes};
use indexer_tests::report::{
    ceilings_json, markdown, parse_json_lines, plot, point_json, Ceilings, IdStats, Point,
    Workload, HEADLINE,
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
        },
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
    // 8.39 M valid slots over 65536 keys: 128 slots per key.
    assert!(md.contains("| 8.39 | 128.0 | 0.00 |"), "{md}");
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
    assert_eq!(q.median_us, 777.0);
    // Not-finite numbers are written as null and read back as NaN.
    p.traffic_us = f64::NAN;
    p.stats = IdStats::UNKNOWN;
    let line = point_json(&p);
    assert!(line.contains("\"traffic_us\":null"), "{line}");
    let (_, _, pts) = parse_json_lines(&format!("{}\n{line}\n", ceilings_json("g", &c))).unwrap();
    assert!(pts[0].traffic_us.is_nan() && pts[0].stats.valid_slots.is_nan());
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
