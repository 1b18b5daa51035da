//! Typed errors. Every failed check names the tensor (or parameter) and what
//! was expected.
//!
//! What an error means for the buffers:
//! - Every variant but [`Error::Driver`] comes from a check that runs before
//!   the first write: the call that returned it has written nothing (on the
//!   GPU nothing was launched; on the CPU path, [`Error::HostMemory`]
//!   included, no output was touched).
//! - [`Error::Driver`] from [`crate::Plan::execute`] may come from a launch
//!   after earlier launches of the same call were queued: then `attn_score`
//!   may already hold grad_signal (or be partly overwritten), the dK
//!   accumulator may be zeroed, and every output is unspecified. Restore
//!   the targets before running again. Errors of kernels themselves (a
//!   fault) surface later, at the next synchronising call, as with any
//!   asynchronous CUDA work.

use cudarc::driver::DriverError;

/// Errors of plan creation and `execute`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A shape parameter is outside the supported envelope.
    #[error("unsupported shape: {name} = {value}; expected {expected}")]
    Shape {
        /// Parameter name (`heads`, `head_dim`, `batch`, ...).
        name: &'static str,
        /// The value given.
        value: usize,
        /// What is supported.
        expected: &'static str,
    },
    /// A scalar is not finite.
    #[error("{name} must be finite, got {value}")]
    NonFinite {
        /// Scalar name.
        name: &'static str,
        /// The value given.
        value: f32,
    },
    /// A tensor has the wrong number of elements.
    #[error("{tensor}: expected {expected} elements, got {actual}")]
    Length {
        /// Tensor name.
        tensor: &'static str,
        /// Elements the plan's shape requires.
        expected: usize,
        /// Elements given.
        actual: usize,
    },
    /// A `cu_seqlens` array of a packed variable-length dense shape is
    /// malformed (see [`crate::dense::Layout::Varlen`]).
    #[error("{tensor}[{index}] = {value}; expected {expected}")]
    CuSeqlens {
        /// `cu_seqlens_q` or `cu_seqlens_k`.
        tensor: &'static str,
        /// The offending entry.
        index: usize,
        /// Its value.
        value: usize,
        /// What was expected of it.
        expected: &'static str,
    },
    /// A tensor has the wrong element type for the plan's options.
    #[error("{tensor}: expected element type {expected}, got {actual}")]
    Dtype {
        /// Tensor name.
        tensor: &'static str,
        /// Type the options require.
        expected: &'static str,
        /// Type given.
        actual: &'static str,
    },
    /// A device address is not aligned as a kernel needs.
    #[error("{tensor}: device address {address:#x} must be {align}-byte aligned")]
    Alignment {
        /// Tensor name.
        tensor: &'static str,
        /// The address.
        address: u64,
        /// Required alignment in bytes.
        align: u64,
    },
    /// A buffer lives on another device/context than the plan.
    #[error("{tensor}: buffer belongs to another CUDA context than the plan (device {expected} expected)")]
    Device {
        /// Tensor (or `stream`).
        tensor: &'static str,
        /// The plan's device ordinal.
        expected: usize,
    },
    /// An output range overlaps an input or another output.
    #[error("{output} overlaps {other}: outputs must not alias any other tensor")]
    Overlap {
        /// The output tensor.
        output: &'static str,
        /// The tensor it overlaps.
        other: &'static str,
    },
    /// The workspace is missing or too small.
    #[error("workspace: {required} bytes required, {given} given")]
    Workspace {
        /// Bytes the plan needs (`Plan::workspace_bytes`).
        required: usize,
        /// Bytes given.
        given: usize,
    },
    /// The GPU is older than any module this crate embeds (compute
    /// capability below 9.0).
    #[error("unsupported GPU: compute capability {major}.{minor}; the kernels need compute capability 9.0 or newer")]
    UnsupportedDevice {
        /// Major compute capability.
        major: i32,
        /// Minor compute capability.
        minor: i32,
    },
    /// A kernel the plan needs asks for more shared memory per block than
    /// the GPU offers.
    #[error("{kernel} needs {required} bytes of shared memory per block; this GPU (compute capability {major}.{minor}) offers {available}")]
    SharedMemory {
        /// The kernel.
        kernel: &'static str,
        /// Bytes it needs.
        required: u32,
        /// Bytes the GPU offers a block (its opt-in maximum).
        available: u32,
        /// Major compute capability.
        major: i32,
        /// Minor compute capability.
        minor: i32,
    },
    /// The backend forced in `Options::backend` cannot run this plan.
    #[error("backend {backend} unavailable: {reason} (GPU compute capability {major}.{minor})")]
    BackendUnavailable {
        /// The requested backend.
        backend: &'static str,
        /// Why it cannot run (GPU or shape).
        reason: &'static str,
        /// Major compute capability.
        major: i32,
        /// Minor compute capability.
        minor: i32,
    },
    /// What was asked for exists in the API but not yet in the library:
    /// today, dense mode where its GPU path does not run
    /// ([`crate::dense::Plan::execute`] and
    /// [`crate::dense::Plan::execute_raw`]; `NotImplementedError` in
    /// Python). Returned after every check of the call passed and before
    /// anything is written.
    #[error("not implemented yet: {what}")]
    NotImplemented {
        /// What is missing.
        what: &'static str,
    },
    /// The kernel module could not be loaded on the GPU: neither the machine
    /// code shipped for it (where there is some) nor the PTX, which needs a
    /// driver that knows its PTX ISA version (CUDA 12.9 or newer for the
    /// Blackwell module, 12.1 for the others).
    #[error(
        "cannot load the kernels on {gpu} (compute capability {major}.{minor}); tried {tried}"
    )]
    ModuleLoad {
        /// The GPU's name as the driver reports it.
        gpu: String,
        /// Major compute capability.
        major: i32,
        /// Minor compute capability.
        minor: i32,
        /// Each image tried (target and kind) with the driver's error.
        tried: String,
    },
    /// The PTX override (`INDEXER_PTX_DIR`, bring-up and debugging only)
    /// could not be read.
    #[error("{path}: {reason} (PTX override, INDEXER_PTX_DIR)")]
    PtxOverride {
        /// The file the override points to.
        path: String,
        /// The IO error.
        reason: String,
    },
    /// Host memory for the CPU path (outputs, accumulators, scratch) could
    /// not be allocated. Returned before any output is written.
    #[error("out of host memory: {what} needs {bytes} bytes")]
    HostMemory {
        /// What the memory was for.
        what: &'static str,
        /// Bytes requested.
        bytes: usize,
    },
    /// A CUDA driver call failed (see the module docs for what has been
    /// written when this comes from `execute`).
    #[error("CUDA driver error: {0}")]
    Driver(#[from] DriverError),
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
