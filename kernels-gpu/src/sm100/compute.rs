//! Stage-2 compute role (warps 0-3, one warpgroup). **Not executed.**
//!
//! Its order of operations is `proto::compute`. Lane `l < 16` of warp `w`
//! owns head `h = 16 w + l`: `tcgen05.ld.32x32b` from the warp's
//! sub-partition hands it row `h` of the M = 64 S and dQ accumulators
//! (`sm100::tmem`); lanes 16..32 receive unused lanes and only take part in
//! the collective loads. Per chunk the owner of head `h`:
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

use super::budget::{TMEM_DQ, TMEM_S};
use super::ctx::Ctx;
use super::dev::Dev;
use super::operands::ds_at;
use super::proto::{self, ComputeWork, Rows};
use super::tmem::{m64_row_of, warp_lane_base};
use crate::abi::FLAG_DW_F32;
use crate::ptx::tcgen05;
use crate::ptx::{cvt, smem, sreg, sync};
use crate::score::gate;

/// A compute warp's state for `H` heads.
pub(super) struct Compute<const H: u32> {
    /// Whether this lane owns a head (lanes 0..16), and which.
    owner: Option<u32>,
    /// The owned head (0 for lanes that own none).
    h: u32,
    /// Whether the head is a real one (`h < H`).
    real: bool,
    /// Lane field of the warp's tensor-memory sub-partition.
    lanes: u32,
    /// `sm_scale`.
    sm_scale: f32,
    /// The row's weight of head `h`.
    w_h: f32,
    /// The row's d_weights sum of head `h`.
    dw: f32,
}

impl<const H: u32> ComputeWork for Dev<'_, Compute<H>> {
    #[inline(always)]
    fn begin_row(&mut self, row: u32) {
        let (p, s) = (self.c.p, &mut self.role);
        s.w_h = if s.real {
            // SAFETY: (row, h) inside weights (B*S_q*H bf16).
            cvt::bf16_to_f32(unsafe { *(p.weights as *const u16).add((row * H + s.h) as usize) })
        } else {
            0.0
        };
        s.dw = 0.0;
    }

    #[inline(always)]
    fn gate(&mut self, stage: u32) {
        let (c, s) = (self.c, &mut self.role);
        let ds = c.ds();
        // Kept as a loop (opaque trip count): fully unrolled, LLVM
        // hoists all eight loads and runs out of registers.
        for j in 0..sync::opaque_u32(8) {
            // SAFETY: the skeleton's waits hand S and the stage metadata to
            // this role; a whole warp loads from its own sub-partition.
            let v = unsafe { tcgen05::ld_32x32b_x16(c.tmem.offset(s.lanes, TMEM_S + 16 * j)) };
            tcgen05::wait_ld();
            let mut packed = [0u32; 8];
            for (i, pk) in packed.iter_mut().enumerate() {
                let mut pair = [0.0f32; 2];
                for (e, d) in pair.iter_mut().enumerate() {
                    let t = 16 * j + 2 * i as u32 + e as u32;
                    // SAFETY: metadata of this chunk's slot `t` (< 128).
                    let (gs, valid) = unsafe {
                        let gs = smem::ld_f32(c.meta_gs(stage, t));
                        (gs, (smem::ld_u32(c.meta_row(stage, t)) as i32) >= 0)
                    };
                    let (ds_v, dw_t) =
                        gate(f32::from_bits(v[2 * i + e]), s.sm_scale, gs, s.w_h, valid);
                    *d = ds_v;
                    s.dw += dw_t;
                }
                *pk = cvt::pack_bf16x2(pair[0], pair[1]);
            }
            if s.owner.is_some() {
                let lo = [packed[0], packed[1], packed[2], packed[3]];
                let hi = [packed[4], packed[5], packed[6], packed[7]];
                // SAFETY: each owner lane writes only row h of the dS tile,
                // which the skeleton's S_READY wait hands to this role.
                unsafe {
                    smem::st_v4_u32(ds.add(ds_at(s.h, 16 * j)), lo);
                    smem::st_v4_u32(ds.add(ds_at(s.h, 16 * j + 8)), hi);
                }
            }
        }
    }

    #[inline(always)]
    fn read_dq(&mut self, row: u32) {
        let (c, s) = (self.c, &self.role);
        let sm_scale = s.sm_scale;
        let base = (row as usize * H as usize + s.h as usize) * 64;
        // SAFETY: the row's dQ in `d_index_q` (bf16 pairs as u32).
        let dq = unsafe { (c.p.d_index_q as *mut u32).add(base) };
        for j in 0..8u32 {
            // SAFETY: the skeleton's DQ_READY wait hands dQ to this role; a
            // whole warp loads from its own sub-partition.
            let v = unsafe { tcgen05::ld_32x32b_x16(c.tmem.offset(s.lanes, TMEM_DQ + 16 * j)) };
            tcgen05::wait_ld();
            if s.real {
                for i in 0..8usize {
                    let x = f32::from_bits(v[2 * i]) * sm_scale;
                    let y = f32::from_bits(v[2 * i + 1]) * sm_scale;
                    // SAFETY: inside head h's 64 pairs of the row.
                    unsafe { *dq.add(8 * j as usize + i) = cvt::pack_bf16x2(x, y) };
                }
            }
        }
    }

    #[inline(always)]
    fn store_dw(&mut self, row: u32) {
        let (p, s) = (self.c.p, &self.role);
        if s.real {
            let idx = (row * H + s.h) as usize;
            // SAFETY: (row, h) inside d_weights (f32 or bf16 by the flag).
            unsafe {
                if p.flags & FLAG_DW_F32 != 0 {
                    *(p.d_weights as *mut f32).add(idx) = s.dw;
                } else {
                    *(p.d_weights as *mut u16).add(idx) = cvt::pack_bf16x2(s.dw, 0.0) as u16;
                }
            }
        }
    }
}

/// # Safety
/// Called by all 32 lanes of compute warp `warp` (0..4) under the stage-2
/// launch contract.
#[inline(always)]
pub(super) unsafe fn run<const NCH: u32, const H: u32>(c: &Ctx<'_>, warp: u32) {
    let owner = m64_row_of(warp, sreg::thread_idx_x() % 32);
    let h = owner.unwrap_or(0);
    let role = Compute::<H> {
        owner,
        h,
        real: owner.is_some() && h < H,
        lanes: warp_lane_base(warp),
        sm_scale: c.p.sm_scale,
        w_h: 0.0,
        dw: 0.0,
    };
    // SAFETY: forwarded launch contract; this is a compute warp.
    let mut m = unsafe { Dev::new(c, role) };
    let rows = Rows {
        first: c.cta,
        step: c.ctas,
        end: c.rows,
    };
    proto::compute(&mut m, rows, NCH);
}
