//! Toolchain smoke kernel: proves the Rust -> PTX -> driver chain with
//! dynamic shared memory, an mbarrier and inline PTX.
//!
//! Each CTA of [`SMOKE_THREADS`] threads stages its slice of `input` in
//! shared memory, every thread arrives on one mbarrier, waits for the phase
//! to complete, then writes `output[i] = input[mirror(i)] * 3 + tid` where
//! `mirror` reverses the thread index within the CTA. Reading another
//! thread's staged value is only correct if the mbarrier really orders the
//! shared-memory writes.

use crate::abi::{SmokeParams, SMOKE_THREADS};
use crate::ptx::{mbarrier, smem, sreg, sync};

/// Launch: grid `len / SMOKE_THREADS`, block `SMOKE_THREADS`, dynamic shared
/// memory `SMOKE_SMEM_BYTES`.
///
/// # Safety
/// `p.input`/`p.output` must be valid u32 buffers of `p.len` elements, `p.len`
/// a multiple of `SMOKE_THREADS`, and the launch shape as above.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn smoke_mbarrier_reverse(p: SmokeParams) {
    let tid = sreg::thread_idx_x();
    let gid = sreg::block_idx_x() * SMOKE_THREADS + tid;
    let bar = smem::base();
    let vals = bar.add(16);
    if tid == 0 {
        // SAFETY: thread 0 alone initialises the barrier before anyone uses it.
        unsafe { mbarrier::init(bar, SMOKE_THREADS) };
        mbarrier::fence_init();
    }
    // SAFETY: uniform control flow: every thread reaches this barrier.
    unsafe { sync::bar_sync() };
    if gid >= p.len {
        sync::trap(); // the host guarantees len is a multiple of the block
    }
    // SAFETY: gid < len, so the input element exists; the slot `tid` of the
    // staging area is written by this thread only.
    unsafe {
        let v = *(p.input as *const u32).add(gid as usize);
        smem::st_u32(vals.add(4 * tid), v);
        mbarrier::arrive(bar);
        mbarrier::wait_parity(bar, 0);
    }
    let mirror = SMOKE_THREADS - 1 - tid;
    // SAFETY: the completed phase orders every thread's store before this
    // load; the output element gid exists.
    unsafe {
        let v = smem::ld_u32(vals.add(4 * mirror));
        *(p.output as *mut u32).add(gid as usize) = v.wrapping_mul(3).wrapping_add(tid);
    }
}
