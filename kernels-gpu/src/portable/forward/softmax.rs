//! The row's end, common to both forward kernels: the threads' running
//! softmax normalisers ([`Lse`]) merged in a fixed order (a butterfly over
//! each warp's lanes, then the warps in order), the row's log-sum-exp
//! written, and the row's slots rewritten from the walk's stores (logits,
//! or [`PAD_MARK`] at padding) into their outputs ([`super::output`]).

use super::load::Row;
use super::{exp_fast, output, Lse, PAD_MARK, THREADS, WARPS};
use crate::abi::FLAG_LOG_SCORE;
use crate::ptx::{smem as sh, sync};

/// The row's log-sum-exp from every thread's normaliser `mine`, in every
/// thread.
///
/// # Safety
/// Every thread of the CTA, uniform control flow; barrier 0 free; the
/// layout's `lse` region unused since the last barrier.
#[inline(always)]
pub(crate) unsafe fn row_lse(r: &Row<'_>, mine: Lse) -> f32 {
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
        a.merge(o, exp_fast);
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
        t.merge(o, exp_fast);
        w += 1;
    }
    t.value()
}

/// Slots of a thread's rewrite loaded before the first is stored back.
const REWRITE_BATCH: u32 = 4;

/// Writes the row's log-sum-exp and rewrites its slots: sparse, every
/// slot from the walk's store (a logit, or [`PAD_MARK`] at padding) to its
/// probability or log-probability, padding to 0 or `-inf`; dense, zeros
/// past the visible columns (the walk wrote the raw logits of the others).
/// Each thread loads [`REWRITE_BATCH`] of its slots before it stores them.
///
/// # Safety
/// After [`row_lse`] (the walk's stores of every slot below the walked
/// chunks' end are ordered before its barrier); the launch contract.
#[inline(always)]
pub(crate) unsafe fn rewrite(r: &Row<'_>, lse: f32) {
    let p = r.p;
    let log = p.flags & FLAG_LOG_SCORE != 0;
    let dense = r.dense();
    let score = p.score as *mut u32;
    // SAFETY: the launch contract.
    unsafe { store_lse(r, lse) };
    let mut slot = if dense { r.n + r.tid } else { r.tid };
    while slot < p.cols {
        let mut v = [PAD_MARK; REWRITE_BATCH as usize];
        let mut k = 0;
        while k < REWRITE_BATCH {
            let s = slot + k * THREADS;
            if !dense && s < p.cols {
                // SAFETY: in the row's slots, stored by the walk before
                // the barrier of `row_lse`.
                v[k as usize] = unsafe { *score.add(r.flat(s)) };
            }
            k += 1;
        }
        let mut k = 0;
        while k < REWRITE_BATCH {
            let s = slot + k * THREADS;
            if s < p.cols {
                let out = slot_output(v[k as usize], lse, dense, log);
                // SAFETY: in the row's slots.
                unsafe { *score.add(r.flat(s)) = out };
            }
            k += 1;
        }
        slot += REWRITE_BATCH * THREADS;
    }
}

/// Thread 0 of the row writes its log-sum-exp.
///
/// # Safety
/// The launch contract: `lse` holds one f32 per row.
#[inline(always)]
pub(crate) unsafe fn store_lse(r: &Row<'_>, lse: f32) {
    if r.tid == 0 {
        // SAFETY: the caller's contract.
        unsafe { *(r.p.lse as *mut f32).add(r.row as usize) = lse };
    }
}

/// The bits a slot's output takes from what the walk left for it
/// (`bits`: a logit, or [`PAD_MARK`] at padding): [`output`] with the
/// kernels' exponential.
#[inline(always)]
pub(crate) fn slot_output(bits: u32, lse: f32, dense: bool, log: bool) -> u32 {
    output(
        bits != PAD_MARK,
        f32::from_bits(bits),
        lse,
        dense,
        log,
        exp_fast,
    )
    .to_bits()
}
