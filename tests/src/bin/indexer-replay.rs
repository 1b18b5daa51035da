//! Replays a case dumped from PyTorch: reads SPEC's input tensors by name
//! from a `.safetensors` file, runs the backward (GPU when present, CPU
//! fallback otherwise), writes the outputs to another `.safetensors` file.
//!
//! ```text
//! cargo run --release -p indexer-tests --bin indexer-replay -- IN.safetensors OUT.safetensors
//!     [--ids global|local] [--sm-scale F] [--loss-coeff F] [--grad-loss F]
//!     [--log-score] [--dk f32|bf16] [--dw bf16|f32] [--backend auto|hopper|blackwell]
//!     [--cpu] [--check]
//! ```
//!
//! Inputs: `index_q` bf16 (B,S_q,H,D), `weights` bf16 (B,S_q,H), `index_k`
//! bf16 (B,S_k,D), `attn_score` f32 (B,S_q,topk), `index_score` f32,
//! `topk_indices` i32 or i64 (B,S_q,topk), and optionally `grad_loss` f32 (1,)
//! (overridden by `--grad-loss`). Outputs: `grad_signal`, `d_index_q`,
//! `d_weights`, `d_index_k`. `--check` also prints the relative error of
//! each output against the f64 CPU reference.

use dsa_indexer_bwd::cpu::{self, HostInputs};
use dsa_indexer_bwd::oneshot::{self, GradVec};
use dsa_indexer_bwd::{bf16, Backend, GradDtype, KeyIds, Options, ScoreKind, Shape};
use safetensors::{Dtype, SafeTensors};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn tensor<'a>(
    st: &'a SafeTensors,
    name: &str,
    dtypes: &[Dtype],
    rank: usize,
) -> Res<safetensors::tensor::TensorView<'a>> {
    let t = st.tensor(name).map_err(|e| format!("{name}: {e}"))?;
    if !dtypes.contains(&t.dtype()) {
        return Err(format!("{name}: dtype {:?}, expected one of {dtypes:?}", t.dtype()).into());
    }
    if t.shape().len() != rank {
        return Err(format!("{name}: shape {:?}, expected rank {rank}", t.shape()).into());
    }
    Ok(t)
}

fn bf16s(d: &[u8]) -> Vec<bf16> {
    d.chunks_exact(2)
        .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
        .collect()
}

fn f32s(d: &[u8]) -> Vec<f32> {
    d.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (input, output) = match (args.first(), args.get(1)) {
        (Some(i), Some(o)) if !i.starts_with("--") && !o.starts_with("--") => {
            (i.clone(), o.clone())
        }
        _ => {
            return Err(
                "usage: replay IN.safetensors OUT.safetensors [options] (see the file's docs)"
                    .into(),
            )
        }
    };
    let parse = |name: &str, default: f32| -> Res<f32> {
        flag(&args, name).map_or(Ok(default), |v| {
            v.parse::<f32>().map_err(|e| format!("{name}: {e}").into())
        })
    };
    let bytes = std::fs::read(&input)?;
    let st = SafeTensors::deserialize(&bytes)?;
    let q = tensor(&st, "index_q", &[Dtype::BF16], 4)?;
    let w = tensor(&st, "weights", &[Dtype::BF16], 3)?;
    let k = tensor(&st, "index_k", &[Dtype::BF16], 3)?;
    let attn = tensor(&st, "attn_score", &[Dtype::F32], 3)?;
    let score = tensor(&st, "index_score", &[Dtype::F32], 3)?;
    let ids = tensor(&st, "topk_indices", &[Dtype::I32, Dtype::I64], 3)?;
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
            Err(format!("{name}: shape {got:?}, expected {exp:?}").into())
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
    let ids_i32: Vec<i32> = match ids.dtype() {
        Dtype::I32 => ids
            .data()
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        // i64 ids beyond i32 are out of range for any valid key: padding.
        _ => ids
            .data()
            .chunks_exact(8)
            .map(|c| {
                let v = i64::from_le_bytes(c.try_into().expect("8 bytes"));
                i32::try_from(v).unwrap_or(if v < 0 { -1 } else { i32::MAX })
            })
            .collect(),
    };
    let stored_loss = match st.tensor("grad_loss") {
        Ok(t) if t.dtype() == Dtype::F32 && t.data().len() == 4 => f32s(t.data())[0],
        _ => 1.0,
    };
    let opts = Options {
        sm_scale: parse("--sm-scale", 1.0)?,
        key_ids: if flag(&args, "--ids") == Some("local") {
            KeyIds::Local
        } else {
            KeyIds::Global
        },
        score: if args.iter().any(|a| a == "--log-score") {
            ScoreKind::LogProbs
        } else {
            ScoreKind::Probs
        },
        d_index_k: if flag(&args, "--dk") == Some("bf16") {
            GradDtype::Bf16
        } else {
            GradDtype::F32
        },
        d_weights: if flag(&args, "--dw") == Some("f32") {
            GradDtype::F32
        } else {
            GradDtype::Bf16
        },
        backend: match flag(&args, "--backend") {
            Some("hopper") => Backend::Hopper,
            Some("blackwell") => Backend::Blackwell,
            _ => Backend::Auto,
        },
    };
    let (qv, wv, kv) = (bf16s(q.data()), bf16s(w.data()), bf16s(k.data()));
    let (av, sv) = (f32s(attn.data()), f32s(score.data()));
    let x = HostInputs {
        index_q: &qv,
        weights: &wv,
        index_k: &kv,
        attn_score: &av,
        index_score: &sv,
        topk_indices: &ids_i32,
        grad_loss: parse("--grad-loss", stored_loss)?,
        loss_coeff: parse("--loss-coeff", 1.0)?,
    };
    println!("{shape:?} {opts:?}");
    let r = oneshot::run(&shape, &opts, &x, !args.iter().any(|a| a == "--cpu"))?;
    println!("ran on the {}", r.backend);
    if args.iter().any(|a| a == "--check") {
        let refr = cpu::reference(&shape, &opts, &x)?;
        // The suite's metric (non-finite outputs report infinity).
        let rel = |g: Vec<f64>, w: &[f64]| indexer_tests::rel_err(&g, w);
        println!(
            "rel error vs f64 reference: grad_signal {:.2e} d_index_q {:.2e} d_weights {:.2e} d_index_k {:.2e}",
            rel(r.grad_signal.iter().map(|&v| v as f64).collect(), &refr.grad_signal),
            rel(r.d_index_q.iter().map(|v| v.to_f64()).collect(), &refr.d_index_q),
            rel(r.d_weights.to_f64(), &refr.d_weights),
            rel(r.d_index_k.to_f64(), &refr.d_index_k)
        );
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
    let views = vec![
        (
            "grad_signal",
            safetensors::tensor::TensorView::new(Dtype::F32, ss.to_vec(), &gs)?,
        ),
        (
            "d_index_q",
            safetensors::tensor::TensorView::new(Dtype::BF16, qs.to_vec(), &dq)?,
        ),
        (
            "d_weights",
            safetensors::tensor::TensorView::new(dwt, w.shape().to_vec(), &dw)?,
        ),
        (
            "d_index_k",
            safetensors::tensor::TensorView::new(dkt, ks.to_vec(), &dk)?,
        ),
    ];
    safetensors::serialize_to_file(views, None, std::path::Path::new(&output))?;
    println!("wrote {output}");
    Ok(())
}
