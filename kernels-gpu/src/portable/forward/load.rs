//! The forward kernels' row context ([`Row`]: the launch, the row, its
//! slots and key range, the shared-memory layout) and the portable
//! kernel's weights load. The wgmma kernels' loads (ids, their
//! resolution, the K gather and the q tile into swizzle blocks) are
//! `crate::sm90::forward::load`'s.

use super::{batch_keys, chunks, ids_i64, key_row, FwdSmem, CHUNK, K_BLOCK, ROW_BYTES, ROW_ELEMS};
use crate::abi::{FwdParams, FLAG_FWD_DENSE, FLAG_LOCAL_IDS};
use crate::ptx::smem::{self as sh, SmemAddr};
use crate::ptx::{cvt, sreg};

/// What the kernels know of their launch and row.
pub(crate) struct Row<'a> {
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

/// Stores the row's `h` weights into the weights region as f32 (one
/// plain load per thread `t < h`; `weights` needs only its element
/// alignment).
///
/// # Safety
/// The launch contract; nothing reads the region before a barrier.
#[inline(always)]
pub(crate) unsafe fn load_weights(r: &Row<'_>, h: u32) {
    if r.tid < h {
        // SAFETY: inside the row's weights.
        let w = unsafe { *(r.p.weights as *const u16).add((r.row * h + r.tid) as usize) };
        // SAFETY: this thread's word of the weights region (h f32).
        unsafe { sh::st_f32(r.base.add(r.l.w + 4 * r.tid), cvt::bf16_to_f32(w)) };
    }
}

// A q block row is one swizzled row; the layout's K blocks are CHUNK rows.
const _: () = assert!(ROW_BYTES == 2 * ROW_ELEMS && K_BLOCK == CHUNK * ROW_BYTES);
