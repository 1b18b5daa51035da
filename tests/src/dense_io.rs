//! Reading a dense-mode case from a `.safetensors` file and writing its
//! gradients back (`indexer-dense-replay`).
//!
//! Inputs by name. BSHD: `index_q` bf16 (B,S_q,H,D), `weights` bf16
//! (B,S_q,H), `index_k` bf16 (B,S_k,D), `attn_score` f32 (B,S_q,S_k),
//! `attn_l1norm` f32 (B,S_q), `index_score` f32 (B,S_q,S_k), `index_lse`
//! f32 (B,S_q). Packed (when `cu_seqlens_q` is present): `cu_seqlens_q`
//! and `cu_seqlens_k` i32 or i64 (B+1,), `index_q` (T_q,H,D), `weights`
//! (T_q,H), `index_k` (T_k,D), `attn_score` and `index_score` (T_q, cols),
//! `attn_l1norm` and `index_lse` (T_q,). Optional in both: `q_offset` i32
//! or i64 (B,), `grad_loss` f32 (1,) or (). Outputs: `grad_signal` shaped
//! as `index_score`, `d_index_q`, `d_weights`, `d_index_k` shaped as their
//! inputs, in the options' types.

use crate::io::{bf16s, choose_grad_loss, decode, f32s, grad_loss_tensor, tensor, Res};
use dsa_indexer_bwd::dense::{self, Layout};
use dsa_indexer_bwd::oneshot::HostResult;
use dsa_indexer_bwd::{bf16, oneshot::GradVec};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::Path;

/// The tensors of one dense case, decoded.
#[derive(Clone, Debug)]
pub struct DenseCase {
    pub shape: dense::Shape,
    pub index_q: Vec<bf16>,
    pub weights: Vec<bf16>,
    pub index_k: Vec<bf16>,
    pub attn_score: Vec<f32>,
    pub attn_l1norm: Vec<f32>,
    pub index_score: Vec<f32>,
    pub index_lse: Vec<f32>,
    /// The file's `grad_loss`: absent, a finite value, or why it is unusable.
    grad_loss: Option<Res<f32>>,
    /// Tensors of the file that are not inputs, sorted.
    pub unread: Vec<String>,
    /// The file's string metadata (`__metadata__`).
    pub metadata: HashMap<String, String>,
}

const KNOWN: [&str; 11] = [
    "index_q",
    "weights",
    "index_k",
    "attn_score",
    "attn_l1norm",
    "index_score",
    "index_lse",
    "cu_seqlens_q",
    "cu_seqlens_k",
    "q_offset",
    "grad_loss",
];

/// An i32 or i64 rank-1 tensor as i64.
fn ints(st: &SafeTensors<'_>, inp: &str, name: &str) -> Res<Vec<i64>> {
    let t = tensor(st, inp, name, &[Dtype::I32, Dtype::I64], 1)?;
    match t.dtype() {
        Dtype::I32 => Ok(
            decode(t.data(), "cu_seqlens / q_offset", i32::from_le_bytes)?
                .into_iter()
                .map(i64::from)
                .collect(),
        ),
        _ => decode(t.data(), "cu_seqlens / q_offset", i64::from_le_bytes),
    }
}

/// `cu_seqlens` as offsets; a negative entry is an error naming it.
fn offsets(st: &SafeTensors<'_>, inp: &str, name: &str) -> Res<Vec<usize>> {
    ints(st, inp, name)?
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            usize::try_from(v).map_err(|_| format!("{inp}: tensor {name}[{i}] = {v} is negative"))
        })
        .collect()
}

/// The shape the file describes (not yet validated): packed when it holds
/// `cu_seqlens_q`, sizes from `index_q`, `index_k` (BSHD) and the width of
/// `index_score` (packed).
fn read_shape(st: &SafeTensors<'_>, inp: &str, ratio: usize) -> Res<dense::Shape> {
    let packed = st.tensor("cu_seqlens_q").is_ok();
    let q = tensor(
        st,
        inp,
        "index_q",
        &[Dtype::BF16],
        if packed { 3 } else { 4 },
    )?;
    let score = tensor(
        st,
        inp,
        "index_score",
        &[Dtype::F32],
        if packed { 2 } else { 3 },
    )?;
    let qs = q.shape();
    let shape = if packed {
        let (h, d) = (qs[1], qs[2]);
        let cu_q = offsets(st, inp, "cu_seqlens_q")?;
        let cu_k = offsets(st, inp, "cu_seqlens_k")?;
        dense::Shape {
            layout: Layout::Varlen {
                cu_seqlens_q: cu_q,
                cu_seqlens_k: cu_k,
                score_cols: score.shape()[1],
            },
            ..dense::Shape::bshd(1, 1, 1, h, d)
        }
    } else {
        let k = tensor(st, inp, "index_k", &[Dtype::BF16], 3)?;
        dense::Shape::bshd(qs[0], qs[1], k.shape()[1], qs[2], qs[3])
    };
    let q_offset = match st.tensor("q_offset") {
        Ok(_) => ints(st, inp, "q_offset")?,
        Err(_) => Vec::new(),
    };
    Ok(shape.with_q_offset(q_offset).with_ratio(ratio))
}

/// The shapes every tensor must have for `s` (packed or BSHD).
fn expected_shapes(s: &dense::Shape) -> [(&'static str, Vec<usize>); 7] {
    let (h, d, cols) = (s.heads, s.head_dim, s.score_cols());
    match &s.layout {
        Layout::Bshd {
            batch,
            seq_q,
            seq_k,
        } => {
            let (b, q, k) = (*batch, *seq_q, *seq_k);
            [
                ("index_q", vec![b, q, h, d]),
                ("weights", vec![b, q, h]),
                ("index_k", vec![b, k, d]),
                ("attn_score", vec![b, q, k]),
                ("attn_l1norm", vec![b, q]),
                ("index_score", vec![b, q, k]),
                ("index_lse", vec![b, q]),
            ]
        }
        Layout::Varlen { .. } => {
            let (t, tk) = (s.rows(), s.key_rows());
            [
                ("index_q", vec![t, h, d]),
                ("weights", vec![t, h]),
                ("index_k", vec![tk, d]),
                ("attn_score", vec![t, cols]),
                ("attn_l1norm", vec![t]),
                ("index_score", vec![t, cols]),
                ("index_lse", vec![t]),
            ]
        }
    }
}

/// Reads and checks a dense case: names, dtypes, ranks, the shape
/// ([`dense::Shape::validate`], cu_seqlens included), then every tensor's
/// shape against it. `ratio` is the key compression ratio (not in the file).
pub fn read_dense_case(input: &Path, ratio: usize) -> Res<DenseCase> {
    let inp = input.display().to_string();
    let bytes = std::fs::read(input).map_err(|e| format!("{inp}: {e}"))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| format!("{inp}: not a readable safetensors file: {e}"))?;
    let shape = read_shape(&st, &inp, ratio)?;
    shape.validate().map_err(|e| format!("{inp}: {e}"))?;
    let mut data = HashMap::new();
    for (name, want) in expected_shapes(&shape) {
        let dt = match name {
            "index_q" | "weights" | "index_k" => Dtype::BF16,
            _ => Dtype::F32,
        };
        let t = tensor(&st, &inp, name, &[dt], want.len())?;
        if t.shape() != want.as_slice() {
            return Err(format!(
                "{inp}: tensor {name}: shape {:?}, expected {want:?} (from {shape:?})",
                t.shape()
            ));
        }
        data.insert(name, t);
    }
    let bf = |n: &'static str| bf16s(data[n].data(), n);
    let f = |n: &'static str| f32s(data[n].data(), n);
    let mut unread: Vec<String> = st
        .names()
        .into_iter()
        .filter(|n| !KNOWN.contains(n))
        .map(str::to_string)
        .collect();
    unread.sort();
    let metadata = SafeTensors::read_metadata(&bytes)
        .ok()
        .and_then(|(_, m)| m.metadata().clone())
        .unwrap_or_default();
    Ok(DenseCase {
        metadata,
        index_q: bf("index_q")?,
        weights: bf("weights")?,
        index_k: bf("index_k")?,
        attn_score: f("attn_score")?,
        attn_l1norm: f("attn_l1norm")?,
        index_score: f("index_score")?,
        index_lse: f("index_lse")?,
        grad_loss: grad_loss_tensor(&st, &inp),
        unread,
        shape,
    })
}

impl DenseCase {
    /// `grad_loss`: `flag` when given, else the file's, else 1.0 (see
    /// [`crate::io::Case::grad_loss`]).
    pub fn grad_loss(&self, flag: Option<f32>, inp: &str) -> Res<(f32, String)> {
        choose_grad_loss(flag, &self.grad_loss, inp)
    }

    /// Warnings about NaN and infinite input values, one per tensor that
    /// holds any (as [`crate::io::Case::non_finite_warnings`]).
    pub fn non_finite_warnings(&self, inp: &str) -> Vec<String> {
        use crate::io::{non_finite, non_finite_bf16, non_finite_warnings};
        let f = |v: &[f32]| non_finite(v.iter().copied());
        non_finite_warnings(
            inp,
            &[
                ("index_q", non_finite_bf16(&self.index_q)),
                ("weights", non_finite_bf16(&self.weights)),
                ("index_k", non_finite_bf16(&self.index_k)),
                ("attn_score", f(&self.attn_score)),
                ("attn_l1norm", f(&self.attn_l1norm)),
                ("index_score", f(&self.index_score)),
                ("index_lse", f(&self.index_lse)),
            ],
        )
    }
}

/// The outputs as a `.safetensors` file's bytes: `grad_signal` shaped as
/// `index_score`, the gradients shaped as their inputs, `meta` as metadata.
pub fn serialize_dense_outputs(
    shape: &dense::Shape,
    r: &HostResult,
    meta: &[(&str, String)],
    out: &str,
) -> Res<Vec<u8>> {
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
    let [q, w, k, _, _, sc, _] = expected_shapes(shape).map(|(_, s)| s);
    let view = |dt, shape: Vec<usize>, data| {
        TensorView::new(dt, shape, data).map_err(|e| format!("{out}: {e}"))
    };
    let views = vec![
        ("grad_signal", view(Dtype::F32, sc, &gs)?),
        ("d_index_q", view(Dtype::BF16, q, &dq)?),
        ("d_weights", view(dwt, w, &dw)?),
        ("d_index_k", view(dkt, k, &dk)?),
    ];
    let meta: HashMap<String, String> = meta
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    safetensors::serialize(views, Some(meta)).map_err(|e| format!("{out}: {e}"))
}

/// Writes `p` as a dense case file (the inverse of [`read_dense_case`]):
/// packed problems with i32 `cu_seqlens_*`, `q_offset` as i64 when the
/// shape has one, `grad_loss` as f32 (1,). The ratio is not stored.
pub fn write_dense_case(p: &crate::dense::DenseProblem, path: &Path) -> Res<()> {
    let s = &p.shape;
    let bf = |v: &[bf16]| -> Vec<u8> { v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect() };
    let f = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let data = [
        bf(&p.q),
        bf(&p.w),
        bf(&p.k),
        f(&p.attn),
        f(&p.l1),
        f(&p.logits),
        f(&p.lse),
    ];
    let mut extra: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> = vec![(
        "grad_loss",
        Dtype::F32,
        vec![1],
        p.grad_loss.to_le_bytes().to_vec(),
    )];
    if let Layout::Varlen {
        cu_seqlens_q,
        cu_seqlens_k,
        ..
    } = &s.layout
    {
        for (name, cu) in [
            ("cu_seqlens_q", cu_seqlens_q),
            ("cu_seqlens_k", cu_seqlens_k),
        ] {
            let bytes = cu.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect();
            extra.push((name, Dtype::I32, vec![cu.len()], bytes));
        }
    }
    if !s.q_offset.is_empty() {
        let bytes = s.q_offset.iter().flat_map(|v| v.to_le_bytes()).collect();
        extra.push(("q_offset", Dtype::I64, vec![s.q_offset.len()], bytes));
    }
    let err = |e: safetensors::SafeTensorError| format!("{}: {e}", path.display());
    let mut views = Vec::new();
    for ((name, shape), bytes) in expected_shapes(s).into_iter().zip(&data) {
        let dt = match name {
            "index_q" | "weights" | "index_k" => Dtype::BF16,
            _ => Dtype::F32,
        };
        views.push((name, TensorView::new(dt, shape, bytes).map_err(err)?));
    }
    for (name, dt, shape, bytes) in &extra {
        views.push((
            *name,
            TensorView::new(*dt, shape.clone(), bytes).map_err(err)?,
        ));
    }
    safetensors::serialize_to_file(views, None, path).map_err(err)
}
