//! Load role of the row kernel: the row's q and weights, stage 1 (the
//! row's score-gradient sum, then each chunk's grad_signal and key rows),
//! and the gather of each chunk's K rows.

use super::body::{at, Row};
use super::{CHUNK, GRAD_THREADS, GRAD_WARPS};
use crate::ptx::smem;
use crate::ptx::{cp_async, cvt, sync};
use crate::score::{load_id, resolve, score_terms};

impl<
        const H: usize,
        const D: usize,
        const MT: usize,
        const NQ: usize,
        const SHG: usize,
        const SMT: usize,
    > Row<'_, H, D, MT, NQ, SHG, SMT>
{
    /// The q row into shared memory by `cp.async` (waited for with chunk
    /// 0's K rows) and the weights as f32.
    #[inline(always)]
    pub(super) fn load_q_weights(&self) {
        let (p, tid) = (self.p, self.tid);
        let qrow = (p.index_q as *const u8).wrapping_add(self.row as usize * H * D * 2);
        let mut v = tid;
        while v < Self::H_U * Self::VEC_PER_ROW {
            let (h, cc) = (v / Self::VEC_PER_ROW, v % Self::VEC_PER_ROW);
            // SAFETY: the row has H*D bf16; 16-byte aligned (host-checked base,
            // D*2 a multiple of 16); the destination vector is this thread's and
            // nobody reads it before this thread's wait_all and a barrier.
            unsafe {
                cp_async::copy_16(
                    at(self.sq, Self::D_U, h, cc * 8),
                    qrow.add(v as usize * 16),
                    16,
                )
            };
            v += GRAD_THREADS;
        }
        let mut h = tid;
        while h < Self::H_U {
            // SAFETY: weights has B*S_q*H bf16; this thread owns slot h of `sw`.
            unsafe {
                let wb = *(p.weights as *const u16).add(self.row as usize * H + h as usize);
                smem::st_f32(self.sw.add(4 * h), cvt::bf16_to_f32(wb));
            }
            h += GRAD_THREADS;
        }
    }

    /// Stage 1, pass 1: G = sum_t g_t over the row's slots in a fixed
    /// order (each thread's strided part, then the warps' sums in order).
    ///
    /// # Safety
    /// Every thread of the CTA, uniform control flow (a CTA barrier).
    #[inline(always)]
    pub(super) unsafe fn score_sum(&self, coeff: f32) -> f32 {
        let (attn, score) = (
            self.p.attn_score as *const f32,
            self.p.index_score as *const f32,
        );
        let mut part = 0.0f32;
        let mut t = self.tid as usize;
        while t < self.topk {
            // SAFETY: t < topk, inside this row's slots.
            let (gt, _) = unsafe {
                score_terms(
                    *attn.add(self.row_slots + t),
                    *score.add(self.row_slots + t),
                    self.log,
                    coeff,
                )
            };
            part += gt;
            t += GRAD_THREADS as usize;
        }
        // SAFETY: every lane of every warp reaches these collectives/barriers.
        unsafe {
            let wsum = sync::warp_sum_f32(part);
            if self.lane == 0 {
                smem::st_f32(self.sred.add(4 * self.warp), wsum);
            }
            sync::bar_sync();
            let mut s = 0.0f32;
            for w in 0..GRAD_WARPS {
                s += smem::ld_f32(self.sred.add(4 * w));
            }
            s
        }
    }

    /// Stage 1, pass 2 for the chunk starting at slot `t0`, by threads
    /// < CHUNK into buffer set `set`: grad_signal (written in place over
    /// attn_score) and the resolved key row of each slot.
    #[inline(always)]
    pub(super) fn prepare(&self, t0: usize, set: u32, coeff: f32, big_g: f32) {
        let (p, tid) = (self.p, self.tid);
        let attn = p.attn_score as *mut f32;
        let score = p.index_score as *const f32;
        if tid < CHUNK {
            let t = t0 + tid as usize;
            let (gs, r) = if t < self.topk {
                // SAFETY: t < topk; this thread is the only one touching
                // slot t now, and every pass-1 read finished before the
                // barrier that produced G.
                unsafe {
                    let (gt, pr) = score_terms(
                        *attn.add(self.row_slots + t),
                        *score.add(self.row_slots + t),
                        self.log,
                        coeff,
                    );
                    let gs = gt - pr * big_g;
                    *attn.add(self.row_slots + t) = gs;
                    (gs, resolve(load_id(p, self.row_slots + t), self.b, p))
                }
            } else {
                (0.0, -1)
            };
            // SAFETY: slot tid of this buffer set belongs to this thread, and
            // its previous readers passed a barrier since (see the loop).
            unsafe {
                smem::st_f32(self.sgs.add(4 * (set * CHUNK + tid)), gs);
                smem::st_u32(self.srows.add(4 * (set * CHUNK + tid)), r as u32);
            }
        }
    }

    /// Gather (cp.async, zero-fill for padding) of the K rows listed in
    /// buffer set `set` into K buffer `set`; one group per thread.
    #[inline(always)]
    pub(super) fn gather(&self, set: u32) {
        let kbuf = self.k_buf(set);
        let index_k = self.p.index_k as *const u8;
        let mut v = self.tid;
        while v < CHUNK * Self::VEC_PER_ROW {
            let (slot, cc) = (v / Self::VEC_PER_ROW, v % Self::VEC_PER_ROW);
            // SAFETY: the row ids were written before a barrier; a valid row
            // is < B*S_k so the 16-byte vector lies inside index_k; padding
            // copies 0 bytes (zero fill) from the valid base address.
            unsafe {
                let r = smem::ld_u32(self.srows.add(4 * (set * CHUNK + slot))) as i32;
                let (src, n) = if r >= 0 {
                    (index_k.add((r as usize * D + cc as usize * 8) * 2), 16)
                } else {
                    (index_k, 0)
                };
                cp_async::copy_16(at(kbuf, Self::D_U, slot, cc * 8), src, n);
            }
            v += GRAD_THREADS;
        }
        cp_async::commit_group();
    }
}
