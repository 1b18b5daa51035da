//! How long building a plan takes: the first plan of a process (which loads
//! the kernel module) and every later one on the same context (which shares
//! it), for sparse or dense plans. A benchmark: it prints numbers and fails
//! only on an error, never on a time.
//!
//! ```text
//! indexer-plans [--kind sparse|dense] [--later 200]
//! ```
//!
//! Run it in a fresh process per measurement, with `CUDA_CACHE_DISABLE=1`
//! for what a cold JIT cache (a fresh container, a read-only home) costs:
//! with the machine code shipped for the GPU, the first plan compiles
//! nothing. `INDEXER_PTX_DIR=<bundle>/ptx` forces the PTX (JIT) path for
//! comparison.
//!
//! Sparse: the first plan is SPEC's shape (B = 1, S_q = 8192, S_k = 4096,
//! H = 64, D = 128, topk 512); the later ones draw S_q, S_k and topk anew
//! each time (a packed variable-length loop), each dropped before the next.
//! Dense: causal (B, S) = (1, 8192), H = 64, D = 128 first; the later ones
//! draw S in 4096..=8192. Then, in either mode: one plan of the other kind
//! on the same context, and one plan after every plan was dropped (the
//! module is unloaded with its last plan and loaded again). Before the
//! first plan, one device buffer is allocated and filled, as a caller's
//! inputs would be (the context's first allocation is timed apart: it sets
//! up the driver's memory pool, whichever call makes it).
//!
//! Prints one line per phase and ends with `plans: ... ok`. Without a GPU
//! it prints `indexer-plans: skipped: no CUDA device` and exits 0.

use clap::{Parser, ValueEnum};
use cudarc::driver::CudaContext;
use dsa_indexer_bwd::{cuda_device_count, dense, loaded_modules, Options, Plan, Shape};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Instant;

/// Which plans to time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Kind {
    /// `Plan::new` (sparse backward).
    Sparse,
    /// `dense::Plan::new` (dense mode).
    Dense,
}

/// Time of plan creation (see the file's docs).
#[derive(Parser, Debug)]
#[command(name = "indexer-plans")]
struct Cli {
    /// Plans to time first.
    #[arg(long, value_enum, default_value_t = Kind::Sparse)]
    kind: Kind,
    /// Later plans on the same context, each of a new shape.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    later: u64,
    /// Seed of the shapes.
    #[arg(long, default_value_t = 2026)]
    seed: u64,
}

/// Microseconds since `t`.
fn us(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

/// The sparse shape of SPEC's workload with `seq_q`, `seq_k` and `topk`.
fn sparse_shape(seq_q: usize, seq_k: usize, topk: usize) -> Shape {
    Shape {
        batch: 1,
        seq_q,
        seq_k,
        heads: 64,
        head_dim: 128,
        topk,
    }
}

/// A causal dense shape of `s` rows and keys.
fn dense_shape(s: usize) -> dense::Shape {
    dense::Shape::bshd(1, s, s, 64, 128)
}

/// Builds one plan of `kind` (a random shape from `rng`, or the first
/// shape when `first`), returns it boxed with its time in microseconds.
fn build(
    ctx: &Arc<CudaContext>,
    kind: Kind,
    rng: &mut StdRng,
    first: bool,
) -> Result<(Box<dyn std::any::Any>, f64, String), dsa_indexer_bwd::Error> {
    let opts = Options::default();
    Ok(match kind {
        Kind::Sparse => {
            let shape = if first {
                sparse_shape(8192, 4096, 512)
            } else {
                let topk = [128, 256, 512, 1024, 2048][rng.random_range(0..5)];
                sparse_shape(
                    rng.random_range(1024..=8192),
                    rng.random_range(2048..=8192),
                    topk,
                )
            };
            let t = Instant::now();
            let plan = Plan::new(ctx, shape, opts)?;
            let dt = us(t);
            let image = plan.module_image().to_string();
            (Box::new(plan), dt, image)
        }
        Kind::Dense => {
            let s = if first {
                8192
            } else {
                rng.random_range(4096..=8192)
            };
            let t = Instant::now();
            let plan = dense::Plan::new(ctx, dense_shape(s), opts)?;
            let dt = us(t);
            let image = plan
                .module_image()
                .map_or("no GPU path".into(), |i| i.to_string());
            (Box::new(plan), dt, image)
        }
    })
}

/// Median, 99th percentile and maximum of `v` (sorted in place).
fn stats(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), v[v.len() - 1])
}

/// The kind's name in the output.
fn name(k: Kind) -> &'static str {
    match k {
        Kind::Sparse => "sparse",
        Kind::Dense => "dense",
    }
}

fn run(cli: &Cli) -> Result<(), dsa_indexer_bwd::Error> {
    let other = match cli.kind {
        Kind::Sparse => Kind::Dense,
        Kind::Dense => Kind::Sparse,
    };
    let mut rng = StdRng::seed_from_u64(cli.seed);
    let cache = std::env::var("CUDA_CACHE_DISABLE").unwrap_or_else(|_| "unset".into());
    let t = Instant::now();
    let ctx = CudaContext::new(0)?;
    println!(
        "context: {:.1} ms ({}, CUDA_CACHE_DISABLE={cache})",
        us(t) / 1e3,
        ctx.name()?
    );
    // A caller holds device buffers before its first plan (its inputs);
    // the context's first allocation and copy set up the driver's memory
    // pool and staging buffers, which are no cost of a plan.
    let t = Instant::now();
    let stream = ctx.default_stream();
    let buffer = stream.clone_htod(&vec![0u32; 1 << 16])?;
    stream.synchronize()?;
    println!(
        "the context's first device allocation and copy (a caller's buffer): {:.2} ms",
        us(t) / 1e3
    );
    let (first, dt, image) = build(&ctx, cli.kind, &mut rng, true)?;
    println!(
        "first {} plan: {:.2} ms ({image}; modules loaded: {})",
        name(cli.kind),
        dt / 1e3,
        loaded_modules()
    );
    let mut times = Vec::new();
    for _ in 0..cli.later {
        let (plan, dt, _) = build(&ctx, cli.kind, &mut rng, false)?;
        drop(plan);
        times.push(dt);
    }
    let (median, p99, max) = stats(&mut times);
    println!(
        "later {} plans: {} shapes, median {median:.1} us, p99 {p99:.1} us, max {max:.1} us (modules loaded: {})",
        name(cli.kind),
        times.len(),
        loaded_modules()
    );
    let (second, dt, image) = build(&ctx, other, &mut rng, true)?;
    println!(
        "first {} plan on the same context: {:.1} us ({image})",
        name(other),
        dt
    );
    drop((first, second));
    drop(buffer);
    let held = loaded_modules();
    let (_again, dt, image) = build(&ctx, cli.kind, &mut rng, true)?;
    println!(
        "{} plan after every plan was dropped (modules held before: {held}): {:.2} ms ({image})",
        name(cli.kind),
        dt / 1e3
    );
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    if cuda_device_count() == 0 {
        println!("indexer-plans: skipped: no CUDA device");
        return;
    }
    match run(&cli) {
        Ok(()) => println!("plans: {} ok", name(cli.kind)),
        Err(e) => {
            eprintln!("indexer-plans: {e}");
            std::process::exit(1);
        }
    }
}
