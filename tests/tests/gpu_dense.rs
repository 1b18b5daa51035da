//! Dense mode's device plan (no GPU kernel yet): `execute` makes the
//! checks of the `execute` contract, returns `Error::NotImplemented` for a
//! well-formed call, and writes nothing either way.

use cudarc::driver::{CudaSlice, CudaStream};
use dsa_indexer_bwd::dense::{self, Inputs, Outputs, Plan};
use dsa_indexer_bwd::{bf16, Error, GradDtype, GradOut, Options};
use indexer_tests::gpu;
use std::sync::Arc;

/// Every buffer of a call, filled with 7.
struct Buffers {
    q: CudaSlice<bf16>,
    w: CudaSlice<bf16>,
    k: CudaSlice<bf16>,
    attn: CudaSlice<f32>,
    l1: CudaSlice<f32>,
    lse: CudaSlice<f32>,
    grad_loss: CudaSlice<f32>,
    score: CudaSlice<f32>,
    dq: CudaSlice<bf16>,
    dw: CudaSlice<bf16>,
    dw32: CudaSlice<f32>,
    dk: CudaSlice<bf16>,
    ws: CudaSlice<u8>,
}

impl Buffers {
    fn new(stream: &Arc<CudaStream>, s: &dense::Shape, ws: usize) -> Buffers {
        let b = |n: usize| stream.clone_htod(&vec![bf16::from_f32(7.0); n]).unwrap();
        let f = |n: usize| stream.clone_htod(&vec![7.0f32; n]).unwrap();
        Buffers {
            q: b(s.q_len()),
            w: b(s.w_len()),
            k: b(s.k_len()),
            attn: f(s.score_len()),
            l1: f(s.rows()),
            lse: f(s.rows()),
            grad_loss: f(1),
            score: f(s.score_len()),
            dq: b(s.q_len()),
            dw: b(s.w_len()),
            dw32: f(s.w_len()),
            dk: b(s.k_len()),
            ws: stream.clone_htod(&vec![7u8; ws]).unwrap(),
        }
    }

    /// Whether every output still holds 7.
    fn untouched(&self, stream: &Arc<CudaStream>) -> bool {
        let f = |v: &CudaSlice<f32>| stream.clone_dtoh(v).unwrap().iter().all(|&x| x == 7.0);
        let b = |v: &CudaSlice<bf16>| {
            let h = stream.clone_dtoh(v).unwrap();
            h.iter().all(|x| x.to_f32() == 7.0)
        };
        f(&self.score) && f(&self.dw32) && b(&self.dq) && b(&self.dw) && b(&self.dk)
    }
}

#[test]
fn dense_plan_checks_then_reports_that_no_kernel_exists() {
    let Some(ctx) = gpu("dense_plan_checks_then_reports_that_no_kernel_exists") else {
        return;
    };
    let stream = ctx.default_stream();
    let shape = dense::Shape::varlen(vec![0, 3, 8], vec![0, 70, 100], 16, 64)
        .with_q_offset(vec![60, 20])
        .with_ratio(2);
    let opts = Options {
        d_index_k: GradDtype::Bf16,
        ..Options::default()
    };
    let plan = Plan::new(&ctx, shape.clone(), opts).unwrap();
    assert_eq!(plan.workspace_bytes(), 100 * 64 * 4);
    let mut d = Buffers::new(&stream, &shape, plan.workspace_bytes());
    type Edit = fn(&mut Inputs<'_>, &mut Outputs<'_>, &mut f32);
    let cases: [(&str, Edit); 5] = [
        ("well formed", |_, _, _| {}),
        ("loss_coeff", |_, _, c| *c = f32::NAN),
        ("index_k", |i, _, _| i.index_k = i.index_k.slice(64..)),
        ("attn_l1norm", |i, _, _| {
            i.attn_l1norm = i.attn_l1norm.slice(1..)
        }),
        ("workspace", |_, o, _| o.workspace = None),
    ];
    for (name, edit) in cases {
        let mut inputs = Inputs {
            index_q: d.q.as_view(),
            weights: d.w.as_view(),
            index_k: d.k.as_view(),
            attn_score: d.attn.as_view(),
            attn_l1norm: d.l1.as_view(),
            index_lse: d.lse.as_view(),
            grad_loss: d.grad_loss.as_view(),
        };
        let mut outputs = Outputs {
            index_score: d.score.as_view_mut(),
            d_index_q: d.dq.as_view_mut(),
            d_weights: GradOut::Bf16(d.dw.as_view_mut()),
            d_index_k: GradOut::Bf16(d.dk.as_view_mut()),
            workspace: Some(d.ws.as_view_mut()),
        };
        let mut loss_coeff = 1.0;
        edit(&mut inputs, &mut outputs, &mut loss_coeff);
        let e = plan
            .execute(&stream, &inputs, &mut outputs, loss_coeff)
            .unwrap_err();
        println!("{name}: {e}");
        let ok = match name {
            "well formed" => matches!(e, Error::NotImplemented { .. }),
            "loss_coeff" => matches!(
                e,
                Error::NonFinite {
                    name: "loss_coeff",
                    ..
                }
            ),
            "workspace" => matches!(e, Error::Workspace { given: 0, .. }),
            t => matches!(e, Error::Length { tensor, .. } if tensor == t),
        };
        assert!(ok, "{name}: unexpected {e:?}");
    }
    // An f32 d_weights where the plan wants bf16.
    let inputs = Inputs {
        index_q: d.q.as_view(),
        weights: d.w.as_view(),
        index_k: d.k.as_view(),
        attn_score: d.attn.as_view(),
        attn_l1norm: d.l1.as_view(),
        index_lse: d.lse.as_view(),
        grad_loss: d.grad_loss.as_view(),
    };
    let mut outputs = Outputs {
        index_score: d.score.as_view_mut(),
        d_index_q: d.dq.as_view_mut(),
        d_weights: GradOut::F32(d.dw32.as_view_mut()),
        d_index_k: GradOut::Bf16(d.dk.as_view_mut()),
        workspace: Some(d.ws.as_view_mut()),
    };
    let e = plan
        .execute(&stream, &inputs, &mut outputs, 1.0)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Dtype {
                tensor: "d_weights",
                ..
            }
        ),
        "{e:?}"
    );
    stream.synchronize().unwrap();
    assert!(d.untouched(&stream), "a rejected call wrote an output");
    // A bad shape is refused when the plan is built.
    let bad = shape.with_ratio(0);
    assert!(matches!(
        Plan::new(&ctx, bad, opts),
        Err(Error::Shape { name: "ratio", .. })
    ));
}
