//! `dsa_indexer_bwd._native`: the Rust half of the Python package.
//!
//! It knows nothing of PyTorch: the pure-Python layer
//! (`dsa_indexer_bwd/_torch.py`) checks the tensors and passes their
//! `data_ptr()`s, the sizes, the options and the raw handle of PyTorch's
//! current stream. On the GPU a cached [`Plan`] runs
//! [`Plan::execute_raw`] on the device's primary context (the one
//! PyTorch uses); on the CPU [`cpu::execute`] runs on slices made from the
//! host addresses. Dense mode has the same pair (module `dense`): a
//! `DensePlan` running `dense::Plan::execute_raw`, and `dense_cpu_execute`
//! running `dense::cpu::execute`. Errors of the crate become `ValueError` (a
//! bad argument), `TypeError` (a wrong element type), `MemoryError`,
//! `NotImplementedError` (no GPU path for this device or shape) or
//! `RuntimeError` (device and driver), with the crate's message.

use dsa_indexer_bwd::cpu::{self, HostGrad, HostInputs, HostOutputs};
use dsa_indexer_bwd::cudarc::driver::{result, CudaContext};
use dsa_indexer_bwd::{
    bf16, Backend, Error, GradDtype, KeyIds, Options, Plan, RawBuffers, ScoreKind, Shape,
};
use pyo3::exceptions::{
    PyMemoryError, PyNotImplementedError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};

mod dense;
mod forward;
use dense::{dense_cpu_execute, PyDensePlan};
use forward::{cpu_forward, dense_cpu_forward, PyDenseForwardPlan, PyForwardPlan};

/// The Python exception of a crate error.
fn py_err(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::Dtype { .. } => PyTypeError::new_err(msg),
        Error::Shape { .. }
        | Error::NonFinite { .. }
        | Error::Length { .. }
        | Error::CuSeqlens { .. }
        | Error::Alignment { .. }
        | Error::Device { .. }
        | Error::Overlap { .. }
        | Error::Workspace { .. } => PyValueError::new_err(msg),
        Error::HostMemory { .. } => PyMemoryError::new_err(msg),
        Error::NotImplemented { .. } => PyNotImplementedError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}

fn grad_dtype(name: &str, what: &str) -> PyResult<GradDtype> {
    match name {
        "float32" => Ok(GradDtype::F32),
        "bfloat16" => Ok(GradDtype::Bf16),
        _ => Err(PyValueError::new_err(format!(
            "{what}: expected 'float32' or 'bfloat16', got {name:?}"
        ))),
    }
}

/// The key-id convention named `name` (`"global"` or `"local"`).
fn key_ids_of(name: &str) -> PyResult<KeyIds> {
    match name {
        "global" => Ok(KeyIds::Global),
        "local" => Ok(KeyIds::Local),
        _ => Err(PyValueError::new_err(format!(
            "key_ids: expected 'global' or 'local', got {name:?}"
        ))),
    }
}

/// The score kind named `name` (`"probs"` or `"logprobs"`).
fn score_of(name: &str) -> PyResult<ScoreKind> {
    match name {
        "probs" => Ok(ScoreKind::Probs),
        "logprobs" => Ok(ScoreKind::LogProbs),
        _ => Err(PyValueError::new_err(format!(
            "score: expected 'probs' or 'logprobs', got {name:?}"
        ))),
    }
}

/// Options from the names the Python layer uses.
fn options(
    sm_scale: f32,
    key_ids: &str,
    score: &str,
    d_index_k: &str,
    d_weights: &str,
    backend: &str,
) -> PyResult<Options> {
    let (key_ids, score) = (key_ids_of(key_ids)?, score_of(score)?);
    let backend = match backend {
        "auto" => Backend::Auto,
        "hopper" => Backend::Hopper,
        "blackwell" => Backend::Blackwell,
        _ => {
            return Err(PyValueError::new_err(format!(
                "backend: expected 'auto', 'hopper' or 'blackwell', got {backend:?}"
            )))
        }
    };
    let opts = Options {
        sm_scale,
        key_ids,
        score,
        d_index_k: grad_dtype(d_index_k, "d_index_k")?,
        d_weights: grad_dtype(d_weights, "d_weights")?,
        backend,
        deterministic: false,
    };
    opts.validate().map_err(py_err)?;
    Ok(opts)
}

/// `(B, S_q, S_k, H, D, topk)`.
pub(crate) type Dims = (usize, usize, usize, usize, usize, usize);

fn shape(d: Dims) -> PyResult<Shape> {
    let s = Shape {
        batch: d.0,
        seq_q: d.1,
        seq_k: d.2,
        heads: d.3,
        head_dim: d.4,
        topk: d.5,
    };
    s.validate().map_err(py_err)?;
    Ok(s)
}

/// The primary context of each device used so far (retained once, kept
/// for the life of the process, as PyTorch keeps it).
static CONTEXTS: Mutex<Vec<(usize, Arc<CudaContext>)>> = Mutex::new(Vec::new());

fn context(ordinal: usize) -> Result<Arc<CudaContext>, Error> {
    let mut held = CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, c)) = held.iter().find(|(o, _)| *o == ordinal) {
        return Ok(c.clone());
    }
    let c = CudaContext::new(ordinal)?;
    held.push((ordinal, c.clone()));
    Ok(c)
}

/// A backward plan for one device, shape and set of options (the
/// Python layer caches them).
#[pyclass(frozen, name = "Plan", module = "dsa_indexer_bwd._native")]
struct PyPlan {
    plan: Plan,
    device: usize,
}

#[pymethods]
impl PyPlan {
    /// Builds the plan on the primary context of CUDA device `device`.
    #[new]
    #[pyo3(signature = (device, dims, sm_scale, key_ids, score, d_index_k, d_weights, backend="auto", deterministic=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        device: usize,
        dims: Dims,
        sm_scale: f32,
        key_ids: &str,
        score: &str,
        d_index_k: &str,
        d_weights: &str,
        backend: &str,
        deterministic: bool,
    ) -> PyResult<Self> {
        let shape = shape(dims)?;
        let mut opts = options(sm_scale, key_ids, score, d_index_k, d_weights, backend)?;
        opts.deterministic = deterministic;
        let plan = build_plan(py, device, |ctx| Plan::new(ctx, shape, opts))?;
        Ok(PyPlan { plan, device })
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

    /// The kernels `execute` launches, in order.
    #[getter]
    fn kernels(&self) -> Vec<&'static str> {
        self.plan.kernels().to_vec()
    }

    /// `"hopper"` or `"blackwell"`.
    #[getter]
    fn backend(&self) -> &'static str {
        match self.plan.backend() {
            Backend::Blackwell => "blackwell",
            _ => "hopper",
        }
    }

    /// Queues the backward on the raw stream handle `stream`, on device
    /// addresses (each buffer at the shape's element count, on the plan's
    /// device, `stream` the device's; the Python layer checks that),
    /// without synchronising.
    #[pyo3(signature = (stream, index_q, weights, index_k, index_score, topk_indices, grad_loss,
                        attn_score, d_index_q, d_weights, d_index_k, workspace, workspace_bytes,
                        loss_coeff, d_weights_dtype, d_index_k_dtype, ids_i64=false))]
    #[allow(clippy::too_many_arguments)]
    fn execute(
        &self,
        py: Python<'_>,
        stream: usize,
        index_q: u64,
        weights: u64,
        index_k: u64,
        index_score: u64,
        topk_indices: u64,
        grad_loss: u64,
        attn_score: u64,
        d_index_q: u64,
        d_weights: u64,
        d_index_k: u64,
        workspace: u64,
        workspace_bytes: usize,
        loss_coeff: f32,
        d_weights_dtype: &str,
        d_index_k_dtype: &str,
        ids_i64: bool,
    ) -> PyResult<()> {
        let bufs = RawBuffers {
            index_q,
            weights,
            index_k,
            index_score,
            topk_indices,
            grad_loss,
            attn_score,
            d_index_q,
            d_weights,
            d_index_k,
            workspace,
            workspace_bytes,
            d_weights_dtype: grad_dtype(d_weights_dtype, "d_weights")?,
            d_index_k_dtype: grad_dtype(d_index_k_dtype, "d_index_k")?,
            topk_indices_i64: ids_i64,
        };
        let plan = &self.plan;
        // SAFETY: the Python layer passes the data_ptr()s of live,
        // contiguous tensors of the shape's sizes and documented types,
        // all on this plan's device (it checked each tensor's device), and
        // the current stream of that device; the plan's context is the
        // device's primary context (`context`), PyTorch's.
        py.detach(|| unsafe {
            plan.execute_raw_on_plan_device(stream as *mut _, &bufs, loss_coeff)
        })
        .map_err(py_err)
    }
}

/// Whether CUDA device `device` exists (without a driver library cudarc
/// would panic on its first call).
fn check_device(device: usize) -> PyResult<()> {
    let count = dsa_indexer_bwd::cuda_device_count();
    if device >= count {
        return Err(PyRuntimeError::new_err(format!(
            "CUDA device {device} not found ({count} CUDA devices)"
        )));
    }
    Ok(())
}

/// Builds a plan with `build` on the primary context of `device`, without
/// the GIL (loading the module may JIT-compile PTX). Creating the context
/// and loading bind it to this thread; the thread's previous context
/// (PyTorch's current device) is restored after.
fn build_plan<P: Send>(
    py: Python<'_>,
    device: usize,
    build: impl FnOnce(&Arc<CudaContext>) -> Result<P, Error> + Send,
) -> PyResult<P> {
    check_device(device)?;
    py.detach(|| {
        let prev = result::ctx::get_current()?;
        let plan = context(device).and_then(|ctx| build(&ctx));
        if let Some(prev) = prev {
            // SAFETY: `prev` was current on this thread just before.
            unsafe { result::ctx::set_current(prev) }?;
        }
        plan
    })
    .map_err(py_err)
}

/// One host tensor for the CPU path: name, address, element count, size.
struct HostArg {
    name: &'static str,
    addr: usize,
    len: usize,
    elem: usize,
    output: bool,
}

impl HostArg {
    /// Tensor `name` at host address `addr`: `len` elements of `elem`
    /// bytes, written when `output`.
    const fn new(name: &'static str, addr: usize, len: usize, elem: usize, output: bool) -> Self {
        HostArg {
            name,
            addr,
            len,
            elem,
            output,
        }
    }
}

/// Checks host addresses before slices are made of them: non-null,
/// aligned to the element size, and no output overlapping another tensor
/// (a `&mut` slice may alias nothing).
fn check_host(args: &[HostArg]) -> PyResult<()> {
    for a in args {
        if a.addr == 0 || a.addr % a.elem != 0 {
            return Err(PyValueError::new_err(format!(
                "{}: host address {:#x} is null or not {}-byte aligned",
                a.name, a.addr, a.elem
            )));
        }
    }
    for o in args.iter().filter(|a| a.output) {
        for other in args.iter().filter(|a| a.name != o.name) {
            let (a0, a1) = (o.addr, o.addr + o.len * o.elem);
            let (b0, b1) = (other.addr, other.addr + other.len * other.elem);
            if a0 < b1 && b0 < a1 {
                return Err(PyValueError::new_err(format!(
                    "{} overlaps {}: outputs must not alias any other tensor",
                    o.name, other.name
                )));
            }
        }
    }
    Ok(())
}

/// The CPU path (`cpu::execute`, f64 inside, multi-threaded) on host
/// addresses: `attn_score` holds the targets and receives grad_signal;
/// the other outputs are overwritten. Runs without the GIL.
#[pyfunction]
#[pyo3(signature = (dims, index_q, weights, index_k, index_score, topk_indices, attn_score,
                    d_index_q, d_weights, d_index_k, grad_loss, loss_coeff, *, sm_scale=1.0,
                    key_ids="global", score="probs", d_index_k_dtype="float32",
                    d_weights_dtype="bfloat16"))]
#[allow(clippy::too_many_arguments)]
fn cpu_execute(
    py: Python<'_>,
    dims: Dims,
    index_q: usize,
    weights: usize,
    index_k: usize,
    index_score: usize,
    topk_indices: usize,
    attn_score: usize,
    d_index_q: usize,
    d_weights: usize,
    d_index_k: usize,
    grad_loss: f32,
    loss_coeff: f32,
    sm_scale: f32,
    key_ids: &str,
    score: &str,
    d_index_k_dtype: &str,
    d_weights_dtype: &str,
) -> PyResult<()> {
    let s = shape(dims)?;
    let opts = options(
        sm_scale,
        key_ids,
        score,
        d_index_k_dtype,
        d_weights_dtype,
        "auto",
    )?;
    let (slots, q, w, k) = (s.slots(), s.q_len(), s.w_len(), s.k_len());
    check_host(&[
        HostArg::new("index_q", index_q, q, 2, false),
        HostArg::new("weights", weights, w, 2, false),
        HostArg::new("index_k", index_k, k, 2, false),
        HostArg::new("index_score", index_score, slots, 4, false),
        HostArg::new("topk_indices", topk_indices, slots, 4, false),
        HostArg::new("attn_score", attn_score, slots, 4, true),
        HostArg::new("d_index_q", d_index_q, q, 2, true),
        HostArg::new("d_weights", d_weights, w, opts.d_weights.bytes(), true),
        HostArg::new("d_index_k", d_index_k, k, opts.d_index_k.bytes(), true),
    ])?;
    py.detach(|| {
        // SAFETY: the caller (the Python layer, or a test holding the
        // buffers) passes addresses of live host buffers of at least
        // these element counts and types; `check_host` checked them
        // non-null, aligned, and each output disjoint from every other
        // tensor, so the `&mut` slices alias nothing. The targets are
        // copied out of `attn_score` (the shared slice ends there) before
        // the `&mut` slice over it is made.
        unsafe {
            let targets: Vec<f32> =
                std::slice::from_raw_parts(attn_score as *const f32, slots).to_vec();
            let x = HostInputs {
                index_q: std::slice::from_raw_parts(index_q as *const bf16, q),
                weights: std::slice::from_raw_parts(weights as *const bf16, w),
                index_k: std::slice::from_raw_parts(index_k as *const bf16, k),
                attn_score: &targets,
                index_score: std::slice::from_raw_parts(index_score as *const f32, slots),
                topk_indices: std::slice::from_raw_parts(topk_indices as *const i32, slots),
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
                attn_score: std::slice::from_raw_parts_mut(attn_score as *mut f32, slots),
                d_index_q: std::slice::from_raw_parts_mut(d_index_q as *mut bf16, q),
                d_weights: grad(d_weights, w, opts.d_weights),
                d_index_k: grad(d_index_k, k, opts.d_index_k),
            };
            cpu::execute(&s, &opts, &x, out)
        }
    })
    .map_err(py_err)
}

/// Number of CUDA devices the driver reports (0 without a driver).
#[pyfunction]
fn cuda_device_count() -> usize {
    dsa_indexer_bwd::cuda_device_count()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPlan>()?;
    m.add_class::<PyDensePlan>()?;
    m.add_class::<PyForwardPlan>()?;
    m.add_class::<PyDenseForwardPlan>()?;
    m.add_function(wrap_pyfunction!(cpu_forward, m)?)?;
    m.add_function(wrap_pyfunction!(dense_cpu_forward, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_execute, m)?)?;
    m.add_function(wrap_pyfunction!(dense_cpu_execute, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_device_count, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
