//! Replays a dense-mode case: reads the dense tensors by name from a
//! `.safetensors` file, runs the dense backward and writes the outputs to
//! another `.safetensors` file with `dense::run`: on GPU 0 where the dense
//! plan runs there (`dense::Plan::on_gpu`; compute capability 9.0), else
//! on the CPU. It prints which (`ran on the gpu` / `ran on the cpu`) and
//! stores it as the output's `backend` metadata. (`indexer-bench
//! --dense-input` times the GPU path on such a file.)
//!
//! ```text
//! cargo run --release -p indexer-tests --bin indexer-dense-replay -- IN.safetensors OUT.safetensors
//!     [--ratio N] [--sm-scale F] [--loss-coeff F] [--grad-loss F] [--dk f32|bf16] [--dw bf16|f32]
//! ```
//!
//! Inputs (BSHD or packed with `cu_seqlens_q`/`cu_seqlens_k`, optional
//! `q_offset` and `grad_loss`) and outputs: `indexer_tests::dense_io`.
//! Usage errors exit with status 2, every other failure with status 1 and
//! a message naming the file; the output is written beside OUT and renamed
//! over it when complete; OUT may not be IN. `--sm-scale` follows the rule
//! of `indexer-replay`: the flag, else the file's metadata `sm_scale`, else
//! 1. Non-finite input values are counted and reported, then propagate.

use clap::{Parser, ValueEnum};
use dsa_indexer_bwd::cpu::stderr_progress;
use dsa_indexer_bwd::dense::{self, cpu::HostInputs};
use dsa_indexer_bwd::{GradDtype, Options};
use indexer_tests::dense_io::{read_dense_case, serialize_dense_outputs};
use indexer_tests::io::{case_option, OutFile, Res};
use std::path::PathBuf;
use std::process::ExitCode;

/// Replays a dumped dense indexer-backward case and writes the gradients
/// to OUT (on GPU 0 where the dense plan runs there, else on the CPU).
#[derive(Parser, Debug)]
#[command(name = "indexer-dense-replay", version)]
struct Cli {
    /// Input .safetensors: index_q, weights, index_k, attn_score,
    /// attn_l1norm, index_score, index_lse; cu_seqlens_q and cu_seqlens_k
    /// when packed; optionally q_offset and grad_loss.
    input: PathBuf,
    /// Output .safetensors (grad_signal, d_index_q, d_weights, d_index_k).
    output: PathBuf,
    /// Key compression ratio (>= 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..), allow_hyphen_values = true)]
    ratio: u32,
    /// Scale of q . k (finite; default: the file's metadata sm_scale,
    /// else 1).
    #[arg(long, value_parser = finite, allow_hyphen_values = true)]
    sm_scale: Option<f32>,
    /// Loss coefficient (finite).
    #[arg(long, default_value_t = 1.0, value_parser = finite, allow_hyphen_values = true)]
    loss_coeff: f32,
    /// Upstream gradient of the loss, instead of the file's grad_loss
    /// (default: the file's, else 1.0).
    #[arg(long, value_parser = finite, allow_hyphen_values = true)]
    grad_loss: Option<f32>,
    /// Element type of d_index_k.
    #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
    dk: DtypeArg,
    /// Element type of d_weights.
    #[arg(long, value_enum, default_value_t = DtypeArg::Bf16)]
    dw: DtypeArg,
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

fn finite(s: &str) -> Result<f32, String> {
    let v: f32 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(format!("{v} is not finite"))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match replay(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("indexer-dense-replay: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn replay(cli: &Cli) -> Res<()> {
    let input = &cli.input;
    let inp = input.display().to_string();
    std::fs::metadata(input).map_err(|e| format!("{inp}: {e}"))?;
    let out_file = OutFile::create(&cli.output, input)?;
    let case = read_dense_case(input, cli.ratio as usize)?;
    if !case.unread.is_empty() {
        println!(
            "note: {inp} also holds {} (not read)",
            case.unread.join(", ")
        );
    }
    let (grad_loss, from) = case.grad_loss(cli.grad_loss, &inp)?;
    let finite = |v: &str| v.parse::<f32>().ok().filter(|x| x.is_finite());
    let (sm_scale, scale_from) = case_option(
        cli.sm_scale,
        &case.metadata,
        "sm_scale",
        &inp,
        finite,
        Some(1.0),
    )?;
    println!("options from: sm_scale {scale_from}");
    for w in case.non_finite_warnings(&inp) {
        eprintln!("{w}");
    }
    let opts = Options {
        sm_scale,
        d_index_k: cli.dk.grad(),
        d_weights: cli.dw.grad(),
        ..Options::default()
    };
    let x = HostInputs {
        index_q: &case.index_q,
        weights: &case.weights,
        index_k: &case.index_k,
        attn_score: &case.attn_score,
        attn_l1norm: &case.attn_l1norm,
        index_score: &case.index_score,
        index_lse: &case.index_lse,
        grad_loss,
        loss_coeff: cli.loss_coeff,
    };
    println!("{:?}", case.shape);
    println!(
        "grad_loss {grad_loss} ({from}), loss_coeff {}",
        cli.loss_coeff
    );
    let r = dense::run_with_progress(&case.shape, &opts, &x, true, &mut stderr_progress("cpu"))
        .map_err(|e| format!("{inp}: {e}"))?;
    println!("ran on the {}", r.backend);
    let meta = [
        ("input", inp.clone()),
        ("backend", r.backend.to_string()),
        ("mode", "dense".to_string()),
        ("options", format!("{opts:?}")),
        ("ratio", cli.ratio.to_string()),
        ("grad_loss", format!("{grad_loss}")),
        ("loss_coeff", format!("{}", cli.loss_coeff)),
    ];
    let out = cli.output.display().to_string();
    let bytes = serialize_dense_outputs(&case.shape, &r, &meta, &out)?;
    out_file.commit(&bytes)?;
    println!("wrote {out}");
    Ok(())
}
