//! `gpu-bundle`: one folder with release test and bench binaries, the PTX and
//! `run.sh`, to copy to the GPU machine (no Rust there) and run in one go.

use crate::util;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds the bundle into `--out DIR` (default `bundle/`).
pub fn gpu_bundle(args: &[String]) -> Result<(), String> {
    let root = util::repo_root();
    let out = match args.iter().position(|a| a == "--out") {
        Some(i) => PathBuf::from(args.get(i + 1).ok_or("--out needs a directory")?),
        None => root.join("bundle"),
    };
    let _ = std::fs::remove_dir_all(&out);
    for d in ["tests", "bin", "ptx"] {
        std::fs::create_dir_all(out.join(d)).map_err(|e| e.to_string())?;
    }
    util::step("building release test binaries");
    for exe in artifacts(
        &root,
        &[
            "test",
            "--release",
            "--no-run",
            "-p",
            "dsa-indexer-bwd",
            "-p",
            "indexer-tests",
        ],
        true,
    )? {
        copy_into(&exe, &out.join("tests"))?;
    }
    util::step("building release binaries and examples");
    for exe in artifacts(
        &root,
        &[
            "build",
            "--release",
            "-p",
            "dsa-indexer-bwd",
            "-p",
            "indexer-tests",
            "--bins",
            "--examples",
        ],
        false,
    )? {
        copy_into(&exe, &out.join("bin"))?;
    }
    for a in &crate::ptx::ARCHS {
        copy_into(&crate::ptx::ptx_path(&root, a.target), &out.join("ptx"))?;
    }
    // The bring-up kit's kernels with bounded mbarrier waits (not committed).
    crate::ptx::build_watchdog_ptx(&out.join("ptx-watchdog"))?;
    // The Python package: its wheel, its GPU tests and examples (`run.sh
    // --python`).
    util::step("building the Python wheel");
    let py = out.join("python");
    crate::python::build_wheel(&root, &py, false)?;
    for (from, to) in [("python/tests", "tests"), ("python/examples", "examples")] {
        std::fs::create_dir_all(py.join(to)).map_err(|e| e.to_string())?;
        for e in std::fs::read_dir(root.join(from)).map_err(|e| format!("{from}: {e}"))? {
            let path = e.map_err(|e| e.to_string())?.path();
            if path.extension().is_some_and(|x| x == "py") {
                copy_into(&path, &py.join(to))?;
            }
        }
    }
    let run = out.join("run.sh");
    std::fs::write(&run, RUN_SH).map_err(|e| e.to_string())?;
    util::run(Command::new("chmod").arg("+x").arg(&run))?;
    println!("bundle written to {}", out.display());
    Ok(())
}

/// Test harnesses that never touch a GPU (generators, reports, file
/// formats, source checks): CI runs them, and leaving them out keeps the
/// bundle and the working tree under the 64 MiB a device call carries.
const CPU_ONLY_HARNESSES: [&str; 7] = [
    "cpu",
    "dense",
    "generators",
    "function_length",
    "report",
    "side_by_side_script",
    "dense_side_by_side_script",
];

/// Executables cargo reports for `args` (test harnesses when `tests`).
fn artifacts(root: &Path, args: &[&str], tests: bool) -> Result<Vec<PathBuf>, String> {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root)
        .args(args)
        .arg("--message-format=json-render-diagnostics");
    let (stdout, _) = util::output(&mut c)?;
    let mut v = Vec::new();
    for line in stdout.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" || msg["profile"]["test"].as_bool() != Some(tests) {
            continue;
        }
        let target = msg["target"]["name"].as_str().unwrap_or("");
        if tests && CPU_ONLY_HARNESSES.contains(&target) {
            continue;
        }
        if let Some(exe) = msg["executable"].as_str() {
            // Test harnesses with no tests (those of the binaries) only
            // take space in the bundle, whose size a copy is limited by.
            if tests && test_count(Path::new(exe))? == 0 {
                continue;
            }
            v.push(PathBuf::from(exe));
        }
    }
    Ok(v)
}

/// Number of tests a libtest harness lists.
fn test_count(exe: &Path) -> Result<usize, String> {
    let (out, _) = util::output(Command::new(exe).args(["--list", "--format", "terse"]))?;
    Ok(out.lines().filter(|l| l.ends_with(": test")).count())
}

/// Copies `src` into `dir`; executables are stripped of their symbols when
/// `strip` is on the PATH (the bundle is copied to the GPU machine).
fn copy_into(src: &Path, dir: &Path) -> Result<(), String> {
    let name = src.file_name().ok_or("no file name")?;
    let dest = dir.join(name);
    std::fs::copy(src, &dest).map_err(|e| format!("{}: {e}", src.display()))?;
    if src.extension().is_none() {
        let _ = Command::new("strip").arg(&dest).output();
    }
    Ok(())
}

const RUN_SH: &str = r#"#!/usr/bin/env bash
# Runs every test binary of the bundle with the GPU required, then the main
# example; prints per-binary results and one summary line.
# Usage: bash run.sh [--bench ARGS... | --plans ARGS... | --soak ARGS... | --sanitize [TOOL...] | --python | --blackwell]
#   --plans: bin/indexer-plans for sparse and dense plans, each in a fresh
#   process with the driver's JIT cache off (CUDA_CACHE_DISABLE=1): with the
#   shipped machine code, then with the PTX (INDEXER_PTX_DIR=ptx) to compare.
#   --soak: runs bin/indexer-soak (random shapes and options on 2-4 streams
#   with graph replays, checked against the CPU reference; about two
#   minutes by default) and exits with its status.
#   --sanitize: runs bin/indexer-sanitize (one small case per kernel family)
#   under compute-sanitizer's memcheck, racecheck, synccheck and initcheck
#   (or the tools named) and fails on any report.
#   --python: installs python/*.whl into a temporary folder (no network, no
#   dependencies: the machine's torch) and runs the Python package's tests
#   (GPU ones included) and python/examples/train_indexer.py (50 steps
#   under torch.compile against plain autograd).
#   --blackwell: the bring-up kit (bin/indexer-bringup) for a first B200 /
#   B300: info, watchdog self-test, tcgen05 smoke, one-MMA probes, stage 2
#   on one row, random problems, timing; in order, with the watchdog build
#   of the kernels (ptx-watchdog/), stopping at the first failure; every
#   step's lines in bringup-report.txt.
set -u
cd "$(dirname "$0")"
export INDEXER_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
if [ "${1:-}" = "--bench" ]; then shift; exec ./bin/indexer-bench "$@"; fi
if [ "${1:-}" = "--blackwell" ]; then
  report="$PWD/bringup-report.txt"; : > "$report"
  { date -u; nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader || true; } >> "$report"
  export INDEXER_PTX_DIR="$PWD/ptx-watchdog"
  passed=0; skipped=0; failed=""
  for step in info watchdog smoke probes one-row props timing; do
    case $step in
      watchdog) INDEXER_WATCHDOG_MS=200 ./bin/indexer-bringup "$step" --report "$report" ;;
      timing) env -u INDEXER_PTX_DIR ./bin/indexer-bringup "$step" --report "$report" ;;
      *) ./bin/indexer-bringup "$step" --report "$report" ;;
    esac
    rc=$?
    if [ "$rc" -eq 0 ]; then passed=$((passed + 1))
    elif [ "$rc" -eq 3 ]; then skipped=$((skipped + 1))
    else failed=$step; break; fi
  done
  summary="bring-up: $passed passed, $skipped skipped${failed:+, stopped at $failed (failed)}; report: $report"
  echo "$summary" | tee -a "$report"
  [ -z "$failed" ]; exit $?
fi
if [ "${1:-}" = "--plans" ]; then
  shift; rc=0
  for kind in sparse dense; do
    echo "--- $kind plans: machine code, CUDA_CACHE_DISABLE=1"
    CUDA_CACHE_DISABLE=1 ./bin/indexer-plans --kind "$kind" "$@" || rc=1
    echo "--- $kind plans: PTX through INDEXER_PTX_DIR (JIT), CUDA_CACHE_DISABLE=1"
    CUDA_CACHE_DISABLE=1 INDEXER_PTX_DIR="$PWD/ptx" ./bin/indexer-plans --kind "$kind" --later 20 || rc=1
  done
  exit $rc
fi
if [ "${1:-}" = "--soak" ]; then shift; exec ./bin/indexer-soak "$@"; fi
if [ "${1:-}" = "--python" ]; then
  site=$(mktemp -d)
  python3 -m pip install --quiet --no-index --no-deps --target "$site" python/*.whl || exit 1
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  rc=0
  (cd python/tests && python3 -m unittest test_native test_gpu test_forward_gpu test_dense_gpu) || rc=1
  echo "=== example: train_indexer.py"
  python3 python/examples/train_indexer.py || rc=1
  echo "python: $([ "$rc" -eq 0 ] && echo passed || echo FAILED)"
  exit $rc
fi
if [ "${1:-}" = "--sanitize" ]; then
  shift
  tools="${*:-memcheck racecheck synccheck initcheck}"
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
  [ -n "$cs" ] || { echo "sanitize: compute-sanitizer not found"; exit 1; }
  "$cs" --version | tail -n 1
  clean=0; dirty=""
  for tool in $tools; do
    log=$(mktemp)
    extra=""
    [ "$tool" = racecheck ] && extra="--racecheck-report all"
    "$cs" --tool "$tool" $extra --error-exitcode 99 --print-limit 20 ./bin/indexer-sanitize > "$log" 2>&1
    rc=$?
    grep -E '^case |cases ok|SUMMARY' "$log" | sed "s/^/[$tool] /"
    if [ "$rc" -eq 0 ] && grep -q 'cases ok' "$log" && grep -Eq 'SUMMARY: 0 (errors|hazards)' "$log"; then
      clean=$((clean + 1)); echo "sanitize $tool: clean"
    else
      dirty="$dirty $tool"; echo "sanitize $tool: FAILED (exit $rc); first reports:"
      grep -E '=========' "$log" | head -n 40
    fi
  done
  n=$(echo $tools | wc -w)
  echo "sanitize: $clean of $n tools clean${dirty:+, failing:$dirty}"
  [ -z "$dirty" ]; exit $?
fi
passed=0; failed=0; bad=""
for t in tests/*; do
  echo "=== $t"
  log=$(mktemp)
  "./$t" --test-threads=1 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  p=$(grep -E '^test result:' "$log" | sed -E 's/.* ([0-9]+) passed.*/\1/' | awk '{s+=$1} END {print s+0}')
  f=$(grep -E '^test result:' "$log" | sed -E 's/.* ([0-9]+) failed.*/\1/' | awk '{s+=$1} END {print s+0}')
  passed=$((passed + p)); failed=$((failed + f))
  if [ "$rc" -ne 0 ]; then bad="$bad $t"; [ "$f" -eq 0 ] && failed=$((failed + 1)); fi
done
echo "=== example"
if ./bin/indexer_bwd; then passed=$((passed + 1)); else failed=$((failed + 1)); bad="$bad example"; fi
[ -n "$bad" ] && echo "failing:$bad"
echo "bundle: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
"#;
