//! One loaded kernel module per (CUDA context, target), shared by every
//! plan on that context (sparse and dense alike).
//!
//! The first plan on a context loads the module for the context's GPU
//! ([`PtxModule::for_capability`]): the machine code shipped for that exact
//! compute capability when there is one ([`PtxModule::sass`]), the PTX
//! otherwise, which the driver JIT-compiles. Later plans on the same context
//! take the loaded module and the kernels already looked up in it (every
//! kernel a plan may launch is looked up when the module loads), so a plan
//! costs no module load, no JIT compilation and no kernel load; each
//! kernel's shared-memory attribute is set once. The module lives while a plan (or
//! any [`Kernel`] handed out) holds it and is unloaded after the last one
//! goes; the next plan then loads it again.
//!
//! Invariant: an entry of the registry is keyed by the raw context handle
//! and holds only a weak reference. A live [`Loaded`] holds its context
//! (through the cudarc module), so while an entry upgrades its context
//! cannot have been destroyed and its handle cannot have been reused.

use crate::error::{Error, Result};
use crate::gpu::{self, PtxModule};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, DriverError};
use kernels_gpu::registry::{Param, Target, KERNELS};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// What a module was loaded from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModuleImage {
    /// The shipped machine code for this GPU target (`sm_90a`, `sm_100a`,
    /// `sm_103a`, `sm_120`): no JIT compilation.
    Sass {
        /// The GPU target the machine code was assembled for.
        target: &'static str,
    },
    /// The PTX of this target, JIT-compiled by the driver (a GPU without
    /// shipped machine code, machine code the driver refused, or the
    /// `INDEXER_PTX_DIR` override).
    Ptx {
        /// The PTX's `.target`.
        target: &'static str,
    },
}

impl std::fmt::Display for ModuleImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModuleImage::Sass { target } => write!(f, "{target} machine code"),
            ModuleImage::Ptx { target } => write!(f, "{target} PTX (JIT)"),
        }
    }
}

/// A module loaded into one context, with the kernels looked up in it.
pub(crate) struct Loaded {
    module: Arc<CudaModule>,
    image: ModuleImage,
    /// Kernels looked up so far, with the dynamic shared memory their
    /// attribute is raised to (0: never raised).
    kernels: Mutex<HashMap<&'static str, (CudaFunction, u32)>>,
}

impl Loaded {
    /// What the module was loaded from.
    pub(crate) fn image(&self) -> ModuleImage {
        self.image
    }

    /// The cudarc module.
    pub(crate) fn module(&self) -> Arc<CudaModule> {
        self.module.clone()
    }

    /// The kernel `name`, looked up once per module.
    pub(crate) fn kernel(&self, name: &'static str) -> Result<CudaFunction> {
        self.kernel_with_smem(name, 0)
    }

    /// The kernel `name` with its dynamic shared-memory limit at least
    /// `bytes`: the attribute is set the first time a plan needs that much,
    /// never again for the same or a smaller size.
    pub(crate) fn kernel_with_smem(&self, name: &'static str, bytes: u32) -> Result<CudaFunction> {
        let mut kernels = lock(&self.kernels);
        let (f, raised) = match kernels.get(name) {
            Some(entry) => entry.clone(),
            None => (self.module.load_function(name)?, 0),
        };
        if bytes > raised {
            gpu::set_dynamic_smem(&f, bytes)?;
        }
        kernels.insert(name, (f.clone(), raised.max(bytes)));
        Ok(f)
    }
}

/// A registry entry: a context handle, the module's target, the module.
struct Entry {
    ctx: usize,
    which: PtxModule,
    loaded: Weak<Loaded>,
}

/// Every module loaded in this process and still held by a plan.
static REGISTRY: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// Locks `m`, recovering the data of a poisoned lock (every critical
/// section here leaves its data consistent at every step).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The module `which` on `ctx`: the one already loaded there, or loaded now
/// (under the registry's lock, so concurrent first plans load it once).
pub(crate) fn get(ctx: &Arc<CudaContext>, which: PtxModule) -> Result<Arc<Loaded>> {
    let key = ctx.cu_ctx() as usize;
    let mut registry = lock(&REGISTRY);
    registry.retain(|e| e.loaded.strong_count() > 0);
    if let Some(loaded) = registry
        .iter()
        .filter(|e| e.ctx == key && e.which == which)
        .find_map(|e| e.loaded.upgrade())
    {
        return Ok(loaded);
    }
    let (module, image) = load(ctx, which)?;
    let loaded = Arc::new(Loaded {
        module,
        image,
        kernels: Mutex::new(HashMap::new()),
    });
    // Every kernel a plan may launch is looked up now: with the driver's
    // lazy loading a kernel's code reaches the GPU at its first lookup, a
    // cost that belongs to the module's load, not to some later plan.
    if let Some(target) = Target::from_name(which.target()) {
        for k in KERNELS
            .iter()
            .filter(|k| k.in_ptx(target) && launched_by_plans(k.param))
        {
            loaded.kernel(k.name)?;
        }
    }
    registry.push(Entry {
        ctx: key,
        which,
        loaded: Arc::downgrade(&loaded),
    });
    Ok(loaded)
}

/// Whether plans launch kernels taking `param` (the others are instruments:
/// smoke tests, ceilings, probes).
fn launched_by_plans(param: Param) -> bool {
    match param {
        Param::Grad
        | Param::Cast
        | Param::Dense
        | Param::DenseTile
        | Param::DenseDet
        | Param::Sm100Stage2
        | Param::Fwd
        | Param::Det => true,
        Param::Smoke | Param::Ceil | Param::Sm100Smoke | Param::Sm100Probe | Param::Tag => false,
    }
}

/// Number of modules loaded and held right now, over every context (for
/// tests and benchmarks: one per context and target in use).
pub fn loaded_modules() -> usize {
    let registry = lock(&REGISTRY);
    registry
        .iter()
        .filter(|e| e.loaded.strong_count() > 0)
        .count()
}

/// Loads `which` on `ctx`: the `INDEXER_PTX_DIR` override when set (armed
/// when it is a watchdog build, [`crate::watchdog::arm`]), else the shipped
/// machine code for the GPU when there is some and the driver takes it,
/// else the PTX. A failure names the GPU, its compute capability and every
/// image tried.
fn load(ctx: &Arc<CudaContext>, which: PtxModule) -> Result<(Arc<CudaModule>, ModuleImage)> {
    let (major, minor) = ctx.compute_capability()?;
    let ptx = ModuleImage::Ptx {
        target: which.target(),
    };
    if let Some(text) = which.override_text()? {
        let watchdog = crate::watchdog::is_watchdog_build(&text);
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(text))
            .map_err(|e| load_error(ctx, (major, minor), &[(ptx, e)]))?;
        if watchdog {
            crate::watchdog::arm(ctx, &module)?;
        }
        return Ok((module, ptx));
    }
    let mut tried = Vec::new();
    if let Some((target, code)) = which.sass(major, minor) {
        let image = ModuleImage::Sass { target };
        match ctx.load_module(cudarc::nvrtc::Ptx::from_binary(code.to_vec())) {
            Ok(module) => return Ok((module, image)),
            Err(e) => tried.push((image, e)),
        }
    }
    match ctx.load_module(cudarc::nvrtc::Ptx::from_src(which.ptx())) {
        Ok(module) => Ok((module, ptx)),
        Err(e) => {
            tried.push((ptx, e));
            Err(load_error(ctx, (major, minor), &tried))
        }
    }
}

/// [`Error::ModuleLoad`] for the images `tried` on `ctx`'s GPU.
fn load_error(ctx: &CudaContext, cc: (i32, i32), tried: &[(ModuleImage, DriverError)]) -> Error {
    let gpu = ctx.name().unwrap_or_else(|_| "an unnamed GPU".into());
    let tried: Vec<String> = tried.iter().map(|(i, e)| format!("{i}: {e}")).collect();
    Error::ModuleLoad {
        gpu,
        major: cc.0,
        minor: cc.1,
        tried: tried.join("; "),
    }
}
