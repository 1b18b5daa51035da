//! The loads of the dense tile kernel, all by `cp.async` into the
//! swizzled tiles and the stage scalars (grad_signal), except a key item's
//! weights (2-byte aligned in global memory: plain loads, stored a row
//! ahead).

use super::ctx::Ctx;
use super::{BLOCK_BYTES, GLOBAL_ROW_BYTES, SMEM};
use crate::ptx::cp_async;
use crate::ptx::smem::SmemAddr;
use crate::sm90::swizzle;

/// 16-byte vectors of one 64-row tile.
const TILE_VECS: u32 = 64 * GLOBAL_ROW_BYTES / 16;
/// 16-byte vectors per global row.
const ROW_VECS: u32 = GLOBAL_ROW_BYTES / 16;

/// Copies the 64 global rows at `src` (256 bytes apart) into the tile at
/// `dst`, rows `valid..` zero-filled, by the `n` threads `lane = 0..n`
/// (vectors `lane, lane + n, ...`).
///
/// # Safety
/// `src` rows `0..valid` are inside a 16-byte aligned bf16 tensor starting
/// at `any` (a valid address for the zero-fill copies); `dst` is a tile of
/// the layout that no one reads until this thread's copies landed
/// ([`Ctx::landed`]).
#[inline(always)]
pub(super) unsafe fn tile(
    dst: SmemAddr,
    src: *const u8,
    any: *const u8,
    valid: u32,
    lane: u32,
    n: u32,
) {
    let mut v = lane;
    while v < TILE_VECS {
        let (row, ch) = (v / ROW_VECS, v % ROW_VECS);
        let at = dst.add((ch / 8) * BLOCK_BYTES + swizzle(row, (ch % 8) * 16));
        let ok = row < valid;
        // SAFETY: the caller's contract; rows past `valid` copy nothing
        // from `any`.
        unsafe {
            let from = if ok {
                src.add((row * GLOBAL_ROW_BYTES + ch * 16) as usize)
            } else {
                any
            };
            cp_async::copy_16(at, from, if ok { 16 } else { 0 })
        };
        v += n;
    }
}

/// Copies the grad_signal element at `src` into word `slot` of stage
/// `s`'s grad_signal, or zero when `!ok`.
///
/// # Safety
/// `ok` only for an element inside grad_signal; the slot is read only
/// after the copy landed.
#[inline(always)]
pub(super) unsafe fn gs(c: &Ctx<'_>, s: u32, slot: u32, src: *const u8, ok: bool) {
    let from = if ok {
        src
    } else {
        c.p.grad_signal as *const u8
    };
    // SAFETY: the caller's contract.
    unsafe {
        cp_async::copy_4(
            c.stage(s).add(SMEM.gs + 4 * slot),
            from,
            if ok { 4 } else { 0 },
        )
    }
}

/// The address of grad_signal element `col` of row `row`.
#[inline(always)]
pub(super) fn gs_src(c: &Ctx<'_>, row: u32, col: u32) -> *const u8 {
    let at = 4 * (row as usize * c.p.cols as usize + col as usize);
    (c.p.grad_signal as *const u8).wrapping_add(at)
}

/// Stage `s`'s grad_signal word `slot` (read it once [`gs`]'s copy
/// landed).
#[inline(always)]
pub(super) fn gs_at(c: &Ctx<'_>, s: u32, slot: u32) -> SmemAddr {
    c.stage(s).add(SMEM.gs + 4 * slot)
}
