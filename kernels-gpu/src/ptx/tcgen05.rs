//! Blackwell tensor-core generation 5 (`tcgen05`, sm_100f): tensor-memory
//! allocation, MMA with the accumulator in tensor memory, commit to an
//! mbarrier, and tensor-memory loads. **Compiled and assembled for sm_100f,
//! not executed** (no such GPU has been available).
//!
//! Tensor-memory addresses: bits 31..16 lane, bits 15..0 column.

use super::smem::SmemAddr;
use core::arch::asm;

/// A tensor-memory address (lane in bits 16..32, column in bits 0..16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub struct TmemAddr(pub u32);

impl TmemAddr {
    /// This address moved by `lanes` lanes and `cols` columns.
    #[inline(always)]
    pub const fn offset(self, lanes: u32, cols: u32) -> TmemAddr {
        TmemAddr(self.0 + (lanes << 16) + cols)
    }
}

/// `tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32`: allocates
/// `ncols` columns (a power of two >= 32) and writes their address to `dst`.
///
/// # Safety
/// One full warp executes it; `dst` is a 4-byte shared slot; the CTA frees
/// the columns with [`dealloc`] before it exits.
#[inline(always)]
pub unsafe fn alloc(dst: SmemAddr, ncols: u32) {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [{d}], {n};",
             d = in(reg32) dst.0, n = in(reg32) ncols, options(nostack))
    }
}

/// `tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned`: this CTA
/// will allocate no more (lets other CTAs on the SM allocate).
///
/// # Safety
/// One full warp executes it, after this CTA's last [`alloc`].
#[inline(always)]
pub unsafe fn relinquish_alloc_permit() {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!(
            "tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;",
            options(nostack)
        )
    }
}

/// `tcgen05.dealloc.cta_group::1.sync.aligned.b32`: frees `ncols` columns.
///
/// # Safety
/// One full warp executes it with the address and size [`alloc`] returned,
/// after every tensor-memory access of the CTA has completed.
#[inline(always)]
pub unsafe fn dealloc(taddr: TmemAddr, ncols: u32) {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!("tcgen05.dealloc.cta_group::1.sync.aligned.b32 {t}, {n};",
             t = in(reg32) taddr.0, n = in(reg32) ncols, options(nostack))
    }
}

/// `tcgen05.mma.cta_group::1.kind::f16`: `D (+)= A * B` with A and B in
/// shared memory (descriptors from `sm100::desc`), D in tensor memory;
/// `accumulate == false` overwrites D. Issued by one thread; asynchronous
/// until a [`commit`].
///
/// # Safety
/// Descriptors must describe valid shared-memory tiles written (and made
/// visible to the async proxy) before the call; `d` must lie in this CTA's
/// allocation with room for the shape in `idesc`.
#[inline(always)]
pub unsafe fn mma_f16(d: TmemAddr, a_desc: u64, b_desc: u64, idesc: u32, accumulate: bool) {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!(
            "{{ .reg .pred p; setp.ne.b32 p, {acc}, 0; tcgen05.mma.cta_group::1.kind::f16 [{d}], {a}, {b}, {i}, p; }}",
            d = in(reg32) d.0, a = in(reg64) a_desc, b = in(reg64) b_desc, i = in(reg32) idesc,
            acc = in(reg32) accumulate as u32, options(nostack),
        )
    }
}

/// `tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64`:
/// the mbarrier gets one arrival when this thread's previously issued
/// tcgen05 operations complete.
///
/// # Safety
/// `bar` is an initialised mbarrier of this CTA expecting that arrival.
#[inline(always)]
pub unsafe fn commit(bar: SmemAddr) {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [{b}];",
             b = in(reg32) bar.0, options(nostack))
    }
}

/// `tcgen05.ld.sync.aligned.32x32b.x8.b32`: each lane of the warp reads 8
/// consecutive 32-bit columns of its tensor-memory lane, starting at
/// `taddr` (whose lane field selects the warp's 32-lane quarter).
///
/// # Safety
/// One full warp executes it; the columns lie in this CTA's allocation and
/// the lanes in the warp's quarter (warp % 4); results are valid after
/// [`wait_ld`].
#[inline(always)]
pub unsafe fn ld_32x32b_x8(taddr: TmemAddr) -> [u32; 8] {
    let (r0, r1, r2, r3, r4, r5, r6, r7): (u32, u32, u32, u32, u32, u32, u32, u32);
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!(
            "tcgen05.ld.sync.aligned.32x32b.x8.b32 {{{r0}, {r1}, {r2}, {r3}, {r4}, {r5}, {r6}, {r7}}}, [{t}];",
            r0 = out(reg32) r0, r1 = out(reg32) r1, r2 = out(reg32) r2, r3 = out(reg32) r3,
            r4 = out(reg32) r4, r5 = out(reg32) r5, r6 = out(reg32) r6, r7 = out(reg32) r7,
            t = in(reg32) taddr.0, options(nostack),
        );
    }
    [r0, r1, r2, r3, r4, r5, r6, r7]
}

/// `tcgen05.ld.sync.aligned.32x32b.x16.b32`: as [`ld_32x32b_x8`], 16
/// consecutive columns per lane.
///
/// # Safety
/// As [`ld_32x32b_x8`].
#[inline(always)]
pub unsafe fn ld_32x32b_x16(taddr: TmemAddr) -> [u32; 16] {
    let mut r = [0u32; 16];
    // SAFETY: forwarded from the caller. Not `pure`: a warp collective
    // (see `ptx::sync::shfl_xor_f32`).
    unsafe {
        asm!(
            "tcgen05.ld.sync.aligned.32x32b.x16.b32 {{{r0}, {r1}, {r2}, {r3}, {r4}, {r5}, {r6}, {r7}, {r8}, {r9}, {r10}, {r11}, {r12}, {r13}, {r14}, {r15}}}, [{t}];",
            r0 = out(reg32) r[0], r1 = out(reg32) r[1], r2 = out(reg32) r[2], r3 = out(reg32) r[3],
            r4 = out(reg32) r[4], r5 = out(reg32) r[5], r6 = out(reg32) r[6], r7 = out(reg32) r[7],
            r8 = out(reg32) r[8], r9 = out(reg32) r[9], r10 = out(reg32) r[10], r11 = out(reg32) r[11],
            r12 = out(reg32) r[12], r13 = out(reg32) r[13], r14 = out(reg32) r[14], r15 = out(reg32) r[15],
            t = in(reg32) taddr.0, options(nostack),
        );
    }
    r
}

/// `tcgen05.st.sync.aligned.32x32b.x16.b32`: each lane of the warp writes
/// `v` to 16 consecutive 32-bit columns of its tensor-memory lane, starting
/// at `taddr` (whose lane field selects the warp's 32-lane quarter). Used
/// by the bring-up probes to mark accumulator cells before an MMA.
///
/// # Safety
/// One full warp executes it; the columns lie in this CTA's allocation and
/// the lanes in the warp's quarter (warp % 4); no tcgen05 operation may
/// access the cells until [`wait_st`] (and, for another thread's MMA, a
/// [`fence_before_thread_sync`] / barrier / [`fence_after_thread_sync`]).
#[inline(always)]
pub unsafe fn st_32x32b_x16(taddr: TmemAddr, v: [u32; 16]) {
    // SAFETY: forwarded from the caller. A warp collective with side
    // effects (not `pure`).
    unsafe {
        asm!(
            "tcgen05.st.sync.aligned.32x32b.x16.b32 [{t}], {{{r0}, {r1}, {r2}, {r3}, {r4}, {r5}, {r6}, {r7}, {r8}, {r9}, {r10}, {r11}, {r12}, {r13}, {r14}, {r15}}};",
            t = in(reg32) taddr.0,
            r0 = in(reg32) v[0], r1 = in(reg32) v[1], r2 = in(reg32) v[2], r3 = in(reg32) v[3],
            r4 = in(reg32) v[4], r5 = in(reg32) v[5], r6 = in(reg32) v[6], r7 = in(reg32) v[7],
            r8 = in(reg32) v[8], r9 = in(reg32) v[9], r10 = in(reg32) v[10], r11 = in(reg32) v[11],
            r12 = in(reg32) v[12], r13 = in(reg32) v[13], r14 = in(reg32) v[14], r15 = in(reg32) v[15],
            options(nostack),
        );
    }
}

/// `tcgen05.wait::st.sync.aligned`: this thread's tensor-memory stores are done.
#[inline(always)]
pub fn wait_st() {
    // SAFETY: a wait with no operands.
    unsafe { asm!("tcgen05.wait::st.sync.aligned;", options(nostack)) }
}

/// `tcgen05.wait::ld.sync.aligned`: this thread's tensor-memory loads are done.
#[inline(always)]
pub fn wait_ld() {
    // SAFETY: a wait with no operands.
    unsafe { asm!("tcgen05.wait::ld.sync.aligned;", options(nostack)) }
}

/// `tcgen05.fence::before_thread_sync`: orders this thread's tcgen05
/// operations before a following barrier.
#[inline(always)]
pub fn fence_before_thread_sync() {
    // SAFETY: a fence with no operands.
    unsafe { asm!("tcgen05.fence::before_thread_sync;", options(nostack)) }
}

/// `tcgen05.fence::after_thread_sync`: orders tcgen05 operations after a
/// preceding barrier or mbarrier wait.
#[inline(always)]
pub fn fence_after_thread_sync() {
    // SAFETY: a fence with no operands.
    unsafe { asm!("tcgen05.fence::after_thread_sync;", options(nostack)) }
}
