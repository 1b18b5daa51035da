//! The row's end, common to both forward kernels: the threads' running
//! softmax normalisers ([`Lse`]) merged in a fixed order (a butterfly over
//! each warp's lanes, then the warps in order), the row's log-sum-exp
//! written, and the row's slots rewritten from logits into their outputs
//! ([`super::output`]).

use super::load::Row;
use super::{output, Lse, THREADS, WARPS};
use crate::abi::FLAG_LOG_SCORE;
use crate::ptx::{smem as sh, sync};
use crate::score::expf;

/// The row's log-sum-exp from every thread's normaliser `mine`, in every
/// thread.
///
/// # Safety
/// Every thread of the CTA, uniform control flow; barrier 0 free; the
/// layout's `lse` region unused since the last barrier.
#[inline(always)]
pub(super) unsafe fn row_lse(r: &Row<'_>, mine: Lse) -> f32 {
    let mut a = mine;
    let mut mask = 16;
    while mask > 0 {
        // SAFETY: full warps, uniform control flow.
        let o = unsafe {
            Lse {
                m: sync::shfl_xor_f32(a.m, mask),
                s: sync::shfl_xor_f32(a.s, mask),
            }
        };
        // Both lanes of a pair compute the same merge (`max` and `+` are
        // symmetric), so every lane ends with the warp's total.
        a.merge(o, expf);
        mask /= 2;
    }
    let at = r.base.add(r.l.lse);
    let warp = r.tid / 32;
    if r.tid % 32 == 0 {
        // SAFETY: this warp's two words of the region.
        unsafe {
            sh::st_f32(at.add(8 * warp), a.m);
            sh::st_f32(at.add(8 * warp + 4), a.s);
        }
    }
    // SAFETY: uniform control flow, every thread; orders the row's logit
    // stores before the rewrite's loads too.
    unsafe { sync::bar_sync() };
    let mut t = Lse::EMPTY;
    let mut w = 0;
    while w < WARPS {
        // SAFETY: written before the barrier.
        let o = unsafe {
            Lse {
                m: sh::ld_f32(at.add(8 * w)),
                s: sh::ld_f32(at.add(8 * w + 4)),
            }
        };
        t.merge(o, expf);
        w += 1;
    }
    t.value()
}

/// Writes the row's log-sum-exp and rewrites its slots: sparse, every
/// slot from its logit (written by the walk at valid slots) to its
/// probability or log-probability, padding to 0 or `-inf`; dense, zeros
/// past the visible columns (the walk wrote the raw logits of the others).
///
/// # Safety
/// After [`row_lse`] (the walk's stores are ordered before its barrier);
/// the launch contract.
#[inline(always)]
pub(super) unsafe fn rewrite(r: &Row<'_>, lse: f32) {
    let p = r.p;
    let log = p.flags & FLAG_LOG_SCORE != 0;
    let dense = r.dense();
    let score = p.score as *mut f32;
    if r.tid == 0 {
        // SAFETY: one f32 per row.
        unsafe { *(p.lse as *mut f32).add(r.row as usize) = lse };
    }
    let mut slot = if dense { r.n + r.tid } else { r.tid };
    while slot < p.cols {
        let at = r.flat(slot);
        let (valid, l) = if dense {
            (false, 0.0)
        } else {
            // SAFETY: the launch contract; a valid slot's logit was
            // written by the walk, before the barrier of `row_lse`.
            unsafe {
                let key = r.key_of(slot, r.global_id(slot));
                if key >= 0 {
                    (true, *score.add(at))
                } else {
                    (false, 0.0)
                }
            }
        };
        // SAFETY: in the row's slots.
        unsafe { *score.add(at) = output(valid, l, lse, dense, log) };
        slot += THREADS;
    }
}
