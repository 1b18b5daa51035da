//! The wgmma forward kernels' loads: key ids (copied `IDS_AHEAD` chunks
//! ahead of their gather, one slot per thread), their resolution into key
//! rows ([`resolve`], by the thread that copied them, one iteration before
//! the gather), the gather of a chunk's K rows and the row's q tile into
//! swizzle blocks, and the row's weights in two steps.
//!
//! The loads are all `cp.async`, committed as one group per chunk: the
//! group of chunk `c` holds its K rows and the key ids of chunk
//! `c + IDS_AHEAD`; the prologue's, the q tile and the first chunks' ids.
//! Thread `t < CHUNK` copies and resolves slot `t` of every chunk, so its
//! own wait for a group makes the ids it resolves visible to it; the
//! resolved key rows reach the gathering threads through a barrier.

use crate::portable::forward::load::Row;
use crate::portable::forward::{
    ids_i64, passes, pieces, rows_per_pass, CHUNK, ID_BYTES, ID_SETS, KEY_SETS, K_BLOCK, STAGES,
    THREADS,
};
use crate::ptx::smem as sh;
use crate::ptx::{cp_async, cvt};
use crate::score::narrow_id_words;
use crate::sm90::swizzle;

/// Bytes of one id set (one chunk's ids).
const ID_SET: u32 = CHUNK * ID_BYTES;
// One copying and resolving thread per slot.
const _: () = assert!(CHUNK <= THREADS);

/// Copies the key ids of chunk `c` (sparse; nothing in dense mode or past
/// the row's chunks) into id set `c % ID_SETS`: thread `t < CHUNK` slot
/// `t`'s, 4 or 8 bytes, zero past `cols` (where [`Row::key_of`] makes
/// padding of any id).
///
/// # Safety
/// The launch contract; this thread last read its word of the set before
/// a barrier it passed.
#[inline(always)]
pub(crate) unsafe fn copy_ids(r: &Row<'_>, c: u32) {
    if r.dense() || c >= r.chunks() || r.tid >= CHUNK {
        return;
    }
    let slot = c * CHUNK + r.tid;
    let wide = ids_i64(r.p);
    let width = if wide { 8 } else { 4 };
    let n = if slot < r.p.cols { width } else { 0 };
    let src = if n > 0 {
        // SAFETY: in bounds (slot < cols).
        unsafe { (r.p.topk_indices as *const u8).add(r.flat(slot) * width as usize) }
    } else {
        r.p.topk_indices as *const u8
    };
    let dst = r
        .base
        .add(r.l.ids + (c % ID_SETS) * ID_SET + r.tid * ID_BYTES);
    // SAFETY: this thread's slot of the set, aligned; src valid for n bytes
    // (host-checked id tensor, aligned to its width).
    unsafe {
        if wide {
            cp_async::copy_8(dst, src, n)
        } else {
            cp_async::copy_4(dst, src, n)
        }
    }
}

/// Resolves slot `t` of chunk `c` (thread `t < CHUNK`; nothing past the
/// row's chunks) into key set `c % KEY_SETS`: its key row from the id this
/// thread copied (sparse) or the row's visible range (dense), -1 for
/// padding. Returns whether the slot is valid.
///
/// # Safety
/// Sparse: this thread's copy of the chunk's ids completed (its wait); the
/// key set's word was last read before a barrier this thread passed.
#[inline(always)]
pub(crate) unsafe fn resolve(r: &Row<'_>, c: u32) -> bool {
    if r.tid >= CHUNK || c >= r.chunks() {
        return false;
    }
    let id = if r.dense() {
        0
    } else {
        let at = r
            .base
            .add(r.l.ids + (c % ID_SETS) * ID_SET + r.tid * ID_BYTES);
        // SAFETY: the caller's contract; this thread's slot of the set.
        unsafe {
            if ids_i64(r.p) {
                narrow_id_words(sh::ld_v2_u32(at))
            } else {
                sh::ld_u32(at) as i32
            }
        }
    };
    let key = r.key_of(c * CHUNK + r.tid, id);
    // SAFETY: this thread's word of the key set.
    unsafe { sh::st_u32(r.keys(c % KEY_SETS).add(4 * r.tid), key as u32) };
    key >= 0
}

/// Gathers chunk `c`'s K rows (their key rows from key set `c % KEY_SETS`)
/// into K buffer `c % STAGES` as 64-column swizzle blocks (the wgmma A
/// operand, K-major; padding rows zero-filled): each thread one 16-byte
/// piece of one row per pass, [`rows_per_pass`] rows apart.
///
/// # Safety
/// The chunk's key set was written before a barrier this thread passed;
/// the K buffer was last read before a barrier this thread passed.
#[inline(always)]
pub(crate) unsafe fn gather(r: &Row<'_>, c: u32) {
    let (first, piece) = (r.tid / pieces(r.d), r.tid % pieces(r.d));
    let kb = r.kbuf(c % STAGES);
    let keys = r.keys(c % KEY_SETS);
    let row_bytes = (r.d * 2) as usize;
    let mut i = 0;
    while i < passes(r.d) {
        let row = first + rows_per_pass(r.d) * i;
        // SAFETY: written by the slot's resolver before a barrier.
        let key = unsafe { sh::ld_u32(keys.add(4 * row)) } as i32;
        let ok = key >= 0;
        let src = if ok {
            // SAFETY: a valid key row of index_k.
            unsafe {
                (r.p.index_k as *const u8).add(key as usize * row_bytes + piece as usize * 16)
            }
        } else {
            r.p.index_k as *const u8
        };
        let dst = kb.add((piece / 8) * K_BLOCK + swizzle(row, (piece % 8) * 16));
        // SAFETY: the caller's contract; 16-byte aligned (index_k is
        // 16-byte aligned, rows of D bf16 are whole pieces).
        unsafe { cp_async::copy_16(dst, src, if ok { 16 } else { 0 }) };
        i += 1;
    }
}

/// Copies the row's q tile (`h` heads x D) into the q region as 64-column
/// swizzle blocks (the wgmma B operand, K-major), by `cp.async`, in the
/// caller's current group.
///
/// # Safety
/// The launch contract; nothing reads the region before this thread's
/// wait for the group and a barrier.
#[inline(always)]
pub(crate) unsafe fn copy_q(r: &Row<'_>, h: u32) {
    let d = r.d;
    let per_row = pieces(d);
    let total = h * per_row;
    let q0 = r.p.index_q as *const u8;
    let row_q = r.row as usize * (h * d * 2) as usize;
    let mut v = r.tid;
    while v < total {
        let (head, piece) = (v / per_row, v % per_row);
        // SAFETY: inside the row's q (h x d bf16).
        let src = unsafe { q0.add(row_q + (head * d * 2 + piece * 16) as usize) };
        let dst = r
            .base
            .add(r.l.q + (piece / 8) * r.l.q_block + swizzle(head, (piece % 8) * 16));
        // SAFETY: 16-byte aligned (index_q is 16-byte aligned).
        unsafe { cp_async::copy_16(dst, src, 16) };
        v += THREADS;
    }
}

/// `load_weights` in two steps: this thread's weight of the row (head
/// `t` for thread `t < h`, as bf16 bits; 0 for the other threads), loaded
/// into a register so that its latency can pass before [`store_weight`]
/// needs it.
///
/// # Safety
/// The launch contract.
#[inline(always)]
pub(crate) unsafe fn fetch_weight(r: &Row<'_>, h: u32) -> u16 {
    if r.tid < h {
        // SAFETY: inside the row's weights.
        unsafe { *(r.p.weights as *const u16).add((r.row * h + r.tid) as usize) }
    } else {
        0
    }
}

/// Stores this thread's weight `w` (from [`fetch_weight`] of the same row)
/// into the weights region as f32.
///
/// # Safety
/// Nothing reads the region between the last barrier and the next.
#[inline(always)]
pub(crate) unsafe fn store_weight(r: &Row<'_>, h: u32, w: u16) {
    if r.tid < h {
        // SAFETY: this thread's word of the weights region (h f32).
        unsafe { sh::st_f32(r.base.add(r.l.w + 4 * r.tid), cvt::bf16_to_f32(w)) };
    }
}

/// Head `col`'s weight, from the weights region.
///
/// # Safety
/// After [`load_weights`] and a barrier; `col < h`.
#[inline(always)]
pub(crate) unsafe fn weight(r: &Row<'_>, col: u32) -> f32 {
    // SAFETY: the caller's contract.
    unsafe { sh::ld_f32(r.base.add(r.l.w + 4 * col)) }
}
