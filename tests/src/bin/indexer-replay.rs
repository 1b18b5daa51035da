//! Replays a case dumped from PyTorch: reads SPEC's input tensors by name
//! from a `.safetensors` file, runs the backward (GPU when present, CPU
//! fallback otherwise), writes the outputs to another `.safetensors` file.
//!
//! ```text
//! cargo run --release -p indexer-tests --bin indexer-replay -- IN.safetensors OUT.safetensors
//!     [--ids global|local] [--sm-scale F] [--loss-coeff F] [--grad-loss F]
//!     [--log-score] [--dk f32|bf16] [--dw bf16|f32] [--backend auto|hopper|blackwell]
//!     [--cpu] [--check] [--trust-ids]
//! ```
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
//! look like the other convention (a batch that selects none of its own
//! keys under `--ids` but mostly valid keys under the other) are an error
//! unless `--trust-ids`; non-finite input values are counted and reported,
//! then propagate as SPEC says.

use clap::{Parser, ValueEnum};
use dsa_indexer_bwd::cpu::{self, HostInputs};
use dsa_indexer_bwd::oneshot::{self, GradVec};
use dsa_indexer_bwd::{bf16, Backend, GradDtype, KeyIds, Options, ScoreKind, Shape};
use safetensors::{Dtype, SafeTensors};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

type Res<T> = Result<T, String>;

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
    /// Convention of topk_indices.
    #[arg(long, value_enum, default_value_t = IdsArg::Global)]
    ids: IdsArg,
    /// Scale of q . k (finite; may be zero or negative).
    #[arg(long, default_value_t = 1.0, value_parser = finite, allow_negative_numbers = true)]
    sm_scale: f32,
    /// Loss coefficient (finite).
    #[arg(long, default_value_t = 1.0, value_parser = finite, allow_negative_numbers = true)]
    loss_coeff: f32,
    /// Upstream gradient of the loss, instead of the file's grad_loss
    /// (default: the file's, else 1.0).
    #[arg(long, value_parser = finite, allow_negative_numbers = true)]
    grad_loss: Option<f32>,
    /// index_score holds log-probabilities.
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

/// The output file in the making: a temporary file beside OUT, removed
/// unless [`OutFile::commit`] renames it over OUT.
struct OutFile {
    tmp: PathBuf,
    out: PathBuf,
    file: Option<std::fs::File>,
}

impl OutFile {
    /// Refuses OUT == IN (same path, link or file) and a directory, then
    /// creates the temporary file, so an unwritable location fails before
    /// any work.
    fn create(out: &Path, input: &Path) -> Res<OutFile> {
        let shown = out.display();
        if let Ok(meta) = std::fs::metadata(out) {
            if meta.is_dir() {
                return Err(format!("{shown}: is a directory"));
            }
            if same_file(out, input) {
                return Err(format!(
                    "{shown}: is the input file {}; refusing to replace the dumped case (pick another output path)",
                    input.display()
                ));
            }
        }
        let name = out
            .file_name()
            .ok_or_else(|| format!("{shown}: not a file path"))?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".tmp-{}", std::process::id()));
        let tmp = out.with_file_name(tmp_name);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| format!("{shown}: cannot create {}: {e}", tmp.display()))?;
        Ok(OutFile {
            tmp,
            out: out.to_path_buf(),
            file: Some(file),
        })
    }

    /// Writes `bytes`, flushes them to disk and renames over OUT.
    fn commit(mut self, bytes: &[u8]) -> Res<()> {
        let at = |e: std::io::Error| format!("{}: {e}", self.tmp.display());
        let mut f = self.file.take().expect("file open until commit");
        f.write_all(bytes).map_err(at)?;
        f.sync_all().map_err(at)?;
        drop(f);
        std::fs::rename(&self.tmp, &self.out).map_err(|e| {
            format!(
                "{}: cannot rename {} over it: {e}",
                self.out.display(),
                self.tmp.display()
            )
        })
    }
}

impl Drop for OutFile {
    fn drop(&mut self) {
        // Not committed (or the rename failed): leave no partial file.
        if self.tmp.exists() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Whether `a` and `b` name the same existing file (same path after
/// resolving links, or the same inode).
fn same_file(a: &Path, b: &Path) -> bool {
    if let (Ok(x), Ok(y)) = (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        if x == y {
            return true;
        }
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return x.dev() == y.dev() && x.ino() == y.ino();
        }
    }
    false
}

/// Decodes little-endian elements of `n` bytes each, with a typed error
/// instead of an abort when memory runs out.
fn decode<T: Clone + Default, const N: usize>(
    d: &[u8],
    what: &'static str,
    f: impl Fn([u8; N]) -> T,
) -> Res<Vec<T>> {
    let mut v = cpu::try_vec(d.len() / N, T::default(), what).map_err(|e| e.to_string())?;
    for (o, c) in v.iter_mut().zip(d.chunks_exact(N)) {
        *o = f(c.try_into().expect("N bytes"));
    }
    Ok(v)
}

fn bf16s(d: &[u8], what: &'static str) -> Res<Vec<bf16>> {
    decode(d, what, |c: [u8; 2]| bf16::from_bits(u16::from_le_bytes(c)))
}

fn f32s(d: &[u8], what: &'static str) -> Res<Vec<f32>> {
    decode(d, what, f32::from_le_bytes)
}

/// Counts of NaN and infinite values.
fn non_finite(v: impl Iterator<Item = f32>) -> (usize, usize) {
    v.fold((0, 0), |(n, i), x| {
        (n + x.is_nan() as usize, i + x.is_infinite() as usize)
    })
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
    let bytes = std::fs::read(input).map_err(|e| format!("{inp}: {e}"))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| format!("{inp}: not a readable safetensors file: {e}"))?;
    let tensor = |name: &str, dtypes: &[Dtype], rank: usize| {
        let t = st
            .tensor(name)
            .map_err(|e| format!("{inp}: tensor {name}: {e}"))?;
        if !dtypes.contains(&t.dtype()) {
            return Err(format!(
                "{inp}: tensor {name}: dtype {:?}, expected {}",
                t.dtype(),
                dtypes
                    .iter()
                    .map(|d| format!("{d:?}"))
                    .collect::<Vec<_>>()
                    .join(" or ")
            ));
        }
        if t.shape().len() != rank {
            return Err(format!(
                "{inp}: tensor {name}: shape {:?}, expected rank {rank}",
                t.shape()
            ));
        }
        Ok(t)
    };
    let q = tensor("index_q", &[Dtype::BF16], 4)?;
    let w = tensor("weights", &[Dtype::BF16], 3)?;
    let k = tensor("index_k", &[Dtype::BF16], 3)?;
    let attn = tensor("attn_score", &[Dtype::F32], 3)?;
    let score = tensor("index_score", &[Dtype::F32], 3)?;
    let ids = tensor("topk_indices", &[Dtype::I32, Dtype::I64], 3)?;
    let (qs, ks, ss) = (q.shape(), k.shape(), attn.shape());
    let shape = Shape {
        batch: qs[0],
        seq_q: qs[1],
        seq_k: ks[1],
        heads: qs[2],
        head_dim: qs[3],
        topk: ss[2],
    };
    let want = |name: &str, got: &[usize], exp: &[usize]| -> Res<()> {
        if got == exp {
            Ok(())
        } else {
            Err(format!(
                "{inp}: tensor {name}: shape {got:?}, expected {exp:?} (from index_q {qs:?}, index_k {ks:?}, attn_score {ss:?})"
            ))
        }
    };
    want(
        "weights",
        w.shape(),
        &[shape.batch, shape.seq_q, shape.heads],
    )?;
    want("index_k", ks, &[shape.batch, shape.seq_k, shape.head_dim])?;
    for t in [
        ("attn_score", &attn),
        ("index_score", &score),
        ("topk_indices", &ids),
    ] {
        want(t.0, t.1.shape(), &[shape.batch, shape.seq_q, shape.topk])?;
    }
    shape.validate().map_err(|e| format!("{inp}: {e}"))?;
    let known = [
        "index_q",
        "weights",
        "index_k",
        "attn_score",
        "index_score",
        "topk_indices",
        "grad_loss",
    ];
    let mut unread: Vec<&str> = st
        .names()
        .into_iter()
        .filter(|n| !known.contains(n))
        .collect();
    if !unread.is_empty() {
        unread.sort();
        println!("note: {inp} also holds {} (not read)", unread.join(", "));
    }

    // i64 ids beyond i32 are out of range for any valid key: padding.
    let ids_i32: Vec<i32> = match ids.dtype() {
        Dtype::I32 => decode(ids.data(), "topk_indices", i32::from_le_bytes)?,
        _ => decode(ids.data(), "topk_indices", |c: [u8; 8]| {
            let v = i64::from_le_bytes(c);
            i32::try_from(v).unwrap_or(if v < 0 { -1 } else { i32::MAX })
        })?,
    };

    // grad_loss: the flag, else the file's (f32, one value), else 1.0;
    // anything else in the file is an error, not a silent 1.0.
    let (grad_loss, from) = match (cli.grad_loss, st.tensor("grad_loss")) {
        (Some(v), _) => (v, "--grad-loss".to_string()),
        (None, Ok(t)) => {
            if t.dtype() != Dtype::F32 {
                return Err(format!(
                    "{inp}: tensor grad_loss: dtype {:?}, expected F32 (or pass --grad-loss)",
                    t.dtype()
                ));
            }
            if !(t.shape().is_empty() || t.shape() == [1]) {
                return Err(format!(
                    "{inp}: tensor grad_loss: shape {:?}, expected [1] or [] (or pass --grad-loss)",
                    t.shape()
                ));
            }
            let v = f32s(t.data(), "grad_loss")?[0];
            if !v.is_finite() {
                return Err(format!(
                    "{inp}: tensor grad_loss: {v} is not finite (a host scalar here, rejected as SPEC says; pass --grad-loss)"
                ));
            }
            (v, inp.clone())
        }
        (None, Err(_)) => (1.0, format!("default: {inp} has no grad_loss")),
    };
    let opts = Options {
        sm_scale: cli.sm_scale,
        key_ids: match cli.ids {
            IdsArg::Global => KeyIds::Global,
            IdsArg::Local => KeyIds::Local,
        },
        score: if cli.log_score {
            ScoreKind::LogProbs
        } else {
            ScoreKind::Probs
        },
        d_index_k: cli.dk.grad(),
        d_weights: cli.dw.grad(),
        backend: match cli.backend {
            BackendArg::Auto => Backend::Auto,
            BackendArg::Hopper => Backend::Hopper,
            BackendArg::Blackwell => Backend::Blackwell,
        },
    };
    check_ids(&shape, &opts, &ids_i32, cli.trust_ids, &inp)?;

    let qv = bf16s(q.data(), "index_q")?;
    let wv = bf16s(w.data(), "weights")?;
    let kv = bf16s(k.data(), "index_k")?;
    let av = f32s(attn.data(), "attn_score")?;
    let sv = f32s(score.data(), "index_score")?;
    let bad = [
        ("index_q", non_finite(qv.iter().map(|v| v.to_f32()))),
        ("weights", non_finite(wv.iter().map(|v| v.to_f32()))),
        ("index_k", non_finite(kv.iter().map(|v| v.to_f32()))),
        ("attn_score", non_finite(av.iter().copied())),
        ("index_score", non_finite(sv.iter().copied())),
    ];
    for (name, (nan, inf)) in bad {
        if nan + inf > 0 {
            eprintln!(
                "warning: {inp}: {name} holds {nan} NaN and {inf} infinite values; they propagate into the outputs (README, \"Non-finite inputs\")"
            );
        }
    }
    let x = HostInputs {
        index_q: &qv,
        weights: &wv,
        index_k: &kv,
        attn_score: &av,
        index_score: &sv,
        topk_indices: &ids_i32,
        grad_loss,
        loss_coeff: cli.loss_coeff,
    };
    println!("{shape:?} {opts:?}");
    println!(
        "grad_loss {grad_loss} ({from}), loss_coeff {}",
        cli.loss_coeff
    );
    let r = oneshot::run_with_progress(
        &shape,
        &opts,
        &x,
        !cli.cpu,
        &mut cpu::stderr_progress("cpu"),
    )
    .map_err(|e| format!("{inp}: {e}"))?;
    println!("ran on the {}", r.backend);
    if cli.check {
        check(&shape, &opts, &x, &r, &inp)?;
    }

    let le = |v: &GradVec| -> (Dtype, Vec<u8>) {
        match v {
            GradVec::F32(v) => (Dtype::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            GradVec::Bf16(v) => (
                Dtype::BF16,
                v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
            ),
        }
    };
    let gs: Vec<u8> = r.grad_signal.iter().flat_map(|x| x.to_le_bytes()).collect();
    let dq: Vec<u8> = r
        .d_index_q
        .iter()
        .flat_map(|x| x.to_bits().to_le_bytes())
        .collect();
    let (dwt, dw) = le(&r.d_weights);
    let (dkt, dk) = le(&r.d_index_k);
    let view = |dt, shape: &[usize], data| {
        safetensors::tensor::TensorView::new(dt, shape.to_vec(), data)
            .map_err(|e| format!("{}: {e}", cli.output.display()))
    };
    let views = vec![
        ("grad_signal", view(Dtype::F32, ss, &gs)?),
        ("d_index_q", view(Dtype::BF16, qs, &dq)?),
        ("d_weights", view(dwt, w.shape(), &dw)?),
        ("d_index_k", view(dkt, ks, &dk)?),
    ];
    let meta = [
        ("input", inp.clone()),
        ("backend", r.backend.to_string()),
        ("options", format!("{opts:?}")),
        ("grad_loss", format!("{grad_loss}")),
        ("loss_coeff", format!("{}", cli.loss_coeff)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let bytes = safetensors::serialize(views, Some(meta))
        .map_err(|e| format!("{}: {e}", cli.output.display()))?;
    out_file.commit(&bytes)?;
    println!("wrote {}", cli.output.display());
    Ok(())
}

/// Refuses ids that look like the other convention: with B > 1, a batch
/// `b >= 1` none of whose ids is a valid key of its own under `--ids`,
/// while at least half of them would be under the other convention (a
/// global-id dump replayed as local ids pads every slot of batches 1..B
/// and gives all-zero gradients there; a local-id dump replayed as global
/// ids reads batch 0's keys). Prints the id counts either way.
fn check_ids(shape: &Shape, opts: &Options, ids: &[i32], trust: bool, inp: &str) -> Res<()> {
    let per_batch = shape.seq_q * shape.topk;
    let sk = shape.seq_k as i64;
    let (mut valid, mut negative) = (0usize, 0usize);
    for (b, chunk) in ids.chunks(per_batch.max(1)).enumerate() {
        let own = |id: i64| (b as i64 * sk..(b as i64 + 1) * sk).contains(&id);
        let local = |id: i64| (0..sk).contains(&id);
        let mut ok = 0usize;
        let mut other = 0usize;
        for &id in chunk {
            let id = id as i64;
            negative += (id < 0) as usize;
            let (this, that) = match opts.key_ids {
                KeyIds::Global => (
                    opts.resolve(shape, b, id as i32).is_some(),
                    b > 0 && local(id),
                ),
                KeyIds::Local => (local(id), own(id)),
            };
            valid += this as usize;
            ok += (this && (opts.key_ids == KeyIds::Local || own(id))) as usize;
            other += that as usize;
        }
        if b > 0 && ok == 0 && 2 * other >= chunk.len() && !trust {
            let (this, that) = match opts.key_ids {
                KeyIds::Global => ("global", "local"),
                KeyIds::Local => ("local", "global"),
            };
            return Err(format!(
                "{inp}: topk_indices: batch {b} selects none of its own keys as {this} ids, but {other} of its {} ids are valid {that} ids; the file looks like it holds {that} ids: pass --ids {that} (or --trust-ids to replay them as {this} ids)",
                chunk.len()
            ));
        }
    }
    println!(
        "topk_indices: {} slots, {valid} valid {} ids, {} padding ({negative} negative, {} out of range)",
        ids.len(),
        match opts.key_ids {
            KeyIds::Global => "global",
            KeyIds::Local => "local",
        },
        ids.len() - valid,
        ids.len() - valid - negative
    );
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
