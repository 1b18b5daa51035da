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
    /// The gradient kernels' per-slot traffic without their arithmetic
    /// (`ceil_gather_reduce`), slots per second: one bf16 K row (256 B at
    /// D = 128) gathered, alone...
    pub slots_gather: f64,
    /// ... one f32 dK row (512 B) reduced with `red.global.add.v4.f32`,
    /// alone ...
    pub slots_reduce: f64,
    /// ... and both for every slot, in the same warps (NaN in JSON written
    /// before these were measured).
    pub slots_both: f64,
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
    /// Valid slots over `Ceilings::slots_both`: the time the memory system
    /// needs to gather each valid slot's K row once and reduce its dK row
    /// once, with no arithmetic (NaN when not measured).
    pub traffic_us: f64,
}

/// The README table of `points` and the ceilings line.
pub fn markdown(points: &[Point], gpu: &str, c: &Ceilings) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| topk | ids | d_index_k | median us | min us | p90 us | zeroing us | gradients us | cast us | TFLOP/s | dK GB/s | bound | of bound | traffic floor us |");
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for p in points {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.0} | {} | {:.1} | {:.0} | {} | {:.0}% | {} |",
            p.topk,
            p.ids,
            if p.dk == GradDtype::F32 { "f32" } else { "bf16" },
            p.median_us,
            p.min_us,
            p.p90_us,
            p.stages.zeroing_us,
            p.stages.gradients_us,
            // f32 d_index_k has no cast: the events bracket nothing.
            if p.dk == GradDtype::F32 { "-".to_string() } else { format!("{:.1}", p.stages.cast_us) },
            p.tflops,
            p.scatter_gbs,
            p.binding,
            100.0 * p.bound_us / p.median_us,
            if p.traffic_us.is_finite() { format!("{:.0}", p.traffic_us) } else { "-".to_string() }
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
    if c.slots_both.is_finite() {
        let _ = writeln!(
            s,
            "Per-slot traffic without arithmetic (a 256-byte bf16 K row gathered, a 512-byte f32 dK row reduced by `red.global.add.v4.f32`): gather alone {:.2} G slots/s ({:.2} TB/s), reduce alone {:.2} G slots/s ({:.2} TB/s), both {:.2} G slots/s ({:.2} TB/s).",
            c.slots_gather / 1e9,
            c.slots_gather * 256.0 / 1e12,
            c.slots_reduce / 1e9,
            c.slots_reduce * 512.0 / 1e12,
            c.slots_both / 1e9,
            c.slots_both * 768.0 / 1e12
        );
    }
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
        .light_line_style(WHITE)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
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

/// JSON line of the ceilings (first line of the bench's JSON output).
pub fn ceilings_json(gpu: &str, c: &Ceilings) -> String {
    format!(
        "{{\"kind\":\"ceilings\",\"gpu\":\"{gpu}\",\"mma_tflops\":{:.1},\"scatter_red_tbs\":{:.3},\"scatter_bulk_tbs\":{:.3},\"gather_tbs\":{:.3},\"copy_tbs\":{:.3},\"slot_gather_gps\":{:.4},\"slot_reduce_gps\":{:.4},\"slot_both_gps\":{:.4}}}",
        c.mma_flops / 1e12,
        c.scatter_red / 1e12,
        c.scatter_bulk / 1e12,
        c.gather / 1e12,
        c.copy / 1e12,
        c.slots_gather / 1e9,
        c.slots_reduce / 1e9,
        c.slots_both / 1e9
    )
}

/// JSON line of one point.
pub fn point_json(p: &Point) -> String {
    format!(
        "{{\"kind\":\"point\",\"topk\":{},\"ids\":\"{}\",\"dk\":\"{}\",\"median_us\":{:.1},\"min_us\":{:.1},\"p90_us\":{:.1},\"zeroing_us\":{:.1},\"gradients_us\":{:.1},\"cast_us\":{:.1},\"tflops\":{:.2},\"dk_scatter_gbs\":{:.1},\"bound_us\":{:.1},\"binding\":\"{}\",\"traffic_us\":{:.1}}}",
        p.topk,
        p.ids,
        dk_name(p.dk),
        p.median_us,
        p.min_us,
        p.p90_us,
        p.stages.zeroing_us,
        p.stages.gradients_us,
        p.stages.cast_us,
        p.tflops,
        p.scatter_gbs,
        p.bound_us,
        p.binding,
        p.traffic_us
    )
}

fn dk_name(d: GradDtype) -> &'static str {
    if d == GradDtype::F32 {
        "f32"
    } else {
        "bf16"
    }
}

/// Reads back the bench's JSON lines (other lines are skipped), so the
/// table and chart of a GPU run can be re-rendered without the GPU.
pub fn parse_json_lines(text: &str) -> Result<(String, Ceilings, Vec<Point>), String> {
    let mut ceil = None;
    let mut points = Vec::new();
    let f = |v: &serde_json::Value, k: &str| {
        v[k].as_f64()
            .ok_or_else(|| format!("missing number {k} in {v}"))
    };
    // Fields added later: NaN in older runs' JSON.
    let opt = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    for line in text.lines().filter(|l| l.starts_with('{')) {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("{e}: {line}"))?;
        match v["kind"].as_str() {
            Some("ceilings") => {
                let c = Ceilings {
                    mma_flops: f(&v, "mma_tflops")? * 1e12,
                    scatter_red: f(&v, "scatter_red_tbs")? * 1e12,
                    scatter_bulk: f(&v, "scatter_bulk_tbs")? * 1e12,
                    gather: f(&v, "gather_tbs")? * 1e12,
                    copy: f(&v, "copy_tbs")? * 1e12,
                    slots_gather: opt(&v, "slot_gather_gps") * 1e9,
                    slots_reduce: opt(&v, "slot_reduce_gps") * 1e9,
                    slots_both: opt(&v, "slot_both_gps") * 1e9,
                };
                ceil = Some((v["gpu"].as_str().unwrap_or("?").to_string(), c));
            }
            Some("point") => {
                let stages = StageTimes {
                    zeroing_us: f(&v, "zeroing_us")?,
                    gradients_us: f(&v, "gradients_us")?,
                    cast_us: f(&v, "cast_us")?,
                    total_us: f(&v, "median_us")?,
                };
                points.push(Point {
                    topk: f(&v, "topk")? as usize,
                    ids: if v["ids"] == "ragged" {
                        "ragged"
                    } else {
                        "uniform"
                    },
                    dk: if v["dk"] == "bf16" {
                        GradDtype::Bf16
                    } else {
                        GradDtype::F32
                    },
                    median_us: stages.total_us,
                    min_us: f(&v, "min_us")?,
                    p90_us: f(&v, "p90_us")?,
                    stages,
                    tflops: f(&v, "tflops")?,
                    scatter_gbs: f(&v, "dk_scatter_gbs")?,
                    bound_us: f(&v, "bound_us")?,
                    binding: if v["binding"] == "mma" {
                        "mma"
                    } else {
                        "dK scatter"
                    },
                    traffic_us: opt(&v, "traffic_us"),
                });
            }
            _ => {}
        }
    }
    let (gpu, c) = ceil.ok_or("no ceilings line")?;
    Ok((gpu, c, points))
}
