//! The producer warp of the dense tile kernel: every tile by TMA (two
//! boxes of 64 rows x 64 columns, one per swizzle block, through the
//! parameter's tensor maps); each streamed tile's grad_signal by 4-byte
//! `cp.async` copies whose completion arrives on the stage's "full"
//! barrier (zero-filled where the row does not see the key), and a key
//! item's weights and the row's visible count by plain loads issued one
//! row ahead ([`Scalars`]), stored before the lane's second arrival.
//! Nothing the producer waits for depends on a load it just issued, so it
//! runs up to `STAGES` tiles ahead of the consumers.

use super::ctx::Ctx;
use super::{BLOCK_BYTES, HEADS, ITEM_KEYS, PRODUCER_LANES, SMEM, TILE_BYTES, TILE_KEYS};
use crate::abi::SM100_Q_MAP_OFFSET;
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{cp_async, mbarrier, tma};

/// Words of a stage's grad_signal each lane copies.
const GS_PER_LANE: u32 = ITEM_KEYS / PRODUCER_LANES;
const _: () = assert!(GS_PER_LANE == 4 && 2 * PRODUCER_LANES == TILE_KEYS);

/// Which map a tile comes from.
#[derive(Clone, Copy)]
enum Map {
    /// `index_k` (rows: key rows).
    K,
    /// `index_q` (rows: query rows x 64 heads).
    Q,
}

/// Issues the two boxes of the 64-row tile whose first row is `row` of
/// `map` into `dst`, completing on `bar`.
///
/// # Safety
/// One lane; `dst` a tile of the layout that no one reads or writes until
/// `bar`'s phase completes, and `bar` expects the tile's bytes.
#[inline(always)]
unsafe fn tile(c: &Ctx<'_>, map: Map, dst: SmemAddr, row: u32, bar: SmemAddr) {
    let m = match map {
        Map::K => c.maps,
        Map::Q => c.maps + SM100_Q_MAP_OFFSET as u64,
    };
    // SAFETY: the caller's contract; the maps are the kernel parameter's
    // (valid for the grid's lifetime); rows past the tensor are zero-filled.
    unsafe {
        tma::load_2d(dst, m, 0, row as i32, bar);
        tma::load_2d(dst.add(BLOCK_BYTES), m, 64, row as i32, bar);
    }
}

/// Copies grad_signal of row `row`, column `col` (zero unless `ok`) to
/// `dst`.
///
/// # Safety
/// `dst` a word of a free buffer.
#[inline(always)]
unsafe fn gs(c: &Ctx<'_>, dst: SmemAddr, row: u32, col: u32, ok: bool) {
    let base = c.p.grad_signal as *const u8;
    let at = 4 * (row as usize * c.p.cols as usize + col as usize);
    // SAFETY: `ok` only for a visible column of a query row (below
    // `cols`); otherwise nothing is read (zero fill from the base).
    unsafe {
        cp_async::copy_4(
            dst,
            if ok { base.add(at) } else { base },
            if ok { 4 } else { 0 },
        )
    }
}

/// The visible key count of query row `row`.
#[inline(always)]
pub(super) fn visible(c: &Ctx<'_>, row: u32) -> u32 {
    // SAFETY: callers pass query rows of the launch.
    unsafe { *(c.p.visible as *const u32).add(row as usize) }
}

/// Marks streamed tile `t` full from this lane: an arrival when its
/// copies completed, then lane 0 expects the tile's bytes and issues its
/// TMA (first row `row` of `map`), the others arrive.
///
/// # Safety
/// Producer lanes, each once per tile, after issuing their copies and
/// their stores.
#[inline(always)]
unsafe fn fill(c: &Ctx<'_>, lane: u32, t: u32, map: Map, row: u32) {
    // SAFETY: the buffer is free (`wait_empty`); this lane's arrivals.
    unsafe {
        cp_async::mbarrier_arrive_noinc(c.full(t));
        if lane == 0 {
            tma::arrive_expect_tx(c.full(t), TILE_BYTES);
            tile(c, map, c.stage(t), row, c.full(t));
        } else {
            mbarrier::arrive(c.full(t));
        }
    }
}

/// Row item `[ROWS, row0, nrows, key_start, tiles]`: the rows' q tiles,
/// then `tiles` K tiles from key row `key_start` with both rows'
/// grad_signal of their keys (word `64 i + j`: row `i`, key `j`).
///
/// # Safety
/// The producer warp of a CTA whose item this is (launch contract).
pub(super) unsafe fn rows(c: &Ctx<'_>, row0: u32, nrows: u32, key_start: u32, tiles: u32) {
    let lane = c.tid % 32;
    if tiles == 0 {
        return;
    }
    if lane == 0 {
        // SAFETY: the fixed tiles are read only after this phase.
        unsafe {
            tma::arrive_expect_tx(c.fixed_bar(), nrows * TILE_BYTES);
            for i in 0..nrows {
                tile(c, Map::Q, c.fixed(i), (row0 + i) * HEADS, c.fixed_bar());
            }
        }
    }
    let last = nrows - 1;
    let lim = [
        visible(c, row0),
        if last > 0 { visible(c, row0 + 1) } else { 0 },
    ];
    for t in 0..tiles {
        // SAFETY: producer; the consumers release every tile.
        unsafe { c.wait_empty(t) };
        let st = c.stage(t);
        for m in 0..GS_PER_LANE {
            // Word `w` is row `w / 64`, key `w % 64`: `m / 2` and `lane +
            // 32 (m % 2)` (GS_PER_LANE = 4), so `lim` is indexed by a
            // constant.
            let w = lane + PRODUCER_LANES * m;
            let (i, col) = (m / 2, TILE_KEYS * t + w % TILE_KEYS);
            let ok = col < lim[i as usize];
            // SAFETY: this lane's word of the free buffer.
            unsafe { gs(c, st.add(SMEM.gs + 4 * w), row0 + i.min(last), col, ok) };
        }
        // SAFETY: after this lane's stores.
        unsafe { fill(c, lane, t, Map::K, key_start + TILE_KEYS * t) };
    }
}

/// Key item `[KEYS, key_start, col0, nkeys, row_begin, row_end]`: the K
/// tiles of the item's keys, then per query row its q tile, its
/// grad_signal of the item's keys (word `j`: key `col0 + j`) and its
/// weights (as bf16 pairs).
///
/// # Safety
/// As [`rows`].
pub(super) unsafe fn keys(
    c: &Ctx<'_>,
    key_start: u32,
    col0: u32,
    nkeys: u32,
    row_begin: u32,
    row_end: u32,
) {
    let lane = c.tid % 32;
    if row_end <= row_begin {
        return;
    }
    if lane == 0 {
        let tiles = nkeys.div_ceil(TILE_KEYS);
        // SAFETY: as in `rows`.
        unsafe {
            tma::arrive_expect_tx(c.fixed_bar(), tiles * TILE_BYTES);
            for i in 0..tiles {
                let first = key_start + col0 + TILE_KEYS * i;
                tile(c, Map::K, c.fixed(i), first, c.fixed_bar());
            }
        }
    }
    let rows = row_end - row_begin;
    let mut next = Scalars::load(c, row_begin, lane);
    for t in 0..rows {
        let row = row_begin + t;
        // This row's scalars were loaded during the previous row (their
        // first use here waits for them); the next row's load now.
        let now = next;
        if t + 1 < rows {
            next = Scalars::load(c, row + 1, lane);
        }
        let (lim, weights) = (now.lim, now.word());
        // SAFETY: producer; the consumers release every tile.
        unsafe { c.wait_empty(t) };
        let st = c.stage(t);
        for m in 0..GS_PER_LANE {
            let w = lane + PRODUCER_LANES * m;
            let col = col0 + w;
            // SAFETY: this lane's word of the free buffer.
            unsafe { gs(c, st.add(SMEM.gs + 4 * w), row, col, w < nkeys && col < lim) };
        }
        // SAFETY: this lane's word of the free buffer (lane 0 also the
        // visible count).
        unsafe {
            smem::st_u32(st.add(SMEM.w + 4 * lane), weights);
            if lane == 0 {
                smem::st_u32(st.add(SMEM.lim), lim);
            }
        }
        // SAFETY: after this lane's copies and store.
        unsafe { fill(c, lane, t, Map::Q, row * HEADS) };
    }
}

/// What a key item's producer lane stores per query row besides the
/// copies: the row's visible key count and this lane's two weights, kept
/// as loaded (the two bf16 apart) so that loading them one row ahead does
/// not wait for them: only [`Scalars::word`], at the store, does.
#[derive(Clone, Copy)]
struct Scalars {
    /// The row's visible key count.
    lim: u32,
    /// Weight of head `2 lane`.
    lo: u16,
    /// Weight of head `2 lane + 1`.
    hi: u16,
}

impl Scalars {
    /// Issues the loads of query row `row`'s scalars for `lane`.
    #[inline(always)]
    fn load(c: &Ctx<'_>, row: u32, lane: u32) -> Scalars {
        let wt = c.p.weights as *const u16;
        let at = (row * HEADS + 2 * lane) as usize;
        // SAFETY: two weights of a query row of the launch (HEADS = 2 x 32
        // lanes).
        let (lo, hi) = unsafe { (*wt.add(at), *wt.add(at + 1)) };
        Scalars {
            lim: visible(c, row),
            lo,
            hi,
        }
    }

    /// The two weights as one word (head `2 lane` in the low half).
    #[inline(always)]
    fn word(self) -> u32 {
        self.lo as u32 | (self.hi as u32) << 16
    }
}
