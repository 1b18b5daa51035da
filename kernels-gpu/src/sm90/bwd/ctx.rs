//! The context every role of the wgmma kernels receives (`wg` builds it
//! once per half, the role modules read it), and the named barriers they
//! meet at. A leaf of its own so that the roles and the kernel that runs
//! them do not use each other.
//!
//! The context holds what the kernel body used to compute once at its
//! start, in the same order: this thread's place in its warpgroup and
//! half, the CTA's rows, launch-uniform parameters, and the shared-memory
//! map of its half's copy of the layout (`pbase`: the other half's, in the
//! paired kernel). `PAIRED` and `HALF` are the body's constants: each half
//! of a paired CTA runs its own copy of the body, the half a constant
//! (derived from %tid.x at run time, ptxas computed the tile addresses and
//! wgmma descriptors per thread and moved each to a uniform register
//! before every wgmma, which slowed the paired kernel down).

use super::{
    row_chunks, Pos, CHUNK, HEADS, PAIR, Q_BYTES, Q_HEADS, SMEM, SPLIT, THREADS,
};
use crate::abi::GradParams;
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{sreg, sync};
use crate::sched::{row_at, row_count};
use crate::score::ids_i64;

/// Whether the two halves of a paired CTA hold the two 64-head halves of
/// one row (H = 128, `super::h128`) instead of two rows: half `h` takes
/// heads `64 h .. 64 h + 64` of the same rows, and every item is fused.
pub(super) const HEAD_HALVES: bool = Q_HEADS > HEADS;
const _: () = assert!(Q_HEADS <= 2 * HEADS);

/// With [`HEAD_HALVES`], whether the halves share one pair of K buffers
/// (half 0's), each gathering the K rows of half the chunk's slots; their
/// uniform barriers are then the CTA's (a K chunk is complete only when
/// both halves' copies are).
pub(super) const SHARED_K: bool = HEAD_HALVES;

/// The named barriers of the wgmma kernels (`barrier.sync` /
/// `barrier.arrive` ids). The row kernel uses only [`Bar::Cta`]; the paired
/// kernel all five.
///
/// | barrier | id | threads | who arrives, who syncs |
/// |---|---|---|---|
/// | `Cta` | 0 | the CTA (256 or 512) | row kernel: every uniform barrier (the prologue's, each item's B2 and M); paired kernel: the prologue's key-row barrier and each item's B2 (both halves sync) |
/// | `Half0`, `Half1` | 1, 2 | 256 ([`THREADS`]) | paired kernel only: half h's own uniform barriers (its M and the prologue's others); its warps sync |
/// | `Staged0`, `Staged1` | 3, 4 | 512 (`PAIR.threads`) | paired kernel only: half h's dK staging of the item is complete; half h arrives, the other half syncs before its reductions |
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(super) enum Bar {
    /// The whole CTA (`barrier.sync 0`, every thread).
    Cta = 0,
    /// Half 0's own barrier (paired kernel).
    Half0 = 1,
    /// Half 1's own barrier (paired kernel).
    Half1 = 2,
    /// Half 0's staging of the current item is complete (paired kernel).
    Staged0 = 3,
    /// Half 1's staging of the current item is complete (paired kernel).
    Staged1 = 4,
}

impl Bar {
    /// Half `h`'s own barrier.
    #[rustc_force_inline]
    pub const fn half(h: u32) -> Bar {
        if h == 0 {
            Bar::Half0
        } else {
            Bar::Half1
        }
    }

    /// Half `h`'s STAGED barrier.
    #[rustc_force_inline]
    pub const fn staged(h: u32) -> Bar {
        if h == 0 {
            Bar::Staged0
        } else {
            Bar::Staged1
        }
    }

    /// The barrier id.
    #[rustc_force_inline]
    pub const fn id(self) -> u32 {
        self as u32
    }

    /// Threads that take part (arriving plus syncing); [`Bar::Cta`]: every
    /// thread of the CTA, which `barrier.sync 0` needs no count for.
    #[rustc_force_inline]
    pub const fn threads(self) -> u32 {
        match self {
            Bar::Cta => 0,
            Bar::Half0 | Bar::Half1 => THREADS,
            Bar::Staged0 | Bar::Staged1 => PAIR.threads,
        }
    }

    /// Waits at the barrier (`barrier.sync`).
    ///
    /// # Safety
    /// Every participant (table above) reaches it, whole warps with uniform
    /// control flow, and no other use of the id is in flight.
    #[rustc_force_inline]
    pub unsafe fn sync(self) {
        // SAFETY: the caller's contract.
        unsafe {
            match self {
                Bar::Cta => sync::bar_sync(),
                b => sync::bar_sync_named(b.id(), b.threads()),
            }
        }
    }

    /// Signals the barrier without waiting (`barrier.arrive`).
    ///
    /// # Safety
    /// As [`Bar::sync`]; not [`Bar::Cta`].
    #[rustc_force_inline]
    pub unsafe fn arrive(self) {
        // SAFETY: the caller's contract.
        unsafe { sync::bar_arrive_named(self.id(), self.threads()) }
    }
}

/// What every role needs (see the module note).
pub(super) struct Ctx<'a, const PAIRED: bool, const HALF: u32> {
    /// Pointers, sizes, scalars.
    pub p: &'a GradParams,
    /// Dynamic shared memory, aligned to 1024 bytes (the tensor cores
    /// apply the swizzle to absolute address bits).
    pub base0: u32,
    /// The other half's copy of the layout (paired kernel only; this
    /// half's, the whole CTA's in the row kernel, is where the regions
    /// below lie).
    pub pbase: SmemAddr,
    /// The q tiles (two, by local row parity).
    pub sq0: SmemAddr,
    /// The K buffers (two, by item parity).
    pub sk: SmemAddr,
    /// The dS tile.
    pub sds: SmemAddr,
    /// The dK staging.
    pub sdk: SmemAddr,
    /// grad_signal, two slot sets.
    pub sgs0: SmemAddr,
    /// Resolved key rows, two slot sets.
    pub srows0: SmemAddr,
    /// Key rows of the staging being reduced.
    pub sred_rows: SmemAddr,
    /// Raw key ids, two sets.
    pub sids0: SmemAddr,
    /// Weights as f32, two rows.
    pub sw0: SmemAddr,
    /// d_weights partials.
    pub sred: SmemAddr,
    /// Paired: this half's item votes (`pair::vote`), in the layout's
    /// padding.
    pub votes: SmemAddr,
    /// Thread inside the half (the CTA in the row kernel).
    pub tid: u32,
    /// Warp inside the half.
    pub warp: u32,
    /// Lane.
    pub lane: u32,
    /// Warpgroup inside the half.
    pub wg: u32,
    /// Warp inside the warpgroup: heads `16 wi .. 16 wi + 16`.
    pub wi: u32,
    /// Fragment row of the lane (`lane / 4`).
    pub g: u32,
    /// Fragment column of the lane (`2 (lane % 4)`).
    pub c: u32,
    /// This CTA.
    pub cta: u32,
    /// The grid size.
    pub ctas: u32,
    /// `p.topk`.
    pub topk: u32,
    /// `p.sm_scale`.
    pub sm_scale: f32,
    /// i64 ids (`FLAG_IDS_I64`): copied whole (8 bytes) into the raw-id
    /// sets and narrowed when resolved, once per slot and item; a branch on
    /// a launch-uniform flag, outside the MMA and reduction loops.
    pub wide: bool,
    /// The f32 dK accumulator.
    pub dk: *mut f32,
    /// This warpgroup's D columns for dQ and dK: `dcol0 .. dcol0 + 64`
    /// (D = 64: 0, the warpgroups split the products, `SPLIT`).
    pub dcol0: u32,
    /// Chunks of a whole row, `ceil(topk / CHUNK)`.
    pub nchunks: u32,
    /// Local rows of this CTA (0 in a kernel the dispatch did not pick).
    pub my_rows: u32,
}

impl<'a, const PAIRED: bool, const HALF: u32> Ctx<'a, PAIRED, HALF> {
    /// The context of this thread; `go`: whether this kernel computes
    /// (`pair::dispatch`).
    #[rustc_force_inline]
    pub fn new(p: &'a GradParams, go: bool) -> Self {
        let l = SMEM;
        let tid_cta = sreg::thread_idx_x();
        let base0 = (smem::base().0 + 1023) & !1023;
        let (base, pbase) = (half_base(base0, HALF), half_base(base0, 1 - HALF));
        // Shared K buffers (`SHARED_K`): half 0's.
        let kbase = if SHARED_K { half_base(base0, 0) } else { base };
        let (sq0, sk, sds, sdk) = (
            base.add(l.q),
            kbase.add(l.k),
            base.add(l.ds),
            base.add(l.dk),
        );
        let (sgs0, srows0, sred_rows) = (base.add(l.gs), base.add(l.rows), base.add(l.red_rows));
        let sids0 = base.add(l.ids);
        let (sw0, sred) = (base.add(l.w), base.add(l.red));
        let votes = base.add(PAIR.votes);

        let tid = if PAIRED { tid_cta % THREADS } else { tid_cta };
        let warp = tid / 32;
        let lane = tid % 32;
        // SAFETY: every thread of the CTA, converged (the constructor runs
        // before any lane-dependent branch); the warpgroup is warp-uniform.
        let wg = unsafe { sync::uniform_u32(tid / 128) };
        let wi = warp % 4;
        let g = lane / 4;
        let c = 2 * (lane % 4);
        let (cta, ctas) = (sreg::block_idx_x(), sreg::grid_dim_x());
        // Units dealt to CTAs: rows, or row pairs in the paired kernel
        // (H = 128: rows, the halves take their heads).
        let units = if PAIRED && !HEAD_HALVES {
            p.batch * p.seq_q / 2
        } else {
            p.batch * p.seq_q
        };
        let topk = p.topk;
        let sm_scale = p.sm_scale;
        let wide = ids_i64(p);
        let dk = p.dk_accum as *mut f32;
        // D = 64 (`SPLIT`): each warpgroup's product covers all 64 columns.
        let dcol0 = if SPLIT { 0 } else { wg * 64 };
        // Index arithmetic in u32: the host checks B*S_q*topk < 2^32
        // (`super::supports`).
        let nchunks = topk.div_ceil(CHUNK);
        let my_rows = if go { row_count(units, ctas, cta) } else { 0 };
        Ctx {
            p,
            base0,
            pbase,
            sq0,
            sk,
            sds,
            sdk,
            sgs0,
            srows0,
            sred_rows,
            sids0,
            sw0,
            sred,
            votes,
            tid,
            warp,
            lane,
            wg,
            wi,
            g,
            c,
            cta,
            ctas,
            topk,
            sm_scale,
            wide,
            dk,
            dcol0,
            nchunks,
            my_rows,
        }
    }

    /// Base of half `h`'s copy of the layout.
    pub fn half_base(&self, h: u32) -> SmemAddr {
        half_base(self.base0, h)
    }

    /// This half's uniform barrier (the CTA's in the row kernel; the halves
    /// of a paired CTA meet only at B2 and STAGED in the item loop).
    ///
    /// # Safety
    /// Called with uniform control flow by every thread of the half (of
    /// the CTA in the row kernel).
    pub unsafe fn bar_half(&self) {
        // SAFETY: the caller's contract; barrier 1 + half is used by no one
        // else, with THREADS threads.
        unsafe {
            if PAIRED && !SHARED_K {
                Bar::half(HALF).sync()
            } else {
                Bar::Cta.sync()
            }
        }
    }

    /// Barrier B2 of an item: dS complete and fenced. The whole CTA in the
    /// paired kernel (both halves, which also frees both halves' staging
    /// of earlier items), else this half's uniform barrier.
    ///
    /// # Safety
    /// Called with uniform control flow by every thread of the CTA (the
    /// halves of a paired CTA walk the same items); barrier 0 has no other
    /// use in the item loop.
    #[rustc_force_inline]
    pub unsafe fn barrier_b2(&self) {
        // SAFETY: the caller's contract.
        unsafe {
            if PAIRED {
                Bar::Cta.sync()
            } else {
                self.bar_half()
            }
        }
    }

    /// Barrier M of an item: its staging, key rows and d_weights
    /// partials, the next chunk's K rows (and the next row's q) and the
    /// slot data two items ahead visible, every wgmma of the item
    /// complete; paired: the votes on the next item. This half's uniform
    /// barrier.
    ///
    /// # Safety
    /// As [`Ctx::bar_half`].
    #[rustc_force_inline]
    pub unsafe fn barrier_m(&self) {
        // SAFETY: the caller's contract.
        unsafe { self.bar_half() }
    }

    /// Query row of local row `k` (paired: of this half).
    pub fn row_of(&self, k: u32) -> u32 {
        if PAIRED && !HEAD_HALVES {
            2 * row_at(self.ctas, self.cta, k) + HALF
        } else {
            row_at(self.ctas, self.cta, k)
        }
    }

    /// The first of this half's heads in the problem's rows: `64 HALF`
    /// with [`HEAD_HALVES`], else 0.
    pub fn head0(&self) -> u32 {
        if HEAD_HALVES {
            HALF * HEADS
        } else {
            0
        }
    }

    /// q tile of local row `k`.
    pub fn q_buf(&self, k: u32) -> SmemAddr {
        self.sq0.add((k % 2) * Q_BYTES)
    }

    /// Weights of local row `k`.
    pub fn w_buf(&self, k: u32) -> SmemAddr {
        self.sw0.add((k % 2) * HEADS * 4)
    }

    /// Slot `tid` of item `at` (threads < CHUNK): the flat slot index, or
    /// `None` past topk or past the CTA's rows.
    pub fn slot_of(&self, at: Pos) -> Option<usize> {
        let tid = self.tid;
        let t = at.ch * CHUNK + tid;
        (tid < CHUNK && at.k < self.my_rows && t < self.topk)
            .then(|| (self.row_of(at.k) * self.topk + t) as usize)
    }

    /// This thread's 8-byte slot of raw-id set `set` (an i64 id; i32 ids
    /// use the first half of the set instead).
    pub fn raw_slot(&self, set: u32) -> SmemAddr {
        self.sids0.add(8 * (set * CHUNK + self.tid))
    }

    /// Chunks the kernel runs for a loaded count. The count is the same in
    /// every lane; it goes through a warp reduction because the result
    /// lands in a uniform register, so ptxas knows the item walk, the
    /// row-end branches and the wgmma descriptors derived from it are
    /// warp-uniform (from the load directly it did not, and added
    /// convergence code, WARPSYNC and BRA.DIV, around the wgmma waits).
    ///
    /// # Safety
    /// Called by every thread with the same value (CTA-uniform control
    /// flow).
    pub unsafe fn chunks(&self, live: u32) -> u32 {
        // SAFETY: the caller's contract.
        row_chunks(unsafe { sync::warp_max_u32(live) }, self.topk)
    }
}

/// Base of half `h`'s copy of the layout, from the aligned base.
fn half_base(base0: u32, h: u32) -> SmemAddr {
    SmemAddr(base0 + h * PAIR.half_stride)
}
