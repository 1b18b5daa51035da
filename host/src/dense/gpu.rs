//! Dense mode on the GPU: dense stage 1 (`indexer_dense_score_grad`: the
//! score gradient of the raw scores over each row's visible columns,
//! written over `index_score`), then stage 2 as its programmatic
//! dependent, by one of two strategies:
//! - **tiles** (H = 64, D = 128): dense mode's own kernel
//!   (`kernels_gpu::dense_wg`): K and q tiles loaded whole, dQ and
//!   d_weights per row item, dK per key item, each output written once;
//!   the plan holds the work items and visible counts (about 40 bytes per
//!   query row).
//! - **sparse** (other shapes): the wgmma kernels of the equivalent sparse
//!   problem: one batch of `rows` query rows, `topk = cols` slots per
//!   row, slot `j` holding key `j` of the row's batch for `j < L` and
//!   padding beyond, with grad_signal read from `index_score`. Its ids
//!   depend on the shape alone, so the plan builds them once and keeps
//!   them on the device (4 bytes per score element, [`MAX_GPU_SCORES`]);
//!   every visible (row, key) pair gathers its K row and reduces its dK
//!   row. Stage 1 also zeroes the dK accumulator and writes the chunk
//!   counts for it.

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
    DenseParams, DenseTileParams, GradParams, DENSE_STAGE1_SMEM, DENSE_STAGE1_THREADS,
    DENSE_TILE_THREADS, FLAG_DK_BF16, FLAG_DW_F32, FLAG_ROW_CHUNKS,
};
use kernels_gpu::registry::{DENSE_STAGE1, DENSE_WG};
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

/// The GPU half of a dense plan: the loaded kernels, each row's visible
/// count on the device, and the stage-2 strategy.
pub(super) struct DenseGpu {
    stage1: CudaFunction,
    /// `(rows,)` visible counts `L`.
    visible: CudaSlice<u32>,
    rows: usize,
    cols: usize,
    heads: usize,
    /// Elements of `d_index_k`.
    k_len: usize,
    stage2: Stage2,
}

/// How stage 2 runs (module note).
enum Stage2 {
    /// Dense mode's tile kernel on the plan's work items.
    Tiles {
        kernel: CudaFunction,
        items: CudaSlice<u32>,
        n_items: u32,
    },
    /// The sparse path's wgmma kernels on the equivalent sparse problem.
    Sparse {
        wgmma: Wgmma,
        cast: Cast,
        /// The equivalent sparse shape.
        sparse: SparseShape,
        /// `(rows, cols)` global key ids: `key_start + j` for `j < L`, -1 beyond.
        ids: CudaSlice<i32>,
        /// Whether stage 1 writes chunk counts (`FLAG_ROW_CHUNKS`).
        row_chunks: bool,
    },
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
    /// a GPU other than compute capability 9.0 (the kernels are in the
    /// `sm_90a` module only), or a shape other than H = 64, D = 128 that
    /// the sparse strategy does not take (64 columns or fewer, more than
    /// [`MAX_GPU_SCORES`] score elements, or outside the wgmma path).
    pub(super) fn new(ctx: &Arc<CudaContext>, shape: &Shape) -> Result<Option<DenseGpu>> {
        let sparse = sparse_shape(shape);
        let (rows, cols) = (shape.rows(), shape.score_cols());
        let (major, minor) = ctx.compute_capability()?;
        let Ok(sel) = select(major, minor, &sparse, Backend::Hopper) else {
            return Ok(None);
        };
        let tiles = (major, minor) == (9, 0) && shape.heads == 64 && shape.head_dim == 128;
        let stream = ctx.default_stream();
        let (stage2, visible) = if tiles {
            let module = sel.module.load(ctx)?;
            let kernel = module.load_function(DENSE_WG.name)?;
            gpu::set_dynamic_smem(&kernel, kernels_gpu::dense_wg::SMEM.bytes)?;
            let (items, visible) = super::tiles::items(shape)?;
            let n_items = items.len() as u32;
            let flat: Vec<u32> = items.into_iter().flatten().collect();
            let items = stream.clone_htod(&flat)?;
            let stage2 = Stage2::Tiles {
                kernel,
                items,
                n_items,
            };
            (stage2, visible)
        } else {
            if rows.saturating_mul(cols) > MAX_GPU_SCORES || sparse.validate().is_err() {
                return Ok(None);
            }
            let Ok(PathKind::Sm90 { row, paired }) = PathKind::choose(&sel, &sparse) else {
                return Ok(None);
            };
            let module = sel.module.load(ctx)?;
            let wgmma = Wgmma::new(ctx, &module, &sparse, row, paired)?;
            let cast = Cast::new(&module)?;
            let (ids, visible) = key_ids(shape)?;
            let stage2 = Stage2::Sparse {
                wgmma,
                cast,
                row_chunks: sm90_path::row_chunks(&sparse),
                sparse,
                ids: stream.clone_htod(&ids)?,
            };
            (stage2, visible)
        };
        let module = sel.module.load(ctx)?;
        let stage1 = module.load_function(DENSE_STAGE1.name)?;
        let visible = stream.clone_htod(&visible)?;
        stream.synchronize()?;
        Ok(Some(DenseGpu {
            stage1,
            visible,
            rows,
            cols,
            heads: shape.heads,
            k_len: shape.k_len(),
            stage2,
        }))
    }

    /// Whether `execute` needs the f32 dK workspace for a bf16
    /// `d_index_k` (the sparse strategy accumulates in it; the tile
    /// kernel writes dK once, in its type).
    pub(super) fn needs_workspace(&self) -> bool {
        matches!(self.stage2, Stage2::Sparse { .. })
    }

    /// Launches stage 1 and stage 2 (and, sparse strategy with a bf16
    /// `d_index_k`, the cast) on `stream`.
    ///
    /// # Safety
    /// `p` passed the dense plan's checks for the shape this was built for
    /// (lengths, alignment, contexts, overlaps, workspace), on `stream`'s
    /// context, and `p.ws` holds the f32 accumulator when `d_index_k` is
    /// bf16 and [`DenseGpu::needs_workspace`].
    pub(super) unsafe fn launch(
        &self,
        stream: &CudaStream,
        p: &Ptrs,
        opts: &Options,
        loss_coeff: f32,
    ) -> Result<()> {
        let mut flags = 0;
        if opts.d_weights == GradDtype::F32 {
            flags |= FLAG_DW_F32;
        }
        let coeff = (loss_coeff as f64 / self.rows as f64) as f32;
        let (visible, _g1) = self.visible.device_ptr(stream);
        let mut d = DenseParams {
            attn_score: p.attn,
            attn_l1norm: p.l1,
            index_score: p.score,
            index_lse: p.lse,
            grad_loss: p.grad_loss,
            visible,
            d_weights: p.dw,
            dk_accum: 0,
            dk_len: 0,
            rows: self.rows as u32,
            cols: self.cols as u32,
            coeff,
            flags,
            heads: self.heads as u32,
            _pad: 0,
        };
        match &self.stage2 {
            Stage2::Tiles {
                kernel,
                items,
                n_items,
            } => {
                let (items, _g2) = items.device_ptr(stream);
                if opts.d_index_k == GradDtype::Bf16 {
                    flags |= FLAG_DK_BF16;
                }
                let t = DenseTileParams {
                    index_q: p.q,
                    weights: p.w,
                    index_k: p.k,
                    grad_signal: p.score,
                    visible,
                    items,
                    d_index_q: p.dq,
                    d_weights: p.dw,
                    d_index_k: p.dk,
                    n_items: *n_items,
                    cols: self.cols as u32,
                    sm_scale: opts.sm_scale,
                    flags,
                };
                // SAFETY: stage 1's launch contract: one CTA of
                // DENSE_STAGE1_THREADS per row with DENSE_STAGE1_SMEM
                // bytes, the buffers of `d` checked, `visible[r] <= cols`
                // by construction, no accumulator, no chunk counts. Then
                // the tile kernel as its programmatic dependent (it waits
                // before reading grad_signal): the plan's items for this
                // shape, checked buffers, one CTA per item.
                unsafe {
                    gpu::launch(
                        stream,
                        &self.stage1,
                        self.rows as u32,
                        DENSE_STAGE1_THREADS,
                        DENSE_STAGE1_SMEM,
                        &d,
                    )?;
                    if *n_items > 0 {
                        gpu::launch_pdl(
                            stream,
                            kernel,
                            *n_items,
                            DENSE_TILE_THREADS,
                            kernels_gpu::dense_wg::SMEM.bytes,
                            &t,
                        )?;
                    }
                }
            }
            Stage2::Sparse {
                wgmma,
                cast,
                sparse: s,
                ids,
                row_chunks,
            } => {
                let accum = match opts.d_index_k {
                    GradDtype::F32 => p.dk,
                    GradDtype::Bf16 => p.ws,
                };
                if *row_chunks {
                    flags |= FLAG_ROW_CHUNKS;
                }
                d.flags = flags;
                d.dk_accum = accum;
                d.dk_len = self.k_len as u64;
                let (ids, _g2) = ids.device_ptr(stream);
                // Stage 2 reads grad_signal where stage 1 wrote it
                // (`index_score`) and the plan's key ids; it never reads
                // `index_score` as scores.
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
                // SAFETY: stage 1's launch contract as above, with the
                // accumulator of k_len f32 (16-byte aligned) and
                // FLAG_ROW_CHUNKS only as the sparse path sets it. Then
                // the wgmma kernels of the sparse shape on the same
                // buffers (ids of the plan: valid key rows or -1), as
                // stage 1's programmatic dependents, and the cast of the
                // checked workspace.
                unsafe {
                    gpu::launch(
                        stream,
                        &self.stage1,
                        self.rows as u32,
                        DENSE_STAGE1_THREADS,
                        DENSE_STAGE1_SMEM,
                        &d,
                    )?;
                    wgmma.launch_stage2(stream, g)?;
                    if opts.d_index_k == GradDtype::Bf16 {
                        cast.launch(stream, s, p.ws, p.dk)?;
                    }
                }
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
