//! Scheduling of the wgmma kernels: their persistent grids (the shared
//! round-robin scheduler `crate::sched`, two CTAs per SM for the row
//! kernel, one for the paired kernel), how many chunks a row runs, and the
//! walk of a CTA's rows as one flat sequence of items ([`Walk`]). Plain
//! Rust, host-tested; re-exported by [`super`].

use super::{CHUNK, CTAS_PER_SM};
use crate::sched;

/// Persistent grid of the row kernel: [`CTAS_PER_SM`] CTAs per SM, never
/// more than rows. Rows are dealt round robin (`crate::sched::row_at`).
pub const fn row_grid(rows: u32, sms: u32) -> u32 {
    sched::persistent_grid(rows, sms, CTAS_PER_SM)
}

/// Persistent grid of the paired kernel: one CTA per SM, never more than
/// row pairs (`rows` must be even, [`super::supports_pairs`]). Pairs are
/// dealt round robin: CTA `cta` takes pairs `row_at(ctas, cta, k)`, rows
/// `2 p` and `2 p + 1` of each.
pub const fn pair_grid(rows: u32, sms: u32) -> u32 {
    sched::persistent_grid(rows / 2, sms, 1)
}

/// Smallest topk for which the host asks stage 1 for per-row chunk counts
/// ([`crate::abi::FLAG_ROW_CHUNKS`]) and the kernel skips trailing
/// all-padding chunks. Below it a row has few chunks to skip (never any at
/// topk 128: every row runs at least two), and the count costs more than
/// it saves (the threshold is where the skip started to pay on ragged
/// ids, docs/architecture.md, "Measurements behind code choices").
pub const SKIP_MIN_TOPK: u32 = 512;

/// Chunks the kernel runs for a row whose stage-1 count
/// ([`crate::abi::FLAG_ROW_CHUNKS`]) is `live`: at least two (the next
/// row's q tile is loaded during a row's first chunk and waited for at the
/// end of its second), at most `ceil(topk / CHUNK)`.
pub const fn row_chunks(live: u32, topk: u32) -> u32 {
    let all = topk.div_ceil(CHUNK);
    let n = if live < 2 { 2 } else { live };
    if n > all {
        all
    } else {
        n
    }
}

/// A position in a CTA's sequence of work items: chunk `ch` of local row `k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pos {
    /// Local row (the CTA's `k`-th row, [`sched::row_at`]).
    pub k: u32,
    /// Chunk of that row.
    pub ch: u32,
}

/// Where a CTA is in its sequence of items: local row `k` spans items
/// `start..end0`, row `k + 1` spans `end0..end1`. The kernel looks at most
/// three items ahead and every row has at least two ([`row_chunks`]), so
/// an item it asks about lies before `end1 + 1` (row `k + 2`, chunk 0 at
/// the latest) and these four numbers (plus one count loaded a row ahead)
/// are all the state it keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Walk {
    /// The current item's local row.
    pub k: u32,
    /// First item of row `k`.
    pub start: u32,
    /// One past the last item of row `k`.
    pub end0: u32,
    /// One past the last item of row `k + 1`.
    pub end1: u32,
}

impl Walk {
    /// The first two rows, of `n0` and `n1` chunks.
    pub const fn new(n0: u32, n1: u32) -> Walk {
        Walk {
            k: 0,
            start: 0,
            end0: n0,
            end1: n0 + n1,
        }
    }

    /// Position of item `x` (`start <= x`, inside rows `k .. k + 2`).
    #[inline(always)]
    pub const fn pos(&self, x: u32) -> Pos {
        if x < self.end0 {
            Pos {
                k: self.k,
                ch: x - self.start,
            }
        } else if x < self.end1 {
            Pos {
                k: self.k + 1,
                ch: x - self.end0,
            }
        } else {
            Pos {
                k: self.k + 2,
                ch: x - self.end1,
            }
        }
    }

    /// Moves on to row `k + 1`; `n2` is the chunk count of row `k + 2`.
    #[inline(always)]
    pub const fn next_row(&mut self, n2: u32) {
        self.k += 1;
        self.start = self.end0;
        self.end0 = self.end1;
        self.end1 += n2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::{row_at, row_count};

    #[test]
    fn persistent_grid_covers_every_row_once() {
        for (rows, sms) in [
            (1, 132),
            (72, 132),
            (264, 132),
            (265, 132),
            (8192, 132),
            (1000, 7),
        ] {
            let ctas = row_grid(rows, sms);
            assert!(ctas >= 1 && ctas <= rows && ctas <= 2 * sms);
            let mut seen = std::vec![0u8; rows as usize];
            for cta in 0..ctas {
                let n = row_count(rows, ctas, cta);
                assert!(n >= 1, "every CTA has a row");
                for k in 0..n {
                    seen[row_at(ctas, cta, k) as usize] += 1;
                }
                assert!(row_at(ctas, cta, n) >= rows, "no row left after the last");
            }
            assert!(seen.iter().all(|&s| s == 1), "rows {rows} sms {sms}");
        }
    }

    #[test]
    fn round_robin_keeps_the_busiest_cta_near_the_mean_on_causal_rows() {
        // The ragged workload at topk 2048 (valid slots first): row r has
        // ceil((r/2+1)/64) live chunks, capped at 32.
        let (rows, ctas, topk) = (8192u32, 264u32, 2048u32);
        let len = |r: u32| row_chunks((r / 2 + 1).min(topk).div_ceil(CHUNK), topk);
        let tot: std::vec::Vec<u32> = (0..ctas)
            .map(|c| {
                (0..row_count(rows, ctas, c))
                    .map(|k| len(row_at(ctas, c, k)))
                    .sum()
            })
            .collect();
        let sum: u32 = (0..rows).map(len).sum();
        assert_eq!(tot.iter().sum::<u32>(), sum);
        let (max, mean) = (*tot.iter().max().unwrap(), sum / ctas);
        assert!(max <= mean + 20, "busiest {max} chunks, mean {mean}");
    }

    #[test]
    fn row_chunks_clamps_to_two_and_to_topk() {
        assert_eq!(row_chunks(0, 128), 2);
        assert_eq!(row_chunks(1, 2048), 2);
        assert_eq!(row_chunks(5, 2048), 5);
        assert_eq!(row_chunks(40, 2048), 32);
        assert_eq!(row_chunks(3, 65), 2);
    }

    #[test]
    fn walk_locates_every_lookahead_item_as_the_kernel_does() {
        let n = [2u32, 5, 2, 2, 3, 2, 7, 2];
        let count = |k: u32| n.get(k as usize).copied().unwrap_or(2);
        let mut want = std::vec::Vec::new();
        for (k, &len) in n.iter().enumerate() {
            for ch in 0..len {
                want.push(Pos { k: k as u32, ch });
            }
        }
        // As the kernel: counts of rows 0 and 1 up front, row k + 2's
        // loaded when row k starts and used when row k + 1 starts.
        let mut w = Walk::new(count(0), count(1));
        let mut pending = count(2);
        let mut it = 0u32;
        while (w.pos(it).k as usize) < n.len() {
            for d in 0..4 {
                let x = it + d;
                if (x as usize) < want.len() {
                    assert_eq!(w.pos(x), want[x as usize], "item {it} + {d}");
                }
            }
            assert_eq!(it + 1 == w.end0, w.pos(it).ch + 1 == n[w.k as usize]);
            it += 1;
            if it == w.end0 {
                w.next_row(pending);
                pending = count(w.k + 2);
            }
        }
        assert_eq!(it as usize, want.len());
    }
}
