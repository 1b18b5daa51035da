//! Tensor-map geometry of the kernels' TMA loads, whatever the
//! architecture, as plain Rust the host turns into
//! `cuTensorMapEncodeTiled` arguments (`host/src/tma.rs`): the q and K
//! tile maps of dense mode's sm_90a tile kernel (`sm90::dense`) and the K
//! gather and q tile maps of the sm_100f path (**compiled, not
//! executed**: no sm_100 GPU); plus the shared-memory image that TMA's
//! 128-byte swizzle produces (which is also the canonical K-major
//! `Swizzle::B128` operand layout of `tcgen05.mma`).

/// Bytes of one swizzle row (the 128-byte swizzle span).
pub const SWIZZLE_BYTES: u32 = 128;
/// Rows of one swizzle atom (8 rows x 128 bytes = 1024 bytes).
pub const ATOM_ROWS: u32 = 8;

/// Geometry of a 2D bf16 tensor map over a row-major `(rows, cols)` matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Map2d {
    /// `globalDim` (innermost first): `[cols, rows]`.
    pub dims: [u64; 2],
    /// `globalStrides` in bytes for dimension 1 (dimension 0 is implicit).
    pub row_stride: u64,
    /// `boxDim` (innermost first).
    pub box_dims: [u32; 2],
}

/// Why a map cannot be encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapError {
    /// The row pitch is not a multiple of 16 bytes.
    RowPitch,
    /// The box's inner extent exceeds the 128-byte swizzle span.
    BoxTooWide,
    /// A box extent is 0 or above 256.
    BoxExtent,
}

/// Gather4 map over `index_k` viewed as `(B*S_k, D)` bf16: one box is one
/// row of `inner` columns (64 for the 128-byte swizzle), so a `gather4`
/// brings four rows x `inner` columns and D = 128 takes two per 4 rows.
pub fn gather_map(key_rows: u64, dim: u32, inner: u32) -> Result<Map2d, MapError> {
    let pitch = dim as u64 * 2;
    if !pitch.is_multiple_of(16) {
        return Err(MapError::RowPitch);
    }
    if inner == 0 || inner > 256 {
        return Err(MapError::BoxExtent);
    }
    if inner * 2 > SWIZZLE_BYTES {
        return Err(MapError::BoxTooWide);
    }
    Ok(Map2d {
        dims: [dim as u64, key_rows],
        row_stride: pitch,
        box_dims: [inner, 1],
    })
}

/// Tile map over `index_q` viewed as `(B*S_q*H, D)` bf16 for the stage-2
/// kernel's q loads: one box is `inner` columns x `heads` rows (one query
/// row's heads, one 64-column half of D), 128-byte swizzle. For H = 32 the
/// box fills rows 0..32 of the 64-row q region; rows 32..64 stay zero (the
/// zero padding of the M = 64 tile).
pub fn q_tile_map(q_rows: u64, dim: u32, inner: u32, heads: u32) -> Result<Map2d, MapError> {
    let mut m = gather_map(q_rows, dim, inner)?;
    if heads == 0 || heads > 256 {
        return Err(MapError::BoxExtent);
    }
    m.box_dims = [inner, heads];
    Ok(m)
}

/// Byte offset of bf16 element `(row, col)` (col < 64) inside a tile that
/// TMA wrote with the 128-byte swizzle: rows are 128 bytes apart and the
/// 16-byte chunk index is XORed with `row % 8`.
pub const fn swizzle128_offset(row: u32, col: u32) -> u32 {
    let byte = col * 2;
    let chunk = (byte / 16) ^ (row % ATOM_ROWS);
    row * SWIZZLE_BYTES + chunk * 16 + byte % 16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_map_geometry() {
        let m = gather_map(4096, 128, 64).unwrap();
        assert_eq!(m.dims, [128, 4096]);
        assert_eq!(m.row_stride, 256);
        assert_eq!(m.box_dims, [64, 1]);
        assert_eq!(gather_map(10, 128, 128), Err(MapError::BoxTooWide));
        assert_eq!(gather_map(10, 4, 4), Err(MapError::RowPitch));
        assert_eq!(gather_map(10, 128, 0), Err(MapError::BoxExtent));
    }

    #[test]
    fn q_map_boxes_one_rows_heads() {
        let m = q_tile_map(8192 * 64, 128, 64, 64).unwrap();
        assert_eq!(m.dims, [128, 8192 * 64]);
        assert_eq!(m.row_stride, 256);
        assert_eq!(m.box_dims, [64, 64]);
        let h32 = q_tile_map(100 * 32, 128, 64, 32).unwrap();
        assert_eq!(h32.box_dims, [64, 32]);
        assert_eq!(q_tile_map(10, 128, 64, 0), Err(MapError::BoxExtent));
        assert_eq!(q_tile_map(10, 128, 128, 64), Err(MapError::BoxTooWide));
    }

    #[test]
    fn swizzle128_is_a_permutation_within_each_row_and_atom() {
        for row in 0..16u32 {
            let mut seen = [false; 64];
            for col in 0..64u32 {
                let off = swizzle128_offset(row, col);
                assert_eq!(off / SWIZZLE_BYTES, row, "stays in its 128-byte row");
                let slot = ((off % SWIZZLE_BYTES) / 2) as usize;
                assert!(!seen[slot]);
                seen[slot] = true;
            }
        }
        // Row 0 is unswizzled; row 1 swaps neighbouring 16-byte chunks.
        assert_eq!(swizzle128_offset(0, 8), 16);
        assert_eq!(swizzle128_offset(1, 0), 128 + 16);
        assert_eq!(swizzle128_offset(1, 8), 128);
        // Eight consecutive columns stay contiguous (one 16-byte chunk).
        assert_eq!(swizzle128_offset(5, 15) - swizzle128_offset(5, 8), 14);
    }
}
