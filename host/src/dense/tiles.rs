//! The work items of dense mode's tile kernel (`kernels_gpu::sm90::dense`,
//! H = 64, D = 128): one item per CTA, in the encoding of
//! `kernels_gpu::abi::DENSE_ITEM_*`, ordered longest first so that the
//! last CTAs to start are the short ones.
//!
//! Per batch: a row item per pair of adjacent query rows (the last alone
//! when the batch has an odd count) and, per 128 keys, key items over the
//! rows of the batch that see one of those keys (visibility grows with the
//! row, so they are a suffix of the batch), in runs of at most
//! `ITEM_MAX_ROWS` rows. Each 128-key tile's runs form the chains of the
//! deterministic twin (`kernels_gpu::sm90::dense::turns`): numbered from 0
//! over the batches' tiles (two per tile), with the runs' turns in row
//! order, and the order below keeps every chain's turns in increasing
//! order (the twin's freedom from deadlock rests on it).

use super::shape::Shape;
use crate::error::Result;
use kernels_gpu::abi::{DENSE_ITEM_KEYS, DENSE_ITEM_ROWS, DENSE_ITEM_WORDS};
use kernels_gpu::sm90::dense::{chains, ITEM_KEYS, ITEM_MAX_ROWS, ITEM_ROWS, TILE_KEYS};

/// One item's words.
pub(super) type Item = [u32; DENSE_ITEM_WORDS];

/// The items of `shape` (validated), longest first, and the number of
/// 128-key tiles (`kernels_gpu::sm90::dense::chains` gives their chains).
pub(super) fn items(shape: &Shape) -> Result<(Vec<Item>, u32)> {
    // (work, item): work in steps of both warpgroups (a key tile of a row
    // item, a query row of a key item).
    let capacity: usize = (0..shape.batch())
        .map(|b| {
            let (nq, nk) = (shape.seq_q_of(b), shape.seq_k_of(b));
            nq.div_ceil(ITEM_ROWS as usize)
                + nk.div_ceil(ITEM_KEYS as usize) * (nq.div_ceil(ITEM_MAX_ROWS as usize) + 1)
        })
        .sum();
    let mut work: Vec<(u64, Item)> = Vec::with_capacity(capacity);
    let (mut row0, mut key0, mut tile) = (0usize, 0usize, 0u32);
    for b in 0..shape.batch() {
        let (nq, nk) = (shape.seq_q_of(b), shape.seq_k_of(b));
        let vis = |s: usize| shape.visible(b, s);
        for s in (0..nq).step_by(ITEM_ROWS as usize) {
            let n = (nq - s).min(ITEM_ROWS as usize);
            let tiles = vis(s + n - 1).div_ceil(TILE_KEYS as usize);
            let item = [
                DENSE_ITEM_ROWS,
                (row0 + s) as u32,
                n as u32,
                key0 as u32,
                tiles as u32,
                0,
                0,
                0,
            ];
            work.push((tiles as u64, item));
        }
        for col0 in (0..nk).step_by(ITEM_KEYS as usize) {
            let n = (nk - col0).min(ITEM_KEYS as usize);
            let first = first_seeing(nq, |s| vis(s) > col0);
            // Keys no row sees still get an item (with no rows): it adds
            // nothing, but every key has its item.
            let (mut s, mut turn) = (first, 0u32);
            let chain = chains(tile);
            loop {
                let end = (s + ITEM_MAX_ROWS as usize).min(nq);
                let item = [
                    DENSE_ITEM_KEYS,
                    key0 as u32,
                    col0 as u32,
                    n as u32,
                    (row0 + s) as u32,
                    (row0 + end) as u32,
                    chain,
                    turn,
                ];
                work.push(((end - s) as u64, item));
                (s, turn) = (end, turn + 1);
                if s >= nq {
                    break;
                }
            }
            tile += 1;
        }
        row0 += nq;
        key0 += nk;
    }
    // Every run of a chain but its last has ITEM_MAX_ROWS rows, the most
    // a key item has: a stable sort by descending work keeps the turns in
    // order (checked by the tests).
    Ok((longest_first(work), tile))
}

/// The items of `work` by descending work, stably (equal work keeps the
/// batch order). Work is a small integer (key tiles of a row, at most
/// `ITEM_MAX_ROWS` rows of a key item), so a counting sort orders them in
/// time linear in their number (a plan is built per shape, often per
/// step); a comparison sort where the largest work is out of proportion.
fn longest_first(work: Vec<(u64, Item)>) -> Vec<Item> {
    let max = work.iter().map(|w| w.0).max().unwrap_or(0);
    if max > 4 * work.len() as u64 + 1024 {
        let mut work = work;
        work.sort_by_key(|w| std::cmp::Reverse(w.0));
        return work.into_iter().map(|(_, i)| i).collect();
    }
    // Bucket `max - w` holds work `w`; `next[b]` is the next free slot of
    // bucket `b` in the output.
    let max = max as usize;
    let mut next = vec![0usize; max + 1];
    for w in &work {
        next[max - w.0 as usize] += 1;
    }
    let mut at = 0;
    for n in next.iter_mut() {
        (*n, at) = (at, at + *n);
    }
    let mut out = vec![[0u32; DENSE_ITEM_WORDS]; work.len()];
    for (w, item) in work {
        let b = max - w as usize;
        out[next[b]] = item;
        next[b] += 1;
    }
    out
}

/// The first `s < n` with `sees(s)` (`n` if none), for `sees` false then
/// true along `s`: a binary search.
fn first_seeing(n: usize, sees: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if sees(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (row, key) pair a row sees is covered by exactly one row item
    /// and one key item, every row has one row item, every key its key
    /// items (one per run of rows), and the order is longest first.
    #[test]
    fn longest_first_is_a_stable_sort_by_descending_work() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        // Small work (the counting sort) and work out of proportion (the
        // comparison sort), with many ties.
        for (n, range) in [(0, 1), (1, 1), (500, 9), (3000, 300), (50, 1 << 40)] {
            let work: Vec<(u64, Item)> = (0..n)
                .map(|i| (next() % range, [i as u32, 1, 2, 3, 4, 5, 6, 7]))
                .collect();
            let mut want = work.clone();
            want.sort_by_key(|w| std::cmp::Reverse(w.0));
            let want: Vec<Item> = want.into_iter().map(|(_, i)| i).collect();
            assert_eq!(longest_first(work), want, "n {n} range {range}");
        }
    }

    #[test]
    fn items_cover_every_visible_pair_once_each_way() {
        let shapes = [
            Shape::bshd(2, 7, 300, 64, 128),
            Shape::bshd(1, 130, 129, 64, 128)
                .with_q_offset(vec![-5])
                .with_ratio(2),
            Shape::bshd(1, 700, 600, 64, 128),
            Shape::varlen(vec![0, 3, 3, 200], vec![0, 1, 129, 400], 64, 128)
                .with_q_offset(vec![0, 4, 100]),
        ];
        for shape in shapes {
            let (items, tiles) = items(&shape).unwrap();
            let (rows, keys) = (shape.rows(), shape.key_rows());
            // The next turn each chain expects, in list order.
            let chains = chains(tiles) as usize;
            let mut next_turn = vec![0u32; chains];
            let mut row_seen = vec![0; rows];
            let mut key_seen = vec![0; keys];
            let mut pairs_by_rows = std::collections::HashSet::new();
            let mut pairs_by_keys = std::collections::HashSet::new();
            let mut last = u64::MAX;
            for it in &items {
                let w = match it[0] {
                    DENSE_ITEM_ROWS => {
                        let (r0, n, ks, tiles) = (it[1] as usize, it[2] as usize, it[3], it[4]);
                        assert!(n == 1 || n == 2);
                        for (r, seen) in row_seen.iter_mut().enumerate().skip(r0).take(n) {
                            *seen += 1;
                            let row = shape.row(r);
                            assert_eq!(row.key_start as u32, ks, "one batch per item");
                            assert!(row.visible <= 64 * tiles as usize);
                            for j in 0..row.visible {
                                assert!(pairs_by_rows.insert((r, row.key_start + j)));
                            }
                        }
                        tiles as u64
                    }
                    DENSE_ITEM_KEYS => {
                        let (ks, c0, n) = (it[1] as usize, it[2] as usize, it[3] as usize);
                        let (rb, re) = (it[4] as usize, it[5] as usize);
                        assert!((1..=128).contains(&n));
                        assert!(re - rb <= ITEM_MAX_ROWS as usize);
                        let (chain, turn) = (it[6] as usize, it[7]);
                        assert!(chain % 2 == 0 && chain + 1 < chains);
                        assert_eq!(turn, next_turn[chain], "turns in list order");
                        next_turn[chain] += 1;
                        // Counted on the run that starts at the first row
                        // seeing the keys (or, when none does, the empty one).
                        let starts = rb == 0
                            || shape.row(rb - 1).key_start != ks
                            || shape.row(rb - 1).visible <= c0;
                        if starts {
                            for seen in key_seen.iter_mut().skip(ks + c0).take(n) {
                                *seen += 1;
                            }
                        }
                        for r in rb..re {
                            let row = shape.row(r);
                            assert_eq!(row.key_start, ks);
                            for j in c0..(c0 + n).min(row.visible) {
                                assert!(pairs_by_keys.insert((r, ks + j)));
                            }
                        }
                        (re - rb) as u64
                    }
                    k => panic!("kind {k}"),
                };
                assert!(w <= last, "longest first");
                last = w;
            }
            assert!(row_seen.iter().all(|&n| n == 1));
            assert!(key_seen.iter().all(|&n| n == 1));
            // Every tile's chain has its runs, one per started turn.
            assert!(next_turn.iter().step_by(2).all(|&t| t >= 1));
            assert_eq!(
                tiles as usize,
                (0..shape.batch())
                    .map(|b| shape.seq_k_of(b).div_ceil(128))
                    .sum::<usize>()
            );
            assert_eq!(pairs_by_rows, pairs_by_keys);
            let total: usize = (0..rows).map(|r| shape.row(r).visible).sum();
            assert_eq!(pairs_by_rows.len(), total);
        }
    }
}
