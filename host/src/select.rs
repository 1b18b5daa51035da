//! What a plan runs on a GPU, decided from its compute capability, the
//! shape and `Options` alone (no CUDA call), so that the whole table (on
//! [`select`]) and the path each row leads to ([`PathKind`], with the
//! kernels it launches) are unit-tested without a GPU.

use crate::error::{Error, Result};
use crate::gpu::PtxModule;
use crate::shape::{Backend, GradDtype, Options, Shape};
use kernels_gpu::abi::SM100_DIM;
use kernels_gpu::registry::{
    grad_kernel_name, sm100_stage2_kernel_name, CAST, SM100_HEADS, SM100_TOPKS, STAGE1,
};
use kernels_gpu::sm90::bwd;

/// Compute capabilities `(major, minor)` on which the tcgen05 (Blackwell)
/// path has a recorded hardware validation: its kernels run with
/// `Backend::Blackwell` on a GPU of that capability and matched the CPU
/// reference within SPEC's tolerances, with the run recorded (date, GPU,
/// driver, commit, results) in `docs/sm100-design.md`.
///
/// Empty: no sm_100-family GPU has been available, so the tcgen05 path is
/// compiled and assembled, never executed. [`Backend::Auto`] therefore
/// keeps every GPU on the kernels tested on the H200 (the wgmma fast path
/// on 9.0; elsewhere the `mma.sync` row kernels, the same source compiled
/// into that GPU's module); `Options { backend: Backend::Blackwell, .. }`
/// opts in to the tcgen05 kernels explicitly.
pub const TCGEN05_VALIDATED: &[(i32, i32)] = &[];

/// The kernels of one plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Selection {
    /// The PTX module loaded for the GPU.
    pub module: PtxModule,
    /// [`Backend::Hopper`] (wgmma fast path or `mma.sync` row kernels) or
    /// [`Backend::Blackwell`] (tcgen05), never `Auto`.
    pub backend: Backend,
    /// Whether the Hopper backend takes the wgmma fast path (stage-1
    /// launch, then the persistent warpgroup-MMA kernels); only where the
    /// module holds them.
    pub wgmma: bool,
}

/// The module, backend and fast-path choice of a plan for `shape` on a GPU
/// of compute capability `major.minor`, as [`TCGEN05_VALIDATED`] stands
/// (empty today):
///
/// | compute capability | PTX module | `Auto` | `Hopper` | `Blackwell` |
/// |---|---|---|---|---|
/// | below 9.0 | none | [`Error::UnsupportedDevice`] | same | same |
/// | 9.0 (H100, H200) | `sm_90a` | wgmma fast path or row kernels | same | [`Error::BackendUnavailable`] |
/// | 10.0, 10.3 (B200/GB200, B300/GB300) | `sm_100f` | row kernels (tcgen05 only if listed in [`TCGEN05_VALIDATED`]) | row kernels | tcgen05 kernels for the shapes they take, else [`Error::BackendUnavailable`] |
/// | any other >= 9.0 (11.0, 12.0, 12.1, ...) | `sm_90` (portable, JIT-compiled) | row kernels | row kernels | [`Error::BackendUnavailable`] |
///
/// "Row kernels" are the `mma.sync` kernels (one CTA per query row), which
/// every module holds; the wgmma fast path (every H in {16, 32, 64, 128}
/// x D in {64, 128}, topk > 64) is in the `sm_90a` module only.
pub fn select(major: i32, minor: i32, shape: &Shape, requested: Backend) -> Result<Selection> {
    select_with(major, minor, shape, requested, TCGEN05_VALIDATED)
}

/// The backend a plan uses on a GPU of compute capability `major.minor`:
/// [`Backend::Hopper`] (the tested wgmma / `mma.sync` kernels) or
/// [`Backend::Blackwell`] (the tcgen05 kernels), never `Auto`.
///
/// - below 9.0: [`Error::UnsupportedDevice`] whatever was requested;
/// - `Hopper`: Hopper on every supported GPU;
/// - `Auto`: Blackwell only on a capability listed in
///   [`TCGEN05_VALIDATED`] (none today) whose module holds the tcgen05
///   kernels, for a shape they take; Hopper everywhere else;
/// - `Blackwell`: Blackwell on 10.0 and 10.3 for a shape the tcgen05
///   kernels take, otherwise [`Error::BackendUnavailable`] naming the gap.
pub fn select_backend(
    major: i32,
    minor: i32,
    shape: &Shape,
    requested: Backend,
) -> Result<Backend> {
    Ok(select(major, minor, shape, requested)?.backend)
}

fn select_with(
    major: i32,
    minor: i32,
    shape: &Shape,
    requested: Backend,
    validated: &[(i32, i32)],
) -> Result<Selection> {
    let module = PtxModule::for_capability(major, minor)?;
    let unavailable = |reason| Error::BackendUnavailable {
        backend: Backend::Blackwell.name(),
        reason,
        major,
        minor,
    };
    let backend = match requested {
        Backend::Hopper => Backend::Hopper,
        Backend::Auto => {
            if module.has_tcgen05()
                && validated.contains(&(major, minor))
                && blackwell_shape_gap(shape).is_none()
            {
                Backend::Blackwell
            } else {
                Backend::Hopper
            }
        }
        Backend::Blackwell => {
            if !module.has_tcgen05() {
                return Err(unavailable(
                    "the tcgen05 kernels need an sm_100 or sm_103 GPU",
                ));
            }
            if let Some(reason) = blackwell_shape_gap(shape) {
                return Err(unavailable(reason));
            }
            Backend::Blackwell
        }
    };
    let wgmma = backend == Backend::Hopper
        && module.has_wgmma()
        && wg_row(shape).is_some()
        && bwd::supports(shape.rows() as u64, shape.topk as u64);
    Ok(Selection {
        module,
        backend,
        wgmma,
    })
}

/// The wgmma path's kernels for the heads and head dimension of `shape`
/// (H in {16, 32, 64, 128}, D in {64, 128}), or `None`.
fn wg_row(shape: &Shape) -> Option<bwd::WgRow> {
    let (h, d) = (
        u32::try_from(shape.heads).ok()?,
        u32::try_from(shape.head_dim).ok()?,
    );
    bwd::wg_row(h, d)
}

/// Why the tcgen05 kernels cannot take `shape`, or `None` when they can.
pub(crate) fn blackwell_shape_gap(shape: &Shape) -> Option<&'static str> {
    let in_list = |v: usize, list: &[u32]| list.iter().any(|&x| x as usize == v);
    if !in_list(shape.heads, &SM100_HEADS)
        || shape.head_dim != SM100_DIM as usize
        || !in_list(shape.topk, &SM100_TOPKS)
    {
        return Some("shape outside the tcgen05 specializations (H in {32, 64}, D = 128, topk in {128, 256, 384})");
    }
    // q rows are TMA coordinates (i32).
    if shape
        .rows()
        .checked_mul(shape.heads)
        .is_none_or(|v| v > i32::MAX as usize)
    {
        return Some("B * S_q * H must stay below 2^31 for the q tensor map");
    }
    None
}

/// The path a plan runs and the kernels it names, decided from its
/// [`Selection`] and shape alone; `launch::Path` loads what it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PathKind {
    /// The `mma.sync` row kernel `kernel` of the shape (one CTA per query
    /// row, stage 1 fused) after a memset: every module, every shape the
    /// other two paths do not take.
    Rows {
        /// The row kernel's name (`grad_kernel_name`).
        kernel: &'static str,
    },
    /// The Hopper fast path (`sm_90a` module, every H x D, topk > 64):
    /// stage 1, then, when `paired` (H = 64, D = 128, an even row count),
    /// the paired wgmma kernel, then the persistent wgmma kernel of the
    /// shape.
    Sm90 {
        /// The kernels of the shape (`bwd::wg_row`).
        row: bwd::WgRow,
        /// Whether the paired kernel is launched (H = 64, D = 128 and an
        /// even number of rows).
        paired: bool,
    },
    /// The tcgen05 path (`Backend::Blackwell`): stage 1, then the stage-2
    /// specialization `stage2`.
    Sm100 {
        /// The stage-2 kernel's name (`sm100_stage2_kernel_name`).
        stage2: &'static str,
    },
}

impl PathKind {
    /// The path of a plan for `shape` whose kernels `sel` chose.
    pub(crate) fn choose(sel: &Selection, shape: &Shape) -> Result<PathKind> {
        let (heads, dim, topk) = (shape.heads as u32, shape.head_dim as u32, shape.topk as u32);
        Ok(if sel.backend == Backend::Blackwell {
            let stage2 = sm100_stage2_kernel_name(topk, heads).ok_or(Error::Shape {
                name: "topk x heads",
                value: shape.topk,
                expected: "a tcgen05 specialization",
            })?;
            PathKind::Sm100 { stage2 }
        } else if let Some(row) = wg_row(shape).filter(|_| sel.wgmma) {
            let paired = row.paired && bwd::supports_pairs(shape.rows() as u64, shape.topk as u64);
            PathKind::Sm90 { row, paired }
        } else {
            let kernel = grad_kernel_name(heads, dim).ok_or(Error::Shape {
                name: "heads x head_dim",
                value: shape.heads * shape.head_dim,
                expected: "heads in {16, 32, 64, 128} and head_dim in {64, 128}",
            })?;
            PathKind::Rows { kernel }
        })
    }

    /// Names of the kernels `execute` launches on this path, in launch
    /// order: the path's own, then the cast when `d_index_k` is bf16; in
    /// deterministic mode (Hopper fast path) stage 1, the passes, the
    /// wgmma kernels' twins and the finish.
    pub(crate) fn kernels(self, opts: &Options) -> Vec<&'static str> {
        if let (true, PathKind::Sm90 { row, paired }) = (opts.deterministic, self) {
            use kernels_gpu::registry::{
                det_twin, DET_BOUNDS, DET_FINISH, DET_KEY_SUMS, DET_SCALES, SM90_WG_PAIR,
            };
            let twin = |name| det_twin(name).map_or(name, |k| k.name);
            let mut kernels = vec![
                row.stage1,
                DET_BOUNDS.name,
                DET_KEY_SUMS.name,
                DET_SCALES.name,
            ];
            if paired {
                kernels.push(twin(SM90_WG_PAIR.name));
            }
            kernels.extend([twin(row.kernel), DET_FINISH.name]);
            return kernels;
        }
        let d_index_k = opts.d_index_k;
        let mut kernels = match self {
            PathKind::Rows { kernel } => vec![kernel],
            PathKind::Sm90 { row, paired: true } => vec![
                row.stage1,
                kernels_gpu::registry::SM90_WG_PAIR.name,
                row.kernel,
            ],
            PathKind::Sm90 { row, paired: false } => vec![row.stage1, row.kernel],
            PathKind::Sm100 { stage2 } => vec![STAGE1.name, stage2],
        };
        if d_index_k == GradDtype::Bf16 {
            kernels.push(CAST.name);
        }
        kernels
    }
}

/// Checks that `kernel`, which needs `required` bytes of dynamic shared
/// memory per block, fits the `available` bytes a GPU of compute capability
/// `cc` offers a block (its opt-in maximum): otherwise
/// [`Error::SharedMemory`] names both, where the driver would only refuse
/// the launch configuration.
pub fn check_shared_memory(
    kernel: &'static str,
    required: u32,
    available: i32,
    cc: (i32, i32),
) -> Result<()> {
    if i64::from(required) <= i64::from(available) {
        Ok(())
    } else {
        Err(Error::SharedMemory {
            kernel,
            required,
            available: available.max(0) as u32,
            major: cc.0,
            minor: cc.1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Default options with `d_index_k` of type `dk`.
    fn dk_opts(dk: GradDtype) -> Options {
        Options {
            d_index_k: dk,
            ..Options::default()
        }
    }

    fn shape(heads: usize, head_dim: usize, topk: usize) -> Shape {
        Shape {
            batch: 2,
            seq_q: 100,
            seq_k: 300,
            heads,
            head_dim,
            topk,
        }
    }

    /// A shape the tcgen05 kernels and the wgmma fast path both take.
    fn both() -> Shape {
        shape(64, 128, 256)
    }

    /// What a plan for [`both`] runs: `(module, Auto, Hopper, Blackwell)`,
    /// each a backend plus the fast-path flag, or `None` for an error.
    type Row = (
        PtxModule,
        (Backend, bool),
        (Backend, bool),
        Option<(Backend, bool)>,
    );

    fn row(major: i32, minor: i32, validated: &[(i32, i32)]) -> Result<Row> {
        let s = both();
        let pick = |b| {
            select_with(major, minor, &s, b, validated).map(|x| {
                assert_eq!(x.module, PtxModule::for_capability(major, minor).unwrap());
                (x.backend, x.wgmma)
            })
        };
        Ok((
            PtxModule::for_capability(major, minor)?,
            pick(Backend::Auto)?,
            pick(Backend::Hopper)?,
            match pick(Backend::Blackwell) {
                Ok(b) => Some(b),
                Err(Error::BackendUnavailable {
                    major: ma,
                    minor: mi,
                    ..
                }) => {
                    assert_eq!((ma, mi), (major, minor));
                    None
                }
                Err(e) => panic!("{major}.{minor}: {e}"),
            },
        ))
    }

    #[test]
    fn selection_table_by_compute_capability() {
        use Backend::{Blackwell, Hopper};
        let wgmma = (Hopper, true);
        let rows = (Hopper, false);
        let tc = (Blackwell, false);
        let expected: [((i32, i32), Option<Row>); 7] = [
            ((8, 9), None),
            ((9, 0), Some((PtxModule::Sm90a, wgmma, wgmma, None))),
            ((10, 0), Some((PtxModule::Sm100f, rows, rows, Some(tc)))),
            ((10, 3), Some((PtxModule::Sm100f, rows, rows, Some(tc)))),
            ((11, 0), Some((PtxModule::Portable, rows, rows, None))),
            ((12, 0), Some((PtxModule::Portable, rows, rows, None))),
            ((12, 1), Some((PtxModule::Portable, rows, rows, None))),
        ];
        for ((major, minor), want) in expected {
            match (row(major, minor, TCGEN05_VALIDATED), want) {
                (Ok(got), Some(want)) => assert_eq!(got, want, "{major}.{minor}"),
                (
                    Err(Error::UnsupportedDevice {
                        major: ma,
                        minor: mi,
                    }),
                    None,
                ) => {
                    assert_eq!((ma, mi), (major, minor));
                    // The message names the capability.
                    let msg = Error::UnsupportedDevice { major, minor }.to_string();
                    assert!(msg.contains(&format!("{major}.{minor}")), "{msg}");
                }
                (got, want) => panic!("{major}.{minor}: got {got:?}, want {want:?}"),
            }
        }
        // The public entry points follow the same table.
        assert_eq!(
            select_backend(10, 0, &both(), Backend::Auto).unwrap(),
            Hopper
        );
        assert_eq!(
            select(9, 0, &both(), Backend::Auto).unwrap(),
            Selection {
                module: PtxModule::Sm90a,
                backend: Hopper,
                wgmma: true
            }
        );
    }

    #[test]
    fn auto_takes_tcgen05_only_where_a_validation_is_recorded() {
        // Today: nowhere.
        assert!(TCGEN05_VALIDATED.is_empty());
        for (major, minor) in [(10, 0), (10, 3)] {
            assert_eq!(
                select(major, minor, &both(), Backend::Auto)
                    .unwrap()
                    .backend,
                Backend::Hopper
            );
        }
        // With a record for 10.0 only: Auto takes tcgen05 there, for the
        // shapes it has, and nowhere else.
        let v = [(10, 0)];
        let auto = |major, minor, s: &Shape| {
            select_with(major, minor, s, Backend::Auto, &v)
                .unwrap()
                .backend
        };
        assert_eq!(auto(10, 0, &both()), Backend::Blackwell);
        assert_eq!(auto(10, 0, &shape(32, 128, 384)), Backend::Blackwell);
        assert_eq!(auto(10, 0, &shape(64, 128, 512)), Backend::Hopper);
        assert_eq!(auto(10, 3, &both()), Backend::Hopper);
        // A recorded capability whose module has no tcgen05 kernels cannot
        // send Auto to them.
        let v = [(9, 0), (12, 0)];
        for (major, minor) in v {
            let s = select_with(major, minor, &both(), Backend::Auto, &v).unwrap();
            assert_eq!(s.backend, Backend::Hopper, "{major}.{minor}");
        }
        // Hopper stays Hopper whatever is recorded.
        let s = select_with(10, 0, &both(), Backend::Hopper, &[(10, 0)]).unwrap();
        assert_eq!((s.backend, s.wgmma), (Backend::Hopper, false));
    }

    #[test]
    fn forcing_blackwell_checks_the_gpu_and_the_shape() {
        let off = [
            shape(16, 128, 128),
            shape(64, 64, 128),
            shape(64, 128, 512),
            shape(128, 128, 128),
        ];
        for (major, minor) in [(10, 0), (10, 3)] {
            assert_eq!(
                select_backend(major, minor, &shape(32, 128, 384), Backend::Blackwell).unwrap(),
                Backend::Blackwell
            );
            for s in &off {
                assert_eq!(
                    select_backend(major, minor, s, Backend::Auto).unwrap(),
                    Backend::Hopper,
                    "{s:?}"
                );
                assert!(matches!(
                    select_backend(major, minor, s, Backend::Blackwell),
                    Err(Error::BackendUnavailable { major: 10, .. })
                ));
            }
        }
        // Blackwell-generation parts outside the sm_100 family.
        for (major, minor) in [(10, 1), (11, 0), (12, 0), (12, 1)] {
            assert_eq!(
                select_backend(major, minor, &both(), Backend::Auto).unwrap(),
                Backend::Hopper
            );
            assert!(matches!(
                select_backend(major, minor, &both(), Backend::Blackwell),
                Err(Error::BackendUnavailable { .. })
            ));
        }
        let big = Shape {
            batch: 1,
            seq_q: (1 << 25) + 1,
            ..shape(64, 128, 128)
        };
        assert!(matches!(
            select_backend(10, 0, &big, Backend::Blackwell),
            Err(Error::BackendUnavailable { .. })
        ));
    }

    #[test]
    fn row_kernels_must_fit_the_shared_memory_of_a_block() {
        use kernels_gpu::portable::rows::RowSmem;
        use kernels_gpu::registry::{grad_kernel_name, SUPPORTED_DIMS, SUPPORTED_HEADS};
        // Opt-in shared memory per block: 227 KiB on 9.0 and 10.x, 99 KiB
        // on 12.x (CUDA programming guide, compute capabilities table).
        const HOPPER: i32 = 227 * 1024;
        const GEFORCE_BLACKWELL: i32 = 99 * 1024;
        for h in SUPPORTED_HEADS {
            for d in SUPPORTED_DIMS {
                let name = grad_kernel_name(h, d).unwrap();
                let bytes = RowSmem::new(h, d).bytes;
                assert!(check_shared_memory(name, bytes, HOPPER, (9, 0)).is_ok());
                let small = check_shared_memory(name, bytes, GEFORCE_BLACKWELL, (12, 0));
                // Only H = 128, D = 128 (124.5 KiB) exceeds 99 KiB.
                assert_eq!(small.is_err(), (h, d) == (128, 128), "{name}");
                if let Err(e) = small {
                    assert!(matches!(
                        e,
                        Error::SharedMemory {
                            required: 127488,
                            available: 101376,
                            major: 12,
                            minor: 0,
                            ..
                        }
                    ));
                    let msg = e.to_string();
                    assert!(msg.contains(name) && msg.contains("12.0"), "{msg}");
                }
            }
        }
        assert!(check_shared_memory("k", 1, -1, (12, 0)).is_err());
    }

    #[test]
    fn the_fast_path_follows_the_module_and_the_shape() {
        // sm_90a only, every H x D, more than one 64-slot chunk per row.
        let fast =
            |major, minor, s: &Shape| select(major, minor, s, Backend::Hopper).unwrap().wgmma;
        for h in [16, 32, 64, 128] {
            for d in [64, 128] {
                assert!(fast(9, 0, &shape(h, d, 65)), "H {h} D {d}");
                assert!(fast(9, 0, &shape(h, d, 2048)), "H {h} D {d}");
                assert!(!fast(9, 0, &shape(h, d, 64)), "H {h} D {d}");
            }
        }
        for (major, minor) in [(9, 5), (10, 0), (10, 3), (11, 0), (12, 0), (13, 0)] {
            assert!(!fast(major, minor, &both()), "{major}.{minor}");
        }
    }

    #[test]
    fn q_rows_must_fit_a_tma_coordinate() {
        let big = Shape {
            batch: 1,
            seq_q: (1 << 25) + 1,
            ..shape(64, 128, 128)
        };
        assert!(blackwell_shape_gap(&big).is_some());
        assert!(blackwell_shape_gap(&shape(64, 128, 128)).is_none());
    }

    /// The path of a plan for `s` on `major.minor` with `backend`.
    fn path(major: i32, minor: i32, s: &Shape, backend: Backend) -> PathKind {
        PathKind::choose(&select(major, minor, s, backend).unwrap(), s).unwrap()
    }

    #[test]
    fn each_selection_leads_to_one_path() {
        let rows = |h, d| PathKind::Rows {
            kernel: grad_kernel_name(h, d).unwrap(),
        };
        // 9.0: the fast path for H = 64, D = 128, topk > 64, paired when
        // the number of rows is even; the row kernels otherwise.
        let odd = Shape {
            seq_q: 101,
            batch: 1,
            ..both()
        };
        let d128 = bwd::wg_row(64, 128).unwrap();
        assert_eq!(
            path(9, 0, &both(), Backend::Auto),
            PathKind::Sm90 {
                row: d128,
                paired: true,
            }
        );
        assert_eq!(
            path(9, 0, &odd, Backend::Hopper),
            PathKind::Sm90 {
                row: d128,
                paired: false,
            }
        );
        assert_eq!(
            path(9, 0, &shape(64, 128, 64), Backend::Auto),
            rows(64, 128)
        );
        assert_eq!(path(9, 0, &shape(32, 64, 64), Backend::Auto), rows(32, 64));
        // Other GPUs: the row kernels, unless tcgen05 is forced on 10.x.
        for (major, minor) in [(10, 0), (10, 3), (12, 0)] {
            assert_eq!(path(major, minor, &both(), Backend::Auto), rows(64, 128));
        }
        assert_eq!(
            path(10, 3, &shape(32, 128, 384), Backend::Blackwell),
            PathKind::Sm100 {
                stage2: "sm100_stage2_t384_h32"
            }
        );
    }

    #[test]
    fn h64_d64_takes_the_wgmma_row_kernel_above_one_chunk() {
        use GradDtype::{Bf16, F32};
        let d64 = PathKind::Sm90 {
            row: bwd::wg_row(64, 64).unwrap(),
            paired: false,
        };
        // Even and odd row counts alike: no paired kernel for D = 64.
        let odd = Shape {
            seq_q: 101,
            batch: 1,
            ..shape(64, 64, 512)
        };
        for s in [shape(64, 64, 65), shape(64, 64, 2048), odd] {
            for b in [Backend::Auto, Backend::Hopper] {
                let p = path(9, 0, &s, b);
                assert_eq!(p, d64, "{s:?}");
                assert_eq!(
                    p.kernels(&dk_opts(F32)),
                    [
                        kernels_gpu::registry::STAGE1_D64.name,
                        kernels_gpu::registry::SM90_WG_D64.name
                    ]
                );
                assert!(p
                    .kernels(&dk_opts(Bf16))
                    .contains(&kernels_gpu::registry::SM90_WG_D64.name));
            }
        }
        // What the wgmma kernels do not take keeps the row kernel: one
        // chunk, other GPUs.
        let rows = |h, d| PathKind::Rows {
            kernel: grad_kernel_name(h, d).unwrap(),
        };
        assert_eq!(path(9, 0, &shape(64, 64, 64), Backend::Auto), rows(64, 64));
        for (major, minor) in [(10, 0), (12, 0)] {
            assert_eq!(
                path(major, minor, &shape(64, 64, 512), Backend::Auto),
                rows(64, 64)
            );
        }
        let l = bwd::SMEM_D64;
        assert_eq!(bwd::wg_row(64, 64).unwrap().smem, l);
        assert!(bwd::wg_row(64, 96).is_none());
    }

    #[test]
    fn h128_h32_and_h16_take_their_wgmma_kernels_above_one_chunk() {
        use GradDtype::{Bf16, F32};
        let rows = |h, d| PathKind::Rows {
            kernel: grad_kernel_name(h, d).unwrap(),
        };
        let s1_d64 = kernels_gpu::registry::STAGE1_D64.name;
        for (h, d, name) in [
            (128u32, 128u32, "indexer_bwd_wg_h128_d128"),
            (32, 128, "indexer_bwd_wg_h32_d128"),
            (16, 128, "indexer_bwd_wg_h16_d128"),
            (128, 64, "indexer_bwd_wg_h128_d64"),
            (32, 64, "indexer_bwd_wg_h32_d64"),
            (16, 64, "indexer_bwd_wg_h16_d64"),
        ] {
            let want = PathKind::Sm90 {
                row: bwd::wg_row(h, d).unwrap(),
                paired: false,
            };
            let stage1 = if d == 64 { s1_d64 } else { STAGE1.name };
            let (hs, ds) = (h as usize, d as usize);
            // Even and odd row counts alike: no paired kernel; stage-1
            // chunk counts from SKIP_MIN_TOPK on, as for H = 64.
            let odd = Shape {
                seq_q: 101,
                batch: 1,
                ..shape(hs, ds, 512)
            };
            for s in [shape(hs, ds, 65), shape(hs, ds, 2048), odd] {
                for b in [Backend::Auto, Backend::Hopper] {
                    let p = path(9, 0, &s, b);
                    assert_eq!(p, want, "{s:?}");
                    assert_eq!(p.kernels(&dk_opts(F32)), [stage1, name]);
                    assert!(p.kernels(&dk_opts(Bf16)).contains(&name));
                }
                let counts = s.topk >= bwd::SKIP_MIN_TOPK as usize;
                assert_eq!(crate::launch::sm90::row_chunks(&s), counts, "{s:?}");
            }
            // One chunk and other GPUs keep the row kernels.
            assert_eq!(path(9, 0, &shape(hs, ds, 64), Backend::Auto), rows(h, d));
            for (major, minor) in [(10, 0), (12, 0)] {
                assert_eq!(
                    path(major, minor, &shape(hs, ds, 512), Backend::Auto),
                    rows(h, d)
                );
            }
        }
        // H = 64 keeps its chunk counts from SKIP_MIN_TOPK on.
        assert!(crate::launch::sm90::row_chunks(&shape(64, 128, 2048)));
        assert!(crate::launch::sm90::row_chunks(&shape(64, 64, 2048)));
        // H = 128 runs one CTA of two halves per SM, on the paired layout.
        let h128 = bwd::wg_row(128, 128).unwrap();
        assert_eq!(
            (h128.threads, h128.bytes),
            (bwd::PAIR.threads, bwd::PAIR.bytes)
        );
        assert_eq!(h128.grid(10_000, 132), 132);
        assert_eq!(bwd::wg_row(64, 128).unwrap().grid(10_000, 132), 264);
        assert!(bwd::wg_row(128, 96).is_none());
    }

    #[test]
    fn each_path_names_its_kernels_in_launch_order() {
        use GradDtype::{Bf16, F32};
        let row = grad_kernel_name(64, 128).unwrap();
        let t = "sm100_stage2_t256_h64";
        let (d128, d64) = (bwd::wg_row(64, 128).unwrap(), bwd::wg_row(64, 64).unwrap());
        let h32 = bwd::wg_row(32, 128).unwrap();
        let cases: [(PathKind, &[&str]); 6] = [
            (PathKind::Rows { kernel: row }, &[row]),
            (
                PathKind::Sm90 {
                    row: d128,
                    paired: true,
                },
                &[
                    STAGE1.name,
                    kernels_gpu::registry::SM90_WG_PAIR.name,
                    kernels_gpu::registry::SM90_WG.name,
                ],
            ),
            (
                PathKind::Sm90 {
                    row: d128,
                    paired: false,
                },
                &[STAGE1.name, kernels_gpu::registry::SM90_WG.name],
            ),
            (
                PathKind::Sm90 {
                    row: d64,
                    paired: false,
                },
                &["indexer_score_grad_d64", "indexer_bwd_wg_h64_d64"],
            ),
            (
                PathKind::Sm90 {
                    row: h32,
                    paired: false,
                },
                &["indexer_score_grad_d128", "indexer_bwd_wg_h32_d128"],
            ),
            (PathKind::Sm100 { stage2: t }, &[STAGE1.name, t]),
        ];
        for (p, names) in cases {
            assert_eq!(p.kernels(&dk_opts(F32)), names, "{p:?}");
            let mut with_cast = names.to_vec();
            with_cast.push(CAST.name);
            assert_eq!(p.kernels(&dk_opts(Bf16)), with_cast, "{p:?}");
        }
        assert_eq!(
            path(10, 0, &both(), Backend::Blackwell).kernels(&dk_opts(F32)),
            [STAGE1.name, t]
        );
    }

    #[test]
    fn deterministic_mode_launches_the_passes_and_the_twins() {
        use GradDtype::{Bf16, F32};
        let row = bwd::wg_row(64, 128).unwrap();
        let det = |dk| Options {
            deterministic: true,
            ..dk_opts(dk)
        };
        for dk in [F32, Bf16] {
            // No cast: the finish writes either type.
            assert_eq!(
                PathKind::Sm90 { row, paired: true }.kernels(&det(dk)),
                [
                    STAGE1.name,
                    "det_bounds",
                    "det_key_sums",
                    "det_scales",
                    "indexer_bwd_wg_pair_det_h64_d128",
                    "indexer_bwd_wg_det_h64_d128",
                    "det_finish",
                ]
            );
        }
        let h128 = bwd::wg_row(128, 64).unwrap();
        assert_eq!(
            PathKind::Sm90 {
                row: h128,
                paired: false
            }
            .kernels(&det(F32))[4],
            "indexer_bwd_wg_det_h128_d64"
        );
        // Every wgmma kernel has its twin, in the registry and the module.
        for k in kernels_gpu::registry::DET_BASES {
            let twin = kernels_gpu::registry::det_twin(k.name).unwrap();
            assert_eq!(kernels_gpu::registry::det_base(twin), Some(&k));
            assert_eq!((twin.threads, twin.bounds), (k.threads, k.bounds));
        }
    }
}
