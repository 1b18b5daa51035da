//! The wgmma forward kernels' bodies (sm_90a): CTAs of one warpgroup, one
//! per query row ([`forward`]) or taking rows in turn ([`persistent`]),
//! walking a row's chunks with [`DIST`] gathers in flight
//! ([`fwd::STAGES`], [`IDS_AHEAD`] and [`fwd::KEY_SETS`] below follow
//! from it).
//!
//! Iteration `it` of the walk resolves chunk `it + 1`, gathers chunk `it`
//! and multiplies chunk `it - DIST`:
//!
//! ```text
//! wait until DIST - 1 groups pend (chunk it - DIST's K rows and chunk
//! it + 1's ids complete) | resolve chunk it + 1 into key set it + 1 |
//! fence | barrier (popc: does chunk it + 1 hold a valid slot?) | gather
//! chunk it (key set it) into K buffer it % STAGES | copy the ids of chunk
//! it + IDS_AHEAD | commit | chunk it - DIST: if it holds a valid slot,
//! wgmma and logits; every slot's store (the logit, or PAD_MARK), the
//! running normaliser
//! ```
//!
//! So DIST chunks' K rows are in flight while a chunk is multiplied.
//! Reuse (sets and buffers by chunk modulo their count): K buffer
//! `it % STAGES` was last read by the product of chunk `it - STAGES`, in
//! iteration `it - STAGES + DIST = it - 1`, which waited for it before
//! the barrier of iteration `it`. Key set `(it + 1) % KEY_SETS` was last
//! read by the stores of chunk `it + 1 - KEY_SETS`, in iteration
//! `it + 1 - KEY_SETS + DIST = it - 2`, before the barrier of iteration
//! `it - 1`. Id sets are private to their slot's thread, which
//! resolves a chunk's ids before it copies into that set again. Every
//! branch around a collective (the product, the quad sums, the barriers)
//! is on a CTA-uniform value.

use super::load::{copy_ids, copy_q, fetch_weight, gather, resolve, store_weight};
use crate::portable::forward::load::{load_weights, Row};
use super::mma::{logits, my_slots, product, scaled, weights, Tile};
use crate::portable::forward::softmax::{rewrite, row_lse, slot_output, store_lse};
use crate::portable::forward::{self as fwd, exp_fast, Lse, CHUNK, DIST, IDS_AHEAD, PAD_MARK};
use crate::abi::{FwdParams, FLAG_LOG_SCORE};
use crate::ptx::{bulk, cp_async, smem as sh, sreg, sync};
use crate::sched::row_at;

/// The kernel body for the shape `T`, one CTA per row (`blockIdx.x`).
///
/// # Safety
/// Launched with `fwd::THREADS` threads, one CTA per row (`p.rows`),
/// `T::L.bytes` of dynamic shared memory, and a `FwdParams` whose pointers
/// and sizes the host validated for `T`.
#[inline(always)]
pub(super) unsafe fn forward<T: Tile>(p: &FwdParams) {
    // SAFETY: the launch contract.
    let r = unsafe { Row::new(p, sreg::block_idx_x(), T::D, T::L) };
    // Prologue: the q tile, the weights and the ids of the first
    // `IDS_AHEAD` chunks, all behind the walk's first wait and barrier.
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
    // SAFETY: the prologue's group and the weights issued, nothing else.
    let (lse, _) = unsafe { walk::<T>(&r, false) };
    // SAFETY: every thread, uniform control flow.
    unsafe {
        let v = row_lse(&r, lse);
        rewrite(&r, v);
    }
}

/// The kernel body for the shape `T` on a persistent grid: a CTA takes
/// rows `blockIdx.x, blockIdx.x + gridDim.x, ...` (`crate::sched::row_at`;
/// any grid, the host's is `crate::sched::persistent_grid` of the CTAs
/// that reside at once). A row's prologue loads (q tile, weights, the ids
/// of its first [`IDS_AHEAD`] chunks) are issued before the previous
/// row's end, so their latency passes while that row's normalisers merge
/// and its slots are rewritten.
///
/// # Safety
/// Launched with `fwd::THREADS` threads, `T::L.bytes` of dynamic shared
/// memory, and a `FwdParams` whose pointers and sizes the host validated
/// for `T`.
#[inline(always)]
pub(super) unsafe fn persistent<T: Tile>(p: &FwdParams) {
    let (ctas, cta) = (sreg::grid_dim_x(), sreg::block_idx_x());
    let mut k = 0;
    let mut row = row_at(ctas, cta, k);
    if row >= p.rows {
        return;
    }
    // SAFETY: row < p.rows; nothing read yet.
    unsafe {
        let r = here(Row::new(p, row, T::D, T::L));
        let w = fetch_weight(&r, T::H);
        prologue(&r, T::H);
        store_weight(&r, T::H, w);
    }
    // Rows of at most KEPT chunks (every row the host gives this kernel)
    // keep their slots in registers until the row's end.
    let keep = p.cols <= fwd::PERSISTENT_MAX_COLS;
    // `row` is CTA-uniform: every branch on it is.
    while row < p.rows {
        // SAFETY: row < p.rows.
        let r = unsafe { here(Row::new(p, row, T::D, T::L)) };
        // SAFETY: the row's prologue loads were issued (above, or by the
        // previous row's end), and nothing else is in flight.
        let (lse, kept) = unsafe { walk::<T>(&r, keep) };
        k += 1;
        let next = row_at(ctas, cta, k);
        // Every thread's last product (the q tile's and the K buffers'
        // readers) and its stores from the key sets are done before any
        // thread loads the next row over them.
        // SAFETY: uniform control flow, every thread.
        unsafe { sync::bar_sync() };
        // SAFETY: next < p.rows; the q tile, the id sets and the weights
        // region are free (the barrier above; each thread's id words were
        // last read by its own resolves).
        let ahead = (next < p.rows).then(|| unsafe {
            let n = here(Row::new(p, next, T::D, T::L));
            let w = fetch_weight(&n, T::H);
            prologue(&n, T::H);
            (n, w)
        });
        // SAFETY: every thread, uniform control flow (`keep` is
        // launch-uniform); the row end uses only the `lse` region and
        // global memory.
        unsafe {
            let v = row_lse(&r, lse);
            if keep {
                rewrite_kept(&r, v, &kept);
            } else {
                rewrite(&r, v);
            }
        }
        if let Some((n, w)) = ahead {
            // SAFETY: nothing reads the weights region before the next
            // walk's first barrier.
            unsafe { store_weight(&n, T::H, w) };
        }
        row = next;
    }
}

/// `r` with the thread index read where the row's context is made: what
/// a row derives from it is not hoisted out of the row loop and held in
/// registers across rows.
#[inline(always)]
fn here(r: Row<'_>) -> Row<'_> {
    Row {
        tid: sreg::thread_idx_x_here(),
        ..r
    }
}

/// Issues, as one `cp.async` group, the row's q tile and the ids of its
/// first [`IDS_AHEAD`] chunks (the persistent kernel's; its weights go
/// apart, [`fetch_weight`] and [`store_weight`]).
///
/// # Safety
/// The launch contract; the q tile and this thread's words of the id sets
/// are not read again before the row's walk.
#[inline(always)]
unsafe fn prologue(r: &Row<'_>, h: u32) {
    // SAFETY: forwarded.
    unsafe {
        copy_q(r, h);
        let mut c = 0;
        while c < IDS_AHEAD {
            copy_ids(r, c);
            c += 1;
        }
    }
    cp_async::commit_group();
}

/// One row's walk over its chunks after its [`prologue`]: returns this
/// thread's running normaliser of the row's logits and, with `keep`, the
/// slots it would have stored (see [`chunk`]).
///
/// # Safety
/// Every thread, uniform control flow; the row's prologue group and its
/// weights store issued, no other copy in flight; `keep` CTA-uniform and
/// only for rows of at most [`KEPT`] chunks.
#[inline(always)]
unsafe fn walk<T: Tile>(r: &Row<'_>, keep: bool) -> (Lse, Kept) {
    let n = r.chunks();
    cp_async::wait_all();
    // SAFETY: this thread's ids of chunk 0 are complete (waited).
    let any = unsafe { resolve(r, 0) };
    // SAFETY: uniform control flow, every thread.
    let first = unsafe { sync::bar_red_popc(any) };
    // SAFETY: the weights region is behind the barrier.
    let (w, ok) = unsafe { weights::<T>(r) };
    // The scaled head sum where every thread's weights allow it.
    // SAFETY: uniform control flow, every thread.
    let fast = unsafe { sync::bar_red_popc(!ok) } == 0;
    let w = if fast { scaled(w, r.p.sm_scale) } else { w };

    let mut lse = Lse::EMPTY;
    let mut kept = Kept([PAD_MARK; KEPT]);
    // Bit `c % 8`: chunk c holds a valid slot (set at its resolution).
    let mut live = (first > 0) as u32;
    let mut it = 0;
    while it < n + DIST {
        cp_async::wait_group::<{ DIST - 1 }>();
        // SAFETY: chunk it + 1's ids were copied by this thread in the
        // group of iteration it + 1 - IDS_AHEAD = it - DIST (or the
        // prologue's), complete after the wait above.
        let any = unsafe { resolve(r, it + 1) };
        // cp.async writes are generic-proxy writes; wgmma reads through
        // the async proxy.
        bulk::fence_proxy_async_shared();
        // SAFETY: uniform control flow, every thread.
        let valid_next = unsafe { sync::bar_red_popc(any) };
        let bit = 1 << ((it + 1) % 8);
        live = if valid_next > 0 {
            live | bit
        } else {
            live & !bit
        };
        if it < n {
            // SAFETY: the reuse rules above; chunk it's key set was
            // written before the barrier of iteration it - 1 (or the
            // prologue's).
            unsafe {
                gather(r, it);
                copy_ids(r, it + IDS_AHEAD);
            }
        }
        cp_async::commit_group();
        if it >= DIST {
            let c = it - DIST;
            let live = live & (1 << (c % 8)) != 0;
            // SAFETY: whole warpgroup, `live` CTA-uniform; chunk c's K
            // rows and the q tile complete, fenced, behind the barrier.
            let out = if keep { Some(&mut kept) } else { None };
            unsafe { chunk::<T>(r, c, live, &w, fast, &mut lse, out) };
        }
        it += 1;
    }
    (lse, kept)
}

/// Chunks a row of the persistent kernel keeps in registers instead of
/// storing its slots before the row's end: every chunk of a row of at most
/// `fwd::PERSISTENT_MAX_COLS` slots.
const KEPT: usize = (fwd::PERSISTENT_MAX_COLS / CHUNK) as usize;

/// A thread's slot of each of a row's first [`KEPT`] chunks (lanes 0 and
/// 1 of each quad own one slot a chunk, [`my_slots`]): the logit's bits,
/// or [`PAD_MARK`].
#[derive(Clone, Copy)]
struct Kept([u32; KEPT]);

impl Kept {
    /// Sets chunk `c`'s slot (`c < KEPT`) by selects, not an index: a
    /// dynamic index would put the array in local memory.
    #[inline(always)]
    fn set(&mut self, c: u32, bits: u32) {
        for (j, v) in self.0.iter_mut().enumerate() {
            if c == j as u32 {
                *v = bits;
            }
        }
    }
}

/// The row's end after [`walk`] with `keep`: thread 0 writes the row's
/// log-sum-exp `lse`, and each slot's owner writes its probability or
/// log-probability (padding 0 or `-inf`) from [`Kept`], once: nothing of
/// the row was stored before.
///
/// # Safety
/// The launch contract; `kept` from this thread's walk of row `r` (of at
/// most [`KEPT`] chunks).
#[inline(always)]
unsafe fn rewrite_kept(r: &Row<'_>, lse: f32, kept: &Kept) {
    let p = r.p;
    // SAFETY: the launch contract.
    unsafe { store_lse(r, lse) };
    let lane = r.tid % 4;
    if lane >= 2 {
        return;
    }
    let log = p.flags & FLAG_LOG_SCORE != 0;
    let slots = my_slots(r.tid);
    let slot = if lane == 0 { slots[0] } else { slots[1] };
    for (c, &bits) in kept.0.iter().enumerate() {
        let s = c as u32 * CHUNK + slot;
        if s < p.cols {
            let out = slot_output(bits, lse, false, log);
            // SAFETY: a slot of the row (below cols).
            unsafe { *(p.score as *mut u32).add(r.flat(s)) = out };
        }
    }
}

/// Chunk `c`: its product and its slots' logits when `live` (some slot
/// valid; `w` and `fast` as [`logits`] takes them), then every slot's
/// store: lanes 0 and 1 of each quad the quad's two slots, a valid slot's
/// logit (added to `lse`) or [`PAD_MARK`], into the row's outputs or, with
/// `kept`, into this thread's [`Kept`].
///
/// # Safety
/// As the call in [`walk`]; `live`, `fast` and whether `kept` is given are
/// the same in every thread; with `kept`, `c < KEPT`.
#[inline(always)]
unsafe fn chunk<T: Tile>(
    r: &Row<'_>,
    c: u32,
    live: bool,
    w: &[f32; 32],
    fast: bool,
    lse: &mut Lse,
    kept: Option<&mut Kept>,
) {
    let l = if live {
        // SAFETY: forwarded (uniform branches).
        unsafe {
            let acc = product::<T>(r, c);
            logits::<T>(r, &acc, w, fast)
        }
    } else {
        [0.0; 2]
    };
    let lane = r.tid % 4;
    if lane >= 2 {
        return;
    }
    // Selects, not an index: a dynamic index would put the pair in local
    // memory.
    let slots = my_slots(r.tid);
    let (slot, x) = if lane == 0 {
        (slots[0], l[0])
    } else {
        (slots[1], l[1])
    };
    if c * CHUNK + slot >= r.p.cols {
        return;
    }
    // SAFETY: written by the slot's resolver before a barrier passed; read
    // again only after the next barrier (the reuse rules).
    let key = unsafe { sh::ld_u32(r.keys(c % fwd::KEY_SETS).add(4 * slot)) } as i32;
    let bits = if key >= 0 {
        lse.push(x, exp_fast);
        x.to_bits()
    } else {
        PAD_MARK
    };
    match kept {
        Some(k) => k.set(c, bits),
        // SAFETY: a slot of the row (below cols).
        None => unsafe { *(r.p.score as *mut u32).add(r.flat(c * CHUNK + slot)) = bits },
    }
}
