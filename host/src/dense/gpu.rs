//! Dense mode on the GPU: dense stage 1 (`indexer_dense_score_grad`: the
//! score gradient of the raw scores over each row's visible columns,
//! written over `index_score`), then stage 2 as its programmatic
//! dependent, by one of two strategies:
//! - **tiles** (H = 64, D = 128): dense mode's own kernel
//!   (`kernels_gpu::sm90::dense`): K and q tiles loaded whole by TMA (two
//!   tensor maps encoded per call at the call's addresses), dQ and
//!   d_weights written once per row, dK reduced once per key item (128
//!   keys against a run of up to 256 rows); the plan holds the work items
//!   and visible counts (about 30 bytes per query row).
//! - **sparse** (other shapes): the wgmma kernels of the equivalent sparse
//!   problem: one batch of `rows` query rows, `topk = cols` slots per
//!   row, slot `j` holding key `j` of the row's batch for `j < L` and
//!   padding beyond, with grad_signal read from `index_score`. Its ids
//!   depend on the shape alone, so the plan builds them once and keeps
//!   them on the device (4 bytes per score element, [`MAX_GPU_SCORES`]);
//!   every visible (row, key) pair gathers its K row and reduces its dK
//!   row. Stage 1 also writes the chunk counts for it.
//!
//! Both accumulate dK in f32 (in `d_index_k`, or in the workspace and then
//! cast when that is bf16), zeroed by stage 1.
//!
//! In deterministic mode (`Options::deterministic`) the tile strategy runs
//! the tile kernel's twin, which adds each key item's sums in a fixed
//! order (`kernels_gpu::sm90::dense::turns`; its turn table in the workspace,
//! zeroed before stage 1), and the sparse strategy runs the sparse path's
//! deterministic passes and twins (`kernels_gpu::det`: a fixed-point
//! accumulator in the workspace, `det_finish` writes `d_index_k`).

use super::shape::Shape;
use crate::cpu::try_vec;
use crate::error::Result;
use crate::gpu;
use crate::launch::sm90::{self as sm90_path, Wgmma};
use crate::launch::Cast;
use crate::launch::DetOut;
use crate::select::{select, PathKind};
use crate::shape::{Backend, GradDtype, Options, Shape as SparseShape};
use crate::tma::{encode, TiledArgs};
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr};
use kernels_gpu::abi::TensorMap;
use kernels_gpu::abi::{
    DenseDetTileParams, DenseParams, DenseTileParams, GradParams, DENSE_STAGE1_SMEM,
    DENSE_STAGE1_THREADS, DENSE_TILE_THREADS, FLAG_DW_F32, FLAG_ROW_CHUNKS,
};
use kernels_gpu::registry::{DENSE_STAGE1, DENSE_WG, DENSE_WG_DET};
use kernels_gpu::tma::q_tile_map;

/// The tile kernel's tensor-map geometry: `(index_k, index_q)`.
type MapArgs = (TiledArgs, TiledArgs);
/// The tile kernel's tensor maps of one call: `(index_k, index_q)`.
type Maps = (TensorMap, TensorMap);
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
    cast: Cast,
    /// `(rows,)` visible counts `L`.
    visible: CudaSlice<u32>,
    /// The equivalent sparse shape: the sparse strategy's problem, and the
    /// sizes of both (rows, columns, heads, `d_index_k`).
    sparse: SparseShape,
    stage2: Stage2,
    /// The module the kernels come from, shared with every plan on the
    /// context (`crate::modules`).
    module: Arc<crate::modules::Loaded>,
}

/// How stage 2 runs (module note).
enum Stage2 {
    /// Dense mode's tile kernel on the plan's work items.
    Tiles {
        /// The tile kernel, or its deterministic twin (the plan's
        /// `Options::deterministic`).
        kernel: CudaFunction,
        items: CudaSlice<u32>,
        n_items: u32,
        /// 128-key tiles of the items (the twin's chains).
        tiles: u32,
        /// Geometry of the tensor maps over `index_k` and `index_q`,
        /// encoded per call at the call's addresses.
        maps: MapArgs,
    },
    /// The sparse path's wgmma kernels on the equivalent sparse problem.
    Sparse {
        wgmma: Wgmma,
        /// `(rows, cols)` global key ids: `key_start + j` for `j < L`, -1 beyond.
        ids: CudaSlice<i32>,
        /// Whether stage 1 writes chunk counts (`FLAG_ROW_CHUNKS`).
        row_chunks: bool,
    },
}

/// The tile kernel's map over a bf16 `(rows, 128)` matrix: boxes of 64
/// rows x 64 columns (one 128-byte swizzle block of a tile).
fn tile_map(rows: usize) -> Result<TiledArgs> {
    use kernels_gpu::sm90::dense::{DIM, TILE_KEYS};
    let m =
        q_tile_map(rows as u64, DIM, 64, TILE_KEYS).map_err(|_| crate::error::Error::Shape {
            name: "tensor map",
            value: rows,
            expected: "a TMA-encodable bf16 matrix of 128 columns",
        })?;
    Ok(TiledArgs::of(&m))
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
    pub(super) fn new(
        ctx: &Arc<CudaContext>,
        shape: &Shape,
        deterministic: bool,
    ) -> Result<Option<DenseGpu>> {
        let sparse = sparse_shape(shape);
        let (rows, cols) = (shape.rows(), shape.score_cols());
        let (major, minor) = ctx.compute_capability()?;
        let Ok(sel) = select(major, minor, &sparse, Backend::Hopper) else {
            return Ok(None);
        };
        let tiles = (major, minor) == (9, 0) && shape.heads == 64 && shape.head_dim == 128;
        let path = if tiles {
            None
        } else {
            if rows.saturating_mul(cols) > MAX_GPU_SCORES || sparse.validate().is_err() {
                return Ok(None);
            }
            match PathKind::choose(&sel, &sparse) {
                Ok(PathKind::Sm90 { row, paired }) => Some((row, paired)),
                _ => return Ok(None),
            }
        };
        let module = crate::modules::get(ctx, sel.module)?;
        let stream = ctx.default_stream();
        let stage2 = match path {
            None => {
                let name = if deterministic {
                    DENSE_WG_DET.name
                } else {
                    DENSE_WG.name
                };
                let kernel = module.kernel_with_smem(name, kernels_gpu::sm90::dense::SMEM.bytes)?;
                let (items, tiles) = super::tiles::items(shape)?;
                let n_items = items.len() as u32;
                let items = stream.clone_htod(items.as_flattened())?;
                let heads = kernels_gpu::sm90::dense::HEADS as usize;
                Stage2::Tiles {
                    kernel,
                    items,
                    n_items,
                    tiles,
                    maps: (tile_map(shape.key_rows())?, tile_map(rows * heads)?),
                }
            }
            Some((row, paired)) => {
                let wgmma = Wgmma::new(ctx, &module, &sparse, row, paired, deterministic)?;
                Stage2::Sparse {
                    wgmma,
                    row_chunks: sm90_path::row_chunks(&sparse),
                    ids: stream.clone_htod(&key_ids(shape)?)?,
                }
            }
        };
        let gpu = DenseGpu {
            stage1: module.kernel(DENSE_STAGE1.name)?,
            cast: Cast::new(&module)?,
            visible: stream.clone_htod(&visible_counts(shape)?)?,
            sparse,
            stage2,
            module,
        };
        stream.synchronize()?;
        Ok(Some(gpu))
    }

    /// What the kernel module was loaded from.
    pub(super) fn module_image(&self) -> crate::ModuleImage {
        self.module.image()
    }

    /// Workspace bytes a call needs (`dense::Plan::workspace_bytes`), in
    /// the order of [`WsLayout`].
    pub(super) fn workspace_bytes(&self, opts: &Options) -> usize {
        self.ws_layout(opts).bytes as usize
    }

    /// Where the workspace's parts lie for `opts` (the plan's).
    fn ws_layout(&self, opts: &Options) -> WsLayout {
        let up = |x: u64| x.div_ceil(16) * 16;
        let k_len = self.sparse.k_len() as u64;
        let cast = match opts.d_index_k {
            GradDtype::F32 => 0,
            GradDtype::Bf16 => up(4 * k_len),
        };
        match (&self.stage2, opts.deterministic) {
            (Stage2::Tiles { tiles, .. }, true) => {
                let words =
                    kernels_gpu::sm90::dense::turn_words(kernels_gpu::sm90::dense::chains(*tiles));
                WsLayout {
                    turns: Some(cast),
                    bytes: cast + up(4 * words as u64),
                }
            }
            (Stage2::Sparse { .. }, true) => WsLayout {
                turns: None,
                bytes: self.sparse.det_layout().bytes,
            },
            (_, false) => WsLayout {
                turns: None,
                bytes: cast,
            },
        }
    }

    /// Launches stage 1, stage 2 and (bf16 `d_index_k`) the cast on
    /// `stream`.
    ///
    /// # Safety
    /// `p` passed the dense plan's checks for the shape this was built for
    /// (lengths, alignment, contexts, overlaps, workspace), on `stream`'s
    /// context, and `p.ws` holds [`DenseGpu::workspace_bytes`] for `opts`,
    /// the options this was built with (their `deterministic` chose the
    /// kernels).
    pub(super) unsafe fn launch(
        &self,
        stream: &CudaStream,
        p: &Ptrs,
        opts: &Options,
        loss_coeff: f32,
    ) -> Result<()> {
        let s = &self.sparse;
        let ws = self.ws_layout(opts);
        // The sparse strategy's deterministic passes keep their fixed-point
        // accumulator at the workspace's start and write d_index_k last.
        let det_sparse = opts.deterministic && matches!(self.stage2, Stage2::Sparse { .. });
        let accum = match opts.d_index_k {
            GradDtype::F32 if !det_sparse => p.dk,
            _ => p.ws,
        };
        let mut flags = 0;
        if opts.d_weights == GradDtype::F32 {
            flags |= FLAG_DW_F32;
        }
        if matches!(
            self.stage2,
            Stage2::Sparse {
                row_chunks: true,
                ..
            }
        ) {
            flags |= FLAG_ROW_CHUNKS;
        }
        // The tile kernel's maps over this call's q and K, encoded before
        // anything is launched: an encoding error leaves every buffer as
        // it was.
        let maps = match &self.stage2 {
            Stage2::Tiles { maps, .. } => Some((encode(p.k, &maps.0)?, encode(p.q, &maps.1)?)),
            Stage2::Sparse { .. } => None,
        };
        let coeff = (loss_coeff as f64 / s.seq_q as f64) as f32;
        if let Some(at) = ws.turns {
            let bytes = (ws.bytes - at) as usize;
            // SAFETY: the turn table inside the checked workspace (of
            // `ws.bytes`), before stage 1 on the same stream.
            unsafe { gpu::memset_zero(stream, p.ws + at, bytes)? };
        }
        let (visible, _g1) = self.visible.device_ptr(stream);
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
        // SAFETY: stage 1's launch contract: one CTA of
        // DENSE_STAGE1_THREADS per row with DENSE_STAGE1_SMEM bytes, the
        // buffers of `d` checked (the accumulator of k_len f32, 16-byte
        // aligned: `d_index_k` or the workspace), `visible[r] <= cols` by
        // construction, FLAG_ROW_CHUNKS only as the sparse path sets it.
        unsafe {
            gpu::launch(
                stream,
                &self.stage1,
                s.seq_q as u32,
                DENSE_STAGE1_THREADS,
                DENSE_STAGE1_SMEM,
                &d,
            )?
        };
        let call = Call {
            accum,
            flags,
            coeff,
            visible,
        };
        match &self.stage2 {
            Stage2::Tiles {
                kernel,
                items,
                n_items,
                ..
            } => {
                let Some(maps) = maps else {
                    unreachable!("the tile strategy's maps are encoded above")
                };
                let tiles = (kernel, items, *n_items, maps);
                // The turn table exists exactly in deterministic mode,
                // where `kernel` is the twin.
                let turns = ws.turns.map(|at| p.ws + at);
                // SAFETY: forwarded; stage 1 is on the stream before it,
                // the zeroed turn table before that.
                unsafe { self.launch_tiles(stream, p, opts, &call, tiles, turns)? }
            }
            Stage2::Sparse { wgmma, ids, .. } => {
                // SAFETY: forwarded; stage 1 is on the stream before it.
                unsafe { self.launch_sparse(stream, p, opts, &call, wgmma, ids)? }
            }
        }
        if opts.d_index_k == GradDtype::Bf16 && !det_sparse {
            // SAFETY: the cast of the checked workspace (k_len f32, the
            // accumulator stage 2 completed earlier on the stream) into
            // the checked bf16 d_index_k.
            unsafe { self.cast.launch(stream, s, p.ws, p.dk)? };
        }
        Ok(())
    }

    /// Stage 2 by the tile kernel, as stage 1's programmatic dependent:
    /// `(kernel, items, n_items)` are this plan's, `maps` (over `index_k`,
    /// `index_q`) this call's; `turns`, the turn table, when `kernel` is
    /// the deterministic twin.
    ///
    /// # Safety
    /// As [`DenseGpu::launch`], after stage 1 on `stream`; `turns` is
    /// `Some` exactly for the twin, a zeroed table of this plan's chains.
    unsafe fn launch_tiles(
        &self,
        stream: &CudaStream,
        p: &Ptrs,
        opts: &Options,
        call: &Call,
        (kernel, items, n_items, maps): (&CudaFunction, &CudaSlice<u32>, u32, Maps),
        turns: Option<u64>,
    ) -> Result<()> {
        let (items, _g) = items.device_ptr(stream);
        let t = DenseTileParams {
            k_map: maps.0,
            q_map: maps.1,
            index_q: p.q,
            weights: p.w,
            index_k: p.k,
            grad_signal: p.score,
            visible: call.visible,
            items,
            d_index_q: p.dq,
            d_weights: p.dw,
            dk_accum: call.accum,
            n_items,
            cols: self.sparse.topk as u32,
            sm_scale: opts.sm_scale,
            flags: call.flags,
        };
        let bytes = kernels_gpu::sm90::dense::SMEM.bytes;
        // SAFETY: the tile kernel (or its twin, with the plan's items,
        // whose chains list their turns in order, and the zeroed table) as
        // stage 1's programmatic dependent (it waits before reading
        // grad_signal or adding to the accumulator): the plan's items for
        // this shape (at least one: every row has a row item), checked
        // buffers, maps over this call's q and K, one CTA per item.
        unsafe {
            match turns {
                None => gpu::launch_pdl(stream, kernel, n_items, DENSE_TILE_THREADS, bytes, &t),
                Some(turns) => {
                    let d = DenseDetTileParams { tile: t, turns };
                    gpu::launch_pdl(stream, kernel, n_items, DENSE_TILE_THREADS, bytes, &d)
                }
            }
        }
    }

    /// Stage 2 by the sparse path's wgmma kernels on the equivalent sparse
    /// problem, as stage 1's programmatic dependents.
    ///
    /// # Safety
    /// As [`DenseGpu::launch`], after stage 1 on `stream`; `wgmma` and
    /// `ids` are this plan's.
    unsafe fn launch_sparse(
        &self,
        stream: &CudaStream,
        p: &Ptrs,
        opts: &Options,
        call: &Call,
        wgmma: &Wgmma,
        ids: &CudaSlice<i32>,
    ) -> Result<()> {
        let s = &self.sparse;
        let (ids, _g) = ids.device_ptr(stream);
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
            dk_accum: call.accum,
            batch: 1,
            seq_q: s.seq_q as u32,
            seq_k: s.seq_k as u32,
            topk: s.topk as u32,
            sm_scale: opts.sm_scale,
            coeff: call.coeff,
            flags: call.flags,
            heads: s.heads as u32,
        };
        if opts.deterministic {
            let out = DetOut {
                d_index_k: p.dk,
                bf16: opts.d_index_k == GradDtype::Bf16,
            };
            // SAFETY: as below, with the fixed-point accumulator (zeroed by
            // stage 1) at the start of the checked workspace of
            // `det_layout`'s bytes, and the checked d_index_k.
            return unsafe { wgmma.launch_det_stage2(stream, s, g, out) };
        }
        // SAFETY: the wgmma kernels of the sparse shape on the same buffers
        // (ids of the plan: valid key rows or -1).
        unsafe { wgmma.launch_stage2(stream, g) }
    }
}

/// The workspace of a call: the f32 accumulator first when `d_index_k` is
/// bf16 (default mode and the tile twin), the tile twin's turn table after
/// it, or the sparse strategy's deterministic tables (`abi::det_layout`).
struct WsLayout {
    /// Offset of the turn table, for the tile twin.
    turns: Option<u64>,
    /// Bytes in all.
    bytes: u64,
}

/// What stage 1 and stage 2 of one call share.
struct Call {
    /// The f32 dK accumulator (`d_index_k` or the workspace).
    accum: u64,
    /// `FLAG_*` bits.
    flags: u32,
    /// `loss_coeff / rows`.
    coeff: f32,
    /// The visible counts' device address.
    visible: u64,
}

/// Each query row's visible key count `L` (`Shape::visible`), in the
/// order of the flat `(rows, ...)` view.
fn visible_counts(shape: &Shape) -> Result<Vec<u32>> {
    let mut visible = try_vec(shape.rows(), 0u32, "dense visible counts")?;
    let mut row0 = 0;
    for b in 0..shape.batch() {
        let nq = shape.seq_q_of(b);
        for (s, v) in visible[row0..row0 + nq].iter_mut().enumerate() {
            *v = shape.visible(b, s) as u32;
        }
        row0 += nq;
    }
    Ok(visible)
}

/// The equivalent sparse problem's key ids (`(rows, cols)`, global).
fn key_ids(shape: &Shape) -> Result<Vec<i32>> {
    let (rows, cols) = (shape.rows(), shape.score_cols());
    let mut ids = try_vec(rows * cols, -1i32, "dense key ids")?;
    for (r, row_ids) in ids.chunks_mut(cols.max(1)).enumerate() {
        let row = shape.row(r);
        for (j, id) in row_ids[..row.visible].iter_mut().enumerate() {
            *id = (row.key_start + j) as i32;
        }
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_ids_follow_each_row_s_batch_and_visible_columns() {
        // Two batches of 3 query rows over 4 keys, offsets 0 and 1.
        let s = Shape::bshd(2, 3, 4, 16, 64).with_q_offset(vec![0, 1]);
        let ids = key_ids(&s).unwrap();
        assert_eq!(visible_counts(&s).unwrap(), [1, 2, 3, 2, 3, 4]);
        assert_eq!(&ids[..4], [0, -1, -1, -1]);
        assert_eq!(&ids[8..12], [0, 1, 2, -1]);
        // Batch 1's keys start at row 4.
        assert_eq!(&ids[12..16], [4, 5, -1, -1]);
        assert_eq!(&ids[20..24], [4, 5, 6, 7]);
        let t = sparse_shape(&s);
        assert_eq!((t.batch, t.seq_q, t.seq_k, t.topk), (1, 6, 8, 4));
    }

    #[test]
    fn visible_counts_are_each_row_s_across_batches() {
        let shapes = [
            Shape::bshd(2, 7, 300, 64, 128)
                .with_q_offset(vec![0, -3])
                .with_ratio(2),
            Shape::varlen(vec![0, 3, 3, 200], vec![0, 1, 129, 400], 64, 128)
                .with_q_offset(vec![0, 4, 100]),
        ];
        for s in shapes {
            let v = visible_counts(&s).unwrap();
            assert_eq!(v.len(), s.rows());
            assert!((0..s.rows()).all(|r| v[r] as usize == s.row(r).visible));
        }
    }
}
