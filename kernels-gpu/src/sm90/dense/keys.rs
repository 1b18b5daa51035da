//! Key items, consumer side: dK of 64 keys per consumer warpgroup, over
//! a run of the query rows that see them (module note of `super`).

use super::ctx::Ctx;
use super::{gate, mma, turns, SMEM, TILE_KEYS};
use crate::ptx::cvt::bf16_to_f32;
use crate::ptx::global::red_add_v2_f32;
use crate::ptx::smem;

/// Runs the key item `[KEYS, key_start, col0, nkeys, row_begin, row_end,
/// chain, turn]` (its words after the kind) on this consumer's keys
/// `col0 + 64 wg ..` (if it has any); with `DET`, adding them in turn
/// `turn` of chain `chain + wg` (`super::turns`).
///
/// # Safety
/// The kernel's launch contract; every thread of a consumer warpgroup
/// calls it.
#[inline(always)]
pub(super) unsafe fn run<const DET: bool>(c: &Ctx<'_>, item: [u32; 7]) {
    let [key_start, col0, nkeys, row_begin, row_end, chain, turn] = item;
    if TILE_KEYS * c.wg >= nkeys || row_end <= row_begin {
        return;
    }
    let p = c.p;
    let (warp, lane) = (c.t / 32, c.t % 32);
    let (g, c2) = (lane / 4, 2 * (lane % 4));
    let slot = TILE_KEYS * c.wg + 16 * warp + g;
    let mine = col0 + slot;
    let (mut dk0, mut dk1) = ([0.0f32; 32], [0.0f32; 32]);
    // SAFETY: the producer loads the fixed K tiles and one q tile per
    // row; whole warpgroup; a row's grad_signal and weight words are
    // stored before its tile's "full" phase.
    unsafe {
        c.wait_fixed();
        mma::pipeline(
            c,
            c.fixed(c.wg),
            row_end - row_begin,
            &mut dk0,
            &mut dk1,
            |t, s| {
                let st = c.stage(t);
                let l = smem::ld_u32(st.add(SMEM.lim));
                let gs = [
                    smem::ld_f32(st.add(SMEM.gs + 4 * slot)),
                    smem::ld_f32(st.add(SMEM.gs + 4 * (slot + 8))),
                ];
                let w = |j: u32| {
                    let u = smem::ld_u32(st.add(SMEM.w + 2 * (8 * j + c2)));
                    [bf16_to_f32(u as u16), bf16_to_f32((u >> 16) as u16)]
                };
                // Whether the row sees all of this warpgroup's keys
                // (uniform in the warpgroup).
                if l >= col0 + TILE_KEYS * (c.wg + 1) {
                    gate::keys::<false>(s, p.sm_scale, gs, [true; 2], w)
                } else {
                    gate::keys::<true>(s, p.sm_scale, gs, [mine < l, mine + 8 < l], w)
                }
            },
        );
    }
    // SAFETY: this warpgroup's keys of the item, written by it only;
    // with DET every thread of the warpgroup takes the turn (the item has
    // rows, so every run of its chain has this warpgroup's keys too).
    unsafe {
        if DET {
            turns::wait(c, chain + c.wg, turn);
        }
        store(c, key_start + col0, nkeys, &dk0, &dk1);
        if DET {
            turns::pass(c, chain + c.wg, turn);
        }
    }
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
