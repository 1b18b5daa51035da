//! Row coordinates of TMA `tile::gather4` loads of selected K rows.
//!
//! A gather4 load fetches four rows of the 2D `(B*S_k, D)` view of
//! `index_k` by row coordinate. Padding slots get the coordinate `B*S_k`
//! (one past the last row), which marks them invalid; the stage-2 kernel
//! then gathers [`PAD_ROW`] for them ([`tma_row`]), a row outside the
//! tensor that the TMA unit fills with zeros, and the validity mask
//! removes them from dS, d_weights and the dK scatter. A local id is
//! checked against its own batch before `b * S_k` is added, so it never
//! aliases the next batch.
//!
//! Why zeros and not a real row: dS of a padding slot is zero, but the dQ
//! product `dQ += dS K` still multiplies that zero by the slot's K row in
//! the tensor cores, and `0 * Inf` or `0 * NaN` is NaN. A padding slot
//! that gathered a real key row would carry that row's non-finite values
//! into `d_index_q` of every query row with padding, which SPEC's rule
//! "CPU and GPU agree on which outputs are non-finite" forbids (the CPU
//! reference and the Hopper kernels skip or zero-fill padding).

/// Key-id convention, as in `abi::FLAG_LOCAL_IDS`.
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

/// Row coordinate that `tile::gather4` receives for a padding slot: out
/// of bounds of every tensor map (the row coordinates of a gather4 are
/// signed `.s32` tensor coordinates, and rows start at 0).
///
/// PTX ISA, tensors, tiled mode: elements of a bounding box that fall
/// outside the tensor are zero-filled (the maps are encoded with
/// `CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE`, the zero-fill mode), and the
/// gather4 modes follow every rule of the tiled mode, each of the four
/// rows being its own bounding box. The box is still written to shared
/// memory in full, so the stage's `expect_tx` stays the full box bytes of
/// all 128 slots, padding included.
pub const PAD_ROW: i32 = -1;
// The stage metadata stores the gather row as the resolved key row, and
// the compute and reduce roles take a negative one for padding.
const _: () = assert!(PAD_ROW < 0);

/// Row coordinate actually handed to `tile::gather4` for a slot whose
/// [`row_coord`] is `coord`: a valid row as it is, padding
/// (`coord == oob`) as [`PAD_ROW`], so that its K row in shared memory is
/// all zeros and `0 * K` stays 0 in the dQ product whatever `index_k`
/// holds. The value doubles as the slot's resolved key row in the stage
/// metadata (negative: padding).
pub const fn tma_row(coord: i32, oob: i32) -> i32 {
    if coord == oob {
        PAD_ROW
    } else {
        coord
    }
}

/// Whether a TMA load of row `row` of a map over `rows` rows reads global
/// memory (otherwise the TMA unit zero-fills it): the bounds rule that
/// [`PAD_ROW`] relies on, for host emulations of the gather.
pub const fn row_in_bounds(row: i32, rows: u32) -> bool {
    row >= 0 && (row as u32) < rows
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
    fn padding_gathers_an_out_of_bounds_row_and_valid_rows_are_unchanged() {
        let (batch, seq_k) = (2u32, 10u32);
        let oob = 20;
        let ids = [-1, 19, 20, 3];
        let coords = gather4_coords(&ids, 1, batch, seq_k, Ids::Global);
        let rows = coords.map(|c| tma_row(c, oob));
        assert_eq!(rows, [PAD_ROW, 19, PAD_ROW, 3]);
        // Validity comes from the coordinate, and the TMA row agrees.
        assert_eq!(coords.map(|c| c != oob), [false, true, false, true]);
        assert_eq!(
            rows.map(|r| row_in_bounds(r, batch * seq_k)),
            [false, true, false, true]
        );
        let local = gather4_coords(&[9, 10, 0, -5], 1, batch, seq_k, Ids::Local);
        assert_eq!(local.map(|c| tma_row(c, oob)), [19, PAD_ROW, 10, PAD_ROW]);
        // Row 0 is a real row: padding must never be sent there.
        assert!(row_in_bounds(0, 1) && !row_in_bounds(PAD_ROW, u32::MAX));
        assert!(!row_in_bounds(i32::MIN, 1) && !row_in_bounds(1, 1));
    }
}
