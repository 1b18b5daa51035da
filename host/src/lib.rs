//! Backward pass of the DeepSeek Sparse Attention lightning indexer.
//!
//! Given the indexer's inputs (`index_q`, `weights`, `index_k`), the main
//! attention's distribution over each query row's `topk` selected keys
//! (`attn_score`, the target), the indexer's own distribution over them
//! (`index_score`, the predict) and the key ids (`topk_indices`), computes
//! the gradients of the KL loss: `d_index_q`, `d_weights`, `d_index_k`, and
//! writes the score gradient (grad_signal) over `attn_score`. The math and
//! the contract are in `docs/spec.md` of the repository.
//!
//! - [`Plan`]: built once for a [`Shape`] and [`Options`] on a CUDA context;
//!   [`Plan::execute`] validates everything, then runs on the caller's
//!   stream (GPU kernels written in Rust, PTX embedded in this crate).
//! - [`cpu`]: a multi-threaded f64 implementation of the same math: the test
//!   oracle, and [`cpu::execute`], the fallback where no GPU is present.
//!
//! Runs on: NVIDIA GPUs of compute capability 9.0 or newer, tested on an
//! H200 (sm_90). Other GPUs load the `sm_100f` module (10.0, 10.3) or the
//! portable `sm_90` module (any other, JIT-compiled by the driver) and run
//! the `mma.sync` row kernels ([`select()`] has the table). The Blackwell
//! path (sm_100/sm_103, tcgen05 kernels) is compiled and assembled for
//! `sm_100f`, not executed (no such GPU available): [`Backend::Auto`] never
//! picks it while [`TCGEN05_VALIDATED`] is empty; `Options { backend:
//! Backend::Blackwell, .. }` opts in. [`bringup`] holds the checks the
//! first owner of such a GPU runs before that (compiled, not executed).

mod args;
pub mod bringup;
pub mod cpu;
mod error;
mod events;
pub mod gpu;
mod launch;
pub mod oneshot;
mod plan;
mod select;
mod shape;
pub mod watchdog;

pub use args::{GradOut, Inputs, Outputs};
pub use cudarc;
pub use error::{Error, Result};
pub use events::{StageEvents, StageTimes};
pub use gpu::cuda_device_count;
pub use half::bf16;
pub use plan::Plan;
pub use select::{select, select_backend, Selection, TCGEN05_VALIDATED};
pub use shape::{Backend, GradDtype, KeyIds, Options, ScoreKind, Shape};

/// The README's code blocks, compiled as doctests so the API example there
/// cannot drift from the API.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
