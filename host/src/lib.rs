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
//!   stream (GPU kernels written in Rust, embedded in this crate as PTX and
//!   as machine code; one module per context, shared by every plan).
//! - [`cpu`]: a multi-threaded f64 implementation of the same math: the test
//!   oracle, and [`cpu::execute`], the fallback where no GPU is present.
//! - [`dense`]: dense mode (the warm-up stage: every causal key, raw
//!   scores): on compute capability 9.0 its own tile kernel (H = 64,
//!   D = 128) or the sparse path's wgmma kernels (other H x D), the CPU
//!   reference and fallback elsewhere ([`dense::Plan::execute`] returns a
//!   typed error on other GPUs).
//!
//! Runs on: NVIDIA GPUs of compute capability 9.0 or newer, tested on an
//! H200 (sm_90). Other GPUs load the `sm_100f` module (10.0, 10.3) or the
//! portable `sm_90` module (any other; machine code on 12.x, JIT-compiled by
//! the driver elsewhere) and run
//! the `mma.sync` row kernels ([`select()`] has the table). The Blackwell
//! path (sm_100/sm_103, tcgen05 kernels) is compiled and assembled for
//! `sm_100f`, not executed (no such GPU available): [`Backend::Auto`] never
//! picks it while [`TCGEN05_VALIDATED`] is empty; `Options { backend:
//! Backend::Blackwell, .. }` opts in. The checks the first owner of such a
//! GPU runs before that (compiled, not executed) are instruments, with the
//! benchmark's ceilings: the `lab` module, behind the `lab` feature (off by
//! default; not part of this API), loads their own kernel module, which no
//! plan loads.
//!
//! # Example
//!
//! The CPU path on a two-row problem; [`cuda_device_count`] is 0 on a
//! machine without a CUDA driver. On a GPU the same call shapes take
//! [`Plan::execute`] (device buffers, the caller's stream) or
//! [`oneshot::run`] (host data, GPU when present).
//!
//! ```
//! use dsa_indexer_bwd::cpu::{self, HostGrad, HostInputs, HostOutputs};
//! use dsa_indexer_bwd::{bf16, cuda_device_count, Options, Shape};
//!
//! # fn main() -> Result<(), dsa_indexer_bwd::Error> {
//! println!("CUDA devices: {}", cuda_device_count());
//! let shape = Shape { batch: 1, seq_q: 2, seq_k: 4, heads: 16, head_dim: 64, topk: 2 };
//! let opts = Options { sm_scale: 0.125, ..Options::default() }; // f32 dK, bf16 dW
//! let q = vec![bf16::from_f32(0.5); shape.q_len()];
//! let w = vec![bf16::ONE; shape.w_len()];
//! let k: Vec<bf16> = (0..shape.k_len()).map(|i| bf16::from_f32(i as f32 / 256.0)).collect();
//! let target = vec![0.75f32, 0.25, 0.5, 0.5]; // attn_score, one row of topk per query row
//! let predict = vec![0.5f32; shape.slots()]; // index_score
//! let ids = vec![0, 1, 2, 3]; // key rows of the selected slots
//! let x = HostInputs {
//!     index_q: &q, weights: &w, index_k: &k, attn_score: &target, index_score: &predict,
//!     topk_indices: &ids, grad_loss: 1.0, loss_coeff: 1.0,
//! };
//! let mut grad_signal = target.clone(); // targets in, grad_signal out
//! let mut d_q = vec![bf16::ZERO; shape.q_len()];
//! let (mut d_w, mut d_k) = (vec![bf16::ZERO; shape.w_len()], vec![0.0f32; shape.k_len()]);
//! cpu::execute(&shape, &opts, &x, HostOutputs {
//!     attn_score: &mut grad_signal,
//!     d_index_q: &mut d_q,
//!     d_weights: HostGrad::Bf16(&mut d_w),
//!     d_index_k: HostGrad::F32(&mut d_k),
//! })?;
//! assert_ne!(grad_signal[0], 0.0); // row 0's target differs from its predict
//! assert_eq!(grad_signal[2..], [0.0, 0.0]); // row 1's does not
//! # Ok(()) }
//! ```

mod args;
pub mod cpu;
pub mod dense;
mod error;
mod events;
pub mod forward;
pub mod gpu;
#[cfg(feature = "lab")]
pub mod lab;
mod launch;
mod modules;
pub mod oneshot;
mod plan;
mod raw;
mod select;
mod shape;
mod tma;
// Arms watchdog builds when a module is loaded; read by the bring-up kit
// (`lab::watchdog`).
#[cfg_attr(not(feature = "lab"), allow(dead_code))]
mod watchdog;

pub use args::{GradOut, Inputs, Outputs, TopkId};
pub use cudarc;
pub use error::{Error, Result};
pub use events::{StageEvents, StageTimes};
pub use gpu::cuda_device_count;
pub use half::bf16;
pub use modules::{loaded_modules, ModuleImage};
pub use plan::Plan;
pub use raw::RawBuffers;
pub use select::{select, select_backend, Selection, TCGEN05_VALIDATED};
pub use shape::{Backend, GradDtype, KeyIds, Options, ScoreKind, Shape};

/// The README's code blocks, compiled as doctests so the API example there
/// cannot drift from the API.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
