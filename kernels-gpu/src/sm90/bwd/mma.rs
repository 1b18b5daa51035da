//! The `wgmma` products of the wgmma kernels (each a whole warpgroup's):
//! S = q K^T of a chunk for the warpgroup's 32 slots (issued without
//! waiting, waited for an item later), dQ += dS K and dK = dS^T q for its
//! 64 D columns (D = 64, `SPLIT`: warpgroup 0 the whole dQ, warpgroup 1
//! the whole dK), and the paired kernel's fused dK of both rows. Both
//! operands are read from 128-byte-swizzled shared memory (layout and
//! descriptors in `super`).

use super::ctx::Ctx;
use super::{Pos, DIM, K_BLOCK, K_BYTES, Q_BLOCK, Q_BYTES, SMEM, SPLIT};
use crate::ptx::smem::SmemAddr;
use crate::ptx::wgmma;
use crate::sm90::{desc, ATOM_BYTES, ROW_BYTES};

/// Issues S = q K^T of item `at` (K buffer `buf`, q of its row) for this
/// warpgroup's 32 slots without waiting.
pub(super) fn issue_s<const PAIRED: bool, const HALF: u32>(
    c: &Ctx<'_, PAIRED, HALF>,
    s: &mut [f32; 16],
    at: Pos,
    buf: u32,
) {
    let kb = c.sk.add(buf * K_BYTES);
    let da = desc(c.q_buf(at.k).0, 16, ATOM_BYTES);
    let db = desc(kb.0 + c.wg * 32 * ROW_BYTES, 16, ATOM_BYTES);
    *s = [0.0; 16];
    // SAFETY: whole warpgroup; q and the chunk's K rows complete,
    // fenced and behind a barrier; `s` is waited for before any use.
    // D = 64: one swizzle block of each, four K steps.
    unsafe {
        if DIM == 64 {
            wgmma::issue_s_m64n32_k64(s, da, db)
        } else {
            wgmma::issue_s_m64n32(s, da, db)
        }
    };
}

/// Waits for the S issued into `s`.
///
/// # Safety
/// Whole warpgroup; `s` is the array of the issue.
#[rustc_force_inline]
pub(super) unsafe fn wait_s(s: &mut [f32; 16]) {
    // SAFETY: the caller's contract.
    unsafe { wgmma::wait_m64n32(s) };
}

/// dQ += dS K (A = dS K-major: heads x slots; B = K chunk `kb` MN-major:
/// slots x this warpgroup's 64 D columns). D = 64 (`SPLIT`): warpgroup 0
/// only, on the chunk's one block (warpgroup 1 computes dK meanwhile).
///
/// # Safety
/// Whole warpgroup; dS fenced and behind barrier B2; the K chunk and q
/// complete since barrier M of the previous chunk.
#[rustc_force_inline]
pub(super) unsafe fn dq<const PAIRED: bool, const HALF: u32>(
    c: &Ctx<'_, PAIRED, HALF>,
    acc_q: &mut [f32; 32],
    kb: SmemAddr,
) {
    if SPLIT && c.wg != 0 {
        return;
    }
    // The warpgroup's column block (D = 64: the only one).
    let blk = if SPLIT { 0 } else { c.wg };
    // SAFETY: the caller's contract (a whole warpgroup takes the branch).
    unsafe {
        let da = desc(c.sds.0, 16, ATOM_BYTES);
        let db = desc(kb.0 + blk * K_BLOCK, K_BLOCK, ATOM_BYTES);
        wgmma::dq_m64n64(acc_q, da, db);
    }
}

/// dK = dS^T q (A = dS MN-major: heads x slots read as slots x heads; B =
/// q tile `sq` of local row `k`, MN-major: heads x this warpgroup's D).
/// Paired, fused item (`fused`: `Some(half that computes)`): the half that
/// computes takes both rows as one product over 128 heads (`[dS_a;
/// dS_b]^T [q_a; q_b]`), the other computes nothing; `stages` says
/// whether this half computes (and stages) it. D = 64 (`SPLIT`):
/// warpgroup 1 only, on the q tile's one block.
///
/// # Safety
/// As [`dq`]; a fused product also reads the other half's dS and q tiles,
/// complete and fenced before the CTA-wide B2 and rewritten only after
/// its STAGED wait.
#[rustc_force_inline]
pub(super) unsafe fn dk<const PAIRED: bool, const HALF: u32>(
    c: &Ctx<'_, PAIRED, HALF>,
    kacc: &mut [f32; 32],
    sq: SmemAddr,
    k: u32,
    fused: Option<u32>,
    stages: bool,
) {
    if SPLIT && c.wg != 1 {
        return;
    }
    let (l, wg) = (SMEM, if SPLIT { 0 } else { c.wg });
    // SAFETY: the caller's contract (a whole warpgroup takes the branch).
    unsafe {
        let da = desc(c.sds.0, K_BLOCK, ATOM_BYTES);
        let db = desc(sq.0 + wg * Q_BLOCK, Q_BLOCK, ATOM_BYTES);
        if fused.is_some() {
            if stages {
                let psq = c.pbase.add(l.q).add((k % 2) * Q_BYTES);
                let da1 = desc(c.pbase.add(l.ds).0, K_BLOCK, ATOM_BYTES);
                let db1 = desc(psq.0 + wg * Q_BLOCK, Q_BLOCK, ATOM_BYTES);
                wgmma::dk_m64n64_k128(kacc, da, db, da1, db1);
            }
        } else {
            wgmma::dk_m64n64(kacc, da, db);
        }
    }
}
