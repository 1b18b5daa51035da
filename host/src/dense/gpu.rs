//! Dense mode on the GPU, through the sparse path's Hopper kernels: a
//! dense stage 1 (`indexer_dense_score_grad`: the score gradient of the
//! raw scores over each row's visible columns, written over
//! `index_score`, the zeroed dK accumulator, the chunk counts), then the
//! wgmma kernels of the equivalent sparse problem as its programmatic
//! dependents: one batch of `rows` query rows, `topk = cols` slots per
//! row, slot `j` holding key `j` of the row's batch for `j < L` and
//! padding beyond, with grad_signal read from `index_score`.
//!
//! The ids of that problem depend on the shape alone, so the plan builds
//! them once, on the host, and keeps them on the device (4 bytes per
//! score element, [`MAX_GPU_SCORES`]). This is an interim kernel design:
//! every visible (row, key) pair still gathers its K row and reduces its
//! dK row, where a dense kernel would load K tiles whole and reduce dK
//! once per key tile.

use super::shape::Shape;
use crate::cpu::try_vec;
use crate::error::Result;
use crate::gpu;
use crate::launch::sm90::{self as sm90_path, Wgmma};
use crate::launch::Cast;
use crate::select::{select, PathKind};
use crate::shape::{Backend, GradDtype, Options, Shape as SparseShape};
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr};
use kernels_gpu::abi::{
    DenseParams, GradParams, DENSE_STAGE1_SMEM, DENSE_STAGE1_THREADS, FLAG_DW_F32, FLAG_ROW_CHUNKS,
};
use kernels_gpu::registry::DENSE_STAGE1;
use std::sync::Arc;

/// The most score elements (`rows x cols`) a plan runs on the GPU: its
/// key ids take 4 bytes each (2 GiB at this limit). Larger problems get
/// `Error::NotImplemented` from `execute`.
pub const MAX_GPU_SCORES: usize = 1 << 29;

/// The device addresses of one checked call, in the order of
/// `dense::Inputs` and `dense::Outputs` (`dk`: `d_index_k`; `ws`: the
/// workspace, 0 when absent).
pub(super) struct Ptrs {
    pub q: u64,
    pub w: u64,
    pub k: u64,
    pub attn: u64,
    pub l1: u64,
    pub lse: u64,
    pub grad_loss: u64,
    pub score: u64,
    pub dq: u64,
    pub dw: u64,
    pub dk: u64,
    pub ws: u64,
}

/// The GPU half of a dense plan: the loaded kernels and the shape's key
/// ids and visible counts on the device.
pub(super) struct DenseGpu {
    stage1: CudaFunction,
    wgmma: Wgmma,
    cast: Cast,
    /// The equivalent sparse shape the wgmma kernels run.
    sparse: SparseShape,
    /// `(rows, cols)` global key ids: `key_start + j` for `j < L`, -1 beyond.
    ids: CudaSlice<i32>,
    /// `(rows,)` visible counts `L`.
    visible: CudaSlice<u32>,
    /// Whether stage 1 writes chunk counts (`FLAG_ROW_CHUNKS`).
    row_chunks: bool,
}

/// The sparse problem a dense `shape` runs as.
fn sparse_shape(shape: &Shape) -> SparseShape {
    SparseShape {
        batch: 1,
        seq_q: shape.rows(),
        seq_k: shape.key_rows(),
        heads: shape.heads,
        head_dim: shape.head_dim,
        topk: shape.score_cols(),
    }
}

impl DenseGpu {
    /// The GPU half for `shape` on `ctx`, or `None` where it does not run:
    /// a GPU other than compute capability 9.0 (the wgmma kernels are in
    /// the `sm_90a` module only), 64 columns or fewer, more than
    /// [`MAX_GPU_SCORES`] score elements, or a sparse shape the wgmma path
    /// does not take.
    pub(super) fn new(ctx: &Arc<CudaContext>, shape: &Shape) -> Result<Option<DenseGpu>> {
        let sparse = sparse_shape(shape);
        let (rows, cols) = (shape.rows(), shape.score_cols());
        if rows.saturating_mul(cols) > MAX_GPU_SCORES || sparse.validate().is_err() {
            return Ok(None);
        }
        let (major, minor) = ctx.compute_capability()?;
        let Ok(sel) = select(major, minor, &sparse, Backend::Hopper) else {
            return Ok(None);
        };
        let Ok(PathKind::Sm90 { row, paired }) = PathKind::choose(&sel, &sparse) else {
            return Ok(None);
        };
        let module = sel.module.load(ctx)?;
        let stage1 = module.load_function(DENSE_STAGE1.name)?;
        let wgmma = Wgmma::new(ctx, &module, &sparse, row, paired)?;
        let cast = Cast::new(&module)?;
        let (ids, visible) = key_ids(shape)?;
        let stream = ctx.default_stream();
        let ids = stream.clone_htod(&ids)?;
        let visible = stream.clone_htod(&visible)?;
        stream.synchronize()?;
        Ok(Some(DenseGpu {
            stage1,
            wgmma,
            cast,
            row_chunks: sm90_path::row_chunks(&sparse),
            sparse,
            ids,
            visible,
        }))
    }

    /// Launches stage 1, the wgmma kernels and (bf16 `d_index_k`) the
    /// cast on `stream`.
    ///
    /// # Safety
    /// `p` passed the dense plan's checks for the shape this was built for
    /// (lengths, alignment, contexts, overlaps, workspace), on `stream`'s
    /// context, and `p.ws` holds the f32 accumulator when `d_index_k` is
    /// bf16.
    pub(super) unsafe fn launch(
        &self,
        stream: &CudaStream,
        p: &Ptrs,
        opts: &Options,
        loss_coeff: f32,
    ) -> Result<()> {
        let s = &self.sparse;
        let accum = match opts.d_index_k {
            GradDtype::F32 => p.dk,
            GradDtype::Bf16 => p.ws,
        };
        let mut flags = 0;
        if opts.d_weights == GradDtype::F32 {
            flags |= FLAG_DW_F32;
        }
        if self.row_chunks {
            flags |= FLAG_ROW_CHUNKS;
        }
        let coeff = (loss_coeff as f64 / s.seq_q as f64) as f32;
        let (ids, _g1) = self.ids.device_ptr(stream);
        let (visible, _g2) = self.visible.device_ptr(stream);
        let d = DenseParams {
            attn_score: p.attn,
            attn_l1norm: p.l1,
            index_score: p.score,
            index_lse: p.lse,
            grad_loss: p.grad_loss,
            visible,
            d_weights: p.dw,
            dk_accum: accum,
            dk_len: s.k_len() as u64,
            rows: s.seq_q as u32,
            cols: s.topk as u32,
            coeff,
            flags,
            heads: s.heads as u32,
            _pad: 0,
        };
        // Stage 2 reads grad_signal where stage 1 wrote it (`index_score`)
        // and the plan's key ids; it never reads `index_score` as scores.
        let g = GradParams {
            index_q: p.q,
            weights: p.w,
            index_k: p.k,
            attn_score: p.score,
            index_score: p.score,
            topk_indices: ids,
            grad_loss: p.grad_loss,
            d_index_q: p.dq,
            d_weights: p.dw,
            dk_accum: accum,
            batch: 1,
            seq_q: s.seq_q as u32,
            seq_k: s.seq_k as u32,
            topk: s.topk as u32,
            sm_scale: opts.sm_scale,
            coeff,
            flags,
            heads: s.heads as u32,
        };
        // SAFETY: stage 1's launch contract: one CTA of
        // DENSE_STAGE1_THREADS per row with DENSE_STAGE1_SMEM bytes, the
        // buffers of `d` checked (rows x cols scores, per-row inputs, the
        // accumulator of k_len f32, 16-byte aligned), `visible[r] <= cols`
        // by construction, FLAG_ROW_CHUNKS only as the sparse path sets
        // it. Then the wgmma kernels of the sparse shape on the same
        // buffers (ids of the plan: valid key rows or -1), as stage 1's
        // programmatic dependents, and the cast of the checked workspace.
        unsafe {
            gpu::launch(
                stream,
                &self.stage1,
                s.seq_q as u32,
                DENSE_STAGE1_THREADS,
                DENSE_STAGE1_SMEM,
                &d,
            )?;
            self.wgmma.launch_stage2(stream, g)?;
            if opts.d_index_k == GradDtype::Bf16 {
                self.cast.launch(stream, s, p.ws, p.dk)?;
            }
        }
        Ok(())
    }
}

/// The equivalent sparse problem's key ids (`(rows, cols)`, global) and
/// each row's visible count.
fn key_ids(shape: &Shape) -> Result<(Vec<i32>, Vec<u32>)> {
    let (rows, cols) = (shape.rows(), shape.score_cols());
    let mut ids = try_vec(rows * cols, -1i32, "dense key ids")?;
    let mut visible = try_vec(rows, 0u32, "dense visible counts")?;
    for (r, (row_ids, vis)) in ids.chunks_mut(cols.max(1)).zip(&mut visible).enumerate() {
        let row = shape.row(r);
        *vis = row.visible as u32;
        for (j, id) in row_ids[..row.visible].iter_mut().enumerate() {
            *id = (row.key_start + j) as i32;
        }
    }
    Ok((ids, visible))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_ids_follow_each_row_s_batch_and_visible_columns() {
        // Two batches of 3 query rows over 4 keys, offsets 0 and 1.
        let s = Shape::bshd(2, 3, 4, 16, 64).with_q_offset(vec![0, 1]);
        let (ids, vis) = key_ids(&s).unwrap();
        assert_eq!(vis, [1, 2, 3, 2, 3, 4]);
        assert_eq!(&ids[..4], [0, -1, -1, -1]);
        assert_eq!(&ids[8..12], [0, 1, 2, -1]);
        // Batch 1's keys start at row 4.
        assert_eq!(&ids[12..16], [4, 5, -1, -1]);
        assert_eq!(&ids[20..24], [4, 5, 6, 7]);
        let t = sparse_shape(&s);
        assert_eq!((t.batch, t.seq_q, t.seq_k, t.topk), (1, 6, 8, 4));
    }
}
