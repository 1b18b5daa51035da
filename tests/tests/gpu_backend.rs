//! Backend selection on the GPU present: on sm_90 the plan runs the
//! `mma.sync` row kernels and forcing the (sm_100a-only, not executed)
//! tcgen05 backend is a typed error from `Plan::new`.

use dsa_indexer_bwd::{Backend, Error, Options, Plan, Shape};
use indexer_tests::gpu;

#[test]
fn backend_follows_compute_capability_and_forcing_is_checked() {
    let Some(ctx) = gpu("backend_follows_compute_capability_and_forcing_is_checked") else {
        return;
    };
    let shape = Shape {
        batch: 1,
        seq_q: 8,
        seq_k: 256,
        heads: 64,
        head_dim: 128,
        topk: 128,
    };
    let (major, minor) = ctx.compute_capability().unwrap();
    let forced = |backend| {
        Plan::new(
            &ctx,
            shape,
            Options {
                backend,
                ..Options::default()
            },
        )
    };
    let auto = forced(Backend::Auto).expect("plan");
    let hopper = forced(Backend::Hopper).expect("plan");
    assert_eq!(hopper.backend(), Backend::Hopper);
    if major == 9 {
        assert_eq!(auto.backend(), Backend::Hopper);
        assert!(matches!(
            forced(Backend::Blackwell),
            Err(Error::BackendUnavailable { major: 9, .. })
        ));
    } else {
        println!(
            "compute capability {major}.{minor}: auto chose {:?}",
            auto.backend()
        );
    }
    // An unsupported shape can never be forced onto the tcgen05 kernels.
    let odd = Shape { topk: 100, ..shape };
    assert!(matches!(
        Plan::new(
            &ctx,
            odd,
            Options {
                backend: Backend::Blackwell,
                ..Options::default()
            }
        ),
        Err(Error::BackendUnavailable { .. })
    ));
}
