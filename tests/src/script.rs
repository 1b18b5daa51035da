//! Running the repository's Python scripts from tests (`scripts/`).

use std::path::PathBuf;
use std::process::Command;

/// The repository's `scripts/` directory.
pub fn scripts_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts")
}

/// `python3 args...` as `(exit code, stdout, stderr)` (no bytecode
/// written), or `None` when there is no python3.
pub fn python(args: &[&str]) -> Option<(i32, String, String)> {
    let out = Command::new("python3")
        .args(args)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .ok()?;
    Some((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}
