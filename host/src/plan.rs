//! The plan (built once per shape and options) and its validated
//! `execute`; the checks are in `args`.

use crate::args::{self, Expected, Inputs, Outputs, Ptrs};
use crate::error::{Error, Result};
use crate::events::StageEvents;
use crate::gpu;
use crate::select::{check_shared_memory, select};
use crate::shape::{Backend, GradDtype, KeyIds, Options, ScoreKind, Shape};
use crate::sm100::Sm100Kernels;
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaFunction, CudaStream};
use kernels_gpu::params::{
    grad_kernel_name, stage1_grid, CastParams, GradParams, CAST_KERNEL, CAST_THREADS, CAST_VEC,
    FLAG_DW_F32, FLAG_LOCAL_IDS, FLAG_LOG_SCORE, FLAG_PAIR_DISPATCH, FLAG_ROW_CHUNKS,
    STAGE1_KERNEL, STAGE1_SMEM, STAGE1_THREADS,
};
use kernels_gpu::sm90;
use kernels_gpu::tiles::{RowSmem, GRAD_THREADS};
use std::sync::Arc;

/// A backward plan for one shape and set of options on one CUDA context:
/// kernels loaded and configured once, nothing allocated per call.
pub struct Plan {
    shape: Shape,
    opts: Options,
    /// The tcgen05 kernels when the Blackwell backend was selected.
    sm100: Option<Sm100Kernels>,
    ctx: Arc<CudaContext>,
    /// The gradient kernel (one CTA per query row, or persistent on the
    /// fast path).
    row_fn: CudaFunction,
    cast_fn: CudaFunction,
    /// Fast path only: stage 1 + dK zeroing, launched before `row_fn`,
    /// which then runs as its programmatic dependent.
    stage1_fn: Option<CudaFunction>,
    /// Fast path with an even number of rows: the paired kernel
    /// (`sm90::WG_PAIR_KERNEL`) and its grid, launched between stage 1 and
    /// `row_fn`; a test on the ids inside both picks which one computes
    /// (`FLAG_PAIR_DISPATCH`).
    pair: Option<(CudaFunction, u32)>,
    /// CTAs of `row_fn`.
    grid: u32,
    /// Threads per CTA of `row_fn`.
    threads: u32,
    /// Dynamic shared memory of `row_fn` (limit raised in `new`).
    smem_bytes: u32,
    /// Names of the kernels `execute` launches, in order.
    kernels: Vec<&'static str>,
}

impl Plan {
    /// Builds a plan: checks the shape envelope and options, loads the PTX
    /// module for the context's GPU (by exact compute capability: `sm_90a`
    /// on 9.0, `sm_100f` on 10.0 and 10.3, the portable `sm_90` module on
    /// any other GPU of compute capability 9.0 or newer) and configures the
    /// kernels [`crate::select`] chose.
    ///
    /// Fails with [`Error::UnsupportedDevice`] below compute capability
    /// 9.0, [`Error::BackendUnavailable`] when `Backend::Blackwell` is forced
    /// where the tcgen05 kernels cannot run, and [`Error::SharedMemory`]
    /// when the shape's row kernel needs more shared memory per block than
    /// the GPU has (H = 128, D = 128 on 12.x GPUs).
    pub fn new(ctx: &Arc<CudaContext>, shape: Shape, opts: Options) -> Result<Plan> {
        shape.validate()?;
        opts.validate()?;
        let name =
            grad_kernel_name(shape.heads as u32, shape.head_dim as u32).ok_or(Error::Shape {
                name: "heads x head_dim",
                value: shape.heads * shape.head_dim,
                expected: "heads in {16, 32, 64, 128} and head_dim in {64, 128}",
            })?;
        // The module by exact compute capability, then the kernels it
        // holds (`select`): on the sm_90a module, H = 64, D = 128, more than
        // one chunk per row, the fast path (stage-1 kernel, then the
        // persistent wgmma kernel as its programmatic dependent).
        // Everything else on the Hopper backend: the mma.sync row kernel of
        // the shape after a memset.
        let (major, minor) = ctx.compute_capability()?;
        let sel = select(major, minor, &shape, opts.backend)?;
        let module = sel.module.load(ctx)?;
        // Fast path, even rows: the paired kernel and its grid.
        let mut pair = None;
        let (row_fn, threads, smem_bytes, stage1_fn, grid) = if sel.wgmma {
            let sms =
                ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
            let sms = sms.max(1) as u32;
            let rows = shape.rows() as u32;
            if sm90::supports_pairs(shape.rows() as u64, shape.topk as u64) {
                let f = module.load_function(sm90::WG_PAIR_KERNEL)?;
                gpu::set_dynamic_smem(&f, sm90::PAIR.bytes)?;
                pair = Some((f, sm90::pair_grid(rows, sms)));
            }
            (
                module.load_function(sm90::WG_KERNEL)?,
                sm90::THREADS,
                sm90::SMEM.bytes,
                Some(module.load_function(STAGE1_KERNEL)?),
                sm90::grid(rows, sms),
            )
        } else {
            let smem = RowSmem::new(shape.heads as u32, shape.head_dim as u32);
            // GPUs with less shared memory per block than Hopper (12.x:
            // 99 KiB) cannot run the largest row kernels.
            let available = ctx.attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )?;
            check_shared_memory(name, smem.bytes, available, (major, minor))?;
            (
                module.load_function(name)?,
                GRAD_THREADS,
                smem.bytes,
                None,
                shape.rows() as u32,
            )
        };
        gpu::set_dynamic_smem(&row_fn, smem_bytes)?;
        let cast_fn = module.load_function(CAST_KERNEL)?;
        let sm100 = match sel.backend {
            Backend::Blackwell => Some(Sm100Kernels::new(ctx, &module, &shape)?),
            _ => None,
        };
        let mut kernels = match (&sm100, sel.wgmma) {
            (Some(k), _) => vec![STAGE1_KERNEL, k.stage2_name()],
            (None, true) if pair.is_some() => {
                vec![STAGE1_KERNEL, sm90::WG_PAIR_KERNEL, sm90::WG_KERNEL]
            }
            (None, true) => vec![STAGE1_KERNEL, sm90::WG_KERNEL],
            (None, false) => vec![name],
        };
        if opts.d_index_k == GradDtype::Bf16 {
            kernels.push(CAST_KERNEL);
        }
        Ok(Plan {
            shape,
            opts,
            sm100,
            ctx: ctx.clone(),
            row_fn,
            cast_fn,
            stage1_fn,
            pair,
            threads,
            smem_bytes,
            grid,
            kernels,
        })
    }

    /// Names of the kernels `execute` launches, in launch order (for
    /// logs, profilers and sanitizer runs). With an even number of rows on
    /// the Hopper fast path both the paired and the row wgmma kernel are
    /// launched and a test on the ids inside them picks the one that
    /// computes; the other exits at once.
    pub fn kernels(&self) -> &[&'static str] {
        &self.kernels
    }

    /// The backend this plan runs: [`Backend::Hopper`] (on sm_90 the wgmma
    /// fast path or the `mma.sync` row kernels, by shape; the row kernels
    /// on every other GPU) or [`Backend::Blackwell`] (tcgen05; compiled,
    /// not executed, and only when forced: see [`crate::TCGEN05_VALIDATED`]).
    pub fn backend(&self) -> Backend {
        if self.sm100.is_some() {
            Backend::Blackwell
        } else {
            Backend::Hopper
        }
    }

    /// The plan's shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The plan's options.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Device workspace `execute` needs: the f32 accumulator of `d_index_k`
    /// when that output is bf16, zero otherwise.
    pub fn workspace_bytes(&self) -> usize {
        args::workspace_bytes(&self.shape, &self.opts)
    }

    /// Runs the whole backward on `stream` and returns without synchronising.
    ///
    /// Everything is checked first (contexts, element counts and types,
    /// alignment, overlaps, workspace, `loss_coeff`); a failed check returns
    /// an [`Error`] before anything is launched, and no buffer has been
    /// touched. Then: `attn_score` <- grad_signal, `d_index_q`,
    /// `d_weights`, `d_index_k` written. No device memory is allocated.
    /// An [`Error::Driver`] from a launch can follow launches already
    /// queued by this call: then the outputs (`attn_score` included) are
    /// unspecified (see [`Error`]).
    ///
    /// Non-finite values in the tensors (`grad_loss` included, which is
    /// read on the device) are not scanned for: they propagate into the
    /// outputs by the rules of [`crate::cpu`] ("Non-finite inputs"), the
    /// same on both paths.
    pub fn execute(
        &self,
        stream: &CudaStream,
        inputs: &Inputs<'_>,
        outputs: &mut Outputs<'_>,
        loss_coeff: f32,
    ) -> Result<()> {
        self.run(stream, inputs, outputs, loss_coeff, None)
    }

    /// [`execute`](Plan::execute), recording `events` before, between and
    /// after its stages (for benchmarks; the events add no synchronisation).
    pub fn execute_profiled(
        &self,
        stream: &CudaStream,
        inputs: &Inputs<'_>,
        outputs: &mut Outputs<'_>,
        loss_coeff: f32,
        events: &StageEvents,
    ) -> Result<()> {
        self.run(stream, inputs, outputs, loss_coeff, Some(events))
    }

    fn run(
        &self,
        stream: &CudaStream,
        inputs: &Inputs<'_>,
        outputs: &mut Outputs<'_>,
        loss_coeff: f32,
        events: Option<&StageEvents>,
    ) -> Result<()> {
        let s = &self.shape;
        let ws_needed = self.workspace_bytes();
        let want = Expected {
            shape: s,
            opts: &self.opts,
            ctx: &self.ctx,
        };
        // Holds the guards of the device addresses until the launches are
        // queued (see `args::Checked`).
        let checked = args::check(&want, stream, inputs, outputs, loss_coeff)?;
        let Ptrs {
            index_q: q,
            weights: w,
            index_k: k,
            index_score: sc,
            topk_indices: ids,
            grad_loss: gl,
            attn_score: attn,
            d_index_q: dq,
            d_weights: dw,
            d_index_k: dk,
            workspace: ws,
        } = checked.ptrs;

        // All checks passed: zero the f32 accumulator, run, cast.
        let accum = checked.ptrs.dk_accum(ws_needed);
        let mut flags = 0;
        if self.opts.key_ids == KeyIds::Local {
            flags |= FLAG_LOCAL_IDS;
        }
        if self.opts.score == ScoreKind::LogProbs {
            flags |= FLAG_LOG_SCORE;
        }
        if self.opts.d_weights == GradDtype::F32 {
            flags |= FLAG_DW_F32;
        }
        if self.stage1_fn.is_some() && s.topk >= sm90::SKIP_MIN_TOPK as usize {
            // Fast path: stage 1 counts each row's live chunks (over its
            // d_weights block) and the wgmma kernel skips the rest.
            flags |= FLAG_ROW_CHUNKS;
        }
        let p = GradParams {
            index_q: q,
            weights: w,
            index_k: k,
            attn_score: attn,
            index_score: sc,
            topk_indices: ids,
            grad_loss: gl,
            d_index_q: dq,
            d_weights: dw,
            dk_accum: accum,
            batch: s.batch as u32,
            seq_q: s.seq_q as u32,
            seq_k: s.seq_k as u32,
            topk: s.topk as u32,
            sm_scale: self.opts.sm_scale,
            coeff: (loss_coeff as f64 / s.rows() as f64) as f32,
            flags,
            _pad: 0,
        };
        // SAFETY: every pointer was checked by `args::check` for context, length,
        // alignment and aliasing against the plan's shape; the launch shapes
        // are the kernels' contracts (`grid` CTAs of `threads` with
        // `smem_bytes`, limit raised in `new`; the fast path's stage 1 with
        // one to eight warps per row and `STAGE1_SMEM` bytes, then (even
        // rows) the paired wgmma kernel with `pair`'s grid of `sm90::PAIR`
        // CTAs, then the wgmma row kernel;
        // each executes griddepcontrol.wait before it reads what stage 1
        // writes, and the paired one before it exits).
        let mark = |e: Option<&CudaEvent>| e.map_or(Ok(()), |e| e.record(stream));
        mark(events.map(|e| &e.start))?;
        if let Some(k) = &self.sm100 {
            return self.run_tcgen05(k, stream, &p, ws, dk, events);
        }
        unsafe {
            // Fast path: stage 1 zeroes the accumulator and writes
            // grad_signal, and the wgmma kernel runs as its programmatic
            // dependent (overlapping its prologue). Otherwise a memset, then
            // the row kernel (stage 1 fused) as an ordinary launch.
            let launch_row = match &self.stage1_fn {
                Some(stage1) => {
                    let grid = stage1_grid(s.rows() as u32, s.topk as u32);
                    gpu::launch(stream, stage1, grid, STAGE1_THREADS, STAGE1_SMEM, &p)?;
                    gpu::launch_pdl::<GradParams>
                }
                None => {
                    gpu::memset_zero(stream, accum, s.k_len() * 4)?;
                    gpu::launch::<GradParams>
                }
            };
            mark(events.map(|e| &e.zeroed))?;
            let mut p = p;
            if let Some((pair_fn, pair_grid)) = &self.pair {
                // The paired kernel as stage 1's programmatic dependent, the
                // row kernel as the paired kernel's; one of the two exits
                // at once (the dispatch test of FLAG_PAIR_DISPATCH). The
                // paired kernel exits only after waiting for stage 1, so
                // the row kernel's wait also covers stage 1.
                gpu::launch_pdl(
                    stream,
                    pair_fn,
                    *pair_grid,
                    sm90::PAIR.threads,
                    sm90::PAIR.bytes,
                    &p,
                )?;
                p.flags |= FLAG_PAIR_DISPATCH;
            }
            launch_row(
                stream,
                &self.row_fn,
                self.grid,
                self.threads,
                self.smem_bytes,
                &p,
            )?;
            mark(events.map(|e| &e.gradients))?;
            if ws_needed > 0 {
                self.launch_cast(stream, ws, dk)?;
            }
        }
        mark(events.map(|e| &e.end))?;
        Ok(())
    }

    /// The f32 -> bf16 cast of the dK accumulator `ws` into `dk`.
    ///
    /// # Safety
    /// `ws` and `dk` validated by `run` for this plan's shape.
    unsafe fn launch_cast(&self, stream: &CudaStream, ws: u64, dk: u64) -> Result<()> {
        let c = CastParams {
            src: ws,
            dst: dk,
            len: self.shape.k_len() as u64,
        };
        let per_block = (CAST_THREADS * CAST_VEC) as usize;
        let grid = self.shape.k_len().div_ceil(per_block).min(65_535) as u32;
        // SAFETY: forwarded; the cast kernel's launch contract.
        unsafe { gpu::launch(stream, &self.cast_fn, grid, CAST_THREADS, 0, &c) }
    }

    /// The launches of `run` on the tcgen05 path: stage 1 (which also zeroes
    /// the f32 accumulator `p.dk_accum`), stage 2 as its programmatic
    /// dependent, then the cast when `d_index_k` is bf16. `run` has already
    /// checked everything and recorded `events.start`.
    fn run_tcgen05(
        &self,
        k: &Sm100Kernels,
        stream: &CudaStream,
        p: &GradParams,
        ws: u64,
        dk: u64,
        events: Option<&StageEvents>,
    ) -> Result<()> {
        let mark = |e: Option<&CudaEvent>| e.map_or(Ok(()), |e| e.record(stream));
        // Zeroing is fused into stage 1, so `zeroed` directly follows `start`.
        mark(events.map(|e| &e.zeroed))?;
        // SAFETY: `p` and the buffers were validated by `run` for this
        // plan's shape, which `select_backend` accepted for these kernels.
        unsafe {
            k.launch(stream, &self.shape, p)?;
            mark(events.map(|e| &e.gradients))?;
            if self.workspace_bytes() > 0 {
                self.launch_cast(stream, ws, dk)?;
            }
        }
        mark(events.map(|e| &e.end))?;
        Ok(())
    }
}
