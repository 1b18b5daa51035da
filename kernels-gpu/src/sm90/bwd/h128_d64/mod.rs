//! The wgmma kernel for H = 128, D = 64 ([`SM90_WG_H128_D64`](crate::registry::SM90_WG_H128_D64)):
//! the role modules of `super` compiled a second time as children of this
//! module with the D = 64 sizes (`d64_sizes!`, as in `super::d64`: the
//! warpgroups of each half split the products, `SPLIT`) and
//! `Q_HEADS = 128`, run as the paired kernel's body with the two halves of
//! a CTA on one row's two 64-head halves, as in `super::h128` (every item
//! fused: the computing half's warpgroup 1 takes the dK product over all
//! 128 heads; shared K buffers; [`PAIR_D64`]'s launch shape).

use super::*;

d64_sizes!();

/// Heads of the problem: two M = 64 tiles, one per half of the CTA.
const Q_HEADS: u32 = 2 * HEADS;

role_modules!();

halves_entry!(
    /// Persistent warpgroup-MMA stage-2 kernel for H = 128, D = 64: the
    /// launch contract of `wg::stage2` with `PAIRED`, H = 128 and D = 64
    /// ([`PAIR_D64`]'s threads and bytes, [`WgRow::grid`] with one CTA per SM
    /// over the rows, the D = 64 stage 1 ahead of it).
    ///
    /// # Safety
    /// As `wg::stage2` for H = 128, D = 64.
    indexer_bwd_wg_h128_d64,
    indexer_bwd_wg_det_h128_d64
);
