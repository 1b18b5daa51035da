//! Tensor-memory and shared-memory budgets of the planned sm_100f stage-2
//! kernel, as compile-time constants with asserts.
//!
//! Per 128-slot chunk of one query row (H = 64 heads, padded to the M = 64
//! tile; H = 32 is zero-padded to it, D = 128):
//! - S = q K^T: M = 64 heads x N = 128 slots, f32 -> 128 columns;
//! - dQ += dS K: M = 64 x N = 128 (D), f32, kept across chunks -> 128 columns;
//! - dK = dS^T q: M = 128 slots x N = 128 (D), f32 -> 128 columns.

/// Columns of tensor memory per SM (each column: 128 lanes x 32 bits).
pub const TMEM_COLUMNS: u32 = 512;
/// Slots per chunk (the N of S, the M of dK).
pub const SM100_CHUNK: u32 = 128;
/// Head tile (M of S and dQ); H = 32 is zero-padded to it.
pub const SM100_HEAD_TILE: u32 = 64;
/// Head dimension handled by this path.
pub const SM100_DIM: u32 = 128;

/// Tensor-memory column offsets of the three accumulators.
pub const TMEM_S: u32 = 0;
/// See [`TMEM_S`].
pub const TMEM_DQ: u32 = TMEM_S + SM100_CHUNK;
/// See [`TMEM_S`].
pub const TMEM_DK: u32 = TMEM_DQ + SM100_DIM;
/// Columns used.
pub const TMEM_USED: u32 = TMEM_DK + SM100_DIM;
/// Columns allocated (`tcgen05.alloc` takes a power of two >= 32).
pub const TMEM_ALLOC: u32 = TMEM_USED.next_power_of_two();

const _: () = assert!(TMEM_ALLOC <= TMEM_COLUMNS && TMEM_ALLOC >= 32);
const _: () = assert!(TMEM_ALLOC.is_power_of_two());

/// Bytes of one 128-byte-swizzled region: `rows` rows of 64 bf16 (128 B).
pub const fn sw128_region(rows: u32) -> u32 {
    rows * 128
}

/// Shared memory of one K pipeline stage: the chunk's gathered K rows (bf16),
/// as two 128-row regions (D columns 0..64 and 64..128), 128-byte swizzle.
pub const SMEM_K_STAGE: u32 = 2 * SMEM_K_REGION;
/// One K region (128 slots x 64 columns).
pub const SMEM_K_REGION: u32 = sw128_region(SM100_CHUNK);
/// q of one row (bf16, head tile x D) as two 64-row regions.
pub const SMEM_Q: u32 = 2 * SMEM_Q_REGION;
/// One q region (64 heads x 64 columns).
pub const SMEM_Q_REGION: u32 = sw128_region(SM100_HEAD_TILE);
/// dS of the chunk (bf16, head tile x chunk) as two 64-row regions (slots
/// 0..64 and 64..128).
pub const SMEM_DS: u32 = 2 * SMEM_DS_REGION;
/// One dS region (64 heads x 64 slots).
pub const SMEM_DS_REGION: u32 = sw128_region(SM100_HEAD_TILE);
/// Padding of a staged dK row, in f32: rows 16 bytes apart in bank terms,
/// so the 8 lanes of one `st.shared.v4` phase hit different banks; keeps
/// rows 16-byte aligned for the bulk reduction.
pub const DK_ROW_PAD: u32 = 4;
/// Bytes of one staged dK row.
pub const DK_ROW_BYTES: u32 = (SM100_DIM + DK_ROW_PAD) * 4;
/// dK staging for the bulk reduction (f32, chunk x D, padded rows).
pub const SMEM_DK_STAGE: u32 = SM100_CHUNK * DK_ROW_BYTES;
/// K pipeline depth.
pub const K_STAGES: u32 = 2;
/// q buffers (the next row's q loads while the current row finishes).
pub const Q_STAGES: u32 = 2;
/// Per K stage: resolved key row (i32, -1 for padding) and grad_signal (f32)
/// of each slot.
pub const SMEM_META_STAGE: u32 = SM100_CHUNK * 8;

/// Byte offsets of the stage-2 kernel's shared memory (from the 1024-byte
/// aligned dynamic shared-memory base). Swizzled regions first, each on a
/// 1024-byte boundary (the 128-byte swizzle's repeating pattern).
pub const OFF_K: u32 = 0;
/// See [`OFF_K`].
pub const OFF_Q: u32 = OFF_K + K_STAGES * SMEM_K_STAGE;
/// See [`OFF_K`].
pub const OFF_DS: u32 = OFF_Q + Q_STAGES * SMEM_Q;
/// See [`OFF_K`].
pub const OFF_DK: u32 = OFF_DS + SMEM_DS;
/// See [`OFF_K`].
pub const OFF_META: u32 = OFF_DK + SMEM_DK_STAGE;
/// mbarriers (8 bytes each) and the tensor-memory address slot.
pub const OFF_BARS: u32 = OFF_META + K_STAGES * SMEM_META_STAGE;
/// Bytes reserved for barriers and the tensor-memory slot.
pub const SMEM_BARS: u32 = 256;
/// Total dynamic shared memory of the stage-2 kernel.
pub const SM100_SMEM: u32 = OFF_BARS + SMEM_BARS;
/// Shared memory one sm_100 CTA may use (227 KiB).
pub const SMEM_LIMIT_SM100: u32 = 227 * 1024;

const _: () = assert!(SM100_SMEM <= SMEM_LIMIT_SM100);
const _: () =
    assert!(OFF_Q.is_multiple_of(1024) && OFF_DS.is_multiple_of(1024) && OFF_DK.is_multiple_of(16));
const _: () = assert!(SMEM_K_REGION.is_multiple_of(1024) && SMEM_Q_REGION.is_multiple_of(1024));
const _: () = assert!(DK_ROW_BYTES.is_multiple_of(16) && OFF_BARS.is_multiple_of(8));

/// Dynamic shared memory of a bring-up probe (`sm100::probe`): stage 2's
/// layout up to the end of the dS tile (the probes stage their operands
/// where stage 2 keeps them), then `abi::SM100_PROBE_BAR_BYTES`.
pub const SM100_PROBE_SMEM: u32 = OFF_DK + crate::abi::SM100_PROBE_BAR_BYTES;
// The probes' operands are a full head tile, within an sm_100 CTA's shared
// memory; the host's head dimension is this path's.
const _: () = assert!(crate::abi::SM100_PROBE_HEADS == SM100_HEAD_TILE);
const _: () = assert!(SM100_PROBE_SMEM <= SMEM_LIMIT_SM100);
const _: () = assert!(crate::abi::SM100_DIM == SM100_DIM);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_q_tile_box_is_one_q_region() {
        // One box of the q tile map (H = 64) fills one 64-row q region.
        let m = crate::tma::q_tile_map(8192 * 64, 128, 64, 64).unwrap();
        assert_eq!(m.box_dims[0] * m.box_dims[1] * 2, SMEM_Q_REGION);
    }

    #[test]
    fn accumulators_are_disjoint_and_fit_the_allocation() {
        let regions = [
            (TMEM_S, SM100_CHUNK),
            (TMEM_DQ, SM100_DIM),
            (TMEM_DK, SM100_DIM),
        ];
        for (i, a) in regions.iter().enumerate() {
            assert!(a.0 + a.1 <= TMEM_ALLOC);
            for b in &regions[i + 1..] {
                assert!(a.0 + a.1 <= b.0 || b.0 + b.1 <= a.0, "{a:?} overlaps {b:?}");
            }
        }
        assert_eq!(TMEM_USED, 384);
        assert_eq!(TMEM_ALLOC, 512);
    }

    #[test]
    fn shared_memory_plan_fits() {
        assert_eq!(SMEM_K_STAGE, 32 * 1024);
        assert_eq!(SMEM_Q, 16 * 1024);
        assert_eq!(SMEM_DS, 16 * 1024);
        assert_eq!(SMEM_DK_STAGE, 128 * 528);
        assert_eq!(
            SM100_SMEM,
            2 * 32 * 1024 + 2 * 16 * 1024 + 16 * 1024 + 128 * 528 + 2 * 1024 + 256
        );
        // Regions are disjoint and in order.
        let regions = [
            (OFF_K, K_STAGES * SMEM_K_STAGE),
            (OFF_Q, Q_STAGES * SMEM_Q),
            (OFF_DS, SMEM_DS),
            (OFF_DK, SMEM_DK_STAGE),
            (OFF_META, K_STAGES * SMEM_META_STAGE),
            (OFF_BARS, SMEM_BARS),
        ];
        for w in regions.windows(2) {
            assert_eq!(w[0].0 + w[0].1, w[1].0);
        }
    }
}
