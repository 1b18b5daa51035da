//! `indexer-bench`: the SPEC workload (B=1, S_q=8192, S_k=4096, H=64, D=128,
//! topk 128..2048, uniform and ragged ids, f32 and bf16 `d_index_k`) timed
//! with CUDA events (median, min, p90 of `--runs` after `--warmup`), split
//! by stage, next to this GPU's ceilings measured by the crate's own
//! kernels. Prints a table and JSON lines; `--plot FILE.svg` draws time vs
//! topk; `--markdown FILE` writes the README table.
//!
//! ```text
//! indexer-bench [--seq-q 8192] [--seq-k 4096] [--heads 64] [--dim 128]
//!               [--topk 128,256,512,1024,2048] [--ids uniform,ragged]
//!               [--dk f32,bf16] [--runs 30] [--warmup 5]
//!               [--plot FILE.svg] [--markdown FILE] [--json FILE]
//! indexer-bench --from-json RUN.jsonl [--plot FILE.svg] [--markdown FILE]
//! ```

use dsa_indexer_bwd::cudarc::driver::{
    CudaContext, CudaFunction, CudaStream, DevicePtr, DevicePtrMut,
};
use dsa_indexer_bwd::{gpu, GradDtype, Options, Plan, Shape, StageEvents, StageTimes};
use indexer_tests::report::{
    ceilings_json, markdown, parse_json_lines, plot, point_json, Ceilings, Point,
};
use indexer_tests::{DeviceProblem, Gen, Padding, Problem, Values};
use kernels_gpu::params::*;
use rand::{Rng, SeedableRng};
use std::fmt::Write as _;
use std::sync::Arc;

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn num(args: &[String], name: &str, default: usize) -> usize {
    arg(args, name).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}: not a number: {v}"))
    })
}

fn list<'a>(args: &'a [String], name: &str, default: &'a str) -> Vec<&'a str> {
    arg(args, name).unwrap_or(default).split(',').collect()
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
    let module = gpu::load_module(ctx).unwrap();
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
    let mma = f(CEIL_MMA);
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
        let red = f(CEIL_SCATTER_RED);
        let t_red = time_kernel(ctx, stream, runs, || launch(&red, sms * 8, 256, 0, &p));
        let bulk = f(CEIL_SCATTER_BULK);
        let t_bulk = time_kernel(ctx, stream, runs, || {
            launch(&bulk, sms * 8, CEIL_BULK_THREADS, CEIL_BULK_SMEM_BYTES, &p)
        });
        let gat = f(CEIL_GATHER);
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
        let c = f(CEIL_COPY);
        let t = time_kernel(ctx, stream, runs, || launch(&c, sms * 16, 256, 0, &p));
        2.0 * (vecs * 16) as f64 / t
    };
    // Per-slot traffic of the gradient kernels: the same 2^20 slots,
    // gathering, reducing, both.
    let (slots_gather, slots_reduce, slots_both) = {
        let (ap, _ga) = acc.device_ptr_mut(stream);
        let mix = f(CEIL_GATHER_REDUCE);
        let rate = |mode: u32| {
            let p = CeilParams {
                a: ap,
                b: sp,
                idx: ip,
                n: n as u64,
                iters: mode,
                ..Default::default()
            };
            n as f64 / time_kernel(ctx, stream, runs, || launch(&mix, sms * 8, 256, 0, &p))
        };
        (
            rate(CEIL_MIX_GATHER),
            rate(CEIL_MIX_REDUCE),
            rate(CEIL_MIX_GATHER | CEIL_MIX_REDUCE),
        )
    };
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
fn write_reports(args: &[String], gpu: &str, ceil: &Ceilings, points: &[Point]) {
    if let Some(f) = arg(args, "--markdown") {
        std::fs::write(f, markdown(points, gpu, ceil)).expect("--markdown");
    }
    if let Some(f) = arg(args, "--plot") {
        plot(f, points, ceil).expect("--plot");
        eprintln!("wrote {f}");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(f) = arg(&args, "--from-json") {
        // Re-render the reports of an earlier GPU run from its JSON lines.
        let text = std::fs::read_to_string(f).expect("--from-json");
        let (gpu, ceil, points) = parse_json_lines(&text).expect("--from-json");
        write_reports(&args, &gpu, &ceil, &points);
        return;
    }
    let seq_q = num(&args, "--seq-q", 8192);
    let seq_k = num(&args, "--seq-k", 4096);
    let heads = num(&args, "--heads", 64);
    let dim = num(&args, "--dim", 128);
    let runs = num(&args, "--runs", 30).max(1);
    let warmup = num(&args, "--warmup", 5);
    let topks: Vec<usize> = list(&args, "--topk", "128,256,512,1024,2048")
        .iter()
        .map(|v| v.parse().expect("--topk"))
        .collect();
    let id_kinds = list(&args, "--ids", "uniform,ragged");
    let dks: Vec<GradDtype> = list(&args, "--dk", "f32,bf16")
        .iter()
        .map(|d| {
            if *d == "bf16" {
                GradDtype::Bf16
            } else {
                GradDtype::F32
            }
        })
        .collect();
    if dsa_indexer_bwd::cuda_device_count() == 0 {
        println!("indexer-bench: skipped: no CUDA device");
        return;
    }
    let ctx = CudaContext::new(0).expect("device 0");
    let stream = ctx.default_stream();
    let gpu_name = ctx.name().unwrap();
    eprintln!("measuring ceilings...");
    let ceil = measure_ceilings(&ctx, &stream, seq_k);
    let scatter_ceiling = ceil.scatter_bulk.max(ceil.scatter_red);
    println!("GPU {gpu_name}; workload B=1 S_q={seq_q} S_k={seq_k} H={heads} D={dim}; {runs} runs after {warmup} warm-ups");
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

    let total = topks.len() * id_kinds.len() * dks.len();
    let mut points = Vec::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for &topk in &topks {
        for &ids in &id_kinds {
            let shape = Shape {
                batch: 1,
                seq_q,
                seq_k,
                heads,
                head_dim: dim,
                topk,
            };
            let g = Gen {
                values: Values::Continuous,
                padding: Padding::NegOne,
                short_rows: 0.0,
                trailing: false,
                duplicates: false,
                masked: 0.0,
            };
            let mut p = Problem::random(&mut rng, shape, Options::default(), g);
            let ids: &'static str = if ids == "ragged" {
                p.make_ragged(&mut rng);
                "ragged"
            } else {
                "uniform"
            };
            let valid = p.ids.iter().filter(|&&i| i >= 0).count() as f64;
            for &dk in &dks {
                eprint!(
                    "\r[{}/{total}] topk {topk} {ids} d_index_k {dk:?}        ",
                    points.len() + 1
                );
                let opts = Options {
                    d_index_k: dk,
                    ..Options::default()
                };
                p.opts = opts;
                let plan = Plan::new(&ctx, shape, opts).expect("plan");
                let mut d = DeviceProblem::upload(&stream, &p, plan.workspace_bytes());
                let ev = StageEvents::new(&ctx).unwrap();
                let mut st = Vec::new();
                for i in 0..warmup + runs {
                    // Fresh targets each run (execute overwrites them with grad_signal).
                    d.reset_targets(&stream, &p);
                    d.execute_profiled(&plan, &stream, p.loss_coeff, &ev)
                        .expect("execute");
                    let times = ev.times().unwrap();
                    if i >= warmup {
                        st.push(times);
                    }
                }
                let mut tot: Vec<f64> = st.iter().map(|s| s.total_us).collect();
                tot.sort_by(f64::total_cmp);
                let med = |f: fn(&StageTimes) -> f64| median(st.iter().map(f).collect());
                let stages = StageTimes {
                    zeroing_us: med(|s| s.zeroing_us),
                    gradients_us: med(|s| s.gradients_us),
                    cast_us: med(|s| s.cast_us),
                    total_us: tot[tot.len() / 2],
                };
                let t = stages.total_us * 1e-6;
                let flop = 6.0 * valid * (heads * dim) as f64;
                let bytes = valid * dim as f64 * 4.0;
                let (t_mma, t_sc) = (flop / ceil.mma_flops, bytes / scatter_ceiling);
                points.push(Point {
                    topk,
                    ids,
                    dk,
                    median_us: stages.total_us,
                    min_us: tot[0],
                    p90_us: tot[(tot.len() * 9 / 10).min(tot.len() - 1)],
                    stages,
                    tflops: flop / t / 1e12,
                    scatter_gbs: bytes / t / 1e9,
                    bound_us: t_mma.max(t_sc) * 1e6,
                    binding: if t_mma > t_sc { "mma" } else { "dK scatter" },
                    traffic_us: valid / ceil.slots_both * 1e6,
                });
            }
        }
    }
    eprintln!();

    print!("{}", markdown(&points, &gpu_name, &ceil));
    let mut json = format!("{ceil_line}\n");
    for p in &points {
        let _ = writeln!(json, "{}", point_json(p));
    }
    print!("{json}");
    if let Some(f) = arg(&args, "--json") {
        std::fs::write(f, &json).expect("--json");
    }
    write_reports(&args, &gpu_name, &ceil, &points);
}
