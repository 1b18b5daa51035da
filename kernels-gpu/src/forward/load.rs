//! The forward kernels' context and loads: the row's context ([`Row`]),
//! key ids (copied [`IDS_AHEAD`] chunks ahead of their gather), the gather
//! of a chunk's K rows with each slot's validity, and the row's q tile and
//! weights.
//!
//! The wgmma kernel's loads are all `cp.async`, committed as one group per
//! chunk: the group of chunk `c` holds its K rows and the key ids of chunk
//! `c + IDS_AHEAD`; the prologue's, the q tile and the first chunks' ids. A thread
//! that waits for the group of chunk `c` (at most one younger group in
//! flight) has its own copies of both, and a barrier after that wait makes
//! them everyone's.

use super::{
    chunks, ids_i64, key_row, pieces, rows_per_pass, FwdSmem, CHUNK, ID_BYTES, K_BLOCK, MAX_PASSES,
    ROW_BYTES, ROW_ELEMS, STAGES, THREADS,
};
use crate::abi::{FwdParams, FLAG_FWD_DENSE};
use crate::ptx::smem::{self as sh, SmemAddr};
use crate::ptx::{cp_async, cvt, sreg};
use crate::score::narrow_id_words;

/// Chunks ahead of its gather that a chunk's key ids are copied: the
/// copy's group completes [`super::DIST`] chunks later and one barrier
/// after that it is visible to every thread of the row.
pub(super) const IDS_AHEAD: u32 = super::DIST + 1;
/// Bytes of one id set (one chunk's ids).
const ID_SET: u32 = CHUNK * ID_BYTES;
// Chunk `c`'s ids live in set `c % STAGES` from their copy (at the gather
// of chunk `c - IDS_AHEAD`) until their own gather: at most STAGES chunks.
const _: () = assert!(IDS_AHEAD < STAGES);

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
    /// Head dimension (the wgmma kernel's loads).
    #[cfg_attr(not(kernels_arch = "sm_90a"), allow(dead_code))]
    pub d: u32,
}

impl<'a> Row<'a> {
    /// The context of this CTA's row for head dimension `d` on the layout
    /// `l`.
    ///
    /// # Safety
    /// The forward's launch contract: one CTA per row (`grid = p.rows`),
    /// dense mode's `visible` and `key_start` valid for `p.rows` u32.
    #[inline(always)]
    pub unsafe fn new(p: &'a FwdParams, d: u32, l: FwdSmem) -> Row<'a> {
        let row = sreg::block_idx_x();
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
        key_row(self.p, self.row, slot, id, self.n, self.key_start)
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

    /// The validity flags of K buffer `buf`.
    #[inline(always)]
    pub fn valid(&self, buf: u32) -> SmemAddr {
        self.base.add(self.l.valid + buf * CHUNK * 4)
    }
}

/// The rows of a chunk this thread gathers (one per pass, [`rows_per_pass`]
/// apart) and its 16-byte piece of each.
#[cfg_attr(not(kernels_arch = "sm_90a"), allow(dead_code))]
#[inline(always)]
fn my_rows(r: &Row<'_>) -> (u32, u32) {
    (r.tid / pieces(r.d), r.tid % pieces(r.d))
}

/// Copies the key ids of chunk `c` (sparse; nothing in dense mode or past
/// the row's chunks) into id set `c % STAGES`: one thread per slot (the
/// one that gathers piece 0 of it), 4 or 8 bytes, zero past `cols` (where
/// [`Row::key_of`] makes padding of any id).
///
/// # Safety
/// The launch contract; the set was last read before a barrier this
/// thread passed.
#[cfg_attr(not(kernels_arch = "sm_90a"), allow(dead_code))]
#[inline(always)]
pub(super) unsafe fn copy_ids(r: &Row<'_>, c: u32) {
    if r.dense() || c >= r.chunks() {
        return;
    }
    let (first, piece) = my_rows(r);
    if piece != 0 {
        return;
    }
    let set = r.base.add(r.l.ids + (c % STAGES) * ID_SET);
    let wide = ids_i64(r.p);
    let width = if wide { 8 } else { 4 };
    let mut i = 0;
    while i < super::passes(r.d) {
        let row = first + rows_per_pass(r.d) * i;
        let slot = c * CHUNK + row;
        let n = if slot < r.p.cols { width } else { 0 };
        let src = if n > 0 {
            // SAFETY: in bounds (slot < cols).
            unsafe { (r.p.topk_indices as *const u8).add(r.flat(slot) * width as usize) }
        } else {
            r.p.topk_indices as *const u8
        };
        let dst = set.add(row * ID_BYTES);
        // SAFETY: the set is this thread's slot, aligned; src valid for n
        // bytes (host-checked id tensor, aligned to its width).
        unsafe {
            if wide {
                cp_async::copy_8(dst, src, n)
            } else {
                cp_async::copy_4(dst, src, n)
            }
        }
        i += 1;
    }
}

/// The resolved key rows (-1 padding) of this thread's rows of chunk `c`,
/// from id set `c % STAGES` (sparse) or the row's visible range (dense).
///
/// # Safety
/// Sparse: the set's copies completed and a barrier passed since.
#[cfg_attr(not(kernels_arch = "sm_90a"), allow(dead_code))]
#[inline(always)]
pub(super) unsafe fn key_rows(r: &Row<'_>, c: u32) -> [i32; MAX_PASSES] {
    let (first, _) = my_rows(r);
    let set = r.base.add(r.l.ids + (c % STAGES) * ID_SET);
    let wide = ids_i64(r.p);
    let mut keys = [-1i32; MAX_PASSES];
    let mut i = 0;
    while i < super::passes(r.d) {
        let row = first + rows_per_pass(r.d) * i;
        let id = if r.dense() {
            0
        } else {
            let at = set.add(row * ID_BYTES);
            // SAFETY: the caller's contract; in the set.
            unsafe {
                if wide {
                    narrow_id_words(sh::ld_v2_u32(at))
                } else {
                    sh::ld_u32(at) as i32
                }
            }
        };
        keys[i as usize] = r.key_of(c * CHUNK + row, id);
        i += 1;
    }
    keys
}

/// Gathers chunk `c`'s K rows (`keys`, from [`key_rows`]) into K buffer
/// `c % STAGES` as 64-column swizzle blocks (the wgmma A operand, K-major;
/// padding rows zero-filled) and, from the thread of piece 0, each row's
/// validity. Returns whether any of this thread's rows is valid.
///
/// # Safety
/// The buffer and its flags were last read before a barrier this thread
/// passed; `keys` are rows of `index_k` or -1.
#[cfg_attr(not(kernels_arch = "sm_90a"), allow(dead_code))]
#[inline(always)]
pub(super) unsafe fn gather(r: &Row<'_>, c: u32, keys: &[i32; MAX_PASSES]) -> bool {
    let (first, piece) = my_rows(r);
    let kb = r.kbuf(c % STAGES);
    let flags = r.valid(c % STAGES);
    let row_bytes = (r.d * 2) as usize;
    let mut any = false;
    let mut i = 0;
    while i < super::passes(r.d) {
        let row = first + rows_per_pass(r.d) * i;
        let key = keys[i as usize];
        let ok = key >= 0;
        any |= ok;
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
        if piece == 0 {
            // SAFETY: this thread's flag of the buffer.
            unsafe { sh::st_u32(flags.add(4 * row), ok as u32) };
        }
        i += 1;
    }
    any
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
