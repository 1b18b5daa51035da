//! The wgmma kernel for H = 128, D = 128 ([`SM90_WG_H128`](crate::registry::SM90_WG_H128)): the
//! role modules of `super` (their source files) compiled a second time as
//! children of this module, which gives them `Q_HEADS = 128` in place of
//! 64, run as the paired kernel's body (`PAIRED`). The M = 64 head tile
//! holds half the heads, so the two halves of a CTA (two warpgroups and a
//! copy of the layout each, as in the paired kernel) take the same rows,
//! half `h` heads `64 h .. 64 h + 64` (`ctx::HEAD_HALVES`):
//! - each half loads its heads' q and weights (`load::load_row`), its own
//!   copy of the row's slot data and K rows, and computes S, the gate, dS,
//!   d_weights partials and dQ for its heads, storing its part of
//!   d_index_q and d_weights (`row_end`);
//! - every item is fused (the halves' key rows are the same by
//!   construction, so there is no vote): half `it % 2` computes the
//!   item's dK over all 128 heads as one product (`[dS_0; dS_1]^T
//!   [q_0; q_1]`, `wgmma::dk_m64n64_k128`) and stages it, and each key row
//!   is reduced once, the halves taking every other group of four slots.
//!
//! The grid is one CTA per SM (the paired kernel's launch bounds and
//! layout, `PAIR`), rows dealt round robin; stage 1's chunk counts
//! (`FLAG_ROW_CHUNKS`) sit at the start of each row's 128-head d_weights
//! block.

use super::*;

/// Heads of the problem: two M = 64 tiles, one per half of the CTA.
const Q_HEADS: u32 = 2 * HEADS;

role_modules!();

halves_entry!(
    /// Persistent warpgroup-MMA stage-2 kernel for H = 128, D = 128: the
    /// launch contract of `wg::stage2` with `PAIRED` and H = 128 (`PAIR`'s
    /// threads and bytes, [`WgRow::grid`] with one CTA per SM over the rows,
    /// the D = 128 stage 1 ahead of it).
    ///
    /// # Safety
    /// As `wg::stage2` for H = 128.
    indexer_bwd_wg_h128_d128,
    indexer_bwd_wg_det_h128_d128
);
