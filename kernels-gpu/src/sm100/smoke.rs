//! sm_100f smoke kernel: one `tcgen05.mma` (M = 128, N = 64, K = 16, bf16 ->
//! f32) from canonical K-major shared-memory tiles into tensor memory, read
//! back with `tcgen05.ld`. It exists so that ptxas checks the tcgen05 and
//! gather4 wrappers and the descriptor encoders in every CI run.
//! **Compiled and assembled for sm_100f, not executed.**

use crate::abi::Sm100SmokeParams;
use crate::ptx::tcgen05::{self, TmemAddr};
use crate::ptx::{mbarrier, smem, sreg, sync, tma};
use crate::sm100::desc::{
    instr_desc_f16, kmajor_offset, smem_desc, Accum, F16Kind, Major, Swizzle,
};

const M: u32 = 128;
const N: u32 = 64;
const K: u32 = 16;
/// Canonical no-swizzle K-major layout: two core matrices along K (128 B
/// apart), 8-row groups 256 B apart.
const LBO: u32 = 128;
const SBO: u32 = 256;
const IDESC: u32 = instr_desc_f16(M, N, F16Kind::Bf16, Accum::F32, Major::K, Major::K);
/// Shared-memory layout: barriers and the tensor-memory address slot, then A and B.
const BAR_MMA: u32 = 0;
const BAR_TMA: u32 = 8;
const TMEM_SLOT: u32 = 16;
const A_TILE: u32 = 1024;
const B_TILE: u32 = A_TILE + M * K * 2;
const GATHER: u32 = B_TILE + N * K * 2;
/// Columns allocated for the 128 x 64 f32 accumulator.
const TMEM_COLS: u32 = 64;
// The host launches with the sizes `abi` publishes.
const _: () = assert!(GATHER + 4 * K * 2 == crate::abi::SM100_SMOKE_SMEM);
const _: () = assert!(M == crate::abi::SM100_SMOKE_THREADS);

/// Launch: 1 CTA of `SM100_SMOKE_THREADS` (128) threads,
/// `SM100_SMOKE_SMEM` (`GATHER + 4 * K * 2`) bytes of dynamic shared memory.
///
/// # Safety
/// `p` as documented on [`Sm100SmokeParams`].
#[no_mangle]
pub unsafe extern "ptx-kernel" fn sm100_tcgen05_smoke(p: Sm100SmokeParams) {
    let tid = sreg::thread_idx_x();
    let warp = tid / 32;
    let base = smem::base();
    // SAFETY (whole body): one CTA of 128 threads as documented; every
    // shared address below is inside the launch's dynamic shared memory.
    unsafe {
        if tid == 0 {
            mbarrier::init(base.add(BAR_MMA), 1);
            mbarrier::init(base.add(BAR_TMA), 1);
            mbarrier::fence_init();
        }
        // Stage A (128 x 16) and B (64 x 16) in the canonical layout.
        let a = p.a as *const u16;
        let b = p.b as *const u16;
        let mut e = tid;
        while e < M * K / 2 {
            let (r, k) = (e / (K / 2), 2 * (e % (K / 2)));
            let w = *(a.add((r * K + k) as usize) as *const u32);
            smem::st_u32(base.add(A_TILE + kmajor_offset(r, k, LBO, SBO)), w);
            e += 128;
        }
        let mut e = tid;
        while e < N * K / 2 {
            let (r, k) = (e / (K / 2), 2 * (e % (K / 2)));
            let w = *(b.add((r * K + k) as usize) as *const u32);
            smem::st_u32(base.add(B_TILE + kmajor_offset(r, k, LBO, SBO)), w);
            e += 128;
        }
        crate::ptx::bulk::fence_proxy_async_shared();
        if warp == 0 {
            tcgen05::alloc(base.add(TMEM_SLOT), TMEM_COLS);
            tcgen05::relinquish_alloc_permit();
        }
        tcgen05::fence_before_thread_sync();
        sync::bar_sync();
        tcgen05::fence_after_thread_sync();
        let tmem = TmemAddr(smem::ld_u32(base.add(TMEM_SLOT)));

        if tid == 0 {
            if p.tmap != 0 {
                // Rows 0..4 of b by TMA gather4 (exercises the wrapper).
                tma::arrive_expect_tx(base.add(BAR_TMA), 4 * K * 2);
                tma::gather4(
                    base.add(GATHER),
                    p.tmap as *const u8,
                    0,
                    [0, 1, 2, 3],
                    base.add(BAR_TMA),
                );
                mbarrier::wait_parity(base.add(BAR_TMA), 0);
            }
            let ad = smem_desc(base.0 + A_TILE, LBO, SBO, Swizzle::None);
            let bd = smem_desc(base.0 + B_TILE, LBO, SBO, Swizzle::None);
            tcgen05::mma_f16(tmem, ad, bd, IDESC, false);
            tcgen05::commit(base.add(BAR_MMA));
        }
        mbarrier::wait_parity(base.add(BAR_MMA), 0);
        tcgen05::fence_after_thread_sync();

        // Warp w reads accumulator rows (lanes) 32w..32w+32, 8 columns a step.
        let out = p.out as *mut f32;
        let row = tid;
        let mut col = 0;
        while col < N {
            let v = tcgen05::ld_32x32b_x8(tmem.offset(32 * warp, col));
            tcgen05::wait_ld();
            for (j, x) in v.iter().enumerate() {
                *out.add((row * N + col) as usize + j) = f32::from_bits(*x);
            }
            col += 8;
        }
        tcgen05::fence_before_thread_sync();
        sync::bar_sync();
        if warp == 0 {
            tcgen05::fence_after_thread_sync();
            tcgen05::dealloc(tmem, TMEM_COLS);
        }
    }
}
