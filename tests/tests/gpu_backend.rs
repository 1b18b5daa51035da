//! Backend selection on the GPU present: the plan takes the module and the
//! backend `select` gives for its compute capability; `Auto` keeps the
//! tested kernels wherever the tcgen05 path has no recorded hardware
//! validation, and forcing the tcgen05 backend where it cannot run is a
//! typed error from `Plan::new`.

use dsa_indexer_bwd::{select, Backend, Error, Options, Plan, Shape, TCGEN05_VALIDATED};
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
    let sel = select(major, minor, &shape, Backend::Auto).unwrap();
    println!(
        "compute capability {major}.{minor}: module {}, auto chose {:?}",
        sel.module.target(),
        auto.backend()
    );
    assert_eq!(auto.backend(), sel.backend);
    if !TCGEN05_VALIDATED.contains(&(major, minor)) {
        assert_eq!(auto.backend(), Backend::Hopper);
    }
    match select(major, minor, &shape, Backend::Blackwell) {
        Ok(_) => assert_eq!(
            forced(Backend::Blackwell).expect("plan").backend(),
            Backend::Blackwell
        ),
        Err(_) => assert!(matches!(
            forced(Backend::Blackwell),
            Err(Error::BackendUnavailable { .. })
        )),
    }
    if major == 9 {
        assert!(matches!(
            forced(Backend::Blackwell),
            Err(Error::BackendUnavailable { major: 9, .. })
        ));
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
