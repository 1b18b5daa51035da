//! The wgmma row kernel for H = 32, D = 128 ([`super::WG_H32_KERNEL`]):
//! the role modules of `super` (their source files) compiled a second time
//! as children of this module, which gives them `Q_HEADS = 32` in place of
//! 64 (`super::*` is imported whole; the item below shadows it). Everything
//! else is the D = 128 kernel's: the M = 64 head tile, its layout
//! ([`SMEM`]), descriptors and work split. The heads are padded:
//! - the q tile's rows 32..63 are zero-filled by the q loads themselves
//!   (`load::load_row`: 0-byte `cp.async` copies for the padded heads, on
//!   every row, so both q buffers hold zeros there for every item); only
//!   the row's 32 x 128 elements are read from `index_q`;
//! - the padded heads' weights are 0 in shared memory, so their S, dS and
//!   d_weights partials are 0 and they add nothing to dK;
//! - d_index_q is stored by the warps of real heads only (each warp holds
//!   16 heads), d_weights for the 32 real heads;
//! - no stage-1 chunk counts (`FLAG_ROW_CHUNKS` needs rows of 64 heads in
//!   `d_weights`): every row runs all its chunks (`load::load_count`).
//!
//! No paired kernel: the generic paired code is compiled here only where
//! the row kernel's body names it under `PAIRED = false`.

use super::*;
use crate::abi::GradParams;

/// Heads of the problem: the q tile's rows that hold data.
const Q_HEADS: u32 = 32;
// Each warp's 16 heads are all real or all padding.
const _: () = assert!(Q_HEADS.is_multiple_of(16) && Q_HEADS < HEADS);

role_modules!();

/// Persistent warpgroup-MMA stage-2 kernel for H = 32, D = 128, launched
/// alone (no paired kernel); the launch contract of `wg::stage2` with
/// H = 32, [`SMEM`] bytes of dynamic shared memory, the D = 128 stage 1
/// (`indexer_score_grad_d128`) ahead of it and `FLAG_ROW_CHUNKS` clear.
///
/// # Safety
/// As `wg::stage2` for H = 32.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn indexer_bwd_wg_h32_d128(p: GradParams) {
    // SAFETY: forwarded launch contract; the whole CTA runs the test
    // (which computes at once: the host never sets FLAG_PAIR_DISPATCH for
    // H < 64).
    unsafe {
        let go = pair::dispatch::<false>(&p);
        wg::stage2::<false, 0>(&p, go)
    }
}
