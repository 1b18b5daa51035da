//! Benchmark of `Plan::execute` on the SPEC workload (B=1, S_q=8192,
//! S_k=4096, H=64, D=128, topk 128..2048, uniform and ragged ids): CUDA-event
//! median, min and p90 of 30 runs after warm-up. Prints a table and JSON lines.
//!
//! `indexer-bench [--seq-q N] [--seq-k N] [--topk 128,256,...] [--runs N] [--dk bf16]`

/// Events that record timestamps (the default `None` disables timing).
const TIMING: dsa_indexer_bwd::cudarc::driver::sys::CUevent_flags =
    dsa_indexer_bwd::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;

use dsa_indexer_bwd::cudarc::driver::CudaContext;
use dsa_indexer_bwd::{GradDtype, Options, Plan, Shape};
use indexer_tests::{DeviceProblem, Gen, Padding, Problem, Values};
use rand::SeedableRng;

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seq_q: usize = arg(&args, "--seq-q").map_or(8192, |v| v.parse().expect("--seq-q"));
    let seq_k: usize = arg(&args, "--seq-k").map_or(4096, |v| v.parse().expect("--seq-k"));
    let runs: usize = arg(&args, "--runs").map_or(30, |v| v.parse().expect("--runs"));
    let topks: Vec<usize> = arg(&args, "--topk")
        .unwrap_or("128,256,512,1024,2048")
        .split(',')
        .map(|v| v.parse().expect("--topk"))
        .collect();
    let dk = if arg(&args, "--dk") == Some("bf16") {
        GradDtype::Bf16
    } else {
        GradDtype::F32
    };
    if dsa_indexer_bwd::cuda_device_count() == 0 {
        println!("indexer-bench: skipped: no CUDA device");
        return;
    }
    let ctx = CudaContext::new(0).expect("device 0");
    let stream = ctx.default_stream();
    println!(
        "GPU {}  B=1 S_q={seq_q} S_k={seq_k} H=64 D=128 d_index_k={dk:?}",
        ctx.name().unwrap()
    );
    println!(
        "{:>6} {:>8} {:>10} {:>10} {:>10} {:>9}",
        "topk", "ids", "median_us", "min_us", "p90_us", "TFLOP/s"
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for &topk in &topks {
        for ragged in [false, true] {
            let shape = Shape {
                batch: 1,
                seq_q,
                seq_k,
                heads: 64,
                head_dim: 128,
                topk,
            };
            let opts = Options {
                d_index_k: dk,
                ..Options::default()
            };
            let g = Gen {
                values: Values::Continuous,
                padding: Padding::NegOne,
                short_rows: 0.0,
                duplicates: false,
                masked: 0.0,
            };
            let mut p = Problem::random(&mut rng, shape, opts, g);
            if ragged {
                for s in 0..seq_q {
                    let n = (s / 2 + 1).min(seq_k);
                    for t in 0..topk {
                        p.ids[s * topk + t] = if t < n { t as i32 } else { -1 };
                    }
                }
            }
            let plan = Plan::new(&ctx, shape, opts).expect("plan");
            let mut d = DeviceProblem::upload(&stream, &p, plan.workspace_bytes());
            let (start, end) = (
                ctx.new_event(Some(TIMING)).unwrap(),
                ctx.new_event(Some(TIMING)).unwrap(),
            );
            let mut t = Vec::new();
            for i in 0..runs + 5 {
                start.record(&stream).unwrap();
                d.execute(&plan, &stream, 1.0).unwrap();
                end.record(&stream).unwrap();
                end.synchronize().unwrap();
                if i >= 5 {
                    t.push(start.elapsed_ms(&end).unwrap() as f64 * 1e3);
                }
            }
            t.sort_by(f64::total_cmp);
            let (med, min, p90) = (t[t.len() / 2], t[0], t[(t.len() * 9) / 10]);
            let flop = 6.0 * seq_q as f64 * topk as f64 * 64.0 * 128.0;
            let ids = if ragged { "ragged" } else { "uniform" };
            println!(
                "{topk:>6} {ids:>8} {med:>10.1} {min:>10.1} {p90:>10.1} {:>9.1}",
                flop / med / 1e6
            );
            println!("{{\"topk\":{topk},\"ids\":\"{ids}\",\"dk\":\"{dk:?}\",\"median_us\":{med:.1},\"min_us\":{min:.1},\"p90_us\":{p90:.1}}}");
        }
    }
}
