//! Tensor-memory and shared-memory budgets of the planned sm_100a stage-2
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

/// Shared memory of one pipeline stage: the chunk's gathered K rows (bf16).
pub const SMEM_K_STAGE: u32 = SM100_CHUNK * SM100_DIM * 2;
/// q of the row (bf16, head tile x D).
pub const SMEM_Q: u32 = SM100_HEAD_TILE * SM100_DIM * 2;
/// dS of the chunk (bf16, head tile x chunk).
pub const SMEM_DS: u32 = SM100_HEAD_TILE * SM100_CHUNK * 2;
/// dK staging for the bulk reduction (f32, chunk x D).
pub const SMEM_DK_STAGE: u32 = SM100_CHUNK * SM100_DIM * 4;
/// K pipeline depth.
pub const K_STAGES: u32 = 2;
/// Total dynamic shared memory (plus 1 KiB for barriers and row ids).
pub const SM100_SMEM: u32 = K_STAGES * SMEM_K_STAGE + SMEM_Q + SMEM_DS + SMEM_DK_STAGE + 1024;
/// Shared memory one sm_100 CTA may use (227 KiB).
pub const SMEM_LIMIT_SM100: u32 = 227 * 1024;

const _: () = assert!(SM100_SMEM <= SMEM_LIMIT_SM100);

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            SM100_SMEM,
            2 * 32 * 1024 + 16 * 1024 + 16 * 1024 + 64 * 1024 + 1024
        );
    }
}
