//! Row items: dQ and d_weights of one query row per warpgroup, over the
//! key tiles of its visible keys (module note of `super`).

use super::ctx::Ctx;
use super::{desc, gate, load, BLOCK_BYTES, GLOBAL_ROW_BYTES, HEADS, ITEM_ROWS, TILE_KEYS};
use crate::abi::FLAG_DW_F32;
use crate::ptx::cvt::{bf16_to_f32, pack_bf16x2};
use crate::ptx::{cp_async, smem, sync, wgmma};

/// Runs the row item `[ROWS, row0, nrows, key_start, tiles]`.
///
/// # Safety
/// The kernel's launch contract; every thread of the CTA calls it.
pub(super) unsafe fn run(c: &Ctx<'_>, row0: u32, nrows: u32, key_start: u32, tiles: u32) {
    let p = c.p;
    // Whether this warpgroup has a row (warpgroup-uniform); a warpgroup
    // without one still loads and meets the barriers.
    let me = c.wg < nrows;
    let row = row0 + c.wg.min(nrows - 1);
    let (warp, lane) = (c.t / 32, c.t % 32);
    let (g, c2) = (lane / 4, 2 * (lane % 4));
    // SAFETY: rows of the item are query rows (launch contract).
    let vis = |k: u32| unsafe { *(p.visible as *const u32).add((row0 + k) as usize) };
    // Visibility grows with the row inside a batch: the last row of the
    // item is the longest.
    let longest = vis(nrows - 1);
    let mine = if me { vis(c.wg) } else { 0 };
    let (q, k) = (p.index_q as *const u8, p.index_k as *const u8);
    // The grad_signal word this thread copies per tile (threads below
    // ITEM_ROWS * 64: row `tid / 64`, key `tid % 64` of the tile) and the
    // limit of its row (0: none).
    let (gr, gj) = (c.tid / TILE_KEYS, c.tid % TILE_KEYS);
    let glim = if gr < nrows { vis(gr) } else { 0 };
    let gsrc = load::gs_src(c, row0 + gr.min(nrows - 1), gj);
    let ksrc = k.wrapping_add(key_start as usize * GLOBAL_ROW_BYTES as usize);
    // K tile `t` into stage `t` (keys past the longest row zero-filled)
    // and the rows' grad_signal of its keys.
    let issue = |t: u32| {
        let valid = longest.saturating_sub(TILE_KEYS * t).min(TILE_KEYS);
        let tile_bytes = (TILE_KEYS * t) as usize * GLOBAL_ROW_BYTES as usize;
        // SAFETY: keys below `longest` are keys of the batch; the stage
        // is free (its readers met the barrier of this iteration).
        unsafe {
            load::tile(
                c.stage(t),
                ksrc.add(tile_bytes),
                k,
                valid,
                c.tid,
                crate::abi::DENSE_TILE_THREADS,
            );
            if c.tid < ITEM_ROWS * TILE_KEYS {
                let ok = TILE_KEYS * t + gj < glim;
                load::gs(
                    c,
                    t,
                    c.tid,
                    gsrc.wrapping_add(4 * (TILE_KEYS * t) as usize),
                    ok,
                );
            }
        }
    };
    if tiles > 0 {
        if me {
            let at = row as usize * (HEADS * GLOBAL_ROW_BYTES) as usize;
            // SAFETY: the row's q, 64 rows of 256 bytes.
            unsafe { load::tile(c.fixed(c.wg), q.add(at), q, HEADS, c.t, 128) };
        }
        issue(0);
    }
    cp_async::commit_group();
    let wt = p.weights as *const u16;
    let head = |h: u32| (row * HEADS + 16 * warp + g + 8 * h) as usize;
    // SAFETY: this row's weights.
    let w = unsafe { [bf16_to_f32(*wt.add(head(0))), bf16_to_f32(*wt.add(head(1)))] };
    let (mut dq0, mut dq1, mut dw) = ([0.0f32; 32], [0.0f32; 32], [0.0f32; 2]);
    // S of the current tile (loop-carried: each product overwrites it).
    let mut s = [0.0f32; 32];
    let mut t = 0;
    let n = sync::opaque_u32(tiles);
    while t < n {
        // SAFETY: every thread runs the same trip count.
        unsafe { c.landed() };
        if t + 1 < n {
            issue(t + 1);
        }
        cp_async::commit_group();
        if me {
            let st = c.stage(t);
            let gs = load::gs_at(c, t, TILE_KEYS * c.wg);
            // SAFETY: whole warpgroup; q and K tile `t` landed; the
            // grad_signal words are this row's (landed).
            unsafe {
                wgmma::s_m64n64_k128(&mut s, desc(c.fixed(c.wg).0, 16), desc(st.0, 16));
                let a = gate::rows(
                    &s,
                    p.sm_scale,
                    w,
                    |j| smem::ld_v2_f32(gs.add(4 * (8 * j + c2))),
                    mine.saturating_sub(TILE_KEYS * t),
                    c2,
                    &mut dw,
                );
                wgmma::rs_m64n128_k64(&mut dq0, &mut dq1, &a, desc(st.0, BLOCK_BYTES));
            }
        }
        t += 1;
    }
    // SAFETY: whole warps (no lane-dependent branch above).
    let dw = unsafe { [sync::quad_sum_f32(dw[0]), sync::quad_sum_f32(dw[1])] };
    if me {
        // SAFETY: this row's outputs, written by this warpgroup only.
        unsafe { store(c, &dq0, &dq1, dw, head) };
    }
}

/// Writes the row's dQ (`sm_scale` times the sums, bf16 pairs) and this
/// quad's d_weights (lane 0 of each quad).
///
/// # Safety
/// `head(h)` indexes a query row of the launch (this thread's head `h`);
/// the row's outputs are this warpgroup's.
#[inline(always)]
unsafe fn store(
    c: &Ctx<'_>,
    dq0: &[f32; 32],
    dq1: &[f32; 32],
    dw: [f32; 2],
    head: impl Fn(u32) -> usize,
) {
    let p = c.p;
    let lane = c.t % 32;
    let c2 = 2 * (lane % 4);
    let out = p.d_index_q as *mut u32;
    for blk in 0..2usize {
        // (A select, not an array of references: that would live in
        // local memory.)
        let acc = if blk == 0 { dq0 } else { dq1 };
        for j in 0..8u32 {
            for h in 0..2u32 {
                let r = (4 * j + 2 * h) as usize;
                let d = 64 * blk + (8 * j + c2) as usize;
                let v = pack_bf16x2(p.sm_scale * acc[r], p.sm_scale * acc[r + 1]);
                // SAFETY: element (head, d) of the row's dQ, 4-byte
                // aligned (d even, d_index_q 4-byte aligned).
                unsafe { *out.add((head(h) * 128 + d) / 2) = v };
            }
        }
    }
    if lane % 4 == 0 {
        for h in 0..2u32 {
            let (at, v) = (head(h), if h == 0 { dw[0] } else { dw[1] });
            // SAFETY: the row's d_weights element of this head.
            unsafe {
                if p.flags & FLAG_DW_F32 != 0 {
                    *(p.d_weights as *mut f32).add(at) = v;
                } else {
                    *(p.d_weights as *mut u16).add(at) = pack_bf16x2(v, 0.0) as u16;
                }
            }
        }
    }
}
