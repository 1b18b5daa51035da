//! The nvptx64 link step. rustc hands the "linker" the crate's bitcode
//! objects, the rlibs of `core`/`compiler_builtins`, `--export-symbol` names,
//! `--target-cpu` and `-o`; this links them with the toolchain's own
//! `llvm-link`, internalises everything but the kernels, optimises with
//! `opt -O3` and lowers to PTX with `llc`.
//!
//! The target's default linker (`llvm-bitcode-linker`) is not installable
//! here, so `ptx::build_arch` passes `-C linker=<this binary>` with
//! [`LINK_MODE_ENV`] set.

use crate::util;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Set (to anything) when this binary is invoked as the linker.
pub const LINK_MODE_ENV: &str = "XTASK_PTX_LINK";
/// Directory holding `llvm-link`, `opt`, `llc` of the pinned toolchain.
pub const LLVM_BIN_ENV: &str = "XTASK_LLVM_BIN";
/// PTX ISA feature for `llc`, e.g. `+ptx80`.
pub const PTX_FEATURE_ENV: &str = "XTASK_PTX_FEATURE";

/// Link mode entry: `args` are what rustc passed.
pub fn run(args: Vec<String>) -> Result<(), String> {
    let llvm =
        PathBuf::from(std::env::var(LLVM_BIN_ENV).map_err(|_| format!("{LLVM_BIN_ENV} not set"))?);
    let feature =
        std::env::var(PTX_FEATURE_ENV).map_err(|_| format!("{PTX_FEATURE_ENV} not set"))?;
    let mut objects = Vec::new();
    let mut rlibs = Vec::new();
    let mut exports = Vec::new();
    let mut out = None;
    let mut cpu = None;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => out = it.next(),
            "--target-cpu" => cpu = it.next(),
            "--export-symbol" => exports.extend(it.next()),
            "-L" | "--target" => {
                it.next();
            }
            s if s.ends_with(".rlib") => rlibs.push(PathBuf::from(s)),
            s if s.ends_with(".o") => objects.push(PathBuf::from(s)),
            _ => {} // -O3, --debug, --target-feature: decided here instead
        }
    }
    let out = PathBuf::from(out.ok_or("linker: no -o")?);
    let cpu = cpu.ok_or("linker: no --target-cpu")?;
    if objects.is_empty() || exports.is_empty() {
        return Err("linker: no objects or no exported kernels".into());
    }
    let work = out.with_extension("link");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;

    // Library members that are bitcode (skip rustc metadata).
    let mut lib_objs = Vec::new();
    for (i, rlib) in rlibs.iter().enumerate() {
        let dir = work.join(format!("lib{i}"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        util::output(
            Command::new(llvm.join("llvm-ar"))
                .current_dir(&dir)
                .arg("x")
                .arg(rlib),
        )?;
        for e in std::fs::read_dir(&dir).map_err(|e| e.to_string())? {
            let p = e.map_err(|e| e.to_string())?.path();
            if is_bitcode(&p) {
                lib_objs.push(p);
            }
        }
    }
    lib_objs.sort();

    // Crate objects linked whole, library members only where needed.
    let crate_bc = work.join("crate.bc");
    util::output(
        Command::new(llvm.join("llvm-link"))
            .args(&objects)
            .arg("-o")
            .arg(&crate_bc),
    )?;
    let linked = work.join("linked.bc");
    let mut c = Command::new(llvm.join("llvm-link"));
    c.arg("--only-needed")
        .arg(&crate_bc)
        .args(&lib_objs)
        .arg("-o")
        .arg(&linked);
    util::output(&mut c)?;

    let opt_bc = work.join("opt.bc");
    util::output(
        Command::new(llvm.join("opt"))
            .arg(format!(
                "--internalize-public-api-list={}",
                exports.join(",")
            ))
            .arg("--passes=internalize,globaldce,default<O3>")
            .arg(format!(
                "-unroll-threshold={}",
                crate::ptx::UNROLL_THRESHOLD
            ))
            .arg(&linked)
            .arg("-o")
            .arg(&opt_bc),
    )?;
    util::output(
        Command::new(llvm.join("llc"))
            .args([
                "-O3",
                "-march=nvptx64",
                &format!("-mcpu={cpu}"),
                &format!("-mattr={feature}"),
            ])
            .arg(&opt_bc)
            .arg("-o")
            .arg(&out),
    )?;
    let ptx = std::fs::read_to_string(&out).map_err(|e| e.to_string())?;
    // The occupancy targets were tuned and measured on sm_90a; elsewhere
    // (sm_100f, not executed; the portable sm_90 file, which only GPUs
    // other than sm_90 load) ask for one CTA per SM so ptxas keeps its
    // register freedom (with two, the H=64 D=128 kernel spills on sm_100).
    // Kernels that exist in one target's PTX only (the wgmma kernel in
    // sm_90a, the tcgen05 kernels in sm_100f) add their own bounds.
    let mut bounds: Vec<_> = kernels_gpu::params::LAUNCH_BOUNDS
        .map(|(n, t, c)| (n, t, if cpu == "sm_90a" { c } else { 1 }))
        .to_vec();
    match cpu.as_str() {
        "sm_90a" => bounds.extend(kernels_gpu::params::SM90_LAUNCH_BOUNDS),
        "sm_100f" => bounds.extend(kernels_gpu::params::SM100_LAUNCH_BOUNDS),
        _ => {}
    }
    let exact: &[&str] = if cpu == "sm_90a" {
        &kernels_gpu::params::SM90_EXACT_BLOCK
    } else {
        &[]
    };
    let ptx = add_launch_bounds(&ptx, &bounds, exact)?;

    // sm_100f: 64-byte alignment of the parameter holding tensor maps.
    let ptx = if cpu == "sm_100f" {
        align_first_param(
            &ptx,
            &kernels_gpu::params::SM100_STAGE2_KERNELS,
            kernels_gpu::params::TENSOR_MAP_ALIGN,
        )?
    } else {
        ptx
    };
    std::fs::write(&out, ptx).map_err(|e| e.to_string())?;
    Ok(())
}

/// Writes `.maxntid T, 1, 1` and `.minnctapersm N` after the parameter list
/// of each named kernel (between `)` and `{`, where PTX puts performance
/// directives); for a kernel listed in `exact`, `.reqntid T, 1, 1` (always
/// launched with exactly T threads) instead of `.maxntid`. A named kernel
/// missing from the PTX is an error.
pub fn add_launch_bounds(
    ptx: &str,
    bounds: &[(&str, u32, u32)],
    exact: &[&str],
) -> Result<String, String> {
    let mut out = String::with_capacity(ptx.len() + 64 * bounds.len());
    let mut pending: Option<(u32, u32, bool)> = None;
    let mut found = 0;
    for line in ptx.lines() {
        out.push_str(line);
        out.push('\n');
        if let Some(name) = line
            .split(".entry ")
            .nth(1)
            .and_then(|r| r.split('(').next())
        {
            pending = bounds
                .iter()
                .find(|b| b.0 == name)
                .map(|b| (b.1, b.2, exact.contains(&name)));
        } else if line.starts_with(')') {
            // `)` may carry a trailing `// @name` comment from llc.
            if let Some((threads, ctas, exact)) = pending.take() {
                let directive = if exact { "reqntid" } else { "maxntid" };
                out.push_str(&format!(
                    ".{directive} {threads}, 1, 1\n.minnctapersm {ctas}\n"
                ));
                found += 1;
            }
        }
    }
    if found != bounds.len() {
        return Err(format!(
            "launch bounds: {found} of {} kernels found in the PTX",
            bounds.len()
        ));
    }
    Ok(out)
}

/// Raises the declared alignment of the first (by-value struct) parameter
/// of each named kernel to `align` bytes: `.param .align N .b8
/// <kernel>_param_0[..]` becomes `.param .align <align> ...`. rustc cannot
/// declare by-value kernel parameters aligned above 16 bytes, but a
/// `CUtensorMap` inside one must be 64-byte aligned in the parameter space
/// (see `kernels_gpu::params::TensorMap`); offsets inside the parameter are
/// unchanged. A named kernel missing from the PTX is an error.
pub fn align_first_param(ptx: &str, kernels: &[&str], align: u32) -> Result<String, String> {
    let mut out = String::with_capacity(ptx.len() + 16 * kernels.len());
    let mut found = 0;
    for line in ptx.lines() {
        let t = line.trim_start();
        let hit = kernels
            .iter()
            .any(|k| t.starts_with(".param .align ") && t.contains(&format!(" .b8 {k}_param_0[")));
        if hit {
            let rest = t
                .strip_prefix(".param .align ")
                .and_then(|r| r.split_once(' '))
                .map(|(_, r)| r)
                .ok_or_else(|| format!("unexpected parameter line: {line}"))?;
            let indent = &line[..line.len() - t.len()];
            out.push_str(&format!("{indent}.param .align {align} {rest}"));
            found += 1;
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    if found != kernels.len() {
        return Err(format!(
            "parameter alignment: {found} of {} kernels found in the PTX",
            kernels.len()
        ));
    }
    Ok(out)
}

fn is_bitcode(p: &Path) -> bool {
    std::fs::read(p)
        .map(|b| b.starts_with(b"BC\xc0\xde"))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_bounds_go_between_parameters_and_body() {
        let ptx =
            ".visible .entry k1(\n\t.param .u64 p\n)\n{\n\tret;\n}\n.visible .entry k2(\n)\n{\n}\n";
        let out = add_launch_bounds(ptx, &[("k1", 256, 2)], &[]).unwrap();
        assert!(
            out.contains(")\n.maxntid 256, 1, 1\n.minnctapersm 2\n{\n\tret;"),
            "{out}"
        );
        assert_eq!(out.matches(".maxntid").count(), 1);
        assert!(add_launch_bounds(ptx, &[("k3", 128, 1)], &[]).is_err());
        // An exact block size is written as such.
        let out = add_launch_bounds(ptx, &[("k1", 256, 2), ("k2", 512, 1)], &["k2"]).unwrap();
        assert!(
            out.contains(")\n.maxntid 256, 1, 1\n.minnctapersm 2\n{\n\tret;"),
            "{out}"
        );
        assert!(
            out.contains("k2(\n)\n.reqntid 512, 1, 1\n.minnctapersm 1\n{"),
            "{out}"
        );
    }

    #[test]
    fn first_parameter_alignment_is_raised_only_for_named_kernels() {
        let ptx = ".visible .entry k1(\n\t.param .align 16 .b8 k1_param_0[368]\n)\n{\n}\n\
.visible .entry k2(\n\t.param .align 16 .b8 k2_param_0[368]\n)\n{\n}\n";
        let out = align_first_param(ptx, &["k1"], 64).unwrap();
        assert!(
            out.contains("\t.param .align 64 .b8 k1_param_0[368]\n"),
            "{out}"
        );
        assert!(
            out.contains("\t.param .align 16 .b8 k2_param_0[368]\n"),
            "{out}"
        );
        assert!(align_first_param(ptx, &["k3"], 64).is_err());
    }
}
