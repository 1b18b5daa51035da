//! Row coordinates of TMA `tile::gather4` loads of selected K rows.
//!
//! A gather4 load fetches four rows of the 2D `(B*S_k, D)` view of
//! `index_k` by row coordinate. Padding slots get the coordinate `B*S_k`
//! (one past the last row), which marks them invalid; the stage-2 kernel
//! then gathers row 0 for them ([`tma_row`]) rather than relying on how
//! TMA treats out-of-bounds gather4 rows, and the validity mask removes
//! them from dS, d_weights and the dK scatter. A local id is checked against its
//! own batch before `b * S_k` is added, so it never aliases the next batch.

/// Key-id convention, as in `params::FLAG_LOCAL_IDS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ids {
    /// Ids address the flat `(B*S_k, D)` view.
    Global,
    /// Ids address rows of their own batch.
    Local,
}

/// Row coordinate of one slot id for a query row of batch `b`.
pub const fn row_coord(id: i32, b: u32, batch: u32, seq_k: u32, ids: Ids) -> i32 {
    let total = batch as i64 * seq_k as i64;
    let oob = total as i32; // host guarantees B*S_k <= i32::MAX
    if id < 0 {
        return oob;
    }
    match ids {
        Ids::Global => {
            if (id as i64) < total {
                id
            } else {
                oob
            }
        }
        Ids::Local => {
            if (id as u32) < seq_k {
                (b as i64 * seq_k as i64 + id as i64) as i32
            } else {
                oob
            }
        }
    }
}

/// Row coordinate actually handed to `tile::gather4` for a slot whose
/// [`row_coord`] is `coord`: padding (`coord == oob`) reads row 0 instead
/// of an out-of-bounds row, so the kernel does not depend on how the TMA
/// unit treats out-of-bounds gather4 rows; the slot's validity flag (from
/// `coord`) then zeroes its dS, so row 0 contributes nothing. The host
/// guarantees `B*S_k >= 1`.
pub const fn tma_row(coord: i32, oob: i32) -> i32 {
    if coord == oob {
        0
    } else {
        coord
    }
}

/// Coordinates of one gather4 load: slots `4*g .. 4*g+4` of a chunk.
pub fn gather4_coords(ids: &[i32; 4], b: u32, batch: u32, seq_k: u32, conv: Ids) -> [i32; 4] {
    [
        row_coord(ids[0], b, batch, seq_k, conv),
        row_coord(ids[1], b, batch, seq_k, conv),
        row_coord(ids[2], b, batch, seq_k, conv),
        row_coord(ids[3], b, batch, seq_k, conv),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_maps_out_of_bounds_and_local_ids_never_alias() {
        let (batch, seq_k) = (3u32, 10u32);
        let oob = 30;
        assert_eq!(
            gather4_coords(&[0, 29, 30, -1], 2, batch, seq_k, Ids::Global),
            [0, 29, oob, oob]
        );
        assert_eq!(
            gather4_coords(&[0, 9, 10, -7], 1, batch, seq_k, Ids::Local),
            [10, 19, oob, oob]
        );
        // A local id of S_k in batch 0 must not become row 10 (batch 1).
        assert_eq!(row_coord(10, 0, batch, seq_k, Ids::Local), oob);
        assert_eq!(row_coord(i32::MAX, 2, batch, seq_k, Ids::Local), oob);
        assert_eq!(row_coord(i32::MIN, 0, batch, seq_k, Ids::Global), oob);
    }

    #[test]
    fn padding_reads_row_zero_and_valid_rows_are_unchanged() {
        let (batch, seq_k) = (2u32, 10u32);
        let oob = 20;
        let ids = [-1, 19, 20, 3];
        let coords = gather4_coords(&ids, 1, batch, seq_k, Ids::Global);
        let rows = coords.map(|c| tma_row(c, oob));
        assert_eq!(rows, [0, 19, 0, 3]);
        // Validity comes from the coordinate, not from the TMA row.
        assert_eq!(coords.map(|c| c != oob), [false, true, false, true]);
        let local = gather4_coords(&[9, 10, 0, -5], 1, batch, seq_k, Ids::Local);
        assert_eq!(local.map(|c| tma_row(c, oob)), [19, 0, 10, 0]);
    }
}
