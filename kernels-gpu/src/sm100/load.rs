//! Stage-2 K-load role (warp 8, all 32 lanes). **Not executed.**
//!
//! Its order of operations is `proto::load`. Per row: lane 0 loads the
//! row's q (two TMA tile boxes of H x 64 bf16, 128-byte swizzle) into q
//! buffer `r % 2` once the MMA role released it. Per chunk: once K stage
//! `s` is free, lane `l` takes slots `4l .. 4l + 4`: reads their ids (i32, or i64
//! narrowed by `score::load_id`) and
//! grad_signal, writes the resolved key rows (-1 for padding) and
//! grad_signal into the stage's metadata, arrives on `FULL[s]` (lane 0 also
//! expects the stage's 32 KiB), and issues the two `tile::gather4` loads
//! (D columns 0..64 and 64..128) of its four rows. Padding slots are
//! marked invalid (-1) in the metadata and gather row -1
//! (`gather::PAD_ROW`, via `gather::tma_row`), which the TMA unit
//! zero-fills, so their K rows are zeros and contribute nothing to dQ even
//! when `index_k` holds non-finite values; the compute and reduce roles
//! mask them out.

use super::budget::{SM100_CHUNK, SMEM_Q_REGION};
use super::ctx::Ctx;
use super::dev::Dev;
use super::gather::{gather4_coords, tma_row, Ids};
use super::operands::gather4_dst;
use super::proto::{self, LoadWork, Rows};
use crate::abi::FLAG_LOCAL_IDS;
use crate::ptx::{smem, tma};
use crate::score::load_id;

/// The load warp's state for `NCH` chunks per row and `H` heads.
pub(super) struct Load<const NCH: u32, const H: u32> {
    /// Key-id convention of the plan.
    conv: Ids,
    /// `B * S_k`: the coordinate `gather4_coords` gives padding.
    oob: i32,
    /// Scores (grad_signal) of all rows (the key ids are read through
    /// `score::load_id`, i32 or i64 by the flag).
    attn: *const f32,
    /// Batch of the current row.
    b: u32,
    /// The lane's four gather rows of the current chunk.
    rows: [i32; 4],
}

impl<const NCH: u32, const H: u32> LoadWork for Dev<'_, Load<NCH, H>> {
    #[inline(always)]
    fn begin_row(&mut self, row: u32) {
        self.role.b = row / self.c.p.seq_q;
    }

    #[inline(always)]
    fn load_q(&mut self, row: u32, buf: u32, half: u32, bar: u32, _phase: u32) {
        let c = self.c;
        // SAFETY: q buffer `buf` is this role's (the skeleton waited for
        // its release); the box (rows `row * H ..`, D columns `64 half ..`)
        // lies in the q map; `bar` expects the bytes.
        unsafe {
            tma::load_2d(
                c.q_buf(buf).add(half * SMEM_Q_REGION),
                c.q_map,
                (64 * half) as i32,
                (row * H) as i32,
                c.bar(bar),
            )
        };
    }

    #[inline(always)]
    fn fill_meta(&mut self, row: u32, chunk: u32, stage: u32) {
        let (c, lane) = (self.c, self.lane);
        let (p, s) = (c.p, &mut self.role);
        let topk = NCH * SM100_CHUNK;
        let first = row as usize * topk as usize + (chunk * SM100_CHUNK + 4 * lane) as usize;
        let mut id4 = [0i32; 4];
        // SAFETY: slots `first .. first + 4` lie in row `row` of the ids
        // and scores (topk = 128 NCH slots per row); stage `stage`'s
        // metadata is this role's (the skeleton waited for its release).
        unsafe {
            for (i, id) in id4.iter_mut().enumerate() {
                *id = load_id(p, first + i);
            }
            let coords = gather4_coords(&id4, s.b, p.batch, p.seq_k, s.conv);
            let oob = s.oob;
            s.rows = [
                tma_row(coords[0], oob),
                tma_row(coords[1], oob),
                tma_row(coords[2], oob),
                tma_row(coords[3], oob),
            ];
            // The gather row is also the resolved key row of the
            // metadata: `PAD_ROW` (negative) marks padding there.
            for (i, &y) in s.rows.iter().enumerate() {
                let t = 4 * lane + i as u32;
                smem::st_u32(c.meta_row(stage, t), y as u32);
                smem::st_f32(c.meta_gs(stage, t), *s.attn.add(first + i));
            }
        }
    }

    #[inline(always)]
    fn gather_k(&mut self, stage: u32, half: u32, bar: u32, _phase: u32) {
        let c = self.c;
        // SAFETY: K stage `stage` is this role's (the skeleton waited for
        // its release); each row is a row of the map or `PAD_ROW`, whose
        // box the TMA unit zero-fills and still writes in full (`tma_row`),
        // so `bar` receives the bytes it expects.
        unsafe {
            tma::gather4(
                c.k_stage(stage).add(gather4_dst(self.lane, half)),
                c.k_map as *const u8,
                (64 * half) as i32,
                self.role.rows,
                c.bar(bar),
            )
        };
    }
}

/// # Safety
/// Called by all 32 lanes of the load warp under the stage-2 launch contract.
#[inline(always)]
pub(super) unsafe fn run<const NCH: u32, const H: u32>(c: &Ctx<'_>) {
    let p = c.p;
    let conv = if p.flags & FLAG_LOCAL_IDS != 0 {
        Ids::Local
    } else {
        Ids::Global
    };
    let role = Load::<NCH, H> {
        conv,
        oob: (p.batch * p.seq_k) as i32,
        attn: p.attn_score as *const f32,
        b: 0,
        rows: [0; 4],
    };
    // SAFETY: forwarded launch contract; this is the load warp.
    let mut m = unsafe { Dev::new(c, role) };
    let rows = Rows {
        first: c.cta,
        step: c.ctas,
        end: c.rows,
    };
    proto::load(&mut m, rows, NCH, H);
}
