//! scripts/side_by_side.py without a GPU or torch: its `--help`, and its
//! safetensors writer and reader against this crate's (`indexer_tests::io`),
//! both ways. Skipped when `python3` is missing.

use dsa_indexer_bwd::bf16;
use dsa_indexer_bwd::oneshot::GradVec;
use indexer_tests::io::{read_case, serialize_outputs};
use indexer_tests::script::{python, scripts_dir};
use std::path::PathBuf;

fn script() -> PathBuf {
    scripts_dir().join("side_by_side.py")
}

#[test]
fn help_needs_no_torch() {
    let s = script();
    let Some((rc, out, err)) = python(&[s.to_str().unwrap(), "--help"]) else {
        println!("skipped: no python3");
        return;
    };
    assert_eq!(rc, 0, "{err}");
    for flag in [
        "--quick",
        "--runs",
        "--bench",
        "--long-context",
        "--json",
        "--ids",
    ] {
        assert!(out.contains(flag), "{flag}: {out}");
    }
}

#[test]
fn safetensors_files_cross_between_python_and_rust() {
    let dir = std::env::temp_dir().join(format!("sbs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let case = dir.join("case.safetensors");
    let scripts = script().parent().unwrap().to_path_buf();
    // B=1, S_q=2, S_k=3, H=16, D=64, topk=2; bf16 values k/8 are exact.
    let write = format!(
        r#"
import struct, sys
sys.path.insert(0, {scripts:?})
import side_by_side as s
bf = lambda v: b"".join(struct.pack("<f", x)[2:] for x in v)
f32 = lambda v: struct.pack("<%df" % len(v), *v)
rec = {{
    "index_q": ("BF16", [1, 2, 16, 64], bf([i % 16 / 8 for i in range(2048)])),
    "weights": ("BF16", [1, 2, 16], bf([0.5, -1.0, 2.0, 0.25] * 8)),
    "index_k": ("BF16", [1, 3, 64], bf([-(i % 16) / 8 for i in range(192)])),
    "attn_score": ("F32", [1, 2, 2], f32([0.25, 0.75, 1.0, 0.0])),
    "index_score": ("F32", [1, 2, 2], f32([0.5, 0.5, 0.125, 0.875])),
    "topk_indices": ("I32", [1, 2, 2], struct.pack("<4i", 2, 0, -1, 1)),
    "grad_loss": ("F32", [1], f32([1.5])),
}}
open({case:?}, "wb").write(s.pack_safetensors(rec, {{"sm_scale": 0.5, "key_ids": "local"}}))
"#,
        scripts = scripts.to_str().unwrap(),
        case = case.to_str().unwrap()
    );
    let Some((rc, _, err)) = python(&["-c", &write]) else {
        println!("skipped: no python3");
        return;
    };
    assert_eq!(rc, 0, "{err}");
    let c = read_case(&case).unwrap();
    assert_eq!(
        (
            c.shape.seq_q,
            c.shape.seq_k,
            c.shape.heads,
            c.shape.head_dim,
            c.shape.topk
        ),
        (2, 3, 16, 64, 2)
    );
    assert_eq!(c.index_q[25].to_f32(), 9.0 / 8.0);
    assert_eq!(c.index_k[191].to_f32(), -15.0 / 8.0);
    assert_eq!(c.weights[31].to_f32(), 0.25);
    assert_eq!(c.attn_score, [0.25, 0.75, 1.0, 0.0]);
    assert_eq!(c.index_score[3], 0.875);
    assert_eq!(c.topk_indices, [2, 0, -1, 1]);
    assert_eq!(c.grad_loss(None, "f").unwrap().0, 1.5);
    assert_eq!(c.metadata["sm_scale"], "0.5");
    assert_eq!(c.metadata["key_ids"], "local");

    // And back: outputs written here, read by the script's reader.
    let out = dir.join("out.safetensors");
    let bytes = serialize_outputs(
        &c.shape,
        &[1.0, -2.0, 3.0, 4.0],
        &vec![bf16::from_f32(0.5); 2048],
        &GradVec::Bf16(vec![bf16::ONE; 32]),
        &GradVec::F32(vec![0.25; 192]),
        &[("median_us", "12.5".to_string())],
        "out",
    )
    .unwrap();
    std::fs::write(&out, bytes).unwrap();
    let read = format!(
        r#"
import json, struct, sys
sys.path.insert(0, {scripts:?})
import side_by_side as s
recs, meta = s.unpack_safetensors(open({out:?}, "rb").read())
gs = struct.unpack("<4f", recs["grad_signal"][2])
print(json.dumps({{n: [r[0], r[1]] for n, r in recs.items()}}), gs, meta["median_us"])
"#,
        scripts = scripts.to_str().unwrap(),
        out = out.to_str().unwrap()
    );
    let (rc, text, err) = python(&["-c", &read]).unwrap();
    assert_eq!(rc, 0, "{err}");
    for want in [
        r#""grad_signal": ["F32", [1, 2, 2]]"#,
        r#""d_index_q": ["BF16", [1, 2, 16, 64]]"#,
        r#""d_weights": ["BF16", [1, 2, 16]]"#,
        r#""d_index_k": ["F32", [1, 3, 64]]"#,
        "(1.0, -2.0, 3.0, 4.0) 12.5",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The forward's side-by-side and the host-time benchmark: their `--help`
/// needs neither torch nor the package.
#[test]
fn forward_and_host_time_scripts_help_needs_no_torch() {
    for (name, flags) in [
        (
            "forward_side_by_side.py",
            &["--runs", "--ids", "--long-context", "--json", "--no-cudnn"][..],
        ),
        ("host_time.py", &["--calls", "--burst"][..]),
    ] {
        let s = scripts_dir().join(name);
        let Some((rc, out, err)) = python(&[s.to_str().unwrap(), "--help"]) else {
            println!("skipped: no python3");
            return;
        };
        assert_eq!(rc, 0, "{name}: {err}");
        for flag in flags {
            assert!(out.contains(flag), "{name}: {flag}: {out}");
        }
    }
}
