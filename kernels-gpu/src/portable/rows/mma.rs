//! MMA role of the row kernel (`mma.sync` m16n8k16, fragments from
//! `ldmatrix`): S = q K^T for a warp's tile of heads x slots, dQ += dS K
//! and dK = dS^T q for the warp's D columns.

use super::body::{at, Row, SLOT_TILES};
use super::{CHUNK, MMA_K, MMA_M, MMA_N};
use crate::ptx::smem::SmemAddr;
use crate::ptx::{ldmatrix, mma, sync};

/// "col" B operands of `NQ` consecutive 8-column n-tiles starting at column
/// `col0` of `tile`, for reduction rows `row` (this lane's ldmatrix row:
/// `k0 + lj + (li & 1) * 8`): one transposed `ldmatrix` covers both
/// n-tiles when `NQ == 2`.
///
/// # Safety
/// Full warp; rows `k0..k0 + 16` and columns `col0..col0 + 8 * NQ` inside
/// the tile.
#[inline(always)]
unsafe fn col_operand<const NQ: usize>(
    tile: SmemAddr,
    cols: u32,
    row: u32,
    col0: u32,
    li: u32,
) -> [[u32; 2]; NQ] {
    let mut b = [[0u32; 2]; NQ];
    if NQ == 2 {
        // Matrices (k0, col0), (k0 + 8, col0), (k0, col0 + 8), (k0 + 8, col0 + 8).
        // SAFETY: forwarded.
        let r = unsafe { ldmatrix::x4_trans(at(tile, cols, row, col0 + (li >> 1) * 8)) };
        b[0] = [r[0], r[1]];
        b[NQ - 1] = [r[2], r[3]];
    } else {
        // SAFETY: forwarded.
        b[0] = unsafe { ldmatrix::x2_trans(at(tile, cols, row, col0)) };
    }
    b
}

impl<
        const H: usize,
        const D: usize,
        const MT: usize,
        const NQ: usize,
        const SHG: usize,
        const SMT: usize,
    > Row<'_, H, D, MT, NQ, SHG, SMT>
{
    /// S = Q K^T of K buffer `skc`: this warp's SMT*16 heads x SHG*8 slots.
    /// The 2D warp tiling reads each q row by GRAD_WARPS / SHG warps
    /// instead of all of them (shared-memory traffic is the limit here).
    #[inline(always)]
    pub(super) fn s_tile(&self, skc: SmemAddr) -> [[[f32; 4]; SHG]; SMT] {
        let (li, lj) = (self.li, self.lj);
        let mut s = [[[0.0f32; 4]; SHG]; SMT];
        for ks in 0..sync::opaque_u32(Self::D_U / MMA_K) {
            let k0 = ks * MMA_K;
            // SAFETY: every address is a 16-byte aligned row inside the q or
            // K tile (row < 64 or H, column + 8 <= D); full warp.
            unsafe {
                // B[k][n] = K[n0 + n][k0 + k]: matrices (n0, k0), (n0, k0 + 8).
                let mut bf = [[0u32; 2]; SHG];
                for (nt, b) in bf.iter_mut().enumerate() {
                    let n0 = self.s_base + nt as u32 * MMA_N;
                    *b = ldmatrix::x2(at(skc, Self::D_U, n0 + lj, k0 + (li & 1) * 8));
                }
                for (mt, acc) in s.iter_mut().enumerate() {
                    let h0 = self.h_base + mt as u32 * MMA_M;
                    // A = q rows h0..h0+16: matrices (h0, k0), (h0+8, k0), (h0, k0+8), (h0+8, k0+8).
                    let af = ldmatrix::x4(at(
                        self.sq,
                        Self::D_U,
                        h0 + lj + (li & 1) * 8,
                        k0 + (li >> 1) * 8,
                    ));
                    for nt in 0..SHG {
                        mma::mma_bf16_16816(&mut acc[nt], af, bf[nt]);
                    }
                }
            }
        }
        s
    }

    /// dQ += dS K (this warp's D columns, all heads) of K buffer `skc`.
    #[inline(always)]
    pub(super) fn dq(&self, skc: SmemAddr, acc_q: &mut [[[f32; 4]; NQ]; MT]) {
        let (li, lj) = (self.li, self.lj);
        for ks in 0..sync::opaque_u32(CHUNK / MMA_K) {
            let k0 = ks * MMA_K;
            // SAFETY: every address is a 16-byte aligned row inside the dS or
            // K tile; full warp.
            unsafe {
                // B[k][n] = K[k0 + k][dbase + n], transposed loads: matrices
                // (k0, d), (k0 + 8, d) for each of this warp's n-tiles d.
                let bf = col_operand::<NQ>(skc, Self::D_U, k0 + lj + (li & 1) * 8, self.dbase, li);
                for (mt, acc) in acc_q.iter_mut().enumerate() {
                    let h0 = mt as u32 * MMA_M;
                    let af = ldmatrix::x4(at(
                        self.sds,
                        CHUNK,
                        h0 + lj + (li & 1) * 8,
                        k0 + (li >> 1) * 8,
                    ));
                    for nq in 0..NQ {
                        mma::mma_bf16_16816(&mut acc[nq], af, bf[nq]);
                    }
                }
            }
        }
    }

    /// dK_chunk = dS^T Q (all chunk slots, this warp's D columns).
    #[inline(always)]
    pub(super) fn dk(&self) -> [[[f32; 4]; NQ]; SLOT_TILES] {
        let (li, lj) = (self.li, self.lj);
        let mut kacc = [[[0.0f32; 4]; NQ]; SLOT_TILES];
        for ks in 0..sync::opaque_u32(Self::H_U / MMA_K) {
            let k0 = ks * MMA_K;
            // SAFETY: every address is a 16-byte aligned row inside the dS or
            // q tile; full warp.
            unsafe {
                // B[k][n] = q[k0 + k][dbase + n], transposed loads.
                let bf =
                    col_operand::<NQ>(self.sq, Self::D_U, k0 + lj + (li & 1) * 8, self.dbase, li);
                for (mt, acc) in kacc.iter_mut().enumerate() {
                    // A[slot][h] = dS[h][slot], transposed loads: matrices
                    // (k0, s0), (k0, s0 + 8), (k0 + 8, s0), (k0 + 8, s0 + 8) of dS.
                    let s0 = mt as u32 * MMA_M;
                    let af = ldmatrix::x4_trans(at(
                        self.sds,
                        CHUNK,
                        k0 + lj + (li >> 1) * 8,
                        s0 + (li & 1) * 8,
                    ));
                    for nq in 0..NQ {
                        mma::mma_bf16_16816(&mut acc[nq], af, bf[nq]);
                    }
                }
            }
        }
        kacc
    }
}
