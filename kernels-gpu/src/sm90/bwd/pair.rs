//! What only the paired kernel decides: whether it computes at all (the
//! dispatch test both wgmma kernels run first, [`pairs_up`] and
//! [`dispatch`]), and whether an item is
//! fused (the halves' votes, [`vote`] and [`read_votes`]).

use super::{
    pair_sample, pairs_match, sample_hit, sampled_slots, CHUNK, PAIR_SAMPLES,
    VOTE_SET_BYTES,
};
use crate::abi::{GradParams, FLAG_PAIR_DISPATCH};
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{sreg, sync};
use crate::score::load_id;

/// The paired kernel's vote on item `it`: whether every slot holds the
/// same key row in both halves (the item can be fused), as `Some(it % 2)`
/// (the half that computes it fused) or `None`.
///
/// Both halves compare the same pairs of key rows (their own set against
/// the other half's), so each decides from its own warps alone: thread
/// `t < CHUNK` compares slot `t`, each warp publishes whether any of its
/// slots differ in its half's vote set `it % 2`, and after the half's
/// next barrier [`read_votes`] combines them. This keeps the vote off B2,
/// which is then a plain `barrier.sync` that the halves may reach at their
/// own instructions (a reduction barrier there is rejected by
/// compute-sanitizer's synccheck, and its result would sit on B2's
/// critical path).
///
/// # Safety
/// Whole warps of one half, uniform control flow; both halves' key rows
/// of item `it` (set `it % 2`) complete and visible; `votes` this half's
/// vote sets, whose set `it % 2` no thread of the half reads until its
/// next barrier.
#[inline(always)]
pub(super) unsafe fn vote(it: u32, rows: SmemAddr, prows: SmemAddr, votes: SmemAddr, tid: u32) {
    let at = 4 * ((it % 2) * CHUNK + tid);
    // SAFETY: caller's contract; thread t < CHUNK reads slot t of both sets.
    unsafe {
        let differs = tid < CHUNK && smem::ld_u32(rows.add(at)) != smem::ld_u32(prows.add(at));
        let any = sync::warp_max_u32(differs as u32);
        if tid % 32 == 0 {
            smem::st_u32(votes.add((it % 2) * VOTE_SET_BYTES + 4 * (tid / 32)), any);
        }
    }
}

/// The outcome of the votes on item `it` (see [`vote`]).
///
/// # Safety
/// After the half's barrier that follows every warp's [`vote`] on `it`,
/// and before the next vote on `it + 2`.
#[inline(always)]
pub(super) unsafe fn read_votes(it: u32, votes: SmemAddr) -> Option<u32> {
    let set = votes.add((it % 2) * VOTE_SET_BYTES);
    // SAFETY: caller's contract. Raw words: a float comparison could
    // flush the small integers.
    let (x, y) = unsafe { (smem::ld_v4_f32(set), smem::ld_v4_f32(set.add(16))) };
    let or = x.iter().chain(&y).fold(0, |a, v| a | v.to_bits());
    (or == 0).then_some(it % 2)
}

/// The dispatch test (`super::pairs_match` on sampled ids): whether the
/// paired kernel computes this execute. With [`FLAG_PAIR_DISPATCH`] the
/// host launched the paired kernel, then the row kernel; both run this
/// first and only the one it picks goes on.
///
/// It runs in the kernel entry, before the paired kernel's halves split
/// into their own copies of the body, so every thread of the CTA reaches
/// the one `barrier.red` at the same instruction; and every thread loads
/// (row 0's first id where it samples nothing), so no lane-dependent
/// branch precedes the barrier.
///
/// # Safety
/// Every thread of the CTA calls it (it is a CTA barrier); `p` validated
/// by the host.
#[inline(always)]
unsafe fn pairs_up(p: &GradParams) -> bool {
    let tid = sreg::thread_idx_x();
    let topk = p.topk;
    // Warp i < PAIR_SAMPLES compares the first slots of sampled pair i.
    let (i, t) = (tid / 32, tid % 32);
    let pairs = p.batch * p.seq_q / 2;
    let sampled = i < PAIR_SAMPLES && t < sampled_slots(topk) && pairs > 0;
    let a = if sampled {
        (2 * pair_sample(pairs, i) * topk + t) as usize
    } else {
        0
    };
    let b = if sampled { a + topk as usize } else { 0 };
    // SAFETY: sampled: rows 2q and 2q + 1 < B*S_q (q < pairs), t < topk;
    // otherwise index 0: inside topk_indices (host-checked length, at
    // least one slot); inputs only. i64 ids are narrowed (`load_id`), as
    // `super::ids_pair_up` expects them.
    let (x, y) = unsafe { (load_id(p, a), load_id(p, b)) };
    let hit = sampled & sample_hit(x, y);
    // SAFETY: every thread of the CTA reaches it (caller's contract).
    pairs_match(unsafe { sync::bar_red_popc(hit) }, topk)
}

/// Whether this kernel computes: the dispatch test's verdict for the
/// paired kernel (`PAIRED`) or for the row kernel launched after it (with
/// [`FLAG_PAIR_DISPATCH`]); `true` for a row kernel launched alone. Made
/// warp-uniform with a warp reduction so the kernel's branches on it stay
/// uniform.
///
/// # Safety
/// Every thread of the CTA calls it, in the kernel entry.
#[inline(always)]
pub(super) unsafe fn dispatch<const PAIRED: bool>(p: &GradParams) -> bool {
    if PAIRED || p.flags & FLAG_PAIR_DISPATCH != 0 {
        // SAFETY: forwarded (whole CTA, uniform control flow).
        unsafe { sync::warp_max_u32(pairs_up(p) as u32) == PAIRED as u32 }
    } else {
        true
    }
}
