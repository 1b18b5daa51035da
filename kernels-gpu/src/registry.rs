//! Every kernel of the crate, once: its PTX entry name, the parameter it
//! takes, its launch shape and bounds, whether its parameter holds tensor
//! maps, and which PTX files contain it ([`KERNELS`]).
//!
//! One table serves every side: the link step writes the launch bounds
//! (`.maxntid` / `.reqntid`, `.minnctapersm`) and the tensor-map parameter
//! alignment from it (`xtask/src/link.rs`); the host names the kernels it
//! loads through it; kernel modules assert at compile time that their own
//! constants (threads, resident CTAs, specializations) agree with it; and
//! tests check it against the committed PTX (`xtask/src/entries.rs`:
//! every entry is an `.entry` of exactly the files it claims, and every
//! `.entry` is an entry).
//!
//! This module uses only [`crate::abi`]; kernel modules may use it.

use crate::abi::{
    CastParams, CeilParams, DenseDetTileParams, DenseParams, DenseTileParams, DetParams, FwdParams,
    GradParams, Sm100Params, Sm100ProbeParams, Sm100SmokeParams, SmokeParams, CAST_THREADS,
    CEIL_BULK_THREADS, DENSE_STAGE1_THREADS, DENSE_TILE_THREADS, DET_KEY_SUM_THREADS, DET_THREADS,
    SM100_PROBE_THREADS, SM100_SMOKE_THREADS, SM100_STAGE2_THREADS, SMOKE_THREADS, STAGE1_THREADS,
    WATCHDOG_PROBE_THREADS,
};

/// A PTX file `cargo xtask build-ptx` writes (`kernels-gpu/ptx/kernels_<target>.ptx`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// `sm_90a`: Hopper, every Hopper kernel (wgmma included).
    Sm90a,
    /// `sm_100f`: the Blackwell sm_100 family (tcgen05 kernels).
    Sm100f,
    /// `sm_90`: portable, JIT-compiled by GPUs without a file of their own;
    /// only what `Plan` launches there.
    Sm90,
}

impl Target {
    /// Every target.
    pub const ALL: [Target; 3] = [Target::Sm90a, Target::Sm100f, Target::Sm90];

    /// The `-mcpu` / file-name spelling (`sm_90a`).
    pub const fn name(self) -> &'static str {
        match self {
            Target::Sm90a => "sm_90a",
            Target::Sm100f => "sm_100f",
            Target::Sm90 => "sm_90",
        }
    }

    /// The target spelled `name` (`sm_90a`), if any.
    pub fn from_name(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == name)
    }

    const fn bit(self) -> u8 {
        match self {
            Target::Sm90a => 1,
            Target::Sm100f => 2,
            Target::Sm90 => 4,
        }
    }
}

/// The set of PTX files that contain a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Targets(u8);

impl Targets {
    /// Every PTX file.
    pub const ALL: Targets = Targets(7);
    /// The architecture-specific files (`sm_90a`, `sm_100f`), not the
    /// portable one, which holds just what `Plan` launches so that a GPU
    /// without a file of its own JIT-compiles no more than it runs.
    pub const ARCH: Targets = Targets(3);
    /// `sm_90a` only.
    pub const SM90A: Targets = Targets(1);
    /// `sm_100f` only.
    pub const SM100F: Targets = Targets(2);

    /// Whether the kernel is in `t`'s PTX.
    pub const fn contains(self, t: Target) -> bool {
        self.0 & t.bit() != 0
    }
}

/// The parameter a kernel takes (its only one, by value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    /// [`GradParams`].
    Grad,
    /// [`CastParams`].
    Cast,
    /// [`SmokeParams`].
    Smoke,
    /// [`CeilParams`].
    Ceil,
    /// [`Sm100SmokeParams`].
    Sm100Smoke,
    /// [`Sm100ProbeParams`].
    Sm100Probe,
    /// [`Sm100Params`].
    Sm100Stage2,
    /// One `u32` (the watchdog probe's tag).
    Tag,
    /// [`DenseParams`].
    Dense,
    /// [`DenseTileParams`].
    DenseTile,
    /// [`DenseDetTileParams`].
    DenseDet,
    /// [`FwdParams`].
    Fwd,
    /// [`DetParams`].
    Det,
}

impl Param {
    /// Size of the parameter in bytes (the `[N]` of its `.param` in the PTX).
    pub const fn size(self) -> usize {
        use core::mem::size_of;
        match self {
            Param::Grad => size_of::<GradParams>(),
            Param::Cast => size_of::<CastParams>(),
            Param::Smoke => size_of::<SmokeParams>(),
            Param::Ceil => size_of::<CeilParams>(),
            Param::Sm100Smoke => size_of::<Sm100SmokeParams>(),
            Param::Sm100Probe => size_of::<Sm100ProbeParams>(),
            Param::Sm100Stage2 => size_of::<Sm100Params>(),
            Param::Tag => size_of::<u32>(),
            Param::Dense => size_of::<DenseParams>(),
            Param::DenseTile => size_of::<DenseTileParams>(),
            Param::DenseDet => size_of::<DenseDetTileParams>(),
            Param::Fwd => size_of::<FwdParams>(),
            Param::Det => size_of::<DetParams>(),
        }
    }
}

/// The launch bounds the link step writes after a kernel's parameter list
/// (Rust has no attribute for them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bounds {
    /// None: the host picks the block (at most the driver's limit).
    None,
    /// `.maxntid threads, 1, 1` and `.minnctapersm min_ctas`.
    Max {
        /// Resident CTAs per SM asked for on sm_90a (see [`Kernel::min_ctas`]).
        min_ctas: u32,
    },
    /// `.reqntid threads, 1, 1` (always launched with exactly that block,
    /// which lets ptxas allocate registers for that block rather than for
    /// the `.maxntid` cap) and `.minnctapersm min_ctas`.
    Exact {
        /// As for [`Bounds::Max`].
        min_ctas: u32,
    },
}

/// The PTX files a kernel lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Home {
    /// The product modules (`kernels_<target>.ptx`), the only ones a plan
    /// loads.
    Product,
    /// The lab modules (`lab_<target>.ptx`, `--cfg kernels_lab`): the
    /// instruments (the benchmark's ceilings, the toolchain smoke tests,
    /// the Blackwell bring-up probes), loaded only by the tools that use
    /// them, never by a plan.
    Lab,
    /// Watchdog builds of the product modules only (`--cfg
    /// kernels_watchdog`), which are never committed.
    Watchdog,
}

/// One kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// PTX entry name (the `#[no_mangle]` function).
    pub name: &'static str,
    /// What it takes.
    pub param: Param,
    /// Threads per CTA the host launches it with (for a kernel with
    /// [`Bounds`], the bound).
    pub threads: u32,
    /// Launch bounds written into the PTX.
    pub bounds: Bounds,
    /// Its parameter starts with `CUtensorMap`s, so the link step raises
    /// the parameter's alignment to `abi::TENSOR_MAP_ALIGN`.
    pub tensor_maps: bool,
    /// The targets whose files of its [`Home`] contain it.
    pub targets: Targets,
    /// Its files: the product's, the lab's, or watchdog builds' only
    /// (there in every file `targets` names).
    pub home: Home,
}

impl Kernel {
    /// Resident CTAs per SM asked for in `target`'s PTX, or `None` without
    /// bounds. The occupancy targets were tuned and measured on sm_90a;
    /// elsewhere (sm_100f, not executed; the portable sm_90 file, which
    /// only GPUs other than sm_90 load) it is one CTA per SM, so ptxas
    /// keeps its register freedom (with two, the H=64 D=128 row kernel
    /// spills on sm_100).
    pub const fn min_ctas(&self, target: Target) -> Option<u32> {
        match self.bounds {
            Bounds::None => None,
            Bounds::Max { min_ctas } | Bounds::Exact { min_ctas } => {
                Some(if matches!(target, Target::Sm90a) {
                    min_ctas
                } else {
                    1
                })
            }
        }
    }

    /// Whether the bound is `.reqntid` rather than `.maxntid`.
    pub const fn exact_block(&self) -> bool {
        matches!(self.bounds, Bounds::Exact { .. })
    }

    /// Whether `target`'s committed PTX contains it.
    pub const fn in_ptx(&self, target: Target) -> bool {
        self.in_home(Home::Product, target)
    }

    /// Whether it is an `.entry` of `target`'s committed file of `home`.
    pub const fn in_home(&self, home: Home, target: Target) -> bool {
        matches!(
            (self.home, home),
            (Home::Product, Home::Product) | (Home::Lab, Home::Lab)
        ) && self.targets.contains(target)
    }
}

/// Shorthand for the table below.
const fn k(
    name: &'static str,
    param: Param,
    threads: u32,
    bounds: Bounds,
    targets: Targets,
) -> Kernel {
    Kernel {
        name,
        param,
        threads,
        bounds,
        tensor_maps: false,
        targets,
        home: Home::Product,
    }
}

/// Stage 1 of the two-launch paths (Hopper fast path, Blackwell path):
/// score gradient for several rows per CTA with the zeroing of the f32 dK
/// accumulator (D = 128) fused in. Three resident CTAs (at most 85
/// registers, enough for the 16 scores each thread keeps in flight and in
/// registers; the 64 of four resident CTAs are not): it is bound by memory
/// latency and bandwidth and wants many loads in flight.
pub const STAGE1: Kernel = k(
    "indexer_score_grad_d128",
    Param::Grad,
    STAGE1_THREADS,
    Bounds::Max { min_ctas: 3 },
    Targets::ALL,
);

/// Stage 1 for D = 64 (the same body as [`STAGE1`], zeroing a D = 64
/// accumulator), ahead of [`SM90_WG_D64`]: in the sm_90a module only.
pub const STAGE1_D64: Kernel = k(
    "indexer_score_grad_d64",
    Param::Grad,
    STAGE1_THREADS,
    Bounds::Max { min_ctas: 3 },
    Targets::SM90A,
);

/// The f32 -> bf16 cast of the dK accumulator.
pub const CAST: Kernel = k(
    "cast_f32_to_bf16",
    Param::Cast,
    CAST_THREADS,
    Bounds::None,
    Targets::ALL,
);

/// A fused `mma.sync` row kernel (score gradient + gradients), one CTA per
/// query row. Two resident CTAs per SM let one CTA's gathers and barriers
/// overlap the other's tensor-core work; ptxas then caps registers at 128
/// per thread (the H = 128 kernels need more and keep one CTA).
const fn row(name: &'static str, min_ctas: u32) -> Kernel {
    k(
        name,
        Param::Grad,
        ROW_THREADS,
        Bounds::Max { min_ctas },
        Targets::ALL,
    )
}
/// Threads per CTA of the row kernels (`portable::rows::GRAD_THREADS`).
pub const ROW_THREADS: u32 = 256;

/// Heads supported by the row kernels.
pub const SUPPORTED_HEADS: [u32; 4] = [16, 32, 64, 128];
/// Head dimensions supported by the row kernels.
pub const SUPPORTED_DIMS: [u32; 2] = [64, 128];

/// The row kernels, in [`SUPPORTED_HEADS`] x [`SUPPORTED_DIMS`] order.
pub const ROWS: [Kernel; 8] = [
    row("indexer_bwd_rows_h16_d64", 2),
    row("indexer_bwd_rows_h16_d128", 2),
    row("indexer_bwd_rows_h32_d64", 2),
    row("indexer_bwd_rows_h32_d128", 2),
    row("indexer_bwd_rows_h64_d64", 2),
    row("indexer_bwd_rows_h64_d128", 2),
    row("indexer_bwd_rows_h128_d64", 1),
    row("indexer_bwd_rows_h128_d128", 1),
];

/// The row kernel specialised for `heads` x `dim`, or `None` outside the
/// envelope.
pub const fn row_kernel(heads: u32, dim: u32) -> Option<Kernel> {
    let mut i = 0;
    while i < SUPPORTED_HEADS.len() {
        let mut j = 0;
        while j < SUPPORTED_DIMS.len() {
            if SUPPORTED_HEADS[i] == heads && SUPPORTED_DIMS[j] == dim {
                return Some(ROWS[i * SUPPORTED_DIMS.len() + j]);
            }
            j += 1;
        }
        i += 1;
    }
    None
}

/// PTX entry name of the row kernel specialised for `heads` x `dim`, or
/// `None` outside the envelope.
pub const fn grad_kernel_name(heads: u32, dim: u32) -> Option<&'static str> {
    match row_kernel(heads, dim) {
        Some(k) => Some(k.name),
        None => None,
    }
}

/// The wgmma row kernel (H = 64, D = 128; `sm90::bwd`): two resident CTAs per
/// SM (the persistent grid counts on them), so at most 128 registers per
/// thread; always launched with exactly its two warpgroups.
pub const SM90_WG: Kernel = k(
    "indexer_bwd_wg_h64_d128",
    Param::Grad,
    256,
    Bounds::Exact { min_ctas: 2 },
    Targets::SM90A,
);

/// The wgmma row kernel for H = 64, D = 64 (`sm90::bwd`, the same body on a
/// layout half as wide in D): as [`SM90_WG`], two resident CTAs per SM.
pub const SM90_WG_D64: Kernel = k(
    "indexer_bwd_wg_h64_d64",
    Param::Grad,
    256,
    Bounds::Exact { min_ctas: 2 },
    Targets::SM90A,
);

/// The wgmma row kernel for H = 32, D = 128 (`sm90::bwd`, the D = 128 body and
/// layout with the head tile's rows 32..63 padded): as [`SM90_WG`], two
/// resident CTAs per SM.
pub const SM90_WG_H32: Kernel = k(
    "indexer_bwd_wg_h32_d128",
    Param::Grad,
    256,
    Bounds::Exact { min_ctas: 2 },
    Targets::SM90A,
);

/// The wgmma row kernel for H = 16, D = 128: as [`SM90_WG_H32`] with rows
/// 16..63 padded.
pub const SM90_WG_H16: Kernel = k(
    "indexer_bwd_wg_h16_d128",
    Param::Grad,
    256,
    Bounds::Exact { min_ctas: 2 },
    Targets::SM90A,
);

/// The paired wgmma kernel (`sm90::bwd`): one CTA of twice the row kernel's
/// threads per SM, the same register cap.
pub const SM90_WG_PAIR: Kernel = k(
    "indexer_bwd_wg_pair_h64_d128",
    Param::Grad,
    512,
    Bounds::Max { min_ctas: 1 },
    Targets::SM90A,
);

/// The wgmma kernel for H = 128, D = 128 (`sm90::bwd`, the paired kernel's body
/// with the two halves on one row's two 64-head halves): as
/// [`SM90_WG_PAIR`].
pub const SM90_WG_H128: Kernel = k(
    "indexer_bwd_wg_h128_d128",
    Param::Grad,
    512,
    Bounds::Max { min_ctas: 1 },
    Targets::SM90A,
);

/// Dense mode's stage 1 (`sm90::dense::stage1`): one query row per CTA, ahead of a
/// wgmma kernel; in the sm_90a module only (dense mode on the GPU runs
/// the Hopper fast path).
pub const DENSE_STAGE1: Kernel = k(
    "indexer_dense_score_grad",
    Param::Dense,
    DENSE_STAGE1_THREADS,
    Bounds::Max { min_ctas: 4 },
    Targets::SM90A,
);

/// Dense mode's tile kernel for H = 64, D = 128 (`sm90::dense`): stage 2
/// over whole key tiles, one work item per CTA, after
/// [`DENSE_STAGE1`]. One resident CTA per SM (its consumers hold two
/// products in flight: more than 128 registers); its tensor maps lead the
/// parameter.
pub const DENSE_WG: Kernel = Kernel {
    tensor_maps: true,
    ..k(
        "indexer_dense_bwd_wg_h64_d128",
        Param::DenseTile,
        DENSE_TILE_THREADS,
        Bounds::Max { min_ctas: 1 },
        Targets::SM90A,
    )
};

/// The deterministic twin of [`DENSE_WG`] (`sm90::dense`): the same body and
/// launch shape, its work items taken in arrival order and each key
/// item's dK sums added in its chain's turn; takes
/// [`DenseDetTileParams`].
pub const DENSE_WG_DET: Kernel = Kernel {
    name: "indexer_dense_bwd_wg_det_h64_d128",
    param: Param::DenseDet,
    ..DENSE_WG
};

/// The wgmma row kernel for H = 32, D = 64 (`sm90::bwd`, the D = 64 body with
/// the head tile's rows 32..63 padded): as [`SM90_WG`].
pub const SM90_WG_H32_D64: Kernel = k(
    "indexer_bwd_wg_h32_d64",
    Param::Grad,
    256,
    Bounds::Exact { min_ctas: 2 },
    Targets::SM90A,
);

/// The wgmma row kernel for H = 16, D = 64: as [`SM90_WG_H32_D64`] with
/// rows 16..63 padded.
pub const SM90_WG_H16_D64: Kernel = k(
    "indexer_bwd_wg_h16_d64",
    Param::Grad,
    256,
    Bounds::Exact { min_ctas: 2 },
    Targets::SM90A,
);

/// The wgmma kernel for H = 128, D = 64 (`sm90::bwd`, [`SM90_WG_H128`]'s halves
/// on the D = 64 body): as [`SM90_WG_PAIR`].
pub const SM90_WG_H128_D64: Kernel = k(
    "indexer_bwd_wg_h128_d64",
    Param::Grad,
    512,
    Bounds::Max { min_ctas: 1 },
    Targets::SM90A,
);

/// The deterministic twin of wgmma kernel `of` (`det`): the same body,
/// launch shape and bounds, reducing dK in fixed point; takes
/// [`DetParams`].
const fn det(name: &'static str, of: Kernel) -> Kernel {
    Kernel {
        name,
        param: Param::Det,
        ..of
    }
}

/// The wgmma kernels' deterministic twins, in the order of
/// [`DET_BASES`].
pub const SM90_WG_DET: [Kernel; 9] = [
    det("indexer_bwd_wg_det_h64_d128", SM90_WG),
    det("indexer_bwd_wg_det_h64_d64", SM90_WG_D64),
    det("indexer_bwd_wg_det_h32_d128", SM90_WG_H32),
    det("indexer_bwd_wg_det_h16_d128", SM90_WG_H16),
    det("indexer_bwd_wg_pair_det_h64_d128", SM90_WG_PAIR),
    det("indexer_bwd_wg_det_h128_d128", SM90_WG_H128),
    det("indexer_bwd_wg_det_h32_d64", SM90_WG_H32_D64),
    det("indexer_bwd_wg_det_h16_d64", SM90_WG_H16_D64),
    det("indexer_bwd_wg_det_h128_d64", SM90_WG_H128_D64),
];

/// The kernels of [`SM90_WG_DET`], twin by twin.
pub const DET_BASES: [Kernel; 9] = [
    SM90_WG,
    SM90_WG_D64,
    SM90_WG_H32,
    SM90_WG_H16,
    SM90_WG_PAIR,
    SM90_WG_H128,
    SM90_WG_H32_D64,
    SM90_WG_H16_D64,
    SM90_WG_H128_D64,
];

/// The deterministic twin of the wgmma kernel named `base`, if it has one.
pub fn det_twin(base: &str) -> Option<&'static Kernel> {
    let i = DET_BASES.iter().position(|k| k.name == base)?;
    Some(&SM90_WG_DET[i])
}

/// The kernel whose deterministic twin is `twin`, if `twin` is one.
pub fn det_base(twin: &Kernel) -> Option<&'static Kernel> {
    let i = SM90_WG_DET.iter().position(|k| k == twin)?;
    Some(&DET_BASES[i])
}

/// A pass of the deterministic mode (`det`, sm_90a only): at most
/// `threads` threads, `min_ctas` resident CTAs per SM.
const fn det_pass(name: &'static str, threads: u32, min_ctas: u32) -> Kernel {
    k(
        name,
        Param::Det,
        threads,
        Bounds::Max { min_ctas },
        Targets::SM90A,
    )
}

/// The deterministic mode's bound pass: one query row per CTA of
/// [`DET_THREADS`], [`DET_SMEM`] bytes of dynamic shared memory.
pub const DET_BOUNDS: Kernel = det_pass("det_bounds", DET_THREADS, 8);

/// The deterministic mode's key-row bound sums: the grid of
/// `det::key_sum_grid`, [`DET_KEY_SUM_THREADS`] threads,
/// `det::KeySumGrid::smem_bytes` of dynamic shared memory.
pub const DET_KEY_SUMS: Kernel = det_pass("det_key_sums", DET_KEY_SUM_THREADS, 2);

/// The deterministic mode's key-row exponents, grid-stride.
pub const DET_SCALES: Kernel = det_pass("det_scales", DET_THREADS, 8);

/// The deterministic mode's `d_index_k` from the fixed-point sums,
/// grid-stride.
pub const DET_FINISH: Kernel = det_pass("det_finish", DET_THREADS, 8);

/// Dynamic shared memory of [`DET_BOUNDS`]: one f32 per warp.
pub const DET_SMEM: u32 = DET_THREADS / 32 * 4;

/// A forward kernel (`sm90::forward`, `portable::forward`): one CTA of one
/// warpgroup per query row, always launched with exactly its 128 threads,
/// `min_ctas` resident CTAs per SM (the layouts fit them: [`FWD_WG_CTAS`]
/// for the wgmma kernels, `portable::forward::ROWS_CTAS_PER_SM` for the
/// portable ones; `portable::forward` asserts both against this list).
const fn fwd(name: &'static str, targets: Targets, min_ctas: u32) -> Kernel {
    k(
        name,
        Param::Fwd,
        FWD_THREADS,
        Bounds::Exact { min_ctas },
        targets,
    )
}
/// The wgmma forward kernel `name` ([`FWD_WG_CTAS`] resident per SM).
const fn fwd_wg(name: &'static str) -> Kernel {
    fwd(name, Targets::SM90A, FWD_WG_CTAS)
}
/// Resident CTAs per SM of the wgmma forward kernels
/// (`portable::forward::CTAS_PER_SM`, whose layouts fit them).
pub const FWD_WG_CTAS: u32 = 3;
/// The portable forward kernel `name` (two resident per SM).
const fn fwd_rows(name: &'static str) -> Kernel {
    fwd(name, Targets::ALL, 2)
}
/// Threads per CTA of the forward kernels (`portable::forward::THREADS`).
pub const FWD_THREADS: u32 = 128;

/// The wgmma forward kernels (sm_90a), in [`SUPPORTED_HEADS`] x
/// [`SUPPORTED_DIMS`] order.
pub const FWD_WG: [Kernel; 8] = [
    fwd_wg("indexer_fwd_wg_h16_d64"),
    fwd_wg("indexer_fwd_wg_h16_d128"),
    fwd_wg("indexer_fwd_wg_h32_d64"),
    fwd_wg("indexer_fwd_wg_h32_d128"),
    fwd_wg("indexer_fwd_wg_h64_d64"),
    fwd_wg("indexer_fwd_wg_h64_d128"),
    fwd_wg("indexer_fwd_wg_h128_d64"),
    fwd_wg("indexer_fwd_wg_h128_d128"),
];

/// The wgmma forward kernels on a persistent grid (sm_90a), in the order
/// of [`FWD_WG`]: the same walk, each CTA taking rows in turn and issuing
/// a row's prologue loads before the previous row's end
/// (`portable::forward::persistent` says where a plan takes them).
pub const FWD_WG_PERSIST: [Kernel; 8] = [
    fwd_wg("indexer_fwd_wg_persist_h16_d64"),
    fwd_wg("indexer_fwd_wg_persist_h16_d128"),
    fwd_wg("indexer_fwd_wg_persist_h32_d64"),
    fwd_wg("indexer_fwd_wg_persist_h32_d128"),
    fwd_wg("indexer_fwd_wg_persist_h64_d64"),
    fwd_wg("indexer_fwd_wg_persist_h64_d128"),
    fwd_wg("indexer_fwd_wg_persist_h128_d64"),
    fwd_wg("indexer_fwd_wg_persist_h128_d128"),
];

/// The portable forward kernels (every PTX file), in the order of
/// [`FWD_WG`].
pub const FWD_ROWS: [Kernel; 8] = [
    fwd_rows("indexer_fwd_rows_h16_d64"),
    fwd_rows("indexer_fwd_rows_h16_d128"),
    fwd_rows("indexer_fwd_rows_h32_d64"),
    fwd_rows("indexer_fwd_rows_h32_d128"),
    fwd_rows("indexer_fwd_rows_h64_d64"),
    fwd_rows("indexer_fwd_rows_h64_d128"),
    fwd_rows("indexer_fwd_rows_h128_d64"),
    fwd_rows("indexer_fwd_rows_h128_d128"),
];

/// Which of the forward kernels of a shape a plan launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FwdKind {
    /// The portable kernel ([`FWD_ROWS`]), every target.
    Portable,
    /// The wgmma kernel, one CTA per row ([`FWD_WG`]).
    Wgmma,
    /// The wgmma kernel on a persistent grid ([`FWD_WG_PERSIST`]).
    Persistent,
}

/// The forward kernel for `heads` x `dim` of `kind`, or `None` outside
/// the envelope.
pub const fn fwd_kernel(heads: u32, dim: u32, kind: FwdKind) -> Option<Kernel> {
    let mut i = 0;
    while i < SUPPORTED_HEADS.len() {
        let mut j = 0;
        while j < SUPPORTED_DIMS.len() {
            if SUPPORTED_HEADS[i] == heads && SUPPORTED_DIMS[j] == dim {
                let at = i * SUPPORTED_DIMS.len() + j;
                return Some(match kind {
                    FwdKind::Portable => FWD_ROWS[at],
                    FwdKind::Wgmma => FWD_WG[at],
                    FwdKind::Persistent => FWD_WG_PERSIST[at],
                });
            }
            j += 1;
        }
        i += 1;
    }
    None
}

/// An instrument (`Home::Lab`).
const fn lab(kernel: Kernel) -> Kernel {
    Kernel {
        home: Home::Lab,
        ..kernel
    }
}

/// The toolchain smoke kernel (mbarrier, shared memory; `lab::smoke`).
pub const SMOKE: Kernel = lab(k(
    "smoke_mbarrier_reverse",
    Param::Smoke,
    SMOKE_THREADS,
    Bounds::None,
    Targets::ARCH,
));

/// A ceiling kernel of the benchmark (`lab::ceil`), launched with 256
/// threads unless noted.
const fn ceil(name: &'static str, threads: u32) -> Kernel {
    lab(k(name, Param::Ceil, threads, Bounds::None, Targets::ARCH))
}
/// Tensor-core throughput (`mma.sync` chains).
pub const CEIL_MMA: Kernel = ceil("ceil_mma_bf16", 256);
/// Scattered f32 row reduction by `red.global.add`.
pub const CEIL_SCATTER_RED: Kernel = ceil("ceil_scatter_red", 256);
/// Scattered f32 row reduction by `cp.reduce.async.bulk`.
pub const CEIL_SCATTER_BULK: Kernel = ceil("ceil_scatter_bulk", CEIL_BULK_THREADS);
/// bf16 row gather.
pub const CEIL_GATHER: Kernel = ceil("ceil_gather_bf16", 256);
/// Streaming copy.
pub const CEIL_COPY: Kernel = ceil("ceil_copy", 256);
/// Gathered rows through a shared-memory ring, by `cp.async` (with or
/// without the proxy fence) or by TMA (`abi::CEIL_STREAM_*`).
pub const CEIL_GATHER_STREAM: Kernel = ceil("ceil_gather_stream", crate::abi::CEIL_STREAM_THREADS);
/// Gather and reduce mixed (`abi::CEIL_MIX_*`).
pub const CEIL_GATHER_REDUCE: Kernel = ceil("ceil_gather_reduce", 256);

/// The sm_100f tcgen05 smoke kernel (compiled and assembled, not executed).
pub const SM100_SMOKE: Kernel = lab(k(
    "sm100_tcgen05_smoke",
    Param::Sm100Smoke,
    SM100_SMOKE_THREADS,
    Bounds::None,
    Targets::SM100F,
));

/// Heads the stage-2 kernels take (H = 32 zero-padded to the M = 64 tile).
pub const SM100_HEADS: [u32; 2] = [32, 64];
/// Slots per row the stage-2 kernels are specialized for.
pub const SM100_TOPKS: [u32; 3] = [128, 256, 384];

/// A sm_100f stage-2 kernel (persistent: one CTA per SM).
const fn stage2(name: &'static str) -> Kernel {
    Kernel {
        tensor_maps: true,
        ..k(
            name,
            Param::Sm100Stage2,
            SM100_STAGE2_THREADS,
            Bounds::Max { min_ctas: 1 },
            Targets::SM100F,
        )
    }
}

/// The stage-2 kernels, in [`SM100_TOPKS`] x [`SM100_HEADS`] order.
pub const SM100_STAGE2: [Kernel; 6] = [
    stage2("sm100_stage2_t128_h32"),
    stage2("sm100_stage2_t128_h64"),
    stage2("sm100_stage2_t256_h32"),
    stage2("sm100_stage2_t256_h64"),
    stage2("sm100_stage2_t384_h32"),
    stage2("sm100_stage2_t384_h64"),
];

/// The stage-2 kernel for `topk` x `heads` (D = 128), or `None` outside the
/// specializations.
pub const fn stage2_kernel(topk: u32, heads: u32) -> Option<Kernel> {
    let mut i = 0;
    while i < SM100_TOPKS.len() {
        let mut j = 0;
        while j < SM100_HEADS.len() {
            if SM100_TOPKS[i] == topk && SM100_HEADS[j] == heads {
                return Some(SM100_STAGE2[i * SM100_HEADS.len() + j]);
            }
            j += 1;
        }
        i += 1;
    }
    None
}

/// PTX entry name of the stage-2 kernel for `topk` x `heads` (D = 128), or
/// `None` outside the specializations.
pub const fn sm100_stage2_kernel_name(topk: u32, heads: u32) -> Option<&'static str> {
    match stage2_kernel(topk, heads) {
        Some(k) => Some(k.name),
        None => None,
    }
}

/// A sm_100f bring-up probe: one CTA, the tensor maps passed as stage 2's.
const fn probe(name: &'static str) -> Kernel {
    Kernel {
        tensor_maps: true,
        home: Home::Lab,
        ..k(
            name,
            Param::Sm100Probe,
            SM100_PROBE_THREADS,
            Bounds::Max { min_ctas: 1 },
            Targets::SM100F,
        )
    }
}
/// Probe of S = q K^T (M = 64, N = 128, K = 128; A and B K-major).
pub const SM100_PROBE_S: Kernel = probe("sm100_probe_s");
/// Probe of dQ = dS K (M = 64, N = 128, K = 128; B MN-major).
pub const SM100_PROBE_DQ: Kernel = probe("sm100_probe_dq");
/// Probe of dK = dS^T q (M = 128, N = 128, K = `abi::SM100_PROBE_HEADS`;
/// A and B MN-major).
pub const SM100_PROBE_DK: Kernel = probe("sm100_probe_dk");
/// The probes.
pub const SM100_PROBES: [Kernel; 3] = [SM100_PROBE_S, SM100_PROBE_DQ, SM100_PROBE_DK];

/// The watchdog's self-test (watchdog builds only): one CTA; every thread
/// waits on an mbarrier that nobody arrives on.
pub const WATCHDOG_PROBE: Kernel = Kernel {
    home: Home::Watchdog,
    ..k(
        "watchdog_probe",
        Param::Tag,
        WATCHDOG_PROBE_THREADS,
        Bounds::None,
        Targets::ALL,
    )
};

/// Every kernel.
pub const KERNELS: [Kernel; 79] = [
    STAGE1,
    STAGE1_D64,
    CAST,
    ROWS[0],
    ROWS[1],
    ROWS[2],
    ROWS[3],
    ROWS[4],
    ROWS[5],
    ROWS[6],
    ROWS[7],
    SM90_WG,
    SM90_WG_D64,
    SM90_WG_H32,
    SM90_WG_H16,
    SM90_WG_PAIR,
    SM90_WG_H128,
    SM90_WG_H32_D64,
    SM90_WG_H16_D64,
    SM90_WG_H128_D64,
    DENSE_STAGE1,
    DENSE_WG,
    DENSE_WG_DET,
    SMOKE,
    CEIL_MMA,
    CEIL_SCATTER_RED,
    CEIL_SCATTER_BULK,
    CEIL_GATHER,
    CEIL_COPY,
    CEIL_GATHER_REDUCE,
    CEIL_GATHER_STREAM,
    SM100_SMOKE,
    SM100_STAGE2[0],
    SM100_STAGE2[1],
    SM100_STAGE2[2],
    SM100_STAGE2[3],
    SM100_STAGE2[4],
    SM100_STAGE2[5],
    SM100_PROBE_S,
    SM100_PROBE_DQ,
    SM100_PROBE_DK,
    WATCHDOG_PROBE,
    FWD_WG[0],
    FWD_WG[1],
    FWD_WG[2],
    FWD_WG[3],
    FWD_WG[4],
    FWD_WG[5],
    FWD_WG[6],
    FWD_WG[7],
    FWD_WG_PERSIST[0],
    FWD_WG_PERSIST[1],
    FWD_WG_PERSIST[2],
    FWD_WG_PERSIST[3],
    FWD_WG_PERSIST[4],
    FWD_WG_PERSIST[5],
    FWD_WG_PERSIST[6],
    FWD_WG_PERSIST[7],
    FWD_ROWS[0],
    FWD_ROWS[1],
    FWD_ROWS[2],
    FWD_ROWS[3],
    FWD_ROWS[4],
    FWD_ROWS[5],
    FWD_ROWS[6],
    FWD_ROWS[7],
    SM90_WG_DET[0],
    SM90_WG_DET[1],
    SM90_WG_DET[2],
    SM90_WG_DET[3],
    SM90_WG_DET[4],
    SM90_WG_DET[5],
    SM90_WG_DET[6],
    SM90_WG_DET[7],
    SM90_WG_DET[8],
    DET_BOUNDS,
    DET_KEY_SUMS,
    DET_SCALES,
    DET_FINISH,
];

/// The entry named `name`, if any.
pub fn find(name: &str) -> Option<&'static Kernel> {
    KERNELS.iter().find(|k| k.name == name)
}

/// `a == b` for string slices in a const context.
pub const fn const_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

// Names are unique; only kernels that take tensor maps say so, and every
// kernel with bounds or an exact block has a positive thread count.
const _: () = {
    let mut i = 0;
    while i < KERNELS.len() {
        let a = KERNELS[i];
        let mut j = i + 1;
        while j < KERNELS.len() {
            assert!(!const_eq(a.name, KERNELS[j].name));
            j += 1;
        }
        assert!(
            a.tensor_maps
                == matches!(
                    a.param,
                    Param::Sm100Stage2 | Param::Sm100Probe | Param::DenseTile | Param::DenseDet
                ),
            "tensor maps travel in Sm100Params, Sm100ProbeParams and Dense(Det)TileParams"
        );
        assert!(a.threads > 0 && a.threads <= 1024);
        i += 1;
    }
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_shape_has_a_kernel_and_others_do_not() {
        for h in SUPPORTED_HEADS {
            for d in SUPPORTED_DIMS {
                let name = grad_kernel_name(h, d).expect("supported shape");
                assert_eq!(name, std::format!("indexer_bwd_rows_h{h}_d{d}"));
            }
        }
        assert!(grad_kernel_name(48, 128).is_none());
        assert!(grad_kernel_name(64, 96).is_none());
    }

    #[test]
    fn every_supported_shape_has_forward_kernels() {
        for h in SUPPORTED_HEADS {
            for d in SUPPORTED_DIMS {
                let wg = fwd_kernel(h, d, FwdKind::Wgmma).expect("supported shape");
                let pe = fwd_kernel(h, d, FwdKind::Persistent).expect("supported shape");
                let rows = fwd_kernel(h, d, FwdKind::Portable).expect("supported shape");
                assert_eq!(wg.name, std::format!("indexer_fwd_wg_h{h}_d{d}"));
                assert_eq!(pe.name, std::format!("indexer_fwd_wg_persist_h{h}_d{d}"));
                assert_eq!(rows.name, std::format!("indexer_fwd_rows_h{h}_d{d}"));
                for k in [wg, pe] {
                    assert!(k.in_ptx(Target::Sm90a) && !k.in_ptx(Target::Sm90));
                    assert_eq!(k.threads, FWD_THREADS);
                }
                assert!(rows.in_ptx(Target::Sm90) && rows.in_ptx(Target::Sm100f));
            }
        }
        assert!(fwd_kernel(48, 128, FwdKind::Wgmma).is_none());
    }

    #[test]
    fn every_sm100_specialization_has_a_kernel() {
        for t in SM100_TOPKS {
            for h in SM100_HEADS {
                let k = stage2_kernel(t, h).expect("specialization");
                assert_eq!(k.name, std::format!("sm100_stage2_t{t}_h{h}"));
                assert_eq!(sm100_stage2_kernel_name(t, h), Some(k.name));
                assert_eq!(find(k.name), Some(&k));
            }
        }
        assert!(sm100_stage2_kernel_name(512, 64).is_none());
        assert!(sm100_stage2_kernel_name(128, 16).is_none());
    }

    #[test]
    fn bounds_are_tuned_on_sm90a_only_and_every_table_entry_is_found() {
        assert_eq!(STAGE1.min_ctas(Target::Sm90a), Some(3));
        assert_eq!(STAGE1.min_ctas(Target::Sm90), Some(1));
        assert_eq!(STAGE1.min_ctas(Target::Sm100f), Some(1));
        assert_eq!(CAST.min_ctas(Target::Sm90a), None);
        assert!(SM90_WG.exact_block() && !SM90_WG_PAIR.exact_block());
        for k in KERNELS {
            assert_eq!(find(k.name), Some(&k));
        }
        assert!(find("nope").is_none());
        for t in Target::ALL {
            assert_eq!(Target::from_name(t.name()), Some(t));
        }
        assert!(!WATCHDOG_PROBE.in_ptx(Target::Sm90a));
        assert!(!WATCHDOG_PROBE.in_home(Home::Lab, Target::Sm90a));
        // Instruments are in the lab files only, the product in its own.
        for t in [Target::Sm90a, Target::Sm100f] {
            assert!(CEIL_MMA.in_home(Home::Lab, t) && !CEIL_MMA.in_ptx(t));
            assert!(SMOKE.in_home(Home::Lab, t) && !SMOKE.in_ptx(t));
            assert!(STAGE1.in_ptx(t) && !STAGE1.in_home(Home::Lab, t));
        }
        assert!(SM100_PROBE_S.in_home(Home::Lab, Target::Sm100f));
        assert!(!SM100_PROBE_S.in_ptx(Target::Sm100f));
        assert!(!SM100_SMOKE.in_ptx(Target::Sm100f));
        assert!(SM90_WG.in_ptx(Target::Sm90a) && !SM90_WG.in_ptx(Target::Sm90));
    }
}
