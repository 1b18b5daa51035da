//! Small process and path helpers.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root (parent of this crate's manifest directory).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Prints a step banner.
pub fn step(msg: &str) {
    println!("==> {msg}");
}

/// Runs `cmd`, failing with its name and status when it does not succeed.
pub fn run(cmd: &mut Command) -> Result<(), String> {
    let status = cmd
        .status()
        .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed with {status}"))
    }
}

/// Runs `cmd` and returns its stdout and stderr, failing on a bad status.
pub fn output(cmd: &mut Command) -> Result<(String, String), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
    let so = String::from_utf8_lossy(&out.stdout).into_owned();
    let se = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok((so, se))
    } else {
        Err(format!("{cmd:?} failed with {}\n{so}{se}", out.status))
    }
}

/// Runs stable `cargo` (the host toolchain) in `dir` with extra env vars.
pub fn cargo(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(dir).args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    run(&mut c)
}

/// Runs stable `cargo` like [`cargo`], echoing its stdout line by line as
/// it comes and returning it (stderr goes straight through).
pub fn cargo_tee(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<String, String> {
    use std::io::BufRead;
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(dir)
        .args(args)
        .stdout(std::process::Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().map_err(|e| format!("cannot start {c:?}: {e}"))?;
    let mut all = String::new();
    let stdout = child.stdout.take().expect("piped");
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.map_err(|e| format!("{c:?}: reading its output: {e}"))?;
        println!("{line}");
        all.push_str(&line);
        all.push('\n');
    }
    let status = child.wait().map_err(|e| format!("{c:?}: {e}"))?;
    if status.success() {
        Ok(all)
    } else {
        Err(format!("{c:?} failed with {status}"))
    }
}
