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
