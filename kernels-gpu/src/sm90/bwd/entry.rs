//! The entries of the D = 128 wgmma kernels (the body is `super::wg`;
//! the D = 64 entry is `super::d64`'s).

use super::pair::dispatch;
use super::wg::stage2;
use super::THREADS;
use crate::abi::{DetParams, GradParams};
use crate::det::DetTables;
use crate::ptx::sreg;

/// Persistent warpgroup-MMA stage-2 kernel for H = 64, D = 128; see
/// [`stage2`](super::wg) for the launch contract.
///
/// # Safety
/// As [`stage2`](super::wg).
#[no_mangle]
pub unsafe extern "ptx-kernel" fn indexer_bwd_wg_h64_d128(p: GradParams) {
    // SAFETY: forwarded launch contract; the whole CTA runs the test.
    unsafe {
        let go = dispatch::<false>(&p);
        stage2::<false, 0, false>(&p, DetTables::NONE, go)
    }
}

/// Paired persistent warpgroup-MMA stage-2 kernel for H = 64, D = 128 (two
/// rows per CTA in step, shared key rows reduced once); see [`stage2`](super::wg) for
/// the launch contract.
///
/// # Safety
/// As [`stage2`](super::wg) with `PAIRED`.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn indexer_bwd_wg_pair_h64_d128(p: GradParams) {
    // SAFETY: forwarded launch contract; the whole CTA runs the test
    // before the halves split.
    unsafe {
        let go = dispatch::<true>(&p);
        if sreg::thread_idx_x() < THREADS {
            stage2::<true, 0, false>(&p, DetTables::NONE, go)
        } else {
            stage2::<true, 1, false>(&p, DetTables::NONE, go)
        }
    }
}

/// The deterministic twin of [`indexer_bwd_wg_h64_d128`] (`crate::det`):
/// dK reduced in fixed point into `p.grad.dk_accum`.
///
/// # Safety
/// As [`indexer_bwd_wg_h64_d128`] on `p.grad`, after `det_scales` of `p`.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn indexer_bwd_wg_det_h64_d128(p: DetParams) {
    // SAFETY: forwarded launch contract; the whole CTA runs the test.
    unsafe {
        let go = dispatch::<false>(&p.grad);
        stage2::<false, 0, true>(&p.grad, DetTables::of(&p), go)
    }
}

/// The deterministic twin of [`indexer_bwd_wg_pair_h64_d128`].
///
/// # Safety
/// As [`indexer_bwd_wg_pair_h64_d128`] on `p.grad`, after `det_scales`
/// of `p`.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn indexer_bwd_wg_pair_det_h64_d128(p: DetParams) {
    // SAFETY: forwarded launch contract; the whole CTA runs the test
    // before the halves split.
    unsafe {
        let go = dispatch::<true>(&p.grad);
        let det = DetTables::of(&p);
        if sreg::thread_idx_x() < THREADS {
            stage2::<true, 0, true>(&p.grad, det, go)
        } else {
            stage2::<true, 1, true>(&p.grad, det, go)
        }
    }
}
