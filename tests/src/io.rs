//! Reading SPEC's tensors from a `.safetensors` file and writing the
//! gradients back, shared by `indexer-replay` and `indexer-bench --input`.
//!
//! Inputs by name: `index_q` bf16 (B,S_q,H,D), `weights` bf16 (B,S_q,H),
//! `index_k` bf16 (B,S_k,D), `attn_score` f32 (B,S_q,topk), `index_score`
//! f32, `topk_indices` i32 or i64 (B,S_q,topk), optionally `grad_loss` f32
//! of shape (1,) or (). Outputs: `grad_signal` f32, `d_index_q` bf16,
//! `d_weights` and `d_index_k` in the plan's types, with string metadata.

use dsa_indexer_bwd::cpu;
use dsa_indexer_bwd::oneshot::GradVec;
use dsa_indexer_bwd::{bf16, KeyIds, Options, Shape};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Errors are messages naming the file.
pub type Res<T> = Result<T, String>;

/// The output file in the making: a temporary file beside OUT, removed
/// unless [`OutFile::commit`] renames it over OUT.
pub struct OutFile {
    tmp: PathBuf,
    out: PathBuf,
    file: Option<std::fs::File>,
}

impl OutFile {
    /// Refuses OUT == IN (same path, link or file) and a directory, then
    /// creates the temporary file, so an unwritable location fails before
    /// any work.
    pub fn create(out: &Path, input: &Path) -> Res<OutFile> {
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
    pub fn commit(mut self, bytes: &[u8]) -> Res<()> {
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
pub(crate) fn decode<T: Clone + Default, const N: usize>(
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

pub(crate) fn bf16s(d: &[u8], what: &'static str) -> Res<Vec<bf16>> {
    decode(d, what, |c: [u8; 2]| bf16::from_bits(u16::from_le_bytes(c)))
}

pub(crate) fn f32s(d: &[u8], what: &'static str) -> Res<Vec<f32>> {
    decode(d, what, f32::from_le_bytes)
}

/// Counts of NaN and infinite values.
pub fn non_finite(v: impl Iterator<Item = f32>) -> (usize, usize) {
    v.fold((0, 0), |(n, i), x| {
        (n + x.is_nan() as usize, i + x.is_infinite() as usize)
    })
}

/// The tensors of one case, decoded.
#[derive(Clone, Debug)]
pub struct Case {
    pub shape: Shape,
    pub index_q: Vec<bf16>,
    pub weights: Vec<bf16>,
    pub index_k: Vec<bf16>,
    pub attn_score: Vec<f32>,
    pub index_score: Vec<f32>,
    /// As i32; i64 ids beyond i32 are out of range for any valid key, so
    /// they become padding (-1 when negative, `i32::MAX` otherwise).
    pub topk_indices: Vec<i32>,
    /// Whether the file held i64 ids.
    pub ids_were_i64: bool,
    /// The file's i64 ids as they are (when it held i64 ids), for the GPU,
    /// which reads them without a conversion.
    pub topk_indices_i64: Option<Vec<i64>>,
    /// The file's `grad_loss`: absent, a finite value, or why it is unusable.
    grad_loss: Option<Res<f32>>,
    /// The file's string metadata (`__metadata__`).
    pub metadata: HashMap<String, String>,
    /// Tensors of the file that are not inputs, sorted.
    pub unread: Vec<String>,
}

/// Reads and checks a case: names, dtypes, ranks, shapes agreeing with
/// `index_q`, `index_k` and `attn_score`, and [`Shape::validate`].
pub fn read_case(input: &Path) -> Res<Case> {
    let inp = input.display().to_string();
    let bytes = std::fs::read(input).map_err(|e| format!("{inp}: {e}"))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| format!("{inp}: not a readable safetensors file: {e}"))?;
    let metadata = SafeTensors::read_metadata(&bytes)
        .ok()
        .and_then(|(_, m)| m.metadata().clone())
        .unwrap_or_default();
    let tensor = |name: &str, dtypes: &[Dtype], rank: usize| tensor(&st, &inp, name, dtypes, rank);
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
    let mut unread: Vec<String> = st
        .names()
        .into_iter()
        .filter(|n| !known.contains(n))
        .map(str::to_string)
        .collect();
    unread.sort();

    let ids_were_i64 = ids.dtype() == Dtype::I64;
    let topk_indices_i64: Option<Vec<i64>> = match ids.dtype() {
        Dtype::I32 => None,
        _ => Some(decode(ids.data(), "topk_indices", i64::from_le_bytes)?),
    };
    let topk_indices: Vec<i32> = match &topk_indices_i64 {
        None => decode(ids.data(), "topk_indices", i32::from_le_bytes)?,
        Some(v) => v
            .iter()
            .map(|&v| i32::try_from(v).unwrap_or(if v < 0 { -1 } else { i32::MAX }))
            .collect(),
    };
    let grad_loss = grad_loss_tensor(&st, &inp);
    Ok(Case {
        shape,
        index_q: bf16s(q.data(), "index_q")?,
        weights: bf16s(w.data(), "weights")?,
        index_k: bf16s(k.data(), "index_k")?,
        attn_score: f32s(attn.data(), "attn_score")?,
        index_score: f32s(score.data(), "index_score")?,
        topk_indices,
        ids_were_i64,
        topk_indices_i64,
        grad_loss,
        metadata,
        unread,
    })
}

/// Tensor `name` of the file, checked to have one of `dtypes` and rank
/// `rank` (`inp` names the file in errors).
pub(crate) fn tensor<'a>(
    st: &'a SafeTensors<'a>,
    inp: &str,
    name: &str,
    dtypes: &[Dtype],
    rank: usize,
) -> Res<TensorView<'a>> {
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
}

/// The file's `grad_loss` tensor: absent (`None`), one finite f32 of shape
/// (1,) or (), or why it is unusable.
pub(crate) fn grad_loss_tensor(st: &SafeTensors<'_>, inp: &str) -> Option<Res<f32>> {
    let t = st.tensor("grad_loss").ok()?;
    if t.dtype() != Dtype::F32 {
        return Some(Err(format!(
            "{inp}: tensor grad_loss: dtype {:?}, expected F32 (or pass --grad-loss)",
            t.dtype()
        )));
    }
    if !(t.shape().is_empty() || t.shape() == [1]) {
        return Some(Err(format!(
            "{inp}: tensor grad_loss: shape {:?}, expected [1] or [] (or pass --grad-loss)",
            t.shape()
        )));
    }
    let v = match f32s(t.data(), "grad_loss") {
        Ok(v) => v[0],
        Err(e) => return Some(Err(e)),
    };
    if !v.is_finite() {
        return Some(Err(format!(
            "{inp}: tensor grad_loss: {v} is not finite (a host scalar here, rejected as SPEC says; pass --grad-loss)"
        )));
    }
    Some(Ok(v))
}

/// `grad_loss`: `flag` when given, else the file's (`stored`), else 1.0;
/// with where it came from.
pub(crate) fn choose_grad_loss(
    flag: Option<f32>,
    stored: &Option<Res<f32>>,
    inp: &str,
) -> Res<(f32, String)> {
    match (flag, stored) {
        (Some(v), _) => Ok((v, "--grad-loss".to_string())),
        (None, Some(Ok(v))) => Ok((*v, inp.to_string())),
        (None, Some(Err(e))) => Err(e.clone()),
        (None, None) => Ok((1.0, format!("default: {inp} has no grad_loss"))),
    }
}

impl Case {
    /// `grad_loss`: `flag` when given, else the file's (f32, one finite
    /// value), else 1.0; anything else in the file is an error, not a
    /// silent 1.0. With where it came from (`inp` names the file).
    pub fn grad_loss(&self, flag: Option<f32>, inp: &str) -> Res<(f32, String)> {
        choose_grad_loss(flag, &self.grad_loss, inp)
    }

    /// Warnings about NaN and infinite input values (they propagate as
    /// SPEC says), one per tensor that holds any.
    pub fn non_finite_warnings(&self, inp: &str) -> Vec<String> {
        let bad = [
            (
                "index_q",
                non_finite(self.index_q.iter().map(|v| v.to_f32())),
            ),
            (
                "weights",
                non_finite(self.weights.iter().map(|v| v.to_f32())),
            ),
            (
                "index_k",
                non_finite(self.index_k.iter().map(|v| v.to_f32())),
            ),
            ("attn_score", non_finite(self.attn_score.iter().copied())),
            ("index_score", non_finite(self.index_score.iter().copied())),
        ];
        bad.into_iter()
            .filter(|(_, (nan, inf))| nan + inf > 0)
            .map(|(name, (nan, inf))| {
                format!(
                    "warning: {inp}: {name} holds {nan} NaN and {inf} infinite values; they propagate into the outputs (docs/spec.md, \"Non-finite values\")"
                )
            })
            .collect()
    }
}

/// The outputs as a `.safetensors` file's bytes (`grad_signal`,
/// `d_index_q`, `d_weights`, `d_index_k`, shaped as SPEC says), with
/// `meta` as its metadata; `out` names the file in errors.
pub fn serialize_outputs(
    shape: &Shape,
    grad_signal: &[f32],
    d_index_q: &[bf16],
    d_weights: &GradVec,
    d_index_k: &GradVec,
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
    let gs: Vec<u8> = grad_signal.iter().flat_map(|x| x.to_le_bytes()).collect();
    let dq: Vec<u8> = d_index_q
        .iter()
        .flat_map(|x| x.to_bits().to_le_bytes())
        .collect();
    let (dwt, dw) = le(d_weights);
    let (dkt, dk) = le(d_index_k);
    let s = shape;
    let view = |dt, shape: Vec<usize>, data| {
        safetensors::tensor::TensorView::new(dt, shape, data).map_err(|e| format!("{out}: {e}"))
    };
    let views = vec![
        (
            "grad_signal",
            view(Dtype::F32, vec![s.batch, s.seq_q, s.topk], &gs)?,
        ),
        (
            "d_index_q",
            view(
                Dtype::BF16,
                vec![s.batch, s.seq_q, s.heads, s.head_dim],
                &dq,
            )?,
        ),
        (
            "d_weights",
            view(dwt, vec![s.batch, s.seq_q, s.heads], &dw)?,
        ),
        (
            "d_index_k",
            view(dkt, vec![s.batch, s.seq_k, s.head_dim], &dk)?,
        ),
    ];
    let meta: HashMap<String, String> = meta
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    safetensors::serialize(views, Some(meta)).map_err(|e| format!("{out}: {e}"))
}

/// Refuses ids that look like the other convention: with B > 1, a batch
/// `b >= 1` none of whose ids is a valid key of its own under `opts`,
/// while at least half of them would be under the other convention (a
/// global-id dump replayed as local ids pads every slot of batches 1..B
/// and gives all-zero gradients there; a local-id dump replayed as global
/// ids reads batch 0's keys). Returns a line with the id counts.
pub fn check_ids(
    shape: &Shape,
    opts: &Options,
    ids: &[i32],
    trust: bool,
    inp: &str,
) -> Res<String> {
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
    Ok(format!(
        "topk_indices: {} slots, {valid} valid {} ids, {} padding ({negative} negative, {} out of range)",
        ids.len(),
        match opts.key_ids {
            KeyIds::Global => "global",
            KeyIds::Local => "local",
        },
        ids.len() - valid,
        ids.len() - valid - negative
    ))
}
