//! `cargo xtask <command>`: the project's build, check, test and bundle tasks.
//!
//! - `build-ptx [--check]`: builds `kernels-gpu` for nvptx64 with the pinned
//!   nightly, links and lowers it to PTX (this binary is the link step),
//!   writes `kernels-gpu/ptx/kernels_<arch>.ptx`, and assembles each file
//!   with `ptxas -v`. `--check` fails instead of writing when a committed
//!   file is stale.
//! - `test [--require-gpu]`: stale-PTX check, fmt, clippy, rustdoc links,
//!   library builds (two CUDA binding choices, the MSRV, `cargo package`),
//!   the whole suite.
//! - `bench [args]`: runs the benchmark binary (on a machine with a GPU).
//! - `gpu-bundle [--out DIR]`: release test and bench binaries, the PTX and
//!   `run.sh` in one folder to copy to the GPU machine.
//! - `wheel [--zig] [--out DIR]`: the Python package's release wheel
//!   (maturin, installed into `target/python-venv`), default
//!   `target/wheels/`; `--zig` links it for glibc 2.28 (`manylinux_2_28`).
//! - `python-test`: the Python step of `test` alone (wheel, install,
//!   torch-free tests).

mod bundle;
mod converge;
#[cfg(test)]
mod descriptors;
#[cfg(test)]
mod entries;
mod link;
mod modgraph;
mod ptx;
mod python;
#[cfg(test)]
mod timeouts;
mod util;

use std::process::ExitCode;

/// Disk taken by the MSRV toolchain (`--profile minimal`) under
/// `~/.rustup/toolchains` (measured on Linux x86-64; printed with its step
/// and in the README).
const MSRV_TOOLCHAIN_MB: u32 = 551;

fn main() -> ExitCode {
    // rustc calls this binary as the nvptx64 linker (see `ptx::build_arch`).
    if std::env::var_os(link::LINK_MODE_ENV).is_some() {
        return report(link::run(std::env::args().skip(1).collect()));
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, rest) = match args.split_first() {
        Some((c, r)) => (c.as_str(), r),
        None => {
            eprintln!("{}", USAGE);
            return ExitCode::from(2);
        }
    };
    let result = match cmd {
        "build-ptx" => ptx::build_ptx(rest.iter().any(|a| a == "--check")),
        "test" => test(rest.iter().any(|a| a == "--require-gpu")),
        "bench" => bench(rest),
        "gpu-bundle" => bundle::gpu_bundle(rest),
        "wheel" => python::wheel(rest),
        "python-test" => python::test(&util::repo_root()),
        "-h" | "--help" | "help" => {
            println!("{}", USAGE);
            Ok(())
        }
        other => Err(format!("unknown command `{other}`\n{USAGE}")),
    };
    report(result)
}

const USAGE: &str = "usage: cargo xtask <build-ptx [--check] | test [--require-gpu] | bench [ARGS] | gpu-bundle [--out DIR] | wheel [--zig] [--out DIR] | python-test>";

fn report(r: Result<(), String>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The README's test command: stale-PTX check, formatting, lints, doc
/// links, library builds (feature sets, MSRV, packages), tests (Rust, then
/// the Python package's).
fn test(require_gpu: bool) -> Result<(), String> {
    let root = util::repo_root();
    util::step("build-ptx --check (committed PTX must match the sources)");
    ptx::build_ptx(true)?;
    let kmanifest = root.join("kernels-gpu/Cargo.toml");
    let km = kmanifest.to_str().ok_or("non-UTF-8 path")?;
    util::step("kernel crate module graph (no cycles)");
    modgraph::check_kernel_crate(&root)?;
    util::step("cargo fmt --check");
    util::cargo(&root, &["fmt", "--all", "--check"], &[])?;
    util::cargo(&root, &["fmt", "--manifest-path", km, "--check"], &[])?;
    util::step("cargo clippy -D warnings");
    for target in [&["--workspace"][..], &["--manifest-path", km][..]] {
        let mut a = vec!["clippy"];
        a.extend_from_slice(target);
        a.extend_from_slice(&["--all-targets", "--", "-D", "warnings"]);
        util::cargo(&root, &a, &[])?;
    }
    util::step("cargo doc -D warnings (broken links in public docs)");
    let docflags = [("RUSTDOCFLAGS", "-D warnings")];
    util::cargo(&root, &["doc", "--no-deps", "--workspace"], &docflags)?;
    util::cargo(
        &root,
        &["doc", "--no-deps", "--manifest-path", km],
        &docflags,
    )?;
    library_builds(&root)?;
    util::step("cargo test");
    let env: Vec<(&str, &str)> = if require_gpu {
        vec![("INDEXER_REQUIRE_GPU", "1")]
    } else {
        vec![]
    };
    util::cargo(&root, &["test", "--manifest-path", km], &[])?;
    // --show-output so GPU tests' "skipped: no CUDA device" lines are
    // visible; they are counted, so a run without a GPU says how many GPU
    // tests (or GPU parts of tests) did not run.
    let out = util::cargo_tee(
        &root,
        &["test", "--workspace", "--release", "--", "--show-output"],
        &env,
    )?;
    util::step("python package: wheel, install, torch-free tests");
    python::test(&root)?;
    let skipped = skipped_gpu_tests(&out);
    if skipped.is_empty() {
        util::step("GPU tests: none skipped");
    } else {
        util::step(&format!(
            "GPU tests skipped (no CUDA device; they report \"ok\" above but did not run): {}",
            skipped.len()
        ));
        for name in &skipped {
            println!("    {name}");
        }
    }
    util::step("all checks passed");
    Ok(())
}

/// The library as users build it: with two choices of CUDA bindings, with
/// the minimum supported Rust (the workspace's `rust-version`, installed
/// when missing), and as the two packages `cargo publish` would upload
/// (each verified by building it from its package; the host against the
/// packaged `kernels-gpu`, which is not on crates.io yet).
fn library_builds(root: &std::path::Path) -> Result<(), String> {
    util::step("cargo check the library: default features, then cuda-13000 bindings");
    util::cargo(root, &["check", "-p", "dsa-indexer-bwd"], &[])?;
    util::cargo(
        root,
        &[
            "check",
            "-p",
            "dsa-indexer-bwd",
            "--no-default-features",
            "--features",
            "cuda-13000",
        ],
        &[],
    )?;
    let msrv = manifest_string(&root.join("Cargo.toml"), "rust-version")?;
    util::step(&format!(
        "MSRV: cargo +{msrv} check (the library; installs Rust {msrv}, about {MSRV_TOOLCHAIN_MB} MB under ~/.rustup/toolchains, when missing)"
    ));
    util::run(std::process::Command::new("rustup").args([
        "toolchain",
        "install",
        &msrv,
        "--profile",
        "minimal",
    ]))?;
    let msrv_target = root.join("target/msrv");
    util::run(
        std::process::Command::new("rustup")
            .current_dir(root)
            .args(["run", &msrv, "cargo", "check", "-p", "dsa-indexer-bwd"])
            .arg("--target-dir")
            .arg(&msrv_target)
            .env_remove("RUSTC")
            .env_remove("CARGO"),
    )?;
    util::step("cargo package: kernels-gpu, then dsa-indexer-bwd against it");
    let km = root.join("kernels-gpu/Cargo.toml");
    let km = km.to_str().ok_or("non-UTF-8 path")?;
    util::cargo(
        root,
        &["package", "--allow-dirty", "--manifest-path", km],
        &[],
    )?;
    let kversion = manifest_string(&root.join("kernels-gpu/Cargo.toml"), "version")?;
    let packaged = root.join(format!("kernels-gpu/target/package/kernels-gpu-{kversion}"));
    let patch = format!(
        "patch.crates-io.kernels-gpu.path={:?}",
        packaged.to_str().ok_or("non-UTF-8 path")?
    );
    util::cargo(
        root,
        &[
            "package",
            "--allow-dirty",
            "-p",
            "dsa-indexer-bwd",
            "--config",
            &patch,
        ],
        &[],
    )
}

/// The first `KEY = "VALUE"` line's value in the manifest `path` (the
/// root's `rust-version` is the one of `[workspace.package]`, a package's
/// `version` its own).
fn manifest_string(path: &std::path::Path, key: &str) -> Result<String, String> {
    let s = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    s.lines()
        .filter_map(|l| l.trim().strip_prefix(key))
        .filter(|rest| rest.trim_start().starts_with('='))
        .filter_map(|l| l.split('"').nth(1))
        .next()
        .map(str::to_string)
        .ok_or_else(|| format!("{}: no {key}", path.display()))
}

/// The names of the tests that printed `NAME: skipped: no CUDA device`
/// (`indexer_tests::gpu`), each once.
fn skipped_gpu_tests(output: &str) -> Vec<String> {
    let mut v: Vec<String> = output
        .lines()
        .filter_map(|l| l.strip_suffix(": skipped: no CUDA device"))
        .map(|n| n.trim().to_string())
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Runs the benchmark binary in release mode with the given arguments.
fn bench(args: &[String]) -> Result<(), String> {
    let root = util::repo_root();
    let mut a: Vec<&str> = vec![
        "run",
        "--release",
        "-p",
        "indexer-tests",
        "--bin",
        "indexer-bench",
        "--",
    ];
    a.extend(args.iter().map(String::as_str));
    util::cargo(&root, &a, &[])
}

#[cfg(test)]
mod skip_tests {
    #[test]
    fn skipped_gpu_tests_are_counted_once_each() {
        let out = "running 2 tests\n\
                   ---- a stdout ----\n\
                   a_gpu_test: skipped: no CUDA device\n\
                   b (GPU part): skipped: no CUDA device\n\
                   a_gpu_test: skipped: no CUDA device\n\
                   test result: ok. 2 passed\n";
        assert_eq!(
            super::skipped_gpu_tests(out),
            vec!["a_gpu_test".to_string(), "b (GPU part)".to_string()]
        );
        assert!(super::skipped_gpu_tests("test result: ok").is_empty());
    }
}
