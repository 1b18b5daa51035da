//! Bring-up checks for the first run of the Blackwell (sm_100 family)
//! path on a GPU: the tcgen05 smoke kernel ([`smoke`]) and the MMA probes
//! ([`mma_probes`]), each compared against the CPU. **Compiled, not
//! executed**: no sm_100-family GPU has been available, so these checks
//! have never run; on any other GPU they return
//! [`Error::BackendUnavailable`].
//!
//! A probe runs one GEMM of a stage-2 chunk the way stage 2 does (operand
//! placement, instruction and shared-memory descriptors, MMA steps,
//! tensor-memory lane mapping; `kernels-gpu/src/sm100/probe.rs`) on
//! inputs that make every product exact in f32, so any mismatch is a
//! layout or descriptor error, not rounding. [`PROBES`] lists them in the
//! order a bring-up should run them (each needs only what the ones before
//! it established); [`ProbeSpec::isolates`] says what each one pins down.
//! On a mismatch the report's `detail` says where the wrong elements are
//! and which of the design doc's unconfirmed readings of the hardware
//! ([`Model`]: gather4 swizzle, MN-major LBO/SBO roles, swizzle anchor,
//! M = 64 lane layout) reproduces the output exactly.
//!
//! The inputs, the CPU product, the hardware model and the diagnosis are
//! plain functions, unit-tested here without a GPU.

mod diagnose;
mod model;

pub use diagnose::{describe_indices, diagnose, diagnose_smoke, timeout_notes, TOL};
pub use model::{
    probe_inputs, read_back, reference, rows, simulate, small_values, smoke_inputs, smoke_product,
    Gather4Swizzle, M64Lanes, MnStrides, Model, ProbeInputs, ProbeOutput, SwizzleAnchor, HEADS,
    HOST_FILL, KEY_ROWS, LANES, N, SIM_UNDEFINED, SMOKE_K, SMOKE_M, SMOKE_N, TMEM_FILL,
    VALUE_DENOM, VALUE_MAX_NUM,
};

use crate::error::{Error, Result};
use crate::gpu::{self, PtxModule};
use crate::launch::sm100;
use crate::shape::{Backend, Shape};
use cudarc::driver::{
    result, sys, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
};
use half::bf16;
use kernels_gpu::abi::{
    Sm100ProbeParams, Sm100SmokeParams, TensorMap, PROBE_K_GATHER4, PROBE_Q_TMA,
    PROBE_STATUS_WORDS, SM100_PROBE_THREADS, SM100_SMOKE_SMEM, SM100_SMOKE_THREADS,
};
use kernels_gpu::registry::{SM100_PROBE_DK, SM100_PROBE_DQ, SM100_PROBE_S, SM100_SMOKE};
use kernels_gpu::sm100::budget::SM100_PROBE_SMEM;
use std::sync::Arc;

/// The outcome of one check.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeReport {
    /// The check ([`ProbeSpec::name`], or `"tcgen05_smoke"`).
    pub name: &'static str,
    /// Largest `|got - expected|` (infinite when an element is not finite).
    pub max_abs_err: f64,
    /// `||got - expected|| / ||expected||` (Frobenius).
    pub rel_err: f64,
    /// Every element within [`TOL`] and every wait completed.
    pub ok: bool,
    /// `exact: ...` when `ok`; otherwise where the wrong elements are and
    /// what explains them, or why the launch failed.
    pub detail: String,
}

/// The GEMM a probe runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gemm {
    /// S = q K^T: M = 64 heads, N = 128 slots, K = D; q and K K-major.
    S,
    /// dQ = dS K: M = 64 heads, N = 128 (D), K = 128 slots; K MN-major.
    Dq,
    /// dK = dS^T q: M = 128 slots, N = 128 (D), K = 64 heads; dS and q
    /// MN-major.
    Dk,
}

impl Gemm {
    /// The probe kernel of this GEMM.
    pub fn kernel(self) -> &'static str {
        match self {
            Gemm::S => SM100_PROBE_S.name,
            Gemm::Dq => SM100_PROBE_DQ.name,
            Gemm::Dk => SM100_PROBE_DK.name,
        }
    }
}

/// One MMA probe: its GEMM and how its operands reach shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeSpec {
    /// Short name, used in reports.
    pub name: &'static str,
    /// The GEMM.
    pub gemm: Gemm,
    /// `PROBE_K_GATHER4` / `PROBE_Q_TMA`: which operands TMA writes (the
    /// others are stored by the CTA's threads).
    pub flags: u32,
    /// What a failure of this probe (after the earlier ones passed) points
    /// at.
    pub isolates: &'static str,
}

/// The MMA probes in bring-up order: with operands stored by the threads
/// first (descriptors and lane layouts alone), then with TMA writing them
/// as stage 2 does.
pub const PROBES: [ProbeSpec; 6] = [
    ProbeSpec {
        name: "s_stores",
        gemm: Gemm::S,
        flags: 0,
        isolates: "S = q K^T with q and K stored at q_at / k_at: the K-major 128-byte-swizzle \
                   descriptors (SBO, 32-byte K steps inside a swizzled row, the jump to the next \
                   64-column region), the M = 64 instruction descriptor, and the M = 64 \
                   accumulator lanes (layout F)",
    },
    ProbeSpec {
        name: "dq_stores",
        gemm: Gemm::Dq,
        flags: 0,
        isolates: "dQ = dS K with dS at ds_at and K at k_at: B MN-major under the 128-byte \
                   swizzle (LBO = one 16 KiB K region between the two 64-column halves of D, \
                   SBO = 1024 between 8-slot groups), A K-major as in S",
    },
    ProbeSpec {
        name: "dk_stores",
        gemm: Gemm::Dk,
        flags: 0,
        isolates: "dK = dS^T q: A (dS) and B (q) MN-major (LBO = one 8 KiB region), the \
                   transpose-A-and-B instruction descriptor with M = 128, the M = 128 \
                   accumulator lanes (layout D), 64 heads in four K steps",
    },
    ProbeSpec {
        name: "s_k_gather4",
        gemm: Gemm::S,
        flags: PROBE_K_GATHER4,
        isolates: "S with the K stage written by stage 2's tile::gather4 loads (four rows of \
                   128 bytes at 512-byte offsets) through a tensor map passed in the kernel \
                   parameter: whether TMA swizzles gather4 rows by shared-memory address",
    },
    ProbeSpec {
        name: "dq_k_gather4",
        gemm: Gemm::Dq,
        flags: PROBE_K_GATHER4,
        isolates: "dQ with the gathered K stage read MN-major (gather4 placement seen \
                   through the transposed read)",
    },
    ProbeSpec {
        name: "dk_q_tma",
        gemm: Gemm::Dk,
        flags: PROBE_Q_TMA,
        isolates: "dK with q written by stage 2's TMA tile loads (box 64 x 64, 128-byte \
                   swizzle) through the parameter-space tensor map, read MN-major",
    },
];

/// Name of the smoke kernel's report.
pub const SMOKE_NAME: &str = "tcgen05_smoke";

/// [`Error::BackendUnavailable`] unless the context's GPU is of the sm_100
/// family (the only one whose module holds the tcgen05 kernels).
fn require_sm100(ctx: &Arc<CudaContext>) -> Result<()> {
    let (major, minor) = ctx.compute_capability()?;
    if PtxModule::for_capability(major, minor)?.has_tcgen05() {
        Ok(())
    } else {
        Err(Error::BackendUnavailable {
            backend: Backend::Blackwell.name(),
            reason: "the tcgen05 bring-up checks need an sm_100 or sm_103 GPU",
            major,
            minor,
        })
    }
}

/// A report for a check whose launch or execution failed.
fn launch_failed(name: &'static str, why: String) -> ProbeReport {
    ProbeReport {
        name,
        max_abs_err: f64::INFINITY,
        rel_err: f64::INFINITY,
        ok: false,
        detail: why,
    }
}

/// The report detail of a probe whose launch failed: which waits gave up
/// when the probe's status words (read from host memory after the failure)
/// say so, else what a fault there points at.
fn failure_detail(spec: &ProbeSpec, err: &str, status: &[u32; PROBE_STATUS_WORDS]) -> String {
    let waits = timeout_notes(status);
    let what = if waits.is_empty() {
        format!("launch or execution failed: {err}")
    } else {
        format!(
            "{}, so the probe trapped (it neither reads nor frees tensor memory, nor exits, \
             while the work it waited for may still write) and the launch failed: {err}",
            waits.join("; ")
        )
    };
    format!(
        "{what}; {}; the context is unusable after this, so the later probes were not run",
        launch_hint(spec)
    )
}

/// What a failed probe launch points at.
fn launch_hint(spec: &ProbeSpec) -> &'static str {
    if spec.flags & PROBE_K_GATHER4 != 0 {
        "a fault here, after the stored-operand probes passed, points at tile::gather4 \
         (its 512-byte destinations under the 128-byte swizzle) or at the tensor map \
         passed in the kernel parameter"
    } else if spec.flags & PROBE_Q_TMA != 0 {
        "a fault here points at the q tile load or the tensor map passed in the kernel \
         parameter"
    } else {
        "a fault here points at the MMA operands (descriptors, instruction descriptor) or \
         at tensor-memory allocation / access"
    }
}

/// Runs the tcgen05 smoke kernel (one M = 128, N = 64, K = 16 MMA from
/// no-swizzle shared-memory tiles, read back by `tcgen05.ld`) and checks
/// it against the CPU. A launch or execution failure is reported in the
/// returned report; `Err` means the check could not be set up (not an
/// sm_100-family GPU: [`Error::BackendUnavailable`]; module load;
/// allocation).
pub fn smoke(ctx: &Arc<CudaContext>) -> Result<ProbeReport> {
    require_sm100(ctx)?;
    let module = super::load_module(ctx)?;
    let f = module.load_function(SM100_SMOKE.name)?;
    let stream = ctx.default_stream();
    let (a, b) = smoke_inputs();
    let da = stream.clone_htod(&a)?;
    let db = stream.clone_htod(&b)?;
    let mut dout = stream.clone_htod(&vec![HOST_FILL; SMOKE_M * SMOKE_N])?;
    let mut run = || -> Result<Vec<u32>> {
        {
            let (pa, _ga) = da.device_ptr(&stream);
            let (pb, _gb) = db.device_ptr(&stream);
            let (po, _go) = dout.device_ptr_mut(&stream);
            let p = Sm100SmokeParams {
                a: pa,
                b: pb,
                out: po,
                tmap: 0,
            };
            // SAFETY: the buffers hold the documented 128 x 16, 64 x 16
            // bf16 and 128 x 64 f32; one CTA of SM100_SMOKE_THREADS with
            // SM100_SMOKE_SMEM bytes, as the kernel documents; no tensor map.
            unsafe {
                gpu::launch(&stream, &f, 1, SM100_SMOKE_THREADS, SM100_SMOKE_SMEM, &p)?;
            }
        }
        stream.synchronize()?;
        Ok(stream.clone_dtoh(&dout)?)
    };
    Ok(match run() {
        Ok(out) => diagnose_smoke(SMOKE_NAME, &a, &b, &out),
        Err(e) => launch_failed(
            SMOKE_NAME,
            format!("launch or execution failed: {e}; the context is unusable after this"),
        ),
    })
}

/// Runs every probe of [`PROBES`] in order and compares each with the CPU
/// ([`diagnose()`]). Stops after a probe whose launch or execution fails
/// (reported as such: the context is unusable after a fault), so the last
/// report may be that failure. `Err` means the probes could not be set up
/// (not an sm_100-family GPU: [`Error::BackendUnavailable`]; module load;
/// allocation; tensor-map encoding). Never panics on other GPUs.
pub fn mma_probes(ctx: &Arc<CudaContext>) -> Result<Vec<ProbeReport>> {
    mma_probes_with(ctx, |_| {})
}

/// [`mma_probes`], calling `before` with each probe just before it is
/// launched (print its name there, and a hang is attributed to it).
pub fn mma_probes_with(
    ctx: &Arc<CudaContext>,
    mut before: impl FnMut(&ProbeSpec),
) -> Result<Vec<ProbeReport>> {
    require_sm100(ctx)?;
    let module = super::load_module(ctx)?;
    let stream = ctx.default_stream();
    let x = probe_inputs();
    let bufs = Buffers {
        q: stream.clone_htod(&x.q)?,
        k: stream.clone_htod(&x.k)?,
        ids: stream.clone_htod(&x.ids)?,
        ds: stream.clone_htod(&x.ds)?,
    };
    let maps = encode_maps(&stream, &bufs)?;
    let status = MappedStatus::new(ctx)?;
    let mut reports = Vec::with_capacity(PROBES.len());
    for spec in &PROBES {
        before(spec);
        let run = || -> Result<ProbeOutput> {
            let f = module.load_function(spec.gemm.kernel())?;
            gpu::set_dynamic_smem(&f, SM100_PROBE_SMEM)?;
            run_probe(&stream, &f, spec, &bufs, maps, &status)
        };
        match run() {
            Ok(out) => reports.push(diagnose(spec, &x, &out)),
            Err(e) => {
                let why = failure_detail(spec, &e.to_string(), &status.read());
                reports.push(launch_failed(spec.name, why));
                break;
            }
        }
    }
    Ok(reports)
}

/// The probes' status words in host-mapped pinned memory: a probe that
/// gives up on a wait sets its word there and traps, which loses the
/// context (and with it any device buffer), while host memory stays
/// readable.
struct MappedStatus {
    /// Host address of the words.
    host: *mut u32,
    /// Their device address (`Sm100ProbeParams::status`).
    device: sys::CUdeviceptr,
}

impl MappedStatus {
    /// Maps [`PROBE_STATUS_WORDS`] zeroed words for `ctx`'s device.
    fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        ctx.bind_to_thread()?;
        let bytes = PROBE_STATUS_WORDS * std::mem::size_of::<u32>();
        // SAFETY: a fresh pinned allocation of `bytes`, mapped into the
        // device address space (DEVICEMAP); zeroed before any kernel sees
        // it; freed by `Drop` (also after a failure: `new` owns it from
        // here, and a failed pointer query drops it).
        unsafe {
            let host = result::malloc_host(bytes, sys::CU_MEMHOSTALLOC_DEVICEMAP)? as *mut u32;
            std::ptr::write_bytes(host, 0, PROBE_STATUS_WORDS);
            let mut m = MappedStatus { host, device: 0 };
            sys::cuMemHostGetDevicePointer_v2(&mut m.device, host as *mut _, 0).result()?;
            Ok(m)
        }
    }

    /// Zeroes the words (before a launch).
    fn clear(&self) {
        for i in 0..PROBE_STATUS_WORDS {
            // SAFETY: `host` holds PROBE_STATUS_WORDS words for our
            // lifetime; no kernel runs while the host clears them.
            unsafe { std::ptr::write_volatile(self.host.add(i), 0) };
        }
    }

    /// The words as the device left them (after the launch ended, in
    /// success or failure).
    fn read(&self) -> [u32; PROBE_STATUS_WORDS] {
        // SAFETY: as in `clear`; the device wrote them with a system-scope
        // fence before trapping, and the launch has ended.
        std::array::from_fn(|i| unsafe { std::ptr::read_volatile(self.host.add(i)) })
    }
}

impl Drop for MappedStatus {
    fn drop(&mut self) {
        // SAFETY: allocated by `malloc_host` in `new`, freed once. After a
        // trap the context may refuse; the pinned pages are then released
        // with the context, so the error is ignored.
        let _ = unsafe { result::free_host(self.host as *mut _) };
    }
}

/// The probes' inputs on the device.
struct Buffers {
    q: CudaSlice<bf16>,
    k: CudaSlice<bf16>,
    ids: CudaSlice<i32>,
    ds: CudaSlice<bf16>,
}

/// The shape whose tensor maps the probes use: [`KEY_ROWS`] key rows and
/// one query row of [`HEADS`] heads, one chunk of [`N`] slots.
const PROBE_SHAPE: Shape = Shape {
    batch: 1,
    seq_q: 1,
    seq_k: KEY_ROWS,
    heads: HEADS,
    head_dim: N,
    topk: N,
};

/// The two tensor maps as stage 2 encodes them (`sm100::map_args`), over
/// `k` as the key rows and `q` as one query row of [`HEADS`] heads.
fn encode_maps(stream: &Arc<CudaStream>, b: &Buffers) -> Result<(TensorMap, TensorMap)> {
    let (k_args, q_args) = sm100::map_args(&PROBE_SHAPE)?;
    let (pk, _gk) = b.k.device_ptr(stream);
    let (pq, _gq) = b.q.device_ptr(stream);
    Ok((
        crate::tma::encode(pk, &k_args)?,
        crate::tma::encode(pq, &q_args)?,
    ))
}

/// One launch of a probe kernel and its output.
fn run_probe(
    stream: &Arc<CudaStream>,
    f: &CudaFunction,
    spec: &ProbeSpec,
    b: &Buffers,
    (k_map, q_map): (TensorMap, TensorMap),
    status: &MappedStatus,
) -> Result<ProbeOutput> {
    let mut out = stream.clone_htod(&vec![HOST_FILL; rows(spec.gemm) * N])?;
    let mut lanes = stream.clone_htod(&vec![HOST_FILL; LANES * N])?;
    // The uploads above are ordered before the launch on `stream`; the
    // previous probe's launch ended at its synchronization.
    status.clear();
    {
        let (q, _g0) = b.q.device_ptr(stream);
        let (k, _g1) = b.k.device_ptr(stream);
        let (ids, _g2) = b.ids.device_ptr(stream);
        let (ds, _g3) = b.ds.device_ptr(stream);
        let (o, _g4) = out.device_ptr_mut(stream);
        let (l, _g5) = lanes.device_ptr_mut(stream);
        let p = Sm100ProbeParams {
            k_map,
            q_map,
            q,
            k,
            ids,
            ds,
            out: o,
            lanes: l,
            status: status.device,
            flags: spec.flags,
            _pad: 0,
        };
        // SAFETY: the buffers have the sizes `Sm100ProbeParams` documents
        // (cudarc allocations are 256-byte aligned; `status` is mapped host
        // memory of PROBE_STATUS_WORDS words), the ids are distinct
        // rows of `k`, the maps were encoded over `k` and `q` and live in
        // the parameter; one CTA of SM100_PROBE_THREADS with
        // SM100_PROBE_SMEM bytes, which `f` was configured for.
        unsafe {
            gpu::launch(stream, f, 1, SM100_PROBE_THREADS, SM100_PROBE_SMEM, &p)?;
        }
    }
    stream.synchronize()?;
    Ok(ProbeOutput {
        out: stream.clone_dtoh(&out)?,
        lanes: stream.clone_dtoh(&lanes)?,
        status: status.read(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_cover_each_gemm_with_stores_first_then_tma() {
        for g in [Gemm::S, Gemm::Dq, Gemm::Dk] {
            let of: Vec<&ProbeSpec> = PROBES.iter().filter(|p| p.gemm == g).collect();
            assert_eq!(of.len(), 2, "{g:?}");
            assert_eq!(of[0].flags, 0, "{g:?}: stored operands first");
            assert_ne!(of[1].flags, 0, "{g:?}: then TMA");
        }
        let first_tma = PROBES.iter().position(|p| p.flags != 0).unwrap();
        assert!(PROBES[..first_tma].iter().all(|p| p.flags == 0));
        assert!(PROBES[first_tma..].iter().all(|p| p.flags != 0));
        // TMA only where the probe's GEMM reads that operand.
        for p in &PROBES {
            assert!(p.gemm != Gemm::Dk || p.flags & PROBE_K_GATHER4 == 0);
            assert!(p.gemm != Gemm::Dq || p.flags & PROBE_Q_TMA == 0);
        }
        let names: std::collections::BTreeSet<&str> = PROBES.iter().map(|p| p.name).collect();
        assert_eq!(names.len(), PROBES.len());
    }

    #[test]
    fn a_probe_that_gave_up_names_the_wait_and_the_trap() {
        let spec = PROBES.iter().find(|p| p.name == "s_k_gather4").unwrap();
        let d = failure_detail(spec, "unspecified launch failure", &[1, 0]);
        assert!(d.starts_with("the TMA loads"), "{d}");
        assert!(d.contains("trapped") && d.contains("unspecified launch failure"));
        assert!(!d.contains("MMA commit"), "{d}");
        assert!(d.contains("tile::gather4") && d.contains("later probes were not run"));
        let d = failure_detail(spec, "e", &[0, 1]);
        assert!(
            d.starts_with("the MMA commit did not arrive within 2 s"),
            "{d}"
        );
        // No word set: a fault, not a timeout.
        let d = failure_detail(spec, "e", &[0, 0]);
        assert!(d.starts_with("launch or execution failed: e"), "{d}");
        assert!(!d.contains("trapped"), "{d}");
    }

    #[test]
    fn probe_maps_have_the_geometry_of_stage_2s() {
        let (k, q) = sm100::map_args(&PROBE_SHAPE).unwrap();
        assert_eq!(k.dims, [N as u64, KEY_ROWS as u64]);
        assert_eq!(k.box_dims, [64, 1]);
        assert_eq!(q.dims, [N as u64, HEADS as u64]);
        assert_eq!(q.box_dims, [64, HEADS as u32]);
    }
}
