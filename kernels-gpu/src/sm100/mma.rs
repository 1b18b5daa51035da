//! Stage-2 MMA role (warp 9; lane 0 issues, the other lanes go straight to
//! the teardown barrier). **Not executed.**
//!
//! Its order of operations is `proto::mma`. Per chunk n (K stage s, q
//! buffer of the row):
//! 1. wait `FULL[s]`; S = q K^T into `TMEM_S` (8 K steps); commit `S_READY`;
//! 2. wait `DS_READY` (the compute role has read S and written dS);
//! 3. first chunk of a row: wait `DQ_FREE` of the previous row; dQ (+)= dS K
//!    into `TMEM_DQ` (8 K steps, overwriting at the row's first step);
//! 4. wait `DK_FREE` of the previous chunk; dK = dS^T q into `TMEM_DK`
//!    (H / 16 K steps: padded heads are skipped);
//! 5. commit `EMPTY[s]` and `DK_READY`; after the row's last chunk also
//!    `DQ_READY` and `Q_EMPTY[b]`.
//!
//! Before leaving it waits for the last release of every K stage and every
//! q buffer (commit arrivals may land in any order; the other roles wait
//! for all the other commits), so no commit arrival is still in flight
//! when the CTA exits.
//!
//! A commit's arrival means every MMA this thread issued before it is
//! complete, so each commit also releases everything earlier ones did.

use super::budget::{TMEM_DK, TMEM_DQ, TMEM_S};
use super::ctx::Ctx;
use super::dev::Dev;
use super::operands::{
    dk_descs, dk_steps, dq_descs, s_descs, DQ_STEPS, IDESC_DK, IDESC_DQ, IDESC_S, S_STEPS,
};
use super::proto::{self, MmaWork, Rows};
use crate::ptx::sreg;
use crate::ptx::tcgen05::{self, TmemAddr};

/// The MMA lane's state for `H` heads: the three accumulators.
pub(super) struct Mma<const H: u32> {
    s_acc: TmemAddr,
    dq_acc: TmemAddr,
    dk_acc: TmemAddr,
}

// SAFETY (every method): the skeleton's waits hand each operand to this
// thread (see the module docs); descriptors come from `sm100::operands`,
// whose layouts the host tests check; the accumulators lie in the 512
// allocated columns (`sm100::budget`).
impl<const H: u32> MmaWork for Dev<'_, Mma<H>> {
    #[inline(always)]
    fn mma_s(&mut self, buf: u32, stage: u32) {
        let (q, kb) = (self.c.q_buf(buf).0, self.c.k_stage(stage).0);
        for st in 0..S_STEPS {
            let (a, b) = s_descs(q, kb, st);
            // SAFETY: see the impl.
            unsafe { tcgen05::mma_f16(self.role.s_acc, a, b, IDESC_S, st > 0) };
        }
    }
    #[inline(always)]
    fn mma_dq(&mut self, stage: u32, accumulate: bool) {
        let (ds, kb) = (self.c.ds().0, self.c.k_stage(stage).0);
        for st in 0..DQ_STEPS {
            let (a, b) = dq_descs(ds, kb, st);
            // SAFETY: see the impl.
            unsafe { tcgen05::mma_f16(self.role.dq_acc, a, b, IDESC_DQ, accumulate || st > 0) };
        }
    }
    #[inline(always)]
    fn mma_dk(&mut self, buf: u32) {
        let (ds, q) = (self.c.ds().0, self.c.q_buf(buf).0);
        for st in 0..dk_steps(H) {
            let (a, b) = dk_descs(ds, q, st);
            // SAFETY: see the impl.
            unsafe { tcgen05::mma_f16(self.role.dk_acc, a, b, IDESC_DK, st > 0) };
        }
    }
}

/// # Safety
/// Called by the whole MMA warp under the stage-2 launch contract.
#[inline(always)]
pub(super) unsafe fn run<const NCH: u32, const H: u32>(c: &Ctx<'_>) {
    if sreg::thread_idx_x() % 32 != 0 {
        return;
    }
    let role = Mma::<H> {
        s_acc: TmemAddr(c.tmem.0 + TMEM_S),
        dq_acc: TmemAddr(c.tmem.0 + TMEM_DQ),
        dk_acc: TmemAddr(c.tmem.0 + TMEM_DK),
    };
    // SAFETY: forwarded launch contract; this is the MMA warp's lane 0.
    let mut m = unsafe { Dev::new(c, role) };
    let rows = Rows {
        first: c.cta,
        step: c.ctas,
        end: c.rows,
    };
    proto::mma(&mut m, rows, NCH);
}
