//! Issue 2's end-to-end proof of the toolchain: a Rust kernel with dynamic
//! shared memory, an mbarrier and inline PTX, launched through cudarc and
//! checked against the CPU.

use dsa_indexer_bwd::gpu;
use indexer_tests::gpu as test_gpu;
use kernels_gpu::params::{SmokeParams, SMOKE_KERNEL, SMOKE_SMEM_BYTES, SMOKE_THREADS};
use rand::Rng;

#[test]
fn smoke_kernel_matches_cpu() {
    let Some(ctx) = test_gpu("smoke_kernel_matches_cpu") else {
        return;
    };
    let stream = ctx.default_stream();
    let module = gpu::load_module(&ctx).unwrap();
    let f = module.load_function(SMOKE_KERNEL).unwrap();
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
