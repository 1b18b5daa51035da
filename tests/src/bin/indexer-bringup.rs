//! The Blackwell bring-up kit: one step per invocation, run in order by
//! `bash run.sh --blackwell` in the GPU bundle, which stops at the first
//! failure and collects every step's lines in one report file.
//!
//! ```text
//! indexer-bringup STEP [--report FILE] [--cases N] [--seed S]
//!   STEP: info | watchdog | smoke | probes | one-row | props | timing
//! ```
//!
//! Exit status: 0 passed, 3 skipped (this GPU cannot run the step), any
//! other value failed. With `INDEXER_PTX_DIR` pointing at the bundle's
//! `ptx-watchdog/` (as `run.sh --blackwell` does) every mbarrier wait of
//! the kernels is bounded: a hang becomes a failed launch plus a record of
//! which CTA, warp, barrier and phase gave up, printed here.
//!
//! The tcgen05 path has never run on hardware; this kit is how its first
//! owner finds out whether it works, and where it breaks if it does not.

use dsa_indexer_bwd::cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use dsa_indexer_bwd::lab::{self, bringup, watchdog};
use dsa_indexer_bwd::{
    gpu, Backend, GradDtype, KeyIds, Options, Plan, ScoreKind, Shape, StageEvents,
    TCGEN05_VALIDATED,
};
use indexer_tests::{check_against_reference, DeviceProblem, Gen, Padding, Problem, Values};
use kernels_gpu::abi::{
    watchdog_untag, WatchdogRecord, WATCHDOG_PROBE_SMEM, WATCHDOG_PROBE_THREADS,
};
use kernels_gpu::registry::WATCHDOG_PROBE;
use kernels_gpu::sm100::budget::{K_STAGES, Q_STAGES, SM100_CHUNK};
use kernels_gpu::sm100::proto;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;

/// Exit status of a step this GPU cannot run.
const SKIPPED: u8 = 3;

/// Lines go to stdout and, with `--report`, to the report file.
struct Report {
    file: Option<std::fs::File>,
}

impl Report {
    fn line(&mut self, s: &str) {
        println!("{s}");
        if let Some(f) = &mut self.file {
            let _ = writeln!(f, "{s}");
        }
    }
}

/// How a step ended.
enum Outcome {
    Passed,
    Skipped(String),
    Failed(String),
}

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(step) = args.first().cloned() else {
        eprintln!("usage: indexer-bringup STEP [--report FILE] [--cases N] [--seed S]");
        return ExitCode::from(2);
    };
    let file = arg(&args, "--report").map(|p| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .unwrap_or_else(|e| panic!("{p}: {e}"))
    });
    let mut r = Report { file };
    let cases: usize = arg(&args, "--cases").map_or(40, |v| v.parse().expect("--cases"));
    let seed: u64 = arg(&args, "--seed").map_or(0xb200, |v| v.parse().expect("--seed"));
    r.line(&format!("== step {step}"));
    let outcome = if dsa_indexer_bwd::cuda_device_count() == 0 {
        Outcome::Skipped("no CUDA device".into())
    } else {
        let ctx = CudaContext::new(0).expect("CUDA device 0");
        match step.as_str() {
            "info" => info(&ctx, &mut r),
            "watchdog" => watchdog_self_test(&ctx, &mut r),
            "smoke" => blackwell_only(&ctx, &mut r, smoke),
            "probes" => blackwell_only(&ctx, &mut r, probes),
            "one-row" => blackwell_only(&ctx, &mut r, one_row),
            "props" => blackwell_only(&ctx, &mut r, |c, r| props(c, r, cases, seed)),
            "timing" => blackwell_only(&ctx, &mut r, timing),
            other => Outcome::Failed(format!("unknown step `{other}`")),
        }
    };
    match outcome {
        Outcome::Passed => {
            r.line(&format!("step {step}: passed"));
            ExitCode::SUCCESS
        }
        Outcome::Skipped(why) => {
            r.line(&format!("step {step}: skipped ({why})"));
            ExitCode::from(SKIPPED)
        }
        Outcome::Failed(why) => {
            r.line(&format!("step {step}: FAILED: {why}"));
            if let Some(rec) = watchdog::last_record() {
                r.line(&describe(&rec, None));
            }
            ExitCode::FAILURE
        }
    }
}

fn capability(ctx: &Arc<CudaContext>) -> (i32, i32) {
    ctx.compute_capability().expect("compute capability")
}

/// Runs `f` on a compute capability 10.x GPU; skips elsewhere.
fn blackwell_only(
    ctx: &Arc<CudaContext>,
    r: &mut Report,
    f: impl FnOnce(&Arc<CudaContext>, &mut Report) -> Outcome,
) -> Outcome {
    match capability(ctx) {
        (10, 0) | (10, 3) => f(ctx, r),
        (major, minor) => Outcome::Skipped(format!(
            "needs a Blackwell GPU of compute capability 10.0 or 10.3; this one is {major}.{minor}"
        )),
    }
}

fn info(ctx: &Arc<CudaContext>, r: &mut Report) -> Outcome {
    let (major, minor) = capability(ctx);
    let name = ctx.name().unwrap_or_default();
    let module = gpu::PtxModule::for_capability(major, minor);
    r.line(&format!("gpu: {name}, compute capability {major}.{minor}"));
    r.line(&format!(
        "module: {}; PTX override ({}): {}",
        module.map_or("none".into(), |m| m.target().to_string()),
        gpu::PTX_DIR_ENV,
        std::env::var(gpu::PTX_DIR_ENV).unwrap_or_else(|_| "unset (embedded PTX)".into())
    ));
    r.line(&format!(
        "tcgen05 validated on: {TCGEN05_VALIDATED:?}; watchdog limit {} ms",
        watchdog::limit_ns() / 1_000_000
    ));
    match lab::product_module(ctx) {
        Ok(_) => {
            r.line(&format!(
                "module loaded; watchdog build armed: {}",
                watchdog::is_armed()
            ));
            Outcome::Passed
        }
        Err(e) => Outcome::Failed(format!("loading the module: {e}")),
    }
}

/// The watchdog fires on a barrier nobody arrives on, records where, and
/// the launch fails instead of hanging. Needs the watchdog build.
fn watchdog_self_test(ctx: &Arc<CudaContext>, r: &mut Report) -> Outcome {
    const TAG: u32 = 0x0b00;
    let module = match lab::product_module(ctx) {
        Ok(m) => m,
        Err(e) => return Outcome::Failed(format!("loading the module: {e}")),
    };
    if !watchdog::is_armed() {
        return Outcome::Skipped(format!(
            "the loaded PTX is not a watchdog build (set {} to the bundle's ptx-watchdog/)",
            gpu::PTX_DIR_ENV
        ));
    }
    let f = module
        .load_function(WATCHDOG_PROBE.name)
        .expect("watchdog probe kernel");
    let stream = ctx.default_stream();
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (WATCHDOG_PROBE_THREADS, 1, 1),
        shared_mem_bytes: WATCHDOG_PROBE_SMEM,
    };
    let start = std::time::Instant::now();
    let mut launch = stream.launch_builder(&f);
    launch.arg(&TAG);
    // SAFETY: the probe's documented launch shape; its one parameter is
    // the u32 tag; it touches only its own shared memory and the
    // watchdog's host-mapped record.
    let launched = unsafe { launch.launch(cfg) };
    let synced = launched
        .map_err(|e| e.to_string())
        .and_then(|_| stream.synchronize().map_err(|e| e.to_string()));
    let took = start.elapsed();
    let Err(e) = synced else {
        return Outcome::Failed("the probe returned although nobody arrives on its barrier".into());
    };
    r.line(&format!(
        "probe launch failed as expected after {took:?}: {e}"
    ));
    let Some(rec) = watchdog::last_record() else {
        return Outcome::Failed("no watchdog record after the failed launch".into());
    };
    r.line(&describe(&rec, None));
    let limit_us = watchdog::limit_ns() / 1000;
    let checks = [
        (rec.cta == 0, "CTA 0"),
        (
            rec.warp < WATCHDOG_PROBE_THREADS / 32,
            "a warp of the probe",
        ),
        (rec.barrier_offset == 0, "the barrier at offset 0"),
        (rec.parity == 0, "parity 0"),
        (rec.tag == TAG, "the probe's tag"),
        (
            rec.elapsed_us as u64 >= limit_us && rec.elapsed_us as u64 <= limit_us + 1_000_000,
            "waited about the limit",
        ),
    ];
    for (ok, what) in checks {
        if !ok {
            return Outcome::Failed(format!("the record does not name {what}"));
        }
    }
    Outcome::Passed
}

/// A watchdog record in words; for a stage-2 wait (`launch` = its chunks
/// per row and grid), the barrier's name, the phase and the query row.
fn describe(rec: &WatchdogRecord, launch: Option<(u32, u32)>) -> String {
    let mut s = format!(
        "watchdog: CTA {} warp {} lane {} (SM {}) gave up after {} us on the barrier at shared offset {:#x}, parity {}",
        rec.cta, rec.warp, rec.lane, rec.sm, rec.elapsed_us, rec.barrier_offset, rec.parity
    );
    match (watchdog_untag(rec.tag), launch) {
        (Some((bar, phase)), Some((nch, grid))) => {
            s += &format!(", {} phase {phase}", bar_name(bar));
            if let Some(local) = local_row(bar, phase, nch) {
                s += &format!(" (query row {})", rec.cta + local * grid);
            }
        }
        (Some(_), None) => s += &format!(", tag {:#x}", rec.tag),
        (None, _) => s += ", untagged wait",
    }
    s
}

/// Name of stage-2 barrier `i` (`proto`'s table).
fn bar_name(i: u32) -> String {
    let ring = |base: u32, n: u32, name: &str| {
        (i >= base && i < base + n).then(|| format!("{name}[{}]", i - base))
    };
    ring(proto::FULL, K_STAGES, "FULL")
        .or_else(|| ring(proto::EMPTY, K_STAGES, "EMPTY"))
        .or_else(|| ring(proto::Q_FULL, Q_STAGES, "Q_FULL"))
        .or_else(|| ring(proto::Q_EMPTY, Q_STAGES, "Q_EMPTY"))
        .unwrap_or_else(|| {
            match i {
                proto::S_READY => "S_READY",
                proto::DS_READY => "DS_READY",
                proto::DK_READY => "DK_READY",
                proto::DK_FREE => "DK_FREE",
                proto::DQ_READY => "DQ_READY",
                proto::DQ_FREE => "DQ_FREE",
                _ => "unknown barrier",
            }
            .into()
        })
}

/// The CTA's local row (0, 1, ... of its rows) whose wait on `bar` for
/// `phase` gave up, from the barrier's role: per chunk (the K ring and the
/// chunk events) or per row (the q ring, dQ).
fn local_row(bar: u32, phase: u32, nch: u32) -> Option<u32> {
    let chunk_of_ring = |first: u32, stages: u32| phase * stages + (bar - first);
    Some(if bar < proto::Q_FULL {
        let first = if bar < proto::EMPTY {
            proto::FULL
        } else {
            proto::EMPTY
        };
        chunk_of_ring(first, K_STAGES) / nch
    } else if bar < proto::S_READY {
        let first = if bar < proto::Q_EMPTY {
            proto::Q_FULL
        } else {
            proto::Q_EMPTY
        };
        chunk_of_ring(first, Q_STAGES)
    } else if bar <= proto::DK_FREE {
        phase / nch
    } else if bar < proto::NUM_BARS {
        phase
    } else {
        return None;
    })
}

fn smoke(ctx: &Arc<CudaContext>, r: &mut Report) -> Outcome {
    match bringup::smoke(ctx) {
        Ok(rep) => {
            r.line(&rep.detail);
            if rep.ok {
                Outcome::Passed
            } else {
                Outcome::Failed("the tcgen05 smoke kernel's tile differs from the CPU".into())
            }
        }
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

fn probes(ctx: &Arc<CudaContext>, r: &mut Report) -> Outcome {
    // Each probe's name is on the report before it launches, so a hang or
    // a lost context is pinned to it.
    let announce = |spec: &bringup::ProbeSpec| {
        println!("probe {} (isolates: {}) ...", spec.name, spec.isolates);
        let _ = std::io::stdout().flush();
    };
    match bringup::mma_probes_with(ctx, announce) {
        Ok(reports) => {
            let mut bad = Vec::new();
            for p in &reports {
                r.line(&format!(
                    "probe {}: max abs err {:.3e}, rel err {:.3e}: {}{}",
                    p.name,
                    p.max_abs_err,
                    p.rel_err,
                    if p.ok { "ok" } else { "MISMATCH" },
                    if p.detail.is_empty() {
                        String::new()
                    } else {
                        format!("; {}", p.detail)
                    }
                ));
                if !p.ok {
                    bad.push(p.name);
                }
            }
            if bad.is_empty() {
                Outcome::Passed
            } else {
                Outcome::Failed(format!("probes {bad:?} differ from the CPU"))
            }
        }
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

fn blackwell_opts(key_ids: KeyIds, score: ScoreKind, dk: GradDtype, dw: GradDtype) -> Options {
    Options {
        sm_scale: 0.5,
        key_ids,
        score,
        d_index_k: dk,
        d_weights: dw,
        backend: Backend::Blackwell,
        deterministic: false,
    }
}

/// One problem on the tcgen05 path, checked against the reference; the
/// error in words (with the watchdog's record where it fired).
fn run_checked(ctx: &Arc<CudaContext>, p: &Problem) -> Result<String, String> {
    let plan = Plan::new(ctx, p.shape, p.opts).map_err(|e| format!("Plan::new: {e}"))?;
    let stream = ctx.default_stream();
    let mut dev = DeviceProblem::upload(&stream, p, plan.workspace_bytes());
    let launch = (
        p.shape.topk as u32 / SM100_CHUNK,
        grid_of(ctx, p.shape.rows() as u32),
    );
    let fail = |what: String| {
        let rec = watchdog::last_record().map(|rec| describe(&rec, Some(launch)));
        Err(match rec {
            Some(rec) => format!("{what}; {rec}"),
            None => what,
        })
    };
    if let Err(e) = dev.execute(&plan, &stream, p.loss_coeff) {
        return fail(format!("execute: {e}"));
    }
    if let Err(e) = stream.synchronize() {
        return fail(format!("kernels: {e}"));
    }
    let out = dev.download(&stream, &p.opts);
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        check_against_reference(p, &out)
    })) {
        Ok(e) => Ok(format!(
            "kernels {:?}; errors grad_signal {:.2e} dq {:.2e} dw {:.2e} dk {:.2e}",
            plan.kernels(),
            e.grad_signal,
            e.d_index_q,
            e.d_weights,
            e.d_index_k
        )),
        Err(msg) => Err(msg
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| "the outputs differ from the reference".into())),
    }
}

/// Stage 2's grid (`sched::persistent_grid`: one CTA per SM, at most one per row).
fn grid_of(ctx: &Arc<CudaContext>, rows: u32) -> u32 {
    use dsa_indexer_bwd::cudarc::driver::sys::CUdevice_attribute;
    let sms = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .unwrap_or(1)
        .max(1) as u32;
    kernels_gpu::sched::persistent_grid(rows, sms, 1).max(1)
}

fn problem(seed: u64, shape: Shape, opts: Options, padding: Padding, short_rows: f64) -> Problem {
    let mut rng = StdRng::seed_from_u64(seed);
    let g = Gen {
        values: Values::Grid,
        padding,
        short_rows,
        trailing: false,
        duplicates: true,
        masked: 0.05,
    };
    Problem::random(&mut rng, shape, opts, g)
}

/// A D = 128 shape (the tcgen05 kernels' only head dimension).
fn shape(batch: usize, seq_q: usize, seq_k: usize, heads: usize, topk: usize) -> Shape {
    indexer_tests::shape(batch, seq_q, seq_k, heads, 128, topk)
}

/// Stage 2 on one CTA and one query row, per specialization family.
fn one_row(ctx: &Arc<CudaContext>, r: &mut Report) -> Outcome {
    let o = blackwell_opts(
        KeyIds::Global,
        ScoreKind::Probs,
        GradDtype::F32,
        GradDtype::F32,
    );
    for (i, (heads, topk)) in [(64, 128), (32, 128), (64, 256), (32, 384)]
        .into_iter()
        .enumerate()
    {
        let p = problem(
            i as u64,
            shape(1, 1, 2 * topk, heads, topk),
            o,
            Padding::NegOne,
            0.0,
        );
        match run_checked(ctx, &p) {
            Ok(s) => r.line(&format!("one row, H = {heads}, topk {topk}: {s}")),
            Err(e) => return Outcome::Failed(format!("one row, H = {heads}, topk {topk}: {e}")),
        }
    }
    Outcome::Passed
}

/// Random problems over every specialization and option, each against the
/// reference.
fn props(ctx: &Arc<CudaContext>, r: &mut Report, cases: usize, seed: u64) -> Outcome {
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..cases {
        let heads = [32, 64][rng.random_range(0..2)];
        let topk = [128, 256, 384][rng.random_range(0..3)];
        let batch = rng.random_range(1..=2);
        let seq_q = rng.random_range(1..=200);
        let seq_k = rng.random_range(topk / 2..=4 * topk);
        let key_ids = if rng.random_bool(0.5) {
            KeyIds::Global
        } else {
            KeyIds::Local
        };
        let score = if rng.random_bool(0.5) {
            ScoreKind::Probs
        } else {
            ScoreKind::LogProbs
        };
        let dk = if rng.random_bool(0.5) {
            GradDtype::F32
        } else {
            GradDtype::Bf16
        };
        let dw = if rng.random_bool(0.5) {
            GradDtype::F32
        } else {
            GradDtype::Bf16
        };
        let padding = if rng.random_bool(0.5) {
            Padding::NegOne
        } else {
            Padding::OutOfRange
        };
        let s = shape(batch, seq_q, seq_k, heads, topk);
        let p = problem(
            seed ^ (i as u64 + 1),
            s,
            blackwell_opts(key_ids, score, dk, dw),
            padding,
            0.3,
        );
        let what = format!(
            "case {}/{cases}: B {batch} S_q {seq_q} S_k {seq_k} H {heads} topk {topk} {key_ids:?} {score:?} dk {dk:?} dw {dw:?} {padding:?}",
            i + 1
        );
        match run_checked(ctx, &p) {
            Ok(s) => r.line(&format!("{what}: {s}")),
            Err(e) => return Outcome::Failed(format!("{what}: {e}")),
        }
    }
    Outcome::Passed
}

/// The tcgen05 path against the row kernels on SPEC's shape (median of 20
/// executes each, CUDA events), for the record; never fails on speed.
fn timing(ctx: &Arc<CudaContext>, r: &mut Report) -> Outcome {
    let stream = ctx.default_stream();
    for topk in [128, 256, 384] {
        let s = shape(1, 8192, 4096, 64, topk);
        let mut line = format!("timing, B 1 S_q 8192 S_k 4096 H 64 D 128 topk {topk}:");
        for backend in [Backend::Blackwell, Backend::Hopper] {
            let o = Options {
                backend,
                ..blackwell_opts(
                    KeyIds::Global,
                    ScoreKind::Probs,
                    GradDtype::F32,
                    GradDtype::Bf16,
                )
            };
            let p = problem(topk as u64, s, o, Padding::NegOne, 0.0);
            let plan = match Plan::new(ctx, s, o) {
                Ok(plan) => plan,
                Err(e) => return Outcome::Failed(format!("Plan::new ({backend:?}): {e}")),
            };
            let mut dev = DeviceProblem::upload(&stream, &p, plan.workspace_bytes());
            let events = match StageEvents::new(ctx) {
                Ok(ev) => ev,
                Err(e) => return Outcome::Failed(format!("events: {e}")),
            };
            let mut times = Vec::new();
            for i in 0..25 {
                let run = dev
                    .execute_profiled(&plan, &stream, p.loss_coeff, &events)
                    .and_then(|_| events.times());
                match run {
                    Ok(t) if i >= 5 => times.push(t.total_us),
                    Ok(_) => {}
                    Err(e) => return Outcome::Failed(format!("{backend:?}: {e}")),
                }
                dev.reset_targets(&stream, &p);
            }
            times.sort_by(f64::total_cmp);
            line += &format!(" {:?} {:.0} us", plan.kernels(), times[times.len() / 2]);
        }
        r.line(&line);
    }
    Outcome::Passed
}
