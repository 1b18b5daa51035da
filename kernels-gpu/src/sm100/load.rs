//! Stage-2 K-load role (warp 8, all 32 lanes). **Not executed.**
//!
//! Per row: lane 0 loads the row's q (two TMA tile boxes of H x 64 bf16,
//! 128-byte swizzle) into q buffer `r % 2` once the MMA role released it.
//! Per chunk: once K stage `s` is free, lane `l` takes slots `4l .. 4l + 4`:
//! reads their ids and grad_signal, writes the resolved key rows (-1 for
//! padding) and grad_signal into the stage's metadata, arrives on
//! `FULL[s]` (lane 0 also expects the stage's 32 KiB), and issues the two
//! `tile::gather4` loads (D columns 0..64 and 64..128) of its four rows.
//! Padding slots are marked invalid (-1) in the metadata and gather row 0
//! (`gather::tma_row`); the compute and reduce roles mask them out.

use super::budget::{K_STAGES, Q_STAGES, SM100_CHUNK, SMEM_K_STAGE, SMEM_Q_REGION};
use super::gather::{gather4_coords, tma_row, Ids};
use super::operands::gather4_dst;
use super::sched::slot;
use super::stage2::{Ctx, EMPTY, FULL, Q_EMPTY, Q_FULL};
use crate::params::FLAG_LOCAL_IDS;
use crate::ptx::{mbarrier, smem, sreg, sync, tma};

/// # Safety
/// Called by all 32 lanes of the load warp under the stage-2 launch contract.
#[inline(always)]
pub(super) unsafe fn run<const NCH: u32, const H: u32>(c: &Ctx<'_>) {
    let lane = sreg::thread_idx_x() % 32;
    let p = c.p;
    let conv = if p.flags & FLAG_LOCAL_IDS != 0 {
        Ids::Local
    } else {
        Ids::Global
    };
    let oob = (p.batch * p.seq_k) as i32;
    let topk = NCH * SM100_CHUNK;
    let ids = p.topk_indices as *const i32;
    let attn = p.attn_score as *const f32;
    let (mut n, mut r) = (0u32, 0u32);
    let mut row = c.cta;
    while row < c.rows {
        let b = row / p.seq_q;
        // SAFETY (whole row): barriers initialised in the prologue; waits
        // follow `sched::slot`; every address lies in this row's slots or
        // in the stage/buffer the barriers hand to this role.
        unsafe {
            let qs = slot(r, Q_STAGES);
            if lane == 0 {
                if let Some(ph) = qs.empty_parity {
                    mbarrier::wait_parity(c.bar(Q_EMPTY + qs.index), ph);
                }
                let bar = c.bar(Q_FULL + qs.index);
                tma::arrive_expect_tx(bar, 2 * H * 128);
                let dst = c.q_buf(qs.index);
                let y = (row * H) as i32;
                tma::load_2d(dst, c.q_map, 0, y, bar);
                tma::load_2d(dst.add(SMEM_Q_REGION), c.q_map, 64, y, bar);
            }
            for k in 0..NCH {
                let ks = slot(n, K_STAGES);
                if let Some(ph) = ks.empty_parity {
                    mbarrier::wait_parity(c.bar(EMPTY + ks.index), ph);
                }
                let first = row as usize * topk as usize + (k * SM100_CHUNK + 4 * lane) as usize;
                let mut id4 = [0i32; 4];
                for (i, id) in id4.iter_mut().enumerate() {
                    *id = *ids.add(first + i);
                }
                let coords = gather4_coords(&id4, b, p.batch, p.seq_k, conv);
                let rows = [
                    tma_row(coords[0], oob),
                    tma_row(coords[1], oob),
                    tma_row(coords[2], oob),
                    tma_row(coords[3], oob),
                ];
                for (i, &y) in coords.iter().enumerate() {
                    let t = 4 * lane + i as u32;
                    let resolved = if y == oob { -1 } else { y };
                    smem::st_u32(c.meta_row(ks.index, t), resolved as u32);
                    smem::st_f32(c.meta_gs(ks.index, t), *attn.add(first + i));
                }
                let full = c.bar(FULL + ks.index);
                if lane == 0 {
                    tma::arrive_expect_tx(full, SMEM_K_STAGE);
                } else {
                    mbarrier::arrive(full);
                }
                // Every arrival (so the expected bytes) precedes every
                // gather's completion.
                sync::warp_sync();
                let stage = c.k_stage(ks.index);
                for half in 0..2u32 {
                    tma::gather4(
                        stage.add(gather4_dst(lane, half)),
                        c.k_map as *const u8,
                        (64 * half) as i32,
                        rows,
                        full,
                    );
                }
                n += 1;
            }
        }
        r += 1;
        row += c.ctas;
    }
}
