//! The launches of [`crate::Plan::execute`] once its checks have passed:
//! one module per path, and what the paths share.
//!
//! A plan runs one of three paths, fixed in `Plan::new` from
//! [`PathKind`] (pure, unit-tested in `select.rs`) and held as a [`Path`]:
//! - [`rows`]: the `mma.sync` row kernels, which every module holds: any
//!   GPU, any shape the other two paths do not take;
//! - [`sm90`]: the Hopper wgmma kernels: compute capability 9.0 (`sm_90a`
//!   module), every H x D, topk > 64;
//! - [`sm100`]: the tcgen05 kernels: compute capability 10.0 / 10.3 with
//!   `Backend::Blackwell` forced, or `Auto` where
//!   [`crate::TCGEN05_VALIDATED`] lists the GPU (compiled and assembled,
//!   not executed).
//!
//! Every path runs the same stages, in this order, with a
//! [`crate::StageEvents`] mark after each when profiled: `start`; zeroing of the
//! f32 dK accumulator and stage 1 (score gradient) -> `zeroed`; stage 2
//! (gradients) -> `gradients`; the cast when `d_index_k` is bf16 -> `end`.
//! [`launch`] holds that order; this module also builds the kernel
//! parameters and holds the cast, which every path may end with.
//! `common` holds what the path modules share ([`Run`], the stage-1
//! launch), so that they import only it and not this module.
//!
//! These modules take plain values (device addresses in the plain struct
//! [`crate::args::Ptrs`], shape, options): they never call the checks,
//! and nothing here imports the plan.

mod common;
pub(crate) mod rows;
pub(crate) mod sm100;
pub(crate) mod sm90;

pub(crate) use common::{DetOut, Run};

use crate::args::Ptrs;
use crate::error::Result;
use crate::gpu;
use crate::modules::Loaded;
use crate::select::PathKind;
use crate::shape::{Backend, GradDtype, KeyIds, Options, ScoreKind, Shape};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
use kernels_gpu::abi::{
    CastParams, GradParams, CAST_THREADS, CAST_VEC, FLAG_DW_F32, FLAG_LOCAL_IDS, FLAG_LOG_SCORE,
    FLAG_ROW_CHUNKS,
};
use kernels_gpu::registry::CAST;
use std::sync::Arc;

/// The loaded kernels of a plan's path.
pub(crate) enum Path {
    /// The `mma.sync` row kernel after a memset.
    Rows(rows::RowKernel),
    /// Stage 1, then the Hopper wgmma kernel(s) as programmatic dependents.
    Sm90(sm90::Wgmma),
    /// Stage 1, then the tcgen05 stage 2 as its programmatic dependent.
    Sm100(sm100::Sm100Kernels),
}

impl Path {
    /// Loads and configures the kernels of `kind` from `module` (the module
    /// of a GPU of compute capability `cc`) for `shape`; `deterministic`
    /// (the Hopper fast path only: `Plan::new` refuses it elsewhere) also
    /// loads the deterministic mode's kernels.
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        module: &Loaded,
        kind: PathKind,
        shape: &Shape,
        cc: (i32, i32),
        deterministic: bool,
    ) -> Result<Path> {
        Ok(match kind {
            PathKind::Rows { kernel } => {
                Path::Rows(rows::RowKernel::new(ctx, module, kernel, shape, cc)?)
            }
            PathKind::Sm90 { row, paired } => Path::Sm90(sm90::Wgmma::new(
                ctx,
                module,
                shape,
                row,
                paired,
                deterministic,
            )?),
            PathKind::Sm100 { stage2 } => {
                Path::Sm100(sm100::Sm100Kernels::new(ctx, module, shape, stage2)?)
            }
        })
    }

    /// The backend this path belongs to.
    pub(crate) fn backend(&self) -> Backend {
        match self {
            Path::Sm100(_) => Backend::Blackwell,
            Path::Rows(_) | Path::Sm90(_) => Backend::Hopper,
        }
    }

    /// Whether stage 1 counts each row's live chunks for stage 2 to skip
    /// the rest ([`FLAG_ROW_CHUNKS`]): only the wgmma kernel reads them.
    pub(crate) fn row_chunks(&self, shape: &Shape) -> bool {
        matches!(self, Path::Sm90(_)) && sm90::row_chunks(shape)
    }
}

/// The f32 -> bf16 cast of the dK accumulator, loaded by every plan.
pub(crate) struct Cast(CudaFunction);

impl Cast {
    /// Takes the cast kernel (every module holds it).
    pub(crate) fn new(module: &Loaded) -> Result<Cast> {
        Ok(Cast(module.kernel(CAST.name)?))
    }

    /// Casts `shape.k_len()` f32 elements at `src` into bf16 at `dst`.
    ///
    /// # Safety
    /// `src` and `dst` checked for a plan of `shape` (`args::check`, or
    /// dense mode's checks for its sparse-equivalent shape).
    pub(crate) unsafe fn launch(
        &self,
        stream: &CudaStream,
        shape: &Shape,
        src: u64,
        dst: u64,
    ) -> Result<()> {
        let c = CastParams {
            src,
            dst,
            len: shape.k_len() as u64,
        };
        let per_block = (CAST_THREADS * CAST_VEC) as usize;
        let grid = shape.k_len().div_ceil(per_block).min(65_535) as u32;
        // SAFETY: forwarded; the cast kernel's launch contract (a
        // grid-stride loop, so any grid covers `len`).
        unsafe { gpu::launch(stream, &self.0, grid, CAST_THREADS, 0, &c) }
    }
}

/// Every launch of one call, in stage order (module docs), with the
/// events of `run` recorded between the stages.
///
/// # Safety
/// `run.params` and `run.cast` hold addresses that passed `args::check`
/// for the plan whose `path` and `cast` these are.
pub(crate) unsafe fn launch(path: &Path, cast: &Cast, run: &Run<'_>) -> Result<()> {
    run.mark(|e| &e.start)?;
    // SAFETY: forwarded from the caller; each path's `launch` keeps its
    // kernels' launch contracts.
    unsafe {
        match path {
            Path::Rows(k) => k.launch(run)?,
            Path::Sm90(k) => k.launch(run)?,
            Path::Sm100(k) => k.launch(run)?,
        }
        if let Some((src, dst)) = run.cast {
            cast.launch(run.stream, run.shape, src, dst)?;
        }
    }
    run.mark(|e| &e.end)
}

/// The `flags` word of [`GradParams`] for `opts`, with
/// [`FLAG_ROW_CHUNKS`] when the path asks for chunk counts.
pub(crate) fn flags(opts: &Options, row_chunks: bool) -> u32 {
    let mut flags = 0;
    if opts.key_ids == KeyIds::Local {
        flags |= FLAG_LOCAL_IDS;
    }
    if opts.score == ScoreKind::LogProbs {
        flags |= FLAG_LOG_SCORE;
    }
    if opts.d_weights == GradDtype::F32 {
        flags |= FLAG_DW_F32;
    }
    if row_chunks {
        flags |= FLAG_ROW_CHUNKS;
    }
    flags
}

/// The parameters of stage 1 and stage 2: checked addresses `p`, the f32
/// dK accumulator `dk_accum`, sizes, `sm_scale`, and `loss_coeff / (B *
/// S_q)` (`grad_loss` is multiplied in on the device).
pub(crate) fn grad_params(
    p: &Ptrs,
    dk_accum: u64,
    shape: &Shape,
    opts: &Options,
    loss_coeff: f32,
    flags: u32,
) -> GradParams {
    GradParams {
        index_q: p.index_q,
        weights: p.weights,
        index_k: p.index_k,
        attn_score: p.attn_score,
        index_score: p.index_score,
        topk_indices: p.topk_indices,
        grad_loss: p.grad_loss,
        d_index_q: p.d_index_q,
        d_weights: p.d_weights,
        dk_accum,
        batch: shape.batch as u32,
        seq_q: shape.seq_q as u32,
        seq_k: shape.seq_k as u32,
        topk: shape.topk as u32,
        sm_scale: opts.sm_scale,
        coeff: (loss_coeff as f64 / shape.rows() as f64) as f32,
        flags,
        heads: shape.heads as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_follow_the_options() {
        let o = Options::default();
        assert_eq!(flags(&o, false), 0, "global ids, probs, bf16 d_weights");
        assert_eq!(flags(&o, true), FLAG_ROW_CHUNKS);
        let all = Options {
            key_ids: KeyIds::Local,
            score: ScoreKind::LogProbs,
            d_weights: GradDtype::F32,
            ..o
        };
        assert_eq!(
            flags(&all, true),
            FLAG_LOCAL_IDS | FLAG_LOG_SCORE | FLAG_DW_F32 | FLAG_ROW_CHUNKS
        );
        // d_index_k's type is not a kernel flag: the cast handles it.
        let bf16_dk = Options {
            d_index_k: GradDtype::Bf16,
            ..o
        };
        assert_eq!(flags(&bf16_dk, false), 0);
    }

    #[test]
    fn params_carry_the_addresses_sizes_and_the_per_row_coefficient() {
        let shape = Shape {
            batch: 2,
            seq_q: 3,
            seq_k: 5,
            heads: 16,
            head_dim: 64,
            topk: 7,
        };
        let opts = Options {
            sm_scale: 0.5,
            ..Options::default()
        };
        let ptrs = Ptrs {
            index_q: 1,
            weights: 2,
            index_k: 3,
            index_score: 4,
            topk_indices: 5,
            grad_loss: 6,
            attn_score: 7,
            d_index_q: 8,
            d_weights: 9,
            d_index_k: 10,
            workspace: 11,
        };
        let p = grad_params(&ptrs, 11, &shape, &opts, 3.0, FLAG_DW_F32);
        let addrs = [
            p.index_q,
            p.weights,
            p.index_k,
            p.index_score,
            p.topk_indices,
            p.grad_loss,
            p.attn_score,
            p.d_index_q,
            p.d_weights,
            p.dk_accum,
        ];
        assert_eq!(addrs, [1, 2, 3, 4, 5, 6, 7, 8, 9, 11]);
        assert_eq!((p.batch, p.seq_q, p.seq_k, p.topk), (2, 3, 5, 7));
        assert_eq!((p.sm_scale, p.coeff, p.flags), (0.5, 0.5, FLAG_DW_F32));
    }
}
