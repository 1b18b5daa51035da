//! What the three path modules share: the state of one call's launches
//! ([`Run`], with its stage marks) and the stage-1 launch that the sm90
//! and sm100 paths start with. A leaf of `launch`: the path modules import
//! this, not their parent, so no module of `launch` imports one that
//! imports it back.

use crate::error::Result;
use crate::events::StageEvents;
use crate::gpu;
use crate::shape::Shape;
use cudarc::driver::{CudaEvent, CudaFunction, CudaStream};
use kernels_gpu::abi::{stage1_grid, GradParams, STAGE1_SMEM, STAGE1_THREADS};

/// What one call's launches need: the stream, the kernel parameters, the
/// optional events, and the buffers of the cast.
pub(crate) struct Run<'a> {
    /// The caller's stream.
    pub stream: &'a CudaStream,
    /// The plan's shape.
    pub shape: &'a Shape,
    /// The checked parameters of stage 1 and stage 2.
    pub params: GradParams,
    /// Events to record between the stages (`execute_profiled`).
    pub events: Option<&'a StageEvents>,
    /// `(f32 accumulator, bf16 d_index_k)` when `d_index_k` is bf16.
    pub cast: Option<(u64, u64)>,
    /// Deterministic mode's output (`params.dk_accum` is then the start
    /// of its workspace).
    pub det: Option<DetOut>,
}

/// Where deterministic mode's last pass writes `d_index_k`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DetOut {
    /// The checked `d_index_k`.
    pub d_index_k: u64,
    /// Whether it is bf16 (else f32).
    pub bf16: bool,
}

impl Run<'_> {
    /// Records the event `which` picks, when profiling.
    pub(crate) fn mark(&self, which: fn(&StageEvents) -> &CudaEvent) -> Result<()> {
        match self.events {
            Some(e) => Ok(which(e).record(self.stream)?),
            None => Ok(()),
        }
    }
}

/// Launches stage 1 (grad_signal over `attn_score`, zeroing of
/// `p.dk_accum`, per-row chunk counts when asked) as an ordinary launch:
/// the sm90 and sm100 paths start with it.
///
/// # Safety
/// `p` checked for `shape`; `f` is the module's `STAGE1.name`.
pub(crate) unsafe fn launch_stage1(
    stream: &CudaStream,
    f: &CudaFunction,
    shape: &Shape,
    p: &GradParams,
) -> Result<()> {
    let grid = stage1_grid(shape.rows() as u32, shape.topk as u32);
    // SAFETY: forwarded; stage 1's launch contract: one to eight warps
    // per row in CTAs of STAGE1_THREADS with STAGE1_SMEM bytes, the grid
    // from `stage1_grid`.
    unsafe { gpu::launch(stream, f, grid, STAGE1_THREADS, STAGE1_SMEM, p) }
}
