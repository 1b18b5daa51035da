//! The `mma.sync` row kernels `indexer_bwd_rows_h{H}_d{D}` (every
//! target): both stages of the backward fused, one CTA per query row. This
//! module holds their tile shapes and shared-memory layout as plain
//! `const` arithmetic, so the host (launch configuration, budget checks,
//! unit tests) and the device use the same numbers; the kernel itself is
//! its device-only children: `body` (the row's view, the chunk loop, the
//! entries) and one module per role (`load`, `mma`, `reduce`).
//!
//! One CTA handles one query row `(b, s)`: it keeps `q[b,s]` (H x D) in
//! shared memory, walks the row's `topk` slots in chunks of [`CHUNK`] slots,
//! gathers the selected K rows of a chunk into shared memory, and runs the
//! three products on tensor cores (`mma.sync` m16n8k16, bf16 in, f32 out).

#[cfg(all(target_arch = "nvptx64", not(kernels_lab)))]
mod body;
#[cfg(all(target_arch = "nvptx64", not(kernels_lab)))]
mod load;
#[cfg(all(target_arch = "nvptx64", not(kernels_lab)))]
mod mma;
#[cfg(all(target_arch = "nvptx64", not(kernels_lab)))]
mod reduce;

/// Threads per CTA of the row kernel.
pub const GRAD_THREADS: u32 = 256;
/// Warps per CTA of the row kernel.
pub const GRAD_WARPS: u32 = GRAD_THREADS / 32;
/// Slots (selected keys) processed per chunk. Each warp owns one 8-wide
/// n-tile of the S = Q K^T chunk, so this is `8 * GRAD_WARPS`.
pub const CHUNK: u32 = 8 * GRAD_WARPS;
/// Padding, in bf16 elements, added to each shared-memory row so that the
/// eight rows touched by one mma fragment load fall into different banks.
pub const ROW_PAD: u32 = 8;
/// Padding, in f32 elements, of each staged dK row (keeps rows 16-byte
/// aligned for the bulk reduction and shifts banks between rows).
pub const DK_PAD: u32 = 4;
/// MMA tile: rows (M) per m16n8k16 fragment.
pub const MMA_M: u32 = 16;
/// MMA tile: columns (N) per fragment.
pub const MMA_N: u32 = 8;
/// MMA tile: reduction depth (K) per fragment.
pub const MMA_K: u32 = 16;

/// Byte offsets of the row kernel's shared-memory regions for `heads` x `dim`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowSmem {
    /// `q` of the row, `heads` rows of `dim + ROW_PAD` bf16.
    pub q: u32,
    /// Gathered K rows, two buffers (current chunk, prefetched next chunk)
    /// of `CHUNK` rows of `dim + ROW_PAD` bf16, [`RowSmem::k_bytes`] apart.
    pub k: u32,
    /// `dS` of the chunk as bf16, `heads` rows of `CHUNK + ROW_PAD`.
    pub ds: u32,
    /// grad_signal of the chunk's slots, two buffers of `CHUNK` f32.
    pub gs: u32,
    /// Resolved key row of each slot (`-1` for padding), two buffers of
    /// `CHUNK` i32.
    pub rows: u32,
    /// `weights[b,s,:]` as f32, `heads` values.
    pub w: u32,
    /// Per-warp partial sums (`GRAD_WARPS * heads` f32): G, then d_weights.
    pub red: u32,
    /// dK rows of the chunk staged for the bulk reduction, `CHUNK` rows of
    /// `dim + DK_PAD` f32.
    pub dk: u32,
    /// Total dynamic shared memory in bytes.
    pub bytes: u32,
}

impl RowSmem {
    /// Bytes of one K buffer.
    pub const fn k_bytes(dim: u32) -> u32 {
        CHUNK * (dim + ROW_PAD) * 2
    }

    /// Layout for a supported `heads` x `dim` (multiples of 16).
    pub const fn new(heads: u32, dim: u32) -> Self {
        let q = 0;
        let k = q + heads * (dim + ROW_PAD) * 2;
        let ds = k + 2 * Self::k_bytes(dim);
        let gs = ds + heads * (CHUNK + ROW_PAD) * 2;
        let rows = gs + 2 * CHUNK * 4;
        let w = rows + 2 * CHUNK * 4;
        let red = w + heads * 4;
        let dk = red + GRAD_WARPS * heads * 4;
        let bytes = dk + CHUNK * (dim + DK_PAD) * 4;
        RowSmem {
            q,
            k,
            ds,
            gs,
            rows,
            w,
            red,
            dk,
            bytes,
        }
    }
}

/// Shared memory one H100/H200 CTA may use (227 KiB).
pub const SMEM_LIMIT_SM90: u32 = 227 * 1024;

// Every row kernel runs GRAD_THREADS threads, and as many CTAs as its
// launch bounds ask to be resident (`registry::ROWS`) fit in shared memory.
const _: () = {
    use crate::registry::{row_kernel, Target, SUPPORTED_DIMS, SUPPORTED_HEADS};
    let mut i = 0;
    while i < SUPPORTED_HEADS.len() {
        let mut j = 0;
        while j < SUPPORTED_DIMS.len() {
            let (h, d) = (SUPPORTED_HEADS[i], SUPPORTED_DIMS[j]);
            let k = row_kernel(h, d).unwrap();
            assert!(k.threads == GRAD_THREADS);
            let ctas = k.min_ctas(Target::Sm90a).unwrap();
            assert!(RowSmem::new(h, d).bytes * ctas <= SMEM_LIMIT_SM90);
            j += 1;
        }
        i += 1;
    }
};
// 16-byte alignment of every region (vector loads and stores).
const _: () = {
    let l = RowSmem::new(16, 64);
    assert!(l.k.is_multiple_of(16) && l.ds.is_multiple_of(16) && l.gs.is_multiple_of(16));
    assert!(l.rows.is_multiple_of(16) && l.w.is_multiple_of(16) && l.red.is_multiple_of(16));
    assert!(l.dk.is_multiple_of(16) && ((64 + DK_PAD) * 4).is_multiple_of(16));
};
// Each warp owns one n-tile of S and 1/GRAD_WARPS of the D columns of dQ/dK.
const _: () = assert!(CHUNK == MMA_N * GRAD_WARPS);
const _: () = assert!(64 % (MMA_N * GRAD_WARPS) == 0);
const _: () = assert!(CHUNK.is_multiple_of(MMA_K));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_ordered_aligned_and_within_budget() {
        for h in crate::registry::SUPPORTED_HEADS {
            for d in crate::registry::SUPPORTED_DIMS {
                let l = RowSmem::new(h, d);
                let offs = [l.q, l.k, l.ds, l.gs, l.rows, l.w, l.red, l.dk, l.bytes];
                assert!(offs.windows(2).all(|p| p[0] < p[1]), "{h}x{d}: {l:?}");
                assert!(offs.iter().all(|o| o.is_multiple_of(16)), "{h}x{d}: {l:?}");
                assert!(l.bytes <= SMEM_LIMIT_SM90);
                // q region holds exactly heads rows of padded dim; two K buffers.
                assert_eq!(l.k - l.q, h * (d + ROW_PAD) * 2);
                assert_eq!(l.ds - l.k, 2 * RowSmem::k_bytes(d));
            }
        }
    }

    #[test]
    fn padded_rows_spread_fragment_loads_over_all_banks() {
        // Lane l of a fragment load reads row l/4, word l%4 (plus a column
        // offset): with the padded stride the 32 lanes hit 32 distinct banks.
        for d in crate::registry::SUPPORTED_DIMS {
            let stride_words = (d + ROW_PAD) / 2;
            let mut banks = [false; 32];
            for lane in 0..32u32 {
                let word = (lane / 4) * stride_words + lane % 4;
                banks[(word % 32) as usize] = true;
            }
            assert!(banks.iter().all(|&b| b), "dim {d}");
        }
    }
}
