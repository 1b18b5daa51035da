//! The forward in the native module: [`PyForwardPlan`] and
//! [`PyDenseForwardPlan`] (cached `forward::Plan` / `forward::DensePlan`
//! running `execute_raw` on PyTorch's addresses and stream), and
//! [`cpu_forward`] / [`dense_cpu_forward`] (`forward::cpu` on host
//! addresses).

use super::dense::{dense_shape, Bshd};
use super::{build_plan, check_host, key_ids_of, py_err, score_of, shape, Dims, HostArg};
use dsa_indexer_bwd::bf16;
use dsa_indexer_bwd::forward::{self, cpu, DensePlan, Kernel, Plan, RawDense, RawForward};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Forward options from the Python layer's names.
fn fwd_options(
    sm_scale: f32,
    key_ids: &str,
    score: &str,
    kernel: &str,
) -> PyResult<forward::Options> {
    let (key_ids, score) = (key_ids_of(key_ids)?, score_of(score)?);
    let kernel = match kernel {
        "auto" => Kernel::Auto,
        "portable" => Kernel::Portable,
        _ => {
            return Err(PyValueError::new_err(format!(
                "kernel: expected 'auto' or 'portable', got {kernel:?}"
            )))
        }
    };
    let o = forward::Options {
        sm_scale,
        key_ids,
        score,
        kernel,
    };
    o.validate().map_err(py_err)?;
    Ok(o)
}

/// A sparse forward plan for one device, shape and set of options.
#[pyclass(frozen, name = "ForwardPlan", module = "dsa_indexer_bwd._native")]
pub(crate) struct PyForwardPlan {
    plan: Plan,
}

#[pymethods]
impl PyForwardPlan {
    /// Builds the plan on the primary context of CUDA device `device`.
    #[new]
    #[pyo3(signature = (device, dims, sm_scale, key_ids, score, kernel="auto"))]
    fn new(
        py: Python<'_>,
        device: usize,
        dims: Dims,
        sm_scale: f32,
        key_ids: &str,
        score: &str,
        kernel: &str,
    ) -> PyResult<Self> {
        let s = shape(dims)?;
        let o = fwd_options(sm_scale, key_ids, score, kernel)?;
        let plan = build_plan(py, device, |ctx| Plan::new(ctx, s, o))?;
        Ok(PyForwardPlan { plan })
    }

    /// The kernel `execute` launches.
    #[getter]
    fn kernel(&self) -> &'static str {
        self.plan.kernel()
    }

    /// Queues the forward on the raw stream `stream` without
    /// synchronising: `index_score` and `lse` written.
    #[pyo3(signature = (stream, index_q, weights, index_k, topk_indices, index_score, lse, ids_i64))]
    #[allow(clippy::too_many_arguments)]
    fn execute(
        &self,
        py: Python<'_>,
        stream: usize,
        index_q: u64,
        weights: u64,
        index_k: u64,
        topk_indices: u64,
        index_score: u64,
        lse: u64,
        ids_i64: bool,
    ) -> PyResult<()> {
        let b = RawForward {
            index_q,
            weights,
            index_k,
            topk_indices,
            index_score,
            lse,
            topk_indices_i64: ids_i64,
        };
        let plan = &self.plan;
        // SAFETY: the Python layer passes the data_ptr()s of live,
        // contiguous tensors on the plan's device of the shape's sizes
        // and types, and that device's current stream; the plan's context
        // is the device's primary context, PyTorch's.
        py.detach(|| unsafe { plan.execute_raw(stream as *mut _, &b) })
            .map_err(py_err)
    }
}

/// A dense forward plan for one device and layout.
#[pyclass(frozen, name = "DenseForwardPlan", module = "dsa_indexer_bwd._native")]
pub(crate) struct PyDenseForwardPlan {
    plan: DensePlan,
}

#[pymethods]
impl PyDenseForwardPlan {
    /// Builds the plan on the primary context of CUDA device `device`.
    #[new]
    #[pyo3(signature = (device, heads, head_dim, *, bshd=None, cu_seqlens_q=None,
                        cu_seqlens_k=None, score_cols=None, q_offset=None, ratio=1,
                        sm_scale=1.0, kernel="auto"))]
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
        kernel: &str,
    ) -> PyResult<Self> {
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
        let o = fwd_options(sm_scale, "global", "probs", kernel)?;
        let plan = build_plan(py, device, |ctx| DensePlan::new(ctx, s, o))?;
        Ok(PyDenseForwardPlan { plan })
    }

    /// The kernel `execute` launches.
    #[getter]
    fn kernel(&self) -> &'static str {
        self.plan.kernel()
    }

    /// Queues the dense forward on the raw stream `stream`: raw logits
    /// into `index_score`, log-sum-exps into `index_lse`.
    #[pyo3(signature = (stream, index_q, weights, index_k, index_score, index_lse))]
    #[allow(clippy::too_many_arguments)]
    fn execute(
        &self,
        py: Python<'_>,
        stream: usize,
        index_q: u64,
        weights: u64,
        index_k: u64,
        index_score: u64,
        index_lse: u64,
    ) -> PyResult<()> {
        let b = RawDense {
            index_q,
            weights,
            index_k,
            index_score,
            index_lse,
        };
        let plan = &self.plan;
        // SAFETY: as `PyForwardPlan::execute`.
        py.detach(|| unsafe { plan.execute_raw(stream as *mut _, &b) })
            .map_err(py_err)
    }
}

/// The sparse forward on host addresses (`forward::cpu::execute`, f64
/// inside): `index_score` and `lse` written. Runs without the GIL.
#[pyfunction]
#[pyo3(signature = (dims, index_q, weights, index_k, topk_indices, index_score, lse, *,
                    sm_scale=1.0, key_ids="global", score="probs", ids_i64=false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn cpu_forward(
    py: Python<'_>,
    dims: Dims,
    index_q: usize,
    weights: usize,
    index_k: usize,
    topk_indices: usize,
    index_score: usize,
    lse: usize,
    sm_scale: f32,
    key_ids: &str,
    score: &str,
    ids_i64: bool,
) -> PyResult<()> {
    let s = shape(dims)?;
    let o = fwd_options(sm_scale, key_ids, score, "auto")?;
    let id = if ids_i64 { 8 } else { 4 };
    let (slots, q, w, k) = (s.slots(), s.q_len(), s.w_len(), s.k_len());
    check_host(&[
        HostArg::new("index_q", index_q, q, 2, false),
        HostArg::new("weights", weights, w, 2, false),
        HostArg::new("index_k", index_k, k, 2, false),
        HostArg::new("topk_indices", topk_indices, slots, id, false),
        HostArg::new("index_score", index_score, slots, 4, true),
        HostArg::new("lse", lse, s.rows(), 4, true),
    ])?;
    py.detach(|| {
        // SAFETY: the caller passes live host buffers of these element
        // counts and types; `check_host` checked them non-null, aligned,
        // and each output disjoint from every other tensor.
        unsafe {
            let q = std::slice::from_raw_parts(index_q as *const bf16, q);
            let w = std::slice::from_raw_parts(weights as *const bf16, w);
            let k = std::slice::from_raw_parts(index_k as *const bf16, k);
            let out = std::slice::from_raw_parts_mut(index_score as *mut f32, slots);
            let l = std::slice::from_raw_parts_mut(lse as *mut f32, s.rows());
            if ids_i64 {
                let ids = std::slice::from_raw_parts(topk_indices as *const i64, slots);
                let x = cpu::HostInputs {
                    index_q: q,
                    weights: w,
                    index_k: k,
                    topk_indices: ids,
                };
                cpu::execute(&s, &o, &x, out, l)
            } else {
                let ids = std::slice::from_raw_parts(topk_indices as *const i32, slots);
                let x = cpu::HostInputs {
                    index_q: q,
                    weights: w,
                    index_k: k,
                    topk_indices: ids,
                };
                cpu::execute(&s, &o, &x, out, l)
            }
        }
    })
    .map_err(py_err)
}

/// The dense forward on host addresses (`forward::cpu::dense_execute`).
#[pyfunction]
#[pyo3(signature = (heads, head_dim, index_q, weights, index_k, index_score, index_lse, *,
                    bshd=None, cu_seqlens_q=None, cu_seqlens_k=None, score_cols=None,
                    q_offset=None, ratio=1, sm_scale=1.0))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn dense_cpu_forward(
    py: Python<'_>,
    heads: usize,
    head_dim: usize,
    index_q: usize,
    weights: usize,
    index_k: usize,
    index_score: usize,
    index_lse: usize,
    bshd: Option<Bshd>,
    cu_seqlens_q: Option<Vec<usize>>,
    cu_seqlens_k: Option<Vec<usize>>,
    score_cols: Option<usize>,
    q_offset: Option<Vec<i64>>,
    ratio: usize,
    sm_scale: f32,
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
    let o = fwd_options(sm_scale, "global", "probs", "auto")?;
    let (q, w, k) = (s.q_len(), s.w_len(), s.k_len());
    check_host(&[
        HostArg::new("index_q", index_q, q, 2, false),
        HostArg::new("weights", weights, w, 2, false),
        HostArg::new("index_k", index_k, k, 2, false),
        HostArg::new("index_score", index_score, s.score_len(), 4, true),
        HostArg::new("index_lse", index_lse, s.rows(), 4, true),
    ])?;
    py.detach(|| {
        // SAFETY: as `cpu_forward`.
        unsafe {
            let x = cpu::DenseHostInputs {
                index_q: std::slice::from_raw_parts(index_q as *const bf16, q),
                weights: std::slice::from_raw_parts(weights as *const bf16, w),
                index_k: std::slice::from_raw_parts(index_k as *const bf16, k),
            };
            let out = std::slice::from_raw_parts_mut(index_score as *mut f32, s.score_len());
            let l = std::slice::from_raw_parts_mut(index_lse as *mut f32, s.rows());
            cpu::dense_execute(&s, &o, &x, out, l)
        }
    })
    .map_err(py_err)
}
