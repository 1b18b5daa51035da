//! The forward's benchmark: the sparse forward (`forward::Plan`) on
//! SPEC's workload, and forward plus backward back to back (what one
//! training step of the indexer loss runs), and the dense forward. A
//! benchmark: it prints numbers and fails only on an error, never on a
//! time.
//!
//! ```text
//! indexer-forward-bench [--seq-q 8192] [--seq-k 4096] [--heads 64] [--dim 128]
//!                       [--topk 128,256,512,1024,2048] [--ids uniform,ragged,topk]
//!                       [--kernel auto|portable] [--dense 4096,8192] [--runs 30]
//!                       [--warmup 5] [--seed 1] [--json FILE]
//! ```
//!
//! Ids as `indexer-bench` draws them (`Problem::make_ragged`,
//! `Problem::make_topk`); "topk" ids run at `S_k = S_q` (SPEC). Per point:
//! CUDA-event median, min and p90 of the forward's `execute`, the valid
//! slots, the rate of gathered K bytes (`valid slots x D x 2`) and of
//! tensor-core work (`2 valid slots H D`), and the median of forward then
//! backward (`Plan::execute` on the forward's probabilities, f32 dK) in
//! one event pair. Without a GPU it prints `skipped: no CUDA device`.

use clap::Parser;
use cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream};
use dsa_indexer_bwd::forward::{self, DenseInputs, DenseOutputs, DensePlan, Kernel};
use dsa_indexer_bwd::{cuda_device_count, dense, GradOut, Inputs, Options, Outputs, Plan, Shape};
use indexer_tests::{Gen, Padding, Problem, Values};
use rand::SeedableRng;
use std::io::Write;
use std::sync::Arc;

#[derive(Parser, Debug)]
#[command(name = "indexer-forward-bench")]
struct Cli {
    #[arg(long, default_value_t = 8192)]
    seq_q: usize,
    #[arg(long, default_value_t = 4096)]
    seq_k: usize,
    #[arg(long, default_value_t = 64)]
    heads: usize,
    #[arg(long, default_value_t = 128)]
    dim: usize,
    #[arg(long, value_delimiter = ',', default_value = "128,256,512,1024,2048")]
    topk: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "uniform,ragged,topk")]
    ids: Vec<String>,
    /// `auto` (wgmma on compute capability 9.0) or `portable`.
    #[arg(long, default_value = "auto")]
    kernel: String,
    /// Dense forward points (causal, B = 1, S_q = S_k = each); `--dense`
    /// with no value for none.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "4096,8192")]
    dense: Vec<usize>,
    #[arg(long, default_value_t = 30)]
    runs: usize,
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Appends one JSON line per point.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

type Res<T> = Result<T, String>;

/// Median, min and p90 of `f`'s event-timed runs, in microseconds.
fn time(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    cli: &Cli,
    mut f: impl FnMut() -> Res<()>,
) -> Res<[f64; 3]> {
    let ev = || {
        ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| e.to_string())
    };
    let (a, b) = (ev()?, ev()?);
    let mut t = Vec::new();
    for i in 0..cli.warmup + cli.runs.max(1) {
        a.record(stream).map_err(|e| e.to_string())?;
        f()?;
        b.record(stream).map_err(|e| e.to_string())?;
        b.synchronize().map_err(|e| e.to_string())?;
        if i >= cli.warmup {
            t.push(a.elapsed_ms(&b).map_err(|e| e.to_string())? as f64 * 1e3);
        }
    }
    t.sort_by(f64::total_cmp);
    let p90 = t[((t.len() - 1) as f64 * 0.9).round() as usize];
    Ok([t[t.len() / 2], t[0], p90])
}

fn kernel(cli: &Cli) -> Res<Kernel> {
    match cli.kernel.as_str() {
        "auto" => Ok(Kernel::Auto),
        "portable" => Ok(Kernel::Portable),
        k => Err(format!("--kernel: {k}: expected auto or portable")),
    }
}

fn sparse_point(
    ctx: &Arc<CudaContext>,
    cli: &Cli,
    ids: &str,
    topk: usize,
    json: &mut Option<std::fs::File>,
) -> Res<()> {
    let stream = ctx.default_stream();
    let seq_k = if ids == "topk" { cli.seq_q } else { cli.seq_k };
    let shape = Shape {
        batch: 1,
        seq_q: cli.seq_q,
        seq_k,
        heads: cli.heads,
        head_dim: cli.dim,
        topk,
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(cli.seed);
    let g = Gen {
        values: Values::Continuous,
        padding: Padding::NegOne,
        short_rows: 0.0,
        trailing: false,
        duplicates: false,
        masked: 0.0,
    };
    let mut p = Problem::random(&mut rng, shape, Options::default(), g);
    match ids {
        "uniform" => {}
        "ragged" => p.make_ragged(&mut rng),
        "topk" => {
            p.make_topk(&mut rng);
        }
        other => return Err(format!("--ids: {other}: expected uniform, ragged or topk")),
    }
    let valid = p.ids.iter().filter(|&&i| i >= 0).count();
    let sm_scale = (cli.dim as f32).powf(-0.5);
    let fopts = forward::Options {
        sm_scale,
        kernel: kernel(cli)?,
        ..forward::Options::default()
    };
    let fplan = forward::Plan::new(ctx, shape, fopts).map_err(|e| e.to_string())?;
    let bplan = Plan::new(
        ctx,
        shape,
        Options {
            sm_scale,
            ..Options::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let up = |v: &[dsa_indexer_bwd::bf16]| stream.clone_htod(v).map_err(|e| e.to_string());
    let (q, w, k) = (up(&p.q)?, up(&p.w)?, up(&p.k)?);
    let dids = stream.clone_htod(&p.ids).map_err(|e| e.to_string())?;
    let mut score = stream
        .alloc_zeros::<f32>(shape.slots())
        .map_err(|e| e.to_string())?;
    let mut lse = stream
        .alloc_zeros::<f32>(shape.rows())
        .map_err(|e| e.to_string())?;
    let mut attn = stream.clone_htod(&p.target).map_err(|e| e.to_string())?;
    let gl = stream.clone_htod(&[1.0f32]).map_err(|e| e.to_string())?;
    let mut dq = stream
        .alloc_zeros(shape.q_len())
        .map_err(|e| e.to_string())?;
    let mut dw = stream
        .alloc_zeros(shape.w_len())
        .map_err(|e| e.to_string())?;
    let mut dk = stream
        .alloc_zeros::<f32>(shape.k_len())
        .map_err(|e| e.to_string())?;
    // One forward into `score` and `lse`.
    let forward = |score: &mut CudaSlice<f32>, lse: &mut CudaSlice<f32>| -> Res<()> {
        let x = forward::Inputs {
            index_q: q.as_view(),
            weights: w.as_view(),
            index_k: k.as_view(),
            topk_indices: dids.as_view(),
        };
        let mut o = forward::Outputs {
            index_score: score.as_view_mut(),
            lse: lse.as_view_mut(),
        };
        fplan
            .execute(&stream, &x, &mut o)
            .map_err(|e| e.to_string())
    };
    let fwd_t = time(ctx, &stream, cli, || forward(&mut score, &mut lse))?;
    // Forward then backward (the targets are overwritten by grad_signal
    // each run; the time does not depend on their values).
    let both_t = time(ctx, &stream, cli, || {
        forward(&mut score, &mut lse)?;
        let bx = Inputs {
            index_q: q.as_view(),
            weights: w.as_view(),
            index_k: k.as_view(),
            index_score: score.as_view(),
            topk_indices: dids.as_view(),
            grad_loss: gl.as_view(),
        };
        let mut bo = Outputs {
            attn_score: attn.as_view_mut(),
            d_index_q: dq.as_view_mut(),
            d_weights: GradOut::Bf16(dw.as_view_mut()),
            d_index_k: GradOut::F32(dk.as_view_mut()),
            workspace: None,
        };
        bplan
            .execute(&stream, &bx, &mut bo, 1.0)
            .map_err(|e| e.to_string())
    })?;
    let bytes = valid as f64 * cli.dim as f64 * 2.0;
    let flop = 2.0 * valid as f64 * cli.heads as f64 * cli.dim as f64;
    let line = format!(
        "sparse ids={ids} S_q={} S_k={seq_k} H={} D={} topk={topk} kernel={}: forward median {:.1} us (min {:.1}, p90 {:.1}), valid slots {valid}, K gather {:.2} TB/s, {:.0} TFLOP/s; forward+backward median {:.1} us",
        cli.seq_q,
        cli.heads,
        cli.dim,
        fplan.kernel(),
        fwd_t[0],
        fwd_t[1],
        fwd_t[2],
        bytes / fwd_t[0] * 1e-6,
        flop / fwd_t[0] * 1e-6,
        both_t[0]
    );
    println!("{line}");
    if let Some(f) = json {
        writeln!(
            f,
            "{{\"kind\":\"forward\",\"ids\":\"{ids}\",\"seq_q\":{},\"seq_k\":{seq_k},\"heads\":{},\"dim\":{},\"topk\":{topk},\"kernel\":\"{}\",\"median_us\":{:.2},\"min_us\":{:.2},\"p90_us\":{:.2},\"valid_slots\":{valid},\"fwd_bwd_median_us\":{:.2}}}",
            cli.seq_q, cli.heads, cli.dim, fplan.kernel(), fwd_t[0], fwd_t[1], fwd_t[2], both_t[0]
        )
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn dense_point(
    ctx: &Arc<CudaContext>,
    cli: &Cli,
    s: usize,
    json: &mut Option<std::fs::File>,
) -> Res<()> {
    let stream = ctx.default_stream();
    let shape = dense::Shape::bshd(1, s, s, cli.heads, cli.dim);
    let opts = forward::Options {
        sm_scale: (cli.dim as f32).powf(-0.5),
        kernel: kernel(cli)?,
        ..forward::Options::default()
    };
    let plan = DensePlan::new(ctx, shape.clone(), opts).map_err(|e| e.to_string())?;
    let z = |n: usize| {
        stream
            .alloc_zeros::<dsa_indexer_bwd::bf16>(n)
            .map_err(|e| e.to_string())
    };
    let (q, w, k) = (z(shape.q_len())?, z(shape.w_len())?, z(shape.k_len())?);
    let mut score = stream
        .alloc_zeros::<f32>(shape.score_len())
        .map_err(|e| e.to_string())?;
    let mut lse = stream
        .alloc_zeros::<f32>(shape.rows())
        .map_err(|e| e.to_string())?;
    let t = time(ctx, &stream, cli, || {
        plan.execute(
            &stream,
            &DenseInputs {
                index_q: q.as_view(),
                weights: w.as_view(),
                index_k: k.as_view(),
            },
            &mut DenseOutputs {
                index_score: score.as_view_mut(),
                index_lse: lse.as_view_mut(),
            },
        )
        .map_err(|e| e.to_string())
    })?;
    let pairs = (0..s).map(|r| shape.row(r).visible).sum::<usize>() as f64;
    println!(
        "dense causal S={s} H={} D={} kernel={}: median {:.1} us (min {:.1}, p90 {:.1}), {:.0} TFLOP/s over the causal pairs",
        cli.heads,
        cli.dim,
        plan.kernel(),
        t[0],
        t[1],
        t[2],
        2.0 * pairs * (cli.heads * cli.dim) as f64 / t[0] * 1e-6
    );
    if let Some(f) = json {
        writeln!(
            f,
            "{{\"kind\":\"dense_forward\",\"seq\":{s},\"heads\":{},\"dim\":{},\"kernel\":\"{}\",\"median_us\":{:.2},\"min_us\":{:.2},\"p90_us\":{:.2}}}",
            cli.heads, cli.dim, plan.kernel(), t[0], t[1], t[2]
        )
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    if cuda_device_count() == 0 {
        println!("indexer-forward-bench: skipped: no CUDA device");
        return;
    }
    let run = || -> Res<()> {
        let ctx = CudaContext::new(0).map_err(|e| e.to_string())?;
        println!(
            "GPU {}; runs {} after {} warm-ups",
            ctx.name().unwrap_or_default(),
            cli.runs,
            cli.warmup
        );
        let mut json = match &cli.json {
            Some(p) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| format!("{}: {e}", p.display()))?,
            ),
            None => None,
        };
        for ids in &cli.ids {
            for &topk in &cli.topk {
                sparse_point(&ctx, &cli, ids, topk, &mut json)?;
            }
        }
        for &s in &cli.dense {
            dense_point(&ctx, &cli, s, &mut json)?;
        }
        Ok(())
    };
    if let Err(e) = run() {
        eprintln!("indexer-forward-bench: {e}");
        std::process::exit(1);
    }
}
