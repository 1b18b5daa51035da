//! Key items: dK of 64 keys per warpgroup, over every query row that sees
//! one of them (module note of `super`).

use super::ctx::Ctx;
use super::{
    desc, gate, load, BLOCK_BYTES, GLOBAL_ROW_BYTES, HEADS, ITEM_KEYS, SMEM, TILE_KEYS, WARPGROUPS,
};
use crate::abi::DENSE_TILE_THREADS;
use crate::ptx::cvt::bf16_to_f32;
use crate::ptx::global::red_add_v2_f32;
use crate::ptx::{cp_async, smem, sync, wgmma};

/// Threads that stage a row's weights: one 32-bit word (two heads) each.
const W_THREADS: u32 = HEADS / 2;
/// The first of them: past the threads that issue the grad_signal
/// copies where the CTA has room, else the second warpgroup's first warp.
const W_FIRST: u32 = if ITEM_KEYS + W_THREADS <= DENSE_TILE_THREADS {
    ITEM_KEYS
} else {
    128
};

/// Runs the key item `[KEYS, key_start, col0, nkeys, row_begin, row_end]`.
///
/// # Safety
/// The kernel's launch contract; every thread of the CTA calls it.
pub(super) unsafe fn run(
    c: &Ctx<'_>,
    key_start: u32,
    col0: u32,
    nkeys: u32,
    row_begin: u32,
    row_end: u32,
) {
    let p = c.p;
    let (warp, lane) = (c.t / 32, c.t % 32);
    let (g, c2) = (lane / 4, 2 * (lane % 4));
    let k = p.index_k as *const u8;
    let (q, wt) = (p.index_q as *const u8, p.weights as *const u16);
    // SAFETY: rows of the item are query rows (launch contract).
    let vis = |i: u32| unsafe { *(p.visible as *const u32).add(i as usize) };
    for i in 0..WARPGROUPS {
        let first = (key_start + col0 + TILE_KEYS * i) as usize;
        let valid = nkeys.saturating_sub(TILE_KEYS * i).min(TILE_KEYS);
        // SAFETY: keys below `nkeys` are keys of the batch.
        unsafe {
            load::tile(
                c.fixed(i),
                k.add(first * GLOBAL_ROW_BYTES as usize),
                k,
                valid,
                c.tid,
                DENSE_TILE_THREADS,
            )
        };
    }
    // Query row `i` into stage `s`: its q tile and the grad_signal of the
    // item's keys.
    let issue = |s: u32, i: u32| {
        let l = vis(i);
        // SAFETY: a query row of the launch; the stage is free (its
        // readers met the barrier of this iteration).
        unsafe {
            let at = i as usize * (HEADS * GLOBAL_ROW_BYTES) as usize;
            load::tile(c.stage(s), q.add(at), q, HEADS, c.tid, DENSE_TILE_THREADS);
            if c.tid < ITEM_KEYS {
                let col = col0 + c.tid;
                load::gs(c, s, c.tid, load::gs_src(c, i, col), col < l);
            }
        }
    };
    // This thread's word of row `i`'s weights (W_THREADS threads).
    let stager = c.tid >= W_FIRST && c.tid < W_FIRST + W_THREADS;
    let wword = |i: u32| -> u32 {
        let at = (i * HEADS + 2 * (c.tid - W_FIRST)) as usize;
        // SAFETY: two weights of a query row (callers are stagers).
        unsafe { *wt.add(at) as u32 | (*wt.add(at + 1) as u32) << 16 }
    };
    let put_w = |s: u32, v: u32| {
        // SAFETY: the stager's own word of the stage, free as above.
        unsafe { smem::st_u32(c.stage(s).add(SMEM.w + 4 * (c.tid - W_FIRST)), v) };
    };
    let rows = sync::opaque_u32(row_end - row_begin);
    if rows > 0 {
        issue(0, row_begin);
        if stager {
            put_w(0, wword(row_begin));
        }
    }
    cp_async::commit_group();
    let (mut dk0, mut dk1) = ([0.0f32; 32], [0.0f32; 32]);
    let mine = col0 + TILE_KEYS * c.wg + 16 * warp + g;
    let mut l = if rows > 0 { vis(row_begin) } else { 0 };
    // S^T of the current row (loop-carried: each product overwrites it).
    let mut s = [0.0f32; 32];
    let mut r = 0;
    while r < rows {
        // SAFETY: every thread runs the same trip count.
        unsafe { c.landed() };
        let i = row_begin + r;
        let (mut wnext, mut lnext) = (0, 0);
        if r + 1 < rows {
            issue(r + 1, i + 1);
            if stager {
                wnext = wword(i + 1);
            }
            lnext = vis(i + 1);
        }
        cp_async::commit_group();
        let st = c.stage(r);
        let slot = TILE_KEYS * c.wg + 16 * warp + g;
        // SAFETY: whole warpgroup; the K tiles and the row's q landed;
        // the grad_signal and weight words of the row landed or were
        // stored before the barrier.
        unsafe {
            wgmma::s_m64n64_k128(&mut s, desc(c.fixed(c.wg).0, 16), desc(st.0, 16));
            let gs = [
                smem::ld_f32(load::gs_at(c, r, slot)),
                smem::ld_f32(load::gs_at(c, r, slot + 8)),
            ];
            let a = gate::keys(&s, p.sm_scale, gs, [mine < l, mine + 8 < l], |j| {
                let u = smem::ld_u32(st.add(SMEM.w + 2 * (8 * j + c2)));
                [bf16_to_f32(u as u16), bf16_to_f32((u >> 16) as u16)]
            });
            wgmma::rs_m64n128_k64(&mut dk0, &mut dk1, &a, desc(st.0, BLOCK_BYTES));
        }
        if r + 1 < rows && stager {
            put_w(r + 1, wnext);
        }
        l = lnext;
        r += 1;
    }
    // SAFETY: this warpgroup's keys of the item, written by it only.
    unsafe { store(c, key_start + col0, nkeys, &dk0, &dk1) };
}

/// Adds this warpgroup's dK sums of the keys below `nkeys` (times
/// `sm_scale`) to the accumulator, `key0` the key row of the item's first
/// key: one reduction per element per item.
///
/// # Safety
/// The item's keys are key rows of the launch.
#[inline(always)]
unsafe fn store(c: &Ctx<'_>, key0: u32, nkeys: u32, dk0: &[f32; 32], dk1: &[f32; 32]) {
    let p = c.p;
    let (warp, lane) = (c.t / 32, c.t % 32);
    let c2 = 2 * (lane % 4);
    for h in 0..2u32 {
        let local = TILE_KEYS * c.wg + 16 * warp + lane / 4 + 8 * h;
        if local >= nkeys {
            continue;
        }
        let row = (key0 + local) as usize * 128;
        for blk in 0..2usize {
            let acc = if blk == 0 { dk0 } else { dk1 };
            for j in 0..8u32 {
                let r = (4 * j + 2 * h) as usize;
                let d = row + 64 * blk + (8 * j + c2) as usize;
                let (x, y) = (p.sm_scale * acc[r], p.sm_scale * acc[r + 1]);
                // SAFETY: elements (key, d) and (key, d + 1) of the
                // accumulator: an 8-byte aligned pair (d even, 16-byte
                // aligned tensor).
                unsafe { red_add_v2_f32((p.dk_accum as *mut f32).add(d), [x, y]) };
            }
        }
    }
}
