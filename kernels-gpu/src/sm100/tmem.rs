//! Tensor-memory data-path layouts of the stage-2 accumulators (PTX ISA,
//! tcgen05 "Data path layout organization") and which warp reads what.
//!
//! - M = 128, `cta_group::1` (layout D): accumulator row `i` is TMEM lane `i`.
//! - M = 64, `cta_group::1`, not `.ws` (layout F): the 64 rows are spread
//!   16 per 32-lane sub-partition, rows `16q .. 16q + 16` in lanes
//!   `32q .. 32q + 16`; lanes `32q + 16 .. 32q + 32` are not written.
//!
//! A warp may only access the 32-lane sub-partition `warp % 4`
//! (`tcgen05.ld` restriction), so every role that reads an accumulator is a
//! whole warpgroup (warps `4g .. 4g + 4`), and with `tcgen05.ld.32x32b` lane
//! `l` of warp `w` receives TMEM lane `32 (w % 4) + l`.

/// TMEM lane holding row `row` (< 64) of an M = 64 accumulator.
pub const fn lane_m64(row: u32) -> u32 {
    (row / 16) * 32 + row % 16
}

/// TMEM lane holding row `row` (< 128) of an M = 128 accumulator.
pub const fn lane_m128(row: u32) -> u32 {
    row
}

/// First TMEM lane warp `warp` may access (lane field of its addresses).
pub const fn warp_lane_base(warp: u32) -> u32 {
    (warp % 4) * 32
}

/// Row of an M = 64 accumulator that lane `lane` of warp `warp` receives
/// from a `tcgen05.ld.32x32b` at [`warp_lane_base`], or `None` for the
/// lanes the M = 64 layout leaves unused.
pub const fn m64_row_of(warp: u32, lane: u32) -> Option<u32> {
    if lane < 16 {
        Some((warp % 4) * 16 + lane)
    } else {
        None
    }
}

/// Row of an M = 128 accumulator that lane `lane` of warp `warp` receives.
pub const fn m128_row_of(warp: u32, lane: u32) -> u32 {
    warp_lane_base(warp) + lane
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn m64_rows_round_trip_through_the_reading_warpgroup() {
        let mut seen = [false; 64];
        for warp in 4..8u32 {
            for lane in 0..32u32 {
                let tl = warp_lane_base(warp) + lane;
                match m64_row_of(warp, lane) {
                    Some(r) => {
                        assert_eq!(lane_m64(r), tl, "row {r}");
                        assert!(!seen[r as usize]);
                        seen[r as usize] = true;
                    }
                    None => {
                        // No M = 64 row lives in this TMEM lane.
                        assert!((0..64).all(|r| lane_m64(r) != tl));
                    }
                }
            }
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(lane_m64(15), 15);
        assert_eq!(lane_m64(16), 32);
        assert_eq!(lane_m64(63), 111);
    }

    #[test]
    fn m128_rows_round_trip_and_stay_in_the_warps_subpartition() {
        for warp in 0..8u32 {
            for lane in 0..32u32 {
                let r = m128_row_of(warp, lane);
                assert_eq!(lane_m128(r), warp_lane_base(warp) + lane);
                assert_eq!(lane_m128(r) / 32, warp % 4);
            }
        }
        for r in 0..64 {
            assert_eq!(lane_m64(r) / 32, r / 16, "row {r} in sub-partition r/16");
        }
    }
}
