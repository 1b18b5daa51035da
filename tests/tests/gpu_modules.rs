//! The kernel module on the GPU: loaded from the machine code shipped for
//! the GPU (no JIT), once per context, shared by sparse and dense plans,
//! unloaded with the last plan that holds it and loaded again by the next,
//! and still computing what the CPU reference computes after a reload.
//!
//! One test function in its own binary: it counts the modules the process
//! holds, which tests running beside it in one process would disturb.

use dsa_indexer_bwd::gpu::{PtxModule, PTX_DIR_ENV};
use dsa_indexer_bwd::{dense, loaded_modules, ModuleImage, Options, Plan, Shape};
use indexer_tests::{check_against_reference, gpu, run_gpu, Gen, Padding, Problem, Values};
use rand::SeedableRng;

/// A small sparse shape with `seq_q` rows (the wgmma path on an H200 once
/// topk > 64).
fn shape(seq_q: usize, topk: usize) -> Shape {
    Shape {
        batch: 1,
        seq_q,
        seq_k: 256,
        heads: 64,
        head_dim: 128,
        topk,
    }
}

#[test]
fn one_module_per_context_from_machine_code() {
    let Some(ctx) = gpu("one_module_per_context_from_machine_code") else {
        return;
    };
    let (major, minor) = ctx.compute_capability().unwrap();
    let which = PtxModule::for_capability(major, minor).unwrap();
    let want = match (std::env::var_os(PTX_DIR_ENV), which.sass(major, minor)) {
        (None, Some((target, _))) => ModuleImage::Sass { target },
        _ => ModuleImage::Ptx {
            target: which.target(),
        },
    };
    if (major, minor) == (9, 0) && std::env::var_os(PTX_DIR_ENV).is_none() {
        assert_eq!(want, ModuleImage::Sass { target: "sm_90a" });
    }
    assert_eq!(loaded_modules(), 0, "no plan yet");

    let opts = Options::default();
    let first = Plan::new(&ctx, shape(64, 128), opts).unwrap();
    assert_eq!(first.module_image(), want);
    assert_eq!(loaded_modules(), 1);
    // Later plans of other shapes, a dense plan, and a plan through a
    // second handle of the same (primary) context share the module.
    let mut plans: Vec<Plan> = (1..=8)
        .map(|i| Plan::new(&ctx, shape(64 + 8 * i, 64 * i), opts).unwrap())
        .collect();
    let same_ctx = cudarc::driver::CudaContext::new(0).unwrap();
    plans.push(Plan::new(&same_ctx, shape(32, 256), opts).unwrap());
    let dense_plan =
        dense::Plan::new(&ctx, dense::Shape::bshd(1, 128, 128, 64, 128), opts).unwrap();
    if dense_plan.on_gpu() {
        assert_eq!(dense_plan.module_image(), Some(want));
    }
    assert_eq!(
        loaded_modules(),
        1,
        "one module for every plan on the context"
    );
    for p in &plans {
        assert_eq!(p.module_image(), want);
    }

    // The module lives while any plan holds it ...
    drop(plans);
    drop(dense_plan);
    assert_eq!(loaded_modules(), 1, "the first plan still holds it");
    drop(first);
    // ... and goes with the last one; the next plan loads it again.
    assert_eq!(loaded_modules(), 0, "unloaded with its last plan");

    let mut rng = rand::rngs::StdRng::seed_from_u64(37);
    let g = Gen {
        values: Values::Grid,
        padding: Padding::NegOne,
        short_rows: 0.3,
        trailing: false,
        duplicates: true,
        masked: 0.02,
    };
    for topk in [48, 512] {
        let p = Problem::random(&mut rng, shape(96, topk), opts, g);
        let out = run_gpu(&ctx, &p);
        let e = check_against_reference(&p, &out);
        println!("after a reload, topk {topk}: {e:?}");
    }
    assert_eq!(loaded_modules(), 0, "run_gpu's plans are gone");

    // A module the driver cannot load names the GPU, its compute
    // capability and what was tried (PTX it rejects, through the override;
    // this test is alone in its process, so the variable reaches no other).
    let dir = std::env::temp_dir().join(format!("indexer-bad-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("kernels_{}.ptx", which.target()));
    std::fs::write(&path, ".version 8.1\n.target sm_90a\nnot ptx at all\n").unwrap();
    let old = std::env::var_os(PTX_DIR_ENV);
    std::env::set_var(PTX_DIR_ENV, &dir);
    let err = Plan::new(&ctx, shape(64, 128), opts).err();
    match old {
        Some(v) => std::env::set_var(PTX_DIR_ENV, v),
        None => std::env::remove_var(PTX_DIR_ENV),
    }
    let _ = std::fs::remove_dir_all(&dir);
    let err = err.expect("a plan over PTX the driver rejects");
    let msg = err.to_string();
    println!("rejected module: {msg}");
    assert!(
        matches!(err, dsa_indexer_bwd::Error::ModuleLoad { major: m, minor: n, .. } if (m, n) == (major, minor)),
        "{msg}"
    );
    assert!(msg.contains(&ctx.name().unwrap()), "{msg}");
    assert!(msg.contains(&format!("{major}.{minor}")), "{msg}");
    assert!(msg.contains(which.target()), "{msg}");
    assert_eq!(loaded_modules(), 0);
}
