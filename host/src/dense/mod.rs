//! Dense mode: the indexer's warm-up stage, where every query row is
//! trained against every causal key instead of its top-k.
//!
//! Inputs as in sparse mode except the scores, which come dense and raw:
//! `attn_score` f32 `(rows, cols)` of non-negative attention mass with its
//! row sums `attn_l1norm` `(rows,)`, and `index_score` f32 `(rows, cols)` of
//! raw indexer logits with their row log-sum-exp `index_lse` `(rows,)`. Row
//! `s` of batch `b` sees the key columns `j < L = min((q_offset[b] + s + 1)
//! / ratio, S_k(b))` ([`Shape::visible`]). grad_signal is written over
//! `index_score` (0 at `j >= L`); `attn_score` is read only. The math is in
//! [`cpu`] and in `docs/spec.md` ("Dense mode").
//!
//! Layouts ([`Layout`]): `(B, S, ...)` tensors, and packed variable-length
//! batches (`cu_seqlens_q`, `cu_seqlens_k`; scores `(T_q, score_cols)`
//! with local key columns).
//!
//! What exists:
//! - [`cpu::reference`] (f64, the oracle), [`cpu::reference_f32_bf16_ds`]
//!   and [`cpu::execute`] (the fallback), multi-threaded;
//! - [`run`]: one problem held on the host (on the GPU where [`Plan`]
//!   runs there and the caller allows it, else on the CPU);
//! - [`Plan`]: on compute capability 9.0 (H100, H200), dense stage 1
//!   then, for H = 64 and D = 128, dense mode's own tile kernel (K tiles
//!   loaded whole, each key tile's dK reduced once:
//!   `indexer_dense_bwd_wg_h64_d128`), for the other H x D the sparse
//!   path's wgmma kernels on the equivalent sparse problem (key ids built
//!   once by the plan, up to [`MAX_GPU_SCORES`]); elsewhere
//!   [`Plan::execute`] returns [`crate::Error::NotImplemented`] after its
//!   checks; [`Plan::execute_raw`] the same on raw device addresses and
//!   a raw stream ([`DenseRawBuffers`], for the Python extension).
//!
//! Of [`crate::Options`], `sm_scale`, `d_index_k` and `d_weights` apply;
//! `key_ids`, `score` and `backend` are ignored.
//!
//! # Example
//!
//! ```
//! use dsa_indexer_bwd::cpu::HostGrad;
//! use dsa_indexer_bwd::dense::{self, cpu::HostInputs};
//! use dsa_indexer_bwd::{bf16, Options};
//!
//! # fn main() -> Result<(), dsa_indexer_bwd::Error> {
//! // One batch, 3 query rows, 4 keys, keys compressed 2:1; row s sees (s + 1) / 2 keys.
//! let shape = dense::Shape::bshd(1, 3, 4, 16, 64).with_ratio(2);
//! let q = vec![bf16::from_f32(0.5); shape.q_len()];
//! let w = vec![bf16::ONE; shape.w_len()];
//! let k = vec![bf16::from_f32(0.25); shape.k_len()];
//! let attn = vec![1.0f32; shape.score_len()];
//! let logits = vec![0.0f32; shape.score_len()];
//! let (l1, lse) = (vec![4.0f32; shape.rows()], vec![1.0f32; shape.rows()]);
//! let x = HostInputs {
//!     index_q: &q, weights: &w, index_k: &k, attn_score: &attn, attn_l1norm: &l1,
//!     index_score: &logits, index_lse: &lse, grad_loss: 1.0, loss_coeff: 1.0,
//! };
//! // 4 key columns: too few for the GPU path, so the CPU computes it.
//! let r = dense::run(&shape, &Options::default(), &x, /* allow_gpu */ true)?;
//! assert_eq!(r.backend, "cpu");
//! assert!(r.grad_signal[..4].iter().all(|&g| g == 0.0)); // row 0 sees no key
//! assert_ne!(r.grad_signal[4], 0.0); // row 1 sees key 0
//! assert_eq!(r.grad_signal[5], 0.0); // ... and not key 1
//!
//! // The same on caller-owned buffers.
//! let mut gs = logits.clone();
//! let mut dq = vec![bf16::ZERO; shape.q_len()];
//! let (mut dw, mut dk) = (vec![bf16::ZERO; shape.w_len()], vec![0.0f32; shape.k_len()]);
//! dense::cpu::execute(&shape, &Options::default(), &x, dense::cpu::HostOutputs {
//!     index_score: &mut gs,
//!     d_index_q: &mut dq,
//!     d_weights: HostGrad::Bf16(&mut dw),
//!     d_index_k: HostGrad::F32(&mut dk),
//! })?;
//! assert_eq!(gs, r.grad_signal);
//! # Ok(()) }
//! ```

pub mod cpu;
mod gpu;
mod oneshot;
mod plan;
mod raw;
mod shape;
mod tiles;

pub use gpu::MAX_GPU_SCORES;
pub use oneshot::{run, run_with_progress};
pub use plan::{Inputs, Outputs, Plan};
pub use raw::DenseRawBuffers;
pub use shape::{Layout, Row, Shape};
