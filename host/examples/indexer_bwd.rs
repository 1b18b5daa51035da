//! The main job: builds a random problem of the given shape, runs the
//! backward on the GPU when one is present (CPU fallback otherwise), prints
//! the time and the relative error of every output against the f64 CPU
//! reference.
//!
//! `cargo run --release --example indexer_bwd -- [--batch 1] [--seq-q 4096]
//! [--seq-k 4096] [--heads 64] [--dim 128] [--topk 512] [--iters 20]
//! [--seed 2026] [--cpu]` (`--help` lists them; unknown flags and bad
//! values are usage errors, exit status 2; a problem too large for host
//! memory is an error, exit status 1, not an abort).

/// Events that record timestamps (the default `None` disables timing).
const TIMING: dsa_indexer_bwd::cudarc::driver::sys::CUevent_flags =
    dsa_indexer_bwd::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;

use clap::Parser;
use dsa_indexer_bwd::cpu::{self, HostInputs};
use dsa_indexer_bwd::cudarc::driver::CudaContext;
use dsa_indexer_bwd::{bf16, cuda_device_count, GradOut, Inputs, Options, Outputs, Plan, Shape};
use rand::{Rng, SeedableRng};
use std::time::Instant;

/// Builds a random problem of the given shape, runs the backward on the GPU
/// when one is present (CPU fallback otherwise) and prints the time and
/// the error of every output against the f64 CPU reference.
#[derive(Parser, Debug)]
#[command(name = "indexer_bwd")]
struct Cli {
    /// Batch size B.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    batch: u64,
    /// Query rows per batch, S_q.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..))]
    seq_q: u64,
    /// Key rows per batch, S_k.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..))]
    seq_k: u64,
    /// Heads H (16, 32, 64 or 128).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    heads: u64,
    /// Head dimension D (64 or 128).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..))]
    dim: u64,
    /// Selected keys per query row.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    topk: u64,
    /// Timed GPU runs (after 3 warm-ups).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// Seed of the random problem.
    #[arg(long, default_value_t = 2026)]
    seed: u64,
    /// Run the CPU fallback even when a GPU is present.
    #[arg(long)]
    cpu: bool,
}

/// Fails early when the inputs and the f64 reference clearly cannot fit in
/// the host memory available now (where the system tells: Linux), since
/// an allocation that the kernel grants lazily could otherwise end in the
/// process being killed instead of an error.
fn check_host_memory(s: &Shape) -> Result<(), Box<dyn std::error::Error>> {
    let words = s.q_len() + s.w_len() + s.k_len() + s.slots();
    // bf16 inputs, f32/i32 slot tensors, f64 reference outputs.
    let need =
        (2 * (s.q_len() + s.w_len() + s.k_len()) + 12 * s.slots()) as f64 + 8.0 * words as f64;
    let available = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024.0)
    });
    match available {
        Some(a) if need > a => Err(format!(
            "out of host memory: this problem needs about {:.1} GiB (inputs and the f64 reference), {:.1} GiB available",
            need / f64::from(1u32 << 30),
            a / f64::from(1u32 << 30)
        )
        .into()),
        _ => Ok(()),
    }
}

/// `n` values drawn by `f`, or a typed error when memory runs out.
fn draw<T: Clone + Default>(
    n: usize,
    what: &'static str,
    mut f: impl FnMut() -> T,
) -> Result<Vec<T>, dsa_indexer_bwd::Error> {
    let mut v = cpu::try_vec(n, T::default(), what)?;
    v.iter_mut().for_each(|x| *x = f());
    Ok(v)
}

fn rel(got: impl Iterator<Item = f64>, want: &[f64]) -> f64 {
    let (mut n, mut d) = (0.0, 0.0);
    for (g, &w) in got.zip(want) {
        n += (g - w) * (g - w);
        d += w * w;
    }
    if d == 0.0 {
        n.sqrt()
    } else {
        (n / d).sqrt()
    }
}

/// Prints the relative Frobenius error of each output and the largest.
fn report(label: &str, e: &[f64; 4]) {
    println!(
        "{label}: grad_signal {:.2e} d_index_q {:.2e} d_weights {:.2e} d_index_k {:.2e}; max {:.2e}",
        e[0],
        e[1],
        e[2],
        e[3],
        e.iter().cloned().fold(0.0, f64::max)
    );
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("indexer_bwd: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Result<(), Box<dyn std::error::Error>> {
    let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    let shape = Shape {
        batch: size(cli.batch),
        seq_q: size(cli.seq_q),
        seq_k: size(cli.seq_k),
        heads: size(cli.heads),
        head_dim: size(cli.dim),
        topk: size(cli.topk),
    };
    let iters = size(cli.iters);
    let force_cpu = cli.cpu;
    shape.validate()?;
    let opts = Options::default();
    println!("shape {shape:?}");
    check_host_memory(&shape)?;

    // Random inputs: uniform ids (unique per row), normalised distributions.
    let mut rng = rand::rngs::StdRng::seed_from_u64(cli.seed);
    let mut bfv = |n: usize, what| draw(n, what, || bf16::from_f32(rng.random_range(-1.0f32..1.0)));
    let q = bfv(shape.q_len(), "index_q")?;
    let w = bfv(shape.w_len(), "weights")?;
    let k = bfv(shape.k_len(), "index_k")?;
    let (rows, topk) = (shape.rows(), shape.topk);
    let mut target = cpu::try_vec(rows * topk, 0f32, "attn_score")?;
    let mut score = cpu::try_vec(rows * topk, 0f32, "index_score")?;
    let mut ids = cpu::try_vec(rows * topk, -1i32, "topk_indices")?;
    for r in 0..rows {
        let b = r / shape.seq_q;
        let keys = rand::seq::index::sample(&mut rng, shape.seq_k, topk.min(shape.seq_k));
        for (t, key) in keys.iter().enumerate() {
            ids[r * topk + t] = (b * shape.seq_k + key) as i32;
        }
        for v in [&mut target, &mut score] {
            let row = &mut v[r * topk..(r + 1) * topk];
            row.iter_mut()
                .for_each(|x| *x = rng.random_range(0.01f32..1.0));
            let s: f32 = row.iter().sum();
            row.iter_mut().for_each(|x| *x /= s);
        }
    }
    let host = HostInputs {
        index_q: &q,
        weights: &w,
        index_k: &k,
        attn_score: &target,
        index_score: &score,
        topk_indices: &ids,
        grad_loss: 1.0,
        loss_coeff: 1.0,
    };
    let t0 = Instant::now();
    let reference =
        cpu::reference_with_progress(&shape, &opts, &host, &mut cpu::stderr_progress("reference"))?;
    let ref_ms = t0.elapsed().as_secs_f64() * 1e3;

    if force_cpu || cuda_device_count() == 0 {
        println!(
            "no CUDA device (or --cpu): CPU fallback (f64, {} threads)",
            std::thread::available_parallelism()?.get()
        );
        let mut gs = target.clone();
        let mut dq = cpu::try_vec(shape.q_len(), bf16::ZERO, "d_index_q")?;
        let mut dw = cpu::try_vec(shape.w_len(), bf16::ZERO, "d_weights")?;
        let mut dk = cpu::try_vec(shape.k_len(), 0f32, "d_index_k")?;
        let t0 = Instant::now();
        let out = cpu::HostOutputs {
            attn_score: &mut gs,
            d_index_q: &mut dq,
            d_weights: cpu::HostGrad::Bf16(&mut dw),
            d_index_k: cpu::HostGrad::F32(&mut dk),
        };
        cpu::execute_with_progress(&shape, &opts, &host, out, &mut cpu::stderr_progress("cpu"))?;
        println!("cpu execute: {:.1} ms", t0.elapsed().as_secs_f64() * 1e3);
        let errs = [
            rel(gs.iter().map(|&x| x as f64), &reference.grad_signal),
            rel(dq.iter().map(|x| x.to_f64()), &reference.d_index_q),
            rel(dw.iter().map(|x| x.to_f64()), &reference.d_weights),
            rel(dk.iter().map(|&x| x as f64), &reference.d_index_k),
        ];
        report("rel error vs f64 reference (output rounding only)", &errs);
        return Ok(());
    }

    let ctx = CudaContext::new(0)?;
    println!(
        "GPU: {} (sm_{}{})",
        ctx.name()?,
        ctx.compute_capability()?.0,
        ctx.compute_capability()?.1
    );
    let stream = ctx.default_stream();
    eprintln!("loading kernels");
    let plan = Plan::new(&ctx, shape, opts)?;
    eprintln!("plan ready");
    let d_q = stream.clone_htod(&q)?;
    let d_w = stream.clone_htod(&w)?;
    let d_k = stream.clone_htod(&k)?;
    let d_score = stream.clone_htod(&score)?;
    let d_ids = stream.clone_htod(&ids)?;
    let d_gl = stream.clone_htod(&[1.0f32])?;
    let mut d_attn = stream.clone_htod(&target)?;
    let mut d_dq = stream.alloc_zeros::<bf16>(shape.q_len())?;
    let mut d_dw = stream.alloc_zeros::<bf16>(shape.w_len())?;
    let mut d_dk = stream.alloc_zeros::<f32>(shape.k_len())?;
    let inputs = Inputs {
        index_q: d_q.as_view(),
        weights: d_w.as_view(),
        index_k: d_k.as_view(),
        index_score: d_score.as_view(),
        topk_indices: d_ids.as_view(),
        grad_loss: d_gl.as_view(),
    };
    let mut times = Vec::new();
    let (start, end) = (ctx.new_event(Some(TIMING))?, ctx.new_event(Some(TIMING))?);
    for i in 0..iters + 3 {
        stream.memcpy_htod(&target, &mut d_attn)?;
        let mut outputs = Outputs {
            attn_score: d_attn.as_view_mut(),
            d_index_q: d_dq.as_view_mut(),
            d_weights: GradOut::Bf16(d_dw.as_view_mut()),
            d_index_k: GradOut::F32(d_dk.as_view_mut()),
            workspace: None,
        };
        start.record(&stream)?;
        plan.execute(&stream, &inputs, &mut outputs, 1.0)?;
        end.record(&stream)?;
        end.synchronize()?;
        if i == 0 {
            eprintln!("first execute finished");
        }
        if i >= 3 {
            times.push(start.elapsed_ms(&end)? as f64 * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    let gs = stream.clone_dtoh(&d_attn)?;
    let dq = stream.clone_dtoh(&d_dq)?;
    let dw = stream.clone_dtoh(&d_dw)?;
    let dk = stream.clone_dtoh(&d_dk)?;
    println!("gpu execute: median {:.1} us, min {:.1} us over {iters} runs (CPU f64 reference took {ref_ms:.0} ms)", times[times.len() / 2], times[0]);
    let errs = [
        rel(gs.iter().map(|&x| x as f64), &reference.grad_signal),
        rel(dq.iter().map(|x| x.to_f64()), &reference.d_index_q),
        rel(dw.iter().map(|x| x.to_f64()), &reference.d_weights),
        rel(dk.iter().map(|&x| x as f64), &reference.d_index_k),
    ];
    report("rel error vs f64 reference", &errs);
    Ok(())
}
