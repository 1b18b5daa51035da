//! Benchmark report: measured ceilings, points, the README's markdown
//! table and the SVG chart (plotters).

use dsa_indexer_bwd::{GradDtype, StageTimes};
use std::fmt::Write as _;

/// Reference points from DESIGN.md (cuDNN-frontend 1.32 on this H200, uniform / ragged).
pub const CUDNN: [(usize, f64, f64); 5] = [
    (128, 578.0, 555.0),
    (256, 781.0, 752.0),
    (512, 1251.0, 1203.0),
    (1024, 2157.0, 2014.0),
    (2048, 3906.0, 3494.0),
];

/// Measured ceilings of this GPU.
#[derive(Clone, Copy, Debug)]
pub struct Ceilings {
    /// `mma.sync` m16n8k16 bf16 throughput, FLOP/s.
    pub mma_flops: f64,
    /// Scattered f32 row reduction, bytes/s: per-element `red`, bulk `cp.reduce.async.bulk`.
    pub scatter_red: f64,
    /// See `scatter_red`.
    pub scatter_bulk: f64,
    /// Gathered bf16 rows, bytes/s.
    pub gather: f64,
    /// Device copy, bytes read + written per second.
    pub copy: f64,
}

/// One measured point.
#[derive(Clone, Debug)]
pub struct Point {
    pub topk: usize,
    pub ids: &'static str,
    pub dk: GradDtype,
    pub median_us: f64,
    pub min_us: f64,
    pub p90_us: f64,
    pub stages: StageTimes,
    pub tflops: f64,
    pub scatter_gbs: f64,
    pub bound_us: f64,
    pub binding: &'static str,
}

/// The README table of `points` and the ceilings line.
pub fn markdown(points: &[Point], gpu: &str, c: &Ceilings) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| topk | ids | d_index_k | median us | min us | p90 us | zeroing us | gradients us | cast us | TFLOP/s | dK GB/s | bound | of bound |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for p in points {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.0} | {:.1} | {:.1} | {:.0} | {} | {:.0}% |",
            p.topk,
            p.ids,
            if p.dk == GradDtype::F32 { "f32" } else { "bf16" },
            p.median_us,
            p.min_us,
            p.p90_us,
            p.stages.zeroing_us,
            p.stages.gradients_us,
            p.stages.cast_us,
            p.tflops,
            p.scatter_gbs,
            p.binding,
            100.0 * p.bound_us / p.median_us
        );
    }
    let _ = writeln!(
        s,
        "\nCeilings measured in the same run on {gpu}: mma.sync bf16 {:.0} TFLOP/s; scattered f32 rows {:.2} TB/s (red) / {:.2} TB/s (bulk); gathered bf16 rows {:.2} TB/s; copy {:.2} TB/s.",
        c.mma_flops / 1e12,
        c.scatter_red / 1e12,
        c.scatter_bulk / 1e12,
        c.gather / 1e12,
        c.copy / 1e12
    );
    s
}

/// Writes the time-vs-topk chart as SVG to `path`.
pub fn plot(path: &str, points: &[Point], c: &Ceilings) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let (tmin, tmax) = (64.0f64, 4096.0f64);
    let ymax = points
        .iter()
        .map(|p| p.median_us)
        .fold(CUDNN[4].1, f64::max)
        * 1.5;
    let ymin = points.iter().map(|p| p.bound_us).fold(CUDNN[0].2, f64::min) * 0.5;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "indexer backward on H200: whole execute vs topk",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((tmin..tmax).log_scale(), (ymin..ymax).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("topk")
        .y_desc("time (us)")
        .draw()?;
    let series = [
        (
            "uniform",
            GradDtype::F32,
            RED,
            "this crate, uniform, f32 dK",
        ),
        ("ragged", GradDtype::F32, BLUE, "this crate, ragged, f32 dK"),
        (
            "uniform",
            GradDtype::Bf16,
            MAGENTA,
            "this crate, uniform, bf16 dK",
        ),
    ];
    for (ids, dk, color, label) in series {
        let pts: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| p.ids == ids && p.dk == dk)
            .map(|p| (p.topk as f64, p.median_us))
            .collect();
        if pts.is_empty() {
            continue;
        }
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    let cudnn: Vec<(f64, f64)> = CUDNN.iter().map(|&(t, u, _)| (t as f64, u)).collect();
    chart
        .draw_series(LineSeries::new(cudnn, BLACK.stroke_width(1)))?
        .label("cuDNN-frontend 1.32, uniform (DESIGN.md)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    let bound: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| p.ids == "uniform" && p.dk == GradDtype::F32)
        .map(|p| (p.topk as f64, p.bound_us))
        .collect();
    let gray = RGBColor(120, 120, 120);
    chart
        .draw_series(LineSeries::new(bound, gray.stroke_width(1)))?
        .label(format!(
            "ceiling: max(FLOP / {:.0} TFLOP/s, dK bytes / {:.2} TB/s)",
            c.mma_flops / 1e12,
            c.scatter_bulk.max(c.scatter_red) / 1e12
        ))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], gray));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}
