//! The end-to-end proof of the toolchain: a Rust kernel with dynamic
//! shared memory, an mbarrier and inline PTX, launched through cudarc and
//! checked against the CPU; and the Blackwell bring-up checks' contract.

use dsa_indexer_bwd::gpu;
use indexer_tests::gpu as test_gpu;
use kernels_gpu::abi::{SmokeParams, SMOKE_SMEM_BYTES, SMOKE_THREADS};
use kernels_gpu::registry::SMOKE;
use rand::Rng;

#[test]
fn smoke_kernel_matches_cpu() {
    let Some(ctx) = test_gpu("smoke_kernel_matches_cpu") else {
        return;
    };
    let stream = ctx.default_stream();
    let module = dsa_indexer_bwd::lab::load_module(&ctx).unwrap();
    let f = module.load_function(SMOKE.name).unwrap();
    let blocks = 37u32;
    let n = (blocks * SMOKE_THREADS) as usize;
    let mut rng = rand::rng();
    let input: Vec<u32> = (0..n).map(|_| rng.random()).collect();
    let d_in = stream.clone_htod(&input).unwrap();
    let mut d_out = stream.clone_htod(&vec![0xdead_beefu32; n]).unwrap();
    {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        let (pi, _gi) = d_in.device_ptr(&stream);
        let (po, _go) = d_out.device_ptr_mut(&stream);
        let p = SmokeParams {
            input: pi,
            output: po,
            len: n as u32,
            _pad: 0,
        };
        // SAFETY: buffers of n u32, n a multiple of the block, launch shape
        // as the kernel documents.
        unsafe { gpu::launch(&stream, &f, blocks, SMOKE_THREADS, SMOKE_SMEM_BYTES, &p).unwrap() };
    }
    let out = stream.clone_dtoh(&d_out).unwrap();
    let t = SMOKE_THREADS as usize;
    assert_eq!(out.len(), n);
    for (i, &got) in out.iter().enumerate() {
        let (blk, tid) = (i / t, i % t);
        let want = input[blk * t + (t - 1 - tid)]
            .wrapping_mul(3)
            .wrapping_add(tid as u32);
        assert_eq!(got, want, "element {i}");
    }
}

/// The Blackwell bring-up checks (`dsa_indexer_bwd::lab::bringup`): a typed
/// error on any GPU outside the sm_100 family (never a panic or a launch);
/// on an sm_100-family GPU (never available so far: compiled, not
/// executed) every check must match the CPU exactly.
#[test]
fn blackwell_bringup_checks_refuse_other_gpus_and_pass_on_sm100() {
    use dsa_indexer_bwd::{lab::bringup, Error};
    let Some(ctx) = test_gpu("blackwell_bringup_checks_refuse_other_gpus_and_pass_on_sm100") else {
        return;
    };
    let (major, minor) = ctx.compute_capability().unwrap();
    if major != 10 || !matches!(minor, 0 | 3) {
        for r in [
            bringup::smoke(&ctx).map(|_| ()),
            bringup::mma_probes(&ctx).map(|_| ()),
        ] {
            assert!(
                matches!(r, Err(Error::BackendUnavailable { .. })),
                "compute capability {major}.{minor}: {r:?}"
            );
        }
        println!("compute capability {major}.{minor}: bring-up checks refused (not sm_100)");
        return;
    }
    let mut reports = vec![bringup::smoke(&ctx).expect("smoke set-up")];
    reports.extend(bringup::mma_probes(&ctx).expect("probe set-up"));
    for r in &reports {
        println!(
            "{:<14} {} max|err| {:e} rel {:e}: {}",
            r.name,
            if r.ok { "ok  " } else { "FAIL" },
            r.max_abs_err,
            r.rel_err,
            r.detail
        );
    }
    assert_eq!(reports.len(), 1 + bringup::PROBES.len());
    assert!(reports.iter().all(|r| r.ok), "a bring-up check failed");
}
