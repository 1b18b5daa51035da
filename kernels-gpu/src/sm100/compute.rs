//! Stage-2 compute role (warps 0-3, one warpgroup). **Not executed.**
//!
//! Lane `l < 16` of warp `w` owns head `h = 16 w + l`: `tcgen05.ld.32x32b`
//! from the warp's sub-partition hands it row `h` of the M = 64 S and dQ
//! accumulators (`sm100::tmem`); lanes 16..32 receive unused lanes and only
//! take part in the collective loads. Per chunk the owner of head `h`:
//! - reads S[h, :] 16 slots at a time, gates it
//!   (`valid && sm_scale * S > 0`), writes `dS = grad_signal * w[h]` as bf16
//!   into row h of the swizzled dS tile (`operands::ds_at`) and adds
//!   `grad_signal * sm_scale * S` to its d_weights sum;
//! - fences (generic -> async proxy, tcgen05 before-sync) and its warp
//!   arrives on `DS_READY` and `EMPTY[s]` (done with the stage metadata).
//!
//! After a row's last chunk it reads dQ[h, :] (`DQ_READY`), releases the
//! accumulator (`DQ_FREE`) and writes `d_index_q` (bf16, times sm_scale)
//! and `d_weights` for real heads (`h < H`). Heads `H..64` (H = 32) have
//! zero q rows, so their S and dS are exactly zero.

use super::budget::{K_STAGES, TMEM_DQ, TMEM_S};
use super::operands::ds_at;
use super::sched::{parity, slot};
use super::stage2::{Ctx, DQ_FREE, DQ_READY, DS_READY, EMPTY, FULL, S_READY};
use super::tmem::{m64_row_of, warp_lane_base};
use crate::params::FLAG_DW_F32;
use crate::ptx::tcgen05;
use crate::ptx::{bulk, cvt, mbarrier, smem, sreg, sync};
use crate::score::gate;

/// # Safety
/// Called by all 32 lanes of compute warp `warp` (0..4) under the stage-2
/// launch contract.
#[inline(always)]
pub(super) unsafe fn run<const NCH: u32, const H: u32>(c: &Ctx<'_>, warp: u32) {
    let lane = sreg::thread_idx_x() % 32;
    let p = c.p;
    let owner = m64_row_of(warp, lane);
    let h = owner.unwrap_or(0);
    let real = owner.is_some() && h < H;
    let lanes = warp_lane_base(warp);
    let sm_scale = p.sm_scale;
    let ds = c.ds();
    let (mut n, mut r) = (0u32, 0u32);
    let mut row = c.cta;
    while row < c.rows {
        let w_h = if real {
            // SAFETY: (row, h) inside weights (B*S_q*H bf16).
            cvt::bf16_to_f32(unsafe { *(p.weights as *const u16).add((row * H + h) as usize) })
        } else {
            0.0
        };
        let mut dw = 0.0f32;
        // SAFETY (whole row): barrier waits hand S, the stage metadata and
        // dQ to this role; each owner lane writes only row h of dS; the
        // global stores stay inside row `row` of d_index_q / d_weights.
        unsafe {
            for _ in 0..NCH {
                let ks = slot(n, K_STAGES);
                // The load role's metadata writes are released on FULL[s].
                mbarrier::wait_parity(c.bar(FULL + ks.index), ks.full_parity);
                mbarrier::wait_parity(c.bar(S_READY), parity(n));
                tcgen05::fence_after_thread_sync();
                // Kept as a loop (opaque trip count): fully unrolled, LLVM
                // hoists all eight loads and runs out of registers.
                for j in 0..sync::opaque_u32(8) {
                    let v = tcgen05::ld_32x32b_x16(c.tmem.offset(lanes, TMEM_S + 16 * j));
                    tcgen05::wait_ld();
                    let mut packed = [0u32; 8];
                    for (i, pk) in packed.iter_mut().enumerate() {
                        let mut pair = [0.0f32; 2];
                        for (e, d) in pair.iter_mut().enumerate() {
                            let t = 16 * j + 2 * i as u32 + e as u32;
                            let gs = smem::ld_f32(c.meta_gs(ks.index, t));
                            let valid = (smem::ld_u32(c.meta_row(ks.index, t)) as i32) >= 0;
                            let (ds_v, dw_t) =
                                gate(f32::from_bits(v[2 * i + e]), sm_scale, gs, w_h, valid);
                            *d = ds_v;
                            dw += dw_t;
                        }
                        *pk = cvt::pack_bf16x2(pair[0], pair[1]);
                    }
                    if owner.is_some() {
                        let lo = [packed[0], packed[1], packed[2], packed[3]];
                        let hi = [packed[4], packed[5], packed[6], packed[7]];
                        smem::st_v4_u32(ds.add(ds_at(h, 16 * j)), lo);
                        smem::st_v4_u32(ds.add(ds_at(h, 16 * j + 8)), hi);
                    }
                }
                // dS is read by the tensor cores (async proxy); S reads are
                // complete (wait_ld) before the arrival.
                bulk::fence_proxy_async_shared();
                tcgen05::fence_before_thread_sync();
                sync::warp_sync();
                if lane == 0 {
                    mbarrier::arrive(c.bar(DS_READY));
                    // This warp is done with the stage's metadata.
                    mbarrier::arrive(c.bar(EMPTY + ks.index));
                }
                n += 1;
            }

            // ---- dQ epilogue of the row ----
            mbarrier::wait_parity(c.bar(DQ_READY), parity(r));
            tcgen05::fence_after_thread_sync();
            let dq = (p.d_index_q as *mut u32).add((row as usize * H as usize + h as usize) * 64);
            for j in 0..8u32 {
                let v = tcgen05::ld_32x32b_x16(c.tmem.offset(lanes, TMEM_DQ + 16 * j));
                tcgen05::wait_ld();
                if real {
                    for i in 0..8usize {
                        let x = f32::from_bits(v[2 * i]) * sm_scale;
                        let y = f32::from_bits(v[2 * i + 1]) * sm_scale;
                        *dq.add(8 * j as usize + i) = cvt::pack_bf16x2(x, y);
                    }
                }
            }
            tcgen05::fence_before_thread_sync();
            sync::warp_sync();
            if lane == 0 {
                mbarrier::arrive(c.bar(DQ_FREE));
            }
            if real {
                let idx = (row * H + h) as usize;
                if p.flags & FLAG_DW_F32 != 0 {
                    *(p.d_weights as *mut f32).add(idx) = dw;
                } else {
                    *(p.d_weights as *mut u16).add(idx) = cvt::pack_bf16x2(dw, 0.0) as u16;
                }
            }
        }
        r += 1;
        row += c.ctas;
    }
}
