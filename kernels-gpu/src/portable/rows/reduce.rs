//! Epilogue/reduce role of the row kernel: the gate (dS in bf16 and the
//! d_weights partials), the dK staging and its bulk reductions into the
//! f32 accumulator, and the row's d_index_q and d_weights stores.

use super::body::{at, barrier, Barrier, Row, SLOT_TILES};
use super::{CHUNK, GRAD_THREADS, GRAD_WARPS, MMA_M, MMA_N};
use crate::abi::FLAG_DW_F32;
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{bulk, cvt, sync};

impl<
        const H: usize,
        const D: usize,
        const MT: usize,
        const NQ: usize,
        const SHG: usize,
        const SMT: usize,
    > Row<'_, H, D, MT, NQ, SHG, SMT>
{
    /// The gate on this warp's S tile: dS = grad_signal * w where the slot
    /// is valid and S > 0 (bf16 into the dS tile), and the d_weights
    /// partials `dw += grad_signal * S`; then a barrier (dS complete).
    ///
    /// # Safety
    /// Every thread of the CTA, uniform control flow; `sgs`, `srows` (the
    /// chunk's slot set) and `sw` written before a barrier.
    #[inline(always)]
    pub(super) unsafe fn gate(
        &self,
        s: &[[[f32; 4]; SHG]; SMT],
        sgs: SmemAddr,
        srows: SmemAddr,
        dw: &mut [[f32; 2]; SMT],
    ) {
        // SAFETY: the caller's contract; each thread stores its own two dS
        // columns of its own head rows.
        unsafe {
            for nt in 0..SHG {
                let tl = self.s_base + nt as u32 * MMA_N + self.c;
                let gs = [
                    smem::ld_f32(sgs.add(4 * tl)),
                    smem::ld_f32(sgs.add(4 * (tl + 1))),
                ];
                let valid = [
                    (smem::ld_u32(srows.add(4 * tl)) as i32) >= 0,
                    (smem::ld_u32(srows.add(4 * (tl + 1))) as i32) >= 0,
                ];
                for mt in 0..SMT {
                    for half in 0..2 {
                        let h = self.h_base + mt as u32 * MMA_M + self.g + 8 * half as u32;
                        let wh = smem::ld_f32(self.sw.add(4 * h));
                        let mut ds = [0.0f32; 2];
                        for j in 0..2 {
                            let sv = s[mt][nt][2 * half + j] * self.sm_scale;
                            if valid[j] && sv > 0.0 {
                                ds[j] = gs[j] * wh;
                                dw[mt][half] += gs[j] * sv;
                            }
                        }
                        smem::st_u32(at(self.sds, CHUNK, h, tl), cvt::pack_bf16x2(ds[0], ds[1]));
                    }
                }
            }
            barrier(Barrier::Ds);
        }
    }

    /// Stages the chunk's dK rows (scaled) in shared memory, then one bulk
    /// reduction (TMA unit) per valid slot row into the accumulator, by
    /// thread `slot`.
    ///
    /// # Safety
    /// Every thread of the CTA, uniform control flow; `srows` (the chunk's
    /// key rows) written before a barrier.
    #[inline(always)]
    pub(super) unsafe fn reduce_dk(&self, kacc: &[[[f32; 4]; NQ]; SLOT_TILES], srows: SmemAddr) {
        let tid = self.tid;
        if tid < CHUNK {
            // This thread's bulk reduction of the previous chunk has read the tile.
            bulk::wait_group_read_0();
        }
        // SAFETY: uniform barrier; each thread then writes its own fragment
        // elements (distinct (slot, col) pairs) of the staging tile.
        unsafe {
            barrier(Barrier::StagingFree);
            for (mt, acc) in kacc.iter().enumerate() {
                for half in 0..2 {
                    let slot = mt as u32 * MMA_M + self.g + 8 * half as u32;
                    for (nq, a) in acc.iter().enumerate() {
                        let col = self.dbase + nq as u32 * MMA_N + self.c;
                        let at = self.sdk.add(slot * self.dk_stride + col * 4);
                        smem::st_v2_f32(
                            at,
                            a[2 * half] * self.sm_scale,
                            a[2 * half + 1] * self.sm_scale,
                        );
                    }
                }
            }
            bulk::fence_proxy_async_shared();
            barrier(Barrier::DkStaged);
        }
        if tid < CHUNK {
            // SAFETY: `srows` was written before a barrier; a valid row lies
            // inside the (B*S_k, D) accumulator (16-byte aligned rows, host
            // checks the base); the staged row was fenced and is not written
            // again before this thread's next `wait_group_read_0`.
            unsafe {
                let r = smem::ld_u32(srows.add(4 * tid)) as i32;
                if r >= 0 {
                    let dk = self.p.dk_accum as *mut f32;
                    bulk::reduce_add_f32(
                        dk.add(r as usize * D),
                        self.sdk.add(tid * self.dk_stride),
                        Self::D_U * 4,
                    );
                    bulk::commit_group();
                }
            }
        }
    }

    /// d_index_q of the row: this thread's accumulator elements, scaled,
    /// as bf16 pairs.
    #[inline(always)]
    pub(super) fn store_dq(&self, acc_q: &[[[f32; 4]; NQ]; MT]) {
        let dq = (self.p.d_index_q as *mut u32).wrapping_add(self.row as usize * H * D / 2);
        for (mt, tiles) in acc_q.iter().enumerate() {
            for (nq, a) in tiles.iter().enumerate() {
                for half in 0..2 {
                    let h = mt * MMA_M as usize + self.g as usize + 8 * half;
                    let col = (self.dbase + nq as u32 * MMA_N + self.c) as usize;
                    let w = cvt::pack_bf16x2(
                        a[2 * half] * self.sm_scale,
                        a[2 * half + 1] * self.sm_scale,
                    );
                    // SAFETY: (h, col) is inside this row's H x D block; col even.
                    unsafe { *dq.add((h * D + col) / 2) = w };
                }
            }
        }
    }

    /// d_weights of the row: the partials summed over lanes, then over the
    /// warps of each head group in slot-group order (a fixed order).
    ///
    /// # Safety
    /// Every thread of the CTA, uniform control flow; `sred`'s last readers
    /// passed a barrier.
    #[inline(always)]
    pub(super) unsafe fn store_dw(&self, dw: &[[f32; 2]; SMT]) {
        let (p, h_u) = (self.p, Self::H_U);
        // SAFETY: full warps run the shuffles; uniform barrier before the
        // cross-warp sum.
        unsafe {
            // All shuffles first, at the top level of the warp's control flow,
            // then one lane-conditional block of stores: keeps every lane on the
            // same shfl.sync instructions.
            let mut quad = [[0.0f32; 2]; SMT];
            for (q, pair) in quad.iter_mut().zip(dw.iter()) {
                for (qv, &v) in q.iter_mut().zip(pair.iter()) {
                    *qv = sync::quad_sum_f32(v);
                }
            }
            if self.lane % 4 == 0 {
                for (mt, q) in quad.iter().enumerate() {
                    for (half, &v) in q.iter().enumerate() {
                        let h = self.h_base + mt as u32 * MMA_M + self.g + 8 * half as u32;
                        smem::st_f32(self.sred.add(4 * (self.warp * h_u + h)), v);
                    }
                }
            }
            sync::bar_sync();
            let mut h = self.tid;
            while h < h_u {
                // Head h's partials come from the warps of its head group, one per
                // slot group, summed in slot-group order.
                let hg = h / (h_u / SHG as u32);
                let mut sum = 0.0f32;
                for sg in 0..GRAD_WARPS / SHG as u32 {
                    let w = sg * SHG as u32 + hg;
                    sum += smem::ld_f32(self.sred.add(4 * (w * h_u + h)));
                }
                let idx = self.row as usize * H + h as usize;
                if p.flags & FLAG_DW_F32 != 0 {
                    *(p.d_weights as *mut f32).add(idx) = sum;
                } else {
                    *(p.d_weights as *mut u16).add(idx) = cvt::pack_bf16x2(sum, 0.0) as u16;
                }
                h += GRAD_THREADS;
            }
        }
    }
}
