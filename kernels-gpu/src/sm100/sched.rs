//! Persistent-CTA scheduler arithmetic: which query rows a CTA processes,
//! and how short rows are packed so each work item holds about one chunk.

/// Rows of CTA `cta` out of `ctas`, strided so neighbouring CTAs take
/// neighbouring rows (which tend to share keys and hit L2 together).
pub fn rows_of(cta: u32, ctas: u32, rows: u32) -> impl Iterator<Item = u32> {
    (cta..rows).step_by(ctas.max(1) as usize)
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

/// Persistent grid size: one CTA per SM, never more CTAs than items.
pub const fn grid(sms: u32, items: u32) -> u32 {
    if items < sms {
        items
    } else {
        sms
    }
}

/// Number of CTA rows `rows_of(cta, ctas, rows)` yields.
pub const fn rows_of_count(cta: u32, ctas: u32, rows: u32) -> u32 {
    if cta >= rows || ctas == 0 {
        0
    } else {
        (rows - cta).div_ceil(ctas)
    }
}

/// 128-slot chunks of one row for the `topk` specializations (128, 256,
/// 384); `None` for any other topk (those use the `mma.sync` kernels).
pub const fn chunks_per_row(topk: u32) -> Option<u32> {
    match topk {
        128 | 256 | 384 => Some(topk / 128),
        _ => None,
    }
}

/// Position in a ring of `stages` buffers guarded by `full`/`empty`
/// mbarrier pairs, for the `n`-th use (0-based) of the ring. Phases are
/// 0-based indices of a barrier's phase completions; a wait passes the
/// hardware only their [`parity`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Buffer index, `n % stages`.
    pub index: u32,
    /// Phase a consumer waits for on the buffer's `full` barrier (and the
    /// phase its own release lands in on the `empty` barrier): the buffer's
    /// `n / stages`-th fill.
    pub full_phase: u32,
    /// Phase the producer waits for on the buffer's `empty` barrier before
    /// refilling it (the consumers' release of its previous use), or `None`
    /// for the first use of each buffer.
    pub empty_phase: Option<u32>,
}

/// [`Slot`] of the `n`-th use of a ring of `stages` buffers.
pub const fn slot(n: u32, stages: u32) -> Slot {
    let round = n / stages;
    Slot {
        index: n % stages,
        full_phase: round,
        empty_phase: if round == 0 { None } else { Some(round - 1) },
    }
}

/// Parity `mbarrier.try_wait.parity` takes to wait for phase `phase`
/// (0-based) of a barrier: it passes once the barrier's current phase has
/// the other parity, so a waiter must never fall two phases behind
/// (`sm100::model` checks that it cannot).
pub const fn parity(phase: u32) -> u32 {
    phase & 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    #[test]
    fn every_row_is_taken_by_exactly_one_cta() {
        for (rows, ctas) in [(1u32, 132u32), (8192, 132), (133, 132), (7, 3), (0, 5)] {
            let mut count = std::vec![0u32; rows as usize];
            for c in 0..ctas {
                for r in rows_of(c, ctas, rows) {
                    count[r as usize] += 1;
                }
            }
            assert!(count.iter().all(|&n| n == 1), "rows {rows} ctas {ctas}");
        }
        let first: Vec<u32> = rows_of(2, 132, 8192).take(3).collect();
        assert_eq!(first, [2, 134, 266]);
    }

    #[test]
    fn short_rows_are_packed_to_fill_a_chunk() {
        assert_eq!(rows_per_item(128, 128), 1);
        assert_eq!(rows_per_item(2048, 128), 1);
        assert_eq!(rows_per_item(64, 128), 2);
        assert_eq!(rows_per_item(20, 128), 6);
        assert_eq!(items(8192, 2), 4096);
        assert_eq!(items(5, 2), 3);
        assert_eq!(grid(132, 4096), 132);
        assert_eq!(grid(132, 7), 7);
    }

    #[test]
    fn row_counts_match_the_iterator() {
        for (rows, ctas) in [(1u32, 148u32), (8192, 148), (149, 148), (7, 3), (0, 5)] {
            for c in 0..ctas {
                assert_eq!(
                    rows_of_count(c, ctas, rows) as usize,
                    rows_of(c, ctas, rows).count(),
                    "rows {rows} ctas {ctas} cta {c}"
                );
            }
        }
    }

    #[test]
    fn specializations_have_one_to_three_chunks() {
        assert_eq!(chunks_per_row(128), Some(1));
        assert_eq!(chunks_per_row(256), Some(2));
        assert_eq!(chunks_per_row(384), Some(3));
        for t in [0, 64, 127, 129, 512, 2048] {
            assert_eq!(chunks_per_row(t), None, "{t}");
        }
    }

    /// An mbarrier as the ISA describes it for parity waits: `try_wait.parity p`
    /// succeeds once the phase with parity `p` has completed, i.e. when the
    /// current phase's parity differs from `p`.
    struct Bar {
        completed: u32,
    }
    impl Bar {
        fn try_wait(&self, p: u32) -> bool {
            self.completed & 1 != p
        }
    }

    #[test]
    fn ring_parities_block_until_the_right_phase() {
        // Per specialization: one K ring of 2 stages used once per chunk, one
        // q ring of 2 used once per row, over a CTA's rows.
        for topk in [128u32, 256, 384] {
            let nch = chunks_per_row(topk).unwrap();
            let rows = rows_of_count(5, 148, 8192);
            let uses = rows * nch;
            for stages in [2u32, 3] {
                let mut full = std::vec::Vec::new();
                let mut empty = std::vec::Vec::new();
                for _ in 0..stages {
                    full.push(Bar { completed: 0 });
                    empty.push(Bar { completed: 0 });
                }
                for n in 0..uses {
                    let s = slot(n, stages);
                    assert_eq!(s.index, n % stages);
                    let i = s.index as usize;
                    // Producer: must block until the previous use was released.
                    if let Some(ph) = s.empty_phase {
                        let p = parity(ph);
                        assert!(!empty[i].try_wait(p), "use {n}: empty passed early");
                        empty[i].completed += 1;
                        assert!(empty[i].try_wait(p), "use {n}: empty never passes");
                    } else {
                        assert_eq!(n / stages, 0);
                    }
                    // Consumer: blocks until this use is filled.
                    let p = parity(s.full_phase);
                    assert!(!full[i].try_wait(p), "use {n}: full passed early");
                    full[i].completed += 1;
                    assert!(full[i].try_wait(p));
                }
            }
        }
        for n in 0..8 {
            let b = Bar { completed: n };
            assert!(!b.try_wait(parity(n)));
            let b = Bar { completed: n + 1 };
            assert!(b.try_wait(parity(n)));
        }
    }
}
