//! The safetensors replay runner end to end: a random case written to a
//! file, replayed by the `indexer-replay` binary, outputs read back and
//! compared (CPU path bitwise with `cpu::execute`; GPU path, where present,
//! against the reference within SPEC's tolerances).

use dsa_indexer_bwd::cpu::{self, HostGrad, HostOutputs};
use dsa_indexer_bwd::{bf16, KeyIds, Options, ScoreKind, Shape};
use indexer_tests::{rel_err, Gen, Padding, Problem, Values};
use rand::SeedableRng;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::process::Command;

/// A stored `grad_loss` tensor: dtype, shape, little-endian bytes.
type Stored = (Dtype, Vec<usize>, Vec<u8>);

fn write_case(p: &Problem, path: &std::path::Path) {
    let gl = (Dtype::F32, vec![1], p.grad_loss.to_le_bytes().to_vec());
    write_case_with(p, path, Some(gl));
}

/// Writes the case with the given `grad_loss` tensor (or none).
fn write_case_with(p: &Problem, path: &std::path::Path, grad_loss: Option<Stored>) {
    write_case_meta(p, path, grad_loss, &[]);
}

/// Writes the case with a `grad_loss` tensor (or none) and string metadata.
fn write_case_meta(
    p: &Problem,
    path: &std::path::Path,
    grad_loss: Option<Stored>,
    meta: &[(&str, &str)],
) {
    let s = p.shape;
    let bf = |v: &[bf16]| -> Vec<u8> { v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect() };
    let f = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    // i64 ids, as PyTorch dumps them.
    let ids: Vec<u8> = p
        .ids
        .iter()
        .flat_map(|&x| (x as i64).to_le_bytes())
        .collect();
    let (q, w, k, a, sc) = (bf(&p.q), bf(&p.w), bf(&p.k), f(&p.target), f(&p.score));
    let slots = vec![s.batch, s.seq_q, s.topk];
    let mut views = vec![
        (
            "index_q",
            TensorView::new(Dtype::BF16, vec![s.batch, s.seq_q, s.heads, s.head_dim], &q).unwrap(),
        ),
        (
            "weights",
            TensorView::new(Dtype::BF16, vec![s.batch, s.seq_q, s.heads], &w).unwrap(),
        ),
        (
            "index_k",
            TensorView::new(Dtype::BF16, vec![s.batch, s.seq_k, s.head_dim], &k).unwrap(),
        ),
        (
            "attn_score",
            TensorView::new(Dtype::F32, slots.clone(), &a).unwrap(),
        ),
        (
            "index_score",
            TensorView::new(Dtype::F32, slots.clone(), &sc).unwrap(),
        ),
        (
            "topk_indices",
            TensorView::new(Dtype::I64, slots, &ids).unwrap(),
        ),
    ];
    if let Some((dt, shape, bytes)) = &grad_loss {
        views.push((
            "grad_loss",
            TensorView::new(*dt, shape.clone(), bytes).unwrap(),
        ));
    }
    let meta: std::collections::HashMap<String, String> = meta
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    safetensors::serialize_to_file(views, (!meta.is_empty()).then_some(meta), path).unwrap();
}

/// The runner binary: cargo's path when it exists, else `../bin/` beside
/// this test binary (the layout of `cargo xtask gpu-bundle`).
fn replay_exe() -> std::path::PathBuf {
    let built = std::path::PathBuf::from(env!("CARGO_BIN_EXE_indexer-replay"));
    if built.is_file() {
        return built;
    }
    let me = std::env::current_exe().unwrap();
    me.parent().unwrap().join("../bin/indexer-replay")
}

fn replay(input: &std::path::Path, output: &std::path::Path, extra: &[&str]) {
    let st = Command::new(replay_exe())
        .arg(input)
        .arg(output)
        .args([
            "--ids",
            "local",
            "--log-score",
            "--sm-scale",
            "0.5",
            "--loss-coeff",
            "1.5",
        ])
        .args(extra)
        .status()
        .unwrap();
    assert!(st.success(), "indexer-replay failed: {st}");
}

fn read(path: &std::path::Path) -> (Vec<f32>, Vec<bf16>, Vec<bf16>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let f = |n: &str| -> Vec<f32> {
        let t = st.tensor(n).unwrap();
        assert_eq!(t.dtype(), Dtype::F32, "{n}");
        t.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let b = |n: &str| -> Vec<bf16> {
        let t = st.tensor(n).unwrap();
        assert_eq!(t.dtype(), Dtype::BF16, "{n}");
        t.data()
            .chunks_exact(2)
            .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
            .collect()
    };
    (
        f("grad_signal"),
        b("d_index_q"),
        b("d_weights"),
        f("d_index_k"),
    )
}

#[test]
fn replay_roundtrips_a_dumped_case() {
    let shape = Shape {
        batch: 2,
        seq_q: 7,
        seq_k: 33,
        heads: 16,
        head_dim: 64,
        topk: 19,
    };
    let opts = Options {
        sm_scale: 0.5,
        key_ids: KeyIds::Local,
        score: ScoreKind::LogProbs,
        ..Options::default()
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let g = Gen {
        values: Values::Grid,
        padding: Padding::OutOfRange,
        short_rows: 0.5,
        trailing: false,
        duplicates: true,
        masked: 0.05,
    };
    let mut p = Problem::random(&mut rng, shape, opts, g);
    p.loss_coeff = 1.5;
    let dir = std::env::temp_dir().join(format!("indexer-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (input, out_cpu, out_gpu) = (
        dir.join("in.safetensors"),
        dir.join("cpu.safetensors"),
        dir.join("gpu.safetensors"),
    );
    write_case(&p, &input);

    replay(&input, &out_cpu, &["--cpu"]);
    let (gs, dq, dw, dk) = read(&out_cpu);
    let mut egs = p.target.clone();
    let mut edq = vec![bf16::ZERO; shape.q_len()];
    let mut edw = vec![bf16::ZERO; shape.w_len()];
    let mut edk = vec![0f32; shape.k_len()];
    let out = HostOutputs {
        attn_score: &mut egs,
        d_index_q: &mut edq,
        d_weights: HostGrad::Bf16(&mut edw),
        d_index_k: HostGrad::F32(&mut edk),
    };
    cpu::execute(&shape, &opts, &p.host(), out).unwrap();
    assert_eq!(gs, egs);
    assert_eq!(dq, edq);
    assert_eq!(dw, edw);
    assert_eq!(dk, edk);
    assert!(dk.iter().any(|&v| v != 0.0), "case has no gradient at all");

    if indexer_tests::gpu("replay_roundtrips_a_dumped_case (GPU part)").is_some() {
        replay(&input, &out_gpu, &[]);
        let (gs2, dq2, dw2, dk2) = read(&out_gpu);
        let r = cpu::reference(&shape, &opts, &p.host()).unwrap();
        let w = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
        let wb = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
        assert!(rel_err(&w(&gs2), &r.grad_signal) <= 1e-6);
        assert!(rel_err(&wb(&dq2), &r.d_index_q) <= 8e-3);
        assert!(rel_err(&wb(&dw2), &r.d_weights) <= 8e-3);
        assert!(rel_err(&w(&dk2), &r.d_index_k) <= 8e-3);
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A scratch folder of one test, removed when dropped.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("indexer-replay-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn at(&self, file: &str) -> std::path::PathBuf {
        self.0.join(file)
    }
    /// Files in the folder (to see that no temporary file is left).
    fn files(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the replay binary with `args` (always on the CPU); returns the
/// exit code, stdout and stderr.
fn run_cli(args: &[&std::ffi::OsStr]) -> (i32, String, String) {
    let out = Command::new(replay_exe()).args(args).output().unwrap();
    (
        out.status.code().expect("exited, not killed by a signal"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn os<S: AsRef<std::ffi::OsStr> + ?Sized>(s: &S) -> &std::ffi::OsStr {
    s.as_ref()
}

/// A small two-batch case with global ids (grid values, no padding).
fn small_case(key_ids: KeyIds) -> Problem {
    let shape = Shape {
        batch: 2,
        seq_q: 3,
        seq_k: 20,
        heads: 16,
        head_dim: 64,
        topk: 8,
    };
    let opts = Options {
        key_ids,
        ..Options::default()
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let g = Gen {
        values: Values::Grid,
        padding: Padding::NegOne,
        short_rows: 0.0,
        trailing: false,
        duplicates: false,
        masked: 0.0,
    };
    let mut p = Problem::random(&mut rng, shape, opts, g);
    p.grad_loss = 0.5;
    p
}

/// Usage errors exit with status 2 and say what is wrong: unknown flags,
/// misspelled values, a flag without its value, non-finite scalars.
#[test]
fn bad_arguments_are_usage_errors() {
    let (rc, out, _) = run_cli(&[os("--help")]);
    assert_eq!(rc, 0);
    assert!(out.contains("--ids") && out.contains("possible values: global, local"));
    let cases: [(&[&str], &str); 8] = [
        (&["--bogus"], "unexpected argument '--bogus'"),
        (&["--ids", "globl"], "invalid value 'globl'"),
        (&["--dk", "f16"], "invalid value 'f16'"),
        (&["--dw", "f64"], "invalid value 'f64'"),
        (&["--backend", "foo"], "invalid value 'foo'"),
        (&["--sm-scale"], "a value is required for '--sm-scale"),
        (&["--sm-scale", "nan"], "not finite"),
        (&["--loss-coeff", "inf"], "not finite"),
    ];
    for (extra, want) in cases {
        let mut args = vec![os("in.safetensors"), os("out.safetensors")];
        args.extend(extra.iter().map(os));
        let (rc, _, err) = run_cli(&args);
        assert_eq!(rc, 2, "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
    }
    // Negative scales are values, not flags.
    let dir = Scratch::new("negative");
    let (input, output) = (dir.at("in.safetensors"), dir.at("out.safetensors"));
    write_case(&small_case(KeyIds::Global), &input);
    let args = [
        input.as_os_str(),
        output.as_os_str(),
        os("--cpu"),
        os("--ids"),
        os("global"),
        os("--sm-scale"),
        os("-0.5"),
    ];
    let (rc, out, err) = run_cli(&args);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("sm_scale: -0.5"), "{out}");
}

/// A stored grad_loss is used when it is one f32 (shape (1,) or ()),
/// and any other type or shape, or a non-finite value, is an error naming
/// the file, never a silent 1.0.
#[test]
fn grad_loss_of_the_wrong_type_or_shape_is_an_error() {
    let dir = Scratch::new("grad-loss");
    let p = small_case(KeyIds::Global);
    let output = dir.at("out.safetensors");
    let half = |dt: Dtype, shape: Vec<usize>, bytes: Vec<u8>| Some((dt, shape, bytes));
    let bad: [(&str, Option<Stored>, &str); 4] = [
        (
            "bf16",
            half(
                Dtype::BF16,
                vec![1],
                bf16::from_f32(0.5).to_bits().to_le_bytes().to_vec(),
            ),
            "dtype BF16, expected F32",
        ),
        (
            "f64",
            half(Dtype::F64, vec![1], 0.5f64.to_le_bytes().to_vec()),
            "dtype F64, expected F32",
        ),
        (
            "two",
            half(
                Dtype::F32,
                vec![2],
                [0.5f32, 0.5].iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
            "shape [2], expected [1] or []",
        ),
        (
            "nan",
            half(Dtype::F32, vec![1], f32::NAN.to_le_bytes().to_vec()),
            "not finite",
        ),
    ];
    for (name, stored, want) in bad {
        let input = dir.at(&format!("{name}.safetensors"));
        write_case_with(&p, &input, stored);
        let (rc, out, err) = run_cli(&[
            input.as_os_str(),
            output.as_os_str(),
            os("--cpu"),
            os("--ids"),
            os("global"),
        ]);
        assert_eq!(rc, 1, "{name}: {err}");
        assert!(
            err.contains(&*input.to_string_lossy()) && err.contains("grad_loss"),
            "{name}: {err}"
        );
        assert!(err.contains(want), "{name}: {err}");
        assert!(!out.contains("ran on the"), "{name}: computed anyway");
        // --grad-loss overrides the stored tensor, whatever it is.
        let (rc, out, err) = run_cli(&[
            input.as_os_str(),
            output.as_os_str(),
            os("--cpu"),
            os("--ids"),
            os("global"),
            os("--grad-loss"),
            os("0.5"),
        ]);
        assert_eq!(rc, 0, "{name}: {err}");
        assert!(out.contains("grad_loss 0.5 (--grad-loss)"), "{out}");
    }
    // A scalar (shape ()) 0.5 is read: gradients are half of those at 1.0.
    let input = dir.at("scalar.safetensors");
    write_case_with(
        &p,
        &input,
        half(Dtype::F32, vec![], 0.5f32.to_le_bytes().to_vec()),
    );
    let (rc, out, err) = run_cli(&[
        input.as_os_str(),
        output.as_os_str(),
        os("--cpu"),
        os("--ids"),
        os("global"),
    ]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("grad_loss 0.5 ("), "{out}");
    let (_, _, _, dk_half) = read(&output);
    let input = dir.at("none.safetensors");
    write_case_with(&p, &input, None);
    let (rc, out, err) = run_cli(&[
        input.as_os_str(),
        output.as_os_str(),
        os("--cpu"),
        os("--ids"),
        os("global"),
    ]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("grad_loss 1 (default:"), "{out}");
    let (_, _, _, dk_one) = read(&output);
    assert!(dk_one.iter().any(|&v| v != 0.0));
    for (a, b) in dk_half.iter().zip(&dk_one) {
        assert!((2.0 * a - b).abs() <= 1e-6 * b.abs().max(1e-30), "{a} {b}");
    }
}

/// The output never replaces the input, is only renamed into place when
/// complete (a failed run leaves an existing OUT and no temporary file),
/// and an unwritable location fails before anything is computed; IO
/// errors name the file.
#[test]
fn outputs_are_never_lost_and_never_the_input() {
    let dir = Scratch::new("output");
    let p = small_case(KeyIds::Global);
    let (input, output) = (dir.at("in.safetensors"), dir.at("out.safetensors"));
    write_case(&p, &input);
    let original = std::fs::read(&input).unwrap();

    // OUT == IN, by the same path, another spelling, and a hard link.
    let dotted = dir.0.join(".").join("in.safetensors");
    let linked = dir.at("link.safetensors");
    std::fs::hard_link(&input, &linked).unwrap();
    for same in [&input, &dotted, &linked] {
        let (rc, out, err) = run_cli(&[
            input.as_os_str(),
            same.as_os_str(),
            os("--cpu"),
            os("--ids"),
            os("global"),
        ]);
        assert_eq!(rc, 1, "{err}");
        assert!(err.contains("is the input file"), "{err}");
        assert!(!out.contains("ran on the"));
        assert_eq!(std::fs::read(&input).unwrap(), original, "input changed");
    }
    std::fs::remove_file(&linked).unwrap();

    // A good run, then a failing one: the first result stays.
    let (rc, _, err) = run_cli(&[
        input.as_os_str(),
        output.as_os_str(),
        os("--cpu"),
        os("--ids"),
        os("global"),
    ]);
    assert_eq!(rc, 0, "{err}");
    let good = std::fs::read(&output).unwrap();
    let broken = dir.at("broken.safetensors");
    write_case_with(
        &p,
        &broken,
        Some((Dtype::F64, vec![1], 1f64.to_le_bytes().to_vec())),
    );
    let (rc, _, _) = run_cli(&[
        broken.as_os_str(),
        output.as_os_str(),
        os("--cpu"),
        os("--ids"),
        os("global"),
    ]);
    assert_eq!(rc, 1);
    assert_eq!(std::fs::read(&output).unwrap(), good, "earlier result lost");
    assert_eq!(
        dir.files(),
        ["broken.safetensors", "in.safetensors", "out.safetensors"],
        "temporary file left behind"
    );

    // An output folder that does not exist: refused before computing.
    let missing = dir.0.join("no-such-dir").join("out.safetensors");
    let (rc, out, err) = run_cli(&[
        input.as_os_str(),
        missing.as_os_str(),
        os("--cpu"),
        os("--ids"),
        os("global"),
    ]);
    assert_eq!(rc, 1);
    assert!(err.contains(&*missing.to_string_lossy()), "{err}");
    assert!(
        !out.contains("ran on the"),
        "computed before checking the output"
    );
    // A missing input and a missing tensor name the file.
    let nothing = dir.at("nothing.safetensors");
    let (rc, _, err) = run_cli(&[nothing.as_os_str(), output.as_os_str()]);
    assert_eq!(rc, 1);
    assert!(
        err.contains(&*nothing.to_string_lossy()) && err.contains("No such file"),
        "{err}"
    );
    std::fs::write(&nothing, b"not a safetensors file").unwrap();
    let (rc, _, err) = run_cli(&[nothing.as_os_str(), output.as_os_str()]);
    assert_eq!(rc, 1);
    assert!(err.contains(&*nothing.to_string_lossy()), "{err}");
    assert_eq!(std::fs::read(&output).unwrap(), good, "earlier result lost");
}

/// A global-id dump replayed with `--ids local` (batch 1 would be all
/// padding, its gradients all zero) and a local-id dump replayed as
/// global ids are refused with the fix in the message; `--trust-ids`
/// replays as given, with the documented all-padding result.
#[test]
fn ids_of_the_other_convention_are_refused() {
    let dir = Scratch::new("ids");
    let output = dir.at("out.safetensors");
    for (stored, flag, looks) in [
        (KeyIds::Global, "local", "holds global ids"),
        (KeyIds::Local, "global", "holds local ids"),
    ] {
        let p = small_case(stored);
        let input = dir.at("in.safetensors");
        write_case(&p, &input);
        let args = [
            input.as_os_str(),
            output.as_os_str(),
            os("--cpu"),
            os("--ids"),
            os(flag),
        ];
        let (rc, out, err) = run_cli(&args);
        assert_eq!(rc, 1, "{err}");
        assert!(err.contains(looks) && err.contains("batch 1"), "{err}");
        assert!(!out.contains("ran on the"));
        let mut trusted = args.to_vec();
        trusted.push(os("--trust-ids"));
        let (rc, out, err) = run_cli(&trusted);
        assert_eq!(rc, 0, "{err}");
        assert!(out.contains("topk_indices: 48 slots"), "{out}");
        if flag == "local" {
            // Every batch-1 id is out of range for local ids: padding.
            assert!(out.contains("24 valid local ids, 24 padding"), "{out}");
            let (_, dq, _, _) = read(&output);
            let half = dq.len() / 2;
            assert!(dq[half..].iter().all(|v| v.to_f32() == 0.0));
        }
        let (rc, _, err) = run_cli(&[
            input.as_os_str(),
            output.as_os_str(),
            os("--cpu"),
            os("--ids"),
            os(if flag == "local" { "global" } else { "local" }),
        ]);
        assert_eq!(rc, 0, "the right convention: {err}");
    }
}

/// Non-finite input values are reported, not rejected, and propagate
/// (a NaN key element reaches d_index_q of the rows that select it).
#[test]
fn non_finite_inputs_are_reported_and_propagate() {
    let dir = Scratch::new("nan");
    let mut p = small_case(KeyIds::Global);
    let n = p.ids[0] as usize; // selected by row 0
    p.k[n * 64 + 5] = bf16::NAN;
    let (input, output) = (dir.at("in.safetensors"), dir.at("out.safetensors"));
    write_case(&p, &input);
    let (rc, out, err) = run_cli(&[
        input.as_os_str(),
        output.as_os_str(),
        os("--cpu"),
        os("--ids"),
        os("global"),
        os("--check"),
    ]);
    assert_eq!(rc, 0, "{err}");
    assert!(
        err.contains("index_k holds 1 NaN and 0 infinite values"),
        "{err}"
    );
    let rows = (0..6)
        .filter(|r| p.ids[r * 8..(r + 1) * 8].contains(&(n as i32)))
        .count();
    let bad = format!(
        "d_index_q: {} non-finite elements, reference {}; same positions",
        16 * rows,
        16 * rows
    );
    assert!(out.contains(&bad), "{out}");
    let (gs, dq, dw, dk) = read(&output);
    assert!(gs.iter().all(|v| v.is_finite()) && dk.iter().all(|v| v.is_finite()));
    assert!(dw.iter().all(|v| v.to_f32().is_finite()));
    // Row 0, every head, column 5.
    assert!((0..16).all(|h| dq[h * 64 + 5].to_f32().is_nan()));
}

/// With B > 1 the id convention must be said (flag or metadata); ids that
/// read as the other convention are refused: a local-id dump with padding
/// written as S_k read as global ids, and one stray id >= S_k in batch 1.
#[test]
fn the_id_convention_is_said_and_checked_for_every_batch() {
    let dir = Scratch::new("said");
    let output = dir.at("out.safetensors");
    let input = dir.at("in.safetensors");
    let p = small_case(KeyIds::Global);
    write_case(&p, &input);
    let (rc, out, err) = run_cli(&[input.as_os_str(), output.as_os_str(), os("--cpu")]);
    assert_eq!(rc, 1, "{err}");
    assert!(
        err.contains("B = 2") && err.contains("--ids global"),
        "{err}"
    );
    assert!(!out.contains("ran on the"));
    // The file's metadata says it: no flag needed.
    write_case_meta(&p, &input, None, &[("key_ids", "global")]);
    let (rc, out, err) = run_cli(&[input.as_os_str(), output.as_os_str(), os("--cpu")]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("key_ids") && out.contains("metadata"), "{out}");
    write_case_meta(&p, &input, None, &[("key_ids", "sideways")]);
    let (rc, _, err) = run_cli(&[input.as_os_str(), output.as_os_str(), os("--cpu")]);
    assert_eq!(rc, 1);
    assert!(err.contains("metadata key_ids"), "{err}");

    // Local ids, padding written as S_k (= 20), replayed as global ids.
    let mut local = small_case(KeyIds::Local);
    let per_batch = 3 * 8;
    for b in 0..2 {
        local.ids[b * per_batch + 7] = 20;
    }
    write_case(&local, &input);
    let as_global = [
        input.as_os_str(),
        output.as_os_str(),
        os("--cpu"),
        os("--ids"),
        os("global"),
    ];
    let (rc, _, err) = run_cli(&as_global);
    assert_eq!(rc, 1, "{err}");
    assert!(
        err.contains("another batch's keys") && err.contains("--ids local"),
        "{err}"
    );
    let (rc, out, err) = run_cli(&[
        input.as_os_str(),
        output.as_os_str(),
        os("--cpu"),
        os("--ids"),
        os("local"),
    ]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("46 valid local ids, 2 padding"), "{out}");

    // A global-id dump with one stray id of batch 0's keys in batch 1.
    let mut stray = small_case(KeyIds::Global);
    stray.ids[per_batch + 3] = 2;
    write_case(&stray, &input);
    let (rc, _, err) = run_cli(&as_global);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("batch 1: 1 of its 24 ids"), "{err}");
    let mut trusted = as_global.to_vec();
    trusted.push(os("--trust-ids"));
    let (rc, _, err) = run_cli(&trusted);
    assert_eq!(rc, 0, "{err}");
}

/// sm_scale follows one rule in both tools: the flag, else the file's
/// metadata, else 1; negative and non-finite values are values (parsed,
/// then judged), never mistaken for flags.
#[test]
fn sm_scale_comes_from_the_flag_else_the_metadata() {
    let dir = Scratch::new("meta");
    let (input, output) = (dir.at("in.safetensors"), dir.at("out.safetensors"));
    let p = small_case(KeyIds::Global);
    let run = |extra: &[&str]| {
        let mut args = vec![input.as_os_str(), output.as_os_str(), os("--cpu")];
        args.extend([os("--ids"), os("global")]);
        args.extend(extra.iter().map(os));
        let (rc, out, err) = run_cli(&args);
        assert_eq!(rc, 0, "{extra:?}: {err}");
        (out, read(&output))
    };
    write_case(&p, &input);
    let (_, flagged) = run(&["--sm-scale", "-0.25"]);
    let gl = (Dtype::F32, vec![1], p.grad_loss.to_le_bytes().to_vec());
    write_case_meta(&p, &input, Some(gl), &[("sm_scale", "-0.25")]);
    let (out, from_meta) = run(&[]);
    assert!(
        out.contains("sm_scale") && out.contains("metadata"),
        "{out}"
    );
    assert!(out.contains("sm_scale: -0.25"), "{out}");
    assert!(flagged.1 == from_meta.1, "d_index_q differs");
    let (out, _) = run(&["--sm-scale", "1"]);
    assert!(out.contains("sm_scale: 1.0"), "the flag wins: {out}");
    for (flag, value) in [
        ("--grad-loss", "-inf"),
        ("--sm-scale", "-inf"),
        ("--loss-coeff", "-nan"),
    ] {
        let (rc, _, err) = run_cli(&[input.as_os_str(), output.as_os_str(), os(flag), os(value)]);
        assert_eq!(rc, 2, "{flag} {value}: {err}");
        assert!(err.contains("not finite"), "{flag} {value}: {err}");
    }
}

/// An output path with a trailing '/' is refused before anything is
/// computed, and a run stopped by SIGTERM leaves no temporary file.
#[test]
fn bad_output_paths_fail_at_once_and_signals_leave_nothing() {
    let dir = Scratch::new("paths");
    let input = dir.at("in.safetensors");
    write_case(&small_case(KeyIds::Global), &input);
    let slash = format!("{}/", dir.at("newdir_x").display());
    let (rc, out, err) = run_cli(&[input.as_os_str(), os(&slash), os("--ids"), os("global")]);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("ends with '/'"), "{err}");
    assert!(!out.contains("ran on the"), "computed before refusing");
    assert_eq!(dir.files(), ["in.safetensors"]);

    // A case that takes the CPU path a while; SIGTERM once the temporary
    // output exists.
    let shape = Shape {
        batch: 1,
        seq_q: 512,
        seq_k: 512,
        heads: 64,
        head_dim: 128,
        topk: 256,
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let g = Gen {
        values: Values::Grid,
        padding: Padding::NegOne,
        short_rows: 0.0,
        trailing: false,
        duplicates: false,
        masked: 0.0,
    };
    let big = Problem::random(&mut rng, shape, Options::default(), g);
    let (input, output) = (dir.at("big.safetensors"), dir.at("big-out.safetensors"));
    write_case(&big, &input);
    let mut child = Command::new(replay_exe())
        .args([input.as_os_str(), output.as_os_str(), os("--cpu")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let tmp_exists = || dir.files().iter().any(|f| f.contains(".tmp-"));
    let t = std::time::Instant::now();
    while !tmp_exists() && t.elapsed().as_secs() < 30 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(tmp_exists(), "no temporary output appeared");
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    // The handler is installed before the temporary file is created, and
    // the CPU path takes seconds on this case: the signal lands mid-run.
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(indexer_tests::io::INTERRUPTED),
        "{status}"
    );
    assert_eq!(
        dir.files(),
        ["big.safetensors", "in.safetensors"],
        "a temporary or partial file stayed"
    );
}
