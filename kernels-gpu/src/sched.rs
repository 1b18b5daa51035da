//! The persistent scheduler both persistent kernel families share (the
//! sm_90a wgmma kernels, `sm90`, and the sm_100f tcgen05 kernel, `sm100`):
//! how many CTAs a grid has, which units of work (query rows, or row pairs
//! in the paired wgmma kernel) each CTA takes, and the position of an item
//! in a ring of buffers. Plain Rust that the host tests and the kernels
//! share.
//!
//! Units are dealt round robin: CTA `cta` of a grid of `ctas` takes units
//! `cta, cta + ctas, cta + 2 ctas, ...`, so neighbouring CTAs take
//! neighbouring rows (which tend to share keys and hit L2 together).
//! (Dealing alternate rounds in reverse balances causal row lengths better
//! but hands the last, partial round to the CTAs that already have the most
//! chunks: on the ragged workload at topk 2048 the busiest wgmma CTA would
//! get 784 chunks instead of 769; see the test in `sm90`.)
//!
//! One argument order everywhere: the work (`units`, `rows`, `items`), the
//! machine or grid (`sms`, `ctas`), the CTA (`cta`), the local index (`k`);
//! a function leaves out what it does not need.

/// Persistent grid: `per_sm` CTAs per SM, never more CTAs than `units`.
pub const fn persistent_grid(units: u32, sms: u32, per_sm: u32) -> u32 {
    let slots = sms * per_sm;
    if units < slots {
        units
    } else {
        slots
    }
}

/// Unit of local index `k` of CTA `cta` in a grid of `ctas` (its `k`-th).
pub const fn row_at(ctas: u32, cta: u32, k: u32) -> u32 {
    cta + k * ctas
}

/// How many of `units` units CTA `cta` of a grid of `ctas >= 1` takes
/// ([`row_at`] for `k = 0, 1, ...` below `units`).
pub const fn row_count(units: u32, ctas: u32, cta: u32) -> u32 {
    if cta >= units {
        0
    } else {
        (units - cta).div_ceil(ctas)
    }
}

/// The units CTA `cta` of a grid of `ctas` takes, in order (the values of
/// [`row_at`], [`row_count`] of them).
pub fn rows_of(units: u32, ctas: u32, cta: u32) -> impl Iterator<Item = u32> {
    (cta..units).step_by(ctas.max(1) as usize)
}

/// Rows packed into one work item for a given topk and chunk: short rows
/// (topk below a chunk) are grouped so one item fills a chunk.
pub const fn rows_per_item(topk: u32, chunk: u32) -> u32 {
    if topk >= chunk || topk == 0 {
        1
    } else {
        chunk / topk
    }
}

/// Number of work items for `rows` rows packed `per_item` to an item.
pub const fn items(rows: u32, per_item: u32) -> u32 {
    rows.div_ceil(per_item)
}

/// Position in a ring of `STAGES` buffers that a CTA uses once per item,
/// in order: the `count`-th use (0-based). The stage is `count % STAGES`;
/// the phase is the round (`count / STAGES`) mod 2, the parity a
/// barrier wait on the stage would take (`sm100::sched::Slot` keeps the
/// full phase index for the tcgen05 kernel's mbarriers, which its model
/// check needs).
///
/// The count is the state (not the stage and phase): the wgmma kernels
/// also locate items ahead by it (`sm90::bwd::Walk::pos`), and derive every
/// stage index from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PipeState<const STAGES: u32> {
    /// Uses so far: the index of the current item in the CTA's sequence.
    pub count: u32,
}

impl<const STAGES: u32> PipeState<STAGES> {
    /// The first use.
    pub const fn new() -> Self {
        PipeState { count: 0 }
    }

    /// The stage (buffer) of the current use.
    #[inline(always)]
    pub const fn index(&self) -> u32 {
        self.count % STAGES
    }

    /// The stage of the use `d` ahead.
    #[inline(always)]
    pub const fn index_ahead(&self, d: u32) -> u32 {
        (self.count + d) % STAGES
    }

    /// The phase parity of the current use (its round mod 2).
    #[inline(always)]
    pub const fn phase(&self) -> u32 {
        (self.count / STAGES) % 2
    }

    /// Moves on to the next use.
    #[inline(always)]
    pub const fn advance(&mut self) {
        self.count += 1;
    }
}

impl<const STAGES: u32> Default for PipeState<STAGES> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    #[test]
    fn every_unit_is_taken_by_exactly_one_cta() {
        for (rows, ctas) in [
            (1u32, 132u32),
            (8192, 132),
            (133, 132),
            (7, 3),
            (0, 5),
            (1000, 7),
        ] {
            let mut count = std::vec![0u32; rows as usize];
            for c in 0..ctas {
                let n = row_count(rows, ctas, c);
                let it: Vec<u32> = rows_of(rows, ctas, c).collect();
                assert_eq!(it.len(), n as usize, "rows {rows} ctas {ctas} cta {c}");
                for (k, &r) in it.iter().enumerate() {
                    assert_eq!(r, row_at(ctas, c, k as u32));
                    count[r as usize] += 1;
                }
                assert!(row_at(ctas, c, n) >= rows, "no unit left after the last");
            }
            assert!(count.iter().all(|&n| n == 1), "rows {rows} ctas {ctas}");
        }
        let first: Vec<u32> = rows_of(8192, 132, 2).take(3).collect();
        assert_eq!(first, [2, 134, 266]);
        assert_eq!(row_count(10, 4, 12), 0);
    }

    #[test]
    fn grids_are_capped_by_units_and_by_slots() {
        assert_eq!(persistent_grid(4096, 132, 1), 132);
        assert_eq!(persistent_grid(7, 132, 1), 7);
        assert_eq!(persistent_grid(8192, 132, 2), 264);
        assert_eq!(persistent_grid(200, 132, 2), 200);
        assert_eq!(persistent_grid(0, 132, 2), 0);
    }

    #[test]
    fn short_rows_are_packed_to_fill_a_chunk() {
        assert_eq!(rows_per_item(128, 128), 1);
        assert_eq!(rows_per_item(2048, 128), 1);
        assert_eq!(rows_per_item(64, 128), 2);
        assert_eq!(rows_per_item(20, 128), 6);
        assert_eq!(items(8192, 2), 4096);
        assert_eq!(items(5, 2), 3);
    }

    #[test]
    fn pipe_state_cycles_stages_and_flips_phase_per_round() {
        let mut p = PipeState::<2>::new();
        let mut seen = Vec::new();
        for _ in 0..6 {
            seen.push((p.index(), p.phase(), p.index_ahead(1)));
            p.advance();
        }
        assert_eq!(
            seen,
            [
                (0, 0, 1),
                (1, 0, 0),
                (0, 1, 1),
                (1, 1, 0),
                (0, 0, 1),
                (1, 0, 0)
            ]
        );
        let mut q = PipeState::<3>::default();
        for n in 0..9 {
            assert_eq!((q.index(), q.phase()), (n % 3, (n / 3) % 2));
            q.advance();
        }
    }
}
