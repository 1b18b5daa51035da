//! The tcgen05 kernel's own scheduling arithmetic: chunks per row of its
//! topk specializations, and the position and phases of a use of an
//! mbarrier-guarded ring. Which rows a CTA processes and the grid size are
//! the shared persistent scheduler's (`crate::sched`), dealt one CTA per
//! SM: `sched::persistent_grid(rows, sms, 1)`, rows `sched::rows_of(rows, ctas, cta)`.

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
            let rows = crate::sched::row_count(8192, 148, 5);
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
