//! dK of the wgmma kernels: staged in shared memory (f32, scaled) with the
//! chunk's key rows, then added to the f32 accumulator with coalesced
//! `red.global.add.v4.f32` (one 512-byte row per warp instruction; measured
//! faster than `cp.reduce.async.bulk` and than reductions straight from the
//! MMA fragments). In the paired kernel also the pair fusion: where both
//! halves' rows select the same key in a slot, that slot is reduced once,
//! as the sum of both staged rows; a fused item (every slot the same) has
//! one staging, of the summed product. D = 64 (`SPLIT`): warpgroup 1
//! stages the whole dK, and each warp instruction reduces two 256-byte
//! staged rows, one per half-warp (no paired kernel; with H = 128 every
//! item is fused).

use super::ctx::{Ctx, HEAD_HALVES};
use super::{CHUNK, DIM, DK_STRIDE, SMEM, SPLIT, THREADS};
use crate::det::DetTables;
use crate::sm90::det;
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{global, sreg, sync};

const WARPS: u32 = THREADS / 32;
/// Staged dK rows each warp reduces per chunk (a power of two: the XOR in
/// the reduction loop permutes them).
pub(super) const ROWS_PER_WARP: u32 = CHUNK / WARPS;
const _: () = assert!(ROWS_PER_WARP.is_power_of_two());
/// Staged dK rows (of its eight) each warp reduces right after issuing the
/// next item's S; the rest go after that item's dS, before its barrier B2,
/// and drain while its dQ and dK products run (fewer reductions in one
/// burst). The split was chosen by measurement against the other splits
/// (docs/architecture.md, "Measurements behind code choices").
pub(super) const RED_FIRST: u32 = 4;
const _: () = assert!(RED_FIRST <= ROWS_PER_WARP);
/// Staged dK rows (of its eight) each warp reduces right after issuing the
/// next item's S: [`RED_FIRST`], or all eight with `HEAD_HALVES` (H = 128),
/// where the half that did not compute the item's fused dK reduces all of
/// them while the other computes and stages the next one's.
pub(super) const RED_NOW: u32 = if HEAD_HALVES {
    ROWS_PER_WARP
} else {
    RED_FIRST
};
// `reduce_rows` skips a fused call on the other half's group of four slots
// whole: its calls must cover whole groups.
const _: () = assert!(RED_FIRST.is_multiple_of(4) && ROWS_PER_WARP == 8);

/// Reduce, part 1: stages this warpgroup's dK fragments (`kacc`, scaled
/// by sm_scale) as f32 rows in shared memory, and copies the chunk's key
/// rows for part 2 (`own_row`: this slot's, paired kernel; the row kernel
/// reads it from the item's slot set `srows`).
///
/// # Safety
/// The previous readers of the staging and of the key-row copy passed
/// barrier B2 (see the pipeline note; in the paired kernel B2 spans both
/// halves, the readers of this staging).
#[rustc_force_inline]
pub(super) unsafe fn stage<const PAIRED: bool, const HALF: u32>(
    c: &Ctx<'_, PAIRED, HALF>,
    kacc: &[f32; 32],
    own_row: u32,
    srows: SmemAddr,
) {
    let (tid, wi, g, sm_scale) = (c.tid, c.wi, c.g, c.sm_scale);
    // SAFETY: each thread writes its own fragment elements (distinct
    // (slot, column) pairs); the caller's contract.
    unsafe {
        // D = 64: only warpgroup 1 computed dK (`mma::dk`).
        if !SPLIT || c.wg == 1 {
            for j in 0..8u32 {
                for half in 0..2u32 {
                    let slot = 16 * wi + g + 8 * half;
                    let col = c.dcol0 + 8 * j + c.c;
                    let r = (4 * j + 2 * half) as usize;
                    let at = c.sdk.add(slot * DK_STRIDE + col * 4);
                    smem::st_v2_f32(at, kacc[r] * sm_scale, kacc[r + 1] * sm_scale);
                }
            }
        }
        if tid < CHUNK {
            let r = if PAIRED {
                own_row
            } else {
                smem::ld_u32(srows.add(4 * tid))
            };
            smem::st_u32(c.sred_rows.add(4 * tid), r);
        }
    }
}

/// Reduce, part 2: staged rows `lo..hi` (of each warp's eight) of the
/// current staging; each call covers four rows. ptxas unrolls them,
/// loads the four key rows first and then each staged row into the same
/// four registers right before its reduction, so the staged rows cost no
/// extra live registers (loading all four first takes 16 more; the
/// CHANGELOG's performance history has the measurement).
///
/// `fused`: `Some(h)` when the item's dK of both rows was computed as one
/// product by half h (paired kernel, every slot the same key row in both
/// halves): its staging holds the sum, and each half reduces its groups of
/// four slots from it.
///
/// `DET`: the deterministic twin's reductions ([`det_add`]) instead of
/// the f32 ones, into the fixed-point accumulator of `det`'s tables, with
/// the scales of the staged rows' key rows in lanes `0..ROWS_PER_WARP` of
/// `scales` ([`lane_scale`] of the item's slot set).
///
/// Called by whole warps (every thread of the half) after barrier M: the
/// staged rows and their key rows (of both halves in the paired kernel)
/// are complete, and rewritten only after the next B2.
pub(super) fn reduce_rows<const PAIRED: bool, const HALF: u32, const DET: bool>(
    c: &Ctx<'_, PAIRED, HALF>,
    det: DetTables,
    scales: f32,
    lo: u32,
    hi: u32,
    fused: Option<u32>,
) {
    const D: usize = DIM as usize;
    let (l, half, warp, lane, dk) = (SMEM, HALF, c.warp, c.lane, c.dk);
    let (sdk, sred_rows, pbase) = (c.sdk, c.sred_rows, c.pbase);
    // Each warp takes its eight rows in an order that depends on the
    // CTA (i XOR cta % 8). With one order everywhere, CTAs whose rows
    // select the same key in the same slot (causal selections) reduce
    // into the same key row at the same moment, and those reductions
    // serialize.
    let x = sreg::block_idx_x_here() % ROWS_PER_WARP;
    let slot_at = |i: u32| staged_slot(warp, x, i);
    if SPLIT {
        half_warp_rows::<PAIRED, HALF, DET>(c, det, scales, lo, hi, fused, x);
        return;
    }
    // D = 128: a warp instruction per staged row, 16 bytes a lane.
    // Fused: a half reduces the slots of its groups of four, and the
    // calls cover whole groups (RED_FIRST is 0, 4 or 8), so a call on
    // the other half's group has nothing to do.
    if fused.is_some() && lo < hi && !fused_reducer(fused, lo ^ x, half) {
        return;
    }
    // The key rows of slot `i`: (this half's, the other half's) for an
    // item that is not fused, (the computing half's, unused) for a
    // fused one.
    let key_rows = |i: u32| -> (i32, i32) {
        let slot = slot_at(i);
        // SAFETY: written before barrier M (of both halves in the
        // paired kernel); read only.
        unsafe {
            match fused {
                Some(comp) => {
                    let r = smem::ld_u32(c.half_base(comp).add(l.red_rows).add(4 * slot));
                    (r as i32, 0)
                }
                None => {
                    let r = smem::ld_u32(sred_rows.add(4 * slot)) as i32;
                    let pr = if PAIRED {
                        smem::ld_u32(pbase.add(l.red_rows).add(4 * slot)) as i32
                    } else {
                        -1
                    };
                    (r, pr)
                }
            }
        }
    };
    // Paired: each iteration loads the next slot's key rows before it
    // uses its own (loaded by the previous one), so the shared-memory
    // latency of those loads is not paid in front of every reduction.
    // The row kernel loads them in place: there the same change was
    // slower.
    // The deterministic paired kernel (not H = 128) loads each row's
    // scale with its key rows, one slot ahead (`lane_scales`).
    let fetch = |i: u32| -> (i32, i32, f32) {
        let (r, pr) = key_rows(i);
        let s = if DET && !lane_scales(PAIRED) && r >= 0 {
            // SAFETY: a valid key row is a row of the exponent table.
            unsafe { det::row_scale(det, r as usize) }
        } else {
            0.0
        };
        (r, pr, s)
    };
    let mut next = if PAIRED && lo < hi {
        fetch(lo)
    } else {
        (-1, -1, 0.0)
    };
    for i in lo..hi {
        let (r, pr, loaded) = if PAIRED {
            let cur = next;
            if i + 1 < hi {
                next = fetch(i + 1);
            }
            cur
        } else {
            fetch(i)
        };
        let slot = slot_at(i);
        // SAFETY: the whole warp (`i` is warp-uniform).
        let scale = if DET && lane_scales(PAIRED) {
            unsafe { sync::shfl_idx_f32(scales, i) }
        } else {
            loaded
        };
        // SAFETY: the staged row and its key row are complete (barrier
        // M, of both halves in the paired kernel); a valid key row lies
        // inside the (B*S_k, D) accumulator, 16-byte aligned
        // (host-checked base, D*4 a multiple of 16).
        unsafe {
            if let Some(comp) = fused {
                let dv = if DET {
                    let cdk = c.half_base(comp).add(l.dk);
                    det_vals::<32>(cdk.add(slot * DK_STRIDE), None, lane)
                } else {
                    DET_NONE
                };
                if r >= 0 && fused_reducer(fused, slot, half) {
                    let cdk = c.half_base(comp).add(l.dk);
                    if DET {
                        det_add::<32>(det, dk, dv, r as usize, lane, scale);
                    } else {
                        let v = smem::ld_v4_f32(cdk.add(slot * DK_STRIDE + lane * 16));
                        global::red_add_v4_f32(dk.add(r as usize * D + lane as usize * 4), v);
                    }
                }
                continue;
            }
            // Paired: where the other half's row selected the same key
            // in this slot, one half (alternating by groups of four
            // slots, so every warp does half of them) reduces the sum of
            // both staged rows and the other skips it.
            let shared = PAIRED && r == pr;
            let dv = if DET {
                let other = shared.then(|| pbase.add(l.dk).add(slot * DK_STRIDE));
                det_vals::<32>(sdk.add(slot * DK_STRIDE), other, lane)
            } else {
                DET_NONE
            };
            if DET && r >= 0 && (!shared || (slot / 4) % 2 == half) {
                det_add::<32>(det, dk, dv, r as usize, lane, scale);
            } else if r >= 0 && (!shared || (slot / 4) % 2 == half) {
                let at = slot * DK_STRIDE + lane * 16;
                let mut v = smem::ld_v4_f32(sdk.add(at));
                if shared {
                    let o = smem::ld_v4_f32(pbase.add(l.dk).add(at));
                    v = [v[0] + o[0], v[1] + o[1], v[2] + o[2], v[3] + o[3]];
                }
                global::red_add_v4_f32(dk.add(r as usize * D + lane as usize * 4), v);
            }
        }
    }
}

/// The slot of this warp's staged row `i` (of its [`ROWS_PER_WARP`]) in
/// the CTA's order `x = cta % ROWS_PER_WARP` ([`reduce_rows`]).
#[inline(always)]
fn staged_slot(warp: u32, x: u32, i: u32) -> u32 {
    warp * ROWS_PER_WARP + (i ^ x)
}

/// [`reduce_rows`] for D = 64 (`SPLIT`: the row kernels, and H = 128,
/// whose items are all fused): half-warp `lane / 16` takes row
/// `i + lane / 16` of each pair (`lo`, `hi` even; the XOR maps pairs to
/// pairs), 16 lanes x 16 bytes a row. Fused: from the computing half's
/// staging.
#[inline(always)]
fn half_warp_rows<const PAIRED: bool, const HALF: u32, const DET: bool>(
    c: &Ctx<'_, PAIRED, HALF>,
    det: DetTables,
    scales: f32,
    lo: u32,
    hi: u32,
    fused: Option<u32>,
    x: u32,
) {
    const D: usize = DIM as usize;
    let (l, warp, lane, dk) = (SMEM, c.warp, c.lane, c.dk);
    // Fused (H = 128): as on the D = 128 path, a call on the other half's
    // group of four slots has nothing to do.
    if PAIRED && fused.is_some() && lo < hi && !fused_reducer(fused, lo ^ x, HALF) {
        return;
    }
    let (sdk, sred_rows) = match fused {
        Some(comp) if PAIRED => (
            c.half_base(comp).add(l.dk),
            c.half_base(comp).add(l.red_rows),
        ),
        _ => (c.sdk, c.sred_rows),
    };
    let (sub, col) = (lane / 16, lane % 16);
    let mut i = lo;
    while i < hi {
        let slot = staged_slot(warp, x, i + sub);
        // SAFETY: the whole warp (`i` is warp-uniform), before the
        // lane-dependent branch below.
        let scale = if DET {
            unsafe { sync::shfl_idx_f32(scales, i + sub) }
        } else {
            0.0
        };
        // SAFETY: as on the D = 128 path: the staged row and its key row are
        // complete (barrier M); a valid key row lies inside the (B*S_k, D)
        // accumulator, 16-byte aligned.
        unsafe {
            let r = smem::ld_u32(sred_rows.add(4 * slot)) as i32;
            let dv = if DET {
                det_vals::<16>(sdk.add(slot * DK_STRIDE), None, col)
            } else {
                DET_NONE
            };
            if r >= 0 {
                if DET {
                    det_add::<16>(det, dk, dv, r as usize, col, scale);
                } else {
                    let v = smem::ld_v4_f32(sdk.add(slot * DK_STRIDE + col * 16));
                    global::red_add_v4_f32(dk.add(r as usize * D + col as usize * 4), v);
                }
            }
        }
        i += 2;
    }
}

/// Words of a dK row in the deterministic twin's accumulator (two
/// elements each, [`det::add_pair`]).
const DET_WORDS: u32 = DIM / 2;
/// Most words of a row one thread adds (D = 128 by a half-warp; the
/// kernels reduce D = 128 rows by warps, two words a thread).
const DET_MAX_WORDS: usize = 4;
/// [`det_vals`] of the default kernels, which never read it.
const DET_NONE: [[f32; 2]; DET_MAX_WORDS] = [[0.0; 2]; DET_MAX_WORDS];
/// Words of a row each of its `LANES` threads adds.
const fn det_words_per_lane(lanes: u32) -> usize {
    let n = DET_WORDS / lanes;
    assert!(DET_WORDS.is_multiple_of(lanes) && (n == 1 || n == 2 || n == 4));
    n as usize
}

/// The deterministic twin's part of one staged dK row for thread `l`
/// of the `LANES` that reduce it (a warp for D = 128, a half-warp for
/// D = 64): its words `l + LANES j` (`j < 2`), each the sum of the
/// staged row's two elements and, where both halves' rows select the key
/// (`other`), the other half's (entries past [`det_words_per_lane`]
/// unused). Loaded whether or not the slot is
/// reduced (every staged row is written each item), so that the loads
/// issue beside the key row's instead of after its test.
///
/// # Safety
/// After barrier M (the staged rows complete); `src` (and `other`) a
/// staged row (16-byte aligned: DK_STRIDE).
#[inline(always)]
unsafe fn det_vals<const LANES: u32>(
    src: SmemAddr,
    other: Option<SmemAddr>,
    l: u32,
) -> [[f32; 2]; DET_MAX_WORDS] {
    let n = const { det_words_per_lane(LANES) };
    // SAFETY: the caller's contract; word l + LANES j < DIM / 2 (j < n).
    let word = |j: u32| unsafe {
        let m = l + LANES * j;
        let v = smem::ld_v2_f32(src.add(8 * m));
        match other {
            Some(o) => {
                let w = smem::ld_v2_f32(o.add(8 * m));
                [v[0] + w[0], v[1] + w[1]]
            }
            None => v,
        }
    };
    // Written out (not a loop) so that the array stays in registers.
    let mut out = DET_NONE;
    out[0] = word(0);
    if n > 1 {
        out[1] = word(1);
    }
    if n > 2 {
        out[2] = word(2);
        out[3] = word(3);
    }
    out
}

/// Adds thread `l`'s words `v` ([`det_vals`]) of a staged dK row into key
/// row `r` (of scale `scale`) of the fixed-point accumulator at `dk`, one
/// `red.global.add.u64` per word ([`det::add_pair`]): each warp
/// instruction adds `8 LANES` contiguous bytes of the row, half the bytes
/// of an f32 vector reduction (PTX has no vector integer reduction).
///
/// # Safety
/// As the reductions of [`reduce_rows`]; `r` a valid key row, `det` the
/// call's tables (after `det_scales`).
#[inline(always)]
unsafe fn det_add<const LANES: u32>(
    det: DetTables,
    dk: *mut f32,
    v: [[f32; 2]; DET_MAX_WORDS],
    r: usize,
    l: u32,
    scale: f32,
) {
    let n = const { det_words_per_lane(LANES) };
    // SAFETY: the caller's contract; the key row holds DIM / 2 words.
    let add = |j: usize| unsafe {
        let word = r * DET_WORDS as usize + (l + LANES * j as u32) as usize;
        det::add_pair(det, dk as *mut u64, word, v[j], scale);
    };
    add(0);
    if n > 1 {
        add(1);
    }
    if n > 2 {
        add(2);
        add(3);
    }
}

/// Whether the deterministic twin keeps its rows' scales in lanes
/// ([`lane_scale`], one register for the whole item): every kernel but
/// the paired one (two rows per CTA, not H = 128), whose registers are at
/// its cap; it loads each row's scale in [`reduce_rows`] with its key
/// rows, one slot ahead.
pub(super) const fn lane_scales(paired: bool) -> bool {
    !paired || HEAD_HALVES
}

/// The deterministic twin's scale for this lane: lane `j` (of the first
/// [`ROWS_PER_WARP`]; the others repeat them) holds the scale of the key
/// row of staged row `j` of this warp (slot `warp * ROWS_PER_WARP + (j ^
/// cta % ROWS_PER_WARP)`, as [`reduce_rows`] walks them) in slot set
/// `srows`, 0 for padding. Loaded at the start of the item, long before
/// its reductions, so that the load's latency is not paid in front of
/// them; [`reduce_rows`] takes each row's from its lane.
///
/// # Safety
/// `srows` is the item's slot set (complete: read after the barrier that
/// follows its writes), `det` the call's tables, after `det_scales`.
#[inline(always)]
pub(super) unsafe fn lane_scale<const PAIRED: bool, const HALF: u32>(
    c: &Ctx<'_, PAIRED, HALF>,
    srows: SmemAddr,
    det: DetTables,
) -> f32 {
    let x = sreg::block_idx_x_here() % ROWS_PER_WARP;
    let slot = staged_slot(c.warp, x, c.lane % ROWS_PER_WARP);
    // SAFETY: the caller's contract; a valid key row is a row of the
    // exponent table.
    unsafe {
        let r = smem::ld_u32(srows.add(4 * slot)) as i32;
        if r >= 0 {
            det::row_scale(det, r as usize)
        } else {
            0.0
        }
    }
}

/// Whether `half` reduces staged row `i` (of a warp's eight; any slot of
/// its group of four) of a fused item computed by half `fused`: with
/// `HEAD_HALVES` the half that did not compute it reduces them all, else
/// the halves take every other group of four.
#[inline(always)]
fn fused_reducer(fused: Option<u32>, i: u32, half: u32) -> bool {
    if HEAD_HALVES {
        fused != Some(half)
    } else {
        (i / 4) % 2 == half
    }
}
