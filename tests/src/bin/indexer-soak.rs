//! Soak run on the GPU: thousands of executes over random shapes and
//! options, several plans shared by 2-4 streams at once (one host thread
//! per stream), CUDA-graph capture and replay with new `grad_loss` values,
//! results checked against the CPU reference at intervals, device memory
//! compared before and after.
//!
//! ```text
//! indexer-soak [--seconds 120] [--seed 2026] [--streams 3] [--plans 8] [--check-every 16]
//! ```
//!
//! Kernel families (all that run on an H200): the `mma.sync` row kernels
//! (every H x D with topk <= 64, H = 128 and H x D = 32 x 64 or 16 x 64
//! at any topk), the wgmma fast path (H = 64 with D = 128 or 64, H = 32 or
//! 16 with D = 128; topk > 64), its paired kernel (even rows whose odd
//! rows copy the previous row's ids) and its chunk skip (topk >= 512,
//! rows padded at their end); global and local ids, probabilities and
//! log-probabilities, f32 and bf16 `d_index_k` and `d_weights`, positive
//! and negative `sm_scale`, `Backend::Auto` and `Backend::Hopper`.
//!
//! Plans live in a shared pool that is renewed as the run goes (so plans
//! are built while other threads capture graphs); each stream keeps three
//! problems of pool plans, executes them in random order with fresh
//! targets (and, for the small ones, a new `grad_loss` each time), and
//! captures a graph of a problem's `execute` now and then to replay it.
//! Small problems (`rows * H * D * topk <= 2^25`) are checked against the
//! CPU reference on their first execute and every `--check-every`-th one
//! (graph replays included, with the value of `grad_loss` the replay
//! read); larger ones check that `d_index_q`, `d_weights` and
//! grad_signal are bitwise identical to their first execute (SPEC's
//! determinism; replays included) and that every output is finite.
//!
//! Ends with one line, `soak: ... : ok` or `... : FAILED`, and exits 1 on
//! any failure (a wrong result, a driver error, device memory not given
//! back). Without a GPU it prints `indexer-soak: skipped: no CUDA device`
//! and exits 0.

use clap::Parser;
use cudarc::driver::{CudaContext, CudaGraph, CudaStream};
use dsa_indexer_bwd::{Backend, GradDtype, KeyIds, Options, Plan, ScoreKind, Shape};
use indexer_tests::{
    compare_with_reference, gpu, DeviceProblem, Gen, GpuOut, Padding, Problem, Values,
    CONTINUOUS_FLOORS, GRID_FLOORS,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Soak run of the indexer backward on the GPU (see the file's docs).
#[derive(Parser, Debug)]
#[command(name = "indexer-soak")]
struct Cli {
    /// Seconds of executes (setup and the final checks come on top).
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    seconds: u64,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 2026)]
    seed: u64,
    /// Streams, one host thread each.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(2..=4))]
    streams: u64,
    /// Plans in the shared pool at any time.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=64))]
    plans: u64,
    /// Check every Nth execute of a problem (and its first).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..))]
    check_every: u64,
}

/// Which kernels a plan's problems exercise, and how they are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    /// `mma.sync` row kernels.
    Row,
    /// wgmma fast path, row kernel.
    Fast,
    /// wgmma fast path with rows in identical pairs (the paired kernel).
    Paired,
    /// wgmma fast path, topk >= 512, short rows padded at the end.
    Skip,
}

/// A plan of the pool.
struct Entry {
    plan: Plan,
    family: Family,
}

/// Counters and results shared by the workers.
#[derive(Default)]
struct Stats {
    executes: AtomicU64,
    checked: AtomicU64,
    determinism: AtomicU64,
    graphs: AtomicU64,
    replays: AtomicU64,
    plans: AtomicU64,
    /// Largest errors against the reference: grad_signal, dQ, dW, dK.
    max_err: Mutex<[f64; 4]>,
    failures: Mutex<Vec<String>>,
    stop: AtomicBool,
    /// Held (shared) around each capture and (exclusive) around each
    /// `Plan::new`: module loads are kept out of other threads' captures,
    /// a conservative choice (this run tests the library, not which
    /// driver calls may overlap a capture).
    capture_gate: std::sync::RwLock<()>,
    /// Plans replaced in the pool, kept until the end so that no module
    /// is unloaded while a capture may be open.
    retired: Mutex<Vec<Arc<Entry>>>,
}

impl Stats {
    fn fail(&self, msg: String) {
        eprintln!("soak: FAILURE: {msg}");
        self.failures.lock().unwrap().push(msg);
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn pick<T: Copy>(rng: &mut StdRng, v: &[T]) -> T {
    v[rng.random_range(0..v.len())]
}

/// A random shape and options of a random family.
fn random_config(rng: &mut StdRng) -> (Shape, Options, Family) {
    let family = match rng.random_range(0..10) {
        0..=3 => Family::Row,
        4..=6 => Family::Fast,
        7..=8 => Family::Paired,
        _ => Family::Skip,
    };
    let shape = match family {
        Family::Row => {
            let (heads, head_dim) = (pick(rng, &[16, 32, 64, 128]), pick(rng, &[64, 128]));
            // At H = 64, D = 128 the row kernel runs for topk <= 64 only.
            let max_topk = if heads == 64 && head_dim == 128 {
                64
            } else {
                300
            };
            Shape {
                batch: rng.random_range(1..=3),
                seq_q: rng.random_range(1..=32),
                seq_k: rng.random_range(1..=2048),
                heads,
                head_dim,
                topk: rng.random_range(1..=max_topk),
            }
        }
        Family::Fast | Family::Paired => {
            let topk = rng.random_range(65..=700);
            // Mostly few rows, so most problems are checked against the
            // reference; some with more rows than the persistent grid.
            let mut seq_q: usize = if rng.random_bool(0.6) {
                rng.random_range(1..=16)
            } else {
                rng.random_range(1..=300)
            };
            if family == Family::Paired && !seq_q.is_multiple_of(2) {
                seq_q += 1;
            }
            Shape {
                batch: if family == Family::Paired {
                    1
                } else {
                    rng.random_range(1..=2)
                },
                seq_q,
                seq_k: rng.random_range(1..=4096),
                heads: 64,
                head_dim: 128,
                topk,
            }
        }
        Family::Skip => Shape {
            batch: 1,
            seq_q: if rng.random_bool(0.5) {
                rng.random_range(1..=8)
            } else {
                rng.random_range(1..=64)
            },
            seq_k: rng.random_range(512..=4096),
            heads: 64,
            head_dim: 128,
            topk: rng.random_range(512..=1200),
        },
    };
    let opts = Options {
        sm_scale: pick(rng, &[1.0, 0.5, 0.125, 2.0, -0.7]),
        key_ids: if rng.random_bool(0.5) {
            KeyIds::Local
        } else {
            KeyIds::Global
        },
        score: if rng.random_bool(0.5) {
            ScoreKind::LogProbs
        } else {
            ScoreKind::Probs
        },
        d_index_k: if rng.random_bool(0.5) {
            GradDtype::Bf16
        } else {
            GradDtype::F32
        },
        d_weights: if rng.random_bool(0.5) {
            GradDtype::Bf16
        } else {
            GradDtype::F32
        },
        backend: if rng.random_bool(0.5) {
            Backend::Auto
        } else {
            Backend::Hopper
        },
        deterministic: false,
    };
    (shape, opts, family)
}

fn new_entry(
    ctx: &Arc<CudaContext>,
    rng: &mut StdRng,
    stats: &Stats,
) -> Result<Arc<Entry>, String> {
    let (shape, opts, family) = random_config(rng);
    let plan =
        Plan::new(ctx, shape, opts).map_err(|e| format!("Plan::new({shape:?}, {opts:?}): {e}"))?;
    stats.plans.fetch_add(1, Ordering::Relaxed);
    Ok(Arc::new(Entry { plan, family }))
}

/// Whether a problem is small enough to check against the CPU reference.
fn small(s: &Shape) -> bool {
    s.rows() * s.heads * s.head_dim * s.topk <= 1 << 25
}

/// One problem of a pool plan on one stream.
struct Instance {
    entry: Arc<Entry>,
    p: Problem,
    d: DeviceProblem,
    graph: Option<CudaGraph>,
    small: bool,
    values: Values,
    /// Executes so far, and executes left before it is replaced.
    runs: u64,
    left: u64,
    /// grad_signal, d_index_q and d_weights bits of the first execute
    /// (large problems: the determinism check).
    first: Option<(Vec<u32>, Vec<u16>, Vec<u32>)>,
}

fn new_instance(entry: Arc<Entry>, stream: &Arc<CudaStream>, rng: &mut StdRng) -> Instance {
    let shape = *entry.plan.shape();
    let opts = *entry.plan.options();
    let is_small = small(&shape);
    // Continuous values (gate ties redrawn) only where the reference
    // checks them; the redraw costs as much as a reference run.
    let values = if is_small && rng.random_bool(0.3) {
        Values::Continuous
    } else {
        Values::Grid
    };
    let g = Gen {
        values,
        padding: Padding::NegOne,
        short_rows: match entry.family {
            Family::Skip => 0.6,
            _ => pick(rng, &[0.0, 0.1, 0.5]),
        },
        trailing: entry.family == Family::Skip || rng.random_bool(0.3),
        duplicates: rng.random_bool(0.3),
        masked: 0.03,
    };
    let mut p = Problem::random(rng, shape, opts, g);
    if entry.family == Family::Paired {
        let share = pick(rng, &[1.0, 1.0, 0.5]);
        let swaps = rng.random_range(0..=2);
        p.pair_rows(rng, share, swaps);
    }
    if values == Values::Continuous {
        p.avoid_gate_ties(rng, 1e-4);
    }
    if rng.random_bool(0.1) {
        p.targets_below_clip(rng, 0.1);
    }
    let padding = if rng.random_bool(0.5) {
        Padding::NegOne
    } else {
        Padding::OutOfRange
    };
    p.repad(rng, padding);
    let d = DeviceProblem::upload(stream, &p, entry.plan.workspace_bytes());
    Instance {
        entry,
        p,
        d,
        graph: None,
        small: is_small,
        values,
        runs: 0,
        left: rng.random_range(20..=200),
        first: None,
    }
}

/// Checks the last execute of `inst`: against the reference when small,
/// else bitwise against its first execute.
fn check(inst: &mut Instance, out: &GpuOut, stats: &Stats) -> Result<(), String> {
    let label = || {
        format!(
            "{:?} {:?} {:?} ({:?} values, execute {}{})",
            inst.entry.family,
            inst.p.shape,
            inst.p.opts,
            inst.values,
            inst.runs,
            if inst.graph.is_some() {
                ", graph captured"
            } else {
                ""
            }
        )
    };
    if inst.small {
        let floors = match inst.values {
            Values::Grid => GRID_FLOORS,
            Values::Continuous => CONTINUOUS_FLOORS,
        };
        let e = compare_with_reference(&inst.p, out, floors)
            .map_err(|e| format!("{}: {e}", label()))?;
        let mut m = stats.max_err.lock().unwrap();
        for (a, b) in m
            .iter_mut()
            .zip([e.grad_signal, e.d_index_q, e.d_weights, e.d_index_k])
        {
            *a = a.max(b);
        }
        stats.checked.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    let all_finite = out.grad_signal.iter().all(|v| v.is_finite())
        && out.d_index_q.iter().all(|v| v.is_finite())
        && out.d_weights.iter().all(|v| v.is_finite())
        && out.d_index_k.iter().all(|v| v.is_finite());
    if !all_finite {
        return Err(format!("{}: a non-finite output", label()));
    }
    let bits = (
        out.grad_signal
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>(),
        out.d_index_q
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>(),
        out.d_weights_bits.clone(),
    );
    match &inst.first {
        None => inst.first = Some(bits),
        Some(f) => {
            if f.0 != bits.0 || f.1 != bits.1 || f.2 != bits.2 {
                return Err(format!(
                    "{}: grad_signal / d_index_q / d_weights not bitwise equal to the first execute",
                    label()
                ));
            }
            stats.determinism.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// One stream's loop until `deadline` or a failure anywhere.
fn worker(
    id: u64,
    ctx: Arc<CudaContext>,
    pool: Arc<Mutex<Vec<Arc<Entry>>>>,
    stats: Arc<Stats>,
    deadline: Instant,
    cli: &Cli,
) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(cli.seed ^ (0x9e37_79b9 * (id + 1)));
    let stream = ctx.new_stream().map_err(|e| format!("new_stream: {e}"))?;
    let mut insts: Vec<Instance> = Vec::new();
    while Instant::now() < deadline && !stats.stop.load(Ordering::Relaxed) {
        if insts.len() < 3 {
            // Now and then renew a pool plan (built while other threads
            // execute and capture).
            let entry = if rng.random_bool(0.1) {
                let e = new_entry(&ctx, &mut rng, &stats)?;
                let mut pool = pool.lock().unwrap();
                let i = rng.random_range(0..pool.len());
                let old = std::mem::replace(&mut pool[i], e.clone());
                stats.retired.lock().unwrap().push(old);
                e
            } else {
                let pool = pool.lock().unwrap();
                pool[rng.random_range(0..pool.len())].clone()
            };
            insts.push(new_instance(entry, &stream, &mut rng));
        }
        let i = rng.random_range(0..insts.len());
        let inst = &mut insts[i];
        let (shape, opts) = (inst.p.shape, inst.p.opts);
        let err =
            |what: &str, e: &dyn std::fmt::Display| format!("{what} ({shape:?} {opts:?}): {e}");
        if inst.small {
            // A new grad_loss, read on the device (also by graph replays).
            inst.p.grad_loss = rng.random_range(0.25f32..2.0) * pick(&mut rng, &[1.0, 1.0, -1.0]);
            stream
                .memcpy_htod(&[inst.p.grad_loss], &mut inst.d.grad_loss)
                .map_err(|e| err("grad_loss upload", &e))?;
        }
        inst.d.reset_targets(&stream, &inst.p);
        let plan = &inst.entry.plan;
        let mut replayed = false;
        if let Some(g) = &inst.graph {
            if rng.random_bool(0.7) {
                g.launch().map_err(|e| err("graph launch", &e))?;
                stats.replays.fetch_add(1, Ordering::Relaxed);
                replayed = true;
            }
        } else if inst.runs > 0 && rng.random_bool(0.1) {
            // Capture this problem's execute (warmed by an earlier one) on
            // this thread only; the other threads keep working.
            let _gate = stats.capture_gate.read().unwrap();
            let graph = inst
                .d
                .capture(plan, &stream, inst.p.loss_coeff)
                .map_err(|e| err("capture", &e))?;
            graph.launch().map_err(|e| err("graph launch", &e))?;
            inst.graph = Some(graph);
            stats.graphs.fetch_add(1, Ordering::Relaxed);
            stats.replays.fetch_add(1, Ordering::Relaxed);
            replayed = true;
        }
        if !replayed {
            inst.d
                .execute(plan, &stream, inst.p.loss_coeff)
                .map_err(|e| err("execute", &e))?;
        }
        stats.executes.fetch_add(1, Ordering::Relaxed);
        inst.runs += 1;
        if inst.runs == 1 || inst.runs.is_multiple_of(cli.check_every) {
            stream.synchronize().map_err(|e| err("synchronize", &e))?;
            let out = inst.d.download(&stream, &inst.p.opts);
            check(inst, &out, &stats)?;
        }
        inst.left -= 1;
        if inst.left == 0 {
            // Graphs and buffers go only after their work is done.
            stream.synchronize().map_err(|e| err("synchronize", &e))?;
            insts.swap_remove(i);
        }
    }
    stream
        .synchronize()
        .map_err(|e| format!("synchronize: {e}"))?;
    drop(insts);
    stream
        .synchronize()
        .map_err(|e| format!("synchronize: {e}"))?;
    Ok(())
}

fn free_mib(ctx: &Arc<CudaContext>) -> Result<f64, String> {
    ctx.synchronize().map_err(|e| format!("synchronize: {e}"))?;
    let (free, _) = ctx
        .mem_get_info()
        .map_err(|e| format!("mem_get_info: {e}"))?;
    Ok(free as f64 / f64::from(1u32 << 20))
}

/// Device memory that may stay with the driver between the two readings
/// (allocator granularity, lazily created driver state); a leak of one
/// problem's buffers per execute or of a plan's module per plan is far
/// larger over a run.
const MEMORY_SLACK_MIB: f64 = 64.0;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let Some(ctx) = gpu("indexer-soak") else {
        return std::process::ExitCode::SUCCESS;
    };
    // Graph capture must not wait on events recorded outside it, and
    // every buffer here is used on the one stream it was made on.
    // SAFETY: buffers are allocated, used and freed on one stream each;
    // plans hold no buffers.
    unsafe { ctx.disable_event_tracking() };
    match soak(&ctx, &cli) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            println!("soak: FAILED: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn soak(ctx: &Arc<CudaContext>, cli: &Cli) -> Result<bool, String> {
    println!(
        "GPU: {} ({}s of executes, {} streams, {} plans, seed {})",
        ctx.name().map_err(|e| e.to_string())?,
        cli.seconds,
        cli.streams,
        cli.plans,
        cli.seed
    );
    let stats = Arc::new(Stats::default());
    // Warm-up: one problem of each family, checked, then everything
    // dropped, so the memory baseline includes the driver's lazily
    // created state.
    {
        let stream = ctx.new_stream().map_err(|e| e.to_string())?;
        let mut rng = StdRng::seed_from_u64(cli.seed);
        let mut seen = Vec::new();
        while seen.len() < 4 {
            let e = new_entry(ctx, &mut rng, &stats)?;
            if seen.contains(&e.family) {
                continue;
            }
            seen.push(e.family);
            let mut inst = new_instance(e, &stream, &mut rng);
            inst.d
                .execute(&inst.entry.plan, &stream, inst.p.loss_coeff)
                .map_err(|e| format!("warm-up execute: {e}"))?;
            inst.runs = 1;
            stream.synchronize().map_err(|e| e.to_string())?;
            let out = inst.d.download(&stream, &inst.p.opts);
            check(&mut inst, &out, &stats).map_err(|e| format!("warm-up: {e}"))?;
        }
        stream.synchronize().map_err(|e| e.to_string())?;
    }
    let before = free_mib(ctx)?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(cli.seconds);
    {
        let mut rng = StdRng::seed_from_u64(cli.seed.wrapping_add(1));
        let mut plans = Vec::new();
        for _ in 0..cli.plans {
            plans.push(new_entry(ctx, &mut rng, &stats)?);
        }
        let pool = Arc::new(Mutex::new(plans));
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..cli.streams)
                .map(|id| {
                    let (ctx, pool, stats) = (ctx.clone(), pool.clone(), stats.clone());
                    s.spawn(move || {
                        if let Err(e) = worker(id, ctx, pool, stats.clone(), deadline, cli) {
                            stats.fail(format!("stream {id}: {e}"));
                        }
                    })
                })
                .collect();
            // Progress while the workers run.
            let mut next = Instant::now() + Duration::from_secs(15);
            while handles.iter().any(|h| !h.is_finished()) {
                std::thread::sleep(Duration::from_millis(200));
                if Instant::now() >= next {
                    next += Duration::from_secs(15);
                    println!(
                        "soak: {:.0} s, {} executes, {} checked, {} determinism checks, {} graph replays, {} plans",
                        started.elapsed().as_secs_f64(),
                        stats.executes.load(Ordering::Relaxed),
                        stats.checked.load(Ordering::Relaxed),
                        stats.determinism.load(Ordering::Relaxed),
                        stats.replays.load(Ordering::Relaxed),
                        stats.plans.load(Ordering::Relaxed)
                    );
                }
            }
            for (id, h) in handles.into_iter().enumerate() {
                if let Err(panic) = h.join() {
                    let msg = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "a panic".into());
                    stats.fail(format!("stream {id} panicked: {msg}"));
                }
            }
        });
    }
    stats.retired.lock().unwrap().clear();
    let after = free_mib(ctx)?;
    let secs = started.elapsed().as_secs_f64();
    let failures = stats.failures.lock().unwrap().clone();
    let leaked = before - after > MEMORY_SLACK_MIB;
    let m = *stats.max_err.lock().unwrap();
    let verdict = if failures.is_empty() && !leaked {
        "ok"
    } else {
        "FAILED"
    };
    for f in &failures {
        println!("failure: {f}");
    }
    if leaked {
        println!(
            "failure: device memory free fell by {:.0} MiB over the run (slack {MEMORY_SLACK_MIB} MiB)",
            before - after
        );
    }
    println!(
        "soak: {} executes, {} checked, {} determinism checks, {} graph replays ({} graphs), {} plans, {} streams, {secs:.0} s, max errors gs {:.2e} dq {:.2e} dw {:.2e} dk {:.2e}, device memory before {before:.0} MiB after {after:.0} MiB: {verdict}",
        stats.executes.load(Ordering::Relaxed),
        stats.checked.load(Ordering::Relaxed),
        stats.determinism.load(Ordering::Relaxed),
        stats.replays.load(Ordering::Relaxed),
        stats.graphs.load(Ordering::Relaxed),
        stats.plans.load(Ordering::Relaxed),
        cli.streams,
        m[0],
        m[1],
        m[2],
        m[3]
    );
    Ok(verdict == "ok")
}
