//! Host model check of the stage-2 mbarrier protocol (tests only).
//!
//! The role skeletons of `proto` run here against a recorder, which turns
//! each actor into a trace of operations: the load warp, the MMA lane, each
//! of the four compute and four reduce warps (one actor per warp; an
//! arrival inside `lane0` counts once, outside it once per lane). A checker
//! then explores every interleaving of those traces and of the asynchronous
//! completions, depth first with a set of visited states, against a model
//! of the PTX semantics:
//! - mbarrier: a phase completes when its pending arrivals and transaction
//!   bytes both reach zero; `try_wait.parity` passes while the current
//!   phase's parity differs from the one asked for;
//! - TMA loads complete their bytes on their barrier and `tcgen05.commit`
//!   arrives once every MMA issued before it has completed, each a
//!   separate event delivered at any later point and in any order (a
//!   commit's arrival carries what its thread knew when it issued it);
//! - tensor-memory loads (`tcgen05.ld` + `wait::ld`) and generic
//!   shared-memory accesses are synchronous; MMAs, TMA loads and bulk
//!   reductions access their operands from issue to completion, which an
//!   actor learns only through a barrier phase (TMA loads, commits) or its
//!   own bulk wait; MMAs on one accumulator execute in issue order (the
//!   ISA's pipelined pairs), other asynchronous operations in any order.
//!
//! What it reports: a deadlock (some actor has not finished and nothing can
//! move); an arrival or transaction bytes past a phase's count (every
//! operation names the phase it means, see `proto`), or for a later phase
//! than the open one; a wait whose parity aliases another phase (it passes
//! before its phase completed, or its barrier ran two phases ahead: the
//! wrap-around a parity wait cannot see); a race: two accesses to a staged
//! buffer or tensor-memory region, one a write, with no happens-before
//! edge between them (vector clocks carried through barrier phases,
//! commits and bulk waits); an async-proxy read of a generic write with no
//! `fence.proxy.async` ordered between them; a tensor-memory access after a
//! wait without `tcgen05.fence::after_thread_sync`, or an arrival after a
//! `tcgen05.ld` without `fence::before_thread_sync`; asynchronous work (a
//! TMA load, a commit, an MMA, a bulk reduction) that no actor observed
//! before every actor finished (the CTA may then exit with it in flight);
//! a barrier left mid-phase.
//!
//! Reductions that keep the search small: an actor runs from one wait
//! through the non-blocking operations after it in one step (arrivals and
//! issues only ever enable more, and the race check does not depend on the
//! order of accesses); states equal up to a permutation of the compute
//! warps, or of the reduce warps, are one; each state takes only a
//! persistent set of its moves (Godefroid's construction from the barriers
//! each actor's remaining trace touches); and a visited state is keyed by
//! the program counters, barrier counters and pending events only: while
//! no error has been reported, the clocks and access records follow from
//! those. The tests check these reductions against searches without them.
//!
//! It checks the protocol as written in the skeletons against this model of
//! the ISA text, not the hardware, and not the data work inside the hooks.

use super::proto::{self, Machine, Plant, Rows};
use super::proto::{ComputeWork, LoadWork, MmaWork, ReduceWork};
use super::proto::{DK_FREE, DK_READY, DQ_READY, DS_READY, EMPTY, FULL};
use super::proto::{K_HALF_BYTES, LOAD_LANES, NUM_BARS, Q_EMPTY, Q_FULL, S_READY};
use super::sched::parity;
use crate::sched::rows_of;
use std::collections::HashSet;
use std::format;
use std::string::String;
use std::vec::Vec;

// ---- Actors, clock components, regions ----

/// Actors: the load warp, the MMA lane, compute warps 0..4, reduce warps 0..4.
const LOAD: usize = 0;
const MMA: usize = 1;
const COMPUTE0: usize = 2;
const REDUCE0: usize = COMPUTE0 + proto::COMPUTE_WARPS as usize;
const NA: usize = REDUCE0 + proto::REDUCE_WARPS as usize;
/// Vector-clock components: one per actor; the MMA unit (the number of
/// MMAs known complete); one bulk unit per reduce warp; one per barrier
/// (phases known complete, which covers the TMA loads completing on it).
const MMA_UNIT: usize = NA;
const BULK0: usize = MMA_UNIT + 1;
const BAR0: usize = BULK0 + proto::REDUCE_WARPS as usize;
const NB: usize = NUM_BARS as usize;
const NC: usize = BAR0 + NB;
type Vc = [u16; NC];

/// Regions (bits of a `u32` mask): K stage s half h, slot metadata of stage
/// s, q buffer b half h, the dS rows / dK staging rows / S, dQ and dK
/// tensor-memory lanes of warp w (% 4).
const R_K: u32 = 0;
const R_META: u32 = 4;
const R_Q: u32 = 6;
const R_DS: u32 = 10;
const R_STAGE: u32 = 14;
const R_TS: u32 = 18;
const R_TDQ: u32 = 22;
const R_TDK: u32 = 26;
const NR: usize = 30;
const TMEM_MASK: u32 = ((1 << 12) - 1) << R_TS;
const _: () = assert!(proto::COMPUTE_WARPS == 4 && proto::REDUCE_WARPS == 4);
const _: () = assert!(super::budget::K_STAGES == 2 && super::budget::Q_STAGES == 2);

fn k_reg(stage: u32) -> u32 {
    0b11 << (R_K + 2 * stage)
}
fn q_reg(buf: u32) -> u32 {
    0b11 << (R_Q + 2 * buf)
}
fn all4(base: u32) -> u32 {
    0b1111 << base
}

fn region_name(r: u32) -> String {
    let (base, i) = match r {
        0..4 => return format!("K stage {} (D {}..)", r / 2, 64 * (r % 2)),
        4..6 => return format!("slot metadata of stage {}", r - R_META),
        6..10 => return format!("q buffer {} (D {}..)", (r - R_Q) / 2, 64 * (r % 2)),
        10..14 => ("dS rows of compute warp", r - R_DS),
        14..18 => (
            "dK staging rows of reduce warp",
            r - R_STAGE + proto::REDUCE_WARP0,
        ),
        18..22 => ("tensor-memory S, sub-partition", r - R_TS),
        22..26 => ("tensor-memory dQ, sub-partition", r - R_TDQ),
        _ => ("tensor-memory dK, sub-partition", r - R_TDK),
    };
    format!("{base} {i}")
}

fn actor_name(a: usize) -> String {
    match a {
        LOAD => "load warp".into(),
        MMA => "MMA lane".into(),
        a if a < REDUCE0 => format!("compute warp {}", a - COMPUTE0),
        a => format!("reduce warp {}", a - REDUCE0 + proto::REDUCE_WARP0 as usize),
    }
}

fn bar_name(b: u32) -> String {
    let (name, base) = match b {
        b if b < EMPTY => ("FULL", FULL),
        b if b < Q_FULL => ("EMPTY", EMPTY),
        b if b < Q_EMPTY => ("Q_FULL", Q_FULL),
        b if b < S_READY => ("Q_EMPTY", Q_EMPTY),
        S_READY => return "S_READY".into(),
        DS_READY => return "DS_READY".into(),
        DK_READY => return "DK_READY".into(),
        DK_FREE => return "DK_FREE".into(),
        DQ_READY => return "DQ_READY".into(),
        _ => return "DQ_FREE".into(),
    };
    format!("{name}[{}]", b - base)
}

/// First barrier of `b`'s ring (`EMPTY + 1` -> `EMPTY`), for mutations.
fn family(b: u32) -> u32 {
    [FULL, EMPTY, Q_FULL, Q_EMPTY]
        .into_iter()
        .rev()
        .find(|&f| f <= b && b < S_READY)
        .unwrap_or(b)
}

// ---- Traces ----

/// One operation of an actor's trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Op {
    /// Blocks until phase `phase` of `bar` completes (parity wait).
    Wait { bar: u32, phase: u32 },
    /// `count` arrivals for phase `phase`, expecting `tx` more bytes.
    Arrive {
        bar: u32,
        phase: u32,
        count: u32,
        tx: u32,
    },
    /// `tcgen05.commit` to `bar` for phase `phase`.
    Commit { bar: u32, phase: u32 },
    /// A TMA load writing `region`, completing `bytes` on `bar`.
    Tma {
        bar: u32,
        phase: u32,
        bytes: u32,
        region: u32,
    },
    /// An MMA chain reading and writing the regions of the masks.
    Mma { reads: u32, writes: u32 },
    /// A bulk reduction reading `region` (asynchronously).
    Bulk { region: u32 },
    /// `cp.async.bulk.wait_group.read 0` (`full`: `wait_group 0`, the
    /// writes done too). Bulk reductions complete on their own, so this
    /// never blocks for long; it is where the warp learns they are done.
    BulkWait { full: bool },
    /// Synchronous accesses.
    Access { reads: u32, writes: u32 },
    /// `tcgen05.fence::before_thread_sync`.
    TcBefore,
    /// `tcgen05.fence::after_thread_sync`.
    TcAfter,
    /// `fence.proxy.async.shared::cta`.
    ProxyFence,
}

impl Op {
    fn blocking(&self) -> bool {
        matches!(self, Op::Wait { .. })
    }
}

/// The role a mutation applies to (every warp of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Load,
    Mma,
    Compute,
    Reduce,
}

/// Trace-level mutations the tests plant: each is the trace the skeleton
/// would record after a one-line edit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mutation {
    None,
    /// The role skips every wait on the barriers of `family`.
    SkipWait(Role, u32),
    /// The role waits on `family` for the phase `by` later (earlier when
    /// negative; its parity is wrong for odd `by`).
    WaitShift(Role, u32, i32),
    /// Arrivals with `expect_tx` on `family` expect `bytes`.
    ExpectTx(u32, u32),
    /// The role's arrivals on `family` are made by every lane (the
    /// `lane0` around them dropped).
    EveryLane(Role, u32),
    /// The role drops its `tcgen05.fence::after_thread_sync`.
    NoFenceAfter(Role),
    /// The role drops its `fence.proxy.async`.
    NoProxyFence(Role),
    /// The reduce warps skip their last bulk wait.
    NoFinalBulkWait,
}

/// Records one actor's operations as its skeleton calls them.
struct Recorder<const P: u8> {
    role: Role,
    /// Sub-partition (warp % 4) of a compute or reduce warp.
    warp: u32,
    heads: u32,
    /// Lanes executing (1 inside `lane0`, 31 in its else branch).
    lanes: u32,
    mutation: Mutation,
    ops: Vec<Op>,
    /// Rows whose `d_index_q` this actor wrote.
    rows_out: Vec<u32>,
}

/// [`Plant`] selected by a recorder's const parameter.
const fn plant(p: u8) -> Plant {
    match p {
        1 => Plant::EarlyDkFree,
        2 => Plant::EarlyEmptyCommit,
        3 => Plant::DrainLastOnly,
        _ => Plant::None,
    }
}

impl<const P: u8> Recorder<P> {
    /// Whether a mutation of role `role` on barrier family `f` applies to
    /// this actor's operation on `bar`.
    fn hits(&self, role: Role, f: u32, bar: u32) -> bool {
        role == self.role && f == family(bar)
    }
    fn arrival(&mut self, bar: u32, phase: u32, tx: u32) {
        let every = matches!(self.mutation, Mutation::EveryLane(r, f) if self.hits(r, f, bar));
        let count = if every { LOAD_LANES } else { self.lanes };
        let tx = match self.mutation {
            Mutation::ExpectTx(f, bytes) if tx > 0 && f == family(bar) => bytes,
            _ => tx,
        };
        self.ops.push(Op::Arrive {
            bar,
            phase,
            count,
            tx: tx * count,
        });
    }
}

impl<const P: u8> Machine for Recorder<P> {
    const PLANT: Plant = plant(P);
    fn wait(&mut self, bar: u32, phase: u32) {
        let skip = matches!(self.mutation, Mutation::SkipWait(r, f) if self.hits(r, f, bar));
        let by = match self.mutation {
            Mutation::WaitShift(r, f, by) if self.hits(r, f, bar) => by,
            _ => 0,
        };
        if !skip {
            self.ops.push(Op::Wait {
                bar,
                phase: (phase as i32 + by).max(0) as u32,
            });
        }
    }
    fn arrive(&mut self, bar: u32, phase: u32) {
        self.arrival(bar, phase, 0);
    }
    fn arrive_expect_tx(&mut self, bar: u32, phase: u32, bytes: u32) {
        self.arrival(bar, phase, bytes);
    }
    fn commit(&mut self, bar: u32, phase: u32) {
        self.ops.push(Op::Commit { bar, phase });
    }
    fn bulk_wait_read(&mut self) {
        self.ops.push(Op::BulkWait { full: false });
    }
    fn bulk_wait(&mut self) {
        if self.mutation != Mutation::NoFinalBulkWait {
            self.ops.push(Op::BulkWait { full: true });
        }
    }
    fn tc_fence_before(&mut self) {
        self.ops.push(Op::TcBefore);
    }
    fn tc_fence_after(&mut self) {
        if self.mutation != Mutation::NoFenceAfter(self.role) {
            self.ops.push(Op::TcAfter);
        }
    }
    fn proxy_fence(&mut self) {
        if self.mutation != Mutation::NoProxyFence(self.role) {
            self.ops.push(Op::ProxyFence);
        }
    }
    fn warp_sync(&mut self) {}
    fn lane0(&mut self, f: impl FnOnce(&mut Self)) {
        let lanes = self.lanes;
        self.lanes = 1;
        f(self);
        self.lanes = lanes;
    }
    fn lane0_else(&mut self, f: impl FnOnce(&mut Self), others: impl FnOnce(&mut Self)) {
        let lanes = self.lanes;
        self.lanes = 1;
        f(self);
        self.lanes = lanes - 1;
        others(self);
        self.lanes = lanes;
    }
}

impl<const P: u8> LoadWork for Recorder<P> {
    fn begin_row(&mut self, _row: u32) {}
    fn load_q(&mut self, _row: u32, buf: u32, half: u32, bar: u32, phase: u32) {
        let (bytes, region) = (proto::q_half_bytes(self.heads), R_Q + 2 * buf + half);
        for _ in 0..self.lanes {
            self.ops.push(Op::Tma {
                bar,
                phase,
                bytes,
                region,
            });
        }
    }
    fn fill_meta(&mut self, _row: u32, _chunk: u32, stage: u32) {
        let writes = 1 << (R_META + stage);
        self.ops.push(Op::Access { reads: 0, writes });
    }
    fn gather_k(&mut self, stage: u32, half: u32, bar: u32, phase: u32) {
        // One event for the gathers of all executing lanes.
        self.ops.push(Op::Tma {
            bar,
            phase,
            bytes: self.lanes * (K_HALF_BYTES / LOAD_LANES),
            region: R_K + 2 * stage + half,
        });
    }
}

impl<const P: u8> MmaWork for Recorder<P> {
    fn mma_s(&mut self, buf: u32, stage: u32) {
        let (reads, writes) = (q_reg(buf) | k_reg(stage), all4(R_TS));
        self.ops.push(Op::Mma { reads, writes });
    }
    fn mma_dq(&mut self, stage: u32, _accumulate: bool) {
        let (reads, writes) = (all4(R_DS) | k_reg(stage), all4(R_TDQ));
        self.ops.push(Op::Mma { reads, writes });
    }
    fn mma_dk(&mut self, buf: u32) {
        let (reads, writes) = (all4(R_DS) | q_reg(buf), all4(R_TDK));
        self.ops.push(Op::Mma { reads, writes });
    }
}

impl<const P: u8> ComputeWork for Recorder<P> {
    fn begin_row(&mut self, _row: u32) {}
    fn gate(&mut self, stage: u32) {
        let reads = 1 << (R_META + stage) | 1 << (R_TS + self.warp);
        let writes = 1 << (R_DS + self.warp);
        self.ops.push(Op::Access { reads, writes });
    }
    fn read_dq(&mut self, row: u32) {
        let reads = 1 << (R_TDQ + self.warp);
        self.ops.push(Op::Access { reads, writes: 0 });
        self.rows_out.push(row);
    }
    fn store_dw(&mut self, _row: u32) {}
}

impl<const P: u8> ReduceWork for Recorder<P> {
    fn read_key(&mut self, stage: u32) {
        let reads = 1 << (R_META + stage);
        self.ops.push(Op::Access { reads, writes: 0 });
    }
    fn stage_dk(&mut self) {
        let (reads, writes) = (1 << (R_TDK + self.warp), 1 << (R_STAGE + self.warp));
        self.ops.push(Op::Access { reads, writes });
    }
    fn reduce_dk(&mut self) {
        // As for a valid key (a padding slot issues nothing, which only
        // removes constraints).
        self.proxy_fence();
        self.ops.push(Op::Bulk {
            region: R_STAGE + self.warp,
        });
    }
}

/// One CTA of a small problem: `rows` query rows in all, `ctas` CTAs,
/// `nch` chunks per row, `heads` heads.
#[derive(Clone, Copy, Debug)]
struct Case {
    rows: u32,
    ctas: u32,
    cta: u32,
    nch: u32,
    heads: u32,
}

/// The traces of every actor of a case's CTA, and the rows its compute
/// warps wrote.
struct Traces {
    ops: [Vec<Op>; NA],
    rows_out: Vec<u32>,
}

fn record<const P: u8>(case: &Case, mutation: Mutation) -> Traces {
    let rows = Rows {
        first: case.cta,
        step: case.ctas,
        end: case.rows,
    };
    let rec = |role, warp, lanes| Recorder::<P> {
        role,
        warp,
        heads: case.heads,
        lanes,
        mutation,
        ops: Vec::new(),
        rows_out: Vec::new(),
    };
    let mut ops: [Vec<Op>; NA] = Default::default();
    let mut r = rec(Role::Load, 0, LOAD_LANES);
    proto::load(&mut r, rows, case.nch, case.heads);
    ops[LOAD] = r.ops;
    let mut r = rec(Role::Mma, 0, 1);
    proto::mma(&mut r, rows, case.nch);
    ops[MMA] = r.ops;
    let mut rows_out = Vec::new();
    for w in 0..proto::COMPUTE_WARPS {
        let mut r = rec(Role::Compute, w, 32);
        proto::compute(&mut r, rows, case.nch);
        ops[COMPUTE0 + w as usize] = r.ops;
        rows_out = r.rows_out;
    }
    for w in 0..proto::REDUCE_WARPS {
        let mut r = rec(Role::Reduce, w, 32);
        proto::reduce(&mut r, rows, case.nch);
        ops[REDUCE0 + w as usize] = r.ops;
    }
    Traces { ops, rows_out }
}

// ---- The checker ----

/// What kind of protocol failure was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Deadlock,
    ArrivalPastCount,
    ArrivalTooEarly,
    TxPastCount,
    WaitPassesEarly,
    PhaseWrap,
    Race,
    ProxyFence,
    TcFence,
    InFlightAtExit,
    MidPhaseAtExit,
}

/// A failure the checker found, with what it saw.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Failure {
    kind: Kind,
    msg: String,
}

fn fail<T>(kind: Kind, msg: String) -> Result<T, Failure> {
    Err(Failure { kind, msg })
}

/// An access record: who accessed last, as a clock component and value
/// (known to an actor whose clock has at least that value there).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Epoch {
    comp: u8,
    val: u16,
}

impl Epoch {
    fn known(&self, vc: &Vc) -> bool {
        self.val == 0 || vc[self.comp as usize] >= self.val
    }
}

/// Who made the access an epoch records.
fn who(e: Epoch) -> String {
    let c = e.comp as usize;
    match c {
        c if c < NA => actor_name(c),
        MMA_UNIT => "an MMA".into(),
        c if c < BAR0 => format!("a bulk reduction of {}", actor_name(REDUCE0 + c - BULK0)),
        c => format!("a TMA load completing on {}", bar_name((c - BAR0) as u32)),
    }
}

/// An mbarrier.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Bar {
    /// Phases completed.
    done: u16,
    /// Arrivals the current phase still expects.
    pending: i32,
    /// Transaction bytes the current phase still expects.
    tx: i64,
    /// Join of the current phase's arrivals' clocks.
    acc: Vc,
    /// Clock of the last completed phase (what a wait acquires).
    last: Vc,
}

/// The access record of a region.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Region {
    write: Epoch,
    /// The writer's clock at its first `fence.proxy.async` after the
    /// write (0: none yet).
    fenced: u16,
    /// Per component, the latest read since the write.
    reads: Vc,
}

/// A pending TMA completion or commit arrival: the operation at `pc` of
/// `actor`'s trace, with the clock it carries.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Event {
    actor: u8,
    pc: u16,
    vc: Vc,
}

/// A state of one CTA: every actor's position and clock, the barriers,
/// the pending events and the access records.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    /// Next operation of each actor's trace.
    pc: [u16; NA],
    /// Each actor's vector clock (its own component counts its releases).
    vc: [Vc; NA],
    /// A wait passed with no `fence::after_thread_sync` since.
    after_due: [bool; NA],
    /// A `tcgen05.ld` with no `fence::before_thread_sync` since.
    before_due: [bool; NA],
    /// Regions written since the actor's last `fence.proxy.async`.
    unfenced: [u32; NA],
    bars: [Bar; NB],
    /// Pending events, sorted by (actor, pc).
    events: Vec<Event>,
    /// MMA chains issued so far.
    mma_issued: u16,
    /// Bulk reductions each reduce warp issued so far.
    bulk_issued: [u16; 4],
    /// Bulk reductions issued before each reduce warp's last full wait.
    bulk_waited: [u16; 4],
    /// Access records of the regions.
    regions: [Region; NR],
}

/// The traces and barrier counts being checked.
struct Model<'a> {
    ops: &'a [Vec<Op>; NA],
    counts: [u32; NB],
    /// Footprints of each actor's step and remaining trace, per pc.
    fp: [Vec<Footprint>; NA],
}

/// `a` = `a` join `b`.
fn join(a: &mut Vc, b: &Vc) {
    for (x, y) in a.iter_mut().zip(b) {
        *x = (*x).max(*y);
    }
}

/// The set bits of `mask`.
fn bits(mask: u32) -> impl Iterator<Item = u32> {
    (0..32).filter(move |i| mask >> i & 1 == 1)
}

impl State {
    fn new(m: &Model) -> State {
        let mut vc = [[0u16; NC]; NA];
        for (a, v) in vc.iter_mut().enumerate() {
            v[a] = 1;
        }
        let bar = |b: usize| Bar {
            done: 0,
            pending: m.counts[b] as i32,
            tx: 0,
            acc: [0; NC],
            last: [0; NC],
        };
        let region = Region {
            write: Epoch::default(),
            fenced: 0,
            reads: [0; NC],
        };
        State {
            pc: [0; NA],
            vc,
            after_due: [false; NA],
            before_due: [false; NA],
            unfenced: [0; NA],
            bars: core::array::from_fn(bar),
            events: Vec::new(),
            mma_issued: 0,
            bulk_issued: [0; 4],
            bulk_waited: [0; 4],
            regions: core::array::from_fn(|_| region.clone()),
        }
    }

    fn next_op<'m>(&self, m: &'m Model, a: usize) -> Option<&'m Op> {
        m.ops[a].get(self.pc[a] as usize)
    }

    /// Whether actor `a` can take a step; an error if it sits at a wait
    /// whose parity aliases another phase.
    fn enabled(&self, m: &Model, a: usize) -> Result<bool, Failure> {
        Ok(match self.next_op(m, a) {
            None => false,
            Some(&Op::Wait { bar, phase }) => {
                let done = self.bars[bar as usize].done as u32;
                let passes = parity(done) != parity(phase);
                if done >= phase + 2 {
                    let p = parity(phase);
                    let now = if parity(done) == p {
                        format!("phase {done}, still open: the wait hangs")
                    } else {
                        format!("phase {}: the wait passes on the wrong phase", done - 1)
                    };
                    return fail(
                        Kind::PhaseWrap,
                        format!(
                            "phase wrap-around: {} waits for phase {phase} of {} (parity {p}), \
                             which has completed {done} phases: parity {p} now names {now}",
                            actor_name(a),
                            bar_name(bar),
                        ),
                    );
                }
                if passes && done < phase + 1 {
                    return fail(
                        Kind::WaitPassesEarly,
                        format!(
                            "wait passes early: {} waits for phase {phase} of {} (parity {}), \
                             which has completed only {done} phases: the wait passes while \
                             the current phase {done} has parity {}",
                            actor_name(a),
                            bar_name(bar),
                            parity(phase),
                            parity(done)
                        ),
                    );
                }
                passes
            }
            Some(_) => true,
        })
    }

    fn complete_if_due(&mut self, m: &Model, b: u32) -> Result<(), Failure> {
        let bar = &mut self.bars[b as usize];
        if bar.pending == 0 && bar.tx < 0 {
            return fail(
                Kind::TxPastCount,
                format!(
                    "transaction bytes past count: phase {} of {} received {} bytes more \
                     than its arrivals expected",
                    bar.done,
                    bar_name(b),
                    -bar.tx
                ),
            );
        }
        if bar.pending == 0 && bar.tx == 0 {
            bar.last = bar.acc;
            bar.done += 1;
            bar.last[BAR0 + b as usize] = bar.done;
            bar.acc = [0; NC];
            bar.pending = m.counts[b as usize] as i32;
        }
        Ok(())
    }

    /// The arrivals of `op` (an [`Op::Arrive`]), carrying clock `vc`.
    fn arrive(&mut self, m: &Model, who: &str, op: Op, vc: &Vc) -> Result<(), Failure> {
        let Op::Arrive {
            bar: b,
            phase,
            count,
            tx,
        } = op
        else {
            unreachable!("not an arrival: {op:?}")
        };
        let bar = &mut self.bars[b as usize];
        let done = bar.done as u32;
        if done > phase {
            return fail(
                Kind::ArrivalPastCount,
                format!(
                    "arrival past count: {who} arrives on {} for phase {phase}, which has \
                     already completed ({} arrivals per phase): it lands in phase {done}",
                    bar_name(b),
                    m.counts[b as usize]
                ),
            );
        }
        if done < phase {
            return fail(
                Kind::ArrivalTooEarly,
                format!(
                    "arrival too early: {who} arrives on {} for phase {phase} while phase \
                     {done} is still open",
                    bar_name(b)
                ),
            );
        }
        if count as i32 > bar.pending {
            return fail(
                Kind::ArrivalPastCount,
                format!(
                    "arrival past count: {who} makes {count} arrivals on {} in phase {phase}, \
                     which expects only {} more ({} per phase)",
                    bar_name(b),
                    bar.pending,
                    m.counts[b as usize]
                ),
            );
        }
        bar.pending -= count as i32;
        bar.tx += tx as i64;
        join(&mut bar.acc, vc);
        self.complete_if_due(m, b)
    }

    /// Accesses `reads` / `writes` by `ep` whose knowledge is `vc`; `proxy`:
    /// by the async proxy (MMA, bulk), which must also see a proxy fence
    /// after any generic write it reads.
    fn access(
        &mut self,
        reads: u32,
        writes: u32,
        vc: &Vc,
        ep: Epoch,
        proxy: bool,
    ) -> Result<(), Failure> {
        for r in bits(reads | writes) {
            let rec = &self.regions[r as usize];
            let w = rec.write;
            if !w.known(vc) {
                let what = if writes >> r & 1 == 1 {
                    "writes"
                } else {
                    "reads"
                };
                return fail(
                    Kind::Race,
                    format!(
                        "race on {}: {} {what} it, unordered with the write by {}",
                        region_name(r),
                        who(ep),
                        who(w)
                    ),
                );
            }
            if proxy && reads >> r & 1 == 1 && w.val > 0 && (w.comp as usize) < NA {
                let fenced = rec.fenced > 0 && vc[w.comp as usize] >= rec.fenced;
                if !fenced {
                    return fail(
                        Kind::ProxyFence,
                        format!(
                            "missing proxy fence: {} reads {} (async proxy) with no \
                             fence.proxy.async ordered after the generic write by {}",
                            who(ep),
                            region_name(r),
                            who(w)
                        ),
                    );
                }
            }
            if writes >> r & 1 == 1 {
                if let Some(c) = (0..NC).find(|&c| rec.reads[c] > vc[c]) {
                    let rd = Epoch {
                        comp: c as u8,
                        val: rec.reads[c],
                    };
                    return fail(
                        Kind::Race,
                        format!(
                            "race on {}: {} writes it, unordered with the read by {}",
                            region_name(r),
                            who(ep),
                            who(rd)
                        ),
                    );
                }
            }
        }
        for r in bits(reads & !writes) {
            let rd = &mut self.regions[r as usize].reads[ep.comp as usize];
            *rd = (*rd).max(ep.val);
        }
        for r in bits(writes) {
            let rec = &mut self.regions[r as usize];
            rec.write = ep;
            rec.fenced = 0;
            rec.reads = [0; NC];
        }
        Ok(())
    }
}

impl State {
    /// Runs actor `a` from its blocking operation (or its start) through
    /// the non-blocking operations after it.
    fn step(&mut self, m: &Model, a: usize) -> Result<(), Failure> {
        let mut first = true;
        while let Some(&op) = self.next_op(m, a) {
            if op.blocking() && !first {
                break;
            }
            first = false;
            self.exec(a, op, m)?;
            self.pc[a] += 1;
        }
        Ok(())
    }

    fn exec(&mut self, a: usize, op: Op, m: &Model) -> Result<(), Failure> {
        let own = Epoch {
            comp: a as u8,
            val: self.vc[a][a],
        };
        match op {
            Op::Wait { bar, .. } => {
                let last = self.bars[bar as usize].last;
                join(&mut self.vc[a], &last);
                self.after_due[a] = true;
            }
            Op::Arrive { bar, .. } => {
                if self.before_due[a] {
                    return fail(
                        Kind::TcFence,
                        format!(
                            "missing tcgen05.fence::before_thread_sync: {} arrives on {} \
                             after a tensor-memory load",
                            actor_name(a),
                            bar_name(bar)
                        ),
                    );
                }
                let vc = self.vc[a];
                self.arrive(m, &actor_name(a), op, &vc)?;
                self.vc[a][a] += 1;
            }
            Op::Commit { .. } => {
                let mut vc = self.vc[a];
                vc[MMA_UNIT] = self.mma_issued;
                self.push_event(a, vc);
                self.vc[a][a] += 1;
            }
            Op::Tma {
                bar, phase, region, ..
            } => {
                let ep = Epoch {
                    comp: (BAR0 + bar as usize) as u8,
                    val: phase as u16 + 1,
                };
                let vc = self.vc[a];
                self.access(0, 1 << region, &vc, ep, true)?;
                self.push_event(a, vc);
            }
            Op::Mma { reads, writes } => {
                if self.after_due[a] {
                    return fail(
                        Kind::TcFence,
                        format!(
                            "missing tcgen05.fence::after_thread_sync: {} issues an MMA \
                             after a wait",
                            actor_name(a)
                        ),
                    );
                }
                // MMAs on one accumulator execute in issue order, so each
                // knows the ones before it.
                let mut vc = self.vc[a];
                vc[MMA_UNIT] = self.mma_issued;
                self.mma_issued += 1;
                let ep = Epoch {
                    comp: MMA_UNIT as u8,
                    val: self.mma_issued,
                };
                self.access(reads, writes, &vc, ep, true)?;
            }
            Op::Bulk { region } => {
                let w = a - REDUCE0;
                self.bulk_issued[w] += 1;
                let ep = Epoch {
                    comp: (BULK0 + w) as u8,
                    val: self.bulk_issued[w],
                };
                let vc = self.vc[a];
                self.access(1 << region, 0, &vc, ep, true)?;
            }
            Op::BulkWait { full } => {
                let w = a - REDUCE0;
                self.vc[a][BULK0 + w] = self.bulk_issued[w];
                if full {
                    self.bulk_waited[w] = self.bulk_issued[w];
                }
            }
            Op::Access { reads, writes } => {
                if (reads | writes) & TMEM_MASK != 0 && self.after_due[a] {
                    return fail(
                        Kind::TcFence,
                        format!(
                            "missing tcgen05.fence::after_thread_sync: {} reads tensor \
                             memory after a wait",
                            actor_name(a)
                        ),
                    );
                }
                let vc = self.vc[a];
                self.access(reads, writes, &vc, own, false)?;
                self.before_due[a] |= reads & TMEM_MASK != 0;
                self.unfenced[a] |= writes;
            }
            Op::TcBefore => self.before_due[a] = false,
            Op::TcAfter => self.after_due[a] = false,
            Op::ProxyFence => {
                for r in bits(self.unfenced[a]) {
                    self.regions[r as usize].fenced = self.vc[a][a];
                }
                self.unfenced[a] = 0;
            }
        }
        Ok(())
    }

    /// Adds the completion of the operation at actor `a`'s current pc,
    /// keeping the events sorted (they are part of the state's key).
    fn push_event(&mut self, a: usize, vc: Vc) {
        let ev = Event {
            actor: a as u8,
            pc: self.pc[a],
            vc,
        };
        let at = self
            .events
            .partition_point(|e| (e.actor, e.pc) < (ev.actor, ev.pc));
        self.events.insert(at, ev);
    }

    /// Delivers pending event `i`: a TMA load's bytes or a commit's arrival.
    fn deliver(&mut self, m: &Model, i: usize) -> Result<(), Failure> {
        let ev = self.events.remove(i);
        let op = m.ops[ev.actor as usize][ev.pc as usize];
        match op {
            Op::Commit { bar, phase } => {
                let who = format!("the commit of {}", actor_name(ev.actor as usize));
                let one = Op::Arrive {
                    bar,
                    phase,
                    count: 1,
                    tx: 0,
                };
                self.arrive(m, &who, one, &ev.vc)
            }
            Op::Tma {
                bar,
                phase,
                bytes,
                region,
            } => {
                let b = &mut self.bars[bar as usize];
                if b.done as u32 != phase {
                    return fail(
                        Kind::TxPastCount,
                        format!(
                            "transaction bytes past count: the TMA load of {} completes \
                             {bytes} bytes on {} for phase {phase}, but phase {} is open",
                            region_name(region),
                            bar_name(bar),
                            b.done
                        ),
                    );
                }
                b.tx -= bytes as i64;
                join(&mut b.acc, &ev.vc);
                self.complete_if_due(m, bar)
            }
            _ => unreachable!("only commits and TMA loads complete as events"),
        }
    }

    /// What an actor that cannot move is waiting for.
    fn blocked_on(&self, m: &Model, a: usize) -> String {
        match self.next_op(m, a) {
            Some(&Op::Wait { bar, phase }) => format!(
                "{} waits for phase {phase} of {} ({} completed)",
                actor_name(a),
                bar_name(bar),
                self.bars[bar as usize].done
            ),
            _ => unreachable!("only waits block"),
        }
    }

    /// Checks of the end, when every actor has finished and every event
    /// has been delivered. The CTA exits after its actors' teardown
    /// barrier, so an asynchronous completion no actor observed before
    /// finishing (by acquiring the phase it completes, or by a bulk wait)
    /// may land after the exit: "in flight at exit". Judged by the actors'
    /// clocks, it does not depend on when the event was delivered here.
    fn exit_checks(&self, m: &Model) -> Result<(), Failure> {
        let observed =
            |bar: u32, phase: u32| (0..NA).any(|a| self.vc[a][BAR0 + bar as usize] as u32 > phase);
        let mut flying: Vec<String> = Vec::new();
        for trace in m.ops {
            for (pc, op) in trace.iter().enumerate() {
                match *op {
                    Op::Commit { bar, phase } if !observed(bar, phase) => {
                        flying.push(format!("the commit to {} (phase {phase})", bar_name(bar)))
                    }
                    Op::Tma {
                        bar, phase, region, ..
                    } if !observed(bar, phase) => flying.push(format!(
                        "the TMA load of {} (phase {phase})",
                        region_name(region)
                    )),
                    Op::Mma { .. }
                        if !trace[pc..].iter().any(|o| matches!(o, Op::Commit { .. })) =>
                    {
                        flying.push("an MMA no later commit covers".into())
                    }
                    _ => {}
                }
            }
        }
        for w in 0..4 {
            let n = self.bulk_issued[w] - self.bulk_waited[w];
            if n > 0 {
                let a = actor_name(REDUCE0 + w);
                flying.push(format!("{n} bulk reduction(s) of {a} not waited for"));
            }
        }
        if !flying.is_empty() {
            return fail(
                Kind::InFlightAtExit,
                format!(
                    "asynchronous work in flight when every actor has finished (the CTA \
                     may exit): {}",
                    flying.join(", ")
                ),
            );
        }
        for (b, bar) in self.bars.iter().enumerate() {
            if bar.pending != m.counts[b] as i32 || bar.tx != 0 {
                return fail(
                    Kind::MidPhaseAtExit,
                    format!(
                        "{} ends mid-phase: phase {} has {} of {} arrivals and {} bytes due",
                        bar_name(b as u32),
                        bar.done,
                        m.counts[b] as i32 - bar.pending,
                        m.counts[b],
                        bar.tx
                    ),
                );
            }
        }
        Ok(())
    }

    /// The key of the visited set. `full`: the whole state; otherwise the
    /// abstract part (program counters, fence flags, barrier counters,
    /// pending events), with the compute and the reduce warps sorted when
    /// `symmetric`.
    fn key(&self, full: bool, symmetric: bool) -> u128 {
        use std::hash::Hash;
        let mut h = Fold::default();
        if full {
            self.hash(&mut h);
            return h.finish128();
        }
        let actor = |a: usize| {
            let flags = self.after_due[a] as u8 | (self.before_due[a] as u8) << 1;
            (self.pc[a], flags, self.unfenced[a] != 0)
        };
        let mut compute: Vec<_> = (COMPUTE0..REDUCE0).map(actor).collect();
        let mut reduce: Vec<_> = (REDUCE0..NA).map(actor).collect();
        if symmetric {
            compute.sort_unstable();
            reduce.sort_unstable();
        }
        (actor(LOAD), actor(MMA), compute, reduce).hash(&mut h);
        for b in &self.bars {
            (b.done, b.pending, b.tx).hash(&mut h);
        }
        for e in &self.events {
            (e.actor, e.pc).hash(&mut h);
        }
        h.finish128()
    }
}

/// A 128-bit hash of a state (two multiply-rotate lanes), so the visited
/// set holds 16 bytes per state.
#[derive(Default)]
struct Fold(u64, u64);

impl Fold {
    fn finish128(&self) -> u128 {
        let mix = |mut x: u64| {
            x ^= x >> 33;
            x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
            x ^= x >> 33;
            x
        };
        (mix(self.0) as u128) << 64 | mix(self.1) as u128
    }
}

impl std::hash::Hasher for Fold {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            let x = u64::from_le_bytes(w);
            self.0 = (self.0 ^ x)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .rotate_left(31);
            self.1 = (self.1.rotate_left(23) ^ x).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
        }
    }
    fn finish(&self) -> u64 {
        self.finish128() as u64
    }
}

/// The outcome of exploring one case.
#[derive(Debug, Default)]
struct Report {
    /// Distinct states visited.
    states: usize,
    /// Steps taken (including into visited states).
    steps: usize,
    /// Distinct failures found.
    failures: Vec<Failure>,
}

impl Report {
    fn add(&mut self, f: Failure) {
        if !self.failures.contains(&f) {
            self.failures.push(f);
        }
    }
}

/// Barriers (bit masks) an operation writes (an arrival now, or later by
/// the event it issues) and reads (a wait).
fn op_writes(op: &Op) -> u32 {
    match *op {
        Op::Arrive { bar, .. } | Op::Commit { bar, .. } | Op::Tma { bar, .. } => 1 << bar,
        _ => 0,
    }
}
fn op_reads(op: &Op) -> u32 {
    match *op {
        Op::Wait { bar, .. } => 1 << bar,
        _ => 0,
    }
}

impl<'a> Model<'a> {
    fn new(ops: &'a [Vec<Op>; NA], counts: [u32; NB]) -> Model<'a> {
        let mut fp: [Vec<Footprint>; NA] = Default::default();
        for (a, trace) in ops.iter().enumerate() {
            let mut f = std::vec![Footprint::default(); trace.len() + 1];
            for pc in (0..trace.len()).rev() {
                let op = &trace[pc];
                f[pc].future_w = f[pc + 1].future_w | op_writes(op);
                f[pc].future_r = f[pc + 1].future_r | op_reads(op);
                // The step starting here: its wait, and the arrivals up to
                // the next wait (events are issued, not yet delivered).
                let next = trace[pc + 1..].iter().position(|o| o.blocking());
                let end = next.map_or(trace.len(), |i| pc + 1 + i);
                f[pc].step_r = op_reads(op);
                f[pc].step_w = trace[pc..end]
                    .iter()
                    .filter(|o| matches!(o, Op::Arrive { .. }))
                    .fold(0, |w, o| w | op_writes(o));
            }
            fp[a] = f;
        }
        Model { ops, counts, fp }
    }
}

/// The barriers one actor's next step and its whole remaining trace touch
/// (bit masks), for the persistent sets.
#[derive(Clone, Copy, Debug, Default)]
struct Footprint {
    step_w: u32,
    step_r: u32,
    future_w: u32,
    future_r: u32,
}

/// A move from a state: actor `a`'s next step, or delivery of pending
/// event `i`.
#[derive(Clone, Copy, Debug)]
enum Move {
    Step(usize),
    Deliver(usize),
}

/// A process of the persistent-set construction: an actor that has not
/// finished, or a pending event. `mv` is `None` when the actor is blocked
/// at a wait on the barrier of mask `blocked`.
struct Proc {
    mv: Option<Move>,
    blocked: u32,
    fp: Footprint,
}

/// How [`explore`] keys and prunes states.
#[derive(Clone, Copy, Debug)]
struct Opts {
    /// Key the visited set by the whole state (else its abstract part).
    full_key: bool,
    /// Merge states equal up to a permutation of the compute warps and of
    /// the reduce warps.
    symmetric: bool,
    /// Take only a persistent set of moves at each state.
    persistent: bool,
    /// Distinct failures after which the search stops.
    max_failures: usize,
}

/// The default search: abstract keys, symmetry, persistent sets.
const FAST: Opts = Opts {
    full_key: false,
    symmetric: true,
    persistent: true,
    max_failures: 4,
};

/// Processes in the smallest persistent set containing `start` (a bit mask
/// over `procs`): an enabled move pulls in every process whose remaining
/// operations could write a barrier the move touches or read one it
/// writes; a blocked wait pulls in every process that could still arrive
/// on its barrier (Godefroid's construction from process footprints).
fn closure(procs: &[Proc], start: usize) -> u64 {
    let (mut set, mut work) = (1u64 << start, std::vec![start]);
    while let Some(p) = work.pop() {
        let pp = &procs[p];
        for (q, qq) in procs.iter().enumerate() {
            if set >> q & 1 == 1 {
                continue;
            }
            let f = &qq.fp;
            let dep = match pp.mv {
                Some(_) => {
                    pp.fp.step_w & (f.future_w | f.future_r) != 0 || pp.fp.step_r & f.future_w != 0
                }
                None => pp.blocked & f.future_w != 0,
            };
            if dep {
                set |= 1 << q;
                work.push(q);
            }
        }
    }
    set
}

/// Explores every reachable state of `m` depth first (see the module docs
/// for the reductions `opts` selects).
fn explore(m: &Model, opts: Opts) -> Report {
    let mut seen: HashSet<u128> = HashSet::new();
    let mut stack = std::vec![State::new(m)];
    let mut report = Report::default();
    while let Some(s) = stack.pop() {
        if report.failures.len() >= opts.max_failures {
            break;
        }
        if !seen.insert(s.key(opts.full_key, opts.symmetric)) {
            continue;
        }
        report.states += 1;
        // Every actor finished and every event delivered: the end.
        if s.events.is_empty() && (0..NA).all(|a| s.next_op(m, a).is_none()) {
            if let Err(f) = s.exit_checks(m) {
                report.add(f);
            }
            continue;
        }
        let procs = match s.processes(m) {
            Ok(p) => p,
            Err(f) => {
                report.add(f);
                continue;
            }
        };
        let enabled = |set: u64| (0..procs.len()).filter(move |&p| set >> p & 1 == 1);
        let all = (1u64 << procs.len()) - 1;
        let moves = |set: u64| enabled(set).filter(|&p| procs[p].mv.is_some()).count();
        let mut set = all;
        if opts.persistent {
            for p in (0..procs.len()).filter(|&p| procs[p].mv.is_some()) {
                let c = closure(&procs, p);
                if moves(c) < moves(set) {
                    set = c;
                }
            }
        }
        if moves(set) == 0 {
            let blocked: Vec<String> = (0..NA)
                .filter(|&a| s.next_op(m, a).is_some())
                .map(|a| s.blocked_on(m, a))
                .collect();
            report.add(Failure {
                kind: Kind::Deadlock,
                msg: format!(
                    "deadlock (no asynchronous completion pending): {}",
                    blocked.join("; ")
                ),
            });
            continue;
        }
        for p in enabled(set) {
            let Some(mv) = procs[p].mv else { continue };
            let mut t = s.clone();
            report.steps += 1;
            let r = match mv {
                Move::Step(a) => t.step(m, a),
                Move::Deliver(i) => t.deliver(m, i),
            };
            match r {
                Ok(()) => stack.push(t),
                Err(f) => report.add(f),
            }
        }
    }
    report
}

impl State {
    /// The processes of this state: unfinished actors, then pending events.
    fn processes(&self, m: &Model) -> Result<Vec<Proc>, Failure> {
        let mut procs = Vec::new();
        for a in 0..NA {
            let Some(op) = self.next_op(m, a) else {
                continue;
            };
            let enabled = self.enabled(m, a)?;
            procs.push(Proc {
                mv: enabled.then_some(Move::Step(a)),
                blocked: if enabled { 0 } else { op_reads(op) },
                fp: m.fp[a][self.pc[a] as usize],
            });
        }
        for (i, e) in self.events.iter().enumerate() {
            let w = op_writes(&m.ops[e.actor as usize][e.pc as usize]);
            procs.push(Proc {
                mv: Some(Move::Deliver(i)),
                blocked: 0,
                fp: Footprint {
                    step_w: w,
                    step_r: 0,
                    future_w: w,
                    future_r: 0,
                },
            });
        }
        Ok(procs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::println;
    use std::time::Instant;

    fn counts(change: Option<(u32, i32)>) -> [u32; NB] {
        let mut c: [u32; NB] = core::array::from_fn(|b| proto::arrivals(b as u32));
        if let Some((b, d)) = change {
            c[b as usize] = (c[b as usize] as i32 + d) as u32;
        }
        c
    }

    /// Explores one CTA of `rows` rows x `nch` chunks (H = 64) with
    /// skeleton plant `P`, trace mutation `mutation` and, if given, barrier
    /// `count.0`'s arrival count changed by `count.1`.
    fn check<const P: u8>(
        rows: u32,
        nch: u32,
        mutation: Mutation,
        count: Option<(u32, i32)>,
        opts: Opts,
    ) -> Report {
        let case = Case {
            rows,
            ctas: 1,
            cta: 0,
            nch,
            heads: 64,
        };
        let t = record::<P>(&case, mutation);
        explore(&Model::new(&t.ops, counts(count)), opts)
    }

    /// Every case of 1-3 rows, 1-3 chunks per row, 1-2 CTAs (each CTA's
    /// own row sequence; CTAs share nothing else) and H = 64, plus H = 32
    /// at one row: no failure, and the CTAs' compute warps write every row
    /// of `d_index_q` once. Cases whose traces are equal are explored once.
    #[test]
    fn the_protocol_passes_every_small_case() {
        let mut done: Vec<([Vec<Op>; NA], u32)> = Vec::new();
        let (mut states, start) = (0usize, Instant::now());
        for nch in 1..=3 {
            for rows in 1..=3 {
                for ctas in 1..=2 {
                    let mut written = Vec::new();
                    for cta in 0..ctas {
                        for heads in [64, 32] {
                            let case = Case {
                                rows,
                                ctas,
                                cta,
                                nch,
                                heads,
                            };
                            let t = record::<0>(&case, Mutation::None);
                            let ours: Vec<u32> = rows_of(rows, ctas, cta).collect();
                            assert_eq!(t.rows_out, ours, "{case:?}");
                            if heads == 64 {
                                written.extend(ours.iter().copied());
                            }
                            if (heads == 32 && rows > 1) || done.contains(&(t.ops.clone(), heads)) {
                                continue;
                            }
                            let t0 = Instant::now();
                            let r = explore(&Model::new(&t.ops, counts(None)), FAST);
                            println!(
                                "model: {} rows x {nch} chunks (H = {heads}): {} states, {} steps, {:.2?}",
                                ours.len(),
                                r.states,
                                r.steps,
                                t0.elapsed()
                            );
                            assert!(r.failures.is_empty(), "{case:?}: {:#?}", r.failures);
                            states += r.states;
                            done.push((t.ops, heads));
                        }
                    }
                    written.sort_unstable();
                    assert_eq!(
                        written,
                        (0..rows).collect::<Vec<_>>(),
                        "{rows} rows, {ctas} CTAs"
                    );
                }
            }
        }
        println!(
            "model: {} distinct CTA cases, {states} states in all, {:.2?}",
            done.len(),
            start.elapsed()
        );
    }

    /// A planted protocol bug: a skeleton plant (`Recorder<P>`), a trace
    /// mutation, or a changed arrival count; the case that shows it; what
    /// the checker must report.
    struct Bug {
        name: &'static str,
        plant: u8,
        mutation: Mutation,
        count: Option<(u32, i32)>,
        rows: u32,
        nch: u32,
        kind: Kind,
        says: &'static str,
    }

    const fn bug(name: &'static str, rows: u32, nch: u32, kind: Kind, says: &'static str) -> Bug {
        Bug {
            name,
            plant: 0,
            mutation: Mutation::None,
            count: None,
            rows,
            nch,
            kind,
            says,
        }
    }

    const BUGS: &[Bug] = &[
        // Edits to the shared skeleton (`proto::Plant`).
        Bug {
            plant: 1,
            ..bug("reduce releases dK before reading it", 1, 2, Kind::Race,
                "race on tensor-memory dK, sub-partition 0: an MMA writes it, unordered with the read by reduce warp 4")
        },
        Bug {
            plant: 2,
            ..bug("MMA releases the K stage after S only", 1, 3, Kind::Race,
                "race on K stage 0 (D 0..): a TMA load completing on FULL[0] writes it, unordered with the read by an MMA")
        },
        Bug {
            plant: 3,
            ..bug("MMA drains only its last commits", 2, 1, Kind::InFlightAtExit,
                "the commit to EMPTY[0] (phase 0), the commit to Q_EMPTY[0] (phase 0)")
        },
        // One-line edits, as trace mutations.
        Bug {
            mutation: Mutation::SkipWait(Role::Mma, DS_READY),
            ..bug("MMA skips the DS_READY wait", 1, 1, Kind::Race,
                "race on dS rows of compute warp 0: compute warp 0 writes it, unordered with the read by an MMA")
        },
        Bug {
            mutation: Mutation::WaitShift(Role::Compute, S_READY, 1),
            ..bug("compute waits S_READY one phase ahead (wrong parity)", 1, 2, Kind::WaitPassesEarly,
                "compute warp 0 waits for phase 1 of S_READY (parity 1), which has completed only 0 phases")
        },
        Bug {
            mutation: Mutation::WaitShift(Role::Mma, EMPTY, -1),
            ..bug("MMA drain waits for the release before the last", 1, 3, Kind::PhaseWrap,
                "MMA lane waits for phase 0 of EMPTY[0] (parity 0), which has completed 2 phases: parity 0 now names phase 2, still open: the wait hangs")
        },
        Bug {
            count: Some((EMPTY, -1)),
            ..bug("EMPTY count one short", 1, 3, Kind::ArrivalPastCount,
                "arrives on EMPTY[0] for phase 0, which has already completed (8 arrivals per phase): it lands in phase 1")
        },
        Bug {
            count: Some((DS_READY, 1)),
            ..bug("DS_READY count one over", 1, 1, Kind::Deadlock,
                "MMA lane waits for phase 0 of DS_READY (0 completed)")
        },
        Bug {
            mutation: Mutation::EveryLane(Role::Compute, DS_READY),
            ..bug("compute arrives on DS_READY from every lane", 1, 1, Kind::ArrivalPastCount,
                "compute warp 0 makes 32 arrivals on DS_READY in phase 0, which expects only 4 more")
        },
        Bug {
            mutation: Mutation::ExpectTx(FULL, K_HALF_BYTES),
            ..bug("load expects half a K stage's bytes", 1, 1, Kind::TxPastCount,
                "completes 16384 bytes on FULL[0] for phase 0, but phase 1 is open")
        },
        Bug {
            mutation: Mutation::SkipWait(Role::Load, EMPTY),
            ..bug("load skips the EMPTY wait", 1, 3, Kind::ArrivalTooEarly,
                "load warp arrives on FULL[0] for phase 1 while phase 0 is still open")
        },
        Bug {
            mutation: Mutation::NoFenceAfter(Role::Compute),
            ..bug("compute drops fence::after_thread_sync", 1, 1, Kind::TcFence,
                "missing tcgen05.fence::after_thread_sync: compute warp 0 reads tensor memory after a wait")
        },
        Bug {
            mutation: Mutation::NoProxyFence(Role::Compute),
            ..bug("compute drops fence.proxy.async", 1, 1, Kind::ProxyFence,
                "an MMA reads dS rows of compute warp 0 (async proxy) with no fence.proxy.async")
        },
        Bug {
            mutation: Mutation::NoFinalBulkWait,
            ..bug("reduce skips its final bulk wait", 1, 1, Kind::InFlightAtExit,
                "1 bulk reduction(s) of reduce warp 4 not waited for")
        },
    ];

    fn explore_bug(b: &Bug, opts: Opts) -> Report {
        match b.plant {
            1 => check::<1>(b.rows, b.nch, b.mutation, b.count, opts),
            2 => check::<2>(b.rows, b.nch, b.mutation, b.count, opts),
            3 => check::<3>(b.rows, b.nch, b.mutation, b.count, opts),
            _ => check::<0>(b.rows, b.nch, b.mutation, b.count, opts),
        }
    }

    /// Asserts that the planted bug `name` is reported with its kind and
    /// message; prints what the checker said.
    fn caught(name: &str) {
        let b = BUGS.iter().find(|b| b.name == name).expect("a planted bug");
        let r = explore_bug(b, FAST);
        for f in &r.failures {
            println!("{:?}: {}", f.kind, f.msg);
        }
        assert!(
            r.failures
                .iter()
                .any(|f| f.kind == b.kind && f.msg.contains(b.says)),
            "{name}: expected {:?} ({}), got {:#?}",
            b.kind,
            b.says,
            r.failures
        );
    }

    #[test]
    fn planted_early_dk_free_races_on_tensor_memory() {
        caught("reduce releases dK before reading it");
    }

    #[test]
    fn planted_early_empty_commit_races_on_the_k_stage() {
        caught("MMA releases the K stage after S only");
    }

    #[test]
    fn planted_last_only_drain_leaves_commits_in_flight() {
        caught("MMA drains only its last commits");
    }

    #[test]
    fn mma_skipping_the_ds_wait_races_on_ds() {
        caught("MMA skips the DS_READY wait");
    }

    #[test]
    fn a_wait_one_phase_ahead_passes_early() {
        caught("compute waits S_READY one phase ahead (wrong parity)");
    }

    #[test]
    fn a_wait_two_phases_behind_wraps_around() {
        caught("MMA drain waits for the release before the last");
    }

    #[test]
    fn an_arrival_count_one_short_lets_an_arrival_past_it() {
        caught("EMPTY count one short");
    }

    #[test]
    fn an_arrival_count_one_over_deadlocks() {
        caught("DS_READY count one over");
    }

    #[test]
    fn every_lane_arriving_is_past_the_count() {
        caught("compute arrives on DS_READY from every lane");
    }

    #[test]
    fn expecting_half_the_bytes_lets_bytes_past_the_phase() {
        caught("load expects half a K stage's bytes");
    }

    #[test]
    fn load_skipping_the_empty_wait_refills_a_stage_in_use() {
        caught("load skips the EMPTY wait");
    }

    #[test]
    fn missing_fences_are_reported() {
        caught("compute drops fence::after_thread_sync");
        caught("compute drops fence.proxy.async");
    }

    #[test]
    fn a_missing_final_bulk_wait_leaves_reductions_in_flight() {
        caught("reduce skips its final bulk wait");
    }

    fn kinds(r: &Report) -> Vec<Kind> {
        let mut k: Vec<Kind> = r.failures.iter().map(|f| f.kind).collect();
        k.sort_by_key(|k| *k as u8);
        k.dedup();
        k
    }

    /// The persistent sets and the symmetry find a failure exactly when a
    /// search without them does, for the correct protocol and every
    /// planted bug, on cases small enough to search without them (at one
    /// chunk of one row also without the symmetry), and the planted bug's
    /// own failure among them. (The kinds found may differ beyond that:
    /// a path stops at its first failure, and which consequence of one bug
    /// a path meets first depends on the order the reduced search takes.)
    #[test]
    fn reductions_find_what_the_full_search_finds() {
        let all = Opts {
            max_failures: usize::MAX,
            ..FAST
        };
        let clean =
            [(1, 1), (1, 2), (1, 3), (2, 1)].map(|(r, c)| bug("none", r, c, Kind::Deadlock, ""));
        for b in clean.iter().chain(BUGS) {
            let fast = kinds(&explore_bug(b, all));
            let unreduced = Opts {
                persistent: false,
                symmetric: (b.rows, b.nch) != (1, 1),
                ..all
            };
            let full = kinds(&explore_bug(b, unreduced));
            let what = format!("{} ({} x {}): {fast:?} vs {full:?}", b.name, b.rows, b.nch);
            assert_eq!(fast.is_empty(), full.is_empty(), "{what}");
            assert!(fast.iter().all(|k| full.contains(k)), "{what}");
            if b.name != "none" {
                assert!(fast.contains(&b.kind) && full.contains(&b.kind), "{what}");
            }
        }
    }

    /// Keying the visited set by the abstract state (no clocks, no access
    /// records) visits as many states as keying it by the whole state:
    /// the clocks and records follow from the abstract state.
    #[test]
    fn abstract_state_determines_the_clocks() {
        let exact = Opts {
            full_key: true,
            symmetric: false,
            persistent: false,
            max_failures: usize::MAX,
        };
        let abs = Opts {
            full_key: false,
            ..exact
        };
        let full = check::<0>(1, 1, Mutation::None, None, exact);
        let part = check::<0>(1, 1, Mutation::None, None, abs);
        assert_eq!(full.states, part.states);
        assert!(full.failures.is_empty());
    }
}
