//! Timing events around the stages of [`crate::Plan::execute_profiled`].
//!
//! A leaf module: the launchers record into [`StageEvents`] and the plan
//! hands them through, so neither depends on the other for them.

use crate::error::Result;
use cudarc::driver::{sys, CudaContext, CudaEvent};
use std::sync::Arc;

/// Timing events around the stages of [`crate::Plan::execute_profiled`].
pub struct StageEvents {
    /// Before zeroing the f32 dK accumulator.
    pub start: CudaEvent,
    /// After zeroing (on the Hopper fast path: after the stage-1 kernel,
    /// which also zeroes; the event between the two launches costs their
    /// programmatic overlap, so profiled runs are slightly slower).
    pub zeroed: CudaEvent,
    /// After the gradient kernel.
    pub gradients: CudaEvent,
    /// After the bf16 cast (when there is one).
    pub end: CudaEvent,
}

/// Stage times in microseconds from [`StageEvents`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StageTimes {
    /// Zeroing of the dK accumulator.
    pub zeroing_us: f64,
    /// Score gradient and gradients (one fused kernel).
    pub gradients_us: f64,
    /// Cast of dK to bf16 (0 when d_index_k is f32).
    pub cast_us: f64,
    /// Whole `execute`.
    pub total_us: f64,
}

impl StageEvents {
    /// Four timing-enabled events on `ctx`.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<StageEvents> {
        let ev = || ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT));
        Ok(StageEvents {
            start: ev()?,
            zeroed: ev()?,
            gradients: ev()?,
            end: ev()?,
        })
    }

    /// Waits for the last event and returns the stage times.
    pub fn times(&self) -> Result<StageTimes> {
        self.end.synchronize()?;
        let us =
            |a: &CudaEvent, b: &CudaEvent| -> Result<f64> { Ok(a.elapsed_ms(b)? as f64 * 1e3) };
        Ok(StageTimes {
            zeroing_us: us(&self.start, &self.zeroed)?,
            gradients_us: us(&self.zeroed, &self.gradients)?,
            cast_us: us(&self.gradients, &self.end)?,
            total_us: us(&self.start, &self.end)?,
        })
    }
}
