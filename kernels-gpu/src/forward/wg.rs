//! The wgmma forward kernel's body (sm_90a): one CTA of one warpgroup per
//! query row, walking the row's chunks with [`DIST`] gathers in flight.
//!
//! Iteration `it` of the walk gathers chunk `it` and multiplies chunk
//! `it - DIST`:
//!
//! ```text
//! key rows of chunk it (ids copied IDS_AHEAD iterations ago) | gather it
//! into K buffer it % STAGES, its validity flags | copy the ids of chunk
//! it + IDS_AHEAD | commit | wait until DIST groups pend (chunk it - DIST
//! and the ids of chunk it + 1 complete) | fence | barrier (popc: does
//! chunk it hold a valid slot?) | chunk it - DIST, if it holds one: wgmma,
//! logits, stores of its valid slots' logits, the running normaliser
//! ```
//!
//! Reuse: K buffer and flags `it % STAGES` were last read by the product
//! and logits of chunk `it - STAGES`, in iteration `it - 2`, before the
//! barrier of iteration `it - 1`; id set `(it + IDS_AHEAD) % STAGES` by the
//! key rows of chunk `it + IDS_AHEAD - STAGES = it - 1`, before that same
//! barrier. Every branch around a collective (the product, the quad sums,
//! the barriers) is on a CTA-uniform value.

use super::load::{copy_ids, copy_q, gather, key_rows, load_weights, Row, IDS_AHEAD};
use super::mma::{logits, my_slots, product, Tile};
use super::softmax::{rewrite, row_lse};
use super::{smem, Lse, CHUNK, DIST, STAGES};
use crate::abi::FwdParams;
use crate::ptx::{bulk, cp_async, smem as sh, sync};
use crate::score::expf;

/// The kernel body for the shape `T`.
///
/// # Safety
/// Launched with `super::THREADS` threads, one CTA per row (`p.rows`),
/// `super::smem(T::H, T::D).bytes` of dynamic shared memory, and a
/// `FwdParams` whose pointers and sizes the host validated for `T`.
#[inline(always)]
pub(super) unsafe fn forward<T: Tile>(p: &FwdParams) {
    // SAFETY: the launch contract.
    let r = unsafe { Row::new(p, T::D, smem(T::H, T::D)) };
    let n = r.chunks();
    // Prologue: the q tile, the weights and the ids of the first
    // IDS_AHEAD chunks, complete and visible before the walk.
    // SAFETY: nothing read yet.
    unsafe {
        copy_q(&r, T::H);
        load_weights(&r, T::H);
        let mut c = 0;
        while c < IDS_AHEAD {
            copy_ids(&r, c);
            c += 1;
        }
    }
    cp_async::commit_group();
    cp_async::wait_all();
    // SAFETY: uniform control flow, every thread.
    unsafe { sync::bar_sync() };

    let mut lse = Lse::EMPTY;
    // Bit `c % STAGES`: chunk c holds a valid slot (set at its gather).
    let mut live = 0u32;
    let mut it = 0;
    while it < n + DIST {
        let mut any = false;
        if it < n {
            // SAFETY: the reuse rules above; the ids of chunk `it` were
            // copied in group `it - IDS_AHEAD` (or the prologue), complete
            // and behind the barrier of iteration `it - 1`.
            unsafe {
                let keys = key_rows(&r, it);
                any = gather(&r, it, &keys);
                copy_ids(&r, it + IDS_AHEAD);
            }
        }
        cp_async::commit_group();
        cp_async::wait_group::<DIST>();
        // cp.async writes are generic-proxy writes; wgmma reads through
        // the async proxy.
        bulk::fence_proxy_async_shared();
        // SAFETY: uniform control flow, every thread.
        let valid_here = unsafe { sync::bar_red_popc(any) };
        let bit = 1 << (it % STAGES);
        live = if valid_here > 0 {
            live | bit
        } else {
            live & !bit
        };
        if it >= DIST {
            let c = it - DIST;
            if live & (1 << (c % STAGES)) != 0 {
                // SAFETY: whole warpgroup, uniform branch; chunk c's K
                // rows and the q tile complete, fenced, behind the barrier.
                unsafe { chunk::<T>(&r, c, &mut lse) };
            }
        }
        it += 1;
    }
    // SAFETY: every thread, uniform control flow.
    unsafe {
        let v = row_lse(&r, lse);
        rewrite(&r, v);
    }
}

/// Chunk `c`: its product, its slots' logits, the stores of the valid
/// ones and their mass in `lse`.
///
/// # Safety
/// As the call in [`forward`].
#[inline(always)]
unsafe fn chunk<T: Tile>(r: &Row<'_>, c: u32, lse: &mut Lse) {
    // SAFETY: forwarded.
    let l = unsafe {
        let acc = product::<T>(r, c);
        logits::<T>(r, &acc)
    };
    if r.tid % 4 != 0 {
        return;
    }
    let flags = r.valid(c % STAGES);
    let score = r.p.score as *mut f32;
    let slots = my_slots(r.tid);
    let mut k = 0;
    while k < 2 {
        let slot = slots[k];
        // SAFETY: written at the chunk's gather, before a barrier passed.
        if unsafe { sh::ld_u32(flags.add(4 * slot)) } != 0 {
            // SAFETY: a slot of the row (valid slots are below cols).
            unsafe { *score.add(r.flat(c * CHUNK + slot)) = l[k] };
            lse.push(l[k], expf);
        }
        k += 1;
    }
}
