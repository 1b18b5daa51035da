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

/// zig (as a PyPI package) for `wheel --zig`: links against glibc 2.28
/// symbols, so the wheel is `manylinux_2_28` whatever glibc builds it.
pub const ZIG_PACKAGE: &str = "ziglang==0.17.1";

/// Disk taken by a fresh venv with [`MATURIN_PACKAGE`] (measured on Linux
/// x86-64; printed with the install step and in the README).
pub const MATURIN_VENV_MB: u32 = 52;

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
            "installing {MATURIN_PACKAGE} into {} (about {MATURIN_VENV_MB} MB, once)",
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

/// Builds the release wheel into `out` and returns its path: tagged for
/// the glibc of this machine (maturin's audit), or with `zig` linked for
/// glibc 2.28 and tagged `manylinux_2_28`.
pub(crate) fn build_wheel(root: &Path, out: &Path, zig: bool) -> Result<PathBuf, String> {
    let python = ensure_venv(root)?;
    let bin = venv(root).join("bin");
    let has_zig = || {
        Command::new(&python)
            .args(["-c", "import ziglang"])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if zig && !has_zig() {
        util::run(Command::new(&python).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            ZIG_PACKAGE,
        ]))?;
    }
    let _ = std::fs::remove_dir_all(out);
    util::step(&format!("maturin build --release -> {}", out.display()));
    let mut cmd = Command::new(bin.join("maturin"));
    cmd.current_dir(root)
        .args(["build", "--release", "--manifest-path", "python/Cargo.toml"])
        .arg("--interpreter")
        .arg(&python)
        .arg("--out")
        .arg(out);
    if zig {
        // maturin runs `python -m ziglang` with the first python on PATH.
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![bin.clone()];
        dirs.extend(std::env::split_paths(&path));
        let joined = std::env::join_paths(dirs).map_err(|e| e.to_string())?;
        cmd.env("PATH", joined)
            .args(["--zig", "--compatibility", "manylinux_2_28"]);
    }
    util::run(&mut cmd)?;
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

/// `cargo xtask wheel [--zig] [--out DIR]`: the release wheel (default
/// `target/wheels/`); `--zig` for a `manylinux_2_28` one.
pub fn wheel(args: &[String]) -> Result<(), String> {
    let root = util::repo_root();
    let out = match args.iter().position(|a| a == "--out") {
        Some(i) => PathBuf::from(args.get(i + 1).ok_or("--out needs a directory")?),
        None => root.join("target/wheels"),
    };
    let whl = build_wheel(&root, &out, args.iter().any(|a| a == "--zig"))?;
    util::step(&format!("wheel: {}", whl.display()));
    Ok(())
}

/// The `test` step: build the wheel, install it, run `python/tests`.
pub fn test(root: &Path) -> Result<(), String> {
    let whl = build_wheel(root, &root.join("target/wheels"), false)?;
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
