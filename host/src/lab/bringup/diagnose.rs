//! Turns a probe's output into a [`ProbeReport`]: error measures against
//! the CPU product, where the wrong elements are (row and column
//! patterns, rows or columns that hold another expected row or column,
//! the first wrong element and what it holds), and which modelled reading
//! of the hardware ([`Model`]) reproduces the output exactly.

use super::model::{
    read_back, reference, rows, simulate, smoke_product, Model, ProbeInputs, ProbeOutput,
    HOST_FILL, LANES, N, SIM_UNDEFINED, SMOKE_N, TMEM_FILL,
};
use super::{Gemm, ProbeReport, ProbeSpec};
use half::bf16;
use kernels_gpu::abi::{PROBE_STATUS_MMA, PROBE_STATUS_TMA, PROBE_STATUS_WORDS};

/// Largest error still counted as a match: half the inputs' product step
/// (1/64). Every probe sum is exact in f32 whatever the order, so a layout
/// error shows up as at least one whole step.
pub const TOL: f64 = 1.0 / 128.0;
/// Most wrong rows (columns) a report names one by one.
const LIST_MAX: usize = 4;
/// Most index ranges a report names before summarising.
const RANGES_MAX: usize = 8;
/// A modelled output with more wildcard cells than this share (reads of
/// shared memory no probe wrote) is too vague to claim a match.
const UNDEFINED_MAX_SHARE: f64 = 0.1;
/// Periods tried when describing a set of wrong rows or columns.
const PERIODS: [usize; 6] = [2, 4, 8, 16, 32, 64];

/// Whether two f32 bit patterns agree: NaN markers bit for bit, numbers
/// within [`TOL`].
fn same(a: u32, b: u32) -> bool {
    let (x, y) = (f32::from_bits(a), f32::from_bits(b));
    match (x.is_nan(), y.is_nan()) {
        (true, true) => a == b,
        (false, false) => (x as f64 - y as f64).abs() <= TOL,
        _ => false,
    }
}

/// Whether an output element (f32 bits) matches an expected value.
fn matches(got: u32, want: f64) -> bool {
    let g = f32::from_bits(got) as f64;
    g.is_finite() && (g - want).abs() <= TOL
}

/// Error measures of `got` against `want`, and which elements are wrong.
struct Errors {
    max_abs: f64,
    rel: f64,
    bad: Vec<bool>,
}

fn errors(got: &[u32], want: &[f64]) -> Errors {
    let (mut max_abs, mut diff2, mut norm2) = (0.0f64, 0.0f64, 0.0f64);
    let mut bad = Vec::with_capacity(want.len());
    for (&g, &w) in got.iter().zip(want) {
        let g = f32::from_bits(g) as f64;
        let e = if g.is_finite() {
            (g - w).abs()
        } else {
            f64::INFINITY
        };
        max_abs = max_abs.max(e);
        diff2 += e * e;
        norm2 += w * w;
        bad.push(e > TOL);
    }
    let rel = if norm2 > 0.0 {
        (diff2 / norm2).sqrt()
    } else {
        diff2.sqrt()
    };
    Errors { max_abs, rel, bad }
}

/// `a..b` ranges of the set entries, e.g. `4..8, 12..16`.
fn ranges(set: &[bool]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < set.len() {
        if !set[i] {
            i += 1;
            continue;
        }
        let start = i;
        while i < set.len() && set[i] {
            i += 1;
        }
        out.push(if i - start == 1 {
            format!("{start}")
        } else {
            format!("{start}..{i}")
        });
    }
    if out.len() > RANGES_MAX {
        let more = out.len() - RANGES_MAX;
        out.truncate(RANGES_MAX);
        out.push(format!("and {more} more ranges"));
    }
    out.join(", ")
}

/// A set of row (or column) indices in words: none, all, a pattern that
/// repeats with a period (`rows r with r % 8 in 4..8`), or ranges.
pub fn describe_indices(set: &[bool], var: &str, noun: &str) -> String {
    let n = set.len();
    let count = set.iter().filter(|&&b| b).count();
    if count == 0 {
        return format!("no {noun}s");
    }
    if count == n {
        return format!("all {n} {noun}s");
    }
    for p in PERIODS {
        if p >= n || !n.is_multiple_of(p) {
            continue;
        }
        if (0..n).all(|i| set[i] == set[i % p]) {
            return format!("{noun}s {var} with {var} % {p} in {}", ranges(&set[..p]));
        }
    }
    format!("{noun}s {}", ranges(set))
}

/// A `rows x cols` output against its expected values.
struct Grid<'a> {
    rows: usize,
    cols: usize,
    got: &'a [u32],
    want: &'a [f64],
}

impl Grid<'_> {
    fn got(&self, r: usize, c: usize, by_rows: bool) -> u32 {
        if by_rows {
            self.got[r * self.cols + c]
        } else {
            self.got[c * self.cols + r]
        }
    }
    fn want(&self, r: usize, c: usize, by_rows: bool) -> f64 {
        if by_rows {
            self.want[r * self.cols + c]
        } else {
            self.want[c * self.cols + r]
        }
    }
    /// Lines (rows, or columns when `!by_rows`) and their length.
    fn shape(&self, by_rows: bool) -> (usize, usize) {
        if by_rows {
            (self.rows, self.cols)
        } else {
            (self.cols, self.rows)
        }
    }
    /// For every wrong line, the expected line it equals, if one does.
    fn moves(&self, wrong: &[bool], by_rows: bool) -> Vec<(usize, Option<usize>)> {
        let (lines, len) = self.shape(by_rows);
        (0..lines)
            .filter(|&i| wrong[i])
            .map(|i| {
                let src = (0..lines).find(|&j| {
                    (0..len).all(|k| matches(self.got(i, k, by_rows), self.want(j, k, by_rows)))
                });
                (i, src)
            })
            .collect()
    }
}

/// The moved lines in words: one formula when they share one (`r ^ 4`,
/// `r + 16`), else the first few.
fn describe_moves(moves: &[(usize, Option<usize>)], var: &str, noun: &str) -> Option<String> {
    let found: Vec<(usize, usize)> = moves.iter().filter_map(|&(i, s)| Some((i, s?))).collect();
    if found.is_empty() {
        return None;
    }
    // A shared formula only where listing would not do (a few lines are
    // clearer named, and two exchanged lines fit any formula).
    let xor = found[0].0 ^ found[0].1;
    let delta = found[0].1 as i64 - found[0].0 as i64;
    let many = found.len() > LIST_MAX;
    let mut s = if many && found.iter().all(|&(i, j)| j as i64 - i as i64 == delta) {
        let op = if delta < 0 { '-' } else { '+' };
        format!(
            "each of {} wrong {noun}s {var} holds expected {noun} {var} {op} {}",
            found.len(),
            delta.abs()
        )
    } else if many && found.iter().all(|&(i, j)| i ^ j == xor) {
        format!(
            "each of {} wrong {noun}s {var} holds expected {noun} {var} ^ {xor}",
            found.len()
        )
    } else {
        let mut list: Vec<String> = found
            .iter()
            .take(LIST_MAX)
            .map(|(i, j)| format!("{noun} {i} holds expected {noun} {j}"))
            .collect();
        if found.len() > LIST_MAX {
            list.push(format!("{} more such {noun}s", found.len() - LIST_MAX));
        }
        list.join(", ")
    };
    let lost = moves.len() - found.len();
    if lost > 0 {
        s += &format!("; {lost} other wrong {noun}s equal no expected {noun}");
    }
    Some(s)
}

/// The first wrong element and what it holds. (Its value alone is not
/// traced to a source element: with these inputs most values occur many
/// times in the product; whole rows and columns are traced instead.)
fn first_wrong(g: &Grid<'_>, bad: &[bool]) -> Option<String> {
    let i = bad.iter().position(|&b| b)?;
    let (r, c) = (i / g.cols, i % g.cols);
    let bits = g.got[i];
    let v = f32::from_bits(bits);
    let what = match bits {
        HOST_FILL => " (never written: no lane of the read-back maps to this row)",
        TMEM_FILL => " (the TMEM fill: the MMA did not write this accumulator cell)",
        _ => "",
    };
    Some(format!(
        "first wrong element ({r}, {c}): expected {}, got {v}{what}",
        g.want[i]
    ))
}

/// Where the wrong elements are, as sentences (empty when none is).
fn localize(g: &Grid<'_>, bad: &[bool]) -> Vec<String> {
    let n_bad = bad.iter().filter(|&&b| b).count();
    if n_bad == 0 {
        return Vec::new();
    }
    let wrong_rows: Vec<bool> = (0..g.rows)
        .map(|r| bad[r * g.cols..(r + 1) * g.cols].iter().any(|&b| b))
        .collect();
    let wrong_cols: Vec<bool> = (0..g.cols)
        .map(|c| (0..g.rows).any(|r| bad[r * g.cols + c]))
        .collect();
    let mut out = vec![
        format!("{n_bad} of {} elements wrong", bad.len()),
        format!(
            "in {} and {}",
            describe_indices(&wrong_rows, "r", "row"),
            describe_indices(&wrong_cols, "c", "column")
        ),
    ];
    out.extend(describe_moves(&g.moves(&wrong_rows, true), "r", "row"));
    out.extend(describe_moves(&g.moves(&wrong_cols, false), "c", "column"));
    for (marker, what) in [
        (HOST_FILL, "never written by the kernel"),
        (
            TMEM_FILL,
            "the TMEM fill (accumulator cells the MMA did not write)",
        ),
    ] {
        let hit: Vec<bool> = (0..g.rows)
            .map(|r| g.got[r * g.cols..(r + 1) * g.cols].contains(&marker))
            .collect();
        let k = g.got.iter().filter(|&&b| b == marker).count();
        if k > 0 {
            out.push(format!(
                "{k} elements hold {what}, in {}",
                describe_indices(&hit, "r", "row")
            ));
        }
    }
    out.extend(first_wrong(g, bad));
    out
}

/// Cells where `got` and a simulated output differ (wildcards skipped),
/// or `None` when the simulation has too many wildcards to judge.
fn differing(got: &[u32], sim: &[u32]) -> Option<usize> {
    let undefined = sim.iter().filter(|&&s| s == SIM_UNDEFINED).count();
    if undefined as f64 > UNDEFINED_MAX_SHARE * sim.len() as f64 {
        return None;
    }
    Some(
        got.iter()
            .zip(sim)
            .filter(|&(&g, &s)| s != SIM_UNDEFINED && !same(g, s))
            .count(),
    )
}

/// What [`simulate`] gives for every alternative reading of `spec`.
fn simulate_alternatives(spec: &ProbeSpec, x: &ProbeInputs) -> Vec<(Model, ProbeOutput)> {
    Model::alternatives(spec)
        .into_iter()
        .map(|m| (m, simulate(spec, x, &m)))
        .collect()
}

/// The modelled readings (`alternatives`: each with its simulated output)
/// that reproduce the raw lanes exactly, and otherwise the closest one
/// with its count of differing cells.
fn explain(
    spec: &ProbeSpec,
    x: &ProbeInputs,
    got: &ProbeOutput,
    alternatives: &[(Model, ProbeOutput)],
) -> String {
    let mut hits = Vec::new();
    let mut closest: Option<(usize, Model)> = None;
    for (m, sim) in alternatives {
        let Some(d) = differing(&got.lanes, &sim.lanes) else {
            continue;
        };
        if d == 0 {
            hits.push(m.describe());
        } else if closest.is_none_or(|c| d < c.0) {
            closest = Some((d, *m));
        }
    }
    if !hits.is_empty() {
        return format!(
            "the output is exactly what the kernel writes if {}",
            hits.join(" -- or if ")
        );
    }
    let assumed = simulate(spec, x, &Model::ASSUMED);
    if differing(&got.lanes, &assumed.lanes) == Some(0) {
        return "the raw TMEM lanes hold the expected accumulator as stage 2 assumes, so the probe's own read-back into `out` is at fault".into();
    }
    let mut s = format!(
        "no modelled alternative matches ({} tried: gather4 swizzle, MN-major LBO/SBO roles, swizzle anchor, M = 64 lane layout, as the probe exercises them)",
        alternatives.len()
    );
    if let Some((d, m)) = closest {
        s += &format!(
            "; closest: {} ({d} of {} TMEM cells differ)",
            m.describe(),
            got.lanes.len()
        );
    }
    s
}

/// What a passing M = 64 probe shows about layout F's unused lanes.
fn unused_lanes_note(got: &ProbeOutput) -> String {
    let written: usize = (0..LANES)
        .filter(|l| l % 32 >= 16)
        .map(|l| {
            got.lanes[l * N..(l + 1) * N]
                .iter()
                .filter(|&&v| v != TMEM_FILL)
                .count()
        })
        .sum();
    if written == 0 {
        "; TMEM lanes 16..32 of every sub-partition still hold the fill, as layout F says".into()
    } else {
        format!("; {written} cells of TMEM lanes 16..32 (unused in layout F) were written, which layout F does not predict (harmless to stage 2, which never reads them)")
    }
}

/// What the probe's status words (`PROBE_STATUS_*`) say: one note per
/// wait that gave up (the probe kernel then traps, so these come from the
/// host-mapped words after a failed launch).
pub fn timeout_notes(status: &[u32; PROBE_STATUS_WORDS]) -> Vec<String> {
    let mut notes = Vec::new();
    if status[PROBE_STATUS_TMA] != 0 {
        notes.push("the TMA loads (gather4 / q tile) did not complete within 1 s".to_string());
    }
    if status[PROBE_STATUS_MMA] != 0 {
        notes.push("the MMA commit did not arrive within 2 s".to_string());
    }
    notes
}

/// The report of probe `spec` from its output `got` (inputs `x`): exact,
/// or where the wrong elements are and which modelled reading of the
/// hardware ([`Model::alternatives`]) reproduces the output.
pub fn diagnose(spec: &ProbeSpec, x: &ProbeInputs, got: &ProbeOutput) -> ProbeReport {
    diagnose_with(spec, x, got, || simulate_alternatives(spec, x))
}

/// [`diagnose`] with the alternatives' simulated outputs supplied (only
/// computed when the output is wrong).
fn diagnose_with(
    spec: &ProbeSpec,
    x: &ProbeInputs,
    got: &ProbeOutput,
    alternatives: impl FnOnce() -> Vec<(Model, ProbeOutput)>,
) -> ProbeReport {
    let want = reference(spec.gemm, x);
    let e = errors(&got.out, &want);
    let mut notes = timeout_notes(&got.status);
    let grid = Grid {
        rows: rows(spec.gemm),
        cols: N,
        got: &got.out,
        want: &want,
    };
    let located = localize(&grid, &e.bad);
    let ok = notes.is_empty() && located.is_empty();
    let detail = if ok {
        let mut d = format!("exact: all {} elements", want.len());
        if spec.gemm != Gemm::Dk {
            d += &unused_lanes_note(got);
        }
        d
    } else {
        notes.extend(located);
        if read_back(spec.gemm, &got.lanes) != got.out {
            notes.push("`out` differs from the raw lanes read through stage 2's mapping (the read-back itself misbehaved)".into());
        }
        notes.push(explain(spec, x, got, &alternatives()));
        notes.join("; ")
    };
    ProbeReport {
        name: spec.name,
        max_abs_err: e.max_abs,
        rel_err: e.rel,
        ok,
        detail,
    }
}

/// The report of the tcgen05 smoke kernel (`out` = 128 x 64 f32 bits).
pub fn diagnose_smoke(name: &'static str, a: &[bf16], b: &[bf16], out: &[u32]) -> ProbeReport {
    let want = smoke_product(a, b, false);
    let e = errors(out, &want);
    let grid = Grid {
        rows: want.len() / SMOKE_N,
        cols: SMOKE_N,
        got: out,
        want: &want,
    };
    let mut notes = localize(&grid, &e.bad);
    let ok = notes.is_empty();
    if !ok {
        let swapped = smoke_product(a, b, true);
        let exact = out.iter().zip(&swapped).all(|(&g, &w)| matches(g, w));
        notes.push(if exact {
            "the output is exactly what the MMA computes if LBO and SBO swap roles in the no-swizzle K-major layout".into()
        } else {
            "it is not the no-swizzle K-major layout with LBO and SBO swapped either".into()
        });
    }
    ProbeReport {
        name,
        max_abs_err: e.max_abs,
        rel_err: e.rel,
        ok,
        detail: if ok {
            format!("exact: all {} elements", want.len())
        } else {
            notes.join("; ")
        },
    }
}

#[cfg(test)]
mod tests {
    use super::super::model::{
        probe_inputs, smoke_inputs, Gather4Swizzle, M64Lanes, MnStrides, SwizzleAnchor,
    };
    use super::super::PROBES;
    use super::*;

    fn spec(name: &str) -> &'static ProbeSpec {
        PROBES.iter().find(|p| p.name == name).expect(name)
    }

    fn with(f: impl FnOnce(&mut Model)) -> Model {
        let mut m = Model::ASSUMED;
        f(&mut m);
        m
    }

    #[test]
    fn index_sets_are_described_by_pattern_or_ranges() {
        let by = |f: &dyn Fn(usize) -> bool, n| (0..n).map(f).collect::<Vec<bool>>();
        assert_eq!(describe_indices(&by(&|_| false, 64), "r", "row"), "no rows");
        assert_eq!(
            describe_indices(&by(&|_| true, 64), "r", "row"),
            "all 64 rows"
        );
        assert_eq!(
            describe_indices(&by(&|i| i % 8 >= 4, 128), "c", "column"),
            "columns c with c % 8 in 4..8"
        );
        assert_eq!(
            describe_indices(&by(&|i| (16..32).contains(&i), 64), "r", "row"),
            "rows 16..32"
        );
        assert_eq!(
            describe_indices(&by(&|i| i % 32 >= 16, 128), "r", "row"),
            "rows r with r % 32 in 16..32"
        );
        assert_eq!(
            describe_indices(
                &by(&|i| i == 3 || i == 9 || (20..22).contains(&i), 64),
                "r",
                "row"
            ),
            "rows 3, 9, 20..22"
        );
    }

    #[test]
    fn the_exact_output_passes_for_every_probe() {
        let x = probe_inputs();
        for spec in &PROBES {
            let r = diagnose(spec, &x, &simulate(spec, &x, &Model::ASSUMED));
            assert!(r.ok, "{}: {}", spec.name, r.detail);
            assert_eq!((r.max_abs_err, r.rel_err), (0.0, 0.0));
            assert!(r.detail.starts_with("exact"), "{}", r.detail);
            if spec.gemm != Gemm::Dk {
                assert!(r.detail.contains("still hold the fill"), "{}", r.detail);
            }
        }
    }

    #[test]
    fn every_modelled_alternative_is_named_when_planted() {
        // Plant each reading the probe exercises; the report must fail
        // and name exactly that reading among the ones that explain it.
        let x = probe_inputs();
        for spec in &PROBES {
            let alts = simulate_alternatives(spec, &x);
            for (m, out) in &alts {
                let r = diagnose_with(spec, &x, out, || alts.clone());
                assert!(!r.ok, "{}: {}", spec.name, m.describe());
                assert!(r.max_abs_err > TOL && r.rel_err > 0.0);
                assert!(
                    r.detail.contains(&m.describe()),
                    "{}: planted {:?}, report: {}",
                    spec.name,
                    m,
                    r.detail
                );
            }
        }
    }

    #[test]
    fn a_per_instruction_gather4_swizzle_shows_in_slots_4_to_8_of_every_atom() {
        // S: the K stage's slots are S's columns; the mis-swizzled rows
        // are slots 4..8 of every 8-slot atom.
        let x = probe_inputs();
        let s = spec("s_k_gather4");
        let m = with(|m| m.gather4 = Gather4Swizzle::PerInstruction);
        let r = diagnose(s, &x, &simulate(s, &x, &m));
        assert!(
            r.detail.contains("columns c with c % 8 in 4..8"),
            "{}",
            r.detail
        );
        assert!(r.detail.contains("all 64 rows"), "{}", r.detail);
        assert!(
            r.detail
                .contains("gather4 swizzles relative to each instruction's destination"),
            "{}",
            r.detail
        );
        // The same K stage staged by stores is unaffected by that question.
        let st = spec("s_stores");
        assert!(diagnose(st, &x, &simulate(st, &x, &m)).ok);
    }

    #[test]
    fn an_identity_lane_layout_shows_as_moved_rows_and_unwritten_cells() {
        let x = probe_inputs();
        let s = spec("s_stores");
        let m = with(|m| m.m64 = M64Lanes::Identity);
        let r = diagnose(s, &x, &simulate(s, &x, &m));
        // Rows 0..16 happen to be right (lanes 0..16 either way); rows
        // 16..32 read lanes 32..48, which then hold rows 32..48; rows
        // 32..64 read lanes 64.., which the MMA left as the fill.
        assert!(r.detail.contains("rows 16..64"), "{}", r.detail);
        assert!(
            r.detail
                .contains("each of 16 wrong rows r holds expected row r + 16"),
            "{}",
            r.detail
        );
        assert!(r
            .detail
            .contains("32 other wrong rows equal no expected row"));
        assert!(r.detail.contains("the TMEM fill"), "{}", r.detail);
        assert!(r.detail.contains("sits in TMEM lane r"), "{}", r.detail);
    }

    #[test]
    fn swapped_rows_are_mapped_back_to_their_source() {
        // A planted output with rows 3 and 40 exchanged (no model makes
        // this): the report names the rows and where their values belong.
        let x = probe_inputs();
        let s = spec("dq_stores");
        let mut out = simulate(s, &x, &Model::ASSUMED);
        for c in 0..N {
            out.out.swap(3 * N + c, 40 * N + c);
        }
        let r = diagnose(s, &x, &out);
        assert!(!r.ok);
        assert!(r.detail.contains("128 of 8192") || r.detail.contains("256 of 8192"));
        assert!(r.detail.contains("rows 3, 40"), "{}", r.detail);
        assert!(
            r.detail.contains("row 3 holds expected row 40"),
            "{}",
            r.detail
        );
        assert!(
            r.detail.contains("row 40 holds expected row 3"),
            "{}",
            r.detail
        );
        assert!(
            r.detail.contains("read-back itself misbehaved"),
            "{}",
            r.detail
        );
    }

    #[test]
    fn a_wrong_swizzle_anchor_and_swapped_mn_strides_are_localised() {
        let x = probe_inputs();
        let s = spec("s_stores");
        let m = with(|m| m.swizzle = SwizzleAnchor::DescriptorStart);
        let r = diagnose(s, &x, &simulate(s, &x, &m));
        assert!(
            r.detail.contains("anchors the 128-byte swizzle"),
            "{}",
            r.detail
        );
        let dq = spec("dq_stores");
        let m = with(|m| m.mn_major = MnStrides::Swapped);
        let r = diagnose(dq, &x, &simulate(dq, &x, &m));
        assert!(
            r.detail.contains("LBO and SBO roles swapped"),
            "{}",
            r.detail
        );
        assert!(
            r.detail.starts_with("8192 of 8192") || r.detail.contains("of 8192 elements wrong")
        );
    }

    #[test]
    fn timeouts_and_unexplained_output_are_reported() {
        let x = probe_inputs();
        let s = spec("dk_q_tma");
        let mut out = simulate(s, &x, &Model::ASSUMED);
        out.status[PROBE_STATUS_MMA] = 1;
        let r = diagnose(s, &x, &out);
        assert!(!r.ok);
        assert!(
            r.detail.contains("MMA commit did not arrive"),
            "{}",
            r.detail
        );
        // An accumulator the MMA never wrote: every cell still the fill.
        let mut out = simulate(s, &x, &Model::ASSUMED);
        out.lanes.iter_mut().for_each(|v| *v = TMEM_FILL);
        out.out = read_back(s.gemm, &out.lanes);
        let r = diagnose(s, &x, &out);
        assert!(!r.ok && r.max_abs_err.is_infinite());
        assert!(
            r.detail.contains("16384 elements hold the TMEM fill"),
            "{}",
            r.detail
        );
        assert!(
            r.detail.contains("no modelled alternative matches"),
            "{}",
            r.detail
        );
    }

    #[test]
    fn the_smoke_check_passes_exact_output_and_names_swapped_strides() {
        let (a, b) = smoke_inputs();
        let bits = |v: Vec<f64>| {
            v.into_iter()
                .map(|x| (x as f32).to_bits())
                .collect::<Vec<u32>>()
        };
        let r = diagnose_smoke("smoke", &a, &b, &bits(smoke_product(&a, &b, false)));
        assert!(r.ok, "{}", r.detail);
        let r = diagnose_smoke("smoke", &a, &b, &bits(smoke_product(&a, &b, true)));
        assert!(!r.ok);
        assert!(r.detail.contains("LBO and SBO swap roles"), "{}", r.detail);
        let r = diagnose_smoke("smoke", &a, &b, &vec![HOST_FILL; 128 * 64]);
        assert!(r.detail.contains("never written"), "{}", r.detail);
    }
}
