//! The loads of the wgmma kernels (every thread of the half takes part):
//! chunk counts, key ids and their resolution into key rows, the gather
//! of K rows, the slot data (key ids, grad_signal) and the q tile and
//! weights of a row. Everything arrives by `cp.async` except the prologue's
//! first key ids and the chunk counts; slot data never goes through
//! registers (i64 ids as 8-byte copies, narrowed when resolved).

use super::ctx::{Ctx, HEAD_HALVES, SHARED_K};
use super::{Pos, CHUNK, DIM, HEADS, K_BLOCK, K_BYTES, Q_BLOCK, Q_HEADS, THREADS};
use crate::abi::{row_chunks_at, FLAG_ROW_CHUNKS};
use crate::ptx::smem;
use crate::sm90::swizzle;
use crate::ptx::{cp_async, cvt};
use crate::sched::row_at;
use crate::score::{load_id, narrow_id_words, resolve};

/// 16-byte vectors per bf16 row of D.
const VECS: u32 = DIM / 8;
// The gather gives each thread the same number of vectors (with shared K
// buffers, each half half of them).
const _: () = assert!((CHUNK * VECS).is_multiple_of(2 * THREADS));

/// Live chunks of local row `k` as stage 1 counted them (all of them
/// without `FLAG_ROW_CHUNKS`; 2 past the CTA's rows, never used there).
/// The load's result is only used by `Ctx::chunks`, a row later.
pub(super) fn load_count<const PAIRED: bool, const HALF: u32>(
    c: &Ctx<'_, PAIRED, HALF>,
    k: u32,
) -> u32 {
    let p = c.p;
    if k >= c.my_rows {
        return 2;
    }
    if p.flags & FLAG_ROW_CHUNKS == 0 {
        return c.nchunks;
    }
    let count = |row: u32| -> u32 {
        let at = row_chunks_at(row, Q_HEADS, p.flags);
        // SAFETY: read after griddepcontrol.wait: stage 1 wrote the
        // count over the first two bytes of the row's d_weights block
        // (at least 2-byte aligned), which only this CTA writes, at the
        // row's end, a row after this read and behind the barriers of
        // its items (in the paired kernel, barriers of both halves; with
        // HEAD_HALVES half 0 writes it, as head 0's d_weights, at the
        // row's end, after CTA-wide B2s that both halves reach after
        // this read).
        unsafe { *(p.d_weights as *const u8).add(at).cast::<u16>() as u32 }
    };
    if PAIRED && !HEAD_HALVES {
        // Both halves walk the pair's longer row.
        let r0 = 2 * row_at(c.ctas, c.cta, k);
        let (a, b) = (count(r0), count(r0 + 1));
        b.max(a)
    } else {
        count(c.row_of(k))
    }
}

/// Resolved key row of item `at`'s slot (`id`: its key id, `None` past
/// topk or the CTA's rows) into set `set`.
pub(super) fn put_row<const PAIRED: bool, const HALF: u32>(
    c: &Ctx<'_, PAIRED, HALF>,
    at: Pos,
    id: Option<i32>,
    set: u32,
) {
    let (p, tid) = (c.p, c.tid);
    if tid < CHUNK {
        // (No division for one batch, the common training case.)
        let b = if p.batch == 1 {
            0
        } else {
            c.row_of(at.k) / p.seq_q.max(1)
        };
        let r = id.map_or(-1, |id| resolve(id, b, p));
        // SAFETY: slot tid of this set belongs to this thread; its
        // previous readers passed a barrier since (pipeline note).
        unsafe { smem::st_u32(c.srows0.add(4 * (set * CHUNK + tid)), r as u32) };
    }
}

/// Key id of item `at`'s slot, loaded into a register (prologue only).
pub(super) fn first_id<const PAIRED: bool, const HALF: u32>(
    c: &Ctx<'_, PAIRED, HALF>,
    at: Pos,
) -> Option<i32> {
    // SAFETY: the flat slot index is inside topk_indices (host-checked).
    c.slot_of(at).map(|t| unsafe { load_id(c.p, t) })
}

/// Key id of item `at`'s slot from raw-id set `set`, where [`fetch`] put
/// it (i64 ids: narrowed here).
pub(super) fn raw_id<const PAIRED: bool, const HALF: u32>(
    c: &Ctx<'_, PAIRED, HALF>,
    at: Pos,
    set: u32,
) -> Option<i32> {
    let tid = c.tid;
    // SAFETY: this thread's own cp.async into its own slot, complete
    // after its wait_all (pipeline note); 8-byte slots for i64 ids.
    c.slot_of(at).map(|_| unsafe {
        if c.wide {
            narrow_id_words(smem::ld_v2_u32(c.raw_slot(set)))
        } else {
            smem::ld_u32(c.sids0.add(4 * (set * CHUNK + tid))) as i32
        }
    })
}

/// Slot data by cp.async (threads < CHUNK, one group with whatever else
/// this thread issued): the key id of item `at_id` into raw-id set
/// `id_set`, the grad_signal of item `at_gs` into slot set `gs_set` (0.0
/// past topk or the CTA's rows, by zero fill). Copies, not register
/// loads: a global load into a register in this loop was waited for at
/// the next shared-memory fence (ptxas drains it before the MEMBAR), and
/// that wait stalled warps 0-1 at the next barrier.
pub(super) fn fetch<const PAIRED: bool, const HALF: u32>(
    c: &Ctx<'_, PAIRED, HALF>,
    at_id: Pos,
    id_set: u32,
    at_gs: Pos,
    gs_set: u32,
) {
    let (p, tid) = (c.p, c.tid);
    if tid < CHUNK {
        let src = |base: u64, at: Pos, size: u32| match c.slot_of(at) {
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
            if c.wide {
                let (si, ni) = src(p.topk_indices, at_id, 8);
                cp_async::copy_8(c.raw_slot(id_set), si, ni);
            } else {
                let (si, ni) = src(p.topk_indices, at_id, 4);
                cp_async::copy_4(c.sids0.add(4 * (id_set * CHUNK + tid)), si, ni);
            }
            cp_async::copy_4(c.sgs0.add(4 * (gs_set * CHUNK + tid)), sg, ng);
        }
    }
    cp_async::commit_group();
}

/// q tile (cp.async into its swizzle blocks) and weights of local row `k`
/// (with `HEAD_HALVES`, this half's 64 heads of it).
///
/// With fewer heads than the tile's rows (`Q_HEADS < HEADS`: H = 32 or
/// 16 on the M = 64 tile) the padded rows `Q_HEADS..HEADS` of the q tile
/// are zero-filled by the same copies (0 bytes read from the row's start)
/// on every load, so both q buffers hold zeros there for every row, and
/// the padded heads' weights are 0: their S is 0, so their dS and
/// d_weights partials are 0 and they add nothing to dK. Only the row's
/// `Q_HEADS x D` elements and `Q_HEADS` weights are read.
pub(super) fn load_row<const PAIRED: bool, const HALF: u32>(c: &Ctx<'_, PAIRED, HALF>, k: u32) {
    const H: usize = Q_HEADS as usize;
    const D: usize = DIM as usize;
    let (p, tid) = (c.p, c.tid);
    let row = c.row_of(k) as usize;
    let h0 = c.head0() as usize;
    let qrow = (p.index_q as *const u8).wrapping_add((row * H + h0) * D * 2);
    let sq = c.q_buf(k);
    let mut v = tid;
    while v < HEADS * VECS {
        let (h, cc) = (v / VECS, v % VECS);
        let dst = sq.add((cc / 8) * Q_BLOCK + swizzle(h, (cc % 8) * 16));
        // SAFETY: the row has H*D bf16, 16-byte aligned (host-checked
        // base, D*2 a multiple of 16), and vector v of heads h0.. lies
        // inside it (h0 + 64 <= H); padded heads copy 0 bytes (zero fill)
        // from the row's start;
        // the buffer's previous readers passed a barrier (pipeline note);
        // read after wait_all and a barrier.
        unsafe {
            let (src, n) = if Q_HEADS >= HEADS || v < Q_HEADS * VECS {
                (qrow.add(v as usize * 16), 16)
            } else {
                (qrow, 0)
            };
            cp_async::copy_16(dst, src, n)
        };
        v += THREADS;
    }
    cp_async::commit_group();
    let mut h = tid;
    while h < HEADS {
        // SAFETY: weights has B*S_q*H bf16 and only h0 + h < H is read;
        // this thread owns slot h.
        unsafe {
            let w = if Q_HEADS >= HEADS || h < Q_HEADS {
                cvt::bf16_to_f32(*(p.weights as *const u16).add(row * H + h0 + h as usize))
            } else {
                0.0
            };
            smem::st_f32(c.w_buf(k).add(4 * h), w);
        }
        h += THREADS;
    }
}

/// Gather (cp.async, zero fill for padding) of the K rows of slot set
/// `set` into K buffer `set`, in swizzle blocks; one group per thread.
pub(super) fn gather<const PAIRED: bool, const HALF: u32>(c: &Ctx<'_, PAIRED, HALF>, set: u32) {
    const D: usize = DIM as usize;
    let (p, tid) = (c.p, c.tid);
    let kbuf = c.sk.add(set * K_BYTES);
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
    let row = |v: u32| unsafe { smem::ld_u32(c.srows0.add(4 * (set * CHUNK + v / VECS))) as i32 };
    // All of this thread's key rows loaded before its first copy, so
    // their latency is paid once, not in front of every copy.
    // Shared K buffers (`SHARED_K`): half h copies the vectors of slots
    // `32 h .. 32 h + 32`.
    const SHARES: u32 = if SHARED_K { 2 } else { 1 };
    const PER_THREAD: usize = (CHUNK * VECS / THREADS / SHARES) as usize;
    let first = if SHARED_K { HALF * CHUNK * VECS / 2 } else { 0 };
    let mut r = [0i32; PER_THREAD];
    for (i, x) in r.iter_mut().enumerate() {
        *x = row(first + tid + i as u32 * THREADS);
    }
    for (i, &x) in r.iter().enumerate() {
        copy(first + tid + i as u32 * THREADS, x);
    }
    cp_async::commit_group();
}
