//! The Python package (`python/`): `wheel` builds it with maturin, and the
//! `test` step installs that wheel into a project-local virtual environment
//! and runs its torch-free tests (the CPU path through the native module,
//! the argument checks). The GPU tests (`python/tests/test_gpu.py`) need
//! torch and a GPU and skip here.

use crate::util;
use std::path::{Path, PathBuf};
use std::process::Command;

/// maturin, pinned like `ptxas`; installed from PyPI into [`venv`].
pub const MATURIN_PACKAGE: &str = "maturin==1.16.0";

/// The virtual environment holding maturin and the installed wheel
/// (under `target/`, so `cargo clean` removes it).
fn venv(root: &Path) -> PathBuf {
    root.join("target/python-venv")
}

/// The venv's Python, creating the venv and installing maturin when missing.
fn ensure_venv(root: &Path) -> Result<PathBuf, String> {
    let venv = venv(root);
    let python = venv.join("bin/python");
    if !venv.join("bin/maturin").is_file() {
        util::step(&format!(
            "installing {MATURIN_PACKAGE} into {}",
            venv.display()
        ));
        util::run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        util::run(Command::new(&python).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            MATURIN_PACKAGE,
        ]))?;
    }
    Ok(python)
}

/// Builds the release wheel into `out` and returns its path.
fn build_wheel(root: &Path, out: &Path) -> Result<PathBuf, String> {
    let python = ensure_venv(root)?;
    let _ = std::fs::remove_dir_all(out);
    util::step(&format!("maturin build --release -> {}", out.display()));
    util::run(
        Command::new(venv(root).join("bin/maturin"))
            .current_dir(root)
            .args(["build", "--release", "--manifest-path", "python/Cargo.toml"])
            .arg("--interpreter")
            .arg(&python)
            .arg("--out")
            .arg(out),
    )?;
    let wheels: Vec<PathBuf> = std::fs::read_dir(out)
        .map_err(|e| format!("{}: {e}", out.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    match wheels.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(format!(
            "expected one wheel in {}, found {}",
            out.display(),
            wheels.len()
        )),
    }
}

/// `cargo xtask wheel [--out DIR]`: the release wheel (default
/// `target/wheels/`).
pub fn wheel(args: &[String]) -> Result<(), String> {
    let root = util::repo_root();
    let out = match args.iter().position(|a| a == "--out") {
        Some(i) => PathBuf::from(args.get(i + 1).ok_or("--out needs a directory")?),
        None => root.join("target/wheels"),
    };
    let whl = build_wheel(&root, &out)?;
    util::step(&format!("wheel: {}", whl.display()));
    Ok(())
}

/// The `test` step: build the wheel, install it, run `python/tests`.
pub fn test(root: &Path) -> Result<(), String> {
    let whl = build_wheel(root, &root.join("target/wheels"))?;
    let python = ensure_venv(root)?;
    util::run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--force-reinstall",
                "--no-deps",
            ])
            .arg(&whl),
    )?;
    util::step("python tests (unittest; the GPU tests skip without torch and a GPU)");
    // Run from the tests folder so the installed package, not the source
    // tree, is imported.
    util::run(
        Command::new(&python)
            .current_dir(root.join("python/tests"))
            .args([
                "-m",
                "unittest",
                "discover",
                "-v",
                "-s",
                ".",
                "-p",
                "test_*.py",
            ]),
    )
}
