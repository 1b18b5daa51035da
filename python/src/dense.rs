//! Dense mode in the native module: [`PyDensePlan`] (a cached
//! [`dense::Plan`] running [`dense::Plan::execute_raw`] on PyTorch's
//! addresses and stream) and [`dense_cpu_execute`] ([`dense::cpu::execute`]
//! on host addresses).
//!
//! The layout comes as `bshd=(B, S_q, S_k)` or as `cu_seqlens_q`,
//! `cu_seqlens_k` (lists of B + 1 offsets) with `score_cols` (the columns
//! of the packed score tensors, by default the longest key sequence).

use super::{build_plan, check_host, grad_dtype, py_err, HostArg};
use dsa_indexer_bwd::cpu::HostGrad;
use dsa_indexer_bwd::dense::{self, cpu::HostInputs, cpu::HostOutputs, DenseRawBuffers};
use dsa_indexer_bwd::{bf16, GradDtype, Options};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// `(B, S_q, S_k)`.
pub(crate) type Bshd = (usize, usize, usize);

/// The dense shape of the layout arguments (exactly one of `bshd` and
/// the two `cu_seqlens`), validated.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dense_shape(
    heads: usize,
    head_dim: usize,
    bshd: Option<Bshd>,
    cu_seqlens_q: Option<Vec<usize>>,
    cu_seqlens_k: Option<Vec<usize>>,
    score_cols: Option<usize>,
    q_offset: Option<Vec<i64>>,
    ratio: usize,
) -> PyResult<dense::Shape> {
    let shape = match (bshd, cu_seqlens_q, cu_seqlens_k) {
        (Some((b, sq, sk)), None, None) => {
            if score_cols.is_some_and(|c| c != sk) {
                return Err(PyValueError::new_err(
                    "score_cols: a BSHD layout has S_k score columns",
                ));
            }
            dense::Shape::bshd(b, sq, sk, heads, head_dim)
        }
        (None, Some(q), Some(k)) => {
            let mut s = dense::Shape::varlen(q, k, heads, head_dim);
            if let (Some(c), dense::Layout::Varlen { score_cols, .. }) = (score_cols, &mut s.layout)
            {
                *score_cols = c;
            }
            s
        }
        _ => {
            return Err(PyValueError::new_err(
                "layout: give bshd=(B, S_q, S_k), or both cu_seqlens_q and cu_seqlens_k",
            ))
        }
    };
    let shape = shape
        .with_q_offset(q_offset.unwrap_or_default())
        .with_ratio(ratio);
    shape.validate().map_err(py_err)?;
    Ok(shape)
}

/// Options of dense mode: `sm_scale`, the two output types and the
/// deterministic mode (the other fields do not apply).
fn dense_options(
    sm_scale: f32,
    d_index_k: &str,
    d_weights: &str,
    deterministic: bool,
) -> PyResult<Options> {
    let opts = Options {
        sm_scale,
        d_index_k: grad_dtype(d_index_k, "d_index_k")?,
        d_weights: grad_dtype(d_weights, "d_weights")?,
        deterministic,
        ..Options::default()
    };
    opts.validate().map_err(py_err)?;
    Ok(opts)
}

/// A dense backward plan for one device, layout and set of options (the
/// Python layer caches them).
#[pyclass(frozen, name = "DensePlan", module = "dsa_indexer_bwd._native")]
pub(crate) struct PyDensePlan {
    plan: dense::Plan,
    device: usize,
}

#[pymethods]
impl PyDensePlan {
    /// Builds the plan on the primary context of CUDA device `device`.
    #[new]
    #[pyo3(signature = (device, heads, head_dim, *, bshd=None, cu_seqlens_q=None,
                        cu_seqlens_k=None, score_cols=None, q_offset=None, ratio=1,
                        sm_scale=1.0, d_index_k="float32", d_weights="bfloat16",
                        deterministic=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        device: usize,
        heads: usize,
        head_dim: usize,
        bshd: Option<Bshd>,
        cu_seqlens_q: Option<Vec<usize>>,
        cu_seqlens_k: Option<Vec<usize>>,
        score_cols: Option<usize>,
        q_offset: Option<Vec<i64>>,
        ratio: usize,
        sm_scale: f32,
        d_index_k: &str,
        d_weights: &str,
        deterministic: bool,
    ) -> PyResult<Self> {
        let shape = dense_shape(
            heads,
            head_dim,
            bshd,
            cu_seqlens_q,
            cu_seqlens_k,
            score_cols,
            q_offset,
            ratio,
        )?;
        let opts = dense_options(sm_scale, d_index_k, d_weights, deterministic)?;
        let plan = build_plan(py, device, |ctx| dense::Plan::new(ctx, shape, opts))?;
        Ok(PyDensePlan { plan, device })
    }

    /// Device workspace bytes `execute` needs (f32 dK accumulator for a
    /// bf16 `d_index_k`, else 0; deterministic mode's tables with it).
    #[getter]
    fn workspace_bytes(&self) -> usize {
        self.plan.workspace_bytes()
    }

    /// The CUDA device ordinal the plan runs on.
    #[getter]
    fn device(&self) -> usize {
        self.device
    }

    /// Whether `execute` runs on this GPU and shape (else it raises
    /// `NotImplementedError` after its checks).
    #[getter]
    fn on_gpu(&self) -> bool {
        self.plan.on_gpu()
    }

    /// Queues the dense backward on the raw stream handle `stream`, on
    /// device addresses (each buffer at the shape's element count; the
    /// Python layer checks that), without synchronising. `index_score`
    /// holds the logits and receives grad_signal.
    #[pyo3(signature = (stream, index_q, weights, index_k, attn_score, attn_l1norm, index_lse,
                        grad_loss, index_score, d_index_q, d_weights, d_index_k, workspace,
                        workspace_bytes, loss_coeff, d_weights_dtype, d_index_k_dtype))]
    #[allow(clippy::too_many_arguments)]
    fn execute(
        &self,
        py: Python<'_>,
        stream: usize,
        index_q: u64,
        weights: u64,
        index_k: u64,
        attn_score: u64,
        attn_l1norm: u64,
        index_lse: u64,
        grad_loss: u64,
        index_score: u64,
        d_index_q: u64,
        d_weights: u64,
        d_index_k: u64,
        workspace: u64,
        workspace_bytes: usize,
        loss_coeff: f32,
        d_weights_dtype: &str,
        d_index_k_dtype: &str,
    ) -> PyResult<()> {
        let bufs = DenseRawBuffers {
            index_q,
            weights,
            index_k,
            attn_score,
            attn_l1norm,
            index_lse,
            grad_loss,
            index_score,
            d_index_q,
            d_weights,
            d_index_k,
            workspace,
            workspace_bytes,
            d_weights_dtype: grad_dtype(d_weights_dtype, "d_weights")?,
            d_index_k_dtype: grad_dtype(d_index_k_dtype, "d_index_k")?,
        };
        let plan = &self.plan;
        // SAFETY: the Python layer passes the data_ptr()s of live,
        // contiguous tensors on this plan's device of the shape's sizes
        // and documented types, and the current stream of that device;
        // the plan's context is the device's primary context (`context`),
        // PyTorch's.
        py.detach(|| unsafe { plan.execute_raw(stream as *mut _, &bufs, loss_coeff) })
            .map_err(py_err)
    }
}

/// The dense CPU path (`dense::cpu::execute`, f64 inside, multi-threaded)
/// on host addresses: `index_score` holds the logits and receives
/// grad_signal; the other outputs are overwritten. Runs without the GIL.
#[pyfunction]
#[pyo3(signature = (heads, head_dim, index_q, weights, index_k, attn_score, attn_l1norm,
                    index_score, index_lse, d_index_q, d_weights, d_index_k, grad_loss,
                    loss_coeff, *, bshd=None, cu_seqlens_q=None, cu_seqlens_k=None,
                    score_cols=None, q_offset=None, ratio=1, sm_scale=1.0,
                    d_index_k_dtype="float32", d_weights_dtype="bfloat16"))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn dense_cpu_execute(
    py: Python<'_>,
    heads: usize,
    head_dim: usize,
    index_q: usize,
    weights: usize,
    index_k: usize,
    attn_score: usize,
    attn_l1norm: usize,
    index_score: usize,
    index_lse: usize,
    d_index_q: usize,
    d_weights: usize,
    d_index_k: usize,
    grad_loss: f32,
    loss_coeff: f32,
    bshd: Option<Bshd>,
    cu_seqlens_q: Option<Vec<usize>>,
    cu_seqlens_k: Option<Vec<usize>>,
    score_cols: Option<usize>,
    q_offset: Option<Vec<i64>>,
    ratio: usize,
    sm_scale: f32,
    d_index_k_dtype: &str,
    d_weights_dtype: &str,
) -> PyResult<()> {
    let s = dense_shape(
        heads,
        head_dim,
        bshd,
        cu_seqlens_q,
        cu_seqlens_k,
        score_cols,
        q_offset,
        ratio,
    )?;
    let opts = dense_options(sm_scale, d_index_k_dtype, d_weights_dtype, false)?;
    let (score, rows) = (s.score_len(), s.rows());
    let (q, w, k) = (s.q_len(), s.w_len(), s.k_len());
    check_host(&[
        HostArg::new("index_q", index_q, q, 2, false),
        HostArg::new("weights", weights, w, 2, false),
        HostArg::new("index_k", index_k, k, 2, false),
        HostArg::new("attn_score", attn_score, score, 4, false),
        HostArg::new("attn_l1norm", attn_l1norm, rows, 4, false),
        HostArg::new("index_lse", index_lse, rows, 4, false),
        HostArg::new("index_score", index_score, score, 4, true),
        HostArg::new("d_index_q", d_index_q, q, 2, true),
        HostArg::new("d_weights", d_weights, w, opts.d_weights.bytes(), true),
        HostArg::new("d_index_k", d_index_k, k, opts.d_index_k.bytes(), true),
    ])?;
    py.detach(|| {
        // SAFETY: the caller (the Python layer, or a test holding the
        // buffers) passes addresses of live host buffers of at least
        // these element counts and types; `check_host` checked them
        // non-null, aligned, and each output disjoint from every other
        // tensor, so the `&mut` slices alias nothing. The logits are
        // copied out of `index_score` (the shared slice ends there) before
        // the `&mut` slice over it is made.
        unsafe {
            let logits: Vec<f32> =
                std::slice::from_raw_parts(index_score as *const f32, score).to_vec();
            let x = HostInputs {
                index_q: std::slice::from_raw_parts(index_q as *const bf16, q),
                weights: std::slice::from_raw_parts(weights as *const bf16, w),
                index_k: std::slice::from_raw_parts(index_k as *const bf16, k),
                attn_score: std::slice::from_raw_parts(attn_score as *const f32, score),
                attn_l1norm: std::slice::from_raw_parts(attn_l1norm as *const f32, rows),
                index_score: &logits,
                index_lse: std::slice::from_raw_parts(index_lse as *const f32, rows),
                grad_loss,
                loss_coeff,
            };
            let grad = |addr: usize, len: usize, d: GradDtype| match d {
                GradDtype::F32 => {
                    HostGrad::F32(std::slice::from_raw_parts_mut(addr as *mut f32, len))
                }
                GradDtype::Bf16 => {
                    HostGrad::Bf16(std::slice::from_raw_parts_mut(addr as *mut bf16, len))
                }
            };
            let out = HostOutputs {
                index_score: std::slice::from_raw_parts_mut(index_score as *mut f32, score),
                d_index_q: std::slice::from_raw_parts_mut(d_index_q as *mut bf16, q),
                d_weights: grad(d_weights, w, opts.d_weights),
                d_index_k: grad(d_index_k, k, opts.d_index_k),
            };
            dense::cpu::execute(&s, &opts, &x, out)
        }
    })
    .map_err(py_err)
}
