//! The plan (built once per shape and options) and its validated `execute`:
//! the checks are in `args`, the launches of each path in `launch`.

use crate::args::{self, Expected, Inputs, Outputs, Ptrs, TopkId};
use crate::error::Error;
use crate::error::Result;
use crate::events::StageEvents;
use crate::launch::{self, Cast, DetOut, Path, Run};
use crate::select::{select, PathKind};
use crate::shape::{Backend, GradDtype, Options, Shape};
use cudarc::driver::{CudaContext, CudaStream};
use kernels_gpu::abi::FLAG_IDS_I64;
use std::sync::Arc;

/// A backward plan for one shape and set of options on one CUDA context:
/// kernels loaded and configured once, nothing allocated per call.
pub struct Plan {
    shape: Shape,
    opts: Options,
    ctx: Arc<CudaContext>,
    /// The kernels of the one path this plan runs.
    path: Path,
    /// The f32 -> bf16 cast of the dK accumulator (launched only when
    /// `d_index_k` is bf16).
    cast: Cast,
    /// Names of the kernels `execute` launches, in order.
    kernels: Vec<&'static str>,
    /// The module the kernels come from, shared with every plan on the
    /// context (`modules`).
    module: Arc<crate::modules::Loaded>,
}

impl Plan {
    /// Builds a plan: checks the shape envelope and options, takes the
    /// kernel module for the context's GPU (by exact compute capability:
    /// `sm_90a` on 9.0, `sm_100f` on 10.0 and 10.3, the portable `sm_90`
    /// module on any other GPU of compute capability 9.0 or newer) and
    /// configures the kernels [`crate::select()`] chose.
    ///
    /// The module is loaded once per context and shared by every plan on
    /// it (sparse and dense), from the machine code the crate ships for the
    /// GPU where it has some (no JIT compilation), and kept while any plan
    /// holds it: only the first plan of a context pays the load.
    /// [`Plan::module_image`] says what was loaded.
    ///
    /// With `opts.deterministic`, fails with [`crate::Error::NotImplemented`]
    /// where the chosen path is not the Hopper fast path, and with
    /// [`crate::Error::Shape`] beyond `kernels_gpu::det::MAX_SLOTS` slots.
    ///
    /// Fails with [`crate::Error::UnsupportedDevice`] below compute
    /// capability 9.0, [`crate::Error::BackendUnavailable`] when
    /// `Backend::Blackwell` is forced where the tcgen05 kernels cannot run,
    /// and [`crate::Error::SharedMemory`] when the shape's row kernel needs
    /// more shared memory per block than the GPU has (H = 128, D = 128 on
    /// 12.x GPUs).
    pub fn new(ctx: &Arc<CudaContext>, shape: Shape, opts: Options) -> Result<Plan> {
        shape.validate()?;
        opts.validate()?;
        // The module by exact compute capability, then the path it and the
        // shape allow (`select`, `PathKind`).
        let (major, minor) = ctx.compute_capability()?;
        let sel = select(major, minor, &shape, opts.backend)?;
        let kind = PathKind::choose(&sel, &shape)?;
        if opts.deterministic {
            check_deterministic(kind, &shape)?;
        }
        let module = crate::modules::get(ctx, sel.module)?;
        let path = Path::new(
            ctx,
            &module,
            kind,
            &shape,
            (major, minor),
            opts.deterministic,
        )?;
        let cast = Cast::new(&module)?;
        Ok(Plan {
            shape,
            opts,
            ctx: ctx.clone(),
            path,
            cast,
            kernels: kind.kernels(&opts),
            module,
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
        self.path.backend()
    }

    /// What the plan's kernel module was loaded from: the shipped machine
    /// code of the GPU, or PTX the driver JIT-compiled.
    pub fn module_image(&self) -> crate::ModuleImage {
        self.module.image()
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
    /// when that output is bf16, zero otherwise; in deterministic mode
    /// (`Options::deterministic`) the fixed-point accumulator and its
    /// tables (`kernels_gpu::abi::det_layout`) for either type.
    pub fn workspace_bytes(&self) -> usize {
        args::workspace_bytes(&self.shape, &self.opts)
    }

    /// Runs the whole backward on `stream` and returns without synchronising.
    /// Any thread may call it: the plan's context is made current for the
    /// call and the thread's previous one (or none) restored after.
    ///
    /// Everything is checked first (contexts, element counts and types,
    /// alignment, overlaps, workspace, `loss_coeff`); a failed check returns
    /// an [`crate::Error`] before anything is launched, and no buffer has
    /// been touched. Then: `attn_score` <- grad_signal, `d_index_q`,
    /// `d_weights`, `d_index_k` written. No device memory is allocated.
    /// An [`crate::Error::Driver`] from a launch can follow launches
    /// already queued by this call: then the outputs (`attn_score`
    /// included) are unspecified (see [`crate::Error`]).
    ///
    /// Non-finite values in the tensors (`grad_loss` included, which is
    /// read on the device) are not scanned for: they propagate into the
    /// outputs by the rules of [`crate::cpu`] ("Non-finite inputs"), the
    /// same on both paths.
    ///
    /// `topk_indices` may be i32 or i64 (`I`, inferred from the view): i64
    /// ids, as `torch.topk` returns them, are read by the kernels as they
    /// are, with no conversion pass.
    pub fn execute<I: TopkId>(
        &self,
        stream: &CudaStream,
        inputs: &Inputs<'_, I>,
        outputs: &mut Outputs<'_>,
        loss_coeff: f32,
    ) -> Result<()> {
        self.run(stream, inputs, outputs, loss_coeff, None)
    }

    /// [`execute`](Plan::execute), recording `events` before, between and
    /// after its stages (for benchmarks; the events add no synchronisation).
    pub fn execute_profiled<I: TopkId>(
        &self,
        stream: &CudaStream,
        inputs: &Inputs<'_, I>,
        outputs: &mut Outputs<'_>,
        loss_coeff: f32,
        events: &StageEvents,
    ) -> Result<()> {
        self.run(stream, inputs, outputs, loss_coeff, Some(events))
    }

    /// The checks, then the launches of the plan's path.
    fn run<I: TopkId>(
        &self,
        stream: &CudaStream,
        inputs: &Inputs<'_, I>,
        outputs: &mut Outputs<'_>,
        loss_coeff: f32,
        events: Option<&StageEvents>,
    ) -> Result<()> {
        // Launches need the plan's context current on this thread (a
        // thread the caller never bound it to included); restored after.
        let _bound = crate::gpu::Bound::new(&self.ctx)?;
        let (s, opts) = (&self.shape, &self.opts);
        let want = Expected {
            shape: s,
            opts,
            ctx: &self.ctx,
        };
        // Holds the guards of the device addresses until the launches are
        // queued (see `args::Checked`).
        let checked = args::check(&want, stream, inputs, outputs, loss_coeff)?;
        // SAFETY: every address in `checked.ptrs` passed `args::check` for
        // this plan's shape and options (context, length, element type,
        // alignment, no output aliasing another tensor).
        unsafe { self.launch_checked(stream, &checked.ptrs, checked.ids_i64, loss_coeff, events) }
    }

    /// The plan's context (`raw` compares and binds it).
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The launches of the plan's path on addresses that passed the checks
    /// (`ids_i64`: `topk_indices` holds i64 ids).
    ///
    /// # Safety
    /// Every address in `ptrs` passed `args::check` (or the checks of
    /// `raw` plus the caller's promises there) for this plan's shape and
    /// options.
    pub(crate) unsafe fn launch_checked(
        &self,
        stream: &CudaStream,
        ptrs: &Ptrs,
        ids_i64: bool,
        loss_coeff: f32,
        events: Option<&StageEvents>,
    ) -> Result<()> {
        let (s, opts) = (&self.shape, &self.opts);
        let ws_needed = self.workspace_bytes();
        let accum = ptrs.dk_accum(ws_needed);
        let mut flags = launch::flags(opts, self.path.row_chunks(s));
        if ids_i64 {
            flags |= FLAG_IDS_I64;
        }
        let det = opts.deterministic.then_some(DetOut {
            d_index_k: ptrs.d_index_k,
            bf16: opts.d_index_k == GradDtype::Bf16,
        });
        let run = Run {
            stream,
            shape: s,
            params: launch::grad_params(ptrs, accum, s, opts, loss_coeff, flags),
            events,
            cast: (ws_needed > 0 && det.is_none()).then_some((ptrs.workspace, ptrs.d_index_k)),
            det,
        };
        // SAFETY: forwarded from the caller; `path` and `cast` were loaded
        // for this shape in `new`.
        unsafe { launch::launch(&self.path, &self.cast, &run) }
    }
}

/// Deterministic mode runs where its kernels exist (the Hopper fast path)
/// and up to `kernels_gpu::det::MAX_SLOTS` slots.
fn check_deterministic(kind: PathKind, shape: &Shape) -> Result<()> {
    if !matches!(kind, PathKind::Sm90 { .. }) {
        return Err(Error::NotImplemented {
            what: "deterministic mode outside the Hopper fast path (compute capability 9.0, \
                   topk > 64)",
        });
    }
    if shape.slots() as u64 > kernels_gpu::det::MAX_SLOTS {
        return Err(Error::Shape {
            name: "B*S_q*topk",
            value: shape.slots(),
            expected: "at most 2^30 slots in deterministic mode",
        });
    }
    if shape.topk > kernels_gpu::det::MAX_BIN_SLOTS as usize {
        return Err(Error::Shape {
            name: "topk",
            value: shape.topk,
            expected: "at most 2^21 in deterministic mode",
        });
    }
    Ok(())
}
