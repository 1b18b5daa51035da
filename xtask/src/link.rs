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
    Ok(())
}

fn is_bitcode(p: &Path) -> bool {
    std::fs::read(p)
        .map(|b| b.starts_with(b"BC\xc0\xde"))
        .unwrap_or(false)
}
