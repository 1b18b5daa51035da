//! `indexer-bench`: the benchmark workloads of docs/spec.md timed with CUDA events (median, min,
//! p90 of `--runs` after `--warmup`), split by stage, next to this GPU's
//! ceilings measured by the crate's own kernels. Prints a table and JSON
//! lines; `--plot FILE.svg` draws time vs topk; `--markdown FILE` writes
//! the table as markdown.
//!
//! Points: the headline workload (B=1, S_q=8192, S_k=4096, H=64, D=128)
//! at topk 128..2048 with "uniform", "ragged" and "topk" ids, then the
//! long context (S_q=4096, S_k=32768 and 131072, topk 2048) with "topk"
//! ids (what a trained indexer feeds the backward) and "uniform" ids (the
//! scattered worst case), each with f32 and bf16 `d_index_k`. The ids are
//! SPEC's (`Problem::make_ragged`, `Problem::make_topk` document them).
//!
//! Besides time, each point reports what its ids ask of the dK reduction
//! (`report::IdStats`): valid slots, distinct key rows they name, valid
//! slots per distinct key row, the share of slot-aligned equal pairs of
//! rows, the selections per distinct key of the union of groups of 2, 3,
//! 4 and 8 adjacent rows, the dK row reductions the computing kernel issues
//! per valid slot, and dK GB/s = valid slots x D x 4 bytes / median time.
//!
//! ```text
//! indexer-bench [--seq-q 8192] [--seq-k 4096] [--heads 64] [--dim 128]
//!               [--topk 128,256,512,1024,2048] [--ids uniform,ragged,topk]
//!               [--long-context on|off|only] [--long-seq-k 32768,131072]
//!               [--long-seq-q 4096] [--long-topk 2048] [--long-ids topk,uniform]
//!               [--dk f32,bf16] [--runs 30] [--warmup 5] [--seed 1]
//!               [--plot FILE.svg] [--markdown FILE] [--json FILE]
//! indexer-bench --from-json RUN.jsonl [--plot FILE.svg] [--markdown FILE]
//! indexer-bench --input CASE.safetensors [--output OUT.safetensors]
//!               [--runs 30] [--warmup 5] [--key-ids global|local]
//!               [--sm-scale F] [--loss-coeff F] [--grad-loss F]
//!               [--score probs|log-probs] [--dk f32|bf16] [--dw bf16|f32]
//!               [--json FILE]
//! indexer-bench --dense S1,S2,.. [--heads 64] [--dim 128] [--runs 30] [--warmup 5]
//! indexer-bench --dense-input CASE.safetensors [--output OUT.safetensors]
//!               [--runs 30] [--warmup 5] [--ratio 1] [--sm-scale F]
//!               [--loss-coeff F] [--grad-loss F] [--dk f32|bf16] [--dw bf16|f32]
//!               [--json FILE]
//! ```
//!
//! `--input` times this crate on the tensors of a file (the names of
//! `indexer-replay`; i64 ids are narrowed to i32 as there): the same
//! method, `attn_score` restored before every run (execute overwrites it
//! with grad_signal; nothing else it reads is written), then prints one
//! JSON line (`"kind":"input"`) and writes the last run's outputs
//! (`grad_signal`, `d_index_q`, `d_weights`, `d_index_k`) to `--output`.
//! The options come from flags, else from the file's metadata (string
//! values under `sm_scale`, `loss_coeff`, `key_ids` global|local,
//! `score` probs|log_probs, `d_index_k` and `d_weights` f32|bf16), else
//! the defaults (1, 1, global, probs, f32, bf16); `grad_loss` from the
//! flag, else the file's tensor, else 1.
//!
//! `--dense` times dense mode's whole `execute` on random causal BSHD
//! problems (B = 1, S_q = S_k = each value). `--dense-input` times it on
//! the dense tensors of a file (the names of `indexer-dense-replay`: BSHD,
//! or packed with `cu_seqlens_q`/`cu_seqlens_k`; optional `q_offset` and
//! `grad_loss`) the same way: CUDA events around each `execute`, the
//! logits restored into `index_score` (which execute overwrites with
//! grad_signal) before each run outside the events, median, min and p90
//! of `--runs` after `--warmup`. It prints one summary line and one JSON
//! line (`"kind":"dense_input"`), and writes the outputs of one more run
//! (`grad_signal`, `d_index_q`, `d_weights`, `d_index_k`) to `--output`.
//! Its options come from the flags only (defaults: ratio 1, sm_scale 1,
//! loss_coeff 1, f32 `d_index_k`, bf16 `d_weights`); `grad_loss` from the
//! flag, else the file's tensor, else 1.

use clap::{ArgGroup, Parser, ValueEnum};
use dsa_indexer_bwd::cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaStream, DevicePtr, DevicePtrMut,
};
use dsa_indexer_bwd::dense::{self, cpu::HostInputs, Layout};
use dsa_indexer_bwd::oneshot::HostResult;
use dsa_indexer_bwd::{
    gpu, GradDtype, KeyIds, Options, Plan, ScoreKind, Shape, StageEvents, StageTimes,
};
use indexer_tests::dense::{DenseDevice, DenseProblem};
use indexer_tests::dense_io::{read_dense_case, serialize_dense_outputs, DenseCase};
use indexer_tests::io::{case_key_ids, check_ids, read_case, serialize_outputs, OutFile, Res};
use indexer_tests::report::{
    benchmark_page, ceilings_json, dk_name, json_num, markdown, parse_json_lines, plot, point_json,
    which_computes, Ceilings, IdStats, Point, Workload,
};
use indexer_tests::{grad_vec, DeviceProblem, Gen, Padding, Problem, Values};
use kernels_gpu::abi::*;
use kernels_gpu::registry::{
    CEIL_COPY, CEIL_GATHER, CEIL_GATHER_REDUCE, CEIL_GATHER_STREAM, CEIL_MMA, CEIL_SCATTER_BULK,
    CEIL_SCATTER_RED,
};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// Times the sparse indexer backward on SPEC's workload (or on the tensors
/// of a file) with CUDA events.
#[derive(Parser, Debug)]
#[command(name = "indexer-bench")]
#[command(group(ArgGroup::new("file_input").args(["input", "dense_input"])))]
struct Cli {
    /// Query rows of the headline points.
    #[arg(long, default_value_t = 8192)]
    seq_q: usize,
    /// Keys of the headline points (those of top-k-of-scores ids run at
    /// S_k = max(this, S_q), as SPEC's workload asks: a row before the
    /// first key would see none).
    #[arg(long, default_value_t = 4096)]
    seq_k: usize,
    /// Heads; a list runs every point at each (all points, with --dim).
    #[arg(long, value_delimiter = ',', default_value = "64")]
    heads: Vec<usize>,
    /// Head dimensions; a list runs every point at each.
    #[arg(long, value_delimiter = ',', default_value = "128")]
    dim: Vec<usize>,
    /// topk of the headline points.
    #[arg(long, value_delimiter = ',', default_value = "128,256,512,1024,2048")]
    topk: Vec<usize>,
    /// Ids of the headline points (SPEC, "Performance workload").
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "uniform,ragged,topk"
    )]
    ids: Vec<IdKind>,
    /// Long-context points after the headline ones (on), none (off), or
    /// those alone (only).
    #[arg(long, value_enum, default_value_t = LongContext::On)]
    long_context: LongContext,
    /// Query rows of the long-context points.
    #[arg(long, default_value_t = 4096)]
    long_seq_q: usize,
    /// Keys of the long-context points.
    #[arg(long, value_delimiter = ',', default_value = "32768,131072")]
    long_seq_k: Vec<usize>,
    /// topk of the long-context points.
    #[arg(long, default_value_t = 2048)]
    long_topk: usize,
    /// Ids of the long-context points.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "topk,uniform"
    )]
    long_ids: Vec<IdKind>,
    /// Element types of d_index_k (with --input: the one to use; default
    /// the file's metadata, else f32; with --dense-input: the one to use,
    /// default f32).
    #[arg(long, value_enum, value_delimiter = ',')]
    dk: Vec<DtypeArg>,
    /// Timed runs per point (median, min, p90).
    #[arg(long, default_value_t = 30)]
    runs: usize,
    /// Untimed runs before them.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Seed of the problems.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Writes the time-vs-topk chart (SVG).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Writes the markdown table.
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Writes the JSON lines.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The headline points (or --dense) in deterministic mode
    /// (`Options::deterministic`; the JSON lines and tables do not record
    /// the mode: name the run).
    #[arg(long)]
    deterministic: bool,
    /// Dense mode instead of the sparse workloads: causal, B = 1,
    /// S_q = S_k = each value, the first --heads and --dim, f32 dK.
    #[arg(long, value_delimiter = ',', conflicts_with = "file_input")]
    dense: Vec<usize>,
    /// Re-renders --plot/--markdown from an earlier run's JSON lines (no GPU).
    #[arg(long, value_name = "RUN.jsonl", conflicts_with = "file_input")]
    from_json: Option<PathBuf>,
    /// With --from-json: writes the benchmark page (`docs/benchmarks.md`:
    /// a summary and every point; give the paths relative to the
    /// repository root, as the page names them, with --plot for its chart).
    #[arg(long, value_name = "PAGE.md", requires = "from_json")]
    page: Option<PathBuf>,
    /// Times the tensors of this .safetensors file instead of the workload.
    #[arg(long, value_name = "CASE.safetensors")]
    input: Option<PathBuf>,
    /// Times dense mode on the tensors of this .safetensors file (the
    /// names of indexer-dense-replay) instead of the workload.
    #[arg(long, value_name = "CASE.safetensors")]
    dense_input: Option<PathBuf>,
    /// With --input: writes the outputs of the last timed run here; with
    /// --dense-input, those of one more run.
    #[arg(long, value_name = "OUT.safetensors", requires = "file_input")]
    output: Option<PathBuf>,
    /// With --dense-input: key compression ratio (>= 1).
    #[arg(long, default_value_t = 1)]
    ratio: usize,
    /// With --input: id convention (default: metadata key_ids, else global).
    #[arg(long, value_enum, conflicts_with = "dense_input")]
    key_ids: Option<KeyIdsArg>,
    /// With --input: scale of q . k (default: metadata sm_scale, else 1);
    /// with --dense-input: default 1.
    #[arg(long, allow_negative_numbers = true)]
    sm_scale: Option<f32>,
    /// With --input: loss coefficient (default: metadata loss_coeff, else
    /// 1); with --dense-input: default 1.
    #[arg(long, allow_negative_numbers = true)]
    loss_coeff: Option<f32>,
    /// With --input or --dense-input: upstream gradient (default: the
    /// file's grad_loss, else 1).
    #[arg(long, allow_negative_numbers = true)]
    grad_loss: Option<f32>,
    /// With --input: what index_score holds (default: metadata score, else probs).
    #[arg(long, value_enum, conflicts_with = "dense_input")]
    score: Option<ScoreArg>,
    /// With --input: element type of d_weights (default: metadata
    /// d_weights, else bf16); with --dense-input: default bf16.
    #[arg(long, value_enum)]
    dw: Option<DtypeArg>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum IdKind {
    Uniform,
    Ragged,
    Topk,
}

impl IdKind {
    fn name(self) -> &'static str {
        match self {
            IdKind::Uniform => "uniform",
            IdKind::Ragged => "ragged",
            IdKind::Topk => "topk",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum LongContext {
    On,
    Off,
    Only,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum DtypeArg {
    F32,
    Bf16,
}

impl DtypeArg {
    fn grad(self) -> GradDtype {
        match self {
            DtypeArg::F32 => GradDtype::F32,
            DtypeArg::Bf16 => GradDtype::Bf16,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum KeyIdsArg {
    Global,
    Local,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ScoreArg {
    Probs,
    LogProbs,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median time in seconds of `runs` launches of `f` (after 2 warm-ups).
fn time_kernel(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    runs: usize,
    mut f: impl FnMut(),
) -> f64 {
    let timing = Some(dsa_indexer_bwd::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let (a, b) = (
        ctx.new_event(timing).unwrap(),
        ctx.new_event(timing).unwrap(),
    );
    let mut t = Vec::new();
    for i in 0..runs + 2 {
        a.record(stream).unwrap();
        f();
        b.record(stream).unwrap();
        b.synchronize().unwrap();
        if i >= 2 {
            t.push(a.elapsed_ms(&b).unwrap() as f64 * 1e-3);
        }
    }
    median(t)
}

fn measure_ceilings(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, key_rows: usize) -> Ceilings {
    let module = dsa_indexer_bwd::lab::load_module(ctx).unwrap();
    let f = |name: &str| -> CudaFunction { module.load_function(name).unwrap() };
    let sms = ctx.attribute(dsa_indexer_bwd::cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).unwrap() as u32;
    let runs = 10;
    // SAFETY (all launches below): buffers sized for what each ceiling
    // kernel documents; row ids drawn in range.
    let launch = |func: &CudaFunction, grid: u32, block: u32, smem: u32, p: &CeilParams| unsafe {
        gpu::launch(stream, func, grid, block, smem, p).unwrap()
    };

    // Tensor cores (the instruction the row kernel uses).
    let (grid, block, iters) = (sms * 4, 256u32, 4096u32);
    let mut sink = stream.alloc_zeros::<f32>((grid * block) as usize).unwrap();
    let mma = f(CEIL_MMA.name);
    let t = {
        let (a, _g) = sink.device_ptr_mut(stream);
        let p = CeilParams {
            a,
            iters,
            ..Default::default()
        };
        time_kernel(ctx, stream, runs, || launch(&mma, grid, block, 0, &p))
    };
    let mma_flops = (grid * block / 32) as f64
        * iters as f64
        * CEIL_MMA_CHAINS as f64
        * (2 * 16 * 8 * 16) as f64
        / t;

    // Scattered rows into an L2-resident accumulator, gathered rows.
    let n = 1usize << 20;
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let idx: Vec<i32> = (0..n)
        .map(|_| rng.random_range(0..key_rows as i32))
        .collect();
    let idx = stream.clone_htod(&idx).unwrap();
    let mut acc = stream
        .alloc_zeros::<f32>(key_rows * CEIL_ROW as usize)
        .unwrap();
    let src = stream
        .alloc_zeros::<u16>(key_rows * CEIL_ROW as usize)
        .unwrap();
    let row_bytes = (CEIL_ROW * 4) as f64;
    let (ip, _gi) = idx.device_ptr(stream);
    let (sp, _gs) = src.device_ptr(stream);
    let (scatter_red, scatter_bulk, gather) = {
        let (ap, _ga) = acc.device_ptr_mut(stream);
        let p = CeilParams {
            a: ap,
            b: sp,
            idx: ip,
            n: n as u64,
            ..Default::default()
        };
        let red = f(CEIL_SCATTER_RED.name);
        let t_red = time_kernel(ctx, stream, runs, || launch(&red, sms * 8, 256, 0, &p));
        let bulk = f(CEIL_SCATTER_BULK.name);
        let t_bulk = time_kernel(ctx, stream, runs, || {
            launch(&bulk, sms * 8, CEIL_BULK_THREADS, CEIL_BULK_SMEM_BYTES, &p)
        });
        let gat = f(CEIL_GATHER.name);
        let mut chk = stream.alloc_zeros::<u32>((sms * 8 * 256) as usize).unwrap();
        let (cp, _gc) = chk.device_ptr_mut(stream);
        let pg = CeilParams { a: cp, ..p };
        let t_gat = time_kernel(ctx, stream, runs, || launch(&gat, sms * 8, 256, 0, &pg));
        (
            n as f64 * row_bytes / t_red,
            n as f64 * row_bytes / t_bulk,
            n as f64 * row_bytes / 2.0 / t_gat,
        )
    };

    // Copy: 512 MiB each way.
    let vecs = (512usize << 20) / 16;
    let from = stream.alloc_zeros::<u32>(vecs * 4).unwrap();
    let mut to = stream.alloc_zeros::<u32>(vecs * 4).unwrap();
    let copy = {
        let (b, _gb) = from.device_ptr(stream);
        let (a, _ga) = to.device_ptr_mut(stream);
        let p = CeilParams {
            a,
            b,
            n: vecs as u64,
            ..Default::default()
        };
        let c = f(CEIL_COPY.name);
        let t = time_kernel(ctx, stream, runs, || launch(&c, sms * 16, 256, 0, &p));
        2.0 * (vecs * 16) as f64 / t
    };
    // Per-slot traffic of the gradient kernels: the same 2^20 slots,
    // gathering, reducing, both.
    // The parameters of a ceiling over the 2^20 row ids, mode `iters`,
    // destination `a`.
    let over_ids = |a: u64, iters: u32| CeilParams {
        a,
        b: sp,
        idx: ip,
        n: n as u64,
        iters,
        ..Default::default()
    };
    let (slots_gather, slots_reduce, slots_both) = {
        let (ap, _ga) = acc.device_ptr_mut(stream);
        let mix = f(CEIL_GATHER_REDUCE.name);
        let rate = |mode: u32| {
            let p = over_ids(ap, mode);
            n as f64 / time_kernel(ctx, stream, runs, || launch(&mix, sms * 8, 256, 0, &p))
        };
        (
            rate(CEIL_MIX_GATHER),
            rate(CEIL_MIX_REDUCE),
            rate(CEIL_MIX_GATHER | CEIL_MIX_REDUCE),
        )
    };
    // Gathered rows streamed through a shared-memory ring, 64-row stages
    // as the forward's chunks: cp.async, cp.async with the proxy fence a
    // wgmma consumer needs, TMA row boxes. Printed only.
    {
        let map = dsa_indexer_bwd::lab::row_gather_map(sp, key_rows as u64, CEIL_ROW).unwrap();
        let (grid, block) = (sms * 2, CEIL_STREAM_THREADS);
        let mut words = map.to_vec();
        words.resize(16 + (grid * block) as usize / 2, 0);
        let mut out = stream.clone_htod(&words).unwrap();
        let (ap, _ga) = out.device_ptr_mut(stream);
        let g = f(CEIL_GATHER_STREAM.name);
        gpu::set_dynamic_smem(&g, CEIL_STREAM_SMEM).unwrap();
        // Every chunk of 64 ids within the CTAs' share.
        assert!(n as u32 / CEIL_STREAM_ROWS <= grid * CEIL_STREAM_MAX_CHUNKS);
        let rate = |mode: u32| {
            let p = over_ids(ap, mode);
            n as f64
                / time_kernel(ctx, stream, runs, || {
                    launch(&g, grid, block, CEIL_STREAM_SMEM, &p)
                })
        };
        let (plain, fenced, tma) = (rate(0), rate(CEIL_STREAM_FENCE), rate(CEIL_STREAM_TMA));
        println!(
            "Gathered 256-byte rows through a ring of {CEIL_STREAM_STAGES} 64-row stages ({} CTAs of {block}): cp.async {:.2} G rows/s, cp.async with fence.proxy.async {:.2} G rows/s, TMA row boxes {:.2} G rows/s.",
            grid,
            plain / 1e9,
            fenced / 1e9,
            tma / 1e9
        );
    }
    Ceilings {
        mma_flops,
        scatter_red,
        scatter_bulk,
        gather,
        copy,
        slots_gather,
        slots_reduce,
        slots_both,
    }
}

/// `--markdown FILE` and `--plot FILE.svg`.
fn write_reports(cli: &Cli, gpu: &str, ceil: &Ceilings, points: &[Point]) -> Res<()> {
    if let Some(f) = &cli.page {
        let source = cli
            .from_json
            .as_ref()
            .ok_or("--page: only with --from-json (the page names its JSON lines)")?;
        let chart = cli.plot.as_ref().map(|p| p.display().to_string());
        let page = benchmark_page(
            &source.display().to_string(),
            chart.as_deref(),
            gpu,
            ceil,
            points,
        );
        std::fs::write(f, page).map_err(|e| format!("--page {}: {e}", f.display()))?;
    }
    if let Some(f) = &cli.markdown {
        std::fs::write(f, markdown(points, gpu, ceil))
            .map_err(|e| format!("--markdown {}: {e}", f.display()))?;
    }
    if let Some(f) = &cli.plot {
        let name = f.display().to_string();
        plot(&name, points, ceil).map_err(|e| format!("--plot {name}: {e}"))?;
        eprintln!("wrote {name}");
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let done = if let Some(f) = &cli.from_json {
        // Re-render the reports of an earlier GPU run from its JSON lines.
        std::fs::read_to_string(f)
            .map_err(|e| format!("--from-json {}: {e}", f.display()))
            .and_then(|text| parse_json_lines(&text))
            .and_then(|(gpu, ceil, points)| write_reports(&cli, &gpu, &ceil, &points))
    } else if let Some(input) = &cli.input {
        run_input(&cli, input)
    } else if let Some(input) = &cli.dense_input {
        run_dense_input(&cli, input)
    } else if !cli.dense.is_empty() {
        run_dense(&cli)
    } else {
        run_workload(&cli)
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("indexer-bench: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Dense mode (`--dense`): the whole `execute` per sequence length, by
/// CUDA events around each call (the logits restored before each, outside
/// the events), median, min and p90 of `--runs` after `--warmup`.
fn run_dense(cli: &Cli) -> Res<()> {
    if dsa_indexer_bwd::cuda_device_count() == 0 {
        println!("indexer-bench: skipped: no CUDA device");
        return Ok(());
    }
    let ctx = CudaContext::new(0).map_err(|e| format!("device 0: {e}"))?;
    let stream = ctx.default_stream();
    let (h, d) = (cli.heads[0], cli.dim[0]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(cli.seed);
    let opts = Options {
        deterministic: cli.deterministic,
        ..Options::default()
    };
    let mode = if cli.deterministic {
        "deterministic"
    } else {
        "default"
    };
    for &s in &cli.dense {
        let shape = dense::Shape::bshd(1, s, s, h, d);
        let p = DenseProblem::random(&mut rng, shape.clone(), opts, 0.0);
        let plan = dense::Plan::new(&ctx, shape, opts).map_err(|e| format!("dense plan: {e}"))?;
        let mut dev = DenseDevice::upload(&stream, &p, plan.workspace_bytes());
        let t = time_dense(&ctx, &stream, &plan, &mut dev, &p.logits, p.loss_coeff, cli)?;
        println!(
            "dense causal B=1 S={s} H={h} D={d} f32 dK, {mode} mode: median {:.0} us, min {:.0}, \
             p90 {:.0} ({} runs)",
            t.median, t.min, t.p90, t.runs
        );
    }
    Ok(())
}

/// Median, min and p90 of some times (us), and how many.
struct Spread {
    median: f64,
    min: f64,
    p90: f64,
    runs: usize,
}

impl Spread {
    /// Of `v` (not empty).
    fn of(mut v: Vec<f64>) -> Spread {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        Spread {
            median: v[n / 2],
            min: v[0],
            p90: v[(n * 9 / 10).min(n - 1)],
            runs: n,
        }
    }
}

/// Times dense `plan` on `dev`: CUDA events around each `execute`,
/// `logits` copied into `index_score` before each run outside the events,
/// `--runs` (at least 1) after `--warmup`.
fn time_dense(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    plan: &dense::Plan,
    dev: &mut DenseDevice,
    logits: &[f32],
    loss_coeff: f32,
    cli: &Cli,
) -> Res<Spread> {
    let ev = |_| {
        ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| e.to_string())
    };
    let (start, end) = (ev(0)?, ev(1)?);
    let mut us = Vec::new();
    for i in 0..cli.warmup + cli.runs.max(1) {
        dev.reset_index_score(stream, logits);
        start.record(stream).map_err(|e| e.to_string())?;
        dev.execute(plan, stream, loss_coeff)
            .map_err(|e| format!("dense execute: {e}"))?;
        end.record(stream).map_err(|e| e.to_string())?;
        end.synchronize().map_err(|e| e.to_string())?;
        let t = start.elapsed_ms(&end).map_err(|e| e.to_string())? as f64 * 1e3;
        if i >= cli.warmup {
            us.push(t);
        }
    }
    Ok(Spread::of(us))
}

/// The options of `--dense-input`, from the flags alone, and `loss_coeff`.
fn dense_options(cli: &Cli) -> Res<(Options, f32)> {
    let opts = Options {
        sm_scale: cli.sm_scale.unwrap_or(1.0),
        d_index_k: match cli.dk[..] {
            [] => GradDtype::F32,
            [d] => d.grad(),
            _ => return Err("--dense-input takes one --dk".into()),
        },
        d_weights: cli.dw.map_or(GradDtype::Bf16, DtypeArg::grad),
        ..Options::default()
    };
    Ok((opts, cli.loss_coeff.unwrap_or(1.0)))
}

/// The host view `DenseDevice::upload_host` takes of a file's case.
fn dense_host(case: &DenseCase, grad_loss: f32, loss_coeff: f32) -> HostInputs<'_> {
    HostInputs {
        index_q: &case.index_q,
        weights: &case.weights,
        index_k: &case.index_k,
        attn_score: &case.attn_score,
        attn_l1norm: &case.attn_l1norm,
        index_score: &case.index_score,
        index_lse: &case.index_lse,
        grad_loss,
        loss_coeff,
    }
}

/// `--dense-input`: times dense mode on the file's tensors, prints a
/// summary and a JSON line, writes the outputs of one more run to
/// `--output`. Progress and notes go to stderr.
fn run_dense_input(cli: &Cli, input: &std::path::Path) -> Res<()> {
    let inp = input.display().to_string();
    std::fs::metadata(input).map_err(|e| format!("{inp}: {e}"))?;
    let out_file = match &cli.output {
        Some(o) => Some(OutFile::create(o, input)?),
        None => None,
    };
    let case = read_dense_case(input, cli.ratio)?;
    if !case.unread.is_empty() {
        eprintln!(
            "note: {inp} also holds {} (not read)",
            case.unread.join(", ")
        );
    }
    let (opts, loss_coeff) = dense_options(cli)?;
    let (grad_loss, from) = case.grad_loss(cli.grad_loss, &inp)?;
    let shape = &case.shape;
    eprintln!("{shape:?} {opts:?}; grad_loss {grad_loss} ({from}), loss_coeff {loss_coeff}");
    if dsa_indexer_bwd::cuda_device_count() == 0 {
        return Err(format!(
            "{inp}: no CUDA device: --dense-input times the GPU"
        ));
    }
    let ctx = CudaContext::new(0).map_err(|e| format!("device 0: {e}"))?;
    let stream = ctx.default_stream();
    let gpu_name = ctx.name().map_err(|e| e.to_string())?;
    let plan = dense::Plan::new(&ctx, shape.clone(), opts)
        .map_err(|e| format!("{inp}: dense plan: {e}"))?;
    if !plan.on_gpu() {
        return Err(format!(
            "{inp}: the dense plan does not run on this GPU or shape"
        ));
    }
    let x = dense_host(&case, grad_loss, loss_coeff);
    let mut dev = DenseDevice::upload_host(&stream, shape, &x, plan.workspace_bytes());
    let t = time_dense(
        &ctx,
        &stream,
        &plan,
        &mut dev,
        &case.index_score,
        loss_coeff,
        cli,
    )
    .map_err(|e| format!("{inp}: {e}"))?;
    let line = dense_input_json(&inp, &gpu_name, shape, &opts, cli, &t);
    print_dense_input(cli, &line, shape, &opts, &t)?;
    if let (Some(out_file), Some(out)) = (out_file, &cli.output) {
        let meta = [
            ("input", inp.clone()),
            ("backend", "gpu".to_string()),
            ("mode", "dense".to_string()),
            ("options", format!("{opts:?}")),
            ("ratio", shape.ratio.to_string()),
            ("grad_loss", format!("{grad_loss}")),
            ("loss_coeff", format!("{loss_coeff}")),
            ("median_us", format!("{:.1}", t.median)),
        ];
        let r = dense_final_run(&stream, &plan, &mut dev, &case.index_score, loss_coeff)
            .map_err(|e| format!("{inp}: {e}"))?;
        let out_name = out.display().to_string();
        out_file.commit(&serialize_dense_outputs(shape, &r, &meta, &out_name)?)?;
        eprintln!("wrote {out_name}");
    }
    Ok(())
}

/// The summary line and the JSON `line` of `--dense-input` on stdout,
/// the JSON line also to `--json`.
fn print_dense_input(
    cli: &Cli,
    line: &str,
    shape: &dense::Shape,
    opts: &Options,
    t: &Spread,
) -> Res<()> {
    println!(
        "dense {} rows {} key rows {} cols {} H={} D={} ratio {} dK {}: median {:.1} us, min {:.1}, p90 {:.1} ({} runs)",
        layout_name(shape), shape.rows(), shape.key_rows(), shape.score_cols(), shape.heads,
        shape.head_dim, shape.ratio, dk_name(opts.d_index_k), t.median, t.min, t.p90, t.runs
    );
    println!("{line}");
    if let Some(f) = &cli.json {
        std::fs::write(f, format!("{line}\n"))
            .map_err(|e| format!("--json {}: {e}", f.display()))?;
    }
    Ok(())
}

/// One more run of `plan` on `dev` (logits restored first), its outputs
/// on the host in the plan's types.
fn dense_final_run(
    stream: &Arc<CudaStream>,
    plan: &dense::Plan,
    dev: &mut DenseDevice,
    logits: &[f32],
    loss_coeff: f32,
) -> Res<HostResult> {
    let opts = *plan.options();
    dev.reset_index_score(stream, logits);
    dev.execute(plan, stream, loss_coeff)
        .map_err(|e| format!("dense execute: {e}"))?;
    stream
        .synchronize()
        .map_err(|e| format!("synchronize: {e}"))?;
    let o = dev.download(stream, &opts);
    Ok(HostResult {
        grad_signal: o.grad_signal,
        d_index_q: o.d_index_q,
        d_weights: grad_vec(&o.d_weights, opts.d_weights),
        d_index_k: grad_vec(&o.d_index_k, opts.d_index_k),
        backend: "gpu",
    })
}

fn layout_name(s: &dense::Shape) -> &'static str {
    match s.layout {
        Layout::Bshd { .. } => "bshd",
        Layout::Varlen { .. } => "packed",
    }
}

/// The JSON line of `--dense-input` (`"kind":"dense_input"`): the shape,
/// the options, the times, and TFLOP/s at 6 x (visible columns) x H x D.
fn dense_input_json(
    inp: &str,
    gpu: &str,
    s: &dense::Shape,
    opts: &Options,
    cli: &Cli,
    t: &Spread,
) -> String {
    let visible: usize = (0..s.rows()).map(|r| s.row(r).visible).sum();
    let flop = 6.0 * visible as f64 * (s.heads * s.head_dim) as f64;
    serde_json::json!({
        "kind": "dense_input",
        "file": inp,
        "gpu": gpu,
        "layout": layout_name(s),
        "batch": s.batch(),
        "rows": s.rows(),
        "key_rows": s.key_rows(),
        "score_cols": s.score_cols(),
        "heads": s.heads,
        "dim": s.head_dim,
        "ratio": s.ratio,
        "q_offset": s.q_offset,
        "dk": dk_name(opts.d_index_k),
        "dw": dk_name(opts.d_weights),
        "runs": t.runs,
        "warmup": cli.warmup,
        "median_us": round1(t.median),
        "min_us": round1(t.min),
        "p90_us": round1(t.p90),
        "visible": visible,
        "tflops": json_num(flop / (t.median * 1e-6) / 1e12, 1).parse::<f64>().ok(),
    })
    .to_string()
}

/// Whole-`execute` times of one problem on the device.
struct Timing {
    /// Medians per stage; `total_us` the median of the whole.
    stages: StageTimes,
    min_us: f64,
    p90_us: f64,
}

/// Runs `plan` `warmup + runs` times on `d`, restoring `attn_score` (which
/// execute overwrites with grad_signal) from `p` before each run, and
/// times the timed runs with the plan's stage events.
fn time_execute(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    plan: &Plan,
    d: &mut DeviceProblem,
    p: &Problem,
    warmup: usize,
    runs: usize,
) -> Res<Timing> {
    let ev = StageEvents::new(ctx).map_err(|e| e.to_string())?;
    let mut st = Vec::new();
    for i in 0..warmup + runs {
        d.reset_targets(stream, p);
        d.execute_profiled(plan, stream, p.loss_coeff, &ev)
            .map_err(|e| format!("execute: {e}"))?;
        let times = ev.times().map_err(|e| e.to_string())?;
        if i >= warmup {
            st.push(times);
        }
    }
    let tot = Spread::of(st.iter().map(|s| s.total_us).collect());
    let med = |f: fn(&StageTimes) -> f64| median(st.iter().map(f).collect());
    Ok(Timing {
        stages: StageTimes {
            zeroing_us: med(|s| s.zeroing_us),
            gradients_us: med(|s| s.gradients_us),
            cast_us: med(|s| s.cast_us),
            total_us: tot.median,
        },
        min_us: tot.min,
        p90_us: tot.p90,
    })
}

/// A problem of the workload with SPEC's ids of kind `ids` (continuous
/// values, normalised target and predict rows).
fn make_problem(rng: &mut impl Rng, shape: Shape, ids: IdKind) -> Problem {
    let g = Gen {
        values: Values::Continuous,
        padding: Padding::NegOne,
        short_rows: 0.0,
        trailing: false,
        duplicates: false,
        masked: 0.0,
    };
    // "uniform": topk distinct keys of all S_k in random slot order.
    let mut p = Problem::random(rng, shape, Options::default(), g);
    match ids {
        IdKind::Uniform => {}
        IdKind::Ragged => p.make_ragged(rng),
        IdKind::Topk => {
            p.make_topk(rng);
        }
    }
    p
}

/// The workload of a headline point with `ids`: top-k-of-scores ids at
/// S_k = max(S_k, S_q) (SPEC, "Performance workload"), the others as given.
fn headline(w: Workload, ids: IdKind) -> Workload {
    match ids {
        IdKind::Topk => Workload {
            seq_k: w.seq_k.max(w.seq_q),
            ..w
        },
        IdKind::Uniform | IdKind::Ragged => w,
    }
}

/// The points to measure: (workload, topk, ids), for each heads x head
/// dimension of the command line in turn.
fn cases(cli: &Cli) -> Vec<(Workload, usize, IdKind)> {
    let mut out = Vec::new();
    for &heads in &cli.heads {
        for &dim in &cli.dim {
            if cli.long_context != LongContext::Only {
                let w = Workload {
                    seq_q: cli.seq_q,
                    seq_k: cli.seq_k,
                    heads,
                    dim,
                };
                for &topk in &cli.topk {
                    for &ids in &cli.ids {
                        out.push((headline(w, ids), topk, ids));
                    }
                }
            }
            if cli.long_context != LongContext::Off {
                for &seq_k in &cli.long_seq_k {
                    let w = Workload {
                        seq_q: cli.long_seq_q,
                        seq_k,
                        heads,
                        dim,
                    };
                    for &ids in &cli.long_ids {
                        out.push((w, cli.long_topk, ids));
                    }
                }
            }
        }
    }
    out
}

fn run_workload(cli: &Cli) -> Res<()> {
    let runs = cli.runs.max(1);
    let dks: Vec<GradDtype> = if cli.dk.is_empty() {
        vec![GradDtype::F32, GradDtype::Bf16]
    } else {
        cli.dk.iter().map(|d| d.grad()).collect()
    };
    let cases = cases(cli);
    if dsa_indexer_bwd::cuda_device_count() == 0 {
        println!("indexer-bench: skipped: no CUDA device");
        return Ok(());
    }
    let ctx = CudaContext::new(0).map_err(|e| format!("device 0: {e}"))?;
    let stream = ctx.default_stream();
    let gpu_name = ctx.name().map_err(|e| e.to_string())?;
    eprintln!("measuring ceilings...");
    let ceil = measure_ceilings(&ctx, &stream, cli.seq_k);
    let scatter_ceiling = ceil.scatter_bulk.max(ceil.scatter_red);
    println!(
        "GPU {gpu_name}; B=1 H={:?} D={:?}; {runs} runs after {} warm-ups",
        cli.heads, cli.dim, cli.warmup
    );
    println!(
        "ceilings: mma.sync bf16 {:.0} TFLOP/s | scattered f32 rows: red {:.2} TB/s, bulk {:.2} TB/s | gathered bf16 rows {:.2} TB/s | copy {:.2} TB/s | slots: gather {:.2} G/s, reduce {:.2} G/s, both {:.2} G/s",
        ceil.mma_flops / 1e12,
        ceil.scatter_red / 1e12,
        ceil.scatter_bulk / 1e12,
        ceil.gather / 1e12,
        ceil.copy / 1e12,
        ceil.slots_gather / 1e9,
        ceil.slots_reduce / 1e9,
        ceil.slots_both / 1e9
    );
    let ceil_line = ceilings_json(&gpu_name, &ceil);
    println!("{ceil_line}");

    let total = cases.len() * dks.len();
    let mut points = Vec::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(cli.seed);
    for (w, topk, ids) in cases {
        let shape = Shape {
            batch: 1,
            seq_q: w.seq_q,
            seq_k: w.seq_k,
            heads: w.heads,
            head_dim: w.dim,
            topk,
        };
        let mut p = make_problem(&mut rng, shape, ids);
        let stats = IdStats::count(&shape, &p.opts, &p.ids);
        let valid = stats.valid_slots;
        for &dk in &dks {
            eprint!(
                "\r[{}/{total}] S_q {} S_k {} topk {topk} {} d_index_k {dk:?}        ",
                points.len() + 1,
                w.seq_q,
                w.seq_k,
                ids.name()
            );
            let opts = Options {
                d_index_k: dk,
                deterministic: cli.deterministic,
                ..Options::default()
            };
            p.opts = opts;
            let plan = Plan::new(&ctx, shape, opts).map_err(|e| format!("plan: {e}"))?;
            let computes = which_computes(plan.kernels(), &p);
            let mut d = DeviceProblem::upload(&stream, &p, plan.workspace_bytes());
            let t = time_execute(&ctx, &stream, &plan, &mut d, &p, cli.warmup, runs)?;
            let secs = t.stages.total_us * 1e-6;
            let flop = 6.0 * valid * (w.heads * w.dim) as f64;
            let bytes = valid * w.dim as f64 * 4.0;
            let (t_mma, t_sc) = (flop / ceil.mma_flops, bytes / scatter_ceiling);
            points.push(Point {
                topk,
                ids: ids.name(),
                workload: w,
                dk,
                median_us: t.stages.total_us,
                min_us: t.min_us,
                p90_us: t.p90_us,
                stages: t.stages,
                tflops: flop / secs / 1e12,
                scatter_gbs: bytes / secs / 1e9,
                bound_us: t_mma.max(t_sc) * 1e6,
                binding: if t_mma > t_sc { "mma" } else { "dK scatter" },
                traffic_us: valid / ceil.slots_both * 1e6,
                stats,
                reductions_per_slot: stats.reductions_per_slot(computes),
            });
        }
    }
    eprintln!();

    if cli.deterministic {
        println!("mode: deterministic (Options::deterministic)");
    }
    print!("{}", markdown(&points, &gpu_name, &ceil));
    let mut json = format!("{ceil_line}\n");
    for p in &points {
        let _ = writeln!(json, "{}", point_json(p));
    }
    print!("{json}");
    if let Some(f) = &cli.json {
        std::fs::write(f, &json).map_err(|e| format!("--json {}: {e}", f.display()))?;
    }
    write_reports(cli, &gpu_name, &ceil, &points)
}

/// A metadata value parsed by `parse`, or `None` when absent; an error
/// names the key.
fn meta<T>(
    m: &HashMap<String, String>,
    key: &str,
    inp: &str,
    parse: impl Fn(&str) -> Option<T>,
) -> Res<Option<T>> {
    m.get(key)
        .map(|v| parse(v.trim()).ok_or_else(|| format!("{inp}: metadata {key}: cannot read {v:?}")))
        .transpose()
}

fn dtype_of(v: &str) -> Option<GradDtype> {
    match v {
        "f32" | "float32" => Some(GradDtype::F32),
        "bf16" | "bfloat16" => Some(GradDtype::Bf16),
        _ => None,
    }
}

/// The options of `--input`: flags, else the file's metadata, else defaults.
fn input_options(
    cli: &Cli,
    m: &HashMap<String, String>,
    shape: &Shape,
    inp: &str,
) -> Res<(Options, f32)> {
    let finite = |v: &str| v.parse::<f32>().ok().filter(|x| x.is_finite());
    let opts = Options {
        sm_scale: match cli.sm_scale {
            Some(v) => v,
            None => meta(m, "sm_scale", inp, finite)?.unwrap_or(1.0),
        },
        key_ids: case_key_ids(
            cli.key_ids.map(|k| match k {
                KeyIdsArg::Global => KeyIds::Global,
                KeyIdsArg::Local => KeyIds::Local,
            }),
            m,
            shape,
            inp,
        )?
        .0,
        score: match cli.score {
            Some(ScoreArg::Probs) => ScoreKind::Probs,
            Some(ScoreArg::LogProbs) => ScoreKind::LogProbs,
            None => meta(m, "score", inp, |v| match v {
                "probs" => Some(ScoreKind::Probs),
                "log_probs" | "log-probs" => Some(ScoreKind::LogProbs),
                _ => None,
            })?
            .unwrap_or(ScoreKind::Probs),
        },
        d_index_k: match cli.dk[..] {
            [] => meta(m, "d_index_k", inp, dtype_of)?.unwrap_or(GradDtype::F32),
            [d] => d.grad(),
            _ => return Err("--input takes one --dk".into()),
        },
        d_weights: match cli.dw {
            Some(d) => d.grad(),
            None => meta(m, "d_weights", inp, dtype_of)?.unwrap_or(GradDtype::Bf16),
        },
        ..Options::default()
    };
    let loss_coeff = match cli.loss_coeff {
        Some(v) => v,
        None => meta(m, "loss_coeff", inp, finite)?.unwrap_or(1.0),
    };
    Ok((opts, loss_coeff))
}

/// `--input`: times the file's tensors, prints one JSON line, writes the
/// outputs to `--output`. Progress and notes go to stderr.
fn run_input(cli: &Cli, input: &std::path::Path) -> Res<()> {
    let inp = input.display().to_string();
    std::fs::metadata(input).map_err(|e| format!("{inp}: {e}"))?;
    let out_file = match &cli.output {
        Some(o) => Some(OutFile::create(o, input)?),
        None => None,
    };
    let case = read_case(input)?;
    let shape = case.shape;
    if !case.unread.is_empty() {
        eprintln!(
            "note: {inp} also holds {} (not read)",
            case.unread.join(", ")
        );
    }
    let (opts, loss_coeff) = input_options(cli, &case.metadata, &shape, &inp)?;
    let (grad_loss, from) = case.grad_loss(cli.grad_loss, &inp)?;
    eprintln!(
        "{}",
        check_ids(&shape, &opts, &case.topk_indices, false, &inp)?
    );
    for w in case.non_finite_warnings(&inp) {
        eprintln!("{w}");
    }
    eprintln!("{shape:?} {opts:?}; grad_loss {grad_loss} ({from}), loss_coeff {loss_coeff}");
    let stats = IdStats::count(&shape, &opts, &case.topk_indices);
    if dsa_indexer_bwd::cuda_device_count() == 0 {
        return Err(format!("{inp}: no CUDA device: --input times the GPU"));
    }
    let ctx = CudaContext::new(0).map_err(|e| format!("device 0: {e}"))?;
    let stream = ctx.default_stream();
    let gpu_name = ctx.name().map_err(|e| e.to_string())?;
    let per_batch = shape.seq_q * shape.topk;
    let valid = case
        .topk_indices
        .iter()
        .enumerate()
        .map(|(i, &id)| opts.resolve(&shape, i / per_batch, id).is_some())
        .collect();
    let p = Problem {
        shape,
        opts,
        q: case.index_q,
        w: case.weights,
        k: case.index_k,
        target: case.attn_score,
        score: case.index_score,
        ids: case.topk_indices,
        valid,
        // i64 ids as the file holds them: the GPU reads them as they are.
        ids64: case.topk_indices_i64,
        grad_loss,
        loss_coeff,
    };
    let plan = Plan::new(&ctx, shape, opts).map_err(|e| format!("{inp}: plan: {e}"))?;
    let computes = which_computes(plan.kernels(), &p);
    let mut d = DeviceProblem::upload(&stream, &p, plan.workspace_bytes());
    let runs = cli.runs.max(1);
    let t = time_execute(&ctx, &stream, &plan, &mut d, &p, cli.warmup, runs)
        .map_err(|e| format!("{inp}: {e}"))?;
    stream
        .synchronize()
        .map_err(|e| format!("{inp}: synchronize: {e}"))?;
    let line = serde_json::json!({
        "kind": "input",
        "file": inp,
        "gpu": gpu_name,
        "batch": shape.batch,
        "seq_q": shape.seq_q,
        "seq_k": shape.seq_k,
        "heads": shape.heads,
        "dim": shape.head_dim,
        "topk": shape.topk,
        "key_ids": if opts.key_ids == KeyIds::Global { "global" } else { "local" },
        "dk": dk_name(opts.d_index_k),
        "dw": dk_name(opts.d_weights),
        "ids_were_i64": case.ids_were_i64,
        "runs": runs,
        "warmup": cli.warmup,
        "median_us": round1(t.stages.total_us),
        "min_us": round1(t.min_us),
        "p90_us": round1(t.p90_us),
        "zeroing_us": round1(t.stages.zeroing_us),
        "gradients_us": round1(t.stages.gradients_us),
        "cast_us": round1(t.stages.cast_us),
        "valid_slots": stats.valid_slots,
        "distinct_keys": stats.distinct_keys,
        "slots_per_key": json_num(stats.slots_per_key(), 3).parse::<f64>().ok(),
        "pair_aligned": json_num(stats.pair_aligned, 4).parse::<f64>().ok(),
        "pair_shared": json_num(stats.pair_shared, 4).parse::<f64>().ok(),
        "union2": json_num(stats.union2, 4).parse::<f64>().ok(),
        "union3": json_num(stats.union3, 4).parse::<f64>().ok(),
        "union4": json_num(stats.union4, 4).parse::<f64>().ok(),
        "union8": json_num(stats.union8, 4).parse::<f64>().ok(),
        "reductions_per_slot": json_num(stats.reductions_per_slot(computes), 4).parse::<f64>().ok(),
        "dk_gbs": round1(stats.valid_slots * shape.head_dim as f64 * 4.0 / (t.stages.total_us * 1e-6) / 1e9),
    })
    .to_string();
    println!("{line}");
    if let Some(f) = &cli.json {
        std::fs::write(f, format!("{line}\n"))
            .map_err(|e| format!("--json {}: {e}", f.display()))?;
    }
    if let (Some(out_file), Some(out)) = (out_file, &cli.output) {
        let o = d.download(&stream, &opts);
        let meta = [
            ("input", inp.clone()),
            ("backend", "gpu".to_string()),
            ("options", format!("{opts:?}")),
            ("grad_loss", format!("{grad_loss}")),
            ("loss_coeff", format!("{loss_coeff}")),
            ("median_us", format!("{:.1}", t.stages.total_us)),
        ];
        let bytes = serialize_outputs(
            &shape,
            &o.grad_signal,
            &o.d_index_q,
            &grad_vec(&o.d_weights, opts.d_weights),
            &grad_vec(&o.d_index_k, opts.d_index_k),
            &meta,
            &out.display().to_string(),
        )?;
        out_file.commit(&bytes)?;
        eprintln!("wrote {}", out.display());
    }
    Ok(())
}

/// `x` to one decimal (JSON).
fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_ids_run_at_as_many_keys_as_queries() {
        let w = Workload {
            seq_q: 8192,
            seq_k: 4096,
            heads: 64,
            dim: 128,
        };
        assert_eq!(headline(w, IdKind::Topk).seq_k, 8192);
        assert_eq!(headline(w, IdKind::Uniform).seq_k, 4096);
        assert_eq!(headline(w, IdKind::Ragged).seq_k, 4096);
        let wide = Workload { seq_k: 16384, ..w };
        assert_eq!(headline(wide, IdKind::Topk).seq_k, 16384);
    }
}
