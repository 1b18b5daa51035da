//! The wgmma row kernel for H = 64, D = 64 ([`SM90_WG_D64`](crate::registry::SM90_WG_D64)): the
//! role modules of `super` (their source files) compiled a second time as
//! children of this module, which gives them D = 64 and its sizes in place
//! of the D = 128 ones they read from `super` (`super::*` is imported
//! whole; the items below shadow it). The same body, then, with:
//! - q and K tiles of one swizzle block (64 bf16 per row) instead of two,
//!   S over four K steps (`wgmma::issue_s_m64n32_k64`);
//! - the products split between the warpgroups instead of the D columns
//!   (`SPLIT`): warpgroup 0 computes dQ += dS K and stores d_index_q,
//!   warpgroup 1 computes dK = dS^T q and stages it, each an `m64n64k16`
//!   chain on whole blocks with the D = 128 kernel's descriptors;
//! - staged dK rows of 64 f32 (stride 72 words, 8 banks mod 32), reduced
//!   two rows per warp instruction (a half-warp each).
//!
//! No paired kernel: the generic paired code is compiled here only where
//! the row kernel's body names it under `PAIRED = false`.

use super::*;

d64_sizes!();

role_modules!();

row_entry!(
    /// Persistent warpgroup-MMA stage-2 kernel for H = 64, D = 64, launched
    /// alone (no paired kernel); the launch contract of `wg::stage2` with
    /// `D = 64`, [`SMEM_D64`] bytes of dynamic shared memory and the D = 64
    /// stage 1 (`indexer_score_grad_d64`) ahead of it.
    ///
    /// # Safety
    /// As `wg::stage2` for D = 64.
    indexer_bwd_wg_h64_d64,
    indexer_bwd_wg_det_h64_d64
);
