//! The persistent warpgroup-MMA stage-2 kernel of the Hopper fast path
//! (sm_90a, H = 64, D = 128): [`super::grid`] CTAs of two warpgroups, each
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
//! sequence is walked with [`Walk`] instead of fixed arithmetic.
//!
//! Stage 1 (grad_signal) and the zeroing of the accumulator run in the
//! previous launch (`super::stage1`); this kernel is its programmatic
//! dependent and waits for it (`griddepcontrol.wait`) only before reading
//! grad_signal or adding into dK.
//!
//! The paired kernel (`super::WG_PAIR_KERNEL`) runs this body twice per
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
//! ([`pairs_up`]), and only the one it picks computes.
//!
//! Work split per chunk: warpgroup `wg` computes S for slots
//! `32 wg .. 32 wg + 32` (all 64 heads), then dQ and dK for the D columns
//! `64 wg .. 64 wg + 64`. Every sum feeding d_index_q and d_weights runs in
//! a fixed order, so those outputs are bitwise reproducible; only d_index_k
//! is accumulated by reductions.

use super::{
    desc, pair_sample, pairs_match, row_chunks, sample_hit, sampled_slots, swizzle, Pos, Walk,
    ATOM_BYTES, CHUNK, DIM, DK_STRIDE, HEADS, K_BLOCK, K_BYTES, PAIR, PAIR_SAMPLES, Q_BLOCK,
    Q_BYTES, ROW_BYTES, SMEM, THREADS, VOTE_SET_BYTES,
};
use crate::abi::{row_chunks_at, GradParams, FLAG_DW_F32, FLAG_PAIR_DISPATCH, FLAG_ROW_CHUNKS};
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{bulk, cp_async, cvt, global, griddep, sreg, sync, wgmma};
use crate::sched::{row_at, row_count};
use crate::score::{ids_i64, load_id, narrow_id_words, resolve};

const WARPS: u32 = THREADS / 32;
/// Staged dK rows each warp reduces per chunk (a power of two: the XOR in
/// the reduction loop permutes them).
const ROWS_PER_WARP: u32 = CHUNK / WARPS;
const _: () = assert!(ROWS_PER_WARP.is_power_of_two());
/// 16-byte vectors per bf16 row of D.
const VECS: u32 = DIM / 8;
/// Named barriers of the paired kernel (0 is the whole CTA's: the
/// prologue's and each item's B2; each half's own barrier is `1 + half`):
/// `BAR_STAGED + h`, half h's dK staging of the current item is complete
/// (h arrives, the other half waits).
const BAR_STAGED: u32 = 3;
/// Staged dK rows (of its eight) each warp reduces right after issuing the
/// next item's S; the rest go after that item's dS, before its barrier B2,
/// and drain while its dQ and dK products run (fewer reductions in one
/// burst). The split was chosen by measurement against the other splits
/// (docs/perf-notes.md, "Measurements behind code choices").
const RED_FIRST: u32 = 4;
const _: () = assert!(RED_FIRST <= ROWS_PER_WARP);
// `reduce_rows` skips a fused call on the other half's group of four slots
// whole: its calls must cover whole groups.
const _: () = assert!(RED_FIRST.is_multiple_of(4) && ROWS_PER_WARP == 8);
// The gather gives each thread the same number of vectors.
const _: () = assert!((CHUNK * VECS).is_multiple_of(THREADS));

/// The kernel body.
///
/// # Safety
/// Launched with [`THREADS`] threads, `super::grid(B * S_q, SMs)` CTAs,
/// `SMEM.bytes` of dynamic shared memory, `H = 64`, `D = 128`,
/// `super::supports(B * S_q, topk)`, as the programmatic dependent of
/// `super::stage1` on the same parameters (or after it completed), and a
/// `GradParams` whose pointers and sizes the host has validated.
///
/// `PAIRED`: the paired kernel's body instead ([`super::WG_PAIR_KERNEL`]:
/// `super::pair_grid` CTAs of `PAIR.threads`, `PAIR.bytes` of dynamic
/// shared memory, an even number of rows). Half `h` of CTA `cta` runs this
/// body on rows `2 (cta + k grid) + h` with its own copy of the layout;
/// both halves walk the same number of chunks per pair (the longer row's),
/// each synchronises its own warps as the row kernel does (barrier
/// `1 + h`) except at the prologue's key-row barrier and each item's B2,
/// which span the CTA (barrier 0); STAGED orders each item's reductions
/// after both halves' staging, and B2 each staging after both halves'
/// reductions of the previous items.
///
/// `go`: whether this kernel computes (the verdict of [`dispatch`]); a
/// CTA of the kernel the test did not pick has no rows.
#[inline(always)]
unsafe fn stage2<const PAIRED: bool, const HALF: u32>(p: &GradParams, go: bool) {
    const H: usize = HEADS as usize;
    const D: usize = DIM as usize;
    let l = SMEM;
    let tid_cta = sreg::thread_idx_x();
    // This thread's half of a paired CTA (0 in the row kernel): a
    // constant, each half runs its own copy of the body. (Derived from
    // %tid.x at run time, ptxas computed the tile addresses and wgmma
    // descriptors per thread and moved each to a uniform register before
    // every wgmma, which slowed the paired kernel down.)
    let half = HALF;
    // The tensor cores apply the swizzle to absolute address bits: align the
    // tiles to 1024 bytes whatever the driver's base alignment is.
    let base0 = (smem::base().0 + 1023) & !1023;
    // Base of half h's copy of the layout (the whole CTA's in the row
    // kernel, h = 0); `pbase` is the other half's (paired kernel only).
    let half_base = |h: u32| SmemAddr(base0 + h * PAIR.half_stride);
    let (base, pbase) = (half_base(half), half_base(1 - half));
    // Barrier of this thread's half (of the CTA in the row kernel); the
    // halves of a paired CTA meet only at B2 and STAGED in the item loop.
    let bar_half = || {
        // SAFETY: called with uniform control flow by every thread of the
        // half (of the CTA in the row kernel); barrier 1 + half is used by
        // no one else, with THREADS threads.
        unsafe {
            if PAIRED {
                sync::bar_sync_named(1 + half, THREADS)
            } else {
                sync::bar_sync()
            }
        }
    };
    let (sq0, sk, sds, sdk) = (base.add(l.q), base.add(l.k), base.add(l.ds), base.add(l.dk));
    let (sgs0, srows0, sred_rows) = (base.add(l.gs), base.add(l.rows), base.add(l.red_rows));
    let sids0 = base.add(l.ids);
    let (sw0, sred) = (base.add(l.w), base.add(l.red));
    // Paired: this half's item votes (`vote`), in the layout's padding.
    let votes = base.add(PAIR.votes);

    let tid = if PAIRED { tid_cta % THREADS } else { tid_cta }; // thread inside the half
    let warp = tid / 32;
    let lane = tid % 32;
    let wg = tid / 128; // warpgroup
    let wi = warp % 4; // warp inside the warpgroup: rows 16 wi .. 16 wi + 16
    let g = lane / 4;
    let c = 2 * (lane % 4);
    let (cta, ctas) = (sreg::block_idx_x(), sreg::grid_dim_x());
    // Units dealt to CTAs: rows, or row pairs in the paired kernel.
    let units = if PAIRED {
        p.batch * p.seq_q / 2
    } else {
        p.batch * p.seq_q
    };
    let topk = p.topk;
    let sm_scale = p.sm_scale;
    // i64 ids (FLAG_IDS_I64): copied whole (8 bytes) into the raw-id sets
    // and narrowed when resolved, once per slot and item; a branch on a
    // launch-uniform flag, outside the MMA and reduction loops.
    let wide = ids_i64(p);
    let dk = p.dk_accum as *mut f32;
    let dcol0 = wg * 64; // this warpgroup's D columns for dQ and dK

    // Items: this CTA's rows x their chunks, in order (`Pos`). Each row
    // runs `row_chunks` chunks: with FLAG_ROW_CHUNKS the stage-1 count
    // (trailing all-padding chunks, whose gradients are exactly zero, are
    // skipped), else all of them. Index arithmetic in u32: the host checks
    // B*S_q*topk < 2^32 (`super::supports`).
    let nchunks = topk.div_ceil(CHUNK);
    let my_rows = if go { row_count(units, ctas, cta) } else { 0 };
    let row_of = |k: u32| {
        if PAIRED {
            2 * row_at(ctas, cta, k) + half
        } else {
            row_at(ctas, cta, k)
        }
    };
    let q_buf = |k: u32| sq0.add((k % 2) * Q_BYTES);
    let w_buf = |k: u32| sw0.add((k % 2) * HEADS * 4);
    // Live chunks of local row k as stage 1 counted them (all of them
    // without FLAG_ROW_CHUNKS; 2 past the CTA's rows, never used there).
    // The load's result is only used by `chunks`, a row later.
    let load_count = |k: u32| -> u32 {
        if k >= my_rows {
            return 2;
        }
        if p.flags & FLAG_ROW_CHUNKS == 0 {
            return nchunks;
        }
        let count = |row: u32| -> u32 {
            let at = row_chunks_at(row, p.flags);
            // SAFETY: read after griddepcontrol.wait: stage 1 wrote the
            // count over the first two bytes of the row's d_weights block
            // (at least 2-byte aligned), which only this CTA writes, at the
            // row's end, a row after this read and behind the barriers of
            // its items (in the paired kernel, barriers of both halves).
            unsafe { *(p.d_weights as *const u8).add(at).cast::<u16>() as u32 }
        };
        if PAIRED {
            // Both halves walk the pair's longer row.
            let r0 = 2 * row_at(ctas, cta, k);
            let (a, b) = (count(r0), count(r0 + 1));
            b.max(a)
        } else {
            count(row_of(k))
        }
    };
    // Chunks the kernel runs for a loaded count. The count is the same in
    // every lane; it goes through a warp reduction because the result lands
    // in a uniform register, so ptxas knows the item walk, the row-end
    // branches and the wgmma descriptors derived from it are warp-uniform
    // (from the load directly it did not, and added convergence code,
    // WARPSYNC and BRA.DIV, around the wgmma waits).
    let chunks = |live: u32| -> u32 {
        // SAFETY: called by every thread with the same value (CTA-uniform
        // control flow).
        row_chunks(unsafe { sync::warp_max_u32(live) }, topk)
    };

    // Slot `tid` of item `at` (threads < CHUNK): the flat slot index, or
    // `None` past topk or past the CTA's rows.
    let slot_of = |at: Pos| -> Option<usize> {
        let t = at.ch * CHUNK + tid;
        (tid < CHUNK && at.k < my_rows && t < topk).then(|| (row_of(at.k) * topk + t) as usize)
    };
    // Resolved key row of item `at`'s slot (`id`: its key id, `None` past
    // topk or the CTA's rows) into set `set`.
    let put_row = |at: Pos, id: Option<i32>, set: u32| {
        if tid < CHUNK {
            // (No division for one batch, the common training case.)
            let b = if p.batch == 1 {
                0
            } else {
                row_of(at.k) / p.seq_q.max(1)
            };
            let r = id.map_or(-1, |id| resolve(id, b, p));
            // SAFETY: slot tid of this set belongs to this thread; its
            // previous readers passed a barrier since (pipeline note).
            unsafe { smem::st_u32(srows0.add(4 * (set * CHUNK + tid)), r as u32) };
        }
    };
    // Key id of item `at`'s slot, loaded into a register (prologue only).
    let load_id = |at: Pos| -> Option<i32> {
        // SAFETY: the flat slot index is inside topk_indices (host-checked).
        slot_of(at).map(|t| unsafe { load_id(p, t) })
    };
    // Key id of item `at`'s slot from raw-id set `set`, where `fetch` put it
    // (i64 ids: narrowed here).
    let raw_id = |at: Pos, set: u32| -> Option<i32> {
        // SAFETY: this thread's own cp.async into its own slot, complete
        // after its wait_all (pipeline note); 8-byte slots for i64 ids.
        slot_of(at).map(|_| unsafe {
            if wide {
                narrow_id_words(smem::ld_v2_u32(sids0.add(8 * (set * CHUNK + tid))))
            } else {
                smem::ld_u32(sids0.add(4 * (set * CHUNK + tid))) as i32
            }
        })
    };
    // Slot data by cp.async (threads < CHUNK, one group with whatever else
    // this thread issued): the key id of item `at_id` into raw-id set
    // `id_set`, the grad_signal of item `at_gs` into slot set `gs_set` (0.0
    // past topk or the CTA's rows, by zero fill). Copies, not register
    // loads: a global load into a register in this loop was waited for at
    // the next shared-memory fence (ptxas drains it before the MEMBAR), and
    // that wait stalled warps 0-1 at the next barrier.
    let fetch = |at_id: Pos, id_set: u32, at_gs: Pos, gs_set: u32| {
        if tid < CHUNK {
            let src = |base: u64, at: Pos, size: u32| match slot_of(at) {
                Some(t) => ((base as *const u8).wrapping_add(size as usize * t), size),
                None => (base as *const u8, 0),
            };
            let (sg, ng) = src(p.attn_score, at_gs, 4);
            // SAFETY: 4-byte (i64 ids: 8-byte) aligned slots inside
            // topk_indices and attn_score (host-checked lengths and
            // alignment; grad_signal read after griddepcontrol.wait), or 0
            // bytes from a valid base; the destination slots' previous
            // readers passed a barrier since (pipeline note).
            unsafe {
                if wide {
                    let (si, ni) = src(p.topk_indices, at_id, 8);
                    cp_async::copy_8(sids0.add(8 * (id_set * CHUNK + tid)), si, ni);
                } else {
                    let (si, ni) = src(p.topk_indices, at_id, 4);
                    cp_async::copy_4(sids0.add(4 * (id_set * CHUNK + tid)), si, ni);
                }
                cp_async::copy_4(sgs0.add(4 * (gs_set * CHUNK + tid)), sg, ng);
            }
        }
        cp_async::commit_group();
    };
    // q tile (cp.async into its swizzle blocks) and weights of local row k.
    let load_row = |k: u32| {
        let row = row_of(k) as usize;
        let qrow = (p.index_q as *const u8).wrapping_add(row * H * D * 2);
        let sq = q_buf(k);
        let mut v = tid;
        while v < HEADS * VECS {
            let (h, cc) = (v / VECS, v % VECS);
            let dst = sq.add((cc / 8) * Q_BLOCK + swizzle(h, (cc % 8) * 16));
            // SAFETY: the row has H*D bf16, 16-byte aligned (host-checked
            // base, D*2 a multiple of 16); the buffer's previous readers
            // passed a barrier (pipeline note); read after wait_all and a
            // barrier.
            unsafe { cp_async::copy_16(dst, qrow.add(v as usize * 16), 16) };
            v += THREADS;
        }
        cp_async::commit_group();
        let mut h = tid;
        while h < HEADS {
            // SAFETY: weights has B*S_q*H bf16; this thread owns slot h.
            unsafe {
                let wb = *(p.weights as *const u16).add(row * H + h as usize);
                smem::st_f32(w_buf(k).add(4 * h), cvt::bf16_to_f32(wb));
            }
            h += THREADS;
        }
    };
    // Gather (cp.async, zero fill for padding) of the K rows of slot set
    // `set` into K buffer `set`, in swizzle blocks; one group per thread.
    let gather = |set: u32| {
        let kbuf = sk.add(set * K_BYTES);
        // One 16-byte vector `v` of the chunk: key row `r` of its slot.
        let copy = |v: u32, r: i32| {
            let (slot, cc) = (v / VECS, v % VECS);
            // SAFETY: a valid row is < B*S_k so the 16-byte vector lies
            // inside index_k; padding copies 0 bytes (zero fill) from the
            // valid base address.
            unsafe {
                let (src, n) = if r >= 0 {
                    (
                        (p.index_k as *const u8).add((r as usize * D + cc as usize * 8) * 2),
                        16,
                    )
                } else {
                    (p.index_k as *const u8, 0)
                };
                let dst = kbuf.add((cc / 8) * K_BLOCK + swizzle(slot, (cc % 8) * 16));
                cp_async::copy_16(dst, src, n);
            }
        };
        // SAFETY: row ids were written before a barrier; read only.
        let row = |v: u32| unsafe { smem::ld_u32(srows0.add(4 * (set * CHUNK + v / VECS))) as i32 };
        // All of this thread's key rows loaded before its first copy, so
        // their latency is paid once, not in front of every copy. Measured
        // on the H200: see docs/perf-history.md ("loads ahead of their use").
        const PER_THREAD: usize = (CHUNK * VECS / THREADS) as usize;
        let mut r = [0i32; PER_THREAD];
        for (i, x) in r.iter_mut().enumerate() {
            *x = row(tid + i as u32 * THREADS);
        }
        for (i, &x) in r.iter().enumerate() {
            copy(tid + i as u32 * THREADS, x);
        }
        cp_async::commit_group();
    };
    // Issue S = q K^T of item `at` (K buffer `buf`, q of its row) for this
    // warpgroup's 32 slots without waiting.
    let issue_s = |s: &mut [f32; 16], at: Pos, buf: u32| {
        let kb = sk.add(buf * K_BYTES);
        let da = desc(q_buf(at.k).0, 16, ATOM_BYTES);
        let db = desc(kb.0 + wg * 32 * ROW_BYTES, 16, ATOM_BYTES);
        *s = [0.0; 16];
        // SAFETY: whole warpgroup; q and the chunk's K rows complete,
        // fenced and behind a barrier; `s` is waited for before any use.
        unsafe { wgmma::issue_s_m64n32(s, da, db) };
    };

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
    if my_rows == 0 {
        if PAIRED {
            // The row kernel, launched next as this grid's programmatic
            // dependent, relies on this grid completing only after stage 1
            // did (it reads what stage 1 wrote).
            // SAFETY: waits for the stage-1 grid.
            unsafe { griddep::wait() };
        }
        return;
    }
    // Items 0 and 1 are chunks 0 and 1 of row 0 whatever the counts.
    let (p0, p1) = (Pos { k: 0, ch: 0 }, Pos { k: 0, ch: 1 });
    load_row(0);
    put_row(p0, load_id(p0), 0);
    put_row(p1, load_id(p1), 1);
    // Uniform barrier: key rows of items 0 and 1 (paired: of both halves,
    // which the vote on item 0 compares).
    if PAIRED {
        // SAFETY: every thread of the CTA reaches it (both halves run the
        // same prologue); barrier 0 is used by nothing else in flight.
        unsafe {
            sync::bar_sync();
            vote(0, srows0, pbase.add(l.rows), votes, tid);
        }
    } else {
        bar_half();
    }
    gather(0);
    gather(1);
    cp_async::wait_all();
    // cp.async writes are generic-proxy writes; wgmma reads through the
    // async proxy.
    bulk::fence_proxy_async_shared();
    // Uniform barrier: q, weights, K(0), K(1).
    bar_half();
    let mut s = [0.0f32; 16];
    issue_s(&mut s, p0, 0);
    // Everything above only read inputs stage 1 does not write; S(0) runs
    // while the stage-1 grid finishes.
    // SAFETY: waits for the stage-1 grid (grad_signal, zeroed dK).
    unsafe { griddep::wait() };
    // The item sequence (`Walk`: where rows k and k+1 end) and the chunk
    // count of row k+2, loaded after barrier M of row k's first item and
    // used when row k+1 starts.
    let mut walk = Walk::new(chunks(load_count(0)), chunks(load_count(1)));
    let mut n_pending = 0u32;
    fetch(walk.pos(2), 0, p0, 0);
    fetch(p0, 1, p1, 1); // (the id copy into set 1 is overwritten unused)
    cp_async::wait_all();
    // Uniform barrier: grad_signal of items 0 and 1.
    bar_half();
    // Reductions of staged rows lo..hi (of each warp's eight) of the
    // current staging; each call covers four rows. In the row kernel's SASS
    // (Nsight Compute, 78a2a89) ptxas unrolls them, loads the four key rows
    // first and then each staged row into the same four registers right
    // before its reduction; loading all four staged rows first (16 more
    // live registers) measured no faster (docs/perf-history.md, "what is left
    // at uniform topk 512").
    // `fused`: `Some(h)` when the item's dK of both rows was computed as
    // one product by half h (paired kernel, every slot the same key row in
    // both halves): its staging holds the sum, and each half reduces its
    // groups of four slots from it.
    let reduce_rows = |lo: u32, hi: u32, fused: Option<u32>| {
        // Each warp takes its eight rows in an order that depends on the
        // CTA (i XOR cta % 8). With one order everywhere, CTAs whose rows
        // select the same key in the same slot (causal selections) reduce
        // into the same key row at the same moment, and those reductions
        // serialize.
        let x = sreg::block_idx_x_here() % ROWS_PER_WARP;
        let slot_at = |i: u32| warp * ROWS_PER_WARP + (i ^ x);
        // Fused: a half reduces the slots of its groups of four, and the
        // calls cover whole groups (RED_FIRST is 0, 4 or 8), so a call on
        // the other half's group has nothing to do.
        if fused.is_some() && lo < hi && ((lo ^ x) / 4) % 2 != half {
            return;
        }
        // The key rows of slot `i`: (this half's, the other half's) for an
        // item that is not fused, (the computing half's, unused) for a
        // fused one.
        let key_rows = |i: u32| -> (i32, i32) {
            let slot = slot_at(i);
            // SAFETY: written before barrier M (of both halves in the
            // paired kernel); read only.
            unsafe {
                match fused {
                    Some(comp) => {
                        let r = smem::ld_u32(half_base(comp).add(l.red_rows).add(4 * slot));
                        (r as i32, 0)
                    }
                    None => {
                        let r = smem::ld_u32(sred_rows.add(4 * slot)) as i32;
                        let pr = if PAIRED {
                            smem::ld_u32(pbase.add(l.red_rows).add(4 * slot)) as i32
                        } else {
                            -1
                        };
                        (r, pr)
                    }
                }
            }
        };
        // Paired: each iteration loads the next slot's key rows before it
        // uses its own (loaded by the previous one), so the shared-memory
        // latency of those loads is not paid in front of every reduction.
        // The row kernel loads them in place: there the same change was
        // slower.
        let mut next = if PAIRED && lo < hi {
            key_rows(lo)
        } else {
            (-1, -1)
        };
        for i in lo..hi {
            let (r, pr) = if PAIRED {
                let cur = next;
                if i + 1 < hi {
                    next = key_rows(i + 1);
                }
                cur
            } else {
                key_rows(i)
            };
            let slot = slot_at(i);
            // SAFETY: the staged row and its key row are complete (barrier
            // M, of both halves in the paired kernel); a valid key row lies
            // inside the (B*S_k, D) accumulator, 16-byte aligned
            // (host-checked base, D*4 a multiple of 16).
            unsafe {
                if let Some(comp) = fused {
                    if r >= 0 && (slot / 4) % 2 == half {
                        let cdk = half_base(comp).add(l.dk);
                        let v = smem::ld_v4_f32(cdk.add(slot * DK_STRIDE + lane * 16));
                        global::red_add_v4_f32(dk.add(r as usize * D + lane as usize * 4), v);
                    }
                    continue;
                }
                // Paired: where the other half's row selected the same key
                // in this slot, one half (alternating by groups of four
                // slots, so every warp does half of them) reduces the sum of
                // both staged rows and the other skips it.
                let shared = PAIRED && r == pr;
                if r >= 0 && (!shared || (slot / 4) % 2 == half) {
                    let at = slot * DK_STRIDE + lane * 16;
                    let mut v = smem::ld_v4_f32(sdk.add(at));
                    if shared {
                        let o = smem::ld_v4_f32(pbase.add(l.dk).add(at));
                        v = [v[0] + o[0], v[1] + o[1], v[2] + o[2], v[3] + o[3]];
                    }
                    global::red_add_v4_f32(dk.add(r as usize * D + lane as usize * 4), v);
                }
            }
        }
    };
    let mut acc_q = [0.0f32; 32]; // dQ, heads x this warpgroup's 64 D columns
    let mut dw = [0.0f32; 2]; // d_weights partials of heads 16 wi + g (+ 8)
    let mut it = 0u32; // index of the current item in the CTA's sequence
    let mut fused_prev: Option<u32> = None; // `fused` of item it - 1
    while walk.k < my_rows {
        let set = it % 2;
        let (k, ch) = (walk.k, it - walk.start);
        let last = it + 1 == walk.end0; // the row's last item
        let ahead2 = walk.pos(it + 2);
        let row = row_of(k) as usize;
        let kb = sk.add(set * K_BYTES);
        let (sq, sw) = (q_buf(k), w_buf(k));
        let (sgs, srows) = (sgs0.add(4 * set * CHUNK), srows0.add(4 * set * CHUNK));
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
        let voted = if PAIRED {
            // SAFETY: after the barrier that follows the votes on this
            // item; the set is rewritten only after the next barrier M.
            unsafe { read_votes(it, votes) }
        } else {
            None
        };
        // The gate's inputs: the weights of this thread's two heads and the
        // grad_signal of its eight slots (written before a barrier). The row
        // kernel loads them before the S wait, so their latency passes
        // during it; the paired kernel, at its limit of 128 registers,
        // after it.
        let gate_in = || {
            // SAFETY: written before a barrier; read only.
            unsafe {
                let wh = [
                    smem::ld_f32(sw.add(4 * (16 * wi + g))),
                    smem::ld_f32(sw.add(4 * (16 * wi + g + 8))),
                ];
                let mut gs = [[0.0f32; 2]; 4];
                for (j, x) in gs.iter_mut().enumerate() {
                    *x = smem::ld_v2_f32(sgs.add(4 * (wg * 32 + 8 * j as u32 + c)));
                }
                (wh, gs)
            }
        };
        let early = if PAIRED { None } else { Some(gate_in()) };
        // SAFETY: whole warpgroup; `s` is the array of the issue.
        unsafe { wgmma::wait_m64n32(&mut s) };
        let (wh, gsv) = early.unwrap_or_else(gate_in);

        // ---- epilogue: gate, dS (bf16, swizzled), d_weights partials ----
        // Padding slots need no test here: their K rows were zero-filled, so
        // S is exactly 0 (or NaN when q holds an infinity) and `S > 0` is
        // false, whatever grad_signal holds there.
        // SAFETY: `sgs` and `sw` were written before a barrier; each thread
        // stores its own dS pairs (distinct (head, slot) pairs).
        unsafe {
            for j in 0..4u32 {
                let tl = wg * 32 + 8 * j + c;
                let gs = gsv[j as usize];
                for (half, dwh) in dw.iter_mut().enumerate() {
                    let h = 16 * wi + g + 8 * half as u32;
                    let mut ds = [0.0f32; 2];
                    for i in 0..2 {
                        let sv = s[(4 * j) as usize + 2 * half + i] * sm_scale;
                        if sv > 0.0 {
                            ds[i] = gs[i] * wh[half];
                            *dwh += gs[i] * sv;
                        }
                    }
                    smem::st_u32(sds.add(swizzle(h, tl * 2)), cvt::pack_bf16x2(ds[0], ds[1]));
                }
            }
            bulk::fence_proxy_async_shared();
        }
        // The previous item's remaining reductions, overlapping this item's
        // dQ and dK products (its staging is rewritten only after B2).
        if RED_FIRST < ROWS_PER_WARP && it > 0 {
            reduce_rows(RED_FIRST, ROWS_PER_WARP, fused_prev);
        }
        // Uniform barrier (B2): dS complete and fenced. Paired: a barrier of
        // the whole CTA. When every slot holds the same key row in both
        // halves (`voted`, an item ahead), half `it % 2` computes
        // the item's dK for both rows as one product and the other half
        // neither computes nor stages dK. Every read of either half's
        // staging of earlier items precedes it, so it also frees both
        // stagings.
        let fused = if PAIRED {
            // SAFETY: every thread of the CTA reaches it (the halves walk
            // the same items); barrier 0 has no other use in the loop.
            unsafe { sync::bar_sync() };
            voted
        } else {
            bar_half();
            None
        };

        // ---- MMA: dQ += dS K (A = dS K-major: heads x slots; B = K chunk
        // MN-major: slots x this warpgroup's 64 D columns) ----
        // SAFETY: whole warpgroup; dS fenced and behind barrier B2; the K
        // chunk and q complete since barrier M of the previous chunk.
        unsafe {
            let da = desc(sds.0, 16, ATOM_BYTES);
            let db = desc(kb.0 + wg * K_BLOCK, K_BLOCK, ATOM_BYTES);
            wgmma::dq_m64n64(&mut acc_q, da, db);
        }

        // ---- MMA: dK = dS^T q (A = dS MN-major: heads x slots read as
        // slots x heads; B = q MN-major: heads x this warpgroup's D) ----
        let mut kacc = [0.0f32; 32];
        // Paired, fused item: this half stages nothing unless it computes
        // (one product and one staging of the summed rows instead of one
        // per half).
        let stages = fused.is_none_or(|comp| comp == half);
        // SAFETY: as above; a fused product also reads the other half's dS
        // and q tiles, complete and fenced before the CTA-wide B2 and
        // rewritten only after its STAGED wait below.
        unsafe {
            let da = desc(sds.0, K_BLOCK, ATOM_BYTES);
            let db = desc(sq.0 + wg * Q_BLOCK, Q_BLOCK, ATOM_BYTES);
            if fused.is_some() {
                if stages {
                    let psq = pbase.add(l.q).add((k % 2) * Q_BYTES);
                    let da1 = desc(pbase.add(l.ds).0, K_BLOCK, ATOM_BYTES);
                    let db1 = desc(psq.0 + wg * Q_BLOCK, Q_BLOCK, ATOM_BYTES);
                    wgmma::dk_m64n64_k128(&mut kacc, da, db, da1, db1);
                }
            } else {
                wgmma::dk_m64n64(&mut kacc, da, db);
            }
        }
        // ---- reduce, part 1: stage dK rows (f32, scaled) in shared
        // memory and keep the chunk's key rows for part 2 ----
        if stages {
            // SAFETY: each thread writes its own fragment elements
            // (distinct (slot, column) pairs); the previous readers of both
            // regions passed B2 (see the pipeline note; in the paired
            // kernel B2 spans both halves, the readers of this staging).
            unsafe {
                for j in 0..8u32 {
                    for half in 0..2u32 {
                        let slot = 16 * wi + g + 8 * half;
                        let col = dcol0 + 8 * j + c;
                        let r = (4 * j + 2 * half) as usize;
                        let at = sdk.add(slot * DK_STRIDE + col * 4);
                        smem::st_v2_f32(at, kacc[r] * sm_scale, kacc[r + 1] * sm_scale);
                    }
                }
                if tid < CHUNK {
                    let r = if PAIRED {
                        own_row
                    } else {
                        smem::ld_u32(srows.add(4 * tid))
                    };
                    smem::st_u32(sred_rows.add(4 * tid), r);
                }
            }
        }
        if PAIRED {
            // SAFETY: as above; the other half waits at STAGED before its
            // reductions of this item.
            unsafe { sync::bar_arrive_named(BAR_STAGED + half, PAIR.threads) };
        }

        // ---- at the row's end: d_index_q (bf16 pairs) and this thread's
        // d_weights partials (fixed-order sums over lanes) ----
        if last {
            // This thread's first (head, column) pair of the row; the others
            // are constant offsets from it (keeps one live address).
            let dq = (p.d_index_q as *mut u32).wrapping_add(
                (row * H * D + (16 * wi + g) as usize * D + (dcol0 + c) as usize) / 2,
            );
            let mut packed = [0u32; 16];
            for (i, w) in packed.iter_mut().enumerate() {
                *w = cvt::pack_bf16x2(acc_q[2 * i] * sm_scale, acc_q[2 * i + 1] * sm_scale);
            }
            for j in 0..8usize {
                for half in 0..2usize {
                    // Register 4j + 2half holds (head 16 wi + g + 8 half,
                    // column dcol0 + 8j + c).
                    // SAFETY: inside this row's H x D block; the column is even.
                    unsafe { *dq.add(half * 8 * D / 2 + 4 * j) = packed[2 * j + half] };
                }
            }
            acc_q = [0.0; 32];
            // SAFETY: full warps run the shuffles (`ch` is uniform); `sred`
            // was last read before this item's B2 (pipeline note).
            unsafe {
                let quad = [sync::quad_sum_f32(dw[0]), sync::quad_sum_f32(dw[1])];
                if lane % 4 == 0 {
                    for (half, &v) in quad.iter().enumerate() {
                        let h = 16 * wi + g + 8 * half as u32;
                        smem::st_f32(sred.add(4 * (warp * HEADS + h)), v);
                    }
                }
            }
            dw = [0.0; 2];
        }

        // ---- next items: slot data of c+2 into the set c just released
        // (same threads that copied its key rows above), K(c+1) complete ----
        if PAIRED {
            // Both halves' key rows of c+1 were written before this item's
            // B2 (each half's before its barrier M of c-1) and are
            // rewritten only after the next B2. Here, in front of the
            // copies' wait, the loads cost little.
            // SAFETY: as said; whole warps, uniform control flow; the
            // vote set of c+1 was last read before barrier M of c-1.
            unsafe { vote(it + 1, srows0, pbase.add(l.rows), votes, tid) };
        }
        cp_async::wait_all();
        if ahead2.k < my_rows {
            put_row(ahead2, raw_id(ahead2, set), set);
        }
        bulk::fence_proxy_async_shared();
        // Uniform barrier (M): staging, key rows and d_weights partials of
        // c, K(c+1) (and the next row's q) and the slot data of c+2
        // visible; every wgmma of c complete; paired: the votes on c+1.
        bar_half();
        if ahead2.k < my_rows {
            gather(set);
        }
        if ch == 0 && k + 1 < my_rows {
            load_row(k + 1);
        }
        // Issued unconditionally (after the last item it computes a
        // product of valid shared memory that nobody reads, drained after
        // the loop): with the issue under a branch, ptxas inserted a wait at
        // the join (C7517) and the overlap below was lost.
        issue_s(&mut s, walk.pos(it + 1), 1 - set);
        // Slot data: the key id of c+3 (resolved by the next item before
        // its M) and the grad_signal of c+2 (read by its gate), in flight
        // until the next item's wait_all.
        fetch(walk.pos(it + 3), 1 - set, ahead2, set);
        if ch == 0 {
            n_pending = load_count(k + 2);
        }

        // Paired: the other half's staging of this item is complete.
        if PAIRED {
            // SAFETY: as above (this half waits, the other arrives).
            unsafe { sync::bar_sync_named(BAR_STAGED + 1 - half, PAIR.threads) };
        }
        // ---- reduce, part 2: each warp adds RED_FIRST of its eight
        // staged rows with coalesced vector reductions (one 512-byte row per
        // warp instruction) while the tensor cores run S(c+1); the other
        // rows follow in the next item, before its B2 ----
        reduce_rows(0, RED_FIRST, fused);
        fused_prev = fused;

        if last {
            let mut h = tid;
            while h < HEADS {
                // Head h lives in warp h / 16 of each warpgroup: sum the
                // two warpgroups' partials (slot halves) in order.
                // SAFETY: partials written before barrier M.
                let sum = unsafe {
                    let mut sum = 0.0f32;
                    for wgi in 0..THREADS / 128 {
                        let w = wgi * 4 + h / 16;
                        sum += smem::ld_f32(sred.add(4 * (w * HEADS + h)));
                    }
                    sum
                };
                let idx = row * H + h as usize;
                // SAFETY: idx < B*S_q*H, the d_weights length (host-checked).
                unsafe {
                    if p.flags & FLAG_DW_F32 != 0 {
                        *(p.d_weights as *mut f32).add(idx) = sum;
                    } else {
                        *(p.d_weights as *mut u16).add(idx) = cvt::pack_bf16x2(sum, 0.0) as u16;
                    }
                }
                h += THREADS;
            }
        }

        // ---- advance: the counts follow the current item's row ----
        it += 1;
        if last {
            walk.next_row(chunks(n_pending));
        }
    }
    // The last item's remaining reductions.
    if RED_FIRST < ROWS_PER_WARP {
        reduce_rows(RED_FIRST, ROWS_PER_WARP, fused_prev);
    }
    // SAFETY: whole warpgroup; drains the unused S issued by the last item.
    unsafe { wgmma::wait_m64n32(&mut s) };
    // The last item's slot-data copies (past the CTA's rows) land before exit.
    cp_async::wait_all();
}

/// The paired kernel's vote on item `it`: whether every slot holds the
/// same key row in both halves (the item can be fused), as `Some(it % 2)`
/// (the half that computes it fused) or `None`.
///
/// Both halves compare the same pairs of key rows (their own set against
/// the other half's), so each decides from its own warps alone: thread
/// `t < CHUNK` compares slot `t`, each warp publishes whether any of its
/// slots differ in its half's vote set `it % 2`, and after the half's
/// next barrier [`read_votes`] combines them. This keeps the vote off B2,
/// which is then a plain `barrier.sync` that the halves may reach at their
/// own instructions (a reduction barrier there is rejected by
/// compute-sanitizer's synccheck, and its result would sit on B2's
/// critical path).
///
/// # Safety
/// Whole warps of one half, uniform control flow; both halves' key rows
/// of item `it` (set `it % 2`) complete and visible; `votes` this half's
/// vote sets, whose set `it % 2` no thread of the half reads until its
/// next barrier.
#[inline(always)]
unsafe fn vote(it: u32, rows: SmemAddr, prows: SmemAddr, votes: SmemAddr, tid: u32) {
    let at = 4 * ((it % 2) * CHUNK + tid);
    // SAFETY: caller's contract; thread t < CHUNK reads slot t of both sets.
    unsafe {
        let differs = tid < CHUNK && smem::ld_u32(rows.add(at)) != smem::ld_u32(prows.add(at));
        let any = sync::warp_max_u32(differs as u32);
        if tid % 32 == 0 {
            smem::st_u32(votes.add((it % 2) * VOTE_SET_BYTES + 4 * (tid / 32)), any);
        }
    }
}

/// The outcome of the votes on item `it` (see [`vote`]).
///
/// # Safety
/// After the half's barrier that follows every warp's [`vote`] on `it`,
/// and before the next vote on `it + 2`.
#[inline(always)]
unsafe fn read_votes(it: u32, votes: SmemAddr) -> Option<u32> {
    let set = votes.add((it % 2) * VOTE_SET_BYTES);
    // SAFETY: caller's contract. Raw words: a float comparison could
    // flush the small integers.
    let (x, y) = unsafe { (smem::ld_v4_f32(set), smem::ld_v4_f32(set.add(16))) };
    let or = x.iter().chain(&y).fold(0, |a, v| a | v.to_bits());
    (or == 0).then_some(it % 2)
}

/// The dispatch test (`super::pairs_match` on sampled ids): whether the
/// paired kernel computes this execute. With [`FLAG_PAIR_DISPATCH`] the
/// host launched the paired kernel, then the row kernel; both run this
/// first and only the one it picks goes on.
///
/// It runs in the kernel entry, before the paired kernel's halves split
/// into their own copies of the body, so every thread of the CTA reaches
/// the one `barrier.red` at the same instruction; and every thread loads
/// (row 0's first id where it samples nothing), so no lane-dependent
/// branch precedes the barrier.
///
/// # Safety
/// Every thread of the CTA calls it (it is a CTA barrier); `p` validated
/// by the host.
#[inline(always)]
unsafe fn pairs_up(p: &GradParams) -> bool {
    let tid = sreg::thread_idx_x();
    let topk = p.topk;
    // Warp i < PAIR_SAMPLES compares the first slots of sampled pair i.
    let (i, t) = (tid / 32, tid % 32);
    let pairs = p.batch * p.seq_q / 2;
    let sampled = i < PAIR_SAMPLES && t < sampled_slots(topk) && pairs > 0;
    let a = if sampled {
        (2 * pair_sample(pairs, i) * topk + t) as usize
    } else {
        0
    };
    let b = if sampled { a + topk as usize } else { 0 };
    // SAFETY: sampled: rows 2q and 2q + 1 < B*S_q (q < pairs), t < topk;
    // otherwise index 0: inside topk_indices (host-checked length, at
    // least one slot); inputs only. i64 ids are narrowed (`load_id`), as
    // `super::ids_pair_up` expects them.
    let (x, y) = unsafe { (load_id(p, a), load_id(p, b)) };
    let hit = sampled & sample_hit(x, y);
    // SAFETY: every thread of the CTA reaches it (caller's contract).
    pairs_match(unsafe { sync::bar_red_popc(hit) }, topk)
}

/// Whether this kernel computes: the dispatch test's verdict for the
/// paired kernel (`PAIRED`) or for the row kernel launched after it (with
/// [`FLAG_PAIR_DISPATCH`]); `true` for a row kernel launched alone. Made
/// warp-uniform with a warp reduction so the kernel's branches on it stay
/// uniform.
///
/// # Safety
/// Every thread of the CTA calls it, in the kernel entry.
#[inline(always)]
unsafe fn dispatch<const PAIRED: bool>(p: &GradParams) -> bool {
    if PAIRED || p.flags & FLAG_PAIR_DISPATCH != 0 {
        // SAFETY: forwarded (whole CTA, uniform control flow).
        unsafe { sync::warp_max_u32(pairs_up(p) as u32) == PAIRED as u32 }
    } else {
        true
    }
}

/// Persistent warpgroup-MMA stage-2 kernel for H = 64, D = 128; see
/// [`stage2`] for the launch contract.
///
/// # Safety
/// As [`stage2`].
#[no_mangle]
pub unsafe extern "ptx-kernel" fn indexer_bwd_wg_h64_d128(p: GradParams) {
    // SAFETY: forwarded launch contract; the whole CTA runs the test.
    unsafe {
        let go = dispatch::<false>(&p);
        stage2::<false, 0>(&p, go)
    }
}

/// Paired persistent warpgroup-MMA stage-2 kernel for H = 64, D = 128 (two
/// rows per CTA in step, shared key rows reduced once); see [`stage2`] for
/// the launch contract.
///
/// # Safety
/// As [`stage2`] with `PAIRED`.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn indexer_bwd_wg_pair_h64_d128(p: GradParams) {
    // SAFETY: forwarded launch contract; the whole CTA runs the test
    // before the halves split.
    unsafe {
        let go = dispatch::<true>(&p);
        if sreg::thread_idx_x() < THREADS {
            stage2::<true, 0>(&p, go)
        } else {
            stage2::<true, 1>(&p, go)
        }
    }
}
