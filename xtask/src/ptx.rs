//! `build-ptx`: pinned nightly, nvptx64 build of `kernels-gpu`, link step,
//! stale check, and the `ptxas -v` gate (errors, spills, stack frames).

use crate::link::{LINK_MODE_ENV, LLVM_BIN_ENV, PTX_FEATURE_ENV};
use crate::util;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One committed PTX file: how it is built and what `ptxas` checks it for.
pub struct Arch {
    /// `.target` of the file: rustc's `-Ctarget-cpu`, the `kernels_arch`
    /// cfg value the kernels are gated on, and the file name
    /// (`kernels_<target>.ptx`).
    pub target: &'static str,
    /// PTX ISA version feature for `llc`.
    pub ptx_feature: &'static str,
    /// GPU targets whose machine code is shipped beside the PTX
    /// (`kernels-gpu/sass/kernels_<gpu>.cubin`, embedded by the host, which
    /// loads it on exactly that compute capability and the PTX elsewhere).
    /// Each must assemble with no spills and no stack frame.
    pub sass: &'static [&'static str],
    /// GPU targets the file is also assembled for as a check only (same
    /// gate), where the driver JIT-compiles the PTX.
    pub check_only: &'static [&'static str],
}

/// The committed PTX files (the host picks one by exact compute
/// capability, `host/src/gpu.rs`) and the machine code assembled from them:
/// - `sm_90a` (H100/H200): every Hopper kernel, wgmma included; SASS for
///   `sm_90a`.
/// - `sm_100f` (the sm_100 family: B200/GB200 at 10.0, B300/GB300 at
///   10.3): the tcgen05 kernels and the `mma.sync` row kernels. A family
///   target needs PTX ISA 8.8; `ptxas` accepts `tcgen05.*` and
///   `tile::gather4` there and assembles the file for `sm_100a` and
///   `sm_103a` (`docs/sm100-design.md`, "Targets"); compiled, not executed.
/// - `sm_90` (no architecture-specific features): stage 1, the `mma.sync`
///   row kernels and the cast, for any other GPU of compute capability 9.0
///   or newer; SASS for `sm_120` (binary-compatible with every 12.x GPU),
///   the driver JIT-compiles the PTX on the rest.
pub const ARCHS: [Arch; 3] = [
    Arch {
        target: "sm_90a",
        ptx_feature: "+ptx81",
        sass: &["sm_90a"],
        check_only: &[],
    },
    Arch {
        target: "sm_100f",
        ptx_feature: "+ptx88",
        sass: &["sm_100a", "sm_103a"],
        check_only: &[],
    },
    Arch {
        target: "sm_90",
        ptx_feature: "+ptx81",
        sass: &["sm_120"],
        check_only: &["sm_90"],
    },
];

/// The lab's PTX files (`--cfg kernels_lab`, `kernels-gpu/src/lab`): the
/// instruments of the two architecture-specific targets, with the same
/// gates; machine code shipped for `sm_90a` (the benchmark's ceilings on
/// the H100/H200), the sm_100f file assembled as a check only (its
/// bring-up probes are compiled, not executed).
pub const LAB_ARCHS: [Arch; 2] = [
    Arch {
        target: "sm_90a",
        ptx_feature: "+ptx81",
        sass: &["sm_90a"],
        check_only: &[],
    },
    Arch {
        target: "sm_100f",
        ptx_feature: "+ptx88",
        sass: &[],
        check_only: &["sm_100a"],
    },
];

/// `nvidia-cuda-nvcc` wheel that provides `ptxas` (pinned for reproducible checks).
pub const PTXAS_PACKAGE: &str = "nvidia-cuda-nvcc==13.0.88";

/// Disk taken by `.venv` with [`PTXAS_PACKAGE`] installed (measured on
/// Linux x86-64; printed with the install step and in the README).
pub const PTXAS_VENV_MB: u32 = 315;

/// Disk taken by the pinned nightly with `rust-src` and `llvm-tools`
/// under `~/.rustup/toolchains` (measured as above).
pub const NIGHTLY_MB: u32 = 870;

/// LLVM full-unroll threshold used by rustc and by the link step's `opt`.
pub const UNROLL_THRESHOLD: u32 = 4000;

/// Committed PTX path of the product module for `arch`.
pub fn ptx_path(root: &Path, arch: &str) -> PathBuf {
    Variant::Committed.ptx_path(root, arch)
}

/// The nightly named in `kernels-gpu/rust-toolchain.toml` (single source).
pub fn pinned_nightly(root: &Path) -> Result<String, String> {
    let f = root.join("kernels-gpu/rust-toolchain.toml");
    let s = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
    s.lines()
        .filter_map(|l| l.trim().strip_prefix("channel"))
        .filter_map(|l| l.split('"').nth(1))
        .next()
        .map(str::to_string)
        .ok_or_else(|| format!("{}: no channel", f.display()))
}

/// Installs the pinned nightly with rust-src and llvm-tools when missing
/// (automatic installs are off on these machines), returns its LLVM bin dir.
pub fn ensure_toolchain(nightly: &str) -> Result<PathBuf, String> {
    let sysroot = |n: &str| -> Option<PathBuf> {
        let o = Command::new("rustup")
            .args(["run", n, "rustc", "--print", "sysroot"])
            .output()
            .ok()?;
        o.status
            .success()
            .then(|| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
    };
    let host = host_triple()?;
    let ready = |root: &Path| {
        root.join("lib/rustlib/src/rust/library/core").is_dir()
            && root
                .join("lib/rustlib")
                .join(&host)
                .join("bin/llvm-link")
                .is_file()
    };
    match sysroot(nightly) {
        Some(r) if ready(&r) => {}
        _ => {
            util::step(&format!(
                "installing {nightly} with rust-src and llvm-tools (about {NIGHTLY_MB} MB under ~/.rustup/toolchains, once)"
            ));
            util::run(Command::new("rustup").args([
                "toolchain",
                "install",
                nightly,
                "--profile",
                "minimal",
                "-c",
                "rust-src",
                "-c",
                "llvm-tools",
            ]))?;
        }
    }
    let r = sysroot(nightly).ok_or_else(|| format!("{nightly} not usable after install"))?;
    if !ready(&r) {
        return Err(format!(
            "{nightly}: rust-src or llvm-tools missing under {}",
            r.display()
        ));
    }
    Ok(r.join("lib/rustlib").join(host).join("bin"))
}

fn host_triple() -> Result<String, String> {
    let (o, _) = util::output(Command::new("rustc").arg("-vV"))?;
    o.lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_string)
        .ok_or_else(|| "rustc -vV: no host".into())
}

/// Builds the kernels for `arch` and returns the generated PTX text.
fn build_arch(
    root: &Path,
    nightly: &str,
    llvm_bin: &Path,
    arch: &str,
    feature: &str,
    variant: Variant,
) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let target_dir = root.join(variant.target_dir()).join(arch);
    let mut flags = vec![
        format!("-Ctarget-cpu={arch}"),
        format!("-Ctarget-feature={feature}"),
        format!("-Clinker={}", exe.display()),
        "--cfg".into(),
        format!("kernels_arch=\"{arch}\""),
        "-Dwarnings".into(),
        // No LLVM passes in rustc: the link step first marks the
        // warp-collective asm `convergent` (rustc cannot), then optimises
        // (`link::mark_convergent`). rustc's own pipeline would already
        // duplicate collectives into lane-dependent branches.
        "-Cno-prepopulate-passes".into(),
        // Register arrays (MMA accumulators) must be fully unrolled to stay
        // in registers; the default threshold leaves the larger nests as
        // loops and moves the arrays to local memory.
        format!("-Cllvm-args=-unroll-threshold={UNROLL_THRESHOLD}"),
    ];
    match variant {
        Variant::Committed => {}
        Variant::Watchdog => flags.extend(["--cfg".into(), "kernels_watchdog".into()]),
        Variant::Lab => flags.extend(["--cfg".into(), "kernels_lab".into()]),
    }
    let mut c = Command::new("rustup");
    c.args([
        "run",
        nightly,
        "cargo",
        "rustc",
        "--release",
        "--target",
        "nvptx64-nvidia-cuda",
    ])
    .args([
        "-Zbuild-std=core",
        "--crate-type",
        "cdylib",
        "--manifest-path",
    ])
    .arg(root.join("kernels-gpu/Cargo.toml"))
    .arg("--target-dir")
    .arg(&target_dir)
    .env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"))
    .env_remove("RUSTFLAGS")
    .env_remove("RUSTUP_TOOLCHAIN")
    .env(LINK_MODE_ENV, "1")
    .env(LLVM_BIN_ENV, llvm_bin)
    .env(PTX_FEATURE_ENV, feature);
    util::run(&mut c)?;
    let out = target_dir.join("nvptx64-nvidia-cuda/release/kernels_gpu.ptx");
    std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))
}

/// `cargo xtask build-ptx [--check]`.
pub fn build_ptx(check: bool) -> Result<(), String> {
    let root = util::repo_root();
    let nightly = pinned_nightly(&root)?;
    let llvm_bin = ensure_toolchain(&nightly)?;
    let ptxas = ensure_ptxas(&root)?;
    let mut stale = Vec::new();
    let builds = ARCHS
        .iter()
        .map(|a| (a, Variant::Committed))
        .chain(LAB_ARCHS.iter().map(|a| (a, Variant::Lab)));
    for (a, variant) in builds {
        let (arch, feature) = (a.target, a.ptx_feature);
        let what = if variant == Variant::Lab {
            "the lab"
        } else {
            "kernels-gpu"
        };
        util::step(&format!("building {what} for {arch} ({feature})"));
        let text = build_arch(&root, &nightly, &llvm_bin, arch, feature, variant)?;
        let mut outputs = vec![(variant.ptx_path(&root, arch), text.clone().into_bytes())];
        for (gpu, cubin) in check_text(&root, &ptxas, a, &text, variant)? {
            outputs.push((variant.sass_path(&root, gpu), cubin));
        }
        for (dest, bytes) in outputs {
            if std::fs::read(&dest).ok().as_deref() == Some(&bytes[..]) {
                continue;
            }
            if check {
                stale.push(dest.display().to_string());
            } else {
                if let Some(dir) = dest.parent() {
                    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                }
                std::fs::write(&dest, &bytes).map_err(|e| format!("{}: {e}", dest.display()))?;
                println!("wrote {}", dest.display());
            }
        }
    }
    if !stale.is_empty() {
        return Err(format!(
            "committed PTX or machine code is stale (kernel sources or the pinned {PTXAS_PACKAGE} changed without regenerating): {}\nrun `cargo xtask build-ptx` and commit the result",
            stale.join(", ")
        ));
    }
    Ok(())
}

/// Which build of the kernels: the committed product PTX, the committed
/// lab PTX (`--cfg kernels_lab`: the instruments alone), or the bring-up
/// kit's watchdog build (`--cfg kernels_watchdog`: bounded mbarrier waits
/// that record and trap, `kernels_gpu::watchdog` and `ptx::mbarrier`),
/// which is never committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// `kernels-gpu/ptx/kernels_*.ptx`, `kernels-gpu/sass/kernels_*.cubin`.
    Committed,
    /// `kernels-gpu/ptx/lab_*.ptx`, `kernels-gpu/sass/lab_*.cubin`.
    Lab,
    /// The watchdog build of `cargo xtask gpu-bundle`.
    Watchdog,
}

impl Variant {
    fn target_dir(self) -> &'static str {
        match self {
            Variant::Committed => "target/ptx",
            Variant::Lab => "target/ptx-lab",
            Variant::Watchdog => "target/ptx-watchdog",
        }
    }

    /// File-name prefix of its committed files.
    fn prefix(self) -> &'static str {
        match self {
            Variant::Lab => "lab",
            Variant::Committed | Variant::Watchdog => "kernels",
        }
    }

    /// Committed PTX path for `arch`.
    pub fn ptx_path(self, root: &Path, arch: &str) -> PathBuf {
        root.join("kernels-gpu/ptx")
            .join(format!("{}_{arch}.ptx", self.prefix()))
    }

    /// Committed machine-code path for the GPU target `gpu` (`Arch::sass`).
    fn sass_path(self, root: &Path, gpu: &str) -> PathBuf {
        root.join("kernels-gpu/sass")
            .join(format!("{}_{gpu}.cubin", self.prefix()))
    }
}

/// The checks every generated file passes: no collective in lane-divergent
/// code, and `ptxas -v` for each GPU it is meant for with no spills and no
/// stack frame. Returns the machine code of each `Arch::sass` target.
fn check_text(
    root: &Path,
    ptxas: &Path,
    a: &Arch,
    text: &str,
    variant: Variant,
) -> Result<Vec<(&'static str, Vec<u8>)>, String> {
    let arch = a.target;
    let findings = crate::converge::check(text);
    if !findings.is_empty() {
        let list: Vec<String> = findings.iter().map(|f| format!("  {f}")).collect();
        return Err(format!(
            "{arch}: {} warp-collective instruction(s) in lane-divergent code:\n{}",
            findings.len(),
            list.join("\n")
        ));
    }
    println!("convergence {arch}: no collective in lane-divergent code");
    let tmp = root
        .join(variant.target_dir())
        .join(format!("check_{arch}.ptx"));
    std::fs::write(&tmp, text).map_err(|e| e.to_string())?;
    for gpu in a.check_only {
        assemble(ptxas, &tmp, gpu)?;
    }
    let mut sass = Vec::new();
    for gpu in a.sass {
        let (_, cubin) = assemble(ptxas, &tmp, gpu)?;
        sass.push((*gpu, cubin));
    }
    Ok(sass)
}

/// Builds the watchdog variant of every PTX file into `out`
/// (`kernels_<target>.ptx`, the names the host's `INDEXER_PTX_DIR`
/// override reads), with the same checks as the committed files.
pub fn build_watchdog_ptx(out: &Path) -> Result<(), String> {
    let root = util::repo_root();
    let nightly = pinned_nightly(&root)?;
    let llvm_bin = ensure_toolchain(&nightly)?;
    let ptxas = ensure_ptxas(&root)?;
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    for a in &ARCHS {
        let (arch, feature) = (a.target, a.ptx_feature);
        util::step(&format!("building the watchdog kernels for {arch}"));
        let text = build_arch(&root, &nightly, &llvm_bin, arch, feature, Variant::Watchdog)?;
        if !text.contains(kernels_gpu::abi::WATCHDOG_SYMBOL) {
            return Err(format!(
                "{arch}: the watchdog build lacks {}",
                kernels_gpu::abi::WATCHDOG_SYMBOL
            ));
        }
        check_text(&root, &ptxas, a, &text, Variant::Watchdog)?;
        let dest = out.join(format!("kernels_{arch}.ptx"));
        std::fs::write(&dest, &text).map_err(|e| format!("{}: {e}", dest.display()))?;
    }
    Ok(())
}

/// Path of `ptxas`, installing the pinned `nvidia-cuda-nvcc` wheel into the
/// project-local `.venv` when missing.
pub fn ensure_ptxas(root: &Path) -> Result<PathBuf, String> {
    let venv = root.join(".venv");
    if let Some(p) = find_ptxas(&venv) {
        return Ok(p);
    }
    util::step(&format!(
        "installing {PTXAS_PACKAGE} (ptxas) into {} (about {PTXAS_VENV_MB} MB, once)",
        venv.display()
    ));
    util::run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    util::run(Command::new(venv.join("bin/pip")).args(["install", "--quiet", PTXAS_PACKAGE]))?;
    find_ptxas(&venv).ok_or_else(|| "ptxas not found after installing nvidia-cuda-nvcc".into())
}

fn find_ptxas(venv: &Path) -> Option<PathBuf> {
    let lib = venv.join("lib");
    for py in std::fs::read_dir(lib).ok()? {
        let nv = py.ok()?.path().join("site-packages/nvidia");
        for sub in ["cu13/bin/ptxas", "cuda_nvcc/bin/ptxas"] {
            let p = nv.join(sub);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// Resource report of one kernel from `ptxas -v`.
#[derive(Debug, Default, Clone)]
pub struct KernelReport {
    pub name: String,
    pub registers: u32,
    pub stack_frame: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub smem: u32,
}

/// Assembles `ptx` for `arch` with `ptxas -v`; fails on errors, spills and
/// stack frames; prints registers and static shared memory per kernel.
/// Returns the reports and the machine code (a cubin).
pub fn assemble(
    ptxas: &Path,
    ptx: &Path,
    arch: &str,
) -> Result<(Vec<KernelReport>, Vec<u8>), String> {
    let cubin = ptx.with_extension(format!("{arch}.cubin"));
    let (_, err) = util::output(
        Command::new(ptxas)
            .arg(format!("-arch={arch}"))
            .arg("-v")
            .arg(ptx)
            .arg("-o")
            .arg(&cubin),
    )?;
    // Device functions (panic stubs etc.) are listed too; report kernels.
    let entries: Vec<&str> = err
        .lines()
        .filter_map(|l| {
            l.split("Compiling entry function '")
                .nth(1)?
                .split('\'')
                .next()
        })
        .collect();
    let reports: Vec<KernelReport> = parse_ptxas(&err)
        .into_iter()
        .filter(|r| entries.contains(&r.name.as_str()))
        .collect();
    if reports.is_empty() {
        return Err(format!("ptxas reported no kernels for {arch}:\n{err}"));
    }
    println!(
        "ptxas {arch}: {:<32} {:>5} {:>6} {:>6} {:>6} {:>7} {:>9}",
        "kernel", "regs", "stack", "spillS", "spillL", "smem", "dyn_smem"
    );
    let mut bad = Vec::new();
    for r in &reports {
        println!(
            "ptxas {arch}: {:<32} {:>5} {:>6} {:>6} {:>6} {:>7} {:>9}",
            r.name,
            r.registers,
            r.stack_frame,
            r.spill_stores,
            r.spill_loads,
            r.smem,
            dynamic_smem(&r.name)
        );
        if r.spill_stores + r.spill_loads > 0 || r.stack_frame > 0 {
            bad.push(r.name.clone());
        }
    }
    for l in err.lines().filter(|l| l.contains("warning")) {
        println!("ptxas {arch}: {l}");
    }
    if !bad.is_empty() {
        return Err(format!(
            "{arch}: local memory (spills or stack frame) in {}",
            bad.join(", ")
        ));
    }
    let code = std::fs::read(&cubin).map_err(|e| format!("{}: {e}", cubin.display()))?;
    Ok((reports, code))
}

/// Dynamic shared memory the host requests at launch (ptxas only sees the
/// static part), from the constants the host uses; "-" where none.
fn dynamic_smem(kernel: &str) -> String {
    use kernels_gpu::registry::{self, FwdKind, Param, SUPPORTED_DIMS, SUPPORTED_HEADS};
    let Some(k) = registry::find(kernel) else {
        return "-".into();
    };
    let bytes = match k.param {
        Param::Sm100Stage2 => kernels_gpu::sm100::budget::SM100_SMEM,
        Param::Sm100Probe => kernels_gpu::sm100::budget::SM100_PROBE_SMEM,
        Param::Sm100Smoke => kernels_gpu::abi::SM100_SMOKE_SMEM,
        Param::Smoke => kernels_gpu::abi::SMOKE_SMEM_BYTES,
        Param::Tag => kernels_gpu::abi::WATCHDOG_PROBE_SMEM,
        Param::Dense => kernels_gpu::abi::DENSE_STAGE1_SMEM,
        Param::DenseTile | Param::DenseDet => kernels_gpu::sm90::dense::SMEM.bytes,
        Param::Det => match registry::det_base(k) {
            Some(base) => return dynamic_smem(base.name),
            None => registry::DET_SMEM,
        },
        Param::Grad if *k == registry::STAGE1 || *k == registry::STAGE1_D64 => {
            kernels_gpu::abi::STAGE1_SMEM
        }
        Param::Grad
            if *k == registry::SM90_WG
                || *k == registry::SM90_WG_H32
                || *k == registry::SM90_WG_H16 =>
        {
            kernels_gpu::sm90::bwd::SMEM.bytes
        }
        Param::Grad
            if *k == registry::SM90_WG_D64
                || *k == registry::SM90_WG_H32_D64
                || *k == registry::SM90_WG_H16_D64 =>
        {
            kernels_gpu::sm90::bwd::SMEM_D64.bytes
        }
        Param::Grad if *k == registry::SM90_WG_H128_D64 => kernels_gpu::sm90::bwd::PAIR_D64.bytes,
        Param::Grad if *k == registry::SM90_WG_PAIR || *k == registry::SM90_WG_H128 => {
            kernels_gpu::sm90::bwd::PAIR.bytes
        }
        Param::Grad => {
            let row = SUPPORTED_HEADS
                .into_iter()
                .flat_map(|h| SUPPORTED_DIMS.map(|d| (h, d)))
                .find(|&(h, d)| registry::row_kernel(h, d) == Some(*k));
            match row {
                Some((h, d)) => kernels_gpu::portable::rows::RowSmem::new(h, d).bytes,
                None => return "-".into(),
            }
        }
        Param::Ceil if *k == registry::CEIL_SCATTER_BULK => kernels_gpu::abi::CEIL_BULK_SMEM_BYTES,
        Param::Fwd => {
            let shape = SUPPORTED_HEADS
                .into_iter()
                .flat_map(|h| SUPPORTED_DIMS.map(|d| (h, d)))
                .find_map(|(h, d)| {
                    let is = |kind| registry::fwd_kernel(h, d, kind) == Some(*k);
                    if is(FwdKind::Wgmma) || is(FwdKind::Persistent) {
                        Some(kernels_gpu::portable::forward::smem(h, d).bytes)
                    } else if is(FwdKind::Portable) {
                        Some(kernels_gpu::portable::forward::rows_smem(h, d).bytes)
                    } else {
                        None
                    }
                });
            match shape {
                Some(bytes) => bytes,
                None => return "-".into(),
            }
        }
        Param::Cast | Param::Ceil => return "-".into(),
    };
    bytes.to_string()
}

fn numbers(s: &str) -> Vec<u32> {
    s.split(|c: char| !c.is_ascii_digit())
        .filter(|t| !t.is_empty())
        .filter_map(|t| t.parse().ok())
        .collect()
}

/// Parses `ptxas -v` stderr into one report per function.
pub fn parse_ptxas(text: &str) -> Vec<KernelReport> {
    let mut out: Vec<KernelReport> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            out.push(KernelReport {
                name: rest.trim().to_string(),
                ..Default::default()
            });
        } else if let Some(r) = out.last_mut() {
            if line.contains("bytes stack frame") {
                let n = numbers(line);
                if n.len() >= 3 {
                    (r.stack_frame, r.spill_stores, r.spill_loads) = (n[0], n[1], n[2]);
                }
            } else if let Some(rest) = line.split("Used ").nth(1) {
                r.registers = numbers(rest.split(" registers").next().unwrap_or(""))
                    .first()
                    .copied()
                    .unwrap_or(0);
                if let Some(sm) = rest.split(',').find(|p| p.contains("smem")) {
                    r.smem = numbers(sm).first().copied().unwrap_or(0);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ptxas_resource_lines() {
        let text = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'k1' for 'sm_90a'\n\
ptxas info    : Function properties for k1\n\
    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n\
ptxas info    : Used 72 registers, used 1 barriers, 16 bytes smem, 400 bytes cmem[0]\n\
ptxas info    : Function properties for k2\n\
    24 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 8 registers, used 0 barriers, 384 bytes cmem[0]\n";
        let r = parse_ptxas(text);
        assert_eq!(r.len(), 2);
        assert_eq!(
            (
                r[0].name.as_str(),
                r[0].registers,
                r[0].spill_stores,
                r[0].spill_loads,
                r[0].smem
            ),
            ("k1", 72, 8, 4, 16)
        );
        assert_eq!(
            (
                r[1].name.as_str(),
                r[1].stack_frame,
                r[1].registers,
                r[1].smem
            ),
            ("k2", 24, 8, 0)
        );
    }

    #[test]
    fn pinned_nightly_is_read_from_the_toolchain_file() {
        let n = pinned_nightly(&util::repo_root()).unwrap();
        assert!(n.starts_with("nightly-20"), "{n}");
    }
}
