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

/// Temporary output files that exist right now (removed by the signal
/// handler when the tool is interrupted or terminated).
static LIVE: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Exit status of a tool stopped by SIGINT, SIGTERM or SIGHUP (128 + 2).
pub const INTERRUPTED: i32 = 130;

/// Installs, once per process, the handler that removes every live
/// temporary output file and exits with [`INTERRUPTED`] on SIGINT, SIGTERM
/// or SIGHUP, so an interrupted run leaves OUT as it was and nothing
/// beside it.
fn remove_on_signal() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // A process that cannot install it keeps the default behaviour
        // (the temporary file may stay); nothing else depends on it.
        let _ = ctrlc::set_handler(|| {
            let live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
            for tmp in live.iter() {
                let _ = std::fs::remove_file(tmp);
            }
            eprintln!("interrupted: no output written");
            std::process::exit(INTERRUPTED);
        });
    });
}

/// Registers (`true`) or forgets a live temporary file.
fn track(tmp: &Path, live: bool) {
    let mut all = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|p| p != tmp);
    if live {
        all.push(tmp.to_path_buf());
    }
}

/// The output file in the making: a temporary file beside OUT, removed
/// unless [`OutFile::commit`] renames it over OUT (also when the tool is
/// interrupted or terminated by a signal).
pub struct OutFile {
    tmp: PathBuf,
    out: PathBuf,
    file: Option<std::fs::File>,
}

impl OutFile {
    /// Refuses OUT == IN (same path, link or file), a directory and a path
    /// that names one (a trailing `/`), then creates the temporary file, so
    /// an unwritable location fails before any work.
    pub fn create(out: &Path, input: &Path) -> Res<OutFile> {
        let shown = out.display();
        if out.as_os_str().as_encoded_bytes().ends_with(b"/") {
            return Err(format!(
                "{shown}: ends with '/', a directory; the output must be a file path"
            ));
        }
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
        remove_on_signal();
        // Registered before it exists: a signal between the two removes
        // nothing (no such file), one after removes it.
        track(&tmp, true);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| {
                track(&tmp, false);
                format!("{shown}: cannot create {}: {e}", tmp.display())
            })?;
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
        let renamed = std::fs::rename(&self.tmp, &self.out);
        if renamed.is_ok() {
            track(&self.tmp, false);
        }
        renamed.map_err(|e| {
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
        track(&self.tmp, false);
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

/// [`non_finite`] of bf16 values.
pub fn non_finite_bf16(v: &[bf16]) -> (usize, usize) {
    non_finite(v.iter().map(|x| x.to_f32()))
}

/// One warning per tensor of `counts` (name, (NaN, infinite)) that holds
/// any non-finite value: they are not rejected, they propagate into the
/// outputs as SPEC says (both replay tools print them).
pub fn non_finite_warnings(inp: &str, counts: &[(&str, (usize, usize))]) -> Vec<String> {
    counts
        .iter()
        .filter(|(_, (nan, inf))| nan + inf > 0)
        .map(|(name, (nan, inf))| {
            format!(
                "warning: {inp}: {name} holds {nan} NaN and {inf} infinite values; they propagate into the outputs (docs/spec.md, \"Non-finite values\")"
            )
        })
        .collect()
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
        non_finite_warnings(
            inp,
            &[
                ("index_q", non_finite_bf16(&self.index_q)),
                ("weights", non_finite_bf16(&self.weights)),
                ("index_k", non_finite_bf16(&self.index_k)),
                ("attn_score", non_finite(self.attn_score.iter().copied())),
                ("index_score", non_finite(self.index_score.iter().copied())),
            ],
        )
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

/// One option of a replayed case, by one rule for every tool: the flag
/// when given, else the file's metadata entry `key` (read by `parse`; an
/// entry it cannot read is an error naming the file), else `default`.
/// Returns the value and where it came from.
pub fn case_option<T>(
    flag: Option<T>,
    metadata: &HashMap<String, String>,
    key: &str,
    inp: &str,
    parse: impl Fn(&str) -> Option<T>,
    default: Option<T>,
) -> Res<(T, String)> {
    if let Some(v) = flag {
        return Ok((v, "flag".into()));
    }
    if let Some(v) = metadata.get(key) {
        let got =
            parse(v.trim()).ok_or_else(|| format!("{inp}: metadata {key}: cannot read {v:?}"))?;
        return Ok((got, format!("{inp} metadata")));
    }
    default
        .map(|v| (v, "default".into()))
        .ok_or_else(|| format!("{inp}: {key}: no flag and no metadata entry"))
}

/// The key-id convention of a case: `--ids` when given, else the file's
/// metadata `key_ids`, else global, but only for B = 1 (where both
/// conventions read every id alike): with B > 1 a wrong guess silently
/// reads other batches' keys, so the convention must be said.
pub fn case_key_ids(
    flag: Option<KeyIds>,
    metadata: &HashMap<String, String>,
    shape: &Shape,
    inp: &str,
) -> Res<(KeyIds, String)> {
    let parse = |v: &str| match v {
        "global" => Some(KeyIds::Global),
        "local" => Some(KeyIds::Local),
        _ => None,
    };
    let default = (shape.batch <= 1).then_some(KeyIds::Global);
    case_option(flag, metadata, "key_ids", inp, parse, default).map_err(|e| {
        if default.is_none() && !metadata.contains_key("key_ids") {
            format!(
                "{inp}: topk_indices: B = {}: say which convention the ids use, --ids global (rows of the flat (B*S_k, D) keys) or --ids local (rows of the query's own batch), or store key_ids in the file's metadata",
                shape.batch
            )
        } else {
            e
        }
    })
}

/// What one batch's ids read as under each convention (B > 1).
#[derive(Default)]
struct BatchIds {
    /// Valid under the convention given.
    valid: usize,
    /// Negative (padding under both conventions).
    negative: usize,
    /// Global ids: valid, but rows of another batch's keys.
    foreign: usize,
    /// Local ids: padding (out of range) that would be this batch's own
    /// keys as global ids, and how many distinct such values.
    own_if_global: usize,
    own_if_global_distinct: usize,
}

impl BatchIds {
    fn count(b: usize, chunk: &[i32], shape: &Shape, opts: &Options) -> BatchIds {
        let sk = shape.seq_k as i64;
        let own = b as i64 * sk..(b as i64 + 1) * sk;
        let mut c = BatchIds::default();
        let mut seen = std::collections::HashSet::new();
        for &id in chunk {
            let id = id as i64;
            c.negative += (id < 0) as usize;
            let valid = opts.resolve(shape, b, id as i32).is_some();
            c.valid += valid as usize;
            match opts.key_ids {
                KeyIds::Global => c.foreign += (valid && !own.contains(&id)) as usize,
                KeyIds::Local => {
                    if !valid && own.contains(&id) {
                        c.own_if_global += 1;
                        seen.insert(id);
                    }
                }
            }
        }
        c.own_if_global_distinct = seen.len();
        c
    }
}

/// Checks that the ids agree with the convention given (B > 1; with one
/// batch both conventions read every id alike), one rule per convention:
/// - global: every valid id is a row of its own batch's keys
///   `[b*S_k, (b+1)*S_k)`; an id into another batch's keys is what local
///   ids (and local padding written as `S_k`) read as global ids look like;
/// - local: a batch `b >= 1` with no valid local id but at least two
///   distinct ids that would be its own keys as global ids holds global
///   ids (as local ids they are all padding: all-zero gradients).
///
/// A case that fails is an error naming the batch, the counts and the fix,
/// unless `trust`. Returns a line with the id counts (valid, padding,
/// negative, out of range).
pub fn check_ids(
    shape: &Shape,
    opts: &Options,
    ids: &[i32],
    trust: bool,
    inp: &str,
) -> Res<String> {
    let per_batch = shape.seq_q * shape.topk;
    let (mut valid, mut negative) = (0usize, 0usize);
    let (this, that) = match opts.key_ids {
        KeyIds::Global => ("global", "local"),
        KeyIds::Local => ("local", "global"),
    };
    for (b, chunk) in ids.chunks(per_batch.max(1)).enumerate() {
        let c = BatchIds::count(b, chunk, shape, opts);
        valid += c.valid;
        negative += c.negative;
        if shape.batch <= 1 || trust {
            continue;
        }
        let wrong = match opts.key_ids {
            KeyIds::Global if c.foreign > 0 => Some(format!(
                "{} of its {} ids are rows of another batch's keys as global ids",
                c.foreign,
                chunk.len()
            )),
            KeyIds::Local if b > 0 && c.valid == 0 && c.own_if_global_distinct >= 2 => {
                Some(format!(
                    "none of its {} ids is a valid local id, and {} of them are its own keys as global ids",
                    chunk.len(),
                    c.own_if_global
                ))
            }
            _ => None,
        };
        if let Some(why) = wrong {
            return Err(format!(
                "{inp}: topk_indices: batch {b}: {why}; the file looks like it holds {that} ids: pass --ids {that} (or --trust-ids to replay them as {this} ids)"
            ));
        }
    }
    Ok(format!(
        "topk_indices: {} slots, {valid} valid {this} ids, {} padding ({negative} negative, {} out of range)",
        ids.len(),
        ids.len() - valid,
        ids.len() - valid - negative
    ))
}
