//! The union kernel ([`crate::abi::FLAG_UNION`]): for each row pair
//! `(2 p, 2 p + 1)` the list of key rows the paired kernel walks instead
//! of the rows' own slots, written over the pair's `d_index_q` rows.
//!
//! One CTA per pair, [`UNION_THREADS`] threads, each holding
//! [`UNION_PER_THREAD`] consecutive slots of both rows (resolved key rows,
//! -1 for padding). A hash table of key rows in shared memory keeps, per
//! key, the smallest slot of each row that holds it (`red.shared.min` on a
//! word of two 16-bit halves: first row's slot high, second row's low).
//! Then every valid slot becomes one entry:
//! - a *shared* entry for each key both rows hold: the first row's
//!   smallest slot with it and the second row's;
//! - a *first-only* entry for every other valid slot of the first row
//!   (keys the second row lacks, and repeats of a key in the row);
//! - a *second-only* entry for every other valid slot of the second row.
//!
//! The list is the shared entries, then the first-only, then the
//! second-only ones, each group in slot order (positions from block-wide
//! prefix sums, so the list is the same on every run and d_index_q and
//! d_weights stay bitwise reproducible), padded with empty entries to
//! whole chunks ([`union_chunks`]). Padding slots are left out: their
//! terms are zero. Grouping the shared entries first makes the paired
//! kernel's chunks of them whole "fused" items (one dK product and one
//! reduction per key for both rows).
//!
//! The kernel reads ids only; it is stage 1's programmatic dependent and
//! waits for stage 1 just before it exits, so the paired kernel, its own
//! dependent, sees both complete.

use super::{
    union_chunks, union_hash, CHUNK, HEADS, UNION_ENTRIES, UNION_ENTRY_BYTES, UNION_NONE,
    UNION_PER_THREAD, UNION_TABLE, UNION_THREADS,
};
use crate::abi::{union_chunks_at, GradParams};
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{griddep, sreg, sync};
use crate::score::{load_id, resolve};

/// An empty hash-table slot (no key row is `u32::MAX`: rows are below
/// `2^31`).
const EMPTY: u32 = u32::MAX;
const PER: usize = UNION_PER_THREAD as usize;
const WARPS: u32 = UNION_THREADS / 32;

/// The union kernel for H = 64, D = 128 (`sm90::UNION_KERNEL`).
///
/// # Safety
/// Launched with [`UNION_THREADS`] threads, one CTA per row pair
/// (`B * S_q / 2`, an even row count), `super::UNION_SMEM` bytes of
/// dynamic shared memory, `topk <= super::UNION_MAX_TOPK`, H = 64,
/// D = 128, [`crate::abi::FLAG_UNION`] set, as the programmatic dependent
/// of `super::stage1` on the same parameters, whose pointers and sizes the
/// host has validated (`d_index_q` 4-byte aligned).
#[no_mangle]
pub unsafe extern "ptx-kernel" fn indexer_union_h64_d128(p: GradParams) {
    // SAFETY: forwarded launch contract; uniform control flow.
    unsafe { build(&p, sreg::block_idx_x()) };
    // SAFETY: the paired kernel, this grid's dependent, relies on this
    // grid completing only after stage 1 did.
    unsafe { griddep::wait() };
}

/// Builds pair `pair`'s list (module note).
///
/// # Safety
/// As [`indexer_union_h64_d128`]; every thread of the CTA calls it.
#[inline(always)]
unsafe fn build(p: &GradParams, pair: u32) {
    let tid = sreg::thread_idx_x();
    let keys = SmemAddr((smem::base().0 + 15) & !15);
    let vals = keys.add(4 * UNION_TABLE);
    let totals = vals.add(4 * UNION_TABLE);
    // The table starts empty: keys EMPTY, both slots UNION_NONE.
    let mut i = tid;
    while i < UNION_TABLE / 4 {
        // SAFETY: 16-byte aligned words inside the table, each thread its
        // own.
        unsafe {
            smem::st_v4_u32(keys.add(16 * i), [EMPTY; 4]);
            smem::st_v4_u32(vals.add(16 * i), [u32::MAX; 4]);
        }
        i += UNION_THREADS;
    }
    let (ra, rb) = (2 * pair, 2 * pair + 1);
    let ka = key_rows(p, ra);
    let kb = key_rows(p, rb);
    let first = tid * UNION_PER_THREAD;
    // SAFETY: every thread, uniform control flow.
    unsafe { sync::bar_sync() };
    // Each valid slot of the first row: its key's smallest slot (high half).
    let mut pos_a = [0u32; PER];
    for m in 0..PER {
        if ka[m] >= 0 {
            let s = first + m as u32;
            // SAFETY: table addresses (`insert`); the atomic orders it.
            unsafe {
                pos_a[m] = insert(keys, ka[m] as u32);
                smem::red_min_u32(vals.add(4 * pos_a[m]), (s << 16) | UNION_NONE);
            }
        }
    }
    // SAFETY: every thread, uniform control flow.
    unsafe { sync::bar_sync() };
    // Each valid slot of the second row: its key's smallest slot (low
    // half); the high half no longer changes.
    let mut pos_b = [0u32; PER];
    for m in 0..PER {
        if kb[m] >= 0 {
            let s = first + m as u32;
            // SAFETY: as above.
            unsafe {
                pos_b[m] = insert(keys, kb[m] as u32);
                let hi = smem::ld_u32(vals.add(4 * pos_b[m])) >> 16;
                smem::red_min_u32(vals.add(4 * pos_b[m]), (hi << 16) | s);
            }
        }
    }
    // SAFETY: every thread, uniform control flow.
    unsafe { sync::bar_sync() };
    // Classify: (a's partner slot or NONE per slot, shared?, b shared?).
    let mut partner = [UNION_NONE; PER];
    let (mut shared_a, mut shared_b) = (0u32, 0u32);
    for m in 0..PER {
        let s = first + m as u32;
        // SAFETY: table words written before the barrier; read only.
        unsafe {
            if ka[m] >= 0 {
                let v = smem::ld_u32(vals.add(4 * pos_a[m]));
                if v >> 16 == s && v & 0xFFFF != UNION_NONE {
                    partner[m] = v & 0xFFFF;
                    shared_a |= 1 << m;
                }
            }
            if kb[m] >= 0 {
                let v = smem::ld_u32(vals.add(4 * pos_b[m]));
                if v >> 16 != UNION_NONE && v & 0xFFFF == s {
                    shared_b |= 1 << m;
                }
            }
        }
    }
    let valid_a = ka.iter().enumerate().fold(0u32, |f, (m, &k)| f | ((k >= 0) as u32) << m);
    let valid_b = kb.iter().enumerate().fold(0u32, |f, (m, &k)| f | ((k >= 0) as u32) << m);
    let (only_a, only_b) = (valid_a & !shared_a, valid_b & !shared_b);
    // Positions: shared entries, then first-only, then second-only, each
    // in slot order.
    // SAFETY: every thread, uniform control flow.
    let (before_sa, tot_sa) = unsafe {
        block_scan(
            shared_a.count_ones() | (only_a.count_ones() << 16),
            totals,
        )
    };
    // SAFETY: as above (the scan's own barriers order the reuse).
    let (before_b, tot_b) = unsafe { block_scan(only_b.count_ones(), totals.add(4 * WARPS)) };
    let (n_shared, n_a) = (tot_sa & 0xFFFF, tot_sa >> 16);
    let len = n_shared + n_a + tot_b;
    let (mut at_s, mut at_a, mut at_b) = (
        before_sa & 0xFFFF,
        n_shared + (before_sa >> 16),
        n_shared + n_a + before_b,
    );
    let base = (p.d_index_q as *mut u32).wrapping_add((pair * UNION_ENTRIES) as usize * 2);
    let put = |at: u32, row: u32, sa: u32, sb: u32| {
        // SAFETY: `at` < union_chunks(len) * CHUNK <= UNION_ENTRIES (len
        // <= 2 topk <= UNION_ENTRIES): inside the pair's two d_index_q
        // rows (host-checked length, 4-byte aligned); each entry written
        // by one thread.
        unsafe {
            *base.add(2 * at as usize) = row;
            *base.add(2 * at as usize + 1) = sa | (sb << 16);
        }
    };
    for m in 0..PER {
        let s = first + m as u32;
        if shared_a & (1 << m) != 0 {
            put(at_s, ka[m] as u32, s, partner[m]);
            at_s += 1;
        } else if only_a & (1 << m) != 0 {
            put(at_a, ka[m] as u32, s, UNION_NONE);
            at_a += 1;
        }
        if only_b & (1 << m) != 0 {
            put(at_b, kb[m] as u32, UNION_NONE, s);
            at_b += 1;
        }
    }
    // Empty entries up to the whole chunks the paired kernel walks.
    let chunks = union_chunks(len);
    let mut e = len + tid;
    while e < chunks * CHUNK {
        put(e, 0, UNION_NONE, UNION_NONE);
        e += UNION_THREADS;
    }
    if tid == 0 {
        let at = union_chunks_at(ra, HEADS, p.flags);
        // SAFETY: bytes 2-3 of the pair's first d_weights block (at least
        // 32 bytes, 2-byte aligned); stage 1 writes bytes 0-1 only.
        unsafe { *(p.d_weights as *mut u8).add(at).cast::<u16>() = chunks as u16 };
    }
}

/// This thread's [`UNION_PER_THREAD`] slots of query row `row`, resolved
/// (-1 for padding and past topk).
fn key_rows(p: &GradParams, row: u32) -> [i32; PER] {
    let first = sreg::thread_idx_x() * UNION_PER_THREAD;
    let b = if p.batch == 1 { 0 } else { row / p.seq_q.max(1) };
    let mut k = [-1i32; PER];
    for (m, x) in k.iter_mut().enumerate() {
        let s = first + m as u32;
        if s < p.topk {
            let at = row as usize * p.topk as usize + s as usize;
            // SAFETY: row < B*S_q and s < topk: inside topk_indices
            // (host-checked length).
            *x = resolve(unsafe { load_id(p, at) }, b, p);
        }
    }
    k
}

/// The table slot holding key row `key`, inserted if absent (linear
/// probing from [`union_hash`]; the table never fills: at most half of
/// it holds keys).
///
/// # Safety
/// `keys` the table's key words ([`UNION_TABLE`] of them).
#[inline(always)]
unsafe fn insert(keys: SmemAddr, key: u32) -> u32 {
    let mut at = union_hash(key);
    loop {
        // SAFETY: `at` < UNION_TABLE (masked below).
        let old = unsafe { smem::atom_cas_u32(keys.add(4 * at), EMPTY, key) };
        if old == EMPTY || old == key {
            return at;
        }
        at = (at + 1) & (UNION_TABLE - 1);
    }
}

/// Exclusive prefix sum of `v` over the CTA in thread order, and the
/// total; `totals` holds one word per warp.
///
/// # Safety
/// Every thread of the CTA calls it with uniform control flow; no one
/// else uses `totals` until the call returns everywhere.
#[inline(always)]
unsafe fn block_scan(v: u32, totals: SmemAddr) -> (u32, u32) {
    let tid = sreg::thread_idx_x();
    let (warp, lane) = (tid / 32, tid % 32);
    // SAFETY: whole warps (caller's contract).
    let incl = unsafe { sync::warp_scan_u32(v) };
    if lane == 31 {
        // SAFETY: one word per warp, its last lane.
        unsafe { smem::st_u32(totals.add(4 * warp), incl) };
    }
    // SAFETY: every thread (caller's contract).
    unsafe { sync::bar_sync() };
    let (mut before, mut total) = (0, 0);
    for w in 0..WARPS {
        // SAFETY: written before the barrier; read only until the next.
        let t = unsafe { smem::ld_u32(totals.add(4 * w)) };
        before += if w < warp { t } else { 0 };
        total += t;
    }
    // SAFETY: every thread: the words may be reused after it.
    unsafe { sync::bar_sync() };
    (before + incl - v, total)
}

// The list's entries are the `d_index_q` words of the pair.
const _: () = assert!(UNION_ENTRY_BYTES == 8);
