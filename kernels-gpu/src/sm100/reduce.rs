//! Stage-2 reduce role (warps 4-7, one warpgroup). **Not executed.**
//!
//! Its order of operations is `proto::reduce`. Lane `l` of warp `w` owns
//! chunk slot `32 (w % 4) + l`, which is row `32 (w % 4) + l` of the
//! M = 128 dK accumulator and the lane the warp reaches with
//! `tcgen05.ld.32x32b` (`sm100::tmem`). Per chunk it:
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

use super::budget::{SM100_DIM, TMEM_DK};
use super::ctx::Ctx;
use super::dev::Dev;
use super::proto::{self, ReduceWork, Rows};
use super::tmem::{m128_row_of, warp_lane_base};
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{bulk, sreg, tcgen05};

/// A reduce warp's state.
pub(super) struct Reduce {
    /// The lane's chunk slot (its dK row and staging row).
    slot: u32,
    /// Lane field of the warp's tensor-memory sub-partition.
    lanes: u32,
    /// `sm_scale`.
    sm_scale: f32,
    /// The f32 dK accumulator.
    dk: *mut f32,
    /// The lane's staging row.
    stage_row: SmemAddr,
    /// The slot's key row of the current chunk (-1 for padding).
    key: i32,
}

impl ReduceWork for Dev<'_, Reduce> {
    #[inline(always)]
    fn read_key(&mut self, stage: u32) {
        // SAFETY: the skeleton's FULL wait hands the metadata to this role.
        self.role.key = unsafe { smem::ld_u32(self.c.meta_row(stage, self.role.slot)) } as i32;
    }

    #[inline(always)]
    fn stage_dk(&mut self) {
        let (c, s) = (self.c, &self.role);
        for j in 0..(SM100_DIM / 16) {
            // SAFETY: the skeleton's DK_READY wait hands dK to this role; a
            // whole warp loads from its own sub-partition.
            let v = unsafe { tcgen05::ld_32x32b_x16(c.tmem.offset(s.lanes, TMEM_DK + 16 * j)) };
            tcgen05::wait_ld();
            for q in 0..4usize {
                let mut x = [0u32; 4];
                for (e, xe) in x.iter_mut().enumerate() {
                    *xe = (f32::from_bits(v[4 * q + e]) * s.sm_scale).to_bits();
                }
                // SAFETY: the lane's own staging row, whose previous bulk
                // read the skeleton waited for.
                unsafe { smem::st_v4_u32(s.stage_row.add(64 * j + 16 * q as u32), x) };
            }
        }
    }

    #[inline(always)]
    fn reduce_dk(&mut self) {
        let s = &self.role;
        if s.key >= 0 {
            bulk::fence_proxy_async_shared();
            // SAFETY: a valid key row is < B*S_k, so its 512 bytes lie in
            // dk_accum (16-byte aligned, host-checked); the staging row was
            // written before the proxy fence and is not written again
            // before the skeleton's next `bulk_wait_read`.
            unsafe {
                bulk::reduce_add_f32(
                    s.dk.add(s.key as usize * SM100_DIM as usize),
                    s.stage_row,
                    SM100_DIM * 4,
                )
            };
            bulk::commit_group();
        }
    }
}

/// # Safety
/// Called by all 32 lanes of reduce warp `warp` (4..8) under the stage-2
/// launch contract.
#[inline(always)]
pub(super) unsafe fn run<const NCH: u32>(c: &Ctx<'_>, warp: u32) {
    let slot = m128_row_of(warp, sreg::thread_idx_x() % 32);
    let role = Reduce {
        slot,
        lanes: warp_lane_base(warp),
        sm_scale: c.p.sm_scale,
        dk: c.p.dk_accum as *mut f32,
        stage_row: c.dk_row(slot),
        key: -1,
    };
    // SAFETY: forwarded launch contract; this is a reduce warp.
    let mut m = unsafe { Dev::new(c, role) };
    let rows = Rows {
        first: c.cta,
        step: c.ctas,
        end: c.rows,
    };
    proto::reduce(&mut m, rows, NCH);
}
