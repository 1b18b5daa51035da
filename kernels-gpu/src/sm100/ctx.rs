//! The context every stage-2 role receives (`sm100::stage2` builds it; the
//! role modules and `sm100::dev` read it): parameters, the shared-memory
//! map and the tensor-memory base. A leaf of its own so that the roles and
//! the kernel that runs them do not use each other.

use super::budget::{
    DK_ROW_BYTES, OFF_BARS, OFF_DK, OFF_DS, OFF_K, OFF_META, OFF_Q, SM100_CHUNK, SMEM_K_STAGE,
    SMEM_META_STAGE, SMEM_Q,
};
use crate::abi::GradParams;
use crate::ptx::smem::SmemAddr;
use crate::ptx::tcgen05::TmemAddr;

/// What every role needs: parameters, shared-memory map, tensor memory.
pub(super) struct Ctx<'a> {
    /// Pointers, sizes, scalars.
    pub p: &'a GradParams,
    /// Dynamic shared-memory base (1024-byte aligned).
    pub base: SmemAddr,
    /// Tensor-memory base of this CTA's allocation.
    pub tmem: TmemAddr,
    /// Generic addresses of the two tensor maps (kernel parameter space).
    pub k_map: u64,
    /// See [`Ctx::k_map`].
    pub q_map: u64,
    /// This CTA, the grid size, and the number of query rows `B*S_q`.
    pub cta: u32,
    /// See [`Ctx::cta`].
    pub ctas: u32,
    /// See [`Ctx::cta`].
    pub rows: u32,
}

impl Ctx<'_> {
    /// mbarrier number `i`.
    pub fn bar(&self, i: u32) -> SmemAddr {
        self.base.add(OFF_BARS + 8 * i)
    }
    /// K stage `s`.
    pub fn k_stage(&self, s: u32) -> SmemAddr {
        self.base.add(OFF_K + s * SMEM_K_STAGE)
    }
    /// q buffer `b`.
    pub fn q_buf(&self, b: u32) -> SmemAddr {
        self.base.add(OFF_Q + b * SMEM_Q)
    }
    /// The dS tile.
    pub fn ds(&self) -> SmemAddr {
        self.base.add(OFF_DS)
    }
    /// Staged dK row of chunk slot `slot`.
    pub fn dk_row(&self, slot: u32) -> SmemAddr {
        self.base.add(OFF_DK + slot * DK_ROW_BYTES)
    }
    /// Resolved key row (i32, -1 for padding) of slot `slot` of stage `s`.
    pub fn meta_row(&self, s: u32, slot: u32) -> SmemAddr {
        self.base.add(OFF_META + s * SMEM_META_STAGE + 4 * slot)
    }
    /// grad_signal (f32) of slot `slot` of stage `s`.
    pub fn meta_gs(&self, s: u32, slot: u32) -> SmemAddr {
        self.base
            .add(OFF_META + s * SMEM_META_STAGE + 4 * SM100_CHUNK + 4 * slot)
    }
}
