//! Programmatic dependent launch (`griddepcontrol`, sm_90+).
//!
//! A kernel launched with the programmatic-stream-serialization attribute
//! may start while the previous kernel on the stream is still running; it
//! must call [`wait`] before touching anything that kernel writes. The
//! previous kernel calls [`launch_dependents`] once its remaining work no
//! longer blocks the dependent's prologue (the dependent still sees all of
//! the primary's memory writes after its own `wait`).

use core::arch::asm;

/// `griddepcontrol.wait`: blocks until every prerequisite grid has completed
/// and its memory operations are visible. A no-op when the kernel was not
/// launched as a programmatic dependent.
///
/// # Safety
/// None beyond being device code; marked unsafe because it is raw PTX.
#[inline(always)]
pub unsafe fn wait() {
    // SAFETY: no operands; orders this thread after the primary grid.
    unsafe { asm!("griddepcontrol.wait;", options(nostack)) };
}

/// `griddepcontrol.launch_dependents`: lets the dependent grid be scheduled
/// before this grid finishes. Harmless when no dependent exists.
///
/// # Safety
/// None beyond being device code; marked unsafe because it is raw PTX.
#[inline(always)]
pub unsafe fn launch_dependents() {
    // SAFETY: no operands; only a scheduling hint.
    unsafe { asm!("griddepcontrol.launch_dependents;", options(nostack)) };
}
