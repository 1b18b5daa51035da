//! Row coordinates of TMA `tile::gather4` loads of selected K rows.
//!
//! A gather4 load fetches four rows of the 2D `(B*S_k, D)` view of
//! `index_k` by row coordinate. Padding slots get the coordinate `B*S_k`
//! (one past the last row): the TMA unit zero-fills out-of-bounds rows, so
//! padded slots contribute exact zeros to S without a branch, and the
//! validity mask removes them from dS. A local id is checked against its
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
}
