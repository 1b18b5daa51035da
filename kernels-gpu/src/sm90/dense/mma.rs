//! A consumer warpgroup's products over an item's streamed tiles, the
//! same for both item kinds: per tile `t`, S(t) = A B(t)^T with A the
//! consumer's fixed tile (its first 64 columns held in registers as the
//! A fragments, read once per item), the gate (the caller's) on S(t), then
//! `[D0 D1] += gate(S(t)) B(t)`. S(t + 1) is issued before S(t)'s gate,
//! so the tensor cores run it while the gate does; the product of tile
//! `t` completes behind the next tile's S, and a buffer is released once
//! the product that reads it completed.
//!
//! Each step waits twice with `wait_group 1`: after issuing the next S
//! (completing the previous product, so its buffer can be released) and
//! after issuing its product (completing the next S, so the next gate
//! finds it done). Every step commits the same two groups: the last
//! tile's step issues a spare S on its own tile, which nothing reads.
//! ptxas serialises every `wgmma` of the kernel unless it can match each
//! read of an S to a wait that completed it: it did not with a step that
//! skips its S on some paths, nor with S(t + 1) completed only by the
//! next step's first wait.

use super::ctx::Ctx;
use super::{desc, frag_at, tile_at, BLOCK_BYTES};
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{sreg, wgmma};

/// This thread's register fragments of the first 64 columns of the tile
/// at `tile` as the A operand of S (`super::frag_at` for each K step of
/// 16 columns).
///
/// # Safety
/// A landed tile of the layout; whole warpgroup (any thread order).
#[inline(always)]
unsafe fn fragments(tile: SmemAddr) -> [u32; 16] {
    let t = sreg::thread_idx_x() % 128;
    core::array::from_fn(|i| {
        let (k, r) = (i as u32 / 4, i as u32 % 4);
        let (row, col) = frag_at(t, r);
        // SAFETY: two bf16 of the tile (col even: 4-byte aligned).
        unsafe { smem::ld_u32(tile.add(tile_at(0, row, 16 * k + col))) }
    })
}

/// Runs the products over streamed tiles `0..n` (`n >= 1`) with `a` the
/// fixed tile; `gate(t, s)` turns S(t) into the bf16 A operand of the
/// second product. Afterwards `d0` / `d1` hold the sums and every tile is
/// released.
///
/// # Safety
/// Every thread of an active consumer warpgroup (warpgroup-uniform `n`);
/// the fixed tile landed; the producer fills tiles `0..n`.
#[inline(always)]
pub(super) unsafe fn pipeline(
    c: &Ctx<'_>,
    a: SmemAddr,
    n: u32,
    d0: &mut [f32; 32],
    d1: &mut [f32; 32],
    mut gate: impl FnMut(u32, &[f32; 32]) -> [u32; 16],
) {
    // SAFETY: the fixed tile landed (the caller's contract).
    let a = (unsafe { fragments(a) }, desc(a.0 + BLOCK_BYTES, 16));
    // SAFETY: whole warpgroup; `n` is warpgroup-uniform.
    let n = unsafe { crate::ptx::sync::uniform_u32(n) };
    // S of the current and of the next tile, trading places every tile:
    // the loop runs two tiles per trip so that neither is ever copied
    // while the tensor cores write it.
    let (mut s0, mut s1) = ([0.0f32; 32], [0.0f32; 32]);
    // Every accumulator is set before the first product is issued.
    wgmma::pin_m64n64(&mut s0);
    wgmma::pin_m64n64(&mut s1);
    wgmma::pin_m64n64(d0);
    wgmma::pin_m64n64(d1);
    // SAFETY: tile 0 exists (n >= 1); the caller's contract.
    unsafe {
        c.wait_full(0);
        wgmma::issue_rs_s_m64n64_k128(&mut s0, &a.0, a.1, desc(c.stage(0).0, 16));
    }
    let mut t = 0;
    while t + 1 < n {
        // SAFETY: forwarded; the trip count is warpgroup-uniform.
        unsafe {
            step(c, &a, t, n, &mut s0, &mut s1, d0, d1, &mut gate);
            step(c, &a, t + 1, n, &mut s1, &mut s0, d0, d1, &mut gate);
        }
        t += 2;
    }
    if t < n {
        // SAFETY: as above.
        unsafe { step(c, &a, t, n, &mut s0, &mut s1, d0, d1, &mut gate) };
    }
    // SAFETY: completes the last product; then its buffer is free.
    unsafe {
        wgmma::wait_0_m64n128(d0, d1);
        c.release(n - 1);
    }
}

/// Tile `t`: issue S(t + 1) into `next` (the spare S of tile `t` itself
/// for the last tile), wait for the product of tile `t - 1` (whose buffer
/// is released) and S(t) in `cur`, gate S(t), issue the product of tile
/// `t`, wait for S(t + 1).
///
/// # Safety
/// As [`pipeline`]; S(t) was issued into `cur`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn step(
    c: &Ctx<'_>,
    a: &([u32; 16], u64),
    t: u32,
    n: u32,
    cur: &mut [f32; 32],
    next: &mut [f32; 32],
    d0: &mut [f32; 32],
    d1: &mut [f32; 32],
    gate: &mut impl FnMut(u32, &[f32; 32]) -> [u32; 16],
) {
    let ahead = if t + 1 < n { t + 1 } else { t };
    // SAFETY: whole warpgroup (uniform branches); the producer fills tile
    // `t + 1 < n` (tile `t` is full and held until its product completed);
    // the groups pending are (S(t) at the first step), the product of
    // `t - 1` and S(ahead), so `wait_group 1` completes all but S(ahead).
    unsafe {
        if ahead > t {
            c.wait_full(ahead);
        }
        wgmma::issue_rs_s_m64n64_k128(next, &a.0, a.1, desc(c.stage(ahead).0, 16));
        wgmma::wait_1_m64n64(cur);
        if t > 0 {
            c.release(t - 1);
        }
    }
    let g = gate(t, cur);
    // SAFETY: tile `t` is full; the accumulators are touched by nothing
    // else until the final wait; the groups pending are S(ahead) and the
    // product, so `wait_group 1` completes S(ahead).
    unsafe {
        wgmma::issue_rs_m64n128_k64(d0, d1, &g, desc(c.stage(t).0, BLOCK_BYTES));
        wgmma::wait_1_m64n64(next);
    }
}
