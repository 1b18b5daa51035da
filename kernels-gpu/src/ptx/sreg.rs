//! Special registers: thread, block and lane indices.

/// `%tid.x`.
#[inline(always)]
pub fn thread_idx_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { core::arch::nvptx::_thread_idx_x() as u32 }
}

/// `%ctaid.x`.
#[inline(always)]
pub fn block_idx_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { core::arch::nvptx::_block_idx_x() as u32 }
}

/// `%ntid.x`.
#[inline(always)]
pub fn block_dim_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { core::arch::nvptx::_block_dim_x() as u32 }
}

/// `%nctaid.x`.
#[inline(always)]
pub fn grid_dim_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { core::arch::nvptx::_grid_dim_x() as u32 }
}

/// `%ctaid.x`, read where the call is: an asm statement with side effects,
/// so the compiler neither hoists it out of a loop nor merges it with
/// another read, and the value need not stay in a register across the
/// loop (an S2R per call instead). For kernels at their register cap,
/// where a hoisted copy held across the loop makes ptxas spill.
#[inline(always)]
pub fn block_idx_x_here() -> u32 {
    let r: u32;
    // SAFETY: reads a special register; no memory is touched. Not `pure`
    // on purpose (see above).
    unsafe { core::arch::asm!("mov.u32 {r}, %ctaid.x;", r = out(reg32) r, options(nomem, nostack)) }
    r
}

/// `%tid.x`, read where the call is (as [`block_idx_x_here`]): what a
/// loop derives from it is computed in each iteration instead of being
/// hoisted and held in registers across the loop.
#[inline(always)]
pub fn thread_idx_x_here() -> u32 {
    let r: u32;
    // SAFETY: reads a special register; no memory is touched. Not `pure`
    // on purpose (see above).
    unsafe { core::arch::asm!("mov.u32 {r}, %tid.x;", r = out(reg32) r, options(nomem, nostack)) }
    r
}

/// `%globaltimer`: nanoseconds of a global clock (coarse-grained updates;
/// for timeouts, not for timing kernels).
#[inline(always)]
pub fn global_timer_ns() -> u64 {
    let r: u64;
    // SAFETY: reads a special register; no memory is touched. Not `pure`:
    // each read must happen where it is written (a timeout loop).
    unsafe {
        core::arch::asm!("mov.u64 {r}, %globaltimer;", r = out(reg64) r, options(nomem, nostack))
    }
    r
}

/// `%smid`: the multiprocessor this thread runs on (for diagnostics).
#[inline(always)]
pub fn sm_id() -> u32 {
    let r: u32;
    // SAFETY: reads a special register; no memory is touched.
    unsafe { core::arch::asm!("mov.u32 {r}, %smid;", r = out(reg32) r, options(nomem, nostack)) }
    r
}
