//! The sizes of a dense problem (BSHD or packed variable-length), the
//! causal visibility rule, and the envelope checks.

use crate::error::{Error, Result};
use kernels_gpu::registry::{SUPPORTED_DIMS, SUPPORTED_HEADS};

/// How the query and key rows of a dense problem are laid out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `(B, S, ...)` tensors: every batch has `seq_q` query rows and
    /// `seq_k` key rows. The scores are `(B, S_q, S_k)`.
    Bshd {
        /// Batch size B.
        batch: usize,
        /// Query rows per batch, S_q.
        seq_q: usize,
        /// Key rows per batch, S_k.
        seq_k: usize,
    },
    /// Packed variable-length batches (THD): batch `b` owns the query rows
    /// `cu_seqlens_q[b]..cu_seqlens_q[b + 1]` of `(T_q, H, D)` `index_q`
    /// and the key rows `cu_seqlens_k[b]..cu_seqlens_k[b + 1]` of
    /// `(T_k, D)` `index_k`. The scores are `(T_q, score_cols)`: column `j`
    /// of a query row of batch `b` is that batch's key `j` (local, from 0),
    /// and columns at or past the batch's key count are never read.
    Varlen {
        /// `B + 1` non-decreasing offsets from 0 to `T_q`.
        cu_seqlens_q: Vec<usize>,
        /// `B + 1` non-decreasing offsets from 0 to `T_k`.
        cu_seqlens_k: Vec<usize>,
        /// Columns of the score tensors: at least the longest key sequence
        /// ([`Shape::varlen`] takes exactly that; a larger value describes
        /// a padded `max_seqlen_k` allocation).
        score_cols: usize,
    },
}

/// Sizes of one dense problem. All tensors are dense row-major.
///
/// Row `s` of batch `b` sees the key columns `j < L` with
/// `L = min((q_offset[b] + s + 1) / ratio, S_k(b))` (integer division; `L =
/// 0` when `q_offset[b] + s + 1 <= 0`): [`Shape::visible`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    /// BSHD or packed variable-length.
    pub layout: Layout,
    /// Indexer heads H: 16, 32, 64 or 128 (the sparse envelope).
    pub heads: usize,
    /// Head dimension D: 64 or 128.
    pub head_dim: usize,
    /// Per batch: the key position of query row 0 (so row `s` sits at key
    /// position `q_offset[b] + s`). Empty means 0 for every batch;
    /// otherwise one entry per batch. Negative values are allowed (rows
    /// before the first key see nothing).
    pub q_offset: Vec<i64>,
    /// Key compression ratio, at least 1: query position `p` sees the
    /// compressed keys `j < (p + 1) / ratio`.
    pub ratio: usize,
}

/// Where one query row of a dense problem sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    /// Its batch.
    pub batch: usize,
    /// Its position in the batch, `s`.
    pub pos: usize,
    /// The first key row of its batch in the flat `(rows, D)` view of
    /// `index_k`.
    pub key_start: usize,
    /// Key rows of its batch, `S_k(b)`.
    pub seq_k: usize,
    /// Key columns it sees, `L`.
    pub visible: usize,
}

impl Shape {
    /// A BSHD shape with `q_offset` 0 for every batch (empty) and `ratio` 1.
    pub fn bshd(batch: usize, seq_q: usize, seq_k: usize, heads: usize, head_dim: usize) -> Shape {
        Shape {
            layout: Layout::Bshd {
                batch,
                seq_q,
                seq_k,
            },
            heads,
            head_dim,
            q_offset: Vec::new(),
            ratio: 1,
        }
    }

    /// A packed variable-length shape with `score_cols` the longest key
    /// sequence, `q_offset` 0 for every batch (empty) and `ratio` 1.
    pub fn varlen(
        cu_seqlens_q: Vec<usize>,
        cu_seqlens_k: Vec<usize>,
        heads: usize,
        head_dim: usize,
    ) -> Shape {
        let score_cols = cu_seqlens_k
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]))
            .max()
            .unwrap_or(0);
        Shape {
            layout: Layout::Varlen {
                cu_seqlens_q,
                cu_seqlens_k,
                score_cols,
            },
            heads,
            head_dim,
            q_offset: Vec::new(),
            ratio: 1,
        }
    }

    /// This shape with per-batch query offsets (one per batch).
    pub fn with_q_offset(self, q_offset: Vec<i64>) -> Shape {
        Shape { q_offset, ..self }
    }

    /// This shape with a key compression ratio.
    pub fn with_ratio(self, ratio: usize) -> Shape {
        Shape { ratio, ..self }
    }

    /// Batches B (`cu_seqlens_q.len() - 1` when packed).
    pub fn batch(&self) -> usize {
        match &self.layout {
            Layout::Bshd { batch, .. } => *batch,
            Layout::Varlen { cu_seqlens_q, .. } => cu_seqlens_q.len().saturating_sub(1),
        }
    }

    /// Query rows over all batches: `B * S_q`, or `T_q` when packed.
    pub fn rows(&self) -> usize {
        match &self.layout {
            Layout::Bshd { batch, seq_q, .. } => batch.saturating_mul(*seq_q),
            Layout::Varlen { cu_seqlens_q, .. } => cu_seqlens_q.last().copied().unwrap_or(0),
        }
    }

    /// Key rows over all batches: `B * S_k`, or `T_k` when packed.
    pub fn key_rows(&self) -> usize {
        match &self.layout {
            Layout::Bshd { batch, seq_k, .. } => batch.saturating_mul(*seq_k),
            Layout::Varlen { cu_seqlens_k, .. } => cu_seqlens_k.last().copied().unwrap_or(0),
        }
    }

    /// Columns of the score tensors: `S_k`, or `score_cols` when packed.
    pub fn score_cols(&self) -> usize {
        match &self.layout {
            Layout::Bshd { seq_k, .. } => *seq_k,
            Layout::Varlen { score_cols, .. } => *score_cols,
        }
    }

    /// Elements of `index_q` / `d_index_q`.
    pub fn q_len(&self) -> usize {
        self.rows().saturating_mul(self.heads * self.head_dim)
    }
    /// Elements of `weights` / `d_weights`.
    pub fn w_len(&self) -> usize {
        self.rows().saturating_mul(self.heads)
    }
    /// Elements of `index_k` / `d_index_k`.
    pub fn k_len(&self) -> usize {
        self.key_rows().saturating_mul(self.head_dim)
    }
    /// Elements of `attn_score` and `index_score`: `rows * score_cols`.
    pub fn score_len(&self) -> usize {
        self.rows().saturating_mul(self.score_cols())
    }

    /// Key columns row `pos` of batch `b` sees:
    /// `min((q_offset[b] + pos + 1) / ratio, S_k(b))`, 0 when the numerator
    /// is not positive. Call on a validated shape.
    pub fn visible(&self, b: usize, pos: usize) -> usize {
        let off = self.q_offset.get(b).copied().unwrap_or(0) as i128;
        let num = off + pos as i128 + 1;
        if num <= 0 {
            return 0;
        }
        let l = num / self.ratio.max(1) as i128;
        l.min(self.seq_k_of(b) as i128) as usize
    }

    /// Key rows of batch `b`, `S_k(b)`.
    pub fn seq_k_of(&self, b: usize) -> usize {
        match &self.layout {
            Layout::Bshd { seq_k, .. } => *seq_k,
            Layout::Varlen { cu_seqlens_k, .. } => span(cu_seqlens_k, b).1,
        }
    }

    /// Query rows of batch `b`, `S_q(b)`.
    pub fn seq_q_of(&self, b: usize) -> usize {
        match &self.layout {
            Layout::Bshd { seq_q, .. } => *seq_q,
            Layout::Varlen { cu_seqlens_q, .. } => span(cu_seqlens_q, b).1,
        }
    }

    /// Where query row `r` (of the flat `(rows, ...)` view) sits. Call on a
    /// validated shape with `r < rows()`.
    pub fn row(&self, r: usize) -> Row {
        let (batch, pos, key_start) = match &self.layout {
            Layout::Bshd { seq_q, seq_k, .. } => {
                let b = r / (*seq_q).max(1);
                (b, r - b * seq_q, b * seq_k)
            }
            Layout::Varlen {
                cu_seqlens_q,
                cu_seqlens_k,
                ..
            } => {
                // The last batch whose first row is at or before r (empty
                // batches share their start with the next one).
                let b = cu_seqlens_q[1..].partition_point(|&end| end <= r);
                (b, r - cu_seqlens_q[b], span(cu_seqlens_k, b).0)
            }
        };
        Row {
            batch,
            pos,
            key_start,
            seq_k: self.seq_k_of(batch),
            visible: self.visible(batch, pos),
        }
    }

    /// Checks the envelope, in this order: the layout (BSHD sizes >= 1;
    /// packed: at least one batch, both `cu_seqlens` of the same length,
    /// starting at 0, non-decreasing, totals >= 1, `score_cols` at least
    /// the longest key sequence), `heads` and `head_dim` as in the sparse
    /// mode, sizes the kernels' 32-bit row indices hold, `ratio >= 1`,
    /// `q_offset` empty or one entry per batch.
    pub fn validate(&self) -> Result<()> {
        match &self.layout {
            Layout::Bshd {
                batch,
                seq_q,
                seq_k,
            } => {
                for (name, v) in [("batch", *batch), ("seq_q", *seq_q), ("seq_k", *seq_k)] {
                    if v == 0 {
                        return shape_err(name, v, ">= 1");
                    }
                }
            }
            Layout::Varlen {
                cu_seqlens_q,
                cu_seqlens_k,
                score_cols,
            } => check_varlen(cu_seqlens_q, cu_seqlens_k, *score_cols)?,
        }
        if !SUPPORTED_HEADS.iter().any(|&h| h as usize == self.heads) {
            return shape_err("heads", self.heads, "one of 16, 32, 64, 128");
        }
        if !SUPPORTED_DIMS.iter().any(|&d| d as usize == self.head_dim) {
            return shape_err("head_dim", self.head_dim, "64 or 128");
        }
        self.check_sizes()?;
        if self.ratio == 0 {
            return shape_err("ratio", 0, ">= 1");
        }
        if !self.q_offset.is_empty() && self.q_offset.len() != self.batch() {
            return Err(Error::Length {
                tensor: "q_offset",
                expected: self.batch(),
                actual: self.q_offset.len(),
            });
        }
        Ok(())
    }

    /// Row counts within `i32`, tensor sizes addressable.
    fn check_sizes(&self) -> Result<()> {
        let max = i32::MAX as usize;
        let rows = match &self.layout {
            Layout::Bshd { batch, seq_q, .. } => batch.checked_mul(*seq_q),
            Layout::Varlen { .. } => Some(self.rows()),
        };
        if rows.is_none_or(|r| r > max) {
            return shape_err("query rows", self.rows(), "<= 2^31 - 1");
        }
        let keys = match &self.layout {
            Layout::Bshd { batch, seq_k, .. } => batch.checked_mul(*seq_k),
            Layout::Varlen { .. } => Some(self.key_rows()),
        };
        if keys.is_none_or(|k| k > max) {
            return shape_err("key rows", self.key_rows(), "<= 2^31 - 1");
        }
        let sizes = [
            self.rows().checked_mul(self.score_cols()),
            self.rows().checked_mul(self.heads * self.head_dim),
            self.key_rows().checked_mul(self.head_dim * 4),
        ];
        if sizes
            .iter()
            .any(|s| s.is_none_or(|v| v > isize::MAX as usize / 8))
        {
            return shape_err("tensor size", usize::MAX, "addressable");
        }
        Ok(())
    }
}

/// `(start, length)` of entry `b` of a validated `cu_seqlens`.
fn span(cu: &[usize], b: usize) -> (usize, usize) {
    match (cu.get(b), cu.get(b + 1)) {
        (Some(&s), Some(&e)) => (s, e.saturating_sub(s)),
        _ => (0, 0),
    }
}

fn shape_err(name: &'static str, value: usize, expected: &'static str) -> Result<()> {
    Err(Error::Shape {
        name,
        value,
        expected,
    })
}

/// The checks of a packed layout (see [`Shape::validate`]).
fn check_varlen(cu_q: &[usize], cu_k: &[usize], score_cols: usize) -> Result<()> {
    if cu_q.len() < 2 {
        return shape_err(
            "cu_seqlens_q length",
            cu_q.len(),
            ">= 2 (batches + 1, at least one batch)",
        );
    }
    if cu_k.len() != cu_q.len() {
        return Err(Error::Length {
            tensor: "cu_seqlens_k",
            expected: cu_q.len(),
            actual: cu_k.len(),
        });
    }
    for (tensor, cu) in [("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)] {
        if cu[0] != 0 {
            return Err(Error::CuSeqlens {
                tensor,
                index: 0,
                value: cu[0],
                expected: "0",
            });
        }
        if let Some(i) = (1..cu.len()).find(|&i| cu[i] < cu[i - 1]) {
            return Err(Error::CuSeqlens {
                tensor,
                index: i,
                value: cu[i],
                expected: ">= the entry before it (non-decreasing offsets)",
            });
        }
    }
    if cu_q[cu_q.len() - 1] == 0 {
        return shape_err("total query rows (cu_seqlens_q last)", 0, ">= 1");
    }
    if cu_k[cu_k.len() - 1] == 0 {
        return shape_err("total key rows (cu_seqlens_k last)", 0, ">= 1");
    }
    let longest = cu_k.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    if score_cols < longest {
        return shape_err(
            "score_cols",
            score_cols,
            ">= the longest key sequence of cu_seqlens_k",
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visibility_follows_offset_ratio_and_key_count() {
        let s = Shape::bshd(2, 6, 3, 16, 64)
            .with_q_offset(vec![0, -3])
            .with_ratio(2);
        assert!(s.validate().is_ok());
        // Batch 0: (s + 1) / 2, capped at 3.
        let l0: Vec<usize> = (0..6).map(|p| s.visible(0, p)).collect();
        assert_eq!(l0, [0, 1, 1, 2, 2, 3]);
        // Batch 1: (s - 2) / 2, 0 while not positive.
        let l1: Vec<usize> = (0..6).map(|p| s.visible(1, p)).collect();
        assert_eq!(l1, [0, 0, 0, 0, 1, 1]);
        assert_eq!(
            s.row(7),
            Row {
                batch: 1,
                pos: 1,
                key_start: 3,
                seq_k: 3,
                visible: 0
            }
        );
        // Offsets near the i64 limits neither overflow nor panic.
        let s = Shape::bshd(2, 2, 5, 16, 64).with_q_offset(vec![i64::MAX, i64::MIN]);
        assert_eq!((s.visible(0, 1), s.visible(1, 1)), (5, 0));
    }

    #[test]
    fn varlen_rows_find_their_batch_across_empty_sequences() {
        let s = Shape::varlen(vec![0, 2, 2, 5], vec![0, 4, 5, 5], 16, 64);
        assert!(s.validate().is_ok());
        assert_eq!(
            (s.batch(), s.rows(), s.key_rows(), s.score_cols()),
            (3, 5, 5, 4)
        );
        let rows: Vec<(usize, usize, usize, usize)> = (0..5)
            .map(|r| {
                let x = s.row(r);
                (x.batch, x.pos, x.key_start, x.visible)
            })
            .collect();
        // Batch 1 has no query rows; batch 2 has no keys.
        assert_eq!(
            rows,
            [
                (0, 0, 0, 1),
                (0, 1, 0, 2),
                (2, 0, 5, 0),
                (2, 1, 5, 0),
                (2, 2, 5, 0)
            ]
        );
    }

    #[test]
    fn bad_layouts_are_typed_errors() {
        let v = |q: Vec<usize>, k: Vec<usize>| Shape::varlen(q, k, 16, 64).validate();
        assert!(matches!(
            v(vec![0], vec![0]),
            Err(Error::Shape {
                name: "cu_seqlens_q length",
                value: 1,
                ..
            })
        ));
        assert!(matches!(
            v(vec![0, 3], vec![0, 2, 4]),
            Err(Error::Length {
                tensor: "cu_seqlens_k",
                expected: 2,
                actual: 3
            })
        ));
        assert!(matches!(
            v(vec![1, 3], vec![0, 2]),
            Err(Error::CuSeqlens {
                tensor: "cu_seqlens_q",
                index: 0,
                value: 1,
                ..
            })
        ));
        assert!(matches!(
            v(vec![0, 3, 6], vec![0, 4, 2]),
            Err(Error::CuSeqlens {
                tensor: "cu_seqlens_k",
                index: 2,
                value: 2,
                ..
            })
        ));
        assert!(matches!(
            v(vec![0, 0], vec![0, 2]),
            Err(Error::Shape { value: 0, .. })
        ));
        let mut s = Shape::varlen(vec![0, 3], vec![0, 4], 16, 64);
        if let Layout::Varlen { score_cols, .. } = &mut s.layout {
            *score_cols = 3;
        }
        assert!(matches!(
            s.validate(),
            Err(Error::Shape {
                name: "score_cols",
                value: 3,
                ..
            })
        ));
        let b = Shape::bshd(2, 4, 4, 16, 64);
        assert!(matches!(
            b.clone().with_ratio(0).validate(),
            Err(Error::Shape { name: "ratio", .. })
        ));
        assert!(matches!(
            b.clone().with_q_offset(vec![0]).validate(),
            Err(Error::Length {
                tensor: "q_offset",
                expected: 2,
                actual: 1
            })
        ));
        assert!(matches!(
            Shape::bshd(2, 4, 4, 48, 64).validate(),
            Err(Error::Shape { name: "heads", .. })
        ));
        assert!(matches!(
            Shape::bshd(1, 0, 4, 16, 64).validate(),
            Err(Error::Shape { name: "seq_q", .. })
        ));
        assert!(matches!(
            Shape::bshd(1 << 20, 1 << 12, 4, 16, 64).validate(),
            Err(Error::Shape {
                name: "query rows",
                ..
            })
        ));
    }
}
