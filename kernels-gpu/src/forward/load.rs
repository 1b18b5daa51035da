//! The forward kernels' context and loads: the row's context ([`Row`]),
//! key ids (copied [`super::IDS_AHEAD`] chunks ahead of their gather, one slot per
//! thread), their resolution into key rows ([`resolve`], by the thread
//! that copied them, one iteration before the gather), the gather of a
//! chunk's K rows, and the row's q tile and weights.
//!
//! The wgmma kernel's loads are all `cp.async`, committed as one group per
//! chunk: the group of chunk `c` holds its K rows and the key ids of chunk
//! `c + IDS_AHEAD`; the prologue's, the q tile and the first chunks' ids.
//! Thread `t < CHUNK` copies and resolves slot `t` of every chunk, so its
//! own wait for a group makes the ids it resolves visible to it; the
//! resolved key rows reach the gathering threads through a barrier.

use super::{
    batch_keys, chunks, ids_i64, key_row, pieces, rows_per_pass, FwdSmem, CHUNK, ID_BYTES, ID_SETS,
    KEY_SETS, K_BLOCK, ROW_BYTES, ROW_ELEMS, STAGES, THREADS,
};
use crate::abi::{FwdParams, FLAG_FWD_DENSE, FLAG_LOCAL_IDS};
use crate::ptx::smem::{self as sh, SmemAddr};
use crate::ptx::{cp_async, cvt, sreg};
use crate::score::narrow_id_words;

/// Bytes of one id set (one chunk's ids).
const ID_SET: u32 = CHUNK * ID_BYTES;
// One copying and resolving thread per slot.
const _: () = assert!(CHUNK <= THREADS);

/// What the kernels know of their launch and row.
pub(super) struct Row<'a> {
    /// The launch's parameters.
    pub p: &'a FwdParams,
    /// This CTA's query row.
    pub row: u32,
    /// Thread index.
    pub tid: u32,
    /// The 1024-byte aligned base of dynamic shared memory.
    pub base: SmemAddr,
    /// The layout.
    pub l: FwdSmem,
    /// Slots walked: sparse, every slot (`cols`); dense, the visible
    /// columns.
    pub n: u32,
    /// Dense: the key row of column 0.
    pub key_start: u32,
    /// Local ids: the first key row of the row's batch (else 0).
    pub first_key: u32,
    /// Head dimension (the wgmma kernel's loads).
    #[cfg_attr(not(kernels_arch = "sm_90a"), allow(dead_code))]
    pub d: u32,
}

impl<'a> Row<'a> {
    /// The context of query row `row` for head dimension `d` on the layout
    /// `l`.
    ///
    /// # Safety
    /// `row < p.rows`; dense mode's `visible` and `key_start` valid for
    /// `p.rows` u32 (the forward's launch contract).
    #[inline(always)]
    pub unsafe fn new(p: &'a FwdParams, row: u32, d: u32, l: FwdSmem) -> Row<'a> {
        let (n, key_start) = if p.flags & FLAG_FWD_DENSE != 0 {
            // SAFETY: the launch contract (one u32 per row each).
            unsafe {
                let v = *(p.visible as *const u32).add(row as usize);
                (
                    v.min(p.cols),
                    *(p.key_start as *const u32).add(row as usize),
                )
            }
        } else {
            (p.cols, 0)
        };
        Row {
            p,
            row,
            tid: sreg::thread_idx_x(),
            base: SmemAddr((sh::base().0 + 1023) & !1023),
            l,
            n,
            key_start,
            first_key: if p.flags & FLAG_LOCAL_IDS != 0 {
                batch_keys(p, row)
            } else {
                0
            },
            d,
        }
    }

    /// Chunks this row walks.
    #[inline(always)]
    pub fn chunks(&self) -> u32 {
        chunks(self.n)
    }

    /// Whether the launch is dense mode's.
    #[inline(always)]
    pub fn dense(&self) -> bool {
        self.p.flags & FLAG_FWD_DENSE != 0
    }

    /// Flat index of slot `slot` of this row in the `(rows, cols)` tensors.
    #[inline(always)]
    pub fn flat(&self, slot: u32) -> usize {
        self.row as usize * self.p.cols as usize + slot as usize
    }

    /// The key row of slot `slot` (-1 padding) from its narrowed id.
    #[inline(always)]
    pub fn key_of(&self, slot: u32, id: i32) -> i32 {
        key_row(self.p, self.first_key, slot, id, self.n, self.key_start)
    }

    /// The narrowed key id of slot `slot` read from global memory (the
    /// row's rewrite; sparse only, `slot < cols`).
    ///
    /// # Safety
    /// The launch contract (`topk_indices` holds `rows * cols` ids).
    #[inline(always)]
    pub unsafe fn global_id(&self, slot: u32) -> i32 {
        let i = self.flat(slot);
        // SAFETY: the caller's contract; the flag picks the width.
        unsafe {
            if ids_i64(self.p) {
                crate::score::narrow_id(*(self.p.topk_indices as *const i64).add(i))
            } else {
                *(self.p.topk_indices as *const i32).add(i)
            }
        }
    }

    /// The K buffer `buf`.
    #[cfg_attr(not(kernels_arch = "sm_90a"), allow(dead_code))]
    #[inline(always)]
    pub fn kbuf(&self, buf: u32) -> SmemAddr {
        self.base.add(self.l.k + buf * super::k_bytes(self.d))
    }

    /// Key set `set`: [`CHUNK`] resolved key rows (-1 padding).
    #[inline(always)]
    pub fn keys(&self, set: u32) -> SmemAddr {
        self.base.add(self.l.keys + set * CHUNK * 4)
    }
}

/// Copies the key ids of chunk `c` (sparse; nothing in dense mode or past
/// the row's chunks) into id set `c % ID_SETS`: thread `t < CHUNK` slot
/// `t`'s, 4 or 8 bytes, zero past `cols` (where [`Row::key_of`] makes
/// padding of any id).
///
/// # Safety
/// The launch contract; this thread last read its word of the set before
/// a barrier it passed.
#[cfg_attr(not(kernels_arch = "sm_90a"), allow(dead_code))]
#[inline(always)]
pub(super) unsafe fn copy_ids(r: &Row<'_>, c: u32) {
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
#[cfg_attr(not(kernels_arch = "sm_90a"), allow(dead_code))]
#[inline(always)]
pub(super) unsafe fn resolve(r: &Row<'_>, c: u32) -> bool {
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
#[cfg_attr(not(kernels_arch = "sm_90a"), allow(dead_code))]
#[inline(always)]
pub(super) unsafe fn gather(r: &Row<'_>, c: u32) {
    let (first, piece) = (r.tid / pieces(r.d), r.tid % pieces(r.d));
    let kb = r.kbuf(c % STAGES);
    let keys = r.keys(c % KEY_SETS);
    let row_bytes = (r.d * 2) as usize;
    let mut i = 0;
    while i < super::passes(r.d) {
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
        let dst = kb.add((piece / 8) * K_BLOCK + crate::sm90::swizzle(row, (piece % 8) * 16));
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
#[cfg_attr(not(kernels_arch = "sm_90a"), allow(dead_code))]
#[inline(always)]
pub(super) unsafe fn copy_q(r: &Row<'_>, h: u32) {
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
            .add(r.l.q + (piece / 8) * r.l.q_block + crate::sm90::swizzle(head, (piece % 8) * 16));
        // SAFETY: 16-byte aligned (index_q is 16-byte aligned).
        unsafe { cp_async::copy_16(dst, src, 16) };
        v += THREADS;
    }
}

/// Stores the row's `h` weights into the weights region as f32 (one
/// plain load per thread `t < h`; `weights` needs only its element
/// alignment).
///
/// # Safety
/// The launch contract; nothing reads the region before a barrier.
#[inline(always)]
pub(super) unsafe fn load_weights(r: &Row<'_>, h: u32) {
    if r.tid < h {
        // SAFETY: inside the row's weights.
        let w = unsafe { *(r.p.weights as *const u16).add((r.row * h + r.tid) as usize) };
        // SAFETY: this thread's word of the weights region (h f32).
        unsafe { sh::st_f32(r.base.add(r.l.w + 4 * r.tid), cvt::bf16_to_f32(w)) };
    }
}

/// [`load_weights`] in two steps: this thread's weight of the row (head
/// `t` for thread `t < h`, as bf16 bits; 0 for the other threads), loaded
/// into a register so that its latency can pass before [`store_weight`]
/// needs it.
///
/// # Safety
/// The launch contract.
#[cfg_attr(not(kernels_arch = "sm_90a"), allow(dead_code))]
#[inline(always)]
pub(super) unsafe fn fetch_weight(r: &Row<'_>, h: u32) -> u16 {
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
#[cfg_attr(not(kernels_arch = "sm_90a"), allow(dead_code))]
#[inline(always)]
pub(super) unsafe fn store_weight(r: &Row<'_>, h: u32, w: u16) {
    if r.tid < h {
        // SAFETY: this thread's word of the weights region (h f32).
        unsafe { sh::st_f32(r.base.add(r.l.w + 4 * r.tid), cvt::bf16_to_f32(w)) };
    }
}

/// Head `col`'s weight, from the weights region.
///
/// # Safety
/// After [`load_weights`] and a barrier; `col < h`.
#[cfg_attr(not(kernels_arch = "sm_90a"), allow(dead_code))]
#[inline(always)]
pub(super) unsafe fn weight(r: &Row<'_>, col: u32) -> f32 {
    // SAFETY: the caller's contract.
    unsafe { sh::ld_f32(r.base.add(r.l.w + 4 * col)) }
}

// A q block row is one swizzled row; the layout's K blocks are CHUNK rows.
const _: () = assert!(ROW_BYTES == 2 * ROW_ELEMS && K_BLOCK == CHUNK * ROW_BYTES);
