//! `dense::Plan::execute_raw` (raw addresses, a stream another library
//! owns) against `dense::Plan::execute` on the same problem, and its
//! checks.

use dsa_indexer_bwd::dense::{self, Plan};
use dsa_indexer_bwd::{Error, GradDtype, Options};
use indexer_tests::dense::{DenseDevice, DenseProblem};
use indexer_tests::{gpu, rel_err, same_bits};
use rand::SeedableRng;

#[test]
fn dense_execute_raw_matches_execute_on_a_foreign_stream() {
    let Some(ctx) = gpu("dense_execute_raw_matches_execute_on_a_foreign_stream") else {
        return;
    };
    // Packed, an empty query batch, offsets (one negative), ratio 2.
    let shape = dense::Shape::varlen(vec![0, 40, 40, 100], vec![0, 90, 100, 180], 64, 128)
        .with_q_offset(vec![50, 0, -3])
        .with_ratio(2);
    let sm90 = ctx.compute_capability().unwrap() == (9, 0);
    for opts in [
        Options::default(),
        Options {
            d_index_k: GradDtype::Bf16,
            d_weights: GradDtype::F32,
            sm_scale: 0.25,
            ..Options::default()
        },
    ] {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let p = DenseProblem::random(&mut rng, shape.clone(), opts, 0.05);
        let plan = Plan::new(&ctx, shape.clone(), opts).unwrap();
        assert_eq!(plan.on_gpu(), sm90);
        let ws = plan.workspace_bytes();
        let stream = ctx.default_stream();
        let mut a = DenseDevice::upload(&stream, &p, ws);
        // A stream cudarc does not own, as PyTorch's current stream is.
        let other = ctx.new_stream().unwrap();
        let b = DenseDevice::upload(&other, &p, ws);
        other.synchronize().unwrap();
        let bufs = b.raw(&other, &opts, ws);
        let ra = a.execute(&plan, &stream, p.loss_coeff);
        // SAFETY: `b` holds every buffer at the shape's length on `ctx`,
        // and `other` outlives the launches (synchronised below).
        let rb = unsafe { plan.execute_raw(other.cu_stream(), &bufs, p.loss_coeff) };
        if !sm90 {
            assert!(matches!(ra, Err(Error::NotImplemented { .. })), "{ra:?}");
            assert!(matches!(rb, Err(Error::NotImplemented { .. })), "{rb:?}");
            continue;
        }
        ra.unwrap();
        rb.unwrap();
        stream.synchronize().unwrap();
        other.synchronize().unwrap();
        let want = a.download(&stream, &opts);
        let got = b.download(&other, &opts);
        assert!(same_bits(&got.grad_signal, &want.grad_signal), "{opts:?}");
        assert!(same_bits(&got.d_index_q, &want.d_index_q), "{opts:?}");
        assert_eq!(got.d_weights_bits, want.d_weights_bits, "{opts:?}");
        assert!(
            same_bits(&got.index_score_after, &p.attn),
            "attn_score written"
        );
        // d_index_k is accumulated by atomics: last bits may differ.
        let e = rel_err(&got.d_index_k, &want.d_index_k);
        assert!(e < 1e-5, "{opts:?}: d_index_k differs by {e}");
    }
}

#[test]
fn dense_execute_raw_checks_what_an_address_allows() {
    let Some(ctx) = gpu("dense_execute_raw_checks_what_an_address_allows") else {
        return;
    };
    // 16 key columns: every check runs, then NotImplemented (no GPU path).
    let shape = dense::Shape::bshd(1, 8, 16, 16, 64).with_q_offset(vec![4]);
    let opts = Options {
        d_index_k: GradDtype::Bf16,
        ..Options::default()
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let p = DenseProblem::random(&mut rng, shape.clone(), opts, 0.0);
    let plan = Plan::new(&ctx, shape, opts).unwrap();
    assert!(!plan.on_gpu());
    let ws = plan.workspace_bytes();
    let stream = ctx.default_stream();
    let d = DenseDevice::upload(&stream, &p, ws);
    stream.synchronize().unwrap();
    let good = d.raw(&stream, &opts, ws);
    let host = vec![0u8; 1 << 16];
    let run = |b: &dense::DenseRawBuffers, coeff: f32| {
        // SAFETY: no call here launches anything: each fails a check, or
        // passes them all and gets NotImplemented.
        unsafe { plan.execute_raw(stream.cu_stream(), b, coeff) }
    };
    let r = run(&good, 1.0);
    assert!(matches!(r, Err(Error::NotImplemented { .. })), "{r:?}");
    let r = run(&good, f32::NAN);
    assert!(
        matches!(
            r,
            Err(Error::NonFinite {
                name: "loss_coeff",
                ..
            })
        ),
        "{r:?}"
    );
    let mut b = good;
    b.attn_l1norm = (host.as_ptr() as u64).next_multiple_of(16);
    let r = run(&b, 1.0);
    assert!(
        matches!(
            r,
            Err(Error::Device {
                tensor: "attn_l1norm",
                ..
            })
        ),
        "{r:?}"
    );
    let mut b = good;
    b.d_index_k_dtype = GradDtype::F32;
    let r = run(&b, 1.0);
    assert!(
        matches!(
            r,
            Err(Error::Dtype {
                tensor: "d_index_k",
                ..
            })
        ),
        "{r:?}"
    );
    let mut b = good;
    b.workspace = 0;
    let r = run(&b, 1.0);
    assert!(matches!(r, Err(Error::Workspace { given: 0, .. })), "{r:?}");
    let mut b = good;
    b.index_score = b.attn_score;
    let r = run(&b, 1.0);
    assert!(
        matches!(
            r,
            Err(Error::Overlap {
                output: "index_score",
                other: "attn_score"
            })
        ),
        "{r:?}"
    );
}
