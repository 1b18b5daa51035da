//! Stage-2 reduce role (warps 4-7, one warpgroup). **Not executed.**
//!
//! Lane `l` of warp `w` owns chunk slot `32 (w % 4) + l`, which is row
//! `32 (w % 4) + l` of the M = 128 dK accumulator and the lane the warp
//! reaches with `tcgen05.ld.32x32b` (`sm100::tmem`). Per chunk it:
//! 1. reads its slot's resolved key row from the stage metadata, and its
//!    warp releases the stage (`EMPTY[s]`);
//! 2. waits `DK_READY`, makes sure its previous bulk reduction has finished
//!    reading the staging row (`cp.async.bulk.wait_group.read 0`), and
//!    copies its dK row (times sm_scale) from tensor memory into its padded
//!    f32 staging row;
//! 3. its warp releases the accumulator (`DK_FREE`), and for a valid slot it
//!    issues one `cp.reduce.async.bulk ... .add.f32` of the 512-byte row
//!    into `dk_accum[key row]` (after `fence.proxy.async`).
//!
//! Each lane both writes and bulk-reduces its own staging row, so no
//! barrier between lanes is needed there.

use super::budget::{K_STAGES, SM100_DIM, TMEM_DK};
use super::sched::{parity, slot};
use super::stage2::{Ctx, DK_FREE, DK_READY, EMPTY, FULL};
use super::tmem::{m128_row_of, warp_lane_base};
use crate::ptx::tcgen05;
use crate::ptx::{bulk, mbarrier, smem, sreg, sync};

/// # Safety
/// Called by all 32 lanes of reduce warp `warp` (4..8) under the stage-2
/// launch contract.
#[inline(always)]
pub(super) unsafe fn run<const NCH: u32>(c: &Ctx<'_>, warp: u32) {
    let lane = sreg::thread_idx_x() % 32;
    let slot_id = m128_row_of(warp, lane);
    let lanes = warp_lane_base(warp);
    let sm_scale = c.p.sm_scale;
    let dk = c.p.dk_accum as *mut f32;
    let stage_row = c.dk_row(slot_id);
    let mut n = 0u32;
    let mut row = c.cta;
    while row < c.rows {
        // SAFETY (whole row): the barrier waits hand the metadata and the dK
        // accumulator to this role; the staging row is this lane's alone; a
        // valid key row is < B*S_k, so its 512 bytes lie in dk_accum
        // (16-byte aligned, host-checked).
        unsafe {
            for _ in 0..NCH {
                let ks = slot(n, K_STAGES);
                mbarrier::wait_parity(c.bar(FULL + ks.index), ks.full_parity);
                let key = smem::ld_u32(c.meta_row(ks.index, slot_id)) as i32;
                sync::warp_sync();
                if lane == 0 {
                    mbarrier::arrive(c.bar(EMPTY + ks.index));
                }
                mbarrier::wait_parity(c.bar(DK_READY), parity(n));
                tcgen05::fence_after_thread_sync();
                bulk::wait_group_read_0();
                for j in 0..(SM100_DIM / 16) {
                    let v = tcgen05::ld_32x32b_x16(c.tmem.offset(lanes, TMEM_DK + 16 * j));
                    tcgen05::wait_ld();
                    for q in 0..4usize {
                        let mut x = [0u32; 4];
                        for (e, xe) in x.iter_mut().enumerate() {
                            *xe = (f32::from_bits(v[4 * q + e]) * sm_scale).to_bits();
                        }
                        smem::st_v4_u32(stage_row.add(64 * j + 16 * q as u32), x);
                    }
                }
                tcgen05::fence_before_thread_sync();
                sync::warp_sync();
                if lane == 0 {
                    mbarrier::arrive(c.bar(DK_FREE));
                }
                if key >= 0 {
                    bulk::fence_proxy_async_shared();
                    bulk::reduce_add_f32(
                        dk.add(key as usize * SM100_DIM as usize),
                        stage_row,
                        SM100_DIM * 4,
                    );
                    bulk::commit_group();
                }
                n += 1;
            }
        }
        row += c.ctas;
    }
    // The bulk reductions must land before the grid completes.
    bulk::wait_group_0();
}
