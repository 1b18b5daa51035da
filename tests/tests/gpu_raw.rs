//! `Plan::execute_raw` (raw addresses, a stream another library owns)
//! against `Plan::execute` on the same problem, and its checks.

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use dsa_indexer_bwd::{Error, GradDtype, KeyIds, Options, Plan, RawBuffers, ScoreKind, Shape};
use indexer_tests::{
    gpu, rel_err, same_bits, DeviceProblem, Gen, GpuOut, Padding, Problem, Values,
};
use rand::SeedableRng;
use std::sync::Arc;

fn addr<T>(stream: &Arc<CudaStream>, s: &CudaSlice<T>) -> u64 {
    let (p, _guard) = s.device_ptr(stream);
    p
}

/// The addresses of `d` for a plan of `opts`.
fn raw(stream: &Arc<CudaStream>, d: &DeviceProblem, opts: &Options, ws_bytes: usize) -> RawBuffers {
    RawBuffers {
        index_q: addr(stream, &d.q),
        weights: addr(stream, &d.w),
        index_k: addr(stream, &d.k),
        index_score: addr(stream, &d.score),
        topk_indices: addr(stream, &d.ids),
        grad_loss: addr(stream, &d.grad_loss),
        attn_score: addr(stream, &d.attn),
        d_index_q: addr(stream, &d.dq),
        d_weights: match opts.d_weights {
            GradDtype::F32 => addr(stream, &d.dw_f32),
            GradDtype::Bf16 => addr(stream, &d.dw_bf16),
        },
        d_index_k: match opts.d_index_k {
            GradDtype::F32 => addr(stream, &d.dk_f32),
            GradDtype::Bf16 => addr(stream, &d.dk_bf16),
        },
        workspace: if ws_bytes > 0 { addr(stream, &d.ws) } else { 0 },
        workspace_bytes: ws_bytes,
        d_weights_dtype: opts.d_weights,
        d_index_k_dtype: opts.d_index_k,
        topk_indices_i64: false,
    }
}

#[test]
fn execute_raw_matches_execute_on_a_foreign_stream() {
    let Some(ctx) = gpu("execute_raw_matches_execute_on_a_foreign_stream") else {
        return;
    };
    let shape = Shape {
        batch: 2,
        seq_q: 33,
        seq_k: 90,
        heads: 64,
        head_dim: 128,
        topk: 96,
    };
    let g = Gen {
        values: Values::Grid,
        padding: Padding::OutOfRange,
        short_rows: 0.3,
        trailing: false,
        duplicates: true,
        masked: 0.02,
    };
    for opts in [
        Options::default(),
        Options {
            key_ids: KeyIds::Local,
            score: ScoreKind::LogProbs,
            d_index_k: GradDtype::Bf16,
            d_weights: GradDtype::F32,
            sm_scale: 0.25,
            ..Options::default()
        },
    ] {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let p = Problem::random(&mut rng, shape, opts, g);
        let plan = Plan::new(&ctx, shape, opts).unwrap();
        let ws = plan.workspace_bytes();
        let stream = ctx.default_stream();
        let mut a = DeviceProblem::upload(&stream, &p, ws);
        a.execute(&plan, &stream, p.loss_coeff).unwrap();
        stream.synchronize().unwrap();
        let want = a.download(&stream, &opts);
        // Every output bitwise equal to `want`'s but d_index_k, which is
        // accumulated by atomics: its last bits may differ.
        let same_as_want = |got: &GpuOut| {
            assert!(same_bits(&got.grad_signal, &want.grad_signal), "{opts:?}");
            assert!(same_bits(&got.d_index_q, &want.d_index_q), "{opts:?}");
            assert_eq!(got.d_weights_bits, want.d_weights_bits, "{opts:?}");
            let e = rel_err(&got.d_index_k, &want.d_index_k);
            assert!(e < 1e-5, "{opts:?}: d_index_k differs by {e}");
        };

        // A stream cudarc does not own, as PyTorch's current stream is.
        let other = ctx.new_stream().unwrap();
        let b = DeviceProblem::upload(&other, &p, ws);
        other.synchronize().unwrap();
        let bufs = raw(&other, &b, &opts, ws);
        // SAFETY: `b` holds every buffer at the shape's length on `ctx`,
        // and `other` outlives the launches (synchronised below).
        unsafe { plan.execute_raw(other.cu_stream(), &bufs, p.loss_coeff) }.unwrap();
        other.synchronize().unwrap();
        same_as_want(&b.download(&other, &opts));

        // The entry for callers that know their buffers' device (the
        // Python extension's): the same outputs.
        let c = DeviceProblem::upload(&other, &p, ws);
        other.synchronize().unwrap();
        let bufs = raw(&other, &c, &opts, ws);
        // SAFETY: as above; every buffer of `c` and `other` are on `ctx`.
        unsafe { plan.execute_raw_on_plan_device(other.cu_stream(), &bufs, p.loss_coeff) }.unwrap();
        other.synchronize().unwrap();
        same_as_want(&c.download(&other, &opts));
    }
}

#[test]
fn execute_raw_rejects_host_addresses_types_and_a_missing_workspace() {
    let Some(ctx) = gpu("execute_raw_rejects_host_addresses_types_and_a_missing_workspace") else {
        return;
    };
    let shape = Shape {
        batch: 1,
        seq_q: 4,
        seq_k: 16,
        heads: 16,
        head_dim: 64,
        topk: 8,
    };
    let opts = Options {
        d_index_k: GradDtype::Bf16,
        ..Options::default()
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
    let p = Problem::random(&mut rng, shape, opts, g);
    let plan = Plan::new(&ctx, shape, opts).unwrap();
    let ws = plan.workspace_bytes();
    let stream = ctx.default_stream();
    let d = DeviceProblem::upload(&stream, &p, ws);
    stream.synchronize().unwrap();
    let good = raw(&stream, &d, &opts, ws);
    let host = vec![0u8; 1 << 16];
    let run = |b: &RawBuffers, coeff: f32| {
        // SAFETY: every call here fails a check before any launch.
        unsafe { plan.execute_raw(stream.cu_stream(), b, coeff) }
    };
    let mut b = good;
    b.index_k = (host.as_ptr() as u64).next_multiple_of(16);
    assert!(matches!(
        run(&b, 1.0),
        Err(Error::Device {
            tensor: "index_k",
            ..
        })
    ));
    let mut b = good;
    b.d_index_k_dtype = GradDtype::F32;
    assert!(matches!(
        run(&b, 1.0),
        Err(Error::Dtype {
            tensor: "d_index_k",
            ..
        })
    ));
    // The entry without the driver's residency queries checks the rest.
    // SAFETY: fails the element-type check before any launch.
    let r = unsafe { plan.execute_raw_on_plan_device(stream.cu_stream(), &b, 1.0) };
    assert!(matches!(
        r,
        Err(Error::Dtype {
            tensor: "d_index_k",
            ..
        })
    ));
    let mut b = good;
    b.workspace = 0;
    assert!(matches!(run(&b, 1.0), Err(Error::Workspace { .. })));
    assert!(matches!(run(&good, f32::NAN), Err(Error::NonFinite { .. })));
    let mut b = good;
    b.d_index_q = b.index_q;
    assert!(matches!(run(&b, 1.0), Err(Error::Overlap { .. })));
}
