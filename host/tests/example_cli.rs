//! The main example as a user runs it: usage errors for unknown flags and
//! bad values, a typed error (not an abort) for a problem too large for
//! host memory, and a small run on the CPU path.

use std::path::PathBuf;
use std::process::Command;

/// The example binary: `target/<profile>/examples/` beside this test's
/// `deps/` folder, or `../bin/` in the GPU bundle.
fn example() -> PathBuf {
    let me = std::env::current_exe().unwrap();
    let dir = me.parent().unwrap();
    for p in [
        dir.join("../examples/indexer_bwd"),
        dir.join("../bin/indexer_bwd"),
    ] {
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "example binary not found beside {} (cargo test builds it; or run \
         `cargo build --release --example indexer_bwd`)",
        me.display()
    );
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(example()).args(args).output().unwrap();
    (
        out.status.code().expect("exited, not killed by a signal"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_arguments_are_usage_errors() {
    let (rc, out, _) = run(&["--help"]);
    assert_eq!(rc, 0);
    assert!(out.contains("--seq-q") && out.contains("--cpu"), "{out}");
    for (args, want) in [
        (&["--bogus"][..], "unexpected argument '--bogus'"),
        (&["--seq-q", "many"], "invalid value 'many'"),
        (&["--iters", "0"], "invalid value '0'"),
        (&["--topk"], "a value is required"),
    ] {
        let (rc, _, err) = run(args);
        assert_eq!(rc, 2, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let (rc, _, err) = run(&["--heads", "48", "--cpu"]);
    assert_eq!(rc, 1);
    assert!(err.contains("heads = 48"), "{err}");
}

/// `--seq-q 100000000` asks for 1.6 TB of `index_q`: an error, exit
/// status 1, instead of an allocation abort (from the estimate where the
/// system reports available memory, else from the failed allocation).
#[test]
fn a_problem_too_large_for_memory_is_an_error() {
    let (rc, _, err) = run(&["--seq-q", "100000000", "--cpu"]);
    assert_eq!(rc, 1, "{err}");
    assert!(
        err.contains("out of host memory: this problem needs about")
            || err.contains("out of host memory: index_q needs 1638400000000 bytes"),
        "{err}"
    );
}

#[test]
fn a_small_problem_runs_on_the_cpu() {
    let (rc, out, err) = run(&[
        "--seq-q", "8", "--seq-k", "64", "--topk", "16", "--heads", "16", "--dim", "64", "--cpu",
    ]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("CPU fallback"), "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("rel error"))
        .expect("error line");
    let max: f64 = line.rsplit("max ").next().unwrap().trim().parse().unwrap();
    // Output rounding to bf16 only.
    assert!(max < 4e-3, "{line}");
}
