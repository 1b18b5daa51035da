//! Replays a case dumped from PyTorch: reads SPEC's input tensors by name
//! from a `.safetensors` file, runs the backward (GPU when present, CPU
//! fallback otherwise), writes the outputs to another `.safetensors` file.
//!
//! ```text
//! cargo run --release -p indexer-tests --bin indexer-replay -- IN.safetensors OUT.safetensors
//!     [--ids global|local] [--sm-scale F] [--loss-coeff F] [--grad-loss F]
//!     [--log-score] [--dk f32|bf16] [--dw bf16|f32] [--backend auto|hopper|blackwell]
//!     [--deterministic] [--cpu] [--check] [--trust-ids]
//! ```
//!
//! `--ids`, `--sm-scale` and `--log-score` follow one rule, shared with
//! `indexer-bench --input`: the flag, else the file's metadata (`key_ids`,
//! `sm_scale`, `score`), else the default; with B > 1 the id convention
//! has no default (the flag or the metadata must say it).
//!
//! Inputs: `index_q` bf16 (B,S_q,H,D), `weights` bf16 (B,S_q,H), `index_k`
//! bf16 (B,S_k,D), `attn_score` f32 (B,S_q,topk), `index_score` f32,
//! `topk_indices` i32 or i64 (B,S_q,topk), and optionally `grad_loss` f32
//! of shape (1,) or () (overridden by `--grad-loss`; any other type or
//! shape is an error). Outputs: `grad_signal`, `d_index_q`, `d_weights`,
//! `d_index_k`, with the options and the path that ran in the file's
//! metadata. `--check` also prints the relative error of each output
//! against the f64 CPU reference and where each path has non-finite
//! outputs.
//!
//! Nothing is silent: usage errors (unknown flags, bad values) exit with
//! status 2 and clap's message; every other failure exits with status 1
//! and a message naming the file. The output is written to a temporary
//! file beside OUT, created before anything is computed (so an unwritable
//! location fails at once), and renamed over OUT only when complete: a
//! failed run leaves an existing OUT as it was. OUT may not be IN. Ids that
//! look like the other convention (`io::check_ids`: global ids into another
//! batch's keys, or a batch of local ids with no valid id but its own keys
//! as global ids) are an error unless `--trust-ids`; non-finite input
//! values are counted and reported, then propagate as SPEC says.

use clap::{Parser, ValueEnum};
use dsa_indexer_bwd::cpu::{self, HostInputs};
use dsa_indexer_bwd::oneshot;
use dsa_indexer_bwd::{Backend, GradDtype, KeyIds, Options, ScoreKind, Shape};
use indexer_tests::io::{
    case_key_ids, case_option, check_ids, read_case, serialize_outputs, OutFile, Res,
};
use std::path::PathBuf;
use std::process::ExitCode;

/// Replays a dumped indexer-backward case (SPEC's tensors by name) and
/// writes the gradients to OUT.
#[derive(Parser, Debug)]
#[command(name = "indexer-replay", version)]
struct Cli {
    /// Input .safetensors: index_q, weights, index_k, attn_score,
    /// index_score, topk_indices, and optionally grad_loss (f32, one value).
    input: PathBuf,
    /// Output .safetensors (grad_signal, d_index_q, d_weights, d_index_k);
    /// written beside it first and renamed when complete; must not be IN.
    output: PathBuf,
    /// Convention of topk_indices (default: the file's metadata key_ids;
    /// required for B > 1 when the file does not say; global for B = 1).
    #[arg(long, value_enum)]
    ids: Option<IdsArg>,
    /// Scale of q . k (finite; may be zero or negative; default: the
    /// file's metadata sm_scale, else 1).
    #[arg(long, value_parser = finite, allow_hyphen_values = true)]
    sm_scale: Option<f32>,
    /// Loss coefficient (finite).
    #[arg(long, default_value_t = 1.0, value_parser = finite, allow_hyphen_values = true)]
    loss_coeff: f32,
    /// Upstream gradient of the loss, instead of the file's grad_loss
    /// (default: the file's, else 1.0).
    #[arg(long, value_parser = finite, allow_hyphen_values = true)]
    grad_loss: Option<f32>,
    /// index_score holds log-probabilities (default: the file's metadata
    /// score, "probs" or "log_probs", else probabilities).
    #[arg(long)]
    log_score: bool,
    /// Element type of d_index_k.
    #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
    dk: DtypeArg,
    /// Element type of d_weights.
    #[arg(long, value_enum, default_value_t = DtypeArg::Bf16)]
    dw: DtypeArg,
    /// GPU kernels (ignored on the CPU path).
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    backend: BackendArg,
    /// Deterministic mode (`Options::deterministic`: d_index_k bitwise
    /// reproducible; the Hopper fast path and the CPU).
    #[arg(long)]
    deterministic: bool,
    /// Run on the CPU even when a GPU is present.
    #[arg(long)]
    cpu: bool,
    /// Also compare every output with the f64 CPU reference.
    #[arg(long)]
    check: bool,
    /// Replay the ids as given even when they look like the other convention.
    #[arg(long)]
    trust_ids: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum IdsArg {
    Global,
    Local,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum DtypeArg {
    F32,
    Bf16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    Auto,
    Hopper,
    Blackwell,
}

fn finite(s: &str) -> Result<f32, String> {
    let v: f32 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(format!("{v} is not finite"))
    }
}

impl DtypeArg {
    fn grad(self) -> GradDtype {
        match self {
            DtypeArg::F32 => GradDtype::F32,
            DtypeArg::Bf16 => GradDtype::Bf16,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match replay(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("indexer-replay: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn replay(cli: &Cli) -> Res<()> {
    let input = &cli.input;
    let inp = input.display().to_string();
    // The output location first: nothing is computed for a path that
    // cannot be written.
    std::fs::metadata(input).map_err(|e| format!("{inp}: {e}"))?;
    let out_file = OutFile::create(&cli.output, input)?;
    let case = read_case(input)?;
    let shape = case.shape;
    if !case.unread.is_empty() {
        println!(
            "note: {inp} also holds {} (not read)",
            case.unread.join(", ")
        );
    }
    let (grad_loss, from) = case.grad_loss(cli.grad_loss, &inp)?;
    let m = &case.metadata;
    let ids = cli.ids.map(|i| match i {
        IdsArg::Global => KeyIds::Global,
        IdsArg::Local => KeyIds::Local,
    });
    let (key_ids, ids_from) = case_key_ids(ids, m, &shape, &inp)?;
    let finite = |v: &str| v.parse::<f32>().ok().filter(|x| x.is_finite());
    let (sm_scale, scale_from) = case_option(cli.sm_scale, m, "sm_scale", &inp, finite, Some(1.0))?;
    let log_flag = cli.log_score.then_some(ScoreKind::LogProbs);
    let score_kind = |v: &str| match v {
        "probs" => Some(ScoreKind::Probs),
        "log_probs" | "log-probs" => Some(ScoreKind::LogProbs),
        _ => None,
    };
    let (score, score_from) = case_option(
        log_flag,
        m,
        "score",
        &inp,
        score_kind,
        Some(ScoreKind::Probs),
    )?;
    println!("options from: key_ids {ids_from}, sm_scale {scale_from}, score {score_from}");
    let opts = Options {
        sm_scale,
        key_ids,
        score,
        d_index_k: cli.dk.grad(),
        d_weights: cli.dw.grad(),
        backend: match cli.backend {
            BackendArg::Auto => Backend::Auto,
            BackendArg::Hopper => Backend::Hopper,
            BackendArg::Blackwell => Backend::Blackwell,
        },
        deterministic: cli.deterministic,
    };
    println!(
        "{}",
        check_ids(&shape, &opts, &case.topk_indices, cli.trust_ids, &inp)?
    );
    for w in case.non_finite_warnings(&inp) {
        eprintln!("{w}");
    }
    let x = HostInputs {
        index_q: &case.index_q,
        weights: &case.weights,
        index_k: &case.index_k,
        attn_score: &case.attn_score,
        index_score: &case.index_score,
        topk_indices: &case.topk_indices,
        grad_loss,
        loss_coeff: cli.loss_coeff,
    };
    println!("{shape:?} {opts:?}");
    println!(
        "grad_loss {grad_loss} ({from}), loss_coeff {}",
        cli.loss_coeff
    );
    // i64 ids go to the GPU as the file holds them (no conversion pass);
    // the CPU fallback narrows them the same way `x`'s ids were.
    let r = match &case.topk_indices_i64 {
        Some(ids) => oneshot::run_with_progress(
            &shape,
            &opts,
            &HostInputs {
                topk_indices: ids.as_slice(),
                index_q: x.index_q,
                weights: x.weights,
                index_k: x.index_k,
                attn_score: x.attn_score,
                index_score: x.index_score,
                grad_loss: x.grad_loss,
                loss_coeff: x.loss_coeff,
            },
            !cli.cpu,
            &mut cpu::stderr_progress("cpu"),
        ),
        None => oneshot::run_with_progress(
            &shape,
            &opts,
            &x,
            !cli.cpu,
            &mut cpu::stderr_progress("cpu"),
        ),
    }
    .map_err(|e| format!("{inp}: {e}"))?;
    println!("ran on the {}", r.backend);
    if cli.check {
        check(&shape, &opts, &x, &r, &inp)?;
    }

    let meta = [
        ("input", inp.clone()),
        ("backend", r.backend.to_string()),
        ("options", format!("{opts:?}")),
        ("grad_loss", format!("{grad_loss}")),
        ("loss_coeff", format!("{}", cli.loss_coeff)),
    ];
    let bytes = serialize_outputs(
        &shape,
        &r.grad_signal,
        &r.d_index_q,
        &r.d_weights,
        &r.d_index_k,
        &meta,
        &cli.output.display().to_string(),
    )?;
    out_file.commit(&bytes)?;
    println!("wrote {}", cli.output.display());
    Ok(())
}

/// `--check`: relative errors against the f64 reference, and where each
/// path's outputs are non-finite.
fn check(
    shape: &Shape,
    opts: &Options,
    x: &HostInputs,
    r: &oneshot::HostResult,
    inp: &str,
) -> Res<()> {
    let refr = cpu::reference_with_progress(shape, opts, x, &mut cpu::stderr_progress("reference"))
        .map_err(|e| format!("{inp}: reference: {e}"))?;
    let got = [
        r.grad_signal.iter().map(|&v| v as f64).collect::<Vec<_>>(),
        r.d_index_q.iter().map(|v| v.to_f64()).collect(),
        r.d_weights.to_f64(),
        r.d_index_k.to_f64(),
    ];
    let want = [
        &refr.grad_signal,
        &refr.d_index_q,
        &refr.d_weights,
        &refr.d_index_k,
    ];
    let names = ["grad_signal", "d_index_q", "d_weights", "d_index_k"];
    // The suite's metric (non-finite outputs report infinity).
    let rel: Vec<f64> = got
        .iter()
        .zip(want)
        .map(|(g, w)| indexer_tests::rel_err(g, w))
        .collect();
    println!(
        "rel error vs f64 reference: grad_signal {:.2e} d_index_q {:.2e} d_weights {:.2e} d_index_k {:.2e}",
        rel[0], rel[1], rel[2], rel[3]
    );
    for ((name, g), w) in names.iter().zip(&got).zip(want) {
        let (ng, nw) = (
            g.iter().filter(|v| !v.is_finite()).count(),
            w.iter().filter(|v| !v.is_finite()).count(),
        );
        if ng + nw > 0 {
            let same = g.iter().zip(w).all(|(a, b)| a.is_finite() == b.is_finite());
            println!(
                "{name}: {ng} non-finite elements, reference {nw}; {}",
                if same {
                    "same positions"
                } else {
                    "DIFFERENT positions"
                }
            );
        }
    }
    Ok(())
}
