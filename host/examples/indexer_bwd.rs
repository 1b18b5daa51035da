//! The main job: builds a random problem of the given shape, runs the
//! backward on the GPU when one is present (CPU fallback otherwise), prints
//! the time and the relative error of every output against the f64 CPU
//! reference.
//!
//! `cargo run --release --example indexer_bwd -- [--batch 1] [--seq-q 4096]
//! [--seq-k 4096] [--heads 64] [--dim 128] [--topk 512] [--iters 20] [--cpu]`

/// Events that record timestamps (the default `None` disables timing).
const TIMING: dsa_indexer_bwd::cudarc::driver::sys::CUevent_flags =
    dsa_indexer_bwd::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;

use dsa_indexer_bwd::cpu::{self, HostInputs};
use dsa_indexer_bwd::cudarc::driver::CudaContext;
use dsa_indexer_bwd::{bf16, cuda_device_count, GradOut, Inputs, Options, Outputs, Plan, Shape};
use rand::{Rng, SeedableRng};
use std::time::Instant;

fn arg(args: &[String], name: &str, default: usize) -> usize {
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                eprintln!("{name} needs a positive integer");
                std::process::exit(2)
            }),
        None => default,
    }
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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let shape = Shape {
        batch: arg(&args, "--batch", 1),
        seq_q: arg(&args, "--seq-q", 4096),
        seq_k: arg(&args, "--seq-k", 4096),
        heads: arg(&args, "--heads", 64),
        head_dim: arg(&args, "--dim", 128),
        topk: arg(&args, "--topk", 512),
    };
    let iters = arg(&args, "--iters", 20).max(1);
    let force_cpu = args.iter().any(|a| a == "--cpu");
    shape.validate()?;
    let opts = Options::default();
    println!("shape {shape:?}");

    // Random inputs: uniform ids (unique per row), normalised distributions.
    let mut rng = rand::rngs::StdRng::seed_from_u64(2026);
    let mut bfv = |n: usize| -> Vec<bf16> {
        (0..n)
            .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
            .collect()
    };
    let (q, w, k) = (bfv(shape.q_len()), bfv(shape.w_len()), bfv(shape.k_len()));
    let (rows, topk) = (shape.rows(), shape.topk);
    let mut target = vec![0f32; rows * topk];
    let mut score = vec![0f32; rows * topk];
    let mut ids = vec![-1i32; rows * topk];
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
    let reference = cpu::reference(&shape, &opts, &host)?;
    let ref_ms = t0.elapsed().as_secs_f64() * 1e3;

    if force_cpu || cuda_device_count() == 0 {
        println!(
            "no CUDA device (or --cpu): CPU fallback (f64, {} threads)",
            std::thread::available_parallelism()?.get()
        );
        let mut gs = target.clone();
        let mut dq = vec![bf16::ZERO; shape.q_len()];
        let mut dw = vec![bf16::ZERO; shape.w_len()];
        let mut dk = vec![0f32; shape.k_len()];
        let t0 = Instant::now();
        let out = cpu::HostOutputs {
            attn_score: &mut gs,
            d_index_q: &mut dq,
            d_weights: cpu::HostGrad::Bf16(&mut dw),
            d_index_k: cpu::HostGrad::F32(&mut dk),
        };
        cpu::execute(&shape, &opts, &host, out)?;
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
