//! CTA barriers, warp shuffles and trap.

use core::arch::asm;

/// `barrier.sync 0`: all threads of the CTA wait here; orders their shared
/// and global memory accesses. The non-`.aligned` form, so it stays correct
/// even if the compiler duplicates the call site into both arms of a
/// lane-dependent branch.
///
/// # Safety
/// Every thread of the CTA must reach the same barrier (no divergent call).
#[inline(always)]
pub unsafe fn bar_sync() {
    // SAFETY: the caller guarantees CTA-uniform control flow. No `nomem`:
    // the compiler must not move memory accesses across the barrier.
    unsafe { asm!("barrier.sync 0;", options(nostack)) }
}

/// `barrier.sync id, count`: a named barrier of `count` threads (a multiple
/// of 32) that a subset of the CTA's warps use on their own, e.g. one half
/// of a CTA that runs two independent pipelines. Orders the participants'
/// memory accesses like [`bar_sync`].
///
/// # Safety
/// Exactly `count` threads, whole warps, must reach barrier `id` (1..16,
/// never 0 while other warps use barrier 0 for a different count), with
/// uniform control flow in each warp.
#[inline(always)]
pub unsafe fn bar_sync_named(id: u32, count: u32) {
    // SAFETY: the caller guarantees the participant count and uniformity.
    // No `nomem`: a barrier that orders memory.
    unsafe {
        asm!("barrier.sync {id}, {n};", id = in(reg32) id, n = in(reg32) count, options(nostack))
    }
}

/// `barrier.arrive id, count`: marks this thread's arrival at named
/// barrier `id` of `count` threads without waiting. When the barrier
/// completes (the other participants reach it with [`bar_sync_named`]),
/// this thread's memory accesses before the arrival are performed relative
/// to them: a producer's signal to consumers.
///
/// # Safety
/// As [`bar_sync_named`]: `count` threads in all (arriving plus syncing),
/// whole warps, uniform control flow in each warp.
#[inline(always)]
pub unsafe fn bar_arrive_named(id: u32, count: u32) {
    // SAFETY: the caller guarantees the participant count and uniformity.
    // No `nomem`: it orders this thread's earlier memory accesses.
    unsafe {
        asm!("barrier.arrive {id}, {n};", id = in(reg32) id, n = in(reg32) count, options(nostack))
    }
}

/// `barrier.red.popc.u32 d, 0, p`: a CTA-wide barrier (barrier 0, every
/// thread) that also returns, in every thread, how many threads passed
/// `p = true`. Orders memory like [`bar_sync`].
///
/// # Safety
/// Every thread of the CTA must reach it (uniform control flow), and no
/// other use of barrier 0 may be in flight.
#[inline(always)]
pub unsafe fn bar_red_popc(p: bool) -> u32 {
    let d: u32;
    // SAFETY: the caller guarantees CTA-wide participation. No `nomem`: a
    // barrier that orders memory.
    unsafe {
        asm!(
            "{{ .reg .pred p; setp.ne.u32 p, {v}, 0; barrier.red.popc.u32 {d}, 0, p; }}",
            d = out(reg32) d,
            v = in(reg32) p as u32,
            options(nostack),
        )
    }
    d
}

/// `bar.warp.sync 0xffffffff`: the 32 lanes of the warp reconverge here,
/// and memory accesses of each lane before it are ordered before those of
/// every lane after it.
///
/// # Safety
/// All 32 lanes of the warp must reach it.
#[inline(always)]
pub unsafe fn warp_sync() {
    // SAFETY: the caller guarantees full-warp participation. Not `pure` and
    // no `nomem`: a collective that orders memory.
    unsafe { asm!("bar.warp.sync 0xffffffff;", options(nostack)) }
}

/// `shfl.sync.bfly.b32` over the full warp: the value of lane `lane ^ mask`.
///
/// # Safety
/// All 32 lanes of the warp must execute the call with the same `mask`.
#[inline(always)]
pub unsafe fn shfl_xor_f32(v: f32, mask: u32) -> f32 {
    let r: f32;
    // SAFETY: full-warp participation is guaranteed by the caller.
    unsafe {
        asm!(
            "shfl.sync.bfly.b32 {r}, {v}, {m}, 0x1f, 0xffffffff;",
            r = out(reg32) r,
            v = in(reg32) v,
            m = in(reg32) mask,
            // Not `pure`: a collective must not be sunk into a branch taken
            // by some lanes only (LLVM would otherwise move it next to its
            // single use under `if lane == 0`, and the warp would hang).
            options(nomem, nostack),
        )
    }
    r
}

/// `shfl.sync.idx.b32` over the full warp: the value of lane `src`
/// (each lane its own `src`).
///
/// # Safety
/// All 32 lanes of the warp must execute the call.
#[inline(always)]
pub unsafe fn shfl_idx_f32(v: f32, src: u32) -> f32 {
    let r: f32;
    // SAFETY: full-warp participation is guaranteed by the caller.
    unsafe {
        asm!(
            "shfl.sync.idx.b32 {r}, {v}, {s}, 0x1f, 0xffffffff;",
            r = out(reg32) r,
            v = in(reg32) v,
            s = in(reg32) src,
            // Not `pure`: see `shfl_xor_f32`.
            options(nomem, nostack),
        )
    }
    r
}

/// Inclusive prefix sum of `v` over the lanes (lane `l` gets the sum of
/// lanes `0..=l`), by `shfl.sync.up.b32` steps.
///
/// # Safety
/// All 32 lanes of the warp must call it.
#[inline(always)]
pub unsafe fn warp_scan_u32(mut v: u32) -> u32 {
    let lane = crate::ptx::sreg::thread_idx_x() % 32;
    let mut d = 1;
    while d < 32 {
        let r: u32;
        // SAFETY: full-warp participation is guaranteed by the caller. Not
        // `pure`, for the reason given at `shfl_xor_f32`.
        unsafe {
            asm!(
                "shfl.sync.up.b32 {r}, {v}, {d}, 0, 0xffffffff;",
                r = out(reg32) r,
                v = in(reg32) v,
                d = in(reg32) d,
                options(nomem, nostack),
            )
        }
        v += if lane >= d { r } else { 0 };
        d <<= 1;
    }
    v
}

/// Sum of `v` over the 32 lanes by a fixed butterfly, so the result is
/// bitwise the same on every run; every lane gets the sum.
///
/// # Safety
/// All 32 lanes of the warp must call it.
#[inline(always)]
pub unsafe fn warp_sum_f32(mut v: f32) -> f32 {
    let mut m = 16;
    while m > 0 {
        // SAFETY: forwarded from the caller.
        v += unsafe { shfl_xor_f32(v, m) };
        m >>= 1;
    }
    v
}

/// `redux.sync.max.u32` over the full warp: the largest `v` of the 32
/// lanes, in every lane.
///
/// # Safety
/// All 32 lanes of the warp must call it.
#[inline(always)]
pub unsafe fn warp_max_u32(v: u32) -> u32 {
    let r: u32;
    // SAFETY: full-warp participation is guaranteed by the caller. Not
    // `pure`, for the reason given at `shfl_xor_f32`.
    unsafe {
        asm!(
            "redux.sync.max.u32 {r}, {v}, 0xffffffff;",
            r = out(reg32) r,
            v = in(reg32) v,
            options(nomem, nostack),
        )
    }
    r
}

/// Sum over the four lanes of a quad (`lane / 4` equal), fixed order; every
/// lane of the quad gets the sum.
///
/// # Safety
/// All 32 lanes of the warp must call it.
#[inline(always)]
pub unsafe fn quad_sum_f32(v: f32) -> f32 {
    // SAFETY: forwarded.
    let v = v + unsafe { shfl_xor_f32(v, 1) };
    // SAFETY: forwarded.
    v + unsafe { shfl_xor_f32(v, 2) }
}

/// `trap`: aborts the kernel; the launch reports an error.
#[inline(always)]
pub fn trap() -> ! {
    // SAFETY: `trap` has no operands; it ends the thread (and the grid).
    unsafe { asm!("trap;", options(noreturn, nostack)) }
}

/// Returns `x` unchanged, hidden from the optimiser: used for the trip count
/// of outer loops over shared memory so LLVM keeps them as loops (only the
/// inner loops over register arrays are unrolled), which keeps register
/// pressure bounded.
#[inline(always)]
pub fn opaque_u32(x: u32) -> u32 {
    let r: u32;
    // SAFETY: a register move.
    unsafe {
        asm!("mov.b32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(pure, nomem, nostack))
    }
    r
}

/// `x` of the warp's lane 0 (`shfl.sync.idx`): for a value the caller
/// knows to be the same in every lane, this tells ptxas so, which lets it
/// keep what is derived from it (shared-memory addresses, `wgmma`
/// descriptors) in uniform registers instead of moving it there before
/// every use.
///
/// # Safety
/// All 32 lanes of the warp execute it together (warp-collective).
#[inline(always)]
pub unsafe fn uniform_u32(x: u32) -> u32 {
    let r: u32;
    // SAFETY: the caller's contract; a full-mask shuffle.
    unsafe {
        asm!(
            "shfl.sync.idx.b32 {r}, {x}, 0, 0x1f, 0xffffffff;",
            r = out(reg32) r, x = in(reg32) x,
            options(nomem, nostack)
        )
    }
    r
}

/// `setmaxnreg.inc.sync.aligned.u32 N`: raises this warpgroup's
/// per-thread register allocation to `N` (blocking until the SM has them:
/// another warpgroup of the CTA releases them with [`setmaxnreg_dec`]).
/// ptxas allocates the code after it with up to `N` registers.
///
/// # Safety
/// All 128 threads of the warpgroup execute it together; `N` is a multiple
/// of 8 in 24..=256, at least the kernel's allocation, and the CTA's
/// warpgroups release enough for it.
#[inline(always)]
pub unsafe fn setmaxnreg_inc<const N: u32>() {
    // SAFETY: the caller's contract. No `nomem`: the allocation changes
    // what the code after it may hold.
    unsafe { asm!("setmaxnreg.inc.sync.aligned.u32 {n};", n = const N, options(nostack)) }
}

/// `setmaxnreg.dec.sync.aligned.u32 N`: lowers this warpgroup's per-thread
/// register allocation to `N`, giving the rest to [`setmaxnreg_inc`].
///
/// # Safety
/// As [`setmaxnreg_inc`], with `N` at most the kernel's allocation and the
/// code after it fitting in `N` registers.
#[inline(always)]
pub unsafe fn setmaxnreg_dec<const N: u32>() {
    // SAFETY: the caller's contract.
    unsafe { asm!("setmaxnreg.dec.sync.aligned.u32 {n};", n = const N, options(nostack)) }
}
