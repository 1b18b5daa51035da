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

fn write_case(p: &Problem, path: &std::path::Path) {
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
    let gl = f(&[p.grad_loss]);
    let slots = vec![s.batch, s.seq_q, s.topk];
    let views = vec![
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
        (
            "grad_loss",
            TensorView::new(Dtype::F32, vec![1], &gl).unwrap(),
        ),
    ];
    safetensors::serialize_to_file(views, None, path).unwrap();
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
