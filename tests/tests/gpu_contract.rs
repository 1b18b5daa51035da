//! The contract of `execute` on the GPU: rejected calls write nothing,
//! determinism, realistic shapes within tolerance, CUDA-graph replay with
//! a new `grad_loss`, and calls from a thread without a current context.

use cudarc::driver::{CudaSlice, CudaStream, CudaView};
use dsa_indexer_bwd::{
    bf16, Error, GradDtype, GradOut, Inputs, KeyIds, Options, Outputs, Plan, ScoreKind, Shape,
    TopkId,
};
use indexer_tests::{
    check_against_reference, gpu, run_gpu, same_bits, DeviceProblem, Gen, Padding, Problem, Values,
};
use rand::SeedableRng;
use std::sync::Arc;

fn gen(values: Values) -> Gen {
    Gen {
        values,
        padding: Padding::NegOne,
        short_rows: 0.3,
        trailing: false,
        duplicates: true,
        masked: 0.02,
    }
}

/// Every device buffer of a problem as raw bytes.
fn snapshot(stream: &Arc<CudaStream>, d: &DeviceProblem) -> Vec<Vec<u8>> {
    fn bytes<T: cudarc::driver::DeviceRepr + Default + Clone>(
        s: &Arc<CudaStream>,
        x: &CudaSlice<T>,
    ) -> Vec<u8> {
        let v = s.clone_dtoh(x).unwrap();
        // SAFETY: plain-old-data element types, reinterpreted as bytes.
        unsafe {
            std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v.as_slice()))
                .to_vec()
        }
    }
    vec![
        bytes(stream, &d.q),
        bytes(stream, &d.w),
        bytes(stream, &d.k),
        bytes(stream, &d.attn),
        bytes(stream, &d.score),
        bytes(stream, &d.ids),
        bytes(stream, &d.grad_loss),
        bytes(stream, &d.dq),
        bytes(stream, &d.dw_f32),
        bytes(stream, &d.dw_bf16),
        bytes(stream, &d.dk_f32),
        bytes(stream, &d.dk_bf16),
        bytes(stream, &d.ws),
    ]
}

#[test]
fn rejected_calls_leave_every_buffer_untouched() {
    let Some(ctx) = gpu("rejected_calls_leave_every_buffer_untouched") else {
        return;
    };
    let stream = ctx.default_stream();
    let shape = Shape {
        batch: 2,
        seq_q: 5,
        seq_k: 40,
        heads: 32,
        head_dim: 64,
        topk: 20,
    };
    let opts = Options {
        d_index_k: GradDtype::Bf16,
        ..Options::default()
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let p = Problem::random(&mut rng, shape, opts, gen(Values::Grid));
    let plan = Plan::new(&ctx, shape, opts).unwrap();
    let mut d = DeviceProblem::upload(&stream, &p, plan.workspace_bytes());
    let before = snapshot(&stream, &d);
    let mut q_long = stream.alloc_zeros::<bf16>(shape.q_len() + 8).unwrap();
    stream
        .memcpy_htod(&p.q, &mut q_long.slice_mut(1..shape.q_len() + 1))
        .unwrap();

    let check = |name: &str,
                 r: dsa_indexer_bwd::Result<()>,
                 ok: &dyn Fn(&Error) -> bool,
                 d: &DeviceProblem| {
        let e = r.expect_err(name);
        assert!(ok(&e), "{name}: unexpected error {e}");
        println!("{name}: rejected with: {e}");
        stream.synchronize().unwrap();
        assert!(snapshot(&stream, d) == before, "{name}: a buffer changed");
    };

    check(
        "non-finite loss_coeff",
        d.execute(&plan, &stream, f32::NAN),
        &|e| {
            matches!(
                e,
                Error::NonFinite {
                    name: "loss_coeff",
                    ..
                }
            )
        },
        &d,
    );
    fn run_with<'a>(
        plan: &Plan,
        stream: &Arc<CudaStream>,
        d: &'a mut DeviceProblem,
        edit: impl FnOnce(&mut Inputs<'a>, &mut Outputs<'a>),
    ) -> dsa_indexer_bwd::Result<()> {
        let DeviceProblem {
            q,
            w,
            k,
            attn,
            score,
            ids,
            grad_loss,
            dq,
            dw_bf16,
            dk_bf16,
            ws,
            ..
        } = d;
        let mut inputs = Inputs {
            index_q: q.as_view(),
            weights: w.as_view(),
            index_k: k.as_view(),
            index_score: score.as_view(),
            topk_indices: ids.as_view(),
            grad_loss: grad_loss.as_view(),
        };
        let mut outputs = Outputs {
            attn_score: attn.as_view_mut(),
            d_index_q: dq.as_view_mut(),
            d_weights: GradOut::Bf16(dw_bf16.as_view_mut()),
            d_index_k: GradOut::Bf16(dk_bf16.as_view_mut()),
            workspace: Some(ws.as_view_mut()),
        };
        edit(&mut inputs, &mut outputs);
        plan.execute(stream, &inputs, &mut outputs, 1.0)
    }
    let r = run_with(&plan, &stream, &mut d, |i, _| {
        i.index_q = i.index_q.slice(1..)
    });
    check(
        "short index_q",
        r,
        &|e| {
            matches!(
                e,
                Error::Length {
                    tensor: "index_q",
                    ..
                }
            )
        },
        &d,
    );
    let r = run_with(&plan, &stream, &mut d, |i, _| {
        i.topk_indices = i.topk_indices.slice(..shape.slots() - 1)
    });
    check(
        "short topk_indices",
        r,
        &|e| {
            matches!(
                e,
                Error::Length {
                    tensor: "topk_indices",
                    ..
                }
            )
        },
        &d,
    );
    let r = run_with(&plan, &stream, &mut d, |i, _| {
        i.grad_loss = i.grad_loss.slice(0..0)
    });
    check(
        "empty grad_loss",
        r,
        &|e| {
            matches!(
                e,
                Error::Length {
                    tensor: "grad_loss",
                    ..
                }
            )
        },
        &d,
    );
    let r = run_with(&plan, &stream, &mut d, |_, o| o.workspace = None);
    check(
        "missing workspace",
        r,
        &|e| matches!(e, Error::Workspace { .. }),
        &d,
    );
    let r = run_with(&plan, &stream, &mut d, |i, _| {
        i.index_q = q_long.slice(1..shape.q_len() + 1)
    });
    check(
        "misaligned index_q",
        r,
        &|e| {
            matches!(
                e,
                Error::Alignment {
                    tensor: "index_q",
                    ..
                }
            )
        },
        &d,
    );
    // d_weights given as f32 to a plan that writes bf16.
    let mut dw32 = stream.alloc_zeros::<f32>(shape.w_len()).unwrap();
    let dw32_view = dw32.as_view_mut();
    let r = run_with(&plan, &stream, &mut d, move |_, o| {
        o.d_weights = GradOut::F32(dw32_view)
    });
    check(
        "d_weights dtype",
        r,
        &|e| {
            matches!(
                e,
                Error::Dtype {
                    tensor: "d_weights",
                    ..
                }
            )
        },
        &d,
    );
    // attn_score aliasing index_score (same device memory).
    let (sp, guard) = {
        use cudarc::driver::DevicePtr;
        d.score.device_ptr(&stream)
    };
    drop(guard);
    // SAFETY: the alias covers exactly the index_score allocation and is
    // leaked below, so it is never freed twice.
    let mut alias: CudaSlice<f32> = unsafe { stream.upgrade_device_ptr(sp, shape.slots()) };
    let alias_view = alias.as_view_mut();
    let r = run_with(&plan, &stream, &mut d, move |_, o| {
        o.attn_score = alias_view
    });
    alias.leak();
    check(
        "attn_score overlaps index_score",
        r,
        &|e| {
            matches!(
                e,
                Error::Overlap {
                    output: "attn_score",
                    other: "index_score"
                }
            )
        },
        &d,
    );
    // And the same buffers then work.
    d.execute(&plan, &stream, p.loss_coeff).unwrap();
    let out = d.download(&stream, &opts);
    check_against_reference(&p, &out);
}

/// Realistic shapes with continuous values, uniform and ragged ids, and
/// bitwise-stable d_index_q / d_weights across runs and between i32 and
/// i64 ids. D = 128 and D = 64 (on Hopper the D = 64 wgmma row kernel,
/// asserted from the plan's kernels; with local ids and bf16 dK in two
/// of its cases), and H = 128, 32 and 16 at D = 128 and 64 (on Hopper
/// their own wgmma kernels, likewise asserted; topk 512 and 2048).
#[test]
fn realistic_shapes_are_accurate_and_deterministic() {
    let Some(ctx) = gpu("realistic_shapes_are_accurate_and_deterministic") else {
        return;
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let local_bf16 = Options {
        key_ids: dsa_indexer_bwd::KeyIds::Local,
        d_index_k: dsa_indexer_bwd::GradDtype::Bf16,
        ..Options::default()
    };
    let cases = [
        (64usize, 128usize, 512usize, false, Options::default()),
        (64, 128, 512, true, Options::default()),
        (64, 128, 128, false, Options::default()),
        (64, 128, 1024, true, Options::default()),
        (64, 64, 512, false, Options::default()),
        (64, 64, 512, true, local_bf16),
        (64, 64, 2048, false, local_bf16),
        (64, 64, 2048, true, Options::default()),
        (32, 128, 512, false, Options::default()),
        (32, 128, 2048, true, local_bf16),
        (16, 128, 512, true, Options::default()),
        (16, 128, 2048, false, local_bf16),
        (128, 128, 512, false, Options::default()),
        (128, 128, 2048, true, local_bf16),
        (128, 64, 512, true, Options::default()),
        (32, 64, 2048, false, local_bf16),
        (16, 64, 512, true, Options::default()),
    ];
    let (major, _) = ctx.compute_capability().unwrap();
    for (heads, head_dim, topk, ragged, opts) in cases {
        let shape = Shape {
            batch: 1,
            seq_q: 192,
            seq_k: 2048,
            heads,
            head_dim,
            topk,
        };
        let wgmma = match (heads, head_dim) {
            (64, 64) => Some(kernels_gpu::registry::SM90_WG_D64.name),
            (128, 128) => Some(kernels_gpu::registry::SM90_WG_H128.name),
            (128, 64) => Some(kernels_gpu::registry::SM90_WG_H128_D64.name),
            (32, 64) => Some(kernels_gpu::registry::SM90_WG_H32_D64.name),
            (16, 64) => Some(kernels_gpu::registry::SM90_WG_H16_D64.name),
            (32, 128) => Some(kernels_gpu::registry::SM90_WG_H32.name),
            (16, 128) => Some(kernels_gpu::registry::SM90_WG_H16.name),
            _ => None,
        };
        if let (Some(kernel), 9) = (wgmma, major) {
            let plan = dsa_indexer_bwd::Plan::new(&ctx, shape, opts).unwrap();
            assert!(plan.kernels().contains(&kernel), "{:?}", plan.kernels());
        }
        let g = Gen {
            values: Values::Continuous,
            padding: Padding::NegOne,
            short_rows: 0.0,
            trailing: false,
            duplicates: false,
            masked: 0.0,
        };
        let mut p = Problem::random(&mut rng, shape, opts, g);
        if ragged {
            p.make_ragged(&mut rng);
        }
        let a = run_gpu(&ctx, &p);
        let e = check_against_reference(&p, &a);
        println!("H {heads} D {head_dim} topk {topk} ragged {ragged}: {e:?}");
        let b = run_gpu(&ctx, &p);
        assert!(
            same_bits(&a.d_index_q, &b.d_index_q),
            "d_index_q not bitwise stable"
        );
        assert_eq!(
            a.d_weights_bits, b.d_weights_bits,
            "d_weights not bitwise stable"
        );
        assert!(same_bits(&a.grad_signal, &b.grad_signal));
        // The same ids as i64 (padding as wide values): the same bits.
        p.widen_ids(&mut rng);
        let c = run_gpu(&ctx, &p);
        println!("i64 ids: {:?}", check_against_reference(&p, &c));
        assert!(
            same_bits(&a.d_index_q, &c.d_index_q),
            "d_index_q differs with i64 ids"
        );
        assert_eq!(
            a.d_weights_bits, c.d_weights_bits,
            "d_weights differs with i64 ids"
        );
        assert!(same_bits(&a.grad_signal, &c.grad_signal));
    }
}

/// A graph captured around `execute` replays with a new `grad_loss` value
/// (read on the device) and gives the new answer.
#[test]
fn cuda_graph_replay_picks_up_new_grad_loss() {
    let Some(ctx) = gpu("cuda_graph_replay_picks_up_new_grad_loss") else {
        return;
    };
    let stream = ctx.new_stream().unwrap();
    // Capture must not wait on events recorded outside it.
    // SAFETY: this test uses one stream, so no cross-stream ordering is lost.
    unsafe { ctx.disable_event_tracking() };
    let shape = Shape {
        batch: 2,
        seq_q: 16,
        seq_k: 96,
        heads: 64,
        head_dim: 128,
        topk: 72,
    };
    let opts = Options {
        key_ids: KeyIds::Local,
        score: ScoreKind::LogProbs,
        d_index_k: GradDtype::Bf16,
        ..Options::default()
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut p = Problem::random(&mut rng, shape, opts, gen(Values::Grid));
    let plan = Plan::new(&ctx, shape, opts).unwrap();
    let mut d = DeviceProblem::upload(&stream, &p, plan.workspace_bytes());
    d.execute(&plan, &stream, p.loss_coeff).unwrap(); // warm-up outside capture
    stream.synchronize().unwrap();

    let graph = d.capture(&plan, &stream, p.loss_coeff).expect("graph");

    for new_loss in [3.0f32, -0.5] {
        p.grad_loss = new_loss;
        d.reset_targets(&stream, &p);
        stream.memcpy_htod(&[new_loss], &mut d.grad_loss).unwrap();
        graph.launch().unwrap();
        stream.synchronize().unwrap();
        let out = d.download(&stream, &opts);
        let e = check_against_reference(&p, &out);
        println!("graph replay with grad_loss {new_loss}: {e:?}");
    }
}

/// `execute` from a thread where no context is current (a thread the
/// caller never bound the plan's context to) runs and is correct, and
/// leaves that thread as it found it: no context current afterwards.
#[test]
fn execute_runs_from_a_thread_without_a_current_context() {
    let Some(ctx) = gpu("execute_runs_from_a_thread_without_a_current_context") else {
        return;
    };
    let stream = ctx.default_stream();
    let shape = Shape {
        batch: 1,
        seq_q: 24,
        seq_k: 200,
        heads: 64,
        head_dim: 128,
        topk: 130,
    };
    let opts = Options::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let p = Problem::random(&mut rng, shape, opts, gen(Values::Grid));
    let plan = Plan::new(&ctx, shape, opts).unwrap();
    let mut d = DeviceProblem::upload(&stream, &p, plan.workspace_bytes());
    stream.synchronize().unwrap();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            // SAFETY: unbinding (null) is always allowed.
            unsafe { cudarc::driver::result::ctx::set_current(std::ptr::null_mut()) }.unwrap();
            d.execute(&plan, &stream, p.loss_coeff).unwrap();
            let now = cudarc::driver::result::ctx::get_current().unwrap();
            assert!(
                now.is_none_or(|c| c.is_null()),
                "execute left a context current"
            );
        });
    });
    stream.synchronize().unwrap();
    let e = check_against_reference(&p, &d.download(&stream, &opts));
    println!("from a fresh thread: {e:?}");
}

/// Runs `plan.execute` on `stream` with `d`'s buffers (typed by the plan's
/// options) and `ids` (i32 or i64) as `topk_indices`.
fn run_with_ids<'a, I: TopkId>(
    plan: &Plan,
    stream: &CudaStream,
    d: &'a mut DeviceProblem,
    ids: CudaView<'a, I>,
) -> dsa_indexer_bwd::Result<()> {
    let opts = *plan.options();
    let inputs = Inputs {
        index_q: d.q.as_view(),
        weights: d.w.as_view(),
        index_k: d.k.as_view(),
        index_score: d.score.as_view(),
        topk_indices: ids,
        grad_loss: d.grad_loss.as_view(),
    };
    let mut outputs = Outputs {
        attn_score: d.attn.as_view_mut(),
        d_index_q: d.dq.as_view_mut(),
        d_weights: match opts.d_weights {
            GradDtype::F32 => GradOut::F32(d.dw_f32.as_view_mut()),
            GradDtype::Bf16 => GradOut::Bf16(d.dw_bf16.as_view_mut()),
        },
        d_index_k: match opts.d_index_k {
            GradDtype::F32 => GradOut::F32(d.dk_f32.as_view_mut()),
            GradDtype::Bf16 => GradOut::Bf16(d.dk_bf16.as_view_mut()),
        },
        workspace: Some(d.ws.as_view_mut()),
    };
    plan.execute(stream, &inputs, &mut outputs, 1.0)
}

/// Runs `plan.execute` on `exec_stream` with `d`'s buffers (typed by the
/// plan's options) after `edit` changes any argument.
fn run_edited<'a>(
    plan: &Plan,
    exec_stream: &CudaStream,
    d: &'a mut DeviceProblem,
    edit: impl FnOnce(&mut Inputs<'a>, &mut Outputs<'a>),
) -> dsa_indexer_bwd::Result<()> {
    let opts = *plan.options();
    let DeviceProblem {
        q,
        w,
        k,
        attn,
        score,
        ids,
        grad_loss,
        dq,
        dw_f32,
        dw_bf16,
        dk_f32,
        dk_bf16,
        ws,
        ..
    } = d;
    let mut inputs = Inputs {
        index_q: q.as_view(),
        weights: w.as_view(),
        index_k: k.as_view(),
        index_score: score.as_view(),
        topk_indices: ids.as_view(),
        grad_loss: grad_loss.as_view(),
    };
    let mut outputs = Outputs {
        attn_score: attn.as_view_mut(),
        d_index_q: dq.as_view_mut(),
        d_weights: match opts.d_weights {
            GradDtype::F32 => GradOut::F32(dw_f32.as_view_mut()),
            GradDtype::Bf16 => GradOut::Bf16(dw_bf16.as_view_mut()),
        },
        d_index_k: match opts.d_index_k {
            GradDtype::F32 => GradOut::F32(dk_f32.as_view_mut()),
            GradDtype::Bf16 => GradOut::Bf16(dk_bf16.as_view_mut()),
        },
        workspace: Some(ws.as_view_mut()),
    };
    edit(&mut inputs, &mut outputs);
    plan.execute(exec_stream, &inputs, &mut outputs, 1.0)
}

/// The rejection kinds the first test leaves out, each a typed error that
/// leaves every buffer (the problem's and the substitutes') bitwise
/// unchanged: a stream and a buffer of another CUDA context, an output
/// overlapping another output, misaligned `index_k`, f32 `d_index_k`,
/// workspace and i64 `topk_indices`, short i64 `topk_indices`, short outputs and a short workspace, and a `d_index_k` of
/// the wrong element type.
#[test]
fn every_other_rejection_kind_leaves_every_buffer_untouched() {
    let Some(ctx) = gpu("every_other_rejection_kind_leaves_every_buffer_untouched") else {
        return;
    };
    // Another context on the same GPU (not the primary one), for the
    // foreign stream and buffer. Creating it makes it current on this
    // thread; every cudarc call below binds the context it uses.
    let other = cudarc::driver::CudaContext::new_non_primary(0, 0).expect("second context");
    let ostream = other.default_stream();
    let stream = ctx.default_stream();
    let shape = Shape {
        batch: 2,
        seq_q: 5,
        seq_k: 40,
        heads: 32,
        head_dim: 64,
        topk: 20,
    };
    let bf_opts = Options {
        d_index_k: GradDtype::Bf16,
        ..Options::default()
    };
    let f32_opts = Options::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    let p = Problem::random(&mut rng, shape, bf_opts, gen(Values::Grid));
    let plan = Plan::new(&ctx, shape, bf_opts).unwrap();
    let plan32 = Plan::new(&ctx, shape, f32_opts).unwrap();
    assert_eq!(plan32.workspace_bytes(), 0);
    let ws_bytes = plan.workspace_bytes();
    let mut d = DeviceProblem::upload(&stream, &p, ws_bytes);
    let before = snapshot(&stream, &d);

    // Substitute buffers, poisoned so any write shows.
    let nan_f = |n: usize| vec![f32::NAN; n];
    let nan_b = |n: usize| vec![bf16::NAN; n];
    let k_other = ostream.clone_htod(&p.k).unwrap();
    let mut k_long = stream.alloc_zeros::<bf16>(shape.k_len() + 8).unwrap();
    stream
        .memcpy_htod(&p.k, &mut k_long.slice_mut(1..shape.k_len() + 1))
        .unwrap();
    let mut ws_long = stream.clone_htod(&vec![0xa5u8; ws_bytes + 32]).unwrap();
    let mut dk32_long = stream.clone_htod(&nan_f(shape.k_len() + 4)).unwrap();
    let mut attn_short = stream.clone_htod(&nan_f(shape.slots() - 1)).unwrap();
    let mut dq_short = stream.clone_htod(&nan_b(shape.q_len() - 2)).unwrap();
    let mut dw_short = stream.clone_htod(&nan_b(shape.w_len() - 1)).unwrap();
    let mut dk_short = stream.clone_htod(&nan_b(shape.k_len() - 1)).unwrap();
    let mut ws_short = stream.clone_htod(&vec![0xa5u8; ws_bytes - 16]).unwrap();
    let mut dk32 = stream.clone_htod(&nan_f(shape.k_len())).unwrap();

    let check = |name: &str,
                 r: dsa_indexer_bwd::Result<()>,
                 ok: &dyn Fn(&Error) -> bool,
                 d: &DeviceProblem| {
        let e = r.expect_err(name);
        assert!(ok(&e), "{name}: unexpected error {e}");
        println!("{name}: rejected with: {e}");
        stream.synchronize().unwrap();
        assert!(snapshot(&stream, d) == before, "{name}: a buffer changed");
    };

    let r = run_edited(&plan, &ostream, &mut d, |_, _| {});
    check(
        "stream of another context",
        r,
        &|e| {
            matches!(
                e,
                Error::Device {
                    tensor: "stream",
                    ..
                }
            )
        },
        &d,
    );
    let r = run_edited(&plan, &stream, &mut d, |i, _| i.index_k = k_other.as_view());
    check(
        "index_k of another context",
        r,
        &|e| {
            matches!(
                e,
                Error::Device {
                    tensor: "index_k",
                    ..
                }
            )
        },
        &d,
    );
    // d_weights aliasing the start of d_index_q (same device memory).
    let (qp, guard) = {
        use cudarc::driver::DevicePtr;
        d.dq.device_ptr(&stream)
    };
    drop(guard);
    // SAFETY: the alias lies inside the d_index_q allocation and is leaked
    // below, so it is never freed twice.
    let mut alias: CudaSlice<bf16> = unsafe { stream.upgrade_device_ptr(qp, shape.w_len()) };
    let alias_view = alias.as_view_mut();
    let r = run_edited(&plan, &stream, &mut d, move |_, o| {
        o.d_weights = GradOut::Bf16(alias_view)
    });
    alias.leak();
    check(
        "d_weights overlaps d_index_q",
        r,
        &|e| {
            matches!(
                e,
                Error::Overlap {
                    output: "d_index_q",
                    other: "d_weights"
                } | Error::Overlap {
                    output: "d_weights",
                    other: "d_index_q"
                }
            )
        },
        &d,
    );
    // i64 ids 4 bytes off their 8-byte alignment (fine for i32 ids), and
    // one i64 id short.
    let ids_words = stream
        .clone_htod(&vec![0x5a5a_5a5ai32; 2 * shape.slots() + 2])
        .unwrap();
    let ids_from_word_1 = ids_words.slice(1..);
    // SAFETY: the view covers 2 * slots + 1 i32 words, more than `slots`
    // i64 ids; plain data either way (the check rejects it before use).
    let ids64_misaligned = unsafe { ids_from_word_1.transmute::<i64>(shape.slots()) }.unwrap();
    let r = run_with_ids(&plan, &stream, &mut d, ids64_misaligned);
    check(
        "misaligned i64 topk_indices",
        r,
        &|e| {
            matches!(
                e,
                Error::Alignment {
                    tensor: "topk_indices",
                    align: 8,
                    ..
                }
            )
        },
        &d,
    );
    let ids64_short = stream.clone_htod(&vec![0i64; shape.slots() - 1]).unwrap();
    let r = run_with_ids(&plan, &stream, &mut d, ids64_short.as_view());
    check(
        "short i64 topk_indices",
        r,
        &|e| {
            matches!(
                e,
                Error::Length {
                    tensor: "topk_indices",
                    expected,
                    actual,
                } if *expected == shape.slots() && *actual == shape.slots() - 1
            )
        },
        &d,
    );
    let r = run_edited(&plan, &stream, &mut d, |i, _| {
        i.index_k = k_long.slice(1..shape.k_len() + 1)
    });
    check(
        "misaligned index_k",
        r,
        &|e| {
            matches!(
                e,
                Error::Alignment {
                    tensor: "index_k",
                    align: 16,
                    ..
                }
            )
        },
        &d,
    );
    let v = ws_long.slice_mut(1..1 + ws_bytes);
    let r = run_edited(&plan, &stream, &mut d, move |_, o| o.workspace = Some(v));
    check(
        "misaligned workspace",
        r,
        &|e| {
            matches!(
                e,
                Error::Alignment {
                    tensor: "workspace",
                    ..
                }
            )
        },
        &d,
    );
    let v = dk32_long.slice_mut(1..shape.k_len() + 1);
    let r = run_edited(&plan32, &stream, &mut d, move |_, o| {
        o.d_index_k = GradOut::F32(v)
    });
    check(
        "misaligned f32 d_index_k",
        r,
        &|e| {
            matches!(
                e,
                Error::Alignment {
                    tensor: "d_index_k",
                    align: 16,
                    ..
                }
            )
        },
        &d,
    );
    let v = attn_short.as_view_mut();
    let r = run_edited(&plan, &stream, &mut d, move |_, o| o.attn_score = v);
    check(
        "short attn_score",
        r,
        &|e| {
            matches!(
                e,
                Error::Length {
                    tensor: "attn_score",
                    ..
                }
            )
        },
        &d,
    );
    let v = dq_short.as_view_mut();
    let r = run_edited(&plan, &stream, &mut d, move |_, o| o.d_index_q = v);
    check(
        "short d_index_q",
        r,
        &|e| {
            matches!(
                e,
                Error::Length {
                    tensor: "d_index_q",
                    ..
                }
            )
        },
        &d,
    );
    let v = dw_short.as_view_mut();
    let r = run_edited(&plan, &stream, &mut d, move |_, o| {
        o.d_weights = GradOut::Bf16(v)
    });
    check(
        "short d_weights",
        r,
        &|e| {
            matches!(
                e,
                Error::Length {
                    tensor: "d_weights",
                    ..
                }
            )
        },
        &d,
    );
    let v = dk_short.as_view_mut();
    let r = run_edited(&plan, &stream, &mut d, move |_, o| {
        o.d_index_k = GradOut::Bf16(v)
    });
    check(
        "short d_index_k",
        r,
        &|e| {
            matches!(
                e,
                Error::Length {
                    tensor: "d_index_k",
                    ..
                }
            )
        },
        &d,
    );
    let v = ws_short.as_view_mut();
    let r = run_edited(&plan, &stream, &mut d, move |_, o| o.workspace = Some(v));
    check(
        "short workspace",
        r,
        &|e| matches!(e, Error::Workspace { given, .. } if *given == ws_bytes - 16),
        &d,
    );
    let v = dk32.as_view_mut();
    let r = run_edited(&plan, &stream, &mut d, move |_, o| {
        o.d_index_k = GradOut::F32(v)
    });
    check(
        "d_index_k dtype",
        r,
        &|e| {
            matches!(
                e,
                Error::Dtype {
                    tensor: "d_index_k",
                    expected: "bf16",
                    actual: "f32"
                }
            )
        },
        &d,
    );

    // The substitutes are untouched too.
    let same_f = |x: &CudaSlice<f32>, n| same_bits(&stream.clone_dtoh(x).unwrap(), &nan_f(n));
    let same_b = |x: &CudaSlice<bf16>, n| same_bits(&stream.clone_dtoh(x).unwrap(), &nan_b(n));
    assert!(same_f(&attn_short, shape.slots() - 1));
    assert!(same_f(&dk32_long, shape.k_len() + 4));
    assert!(same_f(&dk32, shape.k_len()));
    assert!(same_b(&dq_short, shape.q_len() - 2));
    assert!(same_b(&dw_short, shape.w_len() - 1));
    assert!(same_b(&dk_short, shape.k_len() - 1));
    for (name, buf, n) in [
        ("ws_long", &ws_long, ws_bytes + 32),
        ("ws_short", &ws_short, ws_bytes - 16),
    ] {
        assert_eq!(stream.clone_dtoh(buf).unwrap(), vec![0xa5u8; n], "{name}");
    }
    assert_eq!(ostream.clone_dtoh(&k_other).unwrap(), p.k);

    // And the same buffers then work (kernels launch in the current
    // context: bind the plan's again after the foreign one).
    ctx.bind_to_thread().unwrap();
    d.execute(&plan, &stream, p.loss_coeff).unwrap();
    let out = d.download(&stream, &bf_opts);
    check_against_reference(&p, &out);
}
