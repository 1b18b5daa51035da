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
}
