//! Benchmark report: measured ceilings, points, the markdown table of
//! `--markdown` and the SVG chart (plotters).

use dsa_indexer_bwd::{GradDtype, Options, Shape, StageTimes};
use std::fmt::Write as _;

/// cuDNN-frontend 1.32 on the H200, uniform / old slot-aligned ragged ids, a
/// separate run (CHANGELOG.md, performance history); same-run ratios
/// come from scripts/side_by_side.py.
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

/// What a point's ids ask of the dK reduction, counted on the host from
/// the ids alone (NaN in JSON written before these were reported).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IdStats {
    /// Valid slots (ids naming a key row): each one's dK contribution,
    /// `D` f32 values, is reduced into its key row.
    pub valid_slots: f64,
    /// Distinct key rows those slots name (of `B * S_k`).
    pub distinct_keys: f64,
    /// Share of the valid slots of rows `2i + 1` whose key row is the one
    /// in the same slot of row `2i` (same batch): the slots the crate's
    /// paired kernel can sum in pairs before reducing (it is picked when
    /// sampled pairs mostly match; ragged ids in key order gave 1, random
    /// slot order gives about 0).
    pub pair_aligned: f64,
    /// Share of all valid slots that the paired kernel reduces together
    /// with its partner: slots of row `2p + 1` of the flattened `B * S_q`
    /// rows (the pairs the kernel takes, across a batch boundary when
    /// `S_q` is odd) whose key row is the one in the same slot of row
    /// `2p`. Each such slot saves one dK row reduction when the paired
    /// kernel computes ([`IdStats::reductions_per_slot`]); at most 1/2.
    pub pair_shared: f64,
    /// As [`IdStats::union4`] with groups of 2 adjacent rows (at most 2).
    pub union2: f64,
    /// As [`IdStats::union4`] with groups of 3 adjacent rows (at most 3).
    pub union3: f64,
    /// Selections per union key of groups of 4 adjacent query rows: valid
    /// slots over the sum, over the groups, of the distinct key rows named
    /// by the group's valid slots. Row `i` of a batch is in group `i / 4`
    /// of that batch (the last group of a batch may be shorter; groups
    /// never span two batches). At least 1 (no key shared inside a
    /// group), at most 4 (every row of a group selects the same keys): the
    /// factor by which a kernel that summed a group's slots per distinct
    /// key before reducing would cut the dK row reductions of one
    /// reduction per slot (NaN without valid slots).
    pub union4: f64,
    /// As [`IdStats::union4`] with groups of 8 adjacent rows (at most 8).
    pub union8: f64,
}

/// Rows per group of the union counts, [`IdStats::union2`] to
/// [`IdStats::union8`] in order.
pub const GROUP_ROWS: [usize; 4] = [2, 3, 4, 8];

/// Key rows marked with a generation stamp: counts the distinct key rows
/// of each group of slots without clearing anything between groups.
struct Marks {
    /// The generation that last marked each key row (0: none).
    stamp: Vec<u32>,
    /// The current group's generation.
    gen: u32,
    /// Distinct key rows summed over the groups so far.
    distinct: usize,
}

impl Marks {
    /// Marks for `keys` key rows, the first group open.
    fn new(keys: usize) -> Marks {
        Marks {
            stamp: vec![0; keys],
            gen: 1,
            distinct: 0,
        }
    }

    /// Closes the current group and opens the next.
    fn next_group(&mut self) {
        if self.gen == u32::MAX {
            self.stamp.fill(0);
            self.gen = 0;
        }
        self.gen += 1;
    }

    /// Counts key row `n` unless the current group already named it.
    fn mark(&mut self, n: usize) {
        if self.stamp[n] != self.gen {
            self.stamp[n] = self.gen;
            self.distinct += 1;
        }
    }
}

/// `num / den`, or 0 when `den` is 0.
fn share(num: usize, den: usize) -> f64 {
    if den == 0 {
        0.0
    } else {
        num as f64 / den as f64
    }
}

impl IdStats {
    /// Counts `ids` of `shape` under `opts`' convention (padding and ids
    /// outside the key range are not slots). One pass over the ids.
    pub fn count(shape: &Shape, opts: &Options, ids: &[i32]) -> IdStats {
        let topk = shape.topk;
        let keys = shape.batch * shape.seq_k;
        // All slots one group; groups of R rows of a batch for each R of
        // `GROUP_ROWS`.
        let mut all = Marks::new(keys);
        let mut by: [Marks; GROUP_ROWS.len()] = std::array::from_fn(|_| Marks::new(keys));
        // Key rows of this row's and the previous flattened row's slots.
        let (mut row, mut prev) = (vec![None; topk], vec![None; topk]);
        let mut valid = 0usize;
        let (mut odd_valid, mut aligned, mut shared) = (0usize, 0usize, 0usize);
        for r in 0..shape.rows() {
            let (b, i) = (r / shape.seq_q, r % shape.seq_q);
            for (m, rows) in by.iter_mut().zip(GROUP_ROWS) {
                if r > 0 && i % rows == 0 {
                    m.next_group();
                }
            }
            for (t, key) in row.iter_mut().enumerate() {
                *key = opts.resolve(shape, b, ids[r * topk + t]);
            }
            for (&key, &before) in row.iter().zip(&prev) {
                let Some(n) = key else {
                    continue;
                };
                valid += 1;
                all.mark(n);
                for m in &mut by {
                    m.mark(n);
                }
                let same = before == Some(n);
                // Row i - 1 of the same batch; flattened pair (r - 1, r).
                if i % 2 == 1 {
                    odd_valid += 1;
                    aligned += same as usize;
                }
                if r % 2 == 1 {
                    shared += same as usize;
                }
            }
            std::mem::swap(&mut row, &mut prev);
        }
        let [u2, u3, u4, u8] = by.map(|m| valid as f64 / m.distinct as f64);
        IdStats {
            valid_slots: valid as f64,
            distinct_keys: all.distinct as f64,
            pair_aligned: share(aligned, odd_valid),
            pair_shared: share(shared, valid),
            union2: u2,
            union3: u3,
            union4: u4,
            union8: u8,
        }
    }

    /// Valid slots per distinct key row: how many contributions each
    /// touched dK row receives on average (1 when every slot names its own
    /// key row; the fan-in a kernel that summed per key before reducing
    /// could exploit).
    pub fn slots_per_key(&self) -> f64 {
        self.valid_slots / self.distinct_keys
    }

    /// dK row reductions the crate issues per valid slot: 1 on every
    /// kernel (one `D`-wide f32 reduction per valid slot), except the
    /// paired kernel, which reduces a slot whose key row is the same in
    /// both rows of its pair once for both: `1 - pair_shared` (a repeated
    /// key is reduced once per repeat).
    ///
    /// `computes`: which stage-2 kernel computes the point
    /// ([`which_computes`]).
    pub fn reductions_per_slot(&self, computes: Computes) -> f64 {
        match computes {
            Computes::Rows => 1.0,
            Computes::Paired => 1.0 - self.pair_shared,
        }
    }

    /// Unknown (older JSON).
    pub const UNKNOWN: IdStats = IdStats {
        valid_slots: f64::NAN,
        distinct_keys: f64::NAN,
        pair_aligned: f64::NAN,
        pair_shared: f64::NAN,
        union2: f64::NAN,
        union3: f64::NAN,
        union4: f64::NAN,
        union8: f64::NAN,
    };
}

/// Whether the paired kernel computes a plan's `execute` on `ids` (i32,
/// `B * S_q x topk`, row major) of `shape`: the plan launches it
/// (`kernels`, [`dsa_indexer_bwd::Plan::kernels`], names
/// `registry::SM90_WG_PAIR`: the Hopper fast path with H = 64,
/// D = 128, topk > 64 and an even row count) and the dispatch test that
/// every CTA runs on the device picks it, replicated on the host by
/// `kernels_gpu::sm90::bwd::ids_pair_up` (raw ids of sampled row pairs, so the
/// same verdict under either id convention). Exact for i32 ids (the
/// bench's); for i64 ids, exact when their values fit in i32.
pub fn paired_kernel_computes(kernels: &[&str], shape: &Shape, ids: &[i32]) -> bool {
    use kernels_gpu::sm90::bwd;
    let pair = kernels_gpu::registry::SM90_WG_PAIR.name;
    let twin = kernels_gpu::registry::det_twin(pair).map(|k| k.name);
    kernels.iter().any(|&k| k == pair || Some(k) == twin)
        && bwd::ids_pair_up(ids, shape.rows() as u32, shape.topk as u32)
}

/// Which stage-2 kernel computes a point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Computes {
    /// A row kernel (one row per CTA).
    Rows,
    /// The paired kernel over the rows' own slots.
    Paired,
}

/// Which kernel computes problem `p` on a plan launching `kernels`: the
/// dispatch test of `kernels_gpu::sm90::bwd` on its ids.
pub fn which_computes(kernels: &[&str], p: &crate::Problem) -> Computes {
    if paired_kernel_computes(kernels, &p.shape, &p.ids) {
        Computes::Paired
    } else {
        Computes::Rows
    }
}

/// The workload of the SPEC's headline points (B = 1).
pub const HEADLINE: Workload = Workload {
    seq_q: 8192,
    seq_k: 4096,
    heads: 64,
    dim: 128,
};

/// Sizes of a point other than topk (B = 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workload {
    pub seq_q: usize,
    pub seq_k: usize,
    pub heads: usize,
    pub dim: usize,
}

/// One measured point.
#[derive(Clone, Debug)]
pub struct Point {
    pub topk: usize,
    pub ids: &'static str,
    /// Sizes (older JSON: the headline workload, which all of it ran).
    pub workload: Workload,
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
    /// The ids' counts.
    pub stats: IdStats,
    /// dK row reductions issued per valid slot by the kernel that computed
    /// the point ([`IdStats::reductions_per_slot`]; NaN in older JSON).
    pub reductions_per_slot: f64,
}

/// `x` with `digits` decimals, or "-" when NaN.
fn or_dash(x: f64, digits: usize) -> String {
    if x.is_finite() {
        format!("{x:.digits$}")
    } else {
        "-".to_string()
    }
}

/// The ids names the bench knows (others read back as "?").
pub const ID_KINDS: [&str; 3] = ["uniform", "ragged", "topk"];

fn ids_name(v: &serde_json::Value) -> &'static str {
    ID_KINDS.into_iter().find(|&k| v == k).unwrap_or("?")
}

/// The markdown table of `points` and the ceilings line. "dK GB/s" is
/// valid slots x D x 4 bytes over the median time (the f32 dK traffic the
/// reductions carry); "valid slots", "slots/key", "pair-aligned" and
/// "sel/union key R=2" / "R=3" / "R=4" / "R=8" ([`IdStats::union2`] ...
/// [`IdStats::union8`])
/// are [`IdStats`]; "reductions/slot" is [`Point::reductions_per_slot`].
pub fn markdown(points: &[Point], gpu: &str, c: &Ceilings) -> String {
    let mut s = String::new();
    let mut shapes: Vec<(usize, usize)> = points
        .iter()
        .map(|p| (p.workload.heads, p.workload.dim))
        .collect();
    shapes.sort_unstable();
    shapes.dedup();
    // Several heads x head dimensions in one run: each row names its own.
    let shape_of = |p: &Point| match shapes[..] {
        [_] => String::new(),
        _ => format!(" H{} D{}", p.workload.heads, p.workload.dim),
    };
    let _ = writeln!(s, "| topk | ids | S_q x S_k | d_index_k | median us | min us | p90 us | zeroing us | gradients us | cast us | TFLOP/s | dK GB/s | bound | of bound | traffic floor us | valid slots (M) | slots/key | pair-aligned | sel/union key R=2 | R=3 | R=4 | R=8 | reductions/slot |");
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for p in points {
        let _ = writeln!(
            s,
            "| {} | {} | {}x{}{} | {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.0} | {} | {:.1} | {:.0} | {} | {:.0}% | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            p.topk,
            p.ids,
            p.workload.seq_q,
            p.workload.seq_k,
            shape_of(p),
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
            or_dash(p.traffic_us, 0),
            or_dash(p.stats.valid_slots / 1e6, 2),
            or_dash(p.stats.slots_per_key(), 1),
            or_dash(p.stats.pair_aligned, 2),
            or_dash(p.stats.union2, 2),
            or_dash(p.stats.union3, 2),
            or_dash(p.stats.union4, 2),
            or_dash(p.stats.union8, 2),
            or_dash(p.reductions_per_slot, 3)
        );
    }
    if let [(h, d)] = shapes[..] {
        let _ = writeln!(s, "\nB = 1, H = {h}, D = {d}.");
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

/// Writes the time-vs-topk chart as SVG to `path`: the points of the
/// headline workload ([`HEADLINE`]), or of the first point's workload when
/// there are none.
pub fn plot(path: &str, points: &[Point], c: &Ceilings) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let shown = if points.iter().any(|p| p.workload == HEADLINE) {
        HEADLINE
    } else {
        points.first().map_or(HEADLINE, |p| p.workload)
    };
    let points: Vec<Point> = points
        .iter()
        .filter(|p| p.workload == shown)
        .cloned()
        .collect();
    let points = &points[..];
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
            format!(
                "indexer backward on H200: whole execute vs topk (S_q {}, S_k {}, H {}, D {})",
                shown.seq_q, shown.seq_k, shown.heads, shown.dim
            ),
            ("sans-serif", 18),
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
            "topk",
            GradDtype::F32,
            GREEN,
            "this crate, topk ids, f32 dK",
        ),
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
    if shown == HEADLINE {
        let cudnn: Vec<(f64, f64)> = CUDNN.iter().map(|&(t, u, _)| (t as f64, u)).collect();
        chart
            .draw_series(LineSeries::new(cudnn, BLACK.stroke_width(1)))?
            .label("cuDNN-frontend 1.32, uniform (separate run, CHANGELOG.md)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    }
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

/// JSON line of one point. Since the long-context points it also carries
/// the workload (`seq_q`, `seq_k`, `heads`, `dim`) and [`IdStats`]
/// (`valid_slots`, `distinct_keys`, `slots_per_key`, `pair_aligned`);
/// later also `pair_shared`, `union4`, `union8` and
/// `reductions_per_slot`, then `union2` and `union3`.
pub fn point_json(p: &Point) -> String {
    format!(
        "{{\"kind\":\"point\",\"topk\":{},\"ids\":\"{}\",\"seq_q\":{},\"seq_k\":{},\"heads\":{},\"dim\":{},\"dk\":\"{}\",\"median_us\":{:.1},\"min_us\":{:.1},\"p90_us\":{:.1},\"zeroing_us\":{:.1},\"gradients_us\":{:.1},\"cast_us\":{:.1},\"tflops\":{:.2},\"dk_scatter_gbs\":{:.1},\"bound_us\":{:.1},\"binding\":\"{}\",\"traffic_us\":{},\"valid_slots\":{},\"distinct_keys\":{},\"slots_per_key\":{},\"pair_aligned\":{},\"pair_shared\":{},\"union2\":{},\"union3\":{},\"union4\":{},\"union8\":{},\"reductions_per_slot\":{}}}",
        p.topk,
        p.ids,
        p.workload.seq_q,
        p.workload.seq_k,
        p.workload.heads,
        p.workload.dim,
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
        json_num(p.traffic_us, 1),
        json_num(p.stats.valid_slots, 0),
        json_num(p.stats.distinct_keys, 0),
        json_num(p.stats.slots_per_key(), 3),
        json_num(p.stats.pair_aligned, 4),
        json_num(p.stats.pair_shared, 4),
        json_num(p.stats.union2, 4),
        json_num(p.stats.union3, 4),
        json_num(p.stats.union4, 4),
        json_num(p.stats.union8, 4),
        json_num(p.reductions_per_slot, 4)
    )
}

/// A number for JSON: `null` when not finite.
pub fn json_num(x: f64, digits: usize) -> String {
    if x.is_finite() {
        format!("{x:.digits$}")
    } else {
        "null".to_string()
    }
}

/// "f32" or "bf16".
pub fn dk_name(d: GradDtype) -> &'static str {
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
                let size = |k: &str, default: usize| v[k].as_u64().map_or(default, |x| x as usize);
                points.push(Point {
                    topk: f(&v, "topk")? as usize,
                    ids: ids_name(&v["ids"]),
                    workload: Workload {
                        seq_q: size("seq_q", HEADLINE.seq_q),
                        seq_k: size("seq_k", HEADLINE.seq_k),
                        heads: size("heads", HEADLINE.heads),
                        dim: size("dim", HEADLINE.dim),
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
                    stats: IdStats {
                        valid_slots: opt(&v, "valid_slots"),
                        distinct_keys: opt(&v, "distinct_keys"),
                        pair_aligned: opt(&v, "pair_aligned"),
                        pair_shared: opt(&v, "pair_shared"),
                        union2: opt(&v, "union2"),
                        union3: opt(&v, "union3"),
                        union4: opt(&v, "union4"),
                        union8: opt(&v, "union8"),
                    },
                    reductions_per_slot: opt(&v, "reductions_per_slot"),
                });
            }
            _ => {}
        }
    }
    let (gpu, c) = ceil.ok_or("no ceilings line")?;
    Ok((gpu, c, points))
}

/// First line of the generated benchmark page; what follows it names the
/// JSON lines the page was rendered from.
pub const PAGE_HEADER: &str = "<!-- Generated by `indexer-bench --from-json";

/// The benchmark page (`docs/benchmarks.md`) of one GPU run: a summary of
/// the median time per workload and topk (f32 `d_index_k`), then the
/// bench's full table ([`markdown`]). `source` is the path of the run's
/// JSON lines and `chart` the chart's (`--plot`, under `docs/`, or
/// `None`), both relative to the repository root as the page names them.
/// The page is a pure function of its inputs, so a test can re-render it
/// ([`page_args`] reads them back from its first line).
pub fn benchmark_page(
    source: &str,
    chart: Option<&str>,
    gpu: &str,
    c: &Ceilings,
    points: &[Point],
) -> String {
    let mut s = String::new();
    let plot = chart.map_or(String::new(), |c| format!(" --plot {c}"));
    let json = source.strip_prefix("docs/").unwrap_or(source);
    let _ = writeln!(
        s,
        "{PAGE_HEADER} {source} --page docs/benchmarks.md{plot}`; do not edit. -->"
    );
    let _ = writeln!(s, "# Benchmarks\n");
    let _ = writeln!(
        s,
        "The sparse backward's whole `execute` on {gpu}, microseconds (CUDA events, \
         median of the run's repetitions after warm-up), on the workloads of \
         [spec.md](spec.md#benchmark-workloads); the run's JSON lines are \
         [`{source}`]({json}). Speed against another implementation is \
         only ever a ratio from one run on identical tensors: \
         [gpu-runs.md](gpu-runs.md) has those runs.\n"
    );
    // Summary: one row per (workload, ids), one column per topk, f32 dK.
    let mut topks: Vec<usize> = points.iter().map(|p| p.topk).collect();
    topks.sort_unstable();
    topks.dedup();
    let mut rows: Vec<(Workload, &str)> = Vec::new();
    for p in points {
        if !rows.contains(&(p.workload, p.ids)) {
            rows.push((p.workload, p.ids));
        }
    }
    let _ = write!(s, "| ids | B x S_q x S_k, H, D |");
    for t in &topks {
        let _ = write!(s, " topk {t} |");
    }
    let _ = writeln!(s);
    let _ = write!(s, "|---|---|");
    for _ in &topks {
        let _ = write!(s, "---|");
    }
    let _ = writeln!(s);
    for (w, ids) in &rows {
        let _ = write!(
            s,
            "| {ids} | 1 x {} x {}, {}, {} |",
            w.seq_q, w.seq_k, w.heads, w.dim
        );
        for t in &topks {
            let cell = points
                .iter()
                .find(|p| {
                    p.workload == *w && p.ids == *ids && p.topk == *t && p.dk == GradDtype::F32
                })
                .map_or("-".to_string(), |p| format!("{:.0}", p.median_us));
            let _ = write!(s, " {cell} |");
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(
        s,
        "\nd_index_k f32; every point with both d_index_k types is in the table below.\n"
    );
    if let Some(chart) = chart {
        let file = chart.strip_prefix("docs/").unwrap_or(chart);
        let _ = writeln!(s, "![time against topk]({file})\n");
    }
    let _ = writeln!(s, "## Every point\n");
    s.push_str(&markdown(points, gpu, c));
    s
}

/// The `source` and `chart` a page of [`benchmark_page`] was rendered
/// from, read back from its first line; `None` if it is not such a page.
pub fn page_args(page: &str) -> Option<(String, Option<String>)> {
    let first = page.lines().next()?.strip_prefix(PAGE_HEADER)?;
    let args = first.split('`').next()?;
    let mut words = args.split_whitespace();
    let source = words.next()?.to_string();
    let mut chart = None;
    while let Some(w) = words.next() {
        if w == "--plot" {
            chart = Some(words.next()?.to_string());
        }
    }
    Some((source, chart))
}
