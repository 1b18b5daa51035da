//! The persistent warpgroup-MMA stage-2 kernel of the Hopper fast path
//! (sm_90a, H = 64, D = 128; compiled again for D = 64 by `super::d64`,
//! whose constants the role modules then read): [`super::row_grid`] CTAs of
//! two warpgroups, each
//! walking its rows `cta, cta + grid, ...` as one flat sequence of 64-slot
//! chunks, so the next row's q tile, key rows and first K rows are loaded
//! while the current row finishes. K rows are gathered by `cp.async` two
//! chunks ahead of use; S, dQ and dK run on `wgmma` from 128-byte-swizzled
//! shared memory (layout and descriptors in [`super`]); dK is staged in
//! shared memory and added to the f32 accumulator with coalesced
//! `red.global.add.v4.f32` (one 512-byte row per warp instruction; measured
//! faster than `cp.reduce.async.bulk` and than reductions straight from the
//! MMA fragments). Slot data (key ids, grad_signal) also arrives by
//! `cp.async`, never through registers (i64 ids as 8-byte copies, narrowed
//! when resolved).
//!
//! From topk [`super::SKIP_MIN_TOPK`] on, stage 1 counts each row's chunks
//! up to its last valid slot and this kernel skips the rest (exactly zero
//! gradients): a row runs [`super::row_chunks`] chunks, so the CTA's
//! sequence is walked with `Walk` instead of fixed arithmetic.
//!
//! Stage 1 (grad_signal) and the zeroing of the accumulator run in the
//! previous launch (`super::stage1`); this kernel is its programmatic
//! dependent and waits for it (`griddepcontrol.wait`) only before reading
//! grad_signal or adding into dK.
//!
//! The paired kernel (`registry::SM90_WG_PAIR`) runs this body twice per
//! CTA, one half per pair of warpgroups on its own copy of the shared
//! memory layout, rows `2 p` and `2 p + 1` of the same pairs `p` in step:
//! each item's barrier B2 spans the whole CTA and counts the slots whose
//! key rows differ between the halves. With none (a "fused" item), one
//! half, alternating by item, computes the dK of both rows as one product
//! over 128 heads (`[dS_a; dS_b]^T [q_a; q_b]`) and stages it, the other
//! computes and stages nothing; otherwise both stage their own rows and
//! each slot that holds the same key row in both is reduced as the sum of
//! both staged rows. After staging a half signals the other (named
//! barrier STAGED), which waits before it reduces; each half reduces every
//! other group of four of those slots. For ids whose rows 2i and 2i + 1
//! are identical slot for slot that halves the reductions, and fused items also
//! halve the staging. Both kernels start with the same test on sampled ids
//! (`pair::pairs_up`), and only the one it picks computes.
//!
//! Work split per chunk: warpgroup `wg` computes S for slots
//! `32 wg .. 32 wg + 32` (all 64 heads), then dQ and dK for the D columns
//! `64 wg .. 64 wg + 64`; with D = 64 (`SPLIT`) warpgroup 0 computes dQ
//! and warpgroup 1 dK, each over all 64 columns, and only warpgroup 1
//! stages dK. Every sum feeding d_index_q and d_weights runs in
//! a fixed order, so those outputs are bitwise reproducible; only d_index_k
//! is accumulated by reductions.
//!
//! This module is the kernel: the body (entries in `super::entry` and
//! `super::d64`), the prologue and the order of
//! one item's steps; the steps are the roles' (one module each, all given
//! the kernel's context `ctx::Ctx`, the named barriers `ctx::Bar`): `load`
//! (chunk counts, key ids and rows, the K gather, slot data, q and
//! weights), `mma` (the `wgmma` products), `gate` (S, the gate, dS,
//! d_weights partials), `reduce` (dK staging and reductions, the pair
//! fusion), `row_end` (d_index_q and d_weights at a row's end) and `pair`
//! (the dispatch test and the item votes).
//!
//! Inlining: the steps that were inline code of one kernel body (the
//! context's constructor, the prologue, the item and its parts, the
//! products, the gate, the staging, the row outputs, the barriers) are
//! `#[rustc_force_inline]`, inlined by rustc in MIR, where the MIR passes
//! see one body as before; the loads, the reductions and the gate's inputs
//! (closures of that body before) are plain functions that LLVM inlines.
//! Inlined later instead, by LLVM (`#[inline(always)]`), the same code
//! takes more registers, and the paired kernel, at its 128-register cap,
//! spills.

use super::ctx::{Bar, Ctx, HEAD_HALVES};
use super::gate::{gate, wait_s_and_inputs};
use super::load::{fetch, first_id, gather, load_count, load_row, put_row, raw_id};
use super::mma::{dk, dq, issue_s, wait_s};
use super::pair::{read_votes, vote};
use super::reduce::{lane_scale, lane_scales, reduce_rows, stage, RED_NOW, ROWS_PER_WARP};
use super::row_end::{store_dq_park_dw, sum_dw};
use super::{Pos, Walk, CHUNK, K_BYTES, SMEM};
use crate::abi::GradParams;
use crate::det::DetTables;
use crate::ptx::smem;
use crate::ptx::{bulk, cp_async, griddep};
use crate::sched::PipeState;

/// What the item loop carries from one item to the next.
struct State {
    /// S of the current item, issued by the previous one (or the prologue).
    s: [f32; 16],
    /// The item sequence (`Walk`: where rows k and k+1 end).
    walk: Walk,
    /// The chunk count of row k+2, loaded after barrier M of row k's first
    /// item and used when row k+1 starts.
    n_pending: u32,
    /// dQ, heads x this warpgroup's 64 D columns.
    acc_q: [f32; 32],
    /// d_weights partials of heads 16 wi + g (+ 8).
    dw: [f32; 2],
    /// The current item's index in the CTA's sequence; its stage (K buffer,
    /// slot set, raw-id set, vote set) is the index mod 2.
    pipe: PipeState<2>,
    /// `fused` of the previous item.
    fused_prev: Option<u32>,
    /// Deterministic twin: this lane's key-row scale (`reduce::lane_scale`)
    /// of the item whose reductions are pending (the previous one until
    /// its last reductions, then the current one).
    scale: f32,
}

/// The kernel body.
///
/// # Safety
/// Launched with [`THREADS`] threads, `super::row_grid(B * S_q, SMs)` CTAs,
/// `SMEM.bytes` of dynamic shared memory, `H = 64`, `D = DIM` (the
/// parent's: 128, or 64 in `super::d64`'s copy),
/// `super::supports(B * S_q, topk)`, as the programmatic dependent of
/// `super::stage1` on the same parameters (or after it completed), and a
/// `GradParams` whose pointers and sizes the host has validated.
///
/// `PAIRED`: the paired kernel's body instead ([`SM90_WG_PAIR`](crate::registry::SM90_WG_PAIR):
/// `super::pair_grid` CTAs of `PAIR.threads`, `PAIR.bytes` of dynamic
/// shared memory, an even number of rows). Half `h` of CTA `cta` runs this
/// body on rows `2 (cta + k grid) + h` with its own copy of the layout;
/// both halves walk the same number of chunks per pair (the longer row's),
/// each synchronises its own warps as the row kernel does (barrier
/// `1 + h`) except at the prologue's key-row barrier and each item's B2,
/// which span the CTA (barrier 0); STAGED orders each item's reductions
/// after both halves' staging, and B2 each staging after both halves'
/// reductions of the previous items (`ctx::Bar`).
///
/// With `ctx::HEAD_HALVES` (H = 128, `super::h128`) the halves take the
/// same rows instead, half `h` heads `64 h .. 64 h + 64`, one row per CTA
/// at a time (`WgRow::grid` with one CTA per SM), and every item is
/// fused (no votes).
///
/// `go`: whether this kernel computes (the verdict of `pair::dispatch`); a
/// CTA of the kernel the test did not pick has no rows.
///
/// `DET`: the deterministic twin (`det`: the call's tables; `p.dk_accum`
/// the fixed-point accumulator), which reduces dK through
/// `reduce::det_row`.
#[inline(always)]
pub(super) unsafe fn stage2<const PAIRED: bool, const HALF: u32, const DET: bool>(
    p: &GradParams,
    det: DetTables,
    go: bool,
) {
    // Items: this CTA's rows x their chunks, in order (`Pos`). Each row
    // runs `row_chunks` chunks: with FLAG_ROW_CHUNKS the stage-1 count
    // (trailing all-padding chunks, whose gradients are exactly zero, are
    // skipped), else all of them.
    let c = Ctx::<PAIRED, HALF>::new(p, go);

    // Pipeline, two barriers per item c (row k, chunk ch; K buffer and slot
    // set c % 2 by the item's index in the CTA's sequence):
    //   wait S(c) | gate, dS, d_weights partials | fence, B2 | dQ(c), dK(c)
    //   | stage dK(c), copy c's key rows | at the row's end: store dQ, park
    //   d_weights partials | wait own copies (K(c+1), q of the next row,
    //   key id of c+2, grad_signal of c+1) | key rows of c+2 into set c%2 |
    //   fence | M | gather(c+2) into buffer c%2 | at the row's first chunk:
    //   load the next row's q and weights | issue S(c+1) | copy the key id
    //   of c+3 into raw set (c+1)%2 and the grad_signal of c+2 into set
    //   c%2 | the first RED_FIRST of each warp's eight reductions of c
    //   (overlapping S(c+1)) | at the row's end: d_weights sums; the other
    //   reductions of c follow in item c+1, after its dS and before its B2.
    // Reuse: slot set c%2 was last read before B2 (gate) and by the gather
    // of c; raw-id set (c+1)%2 by the key rows of c+1, before the previous
    // M; K buffer c%2 by S(c) and dQ(c), complete before M; dS, the
    // staging tile, the key-row copy and the d_weights partials are next
    // written after the next B2, which every warp reaches only after its
    // reductions and sums of c; the q/weights buffer of row k+1 is row
    // k-1's, last read by dK of row k-1's last item (before the M that
    // precedes this row's first chunk), and is waited for at the M of this
    // row's second chunk (every row runs >= 2) before S of row k+1 is issued.
    if c.my_rows == 0 {
        if PAIRED {
            // The row kernel, launched next as this grid's programmatic
            // dependent, relies on this grid completing only after stage 1
            // did (it reads what stage 1 wrote).
            // SAFETY: waits for the stage-1 grid.
            unsafe { griddep::wait() };
        }
        return;
    }
    // SAFETY: the launch contract; every thread of the half runs it.
    let mut st = unsafe { prologue(&c) };
    while st.walk.k < c.my_rows {
        // SAFETY: the launch contract; the halves walk the same items.
        unsafe { item::<PAIRED, HALF, DET>(&c, &mut st, det) };
    }
    // The last item's remaining reductions.
    if RED_NOW < ROWS_PER_WARP {
        reduce_rows::<PAIRED, HALF, DET>(&c, det, st.scale, RED_NOW, ROWS_PER_WARP, st.fused_prev);
    }
    // SAFETY: whole warpgroup; drains the unused S issued by the last item.
    unsafe { wait_s(&mut st.s) };
    // The last item's slot-data copies (past the CTA's rows) land before exit.
    cp_async::wait_all();
}

/// The prologue: q and weights of row 0, the key rows and K of items 0
/// and 1, S(0) issued, the wait for stage 1, the chunk counts of rows 0
/// and 1 and the slot data of items 0-2.
///
/// # Safety
/// The kernel's launch contract; every thread of the half (both halves in
/// the paired kernel) runs it, with rows to compute.
#[rustc_force_inline]
unsafe fn prologue<const PAIRED: bool, const HALF: u32>(c: &Ctx<'_, PAIRED, HALF>) -> State {
    // Items 0 and 1 are chunks 0 and 1 of row 0 whatever the counts.
    let (p0, p1) = (Pos { k: 0, ch: 0 }, Pos { k: 0, ch: 1 });
    load_row(c, 0);
    put_row(c, p0, first_id(c, p0), 0);
    put_row(c, p1, first_id(c, p1), 1);
    // Uniform barrier: key rows of items 0 and 1 (paired: of both halves,
    // which the vote on item 0 compares).
    if PAIRED {
        // SAFETY: every thread of the CTA reaches it (both halves run the
        // same prologue); barrier 0 is used by nothing else in flight.
        unsafe {
            Bar::Cta.sync();
            if !HEAD_HALVES {
                vote(0, c.srows0, c.pbase.add(SMEM.rows), c.votes, c.tid);
            }
        }
    } else {
        // SAFETY: uniform control flow, every thread of the CTA.
        unsafe { c.bar_half() };
    }
    gather(c, 0);
    gather(c, 1);
    cp_async::wait_all();
    // cp.async writes are generic-proxy writes; wgmma reads through the
    // async proxy.
    bulk::fence_proxy_async_shared();
    // Uniform barrier: q, weights, K(0), K(1).
    // SAFETY: uniform control flow, every thread of the half.
    unsafe { c.bar_half() };
    let mut s = [0.0f32; 16];
    issue_s(c, &mut s, p0, 0);
    // Everything above only read inputs stage 1 does not write; S(0) runs
    // while the stage-1 grid finishes.
    // SAFETY: waits for the stage-1 grid (grad_signal, zeroed dK).
    unsafe { griddep::wait() };
    // SAFETY: uniform control flow, every thread.
    let walk = unsafe { Walk::new(c.chunks(load_count(c, 0)), c.chunks(load_count(c, 1))) };
    let n_pending = 0u32;
    fetch(c, walk.pos(2), 0, p0, 0);
    fetch(c, p0, 1, p1, 1); // (the id copy into set 1 is overwritten unused)
    cp_async::wait_all();
    // Uniform barrier: grad_signal of items 0 and 1.
    // SAFETY: uniform control flow, every thread of the half.
    unsafe { c.bar_half() };
    State {
        s,
        walk,
        n_pending,
        acc_q: [0.0; 32],
        dw: [0.0; 2],
        pipe: PipeState::new(),
        fused_prev: None,
        scale: 0.0,
    }
}

/// One item (the pipeline note in [`stage2`]): its gate, products,
/// staging and row outputs, then the next items' loads, S(c+1) and the
/// first reductions of its staging.
///
/// # Safety
/// The kernel's launch contract; every thread of the half (both halves in
/// the paired kernel, which walk the same items) runs it.
#[rustc_force_inline]
unsafe fn item<const PAIRED: bool, const HALF: u32, const DET: bool>(
    c: &Ctx<'_, PAIRED, HALF>,
    st: &mut State,
    det: DetTables,
) {
    let (tid, half) = (c.tid, HALF);
    let it = st.pipe.count;
    let set = st.pipe.index();
    let (k, ch) = (st.walk.k, it - st.walk.start);
    let last = it + 1 == st.walk.end0; // the row's last item
    let ahead2 = st.walk.pos(it + 2);
    let row = c.row_of(k) as usize;
    let kb = c.sk.add(set * K_BYTES);
    let (sq, sw) = (c.q_buf(k), c.w_buf(k));
    let (sgs, srows) = (c.sgs0.add(4 * set * CHUNK), c.srows0.add(4 * set * CHUNK));
    // Paired: this slot's own key row, kept for the copy after the
    // staging, and the outcome of the votes on this item (cast before
    // barrier M of the previous item, or before the prologue's last
    // barriers for item 0), for B2; loaded here so their latency
    // passes during the S wait.
    let own_row = if PAIRED && tid < CHUNK {
        // SAFETY: written before a barrier of this half; read only.
        unsafe { smem::ld_u32(srows.add(4 * tid)) }
    } else {
        0
    };
    let voted = if PAIRED && HEAD_HALVES {
        // The halves hold the same row's heads: every item is fused.
        Some(it % 2)
    } else if PAIRED {
        // SAFETY: after the barrier that follows the votes on this
        // item; the set is rewritten only after the next barrier M.
        unsafe { read_votes(it, c.votes) }
    } else {
        None
    };
    // ---- gate, dS (bf16, swizzled), d_weights partials ----
    // SAFETY: whole warpgroups; `s` is the array of the issue; the dS
    // tile's readers completed before barrier M.
    unsafe {
        let inputs = wait_s_and_inputs(c, &mut st.s, sw, sgs);
        gate(c, &st.s, inputs, &mut st.dw);
    }
    // The previous item's remaining reductions, overlapping this item's
    // dQ and dK products (its staging is rewritten only after B2).
    if RED_NOW < ROWS_PER_WARP && it > 0 {
        reduce_rows::<PAIRED, HALF, DET>(c, det, st.scale, RED_NOW, ROWS_PER_WARP, st.fused_prev);
    }
    // Deterministic twin: the scales of this item's key rows, loaded now
    // that the previous item's reductions are done, used at this item's
    // (their latency passes during the products and the next loads).
    if DET && lane_scales(PAIRED) {
        // SAFETY: the slot set is complete (as `own_row` above).
        st.scale = unsafe { lane_scale(c, srows, det) };
    }
    // Uniform barrier (B2): dS complete and fenced. Paired: a barrier of
    // the whole CTA. When every slot holds the same key row in both
    // halves (`voted`, an item ahead), half `it % 2` computes
    // the item's dK for both rows as one product and the other half
    // neither computes nor stages dK. Every read of either half's
    // staging of earlier items precedes it, so it also frees both
    // stagings.
    // SAFETY: every thread of the CTA reaches it with uniform control
    // flow (the halves walk the same items).
    unsafe { c.barrier_b2() };
    let fused = if PAIRED { voted } else { None };

    // ---- MMA: dQ(c) and dK(c). Paired, fused item: this half stages
    // nothing unless it computes (one product and one staging of the
    // summed rows instead of one per half). ----
    let mut kacc = [0.0f32; 32];
    let stages = fused.is_none_or(|comp| comp == half);
    // SAFETY: whole warpgroups; dS fenced and behind barrier B2; the K
    // chunk and q complete since barrier M of the previous chunk; the other
    // half's dS and q are rewritten only after its STAGED wait below.
    unsafe {
        dq(c, &mut st.acc_q, kb);
        dk(c, &mut kacc, sq, k, fused, stages);
    }
    // ---- reduce, part 1: stage dK rows and keep the chunk's key rows ----
    if stages {
        // SAFETY: the previous readers of both regions passed B2.
        unsafe { stage(c, &kacc, own_row, srows) };
    }
    if PAIRED {
        // SAFETY: every thread of the half; the other half waits at STAGED
        // before its reductions of this item.
        unsafe { Bar::staged(half).arrive() };
    }
    // ---- at the row's end: d_index_q and this thread's d_weights
    // partials (fixed-order sums over lanes) ----
    if last {
        // SAFETY: full warps (`last` is uniform); the partials were last
        // read before this item's B2.
        unsafe { store_dq_park_dw(c, row, &mut st.acc_q, &mut st.dw) };
    }
    // SAFETY: forwarded; every thread of the half.
    unsafe { next_items(c, st, ahead2, ch, k) };

    // Paired: the other half's staging of this item is complete.
    if PAIRED {
        // SAFETY: as above (this half waits, the other arrives).
        unsafe { Bar::staged(1 - half).sync() };
    }
    // ---- reduce, part 2: each warp adds RED_FIRST of its eight
    // staged rows with coalesced vector reductions (one 512-byte row per
    // warp instruction) while the tensor cores run S(c+1); the other
    // rows follow in the next item, before its B2 ----
    reduce_rows::<PAIRED, HALF, DET>(c, det, st.scale, 0, RED_NOW, fused);
    st.fused_prev = fused;
    if last {
        // SAFETY: after barrier M, which follows the partials' parking.
        unsafe { sum_dw(c, row) };
    }

    // ---- advance: the counts follow the current item's row ----
    st.pipe.advance();
    if last {
        // SAFETY: uniform control flow, every thread.
        st.walk.next_row(unsafe { c.chunks(st.n_pending) });
    }
}

/// The middle of item `c = st.pipe` (row `k`, chunk `ch`; `ahead2` is item
/// c+2): the vote on c+1, the wait for this thread's copies, the key rows
/// of c+2, barrier M, then the gather of c+2, the next row's q and weights
/// at a row's first chunk, S(c+1) and the slot data of c+2 and c+3.
///
/// # Safety
/// As [`item`].
#[rustc_force_inline]
unsafe fn next_items<const PAIRED: bool, const HALF: u32>(
    c: &Ctx<'_, PAIRED, HALF>,
    st: &mut State,
    ahead2: Pos,
    ch: u32,
    k: u32,
) {
    let it = st.pipe.count;
    let set = st.pipe.index();
    // ---- next items: slot data of c+2 into the set c just released
    // (same threads that copied its key rows above), K(c+1) complete ----
    if PAIRED && !HEAD_HALVES {
        // Both halves' key rows of c+1 were written before this item's
        // B2 (each half's before its barrier M of c-1) and are
        // rewritten only after the next B2. Here, in front of the
        // copies' wait, the loads cost little.
        // SAFETY: as said; whole warps, uniform control flow; the
        // vote set of c+1 was last read before barrier M of c-1.
        unsafe { vote(it + 1, c.srows0, c.pbase.add(SMEM.rows), c.votes, c.tid) };
    }
    cp_async::wait_all();
    if ahead2.k < c.my_rows {
        put_row(c, ahead2, raw_id(c, ahead2, set), set);
    }
    bulk::fence_proxy_async_shared();
    // Uniform barrier (M): staging, key rows and d_weights partials of
    // c, K(c+1) (and the next row's q) and the slot data of c+2
    // visible; every wgmma of c complete; paired: the votes on c+1.
    // SAFETY: uniform control flow, every thread of the half.
    unsafe { c.barrier_m() };
    if ahead2.k < c.my_rows {
        gather(c, set);
    }
    if ch == 0 && k + 1 < c.my_rows {
        load_row(c, k + 1);
    }
    // Issued unconditionally (after the last item it computes a
    // product of valid shared memory that nobody reads, drained after
    // the loop): with the issue under a branch, ptxas inserted a wait at
    // the join (C7517) and the overlap below was lost.
    issue_s(c, &mut st.s, st.walk.pos(it + 1), 1 - set);
    // Slot data: the key id of c+3 (resolved by the next item before
    // its M) and the grad_signal of c+2 (read by its gate), in flight
    // until the next item's wait_all.
    fetch(c, st.walk.pos(it + 3), 1 - set, ahead2, set);
    if ch == 0 {
        st.n_pending = load_count(c, k + 2);
    }
}
