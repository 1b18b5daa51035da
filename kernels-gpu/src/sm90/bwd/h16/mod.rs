//! The wgmma row kernel for H = 16, D = 128 ([`SM90_WG_H16`](crate::registry::SM90_WG_H16)):
//! the role modules of `super` (their source files) compiled a second time
//! as children of this module, which gives them `Q_HEADS = 16` in place of
//! 64 (`super::*` is imported whole; the item below shadows it). Everything
//! else is the D = 128 kernel's: the M = 64 head tile, its layout
//! ([`SMEM`]), descriptors and work split. The heads are padded:
//! - the q tile's rows 16..63 are zero-filled by the q loads themselves
//!   (`load::load_row`: 0-byte `cp.async` copies for the padded heads, on
//!   every row, so both q buffers hold zeros there for every item); only
//!   the row's 16 x 128 elements are read from `index_q`;
//! - the padded heads' weights are 0 in shared memory, so their S, dS and
//!   d_weights partials are 0 and they add nothing to dK;
//! - d_index_q is stored by the warps of real heads only (each warp holds
//!   16 heads), d_weights for the 16 real heads.
//!
//! No paired kernel: the generic paired code is compiled here only where
//! the row kernel's body names it under `PAIRED = false`.

use super::*;

/// Heads of the problem: the q tile's rows that hold data.
const Q_HEADS: u32 = 16;
// Each warp's 16 heads are all real or all padding.
const _: () = assert!(Q_HEADS.is_multiple_of(16) && Q_HEADS < HEADS);

role_modules!();

row_entry!(
    /// Persistent warpgroup-MMA stage-2 kernel for H = 16, D = 128, launched
    /// alone (no paired kernel); the launch contract of `wg::stage2` with
    /// H = 16, [`SMEM`] bytes of dynamic shared memory, the D = 128 stage 1
    /// (`indexer_score_grad_d128`) ahead of it.
    ///
    /// # Safety
    /// As `wg::stage2` for H = 16.
    indexer_bwd_wg_h16_d128,
    indexer_bwd_wg_det_h16_d128
);
