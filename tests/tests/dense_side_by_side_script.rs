//! scripts/dense_side_by_side.py without torch: its `--help`; the case
//! files it describes (`file_layout`, BSHD and packed), written by its
//! safetensors writer and read by `indexer_tests::dense_io`; and
//! `indexer-bench --dense-input` on them, which without a CUDA device
//! refuses cleanly (exit 1, nothing written) and with one writes outputs
//! the script's reader takes. Skipped when `python3` is missing.

use dsa_indexer_bwd::dense::Layout;
use indexer_tests::dense_io::read_dense_case;
use indexer_tests::script::{python, scripts_dir as scripts};
use std::path::Path;
use std::process::Command;

#[test]
fn help_needs_no_torch() {
    let s = scripts().join("dense_side_by_side.py");
    let Some((rc, out, err)) = python(&[s.to_str().unwrap(), "--help"]) else {
        println!("skipped: no python3");
        return;
    };
    assert_eq!(rc, 0, "{err}");
    for flag in [
        "--quick",
        "--runs",
        "--warmup",
        "--bench",
        "--seqs",
        "--cu-seqlens",
        "--packed",
        "--json",
    ] {
        assert!(out.contains(flag), "{flag}: {out}");
    }
}

/// Writes the script's file for case `c` (a Python dict literal) to
/// `path`: every tensor of `file_layout(c)` with a cycle of exact values
/// (bf16 and f32 -3/8 .. 3/8; the packed case's own cu_seqlens).
fn write_case(c: &str, path: &Path) -> Option<(i32, String, String)> {
    let code = format!(
        r#"
import math, struct, sys
sys.path.insert(0, {scripts:?})
import dense_side_by_side as d, side_by_side as s
c = {c}
cyc = [(i - 3) / 8 for i in range(7)]
def fill(dt, shape, name):
    n = math.prod(shape)
    if dt == "I32":
        return struct.pack("<%di" % n, *c["cu"])
    one = {{"BF16": lambda v: struct.pack("<f", v)[2:], "F32": lambda v: struct.pack("<f", v)}}[dt]
    block = b"".join(one(v) for v in cyc)
    return (block * (n // 7 + 1))[: n * len(one(0.0))]
rec = {{n: (dt, shape, fill(dt, shape, n)) for n, (dt, shape) in d.file_layout(c).items()}}
open({path:?}, "wb").write(s.pack_safetensors(rec, {{"mode": "dense"}}))
"#,
        scripts = scripts().to_str().unwrap(),
        path = path.to_str().unwrap()
    );
    python(&["-c", &code])
}

/// `indexer-bench --dense-input inp --output out` on this machine: without
/// a CUDA device a clean refusal; with one, outputs of the script's
/// names and `file_layout`'s shapes (or the plan's refusal on a GPU the
/// dense path does not run on).
fn bench_on(inp: &Path, out: &Path, c: &str) {
    let run = Command::new(env!("CARGO_BIN_EXE_indexer-bench"))
        .arg("--dense-input")
        .arg(inp)
        .arg("--output")
        .arg(out)
        .args(["--runs", "2", "--warmup", "1"])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
    );
    if dsa_indexer_bwd::cuda_device_count() == 0 {
        assert_eq!(run.status.code(), Some(1), "{stdout}{stderr}");
        assert!(stderr.contains("no CUDA device"), "{stderr}");
        assert!(!out.exists(), "nothing written without a GPU");
        return;
    }
    if !run.status.success() {
        assert!(stderr.contains("does not run on this GPU"), "{stderr}");
        return;
    }
    assert!(stdout.contains(r#""kind":"dense_input""#), "{stdout}");
    let code = format!(
        r#"
import sys
sys.path.insert(0, {scripts:?})
import dense_side_by_side as d, side_by_side as s
recs, meta = s.unpack_safetensors(open({out:?}, "rb").read())
lay = d.file_layout({c})
want = {{"grad_signal": lay["index_score"][1], "d_index_q": lay["index_q"][1],
        "d_weights": lay["weights"][1], "d_index_k": lay["index_k"][1]}}
assert sorted(recs) == sorted(d.OUTPUTS), sorted(recs)
for n in d.OUTPUTS:
    assert list(recs[n][1]) == want[n], (n, recs[n][1], want[n])
assert meta["mode"] == "dense", meta
print("read back")
"#,
        scripts = scripts().to_str().unwrap(),
        out = out.to_str().unwrap()
    );
    let (rc, text, err) = python(&["-c", &code]).unwrap();
    assert_eq!(rc, 0, "{err}");
    assert!(text.contains("read back"), "{text}");
}

#[test]
fn case_files_cross_between_the_script_and_rust() {
    let dir = std::env::temp_dir().join(format!("dense-sbs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        r#"dict(layout="bshd", seq=130, heads=64, dim=128, ratio=1)"#,
        r#"dict(layout="packed", cu=[0, 50, 130], heads=64, dim=128, ratio=1)"#,
    ];
    for (i, c) in cases.iter().enumerate() {
        let inp = dir.join(format!("case{i}.safetensors"));
        let Some((rc, _, err)) = write_case(c, &inp) else {
            println!("skipped: no python3");
            return;
        };
        assert_eq!(rc, 0, "{err}");
        let case = read_dense_case(&inp, 1).unwrap();
        let s = &case.shape;
        assert_eq!((s.heads, s.head_dim, s.ratio), (64, 128, 1));
        match (&s.layout, i) {
            (
                Layout::Bshd {
                    batch,
                    seq_q,
                    seq_k,
                },
                0,
            ) => assert_eq!((*batch, *seq_q, *seq_k), (1, 130, 130)),
            (
                Layout::Varlen {
                    cu_seqlens_q,
                    cu_seqlens_k,
                    score_cols,
                },
                1,
            ) => {
                assert_eq!(cu_seqlens_q, &[0, 50, 130]);
                assert_eq!(cu_seqlens_k, &[0, 50, 130]);
                assert_eq!(*score_cols, 80);
            }
            (l, _) => panic!("case {i}: layout {l:?}"),
        }
        assert_eq!(case.index_q[8].to_f32(), -2.0 / 8.0);
        assert_eq!(case.index_k[3].to_f32(), 0.0);
        assert_eq!(case.index_score[6], 3.0 / 8.0);
        assert_eq!(case.attn_l1norm[1], -2.0 / 8.0);
        assert_eq!(case.grad_loss(None, "f").unwrap().0, -3.0 / 8.0);
        assert!(case.unread.is_empty(), "{:?}", case.unread);
        bench_on(&inp, &dir.join(format!("out{i}.safetensors")), c);
    }
    std::fs::remove_dir_all(&dir).ok();
}
