//! The benchmark report renders (table and SVG chart) from synthetic
//! points, so `--markdown`/`--plot` cannot fail first on the GPU machine.

use dsa_indexer_bwd::{GradDtype, StageTimes};
use indexer_tests::report::{markdown, plot, Ceilings, Point};

fn point(topk: usize, ids: &'static str, dk: GradDtype, us: f64) -> Point {
    Point {
        topk,
        ids,
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
    }
    let c = Ceilings {
        mma_flops: 6e14,
        scatter_red: 1e12,
        scatter_bulk: 3.5e12,
        gather: 7e12,
        copy: 4e12,
        slots_gather: 2.5e10,
        slots_reduce: 7e9,
        slots_both: 5e9,
    };
    let md = markdown(&pts, "test GPU", &c);
    assert_eq!(
        md.lines().filter(|l| l.starts_with("| 2048 |")).count(),
        3,
        "{md}"
    );
    assert!(md.contains("mma.sync bf16 600 TFLOP/s"), "{md}");
    assert!(md.contains("both 5.00 G slots/s (3.84 TB/s)"), "{md}");
    assert!(md.contains("| 20% | 500 |"), "{md}");
    let path = std::env::temp_dir().join(format!("bench-{}.svg", std::process::id()));
    plot(path.to_str().unwrap(), &pts, &c).unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert!(
        svg.starts_with("<svg") && svg.contains("cuDNN-frontend") && svg.contains("topk"),
        "{}",
        &svg[..200.min(svg.len())]
    );
    assert!(svg.matches("<circle").count() >= 15);
}
