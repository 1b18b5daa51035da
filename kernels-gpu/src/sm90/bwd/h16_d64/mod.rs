//! The wgmma row kernel for H = 16, D = 64 ([`SM90_WG_H16_D64`](crate::registry::SM90_WG_H16_D64)):
//! the role modules of `super` compiled a second time as children of this
//! module with the D = 64 sizes (`d64_sizes!`, as in `super::d64`) and
//! `Q_HEADS = 16` (the head tile padded, as in `super::h16`: q rows
//! 16..63 zero-filled by the q loads, the padded heads' weights 0, only the
//! real heads read and stored).

use super::*;

d64_sizes!();

/// Heads of the problem: the q tile's rows that hold data.
const Q_HEADS: u32 = 16;
// Each warp's 16 heads are all real or all padding.
const _: () = assert!(Q_HEADS.is_multiple_of(16) && Q_HEADS < HEADS);

role_modules!();

row_entry!(
    /// Persistent warpgroup-MMA stage-2 kernel for H = 16, D = 64, launched
    /// alone (no paired kernel); the launch contract of `wg::stage2` with
    /// H = 16, D = 64, [`SMEM_D64`] bytes of dynamic shared memory and the
    /// D = 64 stage 1 (`indexer_score_grad_d64`) ahead of it.
    ///
    /// # Safety
    /// As `wg::stage2` for H = 16, D = 64.
    indexer_bwd_wg_h16_d64,
    indexer_bwd_wg_det_h16_d64
);
