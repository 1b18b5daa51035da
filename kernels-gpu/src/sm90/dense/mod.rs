//! Dense mode's kernels (sm_90a): its stage 1 (`stage1`,
//! `indexer_dense_score_grad`), then the tile kernel (H = 64, D = 128):
//! stage 2 of the dense indexer backward over whole key tiles, with no key
//! ids, no gathers and no per-(row, key) dK reductions, after stage 1 wrote
//! grad_signal over `index_score`. (Other shapes run the sparse path's
//! wgmma kernels, `crate::sm90::bwd`, after the same stage 1.)
//!
//! Every CTA takes one work item (`abi::DENSE_ITEM_*`, built by the host
//! longest first) and is warp-specialised: a producer warp (`load`) streams
//! the item's tiles by TMA into a ring of [`STAGES`] buffers, each with a
//! "full" and an "empty" mbarrier (`ctx`), and two consumer warpgroups
//! (`rows`, `keys`) run the products (`mma`): each issues S of the next
//! tile before the elementwise gate of the current one (`gate`), so the
//! tensor cores work while the gate runs. No CTA-wide barrier after the
//! start.
//! - a **row item** (`rows`): one query row per consumer. The CTA walks
//!   the rows' visible keys in tiles of 64 (loaded once for both rows):
//!   S = q K^T (64 heads x 64 keys), the gate (dS and the d_weights sums)
//!   in registers, dQ += dS K with dS as the register A operand. dQ and
//!   d_weights are written once, at the end.
//! - a **key item** (`keys`): 64 keys per consumer. The CTA walks a run of
//!   at most [`ITEM_MAX_ROWS`] of the query rows that see them (q tile
//!   loaded once for both consumers): S^T = K q^T (64 keys x 64 heads), the
//!   same gate transposed, and dK += dS^T q. At the end it adds its dK sums
//!   to the f32 accumulator (zeroed by stage 1): one reduction per key per
//!   run of rows, where the sparse kernels make one per (row, key). The
//!   runs keep every item short: a key item over all of a long sequence's
//!   rows would be the whole launch's critical path.
//!
//! So each (row, key) pair's logits are computed twice (once per kind);
//! in exchange dQ and d_weights are written once, in a fixed order
//! (bitwise reproducible), and dK is reduced `rows / ITEM_MAX_ROWS` times
//! per key instead of once per row.
//!
//! Operand tiles are 64 rows x 128 bf16 stored as two 1024-byte aligned
//! 128-byte-swizzle blocks of 64 columns (`crate::sm90::swizzle`, which is
//! what TMA's 128-byte swizzle writes): q of a row (rows = heads), K of 64
//! keys (rows = keys). The same bytes serve as a K-major operand of S and
//! as the MN-major B operand of dQ / dK. Shared memory ([`Layout`]): two
//! fixed tiles (row item: the two rows' q; key item: the two consumers'
//! K), the ring of streamed tiles (K tiles, or q tiles of successive rows)
//! with their per-tile scalars (grad_signal, and the key item's weights),
//! and the mbarriers.

sm90a_modules!(ctx, entry, gate, keys, load, mma, rows, stage1, turns);

use crate::abi::DENSE_TILE_THREADS;

/// Heads H: one M = 64 tile.
pub const HEADS: u32 = 64;
/// Head dimension D.
pub const DIM: u32 = 128;
/// Keys per warpgroup tile (N of S, K of dQ).
pub const TILE_KEYS: u32 = 64;
/// Consumer warpgroups per CTA (the producer warpgroup follows them).
pub const WARPGROUPS: u32 = DENSE_TILE_THREADS / 128 - 1;
/// Threads of the consumer warpgroups: the producer warp's first thread.
pub const CONSUMER_THREADS: u32 = WARPGROUPS * 128;
/// Keys of one key item (every warpgroup's tile).
pub const ITEM_KEYS: u32 = WARPGROUPS * TILE_KEYS;
/// Query rows of one row item (one per warpgroup).
pub const ITEM_ROWS: u32 = WARPGROUPS;
/// Bytes of one swizzle row (64 bf16).
pub const ROW_BYTES: u32 = 128;
/// Bytes of a 64-column swizzle block of a tile.
pub const BLOCK_BYTES: u32 = 64 * ROW_BYTES;
/// Bytes of one operand tile: 64 rows x D.
pub const TILE_BYTES: u32 = DIM / 64 * BLOCK_BYTES;
/// Bytes between groups of eight rows of a swizzle block.
pub const ATOM_BYTES: u32 = 8 * ROW_BYTES;
/// Bytes of a bf16 row of D in global memory.
pub const GLOBAL_ROW_BYTES: u32 = DIM * 2;
/// Buffers of the ring of streamed tiles.
pub const STAGES: u32 = 4;
/// Bytes of a stage's grad_signal: a row item's rows x 64 keys, or a key
/// item's 128 keys, f32.
pub const GS_BYTES: u32 = 4 * ITEM_KEYS;
/// Bytes of a key item's weights of one row (64 bf16).
pub const W_BYTES: u32 = 2 * HEADS;
/// Query rows of one key item at most.
pub const ITEM_MAX_ROWS: u32 = 256;
/// Resident CTAs per SM the launch bounds ask for.
pub const CTAS_PER_SM: u32 = 1;
/// Lanes of the producer warp.
pub const PRODUCER_LANES: u32 = 32;
/// Arrivals that fill a stage: two per producer lane, one when its
/// `cp.async` copies of the stage's grad_signal completed and one after
/// its other stores (lane 0's also expects the tile's bytes).
pub const FULL_ARRIVALS: u32 = 2 * PRODUCER_LANES;

const _: () = assert!(GS_BYTES >= 4 * ITEM_ROWS * TILE_KEYS);
const _: () = assert!(DIM.is_multiple_of(64) && HEADS == 64 && TILE_KEYS == 64);
const _: () = assert!(DENSE_TILE_THREADS == CONSUMER_THREADS + 128 && WARPGROUPS == 2);

/// Registers per thread of the producer warpgroup after it gives the rest
/// away (`setmaxnreg`).
pub const PRODUCER_REGS: u32 = 40;
/// Registers per thread of a consumer warpgroup: what the producer gave up,
/// shared by the consumers (two S tiles, dQ or dK and the A operand live at
/// once).
pub const CONSUMER_REGS: u32 = 232;
/// Registers per thread the launch gets: an SM sub-partition's 16384
/// registers over its three warps (one of each warpgroup), in units of 8
/// (ptxas's count for the kernel). `setmaxnreg` only moves registers
/// between the CTA's warpgroups: a split above this total never gets its
/// registers, and the consumers wait in `setmaxnreg.inc` forever.
pub const LAUNCH_REGS: u32 = 16384 / (32 * (WARPGROUPS + 1)) / 8 * 8;
const _: () = assert!(LAUNCH_REGS == 168);
const _: () = assert!(
    128 * PRODUCER_REGS + CONSUMER_THREADS * CONSUMER_REGS <= DENSE_TILE_THREADS * LAUNCH_REGS
);
const _: () = assert!(PRODUCER_REGS.is_multiple_of(8) && CONSUMER_REGS.is_multiple_of(8));
// The producer's lanes store a stage's grad_signal in four words each.
const _: () = assert!(GS_BYTES == 4 * 4 * PRODUCER_LANES && W_BYTES == 4 * PRODUCER_LANES);

/// u32 words of the deterministic twin's turn table for `chains` chains
/// (`turns`): the ticket, then one counter per chain.
pub const fn turn_words(chains: u32) -> u32 {
    1 + chains
}

/// Chains of the key items of `key_tiles` 128-key tiles (`turns`: one
/// per consumer warpgroup's 64 keys).
pub const fn chains(key_tiles: u32) -> u32 {
    WARPGROUPS * key_tiles
}

/// The ring buffer of streamed tile `t`.
pub const fn stage_of(t: u32) -> u32 {
    t % STAGES
}

/// The parity of the phase in which streamed tile `t` fills (and then
/// empties) its buffer: the buffer's `t / STAGES`-th use.
pub const fn phase_of(t: u32) -> u32 {
    (t / STAGES) % 2
}

/// The shared-memory map (offsets from the 1024-aligned base).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The fixed tiles, one per warpgroup.
    pub fixed: u32,
    /// Stage 0 of the ring: its tile, then grad_signal, then weights.
    pub ring: u32,
    /// Bytes from one stage to the next (1024-aligned).
    pub stage: u32,
    /// grad_signal inside a stage.
    pub gs: u32,
    /// Weights inside a stage.
    pub w: u32,
    /// A key item's row's visible key count inside a stage (one word).
    pub lim: u32,
    /// The mbarriers (8 bytes each): `STAGES` "full", `STAGES` "empty",
    /// then the fixed tiles' one.
    pub bars: u32,
    /// Bytes used from the aligned base.
    pub used: u32,
    /// Dynamic shared memory to launch with (used + alignment slack).
    pub bytes: u32,
}

const fn align(x: u32, a: u32) -> u32 {
    x.div_ceil(a) * a
}

/// The layout.
pub const SMEM: Layout = {
    let fixed = 0;
    let ring = fixed + WARPGROUPS * TILE_BYTES;
    let gs = TILE_BYTES;
    let w = gs + GS_BYTES;
    let lim = w + W_BYTES;
    let stage = align(lim + 4, 1024);
    let bars = ring + STAGES * stage;
    let used = bars + (2 * STAGES + 1) * 8;
    Layout {
        fixed,
        ring,
        stage,
        gs,
        w,
        lim,
        bars,
        used,
        bytes: used + 1024,
    }
};

/// Shared memory of one H100/H200 SM and what the driver reserves per CTA.
const SMEM_PER_SM: u32 = 228 * 1024;
const _: () = assert!(CTAS_PER_SM * (SMEM.bytes + 1024) <= SMEM_PER_SM);
const _: () = assert!(SMEM.ring.is_multiple_of(1024) && SMEM.stage.is_multiple_of(1024));
const _: () = assert!(SMEM.gs.is_multiple_of(16) && SMEM.w.is_multiple_of(16));
const _: () = assert!(SMEM.bars.is_multiple_of(8));

/// Shared-memory matrix descriptor of a 128-byte-swizzled tile starting at
/// `start` (`crate::sm90::desc`): K-major operands (S) take `lbo` 16 (unused)
/// and `sbo` [`ATOM_BYTES`]; the MN-major B operand (dQ, dK) takes `lbo`
/// [`BLOCK_BYTES`] and `sbo` [`ATOM_BYTES`].
pub const fn desc(start: u32, lbo: u32) -> u64 {
    crate::sm90::desc(start, lbo, ATOM_BYTES)
}

/// Where element `(row, col)` of a tile at `base` lives.
pub const fn tile_at(base: u32, row: u32, col: u32) -> u32 {
    base + (col / 64) * BLOCK_BYTES + crate::sm90::swizzle(row, (col % 64) * 2)
}

/// Accumulator coordinates of an `m64n64` tile (`crate::ptx::wgmma`):
/// register `r` of thread `t` of a warpgroup holds element `(row, col)`.
pub const fn acc_at(t: u32, r: u32) -> (u32, u32) {
    let (w, l) = (t / 32, t % 32);
    let (j, i) = (r / 4, r % 4);
    (16 * w + l / 4 + 8 * (i / 2), 8 * j + 2 * (l % 4) + i % 2)
}

/// A fragment coordinates of the `m64k16` register-A operand: 32-bit
/// register `a` (of 4) of thread `t` holds the two bf16 at `(row, col)`
/// and `(row, col + 1)` of its K step (PTX ISA, wgmma register fragments).
pub const fn frag_at(t: u32, a: u32) -> (u32, u32) {
    let (w, l) = (t / 32, t % 32);
    (16 * w + l / 4 + 8 * (a % 2), 8 * (a / 2) + 2 * (l % 4))
}

/// Packs an `m64n64` accumulator (as bf16 pairs) into the register A
/// operand of K = 64: K step `k` register `a` is accumulator registers
/// `8k + 2a` and `8k + 2a + 1`, the same two elements ([`acc_at`],
/// [`frag_at`]), so no data moves between threads.
pub fn pack_a(acc: &[f32; 32], pack: impl Fn(f32, f32) -> u32) -> [u32; 16] {
    let mut a = [0u32; 16];
    let mut k = 0;
    while k < 16 {
        a[k] = pack(acc[2 * k], acc[2 * k + 1]);
        k += 1;
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_accumulators_are_the_a_fragments_of_the_same_elements() {
        for t in 0..128 {
            for k in 0..4 {
                for a in 0..4 {
                    let (row, col) = frag_at(t, a);
                    let r = 8 * k + 2 * a;
                    assert_eq!(acc_at(t, r), (row, 16 * k + col));
                    assert_eq!(acc_at(t, r + 1), (row, 16 * k + col + 1));
                }
            }
        }
        let acc: [f32; 32] = core::array::from_fn(|i| i as f32);
        let a = pack_a(&acc, |lo, hi| (lo as u32) | (hi as u32) << 16);
        assert_eq!(a[5], 10 | 11 << 16);
    }

    #[test]
    fn layout_aligns_tiles_and_fits_the_sm() {
        assert_eq!(SMEM.ring, 2 * 16384);
        assert_eq!(SMEM.stage, 17408);
        const { assert!(SMEM.lim + 4 <= SMEM.stage) };
        assert_eq!(SMEM.bars, 2 * 16384 + 4 * 17408);
        assert_eq!(SMEM.bytes, SMEM.bars + 9 * 8 + 1024);
    }

    #[test]
    fn a_buffer_alternates_phases_across_its_uses() {
        for t in 0..64 {
            assert_eq!(stage_of(t + STAGES), stage_of(t));
            assert_ne!(phase_of(t + STAGES), phase_of(t));
            assert_eq!(phase_of(t + 2 * STAGES), phase_of(t));
        }
        assert_eq!((stage_of(5), phase_of(5)), (1, 1));
    }

    #[test]
    fn tile_elements_are_distinct_and_inside_the_tile() {
        let mut seen = std::vec![false; TILE_BYTES as usize / 2];
        for row in 0..64 {
            for col in 0..DIM {
                let o = tile_at(0, row, col);
                assert!(o < TILE_BYTES && o.is_multiple_of(2));
                assert!(!seen[o as usize / 2]);
                seen[o as usize / 2] = true;
            }
        }
    }
}
