//! Stage-2 MMA role (warp 9; lane 0 issues, the other lanes go straight to
//! the teardown barrier). **Not executed.**
//!
//! Per chunk n (K stage s, q buffer of the row):
//! 1. wait `FULL[s]`; S = q K^T into `TMEM_S` (8 K steps); commit `S_READY`;
//! 2. wait `DS_READY` (the compute role has read S and written dS);
//! 3. first chunk of a row: wait `DQ_FREE` of the previous row; dQ (+)= dS K
//!    into `TMEM_DQ` (8 K steps, overwriting at the row's first step);
//! 4. wait `DK_FREE` of the previous chunk; dK = dS^T q into `TMEM_DK`
//!    (H / 16 K steps: padded heads are skipped);
//! 5. commit `EMPTY[s]` and `DK_READY`; after the row's last chunk also
//!    `DQ_READY` and `Q_EMPTY[b]`.
//!
//! Before leaving it waits for the last `EMPTY` and `Q_EMPTY` phases, so
//! no commit arrival is still in flight when the CTA exits.
//!
//! A commit's arrival means every MMA this thread issued before it is
//! complete, so each commit also releases everything earlier ones did.

use super::budget::{K_STAGES, Q_STAGES, TMEM_DK, TMEM_DQ, TMEM_S};
use super::operands::{
    dk_descs, dk_steps, dq_descs, s_descs, DQ_STEPS, IDESC_DK, IDESC_DQ, IDESC_S, S_STEPS,
};
use super::sched::{parity, slot};
use super::stage2::{
    Ctx, DK_FREE, DK_READY, DQ_FREE, DQ_READY, DS_READY, EMPTY, FULL, Q_EMPTY, Q_FULL, S_READY,
};
use crate::ptx::tcgen05::{self, TmemAddr};
use crate::ptx::{mbarrier, sreg};

/// Waits for `parity` on barrier `i`, then orders later tcgen05 operations
/// after the wait.
///
/// # Safety
/// Barrier `i` is initialised.
#[inline(always)]
unsafe fn wait(c: &Ctx<'_>, i: u32, parity: u32) {
    // SAFETY: forwarded.
    unsafe { mbarrier::wait_parity(c.bar(i), parity) };
    tcgen05::fence_after_thread_sync();
}

/// # Safety
/// Called by the whole MMA warp under the stage-2 launch contract.
#[inline(always)]
pub(super) unsafe fn run<const NCH: u32, const H: u32>(c: &Ctx<'_>) {
    if sreg::thread_idx_x() % 32 != 0 {
        return;
    }
    let s_acc = TmemAddr(c.tmem.0 + TMEM_S);
    let dq_acc = TmemAddr(c.tmem.0 + TMEM_DQ);
    let dk_acc = TmemAddr(c.tmem.0 + TMEM_DK);
    let ds = c.ds().0;
    let (mut n, mut r) = (0u32, 0u32);
    let mut row = c.cta;
    while row < c.rows {
        let qs = slot(r, Q_STAGES);
        let q = c.q_buf(qs.index).0;
        // SAFETY (whole row): the waits below hand each operand to this
        // thread (see the module docs); descriptors come from
        // `sm100::operands`, whose layouts the host tests check; the
        // accumulators lie in the 512 allocated columns (`sm100::budget`).
        unsafe {
            wait(c, Q_FULL + qs.index, qs.full_parity);
            for k in 0..NCH {
                let ks = slot(n, K_STAGES);
                let kb = c.k_stage(ks.index).0;
                wait(c, FULL + ks.index, ks.full_parity);
                for st in 0..S_STEPS {
                    let (a, b) = s_descs(q, kb, st);
                    tcgen05::mma_f16(s_acc, a, b, IDESC_S, st > 0);
                }
                tcgen05::commit(c.bar(S_READY));
                wait(c, DS_READY, parity(n));
                if k == 0 && r > 0 {
                    wait(c, DQ_FREE, parity(r - 1));
                }
                for st in 0..DQ_STEPS {
                    let (a, b) = dq_descs(ds, kb, st);
                    tcgen05::mma_f16(dq_acc, a, b, IDESC_DQ, k > 0 || st > 0);
                }
                if n > 0 {
                    wait(c, DK_FREE, parity(n - 1));
                }
                for st in 0..dk_steps(H) {
                    let (a, b) = dk_descs(ds, q, st);
                    tcgen05::mma_f16(dk_acc, a, b, IDESC_DK, st > 0);
                }
                tcgen05::commit(c.bar(EMPTY + ks.index));
                tcgen05::commit(c.bar(DK_READY));
                if k + 1 == NCH {
                    tcgen05::commit(c.bar(DQ_READY));
                    tcgen05::commit(c.bar(Q_EMPTY + qs.index));
                }
                n += 1;
            }
        }
        r += 1;
        row += c.ctas;
    }
    // Let the last commits' arrivals land before the CTA may exit: the last
    // K stage's release and the last q buffer's release (issued last).
    if r > 0 {
        let ks = slot(n - 1, K_STAGES);
        let qs = slot(r - 1, Q_STAGES);
        // SAFETY: initialised barriers; these phases complete once the
        // last MMAs finish and the other roles release the stage.
        unsafe {
            mbarrier::wait_parity(c.bar(EMPTY + ks.index), ks.full_parity);
            mbarrier::wait_parity(c.bar(Q_EMPTY + qs.index), qs.full_parity);
        }
    }
}
