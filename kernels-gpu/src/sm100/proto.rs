//! The stage-2 synchronisation protocol, written once. **Not executed on
//! hardware.**
//!
//! Each role's loop (the order of its barrier waits, arrivals, commits,
//! asynchronous copies and buffer accesses, per row and per chunk) is one
//! function here, generic over [`Machine`] (the synchronisation
//! operations) and a role trait (the role's data work: [`LoadWork`],
//! [`MmaWork`], [`ComputeWork`], [`ReduceWork`]). Two implementations run
//! these same functions:
//! - the device roles (`load.rs`, `mma.rs`, `compute.rs`, `reduce.rs`, on
//!   `dev::Dev`): every operation is the real `mbarrier` / `tcgen05` / TMA /
//!   bulk instruction, every hook the real data work;
//! - the host model check (`model.rs`, tests only): a recorder turns each
//!   role into a trace of operations, and a checker explores every
//!   interleaving of the traces and of the asynchronous completions against
//!   a model of the PTX semantics (see there for what it checks).
//!
//! Phases: every barrier operation names the 0-based phase it belongs to
//! (the `n`-th chunk, the `r`-th row, the round of a ring slot). The
//! hardware sees only the parity of a wait's phase (`sched::parity`) and
//! counts arrivals into whatever phase is current; the model checks both
//! against the full index, which is how it sees an arrival past a phase's
//! count or a waiter that fell a phase behind.
//!
//! Barriers (mbarriers in shared memory; "n" counts chunks, "r" rows of
//! this CTA; phases from `sched::slot`):
//!
//! | barrier | arrivals per phase | phase | meaning |
//! |---|---|---|---|
//! | `FULL[s]` | 32 load lanes + 32 KiB tx | round of the use | K stage s and its slot metadata are filled |
//! | `EMPTY[s]` | MMA commit + 4 compute + 4 reduce warps | round of the use | stage s (K rows and slot metadata) is no longer read |
//! | `Q_FULL[b]` | load lane 0 + q bytes tx | round of the row | q buffer b holds the row's q |
//! | `Q_EMPTY[b]` | MMA commit | round of the row | the row's last MMA reading q buffer b is done |
//! | `S_READY` | MMA commit | n | S of chunk n is in tensor memory |
//! | `DS_READY` | 4 compute warps | n | dS of chunk n is in shared memory (S read) |
//! | `DK_READY` | MMA commit | n | dK of chunk n is in tensor memory (dS read) |
//! | `DK_FREE` | 4 reduce warps | n | dK of chunk n was read out of tensor memory |
//! | `DQ_READY` | MMA commit | r | dQ of row r is complete |
//! | `DQ_FREE` | 4 compute warps | r | dQ of row r was read out |

use super::budget::{sw128_region, K_STAGES, Q_STAGES, SMEM_K_REGION, SMEM_K_STAGE};
use super::sched::slot;

/// Barrier indices (8 bytes each from `budget::OFF_BARS`).
pub const FULL: u32 = 0;
/// See [`FULL`].
pub const EMPTY: u32 = FULL + K_STAGES;
/// See [`FULL`].
pub const Q_FULL: u32 = EMPTY + K_STAGES;
/// See [`FULL`].
pub const Q_EMPTY: u32 = Q_FULL + Q_STAGES;
/// See [`FULL`].
pub const S_READY: u32 = Q_EMPTY + Q_STAGES;
/// See [`FULL`].
pub const DS_READY: u32 = S_READY + 1;
/// See [`FULL`].
pub const DK_READY: u32 = DS_READY + 1;
/// See [`FULL`].
pub const DK_FREE: u32 = DK_READY + 1;
/// See [`FULL`].
pub const DQ_READY: u32 = DK_FREE + 1;
/// See [`FULL`].
pub const DQ_FREE: u32 = DQ_READY + 1;
/// Number of barriers.
pub const NUM_BARS: u32 = DQ_FREE + 1;

/// Compute warps (0..4, one warpgroup: a warp reaches only the
/// tensor-memory sub-partition `warp % 4`).
pub const COMPUTE_WARPS: u32 = 4;
/// First reduce warp (a whole warpgroup: warp % 4 = 0..3).
pub const REDUCE_WARP0: u32 = 4;
/// Reduce warps.
pub const REDUCE_WARPS: u32 = 4;
/// The K-load warp.
pub const LOAD_WARP: u32 = 8;
/// The MMA warp (also allocates and frees tensor memory).
pub const MMA_WARP: u32 = 9;
/// Lanes of the load warp; each arrives on `FULL[s]` once per fill.
pub const LOAD_LANES: u32 = 32;
const _: () = assert!(REDUCE_WARP0 == COMPUTE_WARPS && REDUCE_WARP0.is_multiple_of(4));
const _: () = assert!(LOAD_WARP == REDUCE_WARP0 + REDUCE_WARPS && MMA_WARP == LOAD_WARP + 1);

/// Rows of K one `tile::gather4` lands.
pub const GATHER_ROWS: u32 = 4;
/// Bytes the load warp's gathers of one half of a K stage (D columns
/// 0..64 or 64..128) complete on `FULL[s]`: every lane gathers four rows of
/// 64 bf16.
pub const K_HALF_BYTES: u32 = LOAD_LANES * GATHER_ROWS * 64 * 2;
const _: () = assert!(K_HALF_BYTES == SMEM_K_REGION && 2 * K_HALF_BYTES == SMEM_K_STAGE);

/// Bytes one q tile load (a box of `heads` rows of 64 bf16) completes on
/// `Q_FULL[b]`.
pub const fn q_half_bytes(heads: u32) -> u32 {
    sw128_region(heads)
}

/// Arrivals barrier `bar` expects per phase (`mbarrier.init` count).
pub const fn arrivals(bar: u32) -> u32 {
    if bar < EMPTY {
        LOAD_LANES
    } else if bar < Q_FULL {
        1 + COMPUTE_WARPS + REDUCE_WARPS
    } else if bar < S_READY {
        1
    } else {
        match bar {
            DS_READY | DQ_FREE => COMPUTE_WARPS,
            DK_FREE => REDUCE_WARPS,
            _ => 1,
        }
    }
}

/// Mutations of the protocol that the model check's tests plant to show
/// it catches them. The device uses [`Plant::None`] (the default of
/// [`Machine::PLANT`]), for which every branch on it folds away at compile
/// time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plant {
    /// The protocol as written.
    None,
    /// The reduce warps release dK (`DK_FREE`) before reading it out.
    EarlyDkFree,
    /// The MMA role releases the K stage (`EMPTY[s]`) right after S, as if
    /// only S read K (dQ = dS K reads it too).
    EarlyEmptyCommit,
    /// The MMA role drains only the last commit to `EMPTY` and to
    /// `Q_EMPTY` before exiting (as it did before the model check), as if
    /// commits arrived in issue order.
    DrainLastOnly,
}

/// Synchronisation operations of one actor: a warp (the load, compute and
/// reduce roles), or the one lane that issues MMAs. "Arrive" is one
/// arrival per executing lane; roles arrive once per warp inside
/// [`Machine::lane0`].
pub trait Machine {
    /// Planted protocol mutation (tests only).
    const PLANT: Plant = Plant::None;
    /// `mbarrier.try_wait.parity` until phase `phase` of barrier `bar` has
    /// completed (acquire).
    fn wait(&mut self, bar: u32, phase: u32);
    /// One arrival (release) for phase `phase` of barrier `bar`.
    fn arrive(&mut self, bar: u32, phase: u32);
    /// One arrival for phase `phase` of `bar` that also expects `bytes`
    /// transaction bytes in that phase.
    fn arrive_expect_tx(&mut self, bar: u32, phase: u32, bytes: u32);
    /// `tcgen05.commit`: one arrival on `bar` (for its phase `phase`) once
    /// every MMA this thread issued before it has completed.
    fn commit(&mut self, bar: u32, phase: u32);
    /// Waits until this thread's bulk reductions have read their
    /// shared-memory source.
    fn bulk_wait_read(&mut self);
    /// Waits until this thread's bulk reductions have completed.
    fn bulk_wait(&mut self);
    /// `tcgen05.fence::before_thread_sync`: orders this thread's earlier
    /// tensor-memory accesses before its next arrival.
    fn tc_fence_before(&mut self);
    /// `tcgen05.fence::after_thread_sync`: orders this thread's later
    /// tensor-memory accesses after its last wait.
    fn tc_fence_after(&mut self);
    /// `fence.proxy.async.shared::cta`: orders this thread's generic
    /// shared-memory writes before async-proxy (tensor core, bulk) reads.
    fn proxy_fence(&mut self);
    /// `bar.warp.sync`: the warp's lanes reconverge.
    fn warp_sync(&mut self);
    /// Runs `f` on lane 0 of the warp only (no warp collectives inside).
    fn lane0(&mut self, f: impl FnOnce(&mut Self));
    /// Runs `f` on lane 0 and `others` on the other lanes (no warp
    /// collectives inside).
    fn lane0_else(&mut self, f: impl FnOnce(&mut Self), others: impl FnOnce(&mut Self));
}

/// Data work of the K-load warp.
pub trait LoadWork: Machine {
    /// Starts row `row` (its batch).
    fn begin_row(&mut self, row: u32);
    /// Lane 0: issues the TMA tile load of half `half` (D columns
    /// `64 half ..`) of row `row`'s q into q buffer `buf`, completing
    /// [`q_half_bytes`] on phase `phase` of `bar`.
    fn load_q(&mut self, row: u32, buf: u32, half: u32, bar: u32, phase: u32);
    /// Reads the ids and grad_signal of chunk `chunk` of row `row` and
    /// writes the slot metadata of K stage `stage`.
    fn fill_meta(&mut self, row: u32, chunk: u32, stage: u32);
    /// Issues the gathers of half `half` of K stage `stage` (the rows
    /// [`LoadWork::fill_meta`] resolved), completing [`K_HALF_BYTES`] on
    /// phase `phase` of `bar`.
    fn gather_k(&mut self, stage: u32, half: u32, bar: u32, phase: u32);
}

/// Data work of the MMA lane (each call issues a chain of `tcgen05.mma`).
pub trait MmaWork: Machine {
    /// S = q K^T: reads q buffer `buf` and K stage `stage`, writes the S
    /// accumulator.
    fn mma_s(&mut self, buf: u32, stage: u32);
    /// dQ (+)= dS K: reads dS and K stage `stage`, writes (`accumulate`:
    /// adds to) the dQ accumulator.
    fn mma_dq(&mut self, stage: u32, accumulate: bool);
    /// dK = dS^T q: reads dS and q buffer `buf`, writes the dK accumulator.
    fn mma_dk(&mut self, buf: u32);
}

/// Data work of a compute warp.
pub trait ComputeWork: Machine {
    /// Starts row `row` (its weights; d_weights sums to zero).
    fn begin_row(&mut self, row: u32);
    /// Reads S (tensor memory) and the slot metadata of K stage `stage`,
    /// writes the warp's rows of dS, adds to d_weights.
    fn gate(&mut self, stage: u32);
    /// Reads the warp's rows of dQ (tensor memory), writes them to
    /// `d_index_q` of row `row`.
    fn read_dq(&mut self, row: u32);
    /// Writes `d_weights` of row `row`.
    fn store_dw(&mut self, row: u32);
}

/// Data work of a reduce warp.
pub trait ReduceWork: Machine {
    /// Reads the lane's key row from the slot metadata of K stage `stage`.
    fn read_key(&mut self, stage: u32);
    /// Reads the warp's rows of dK (tensor memory) into its staging rows.
    fn stage_dk(&mut self);
    /// For a valid key: `fence.proxy.async`, then one bulk reduction of the
    /// lane's staging row into the dK accumulator (asynchronous read of the
    /// staging row).
    fn reduce_dk(&mut self);
}

/// The query rows of one CTA: `first, first + step, ...` below `end`
/// (`crate::sched::rows_of`).
#[derive(Clone, Copy, Debug)]
pub struct Rows {
    /// This CTA's first row.
    pub first: u32,
    /// The grid size.
    pub step: u32,
    /// `B * S_q`.
    pub end: u32,
}

/// The K-load warp (all 32 lanes): q per row once its buffer is free, then
/// per chunk the slot metadata and the K gathers of a free stage.
#[inline(always)]
pub fn load<M: LoadWork>(m: &mut M, rows: Rows, nch: u32, heads: u32) {
    let (mut n, mut r) = (0u32, 0u32);
    let mut row = rows.first;
    while row < rows.end {
        m.begin_row(row);
        let qs = slot(r, Q_STAGES);
        m.lane0(|m| {
            if let Some(ph) = qs.empty_phase {
                m.wait(Q_EMPTY + qs.index, ph);
            }
            let bar = Q_FULL + qs.index;
            m.arrive_expect_tx(bar, qs.full_phase, 2 * q_half_bytes(heads));
            for half in 0..2 {
                m.load_q(row, qs.index, half, bar, qs.full_phase);
            }
        });
        for k in 0..nch {
            let ks = slot(n, K_STAGES);
            if let Some(ph) = ks.empty_phase {
                m.wait(EMPTY + ks.index, ph);
            }
            m.fill_meta(row, k, ks.index);
            let full = FULL + ks.index;
            m.lane0_else(
                |m| m.arrive_expect_tx(full, ks.full_phase, SMEM_K_STAGE),
                |m| m.arrive(full, ks.full_phase),
            );
            // Every arrival (so the expected bytes) precedes every
            // gather's completion.
            m.warp_sync();
            for half in 0..2 {
                m.gather_k(ks.index, half, full, ks.full_phase);
            }
            n += 1;
        }
        r += 1;
        row += rows.step;
    }
}

/// Waits for a phase, then orders later tcgen05 operations after the wait.
#[inline(always)]
fn wait_tc<M: Machine>(m: &mut M, bar: u32, phase: u32) {
    m.wait(bar, phase);
    m.tc_fence_after();
}

/// The MMA lane: per chunk S, then (dS written) dQ and (dK read out) dK,
/// each commit releasing what the MMAs before it read or wrote; at the end
/// it waits for the commits no other role waits for to land.
#[inline(always)]
pub fn mma<M: MmaWork>(m: &mut M, rows: Rows, nch: u32) {
    let (mut n, mut r) = (0u32, 0u32);
    let mut row = rows.first;
    while row < rows.end {
        let qs = slot(r, Q_STAGES);
        wait_tc(m, Q_FULL + qs.index, qs.full_phase);
        for k in 0..nch {
            let ks = slot(n, K_STAGES);
            wait_tc(m, FULL + ks.index, ks.full_phase);
            m.mma_s(qs.index, ks.index);
            m.commit(S_READY, n);
            if M::PLANT == Plant::EarlyEmptyCommit {
                m.commit(EMPTY + ks.index, ks.full_phase);
            }
            wait_tc(m, DS_READY, n);
            if k == 0 && r > 0 {
                wait_tc(m, DQ_FREE, r - 1);
            }
            m.mma_dq(ks.index, k > 0);
            if n > 0 {
                wait_tc(m, DK_FREE, n - 1);
            }
            m.mma_dk(qs.index);
            if M::PLANT != Plant::EarlyEmptyCommit {
                m.commit(EMPTY + ks.index, ks.full_phase);
            }
            m.commit(DK_READY, n);
            if k + 1 == nch {
                m.commit(DQ_READY, r);
                m.commit(Q_EMPTY + qs.index, qs.full_phase);
            }
            n += 1;
        }
        r += 1;
        row += rows.step;
    }
    // Let every commit's arrival land before the CTA may exit. The ISA does
    // not order the arrivals of different commits; the other roles wait for
    // all of them but the last release of each K stage and each q buffer,
    // so wait for those here.
    let (stages, bufs) = if M::PLANT == Plant::DrainLastOnly {
        (1, 1)
    } else {
        (K_STAGES, Q_STAGES)
    };
    for i in 1..=n.min(stages) {
        let ks = slot(n - i, K_STAGES);
        m.wait(EMPTY + ks.index, ks.full_phase);
    }
    for i in 1..=r.min(bufs) {
        let qs = slot(r - i, Q_STAGES);
        m.wait(Q_EMPTY + qs.index, qs.full_phase);
    }
}

/// A compute warp: per chunk gate S into dS (S and the stage metadata
/// released on `DS_READY` / `EMPTY[s]`), per row read dQ out.
#[inline(always)]
pub fn compute<M: ComputeWork>(m: &mut M, rows: Rows, nch: u32) {
    let (mut n, mut r) = (0u32, 0u32);
    let mut row = rows.first;
    while row < rows.end {
        m.begin_row(row);
        for _ in 0..nch {
            let ks = slot(n, K_STAGES);
            // The load role's metadata writes are released on FULL[s].
            m.wait(FULL + ks.index, ks.full_phase);
            wait_tc(m, S_READY, n);
            m.gate(ks.index);
            // dS is read by the tensor cores (async proxy); S reads are
            // complete (wait::ld) before the arrival.
            m.proxy_fence();
            m.tc_fence_before();
            m.warp_sync();
            m.lane0(|m| {
                m.arrive(DS_READY, n);
                // This warp is done with the stage's metadata.
                m.arrive(EMPTY + ks.index, ks.full_phase);
            });
            n += 1;
        }
        wait_tc(m, DQ_READY, r);
        m.read_dq(row);
        m.tc_fence_before();
        m.warp_sync();
        m.lane0(|m| m.arrive(DQ_FREE, r));
        m.store_dw(row);
        r += 1;
        row += rows.step;
    }
}

/// A reduce warp: per chunk its slots' key rows (stage released on
/// `EMPTY[s]`), then dK out of tensor memory (released on `DK_FREE`) into
/// its staging rows and bulk reductions; at the end it waits for them.
#[inline(always)]
pub fn reduce<M: ReduceWork>(m: &mut M, rows: Rows, nch: u32) {
    let mut n = 0u32;
    let mut row = rows.first;
    while row < rows.end {
        for _ in 0..nch {
            let ks = slot(n, K_STAGES);
            m.wait(FULL + ks.index, ks.full_phase);
            m.read_key(ks.index);
            m.warp_sync();
            m.lane0(|m| m.arrive(EMPTY + ks.index, ks.full_phase));
            wait_tc(m, DK_READY, n);
            // The previous bulk reductions have read the staging rows.
            m.bulk_wait_read();
            if M::PLANT == Plant::EarlyDkFree {
                m.lane0(|m| m.arrive(DK_FREE, n));
            }
            m.stage_dk();
            m.tc_fence_before();
            m.warp_sync();
            if M::PLANT != Plant::EarlyDkFree {
                m.lane0(|m| m.arrive(DK_FREE, n));
            }
            m.reduce_dk();
            n += 1;
        }
        row += rows.step;
    }
    // The bulk reductions must land before the grid completes.
    m.bulk_wait();
}
