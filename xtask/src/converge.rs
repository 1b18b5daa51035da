//! The convergence check of `build-ptx`: no warp-collective instruction in
//! a lane-divergent region of any kernel.
//!
//! A `.sync.aligned` instruction (tcgen05, wgmma, ldmatrix, mma.sync,
//! shfl/vote/redux, barriers) must be executed by every lane of the warp at
//! the same instruction. rustc cannot mark `asm!` as `convergent`, so LLVM
//! is free to duplicate such a wrapper into both arms of a branch (tail
//! duplication, jump threading, unswitching); when that branch depends on
//! the lane, half the warp runs one copy and half the other, which the ISA
//! leaves undefined. The link step marks the collectives `convergent`
//! (`link::mark_convergent`); this check proves on the final PTX that no
//! pass undid it.
//!
//! The check, per function:
//! 1. Lane variance of every register, flow-insensitively: `%laneid`,
//!    loads from lane-dependent addresses, atomics, shuffles, MMA
//!    fragments, `mbarrier.try_wait` results, ... are lane-varying (but a
//!    full-warp `shfl.sync.idx` from a constant lane is a broadcast, so
//!    uniform);
//!    `%tid.x` is "thread index" whose warp part is uniform, so
//!    `tid >> 5`, `tid / 32`, `tid & ~31` and `tid < 32k` are warp-uniform
//!    while `tid & 31` or `tid == 0` are not; everything else inherits the
//!    variance of its operands.
//! 2. The control-flow graph and its post-dominators; the region of a
//!    conditional branch on a lane-varying predicate is every block reached
//!    from it before its immediate post-dominator (where the lanes
//!    reconverge).
//! 3. A collective inside such a region, or guarded by a lane-varying
//!    predicate, is a finding.
//! 4. A `.aligned` instruction reached from the exit of a loop whose trip
//!    count depends on the lane index (its exit branch's predicate varies
//!    with `%tid`/`%laneid` through arithmetic or lane-indexed loads; a
//!    barrier poll does not count) is a finding unless every path from the
//!    exit to it passes a point where the lanes wait for each other:
//!    `bar.warp.sync` of the full warp, or a non-`.aligned` CTA barrier
//!    (`barrier.sync`, `barrier.red`, which the ISA makes wait for every
//!    non-exited lane of the warp). After such a loop the lanes leave at
//!    different iterations; that ptxas makes them wait for each other at
//!    the exit is usual but not promised by anything in the PTX, and a
//!    `.aligned` instruction needs them at the same instruction.
//!
//! Registers declared inside a one-line `{ ... }` scope (inline asm) are
//! renamed per scope first, so that the scopes' shared names (`p`) do not
//! join into one register.

use std::collections::HashMap;

/// One collective instruction in a lane-divergent region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Kernel or function name.
    pub function: String,
    /// 1-based line of the collective instruction.
    pub line: usize,
    /// Its opcode.
    pub opcode: String,
    /// 1-based line of the lane-dependent branch (of the instruction
    /// itself when its own guard predicate is lane-varying; of the loop's
    /// exit branch for [`Kind::AfterLoop`]).
    pub branch_line: usize,
    /// Which rule it breaks.
    pub kind: Kind,
}

/// The rule a [`Finding`] breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A collective guarded by a lane-varying predicate.
    Guard,
    /// A collective between a lane-dependent branch and the point where
    /// the lanes reconverge (its immediate post-dominator).
    Region,
    /// A `.aligned` instruction reached from the exit of a loop whose trip
    /// count depends on the lane index, with no reconvergence point
    /// (`bar.warp.sync`, or a CTA barrier of the non-`.aligned` form, both
    /// of which wait for every lane of the warp) on the way.
    AfterLoop,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (func, line, op, at) = (&self.function, self.line, &self.opcode, self.branch_line);
        match self.kind {
            Kind::Guard => write!(
                f,
                "{func}: line {line}: `{op}` guarded by a lane-varying predicate"
            ),
            Kind::Region => write!(
                f,
                "{func}: line {line}: `{op}` inside the region of the lane-dependent branch at line {at}"
            ),
            Kind::AfterLoop => write!(
                f,
                "{func}: line {line}: `{op}` after the loop with a lane-dependent trip count that \
                 exits at line {at}, with no bar.warp.sync between"
            ),
        }
    }
}

/// Whether an opcode is a warp- or CTA-collective instruction: every
/// `.sync`/`.aligned` form (mma.sync, ldmatrix, shfl.sync, vote.sync,
/// redux.sync, bar.warp.sync, barrier.sync, wgmma.*, tcgen05.ld/alloc/...)
/// and the `bar`/`barrier` family.
pub fn is_collective(opcode: &str) -> bool {
    let mut parts = opcode.split('.');
    let head = parts.next().unwrap_or("");
    head == "bar"
        || head == "barrier"
        || head == "wgmma"
        || opcode.split('.').any(|p| p == "sync" || p == "aligned")
}

/// Lane variance of a value inside a warp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Var {
    /// The same in every lane of the warp.
    Uniform,
    /// `%tid.x + c` with `c` a multiple of 32: its lane part is the lane,
    /// its warp part uniform.
    Tid,
    /// May differ between lanes.
    Varying,
}

fn join(a: Option<Var>, b: Var) -> Var {
    match a {
        None => b,
        Some(a) if a == b => a,
        Some(_) => Var::Varying,
    }
}

/// One instruction.
#[derive(Debug)]
pub(crate) struct Inst {
    /// 1-based line in the PTX text.
    pub(crate) line: usize,
    /// Guard predicate register (without `!`), if any.
    pub(crate) guard: Option<String>,
    /// The opcode with its qualifiers (`tcgen05.ld.sync.aligned...`).
    pub(crate) opcode: String,
    /// Operands, split at top-level commas.
    pub(crate) operands: Vec<String>,
}

/// A basic block: instructions, then its successors (block indices;
/// `None` for the function's exit).
#[derive(Debug, Default)]
pub(crate) struct Block {
    /// Its instructions in order.
    pub(crate) insts: Vec<Inst>,
    /// Successor blocks; `None` leaves the function.
    pub(crate) succs: Vec<Option<usize>>,
}

/// Checks every function of `ptx`; returns every finding.
pub fn check(ptx: &str) -> Vec<Finding> {
    let noreturn = noreturn_functions(ptx);
    functions(ptx)
        .into_iter()
        .flat_map(|(name, body)| check_function(&name, &body, &noreturn))
        .collect()
}

/// The name a `.entry`/`.func` line (`kw`) declares, if it is one.
fn declared_name(line: &str, kw: &str) -> Option<String> {
    let rest = line.split(kw).nth(1)?;
    // `.func (.param ...) name(` has its return first.
    let rest = if rest.trim_start().starts_with('(') {
        rest.split_once(')').map_or("", |(_, r)| r)
    } else {
        rest
    };
    let name = rest
        .trim_start()
        .split(['(', ' ', ';'])
        .next()
        .unwrap_or("");
    Some(name.to_string())
}

/// Names of the functions declared `.noreturn` (a call to one ends its
/// block: LLVM places the next block's code right after such a call, with
/// no edge between them).
pub(crate) fn noreturn_functions(ptx: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending: Option<String> = None;
    for raw in ptx.lines() {
        let line = raw.split("//").next().unwrap_or("");
        if let Some(name) = declared_name(line, ".func ") {
            pending = Some(name);
        }
        if line.trim_start().starts_with(".noreturn") {
            if let Some(n) = pending.take() {
                if !out.contains(&n) {
                    out.push(n);
                }
            }
        }
        if line.contains('{') || line.trim_end().ends_with(';') {
            pending = None;
        }
    }
    out
}

/// Function bodies: (name, [(line, statement)]).
pub(crate) fn functions(ptx: &str) -> Vec<(String, Vec<(usize, String)>)> {
    let mut out = Vec::new();
    let mut header: Option<String> = None;
    let mut body: Option<(String, Vec<(usize, String)>)> = None;
    let mut depth = 0i32;
    for (i, raw) in ptx.lines().enumerate() {
        let line = raw.split("//").next().unwrap_or("");
        if body.is_none() && depth == 0 {
            for kw in [".entry ", ".func "] {
                if let Some(name) = declared_name(line, kw) {
                    header = Some(name);
                }
            }
            if line.trim_end().ends_with(';') && header.is_some() && !line.contains('{') {
                // A declaration (prototype), not a definition, unless
                // its parameter list continues on later lines.
                if !line.contains('(') || line.contains(')') {
                    header = None;
                }
            }
        }
        let opens = line.matches('{').count() as i32;
        let closes = line.matches('}').count() as i32;
        if depth == 0 && opens > 0 {
            if let Some(name) = header.take() {
                body = Some((name, Vec::new()));
            }
        } else if let Some((_, stmts)) = body.as_mut() {
            let scoped = scoped_registers(line);
            for s in line.split(';') {
                let s = s.trim_start_matches(|c: char| c.is_whitespace() || c == '{' || c == '}');
                let s = s.trim();
                if !s.is_empty() && !s.starts_with('.') {
                    let mut s = s.to_string();
                    for r in &scoped {
                        s = rename_register(&s, r, &format!("{r}$scope{}", i + 1));
                    }
                    stmts.push((i + 1, s));
                }
            }
        }
        depth += opens - closes;
        if depth == 0 {
            if let Some(b) = body.take() {
                out.push(b);
            }
        }
    }
    out
}

/// Registers declared inside a `{ ... }` scope that opens on `line` (the
/// inline-asm blocks write `{ .reg .pred p; ...; }` on one line). Every
/// such scope reuses the same names, so the statements of the line get
/// them renamed apart ([`rename_register`]): otherwise the flow-insensitive
/// variance would join every scope's `p` into one register.
fn scoped_registers(line: &str) -> Vec<String> {
    let Some((_, inner)) = line.split_once('{') else {
        return Vec::new();
    };
    let mut names = Vec::new();
    for decl in inner.split(';') {
        let Some(rest) = decl.trim().strip_prefix(".reg") else {
            continue;
        };
        // `.reg .type a, b` (no `<n>` ranges inside inline-asm scopes).
        let rest = rest.trim_start();
        let list = rest.split_once(char::is_whitespace).map_or("", |(_, l)| l);
        names.extend(
            list.split(',')
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty() && !n.contains('<')),
        );
    }
    names
}

/// `stmt` with every whole-token occurrence of register `from` replaced by
/// `to` (tokens as [`regs`] splits them).
fn rename_register(stmt: &str, from: &str, to: &str) -> String {
    let is_tok =
        |c: char| c.is_ascii_alphanumeric() || c == '%' || c == '_' || c == '.' || c == '$';
    let mut out = String::with_capacity(stmt.len());
    let mut tok = String::new();
    let flush = |tok: &mut String, out: &mut String| {
        out.push_str(if tok == from { to } else { tok });
        tok.clear();
    };
    for c in stmt.chars() {
        if is_tok(c) {
            tok.push(c);
        } else {
            flush(&mut tok, &mut out);
            out.push(c);
        }
    }
    flush(&mut tok, &mut out);
    out
}

/// Splits operands at top-level commas (not inside `{}` or `[]`).
fn split_operands(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (mut depth, mut cur) = (0, String::new());
    for c in s.chars() {
        match c {
            '{' | '[' | '(' => depth += 1,
            '}' | ']' | ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// Register-like tokens of an operand (`%r1`, `p`, `%tid.x`), skipping
/// immediates.
fn regs(operand: &str) -> Vec<&str> {
    operand
        .split(|c: char| {
            !(c.is_ascii_alphanumeric() || c == '%' || c == '_' || c == '.' || c == '$')
        })
        .filter(|t| !t.is_empty())
        .filter(|t| !t.starts_with(|c: char| c.is_ascii_digit() || c == '.'))
        .collect()
}

fn immediate(operand: &str) -> Option<i64> {
    let t = operand.trim();
    if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        return i64::from_str_radix(h, 16).ok();
    }
    t.parse().ok()
}

fn parse_inst(line: usize, s: &str) -> Inst {
    let (guard, rest) = match s.strip_prefix('@') {
        Some(r) => {
            let (g, rest) = r.split_once(char::is_whitespace).unwrap_or((r, ""));
            (Some(g.trim_start_matches('!').to_string()), rest.trim())
        }
        None => (None, s),
    };
    let (opcode, ops) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    Inst {
        line,
        guard,
        opcode: opcode.to_string(),
        operands: split_operands(ops),
    }
}

fn label_of(s: &str) -> Option<&str> {
    let (l, rest) = s.split_once(':')?;
    (rest.trim().is_empty()
        && !l.is_empty()
        && l.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$'))
    .then_some(l)
}

/// The basic blocks of a function body ([`functions`]).
pub(crate) fn blocks(stmts: &[(usize, String)], noreturn: &[String]) -> Vec<Block> {
    let mut blocks: Vec<Block> = vec![Block::default()];
    let mut labels: HashMap<String, usize> = HashMap::new();
    let mut jumps: Vec<(usize, String)> = Vec::new();
    // State of the last block: ended by a branch/exit, falls through to
    // the next block, carries a label.
    let (mut ended, mut falls, mut labeled) = (false, true, false);
    let new_block = |blocks: &mut Vec<Block>, falls: bool| {
        let cur = blocks.len() - 1;
        if falls {
            blocks[cur].succs.push(Some(cur + 1));
        }
        blocks.push(Block::default());
    };
    for (line, s) in stmts {
        if let Some(l) = label_of(s) {
            if ended || labeled || !blocks[blocks.len() - 1].insts.is_empty() {
                new_block(&mut blocks, falls);
            }
            labels.insert(l.to_string(), blocks.len() - 1);
            (ended, falls, labeled) = (false, true, true);
            continue;
        }
        if ended {
            new_block(&mut blocks, falls);
            (ended, falls, labeled) = (false, true, false);
        }
        let inst = parse_inst(*line, s);
        let cur = blocks.len() - 1;
        match inst.opcode.split('.').next().unwrap_or("") {
            "bra" => {
                jumps.push((cur, inst.operands.first().cloned().unwrap_or_default()));
                (ended, falls) = (true, inst.guard.is_some());
            }
            "ret" | "exit" => {
                blocks[cur].succs.push(None);
                (ended, falls) = (true, inst.guard.is_some());
            }
            // Aborts (`trap`, a call that never returns): no successor. The
            // thread never reaches an exit from here, so these paths do not
            // move the point where the others reconverge.
            "trap" => (ended, falls) = (true, inst.guard.is_some()),
            "call"
                if inst
                    .operands
                    .iter()
                    .find(|o| !o.starts_with('('))
                    .is_some_and(|f| noreturn.contains(f)) =>
            {
                (ended, falls) = (true, inst.guard.is_some());
            }
            _ => {}
        }
        blocks[cur].insts.push(inst);
    }
    if falls {
        // Falling off the end of the body.
        let last = blocks.len() - 1;
        blocks[last].succs.push(None);
    }
    for (b, t) in jumps {
        // A jump to an unknown label is treated as leaving the function.
        blocks[b].succs.push(labels.get(&t).copied());
    }
    blocks
}

/// What counts as a source of lane variance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sources {
    /// Everything that may differ between lanes: the lane index, and
    /// values the lanes read or receive separately (atomics, shuffles, MMA
    /// fragments, barrier polls, clocks, ...).
    All,
    /// The lane index alone (`%tid`, `%laneid`, `%lanemask_*`), through
    /// arithmetic and through loads from addresses computed from it: what
    /// makes a loop's trip count a function of the lane. Barrier polls and
    /// clocks count as warp-uniform here.
    LaneIndex,
}

/// Variance of the registers an instruction defines, given the current
/// classes; `None` while an operand's definitions are still unseen.
fn def_class(
    inst: &Inst,
    class: &HashMap<String, Var>,
    defined: &HashMap<String, ()>,
    sources: Sources,
) -> Option<Var> {
    let op = inst.opcode.as_str();
    let head = op.split('.').next().unwrap_or("");
    let uses: Vec<&str> = inst.operands.iter().skip(1).flat_map(|o| regs(o)).collect();
    let class_of = |r: &str| -> Option<Var> {
        match r {
            "%tid.x" | "%tid.y" | "%tid.z" => Some(Var::Tid),
            _ if r.starts_with("%laneid") || r.starts_with("%lanemask") => Some(Var::Varying),
            _ if (r.starts_with("%clock") || r.starts_with("%globaltimer"))
                && sources == Sources::All =>
            {
                Some(Var::Varying)
            }
            _ if r.starts_with("%") && r.contains('.') => Some(Var::Uniform),
            _ => match class.get(r) {
                Some(&c) => Some(c),
                None if defined.contains_key(r) => None,
                None => Some(Var::Uniform),
            },
        }
    };
    // A broadcast: every lane gets the same lane's value.
    if is_broadcast(inst) {
        return Some(Var::Uniform);
    }
    // Sources of lane variance whatever their operands (with
    // `Sources::LaneIndex` they inherit their operands' variance below).
    let source = matches!(
        head,
        "atom" | "shfl" | "mma" | "wgmma" | "ldmatrix" | "elect" | "activemask" | "match" | "call"
    ) || op.starts_with("tcgen05.ld")
        || op.starts_with("mbarrier.try_wait")
        || op.starts_with("mbarrier.test_wait");
    if source && sources == Sources::All {
        return Some(Var::Varying);
    }
    // A barrier poll answers with the state of one CTA barrier, not with
    // anything computed from the lane index.
    if sources == Sources::LaneIndex
        && (op.starts_with("mbarrier.try_wait") || op.starts_with("mbarrier.test_wait"))
    {
        return Some(Var::Uniform);
    }
    // Warp- or CTA-wide results.
    if matches!(head, "vote" | "redux")
        || (matches!(head, "bar" | "barrier") && op.contains(".red"))
    {
        return Some(Var::Uniform);
    }
    if op.starts_with("ld.param") {
        return Some(Var::Uniform);
    }
    let mut classes = Vec::new();
    for u in &uses {
        classes.push(class_of(u)?);
    }
    if head == "ld" {
        // The loaded value is uniform when the address is.
        return Some(if classes.iter().all(|&c| c == Var::Uniform) {
            Var::Uniform
        } else {
            Var::Varying
        });
    }
    if classes.contains(&Var::Varying) {
        return Some(Var::Varying);
    }
    let tids = classes.iter().filter(|&&c| c == Var::Tid).count();
    if tids == 0 {
        return Some(Var::Uniform);
    }
    if tids > 1 {
        return Some(Var::Varying);
    }
    Some(tid_transfer(inst, head))
}

/// `shfl.sync.idx.b32 d, a, LANE, 0x1f, -1` with a constant `LANE`: every
/// lane of the (whole) warp receives lane `LANE`'s value.
fn is_broadcast(inst: &Inst) -> bool {
    let o = &inst.operands;
    let imm = |s: &str| !s.contains('%');
    inst.opcode.starts_with("shfl.sync.idx")
        && inst.guard.is_none()
        && o.len() == 5
        && imm(&o[2])
        && o[3] == "0x1f"
        && matches!(o[4].as_str(), "-1" | "0xffffffff" | "0xFFFFFFFF")
}

/// The variance of `op(tid + 32k, immediates)`.
fn tid_transfer(inst: &Inst, head: &str) -> Var {
    let srcs = &inst.operands[1.min(inst.operands.len())..];
    let imm = srcs.iter().find_map(|o| immediate(o));
    let tid_first = srcs.first().is_some_and(|o| immediate(o).is_none());
    let aligned = |k: i64| k.rem_euclid(32) == 0;
    match (head, imm) {
        ("mov" | "cvt", _) => Var::Tid,
        ("shr", Some(k)) if k >= 5 => Var::Uniform,
        ("div", Some(k)) if k != 0 && aligned(k) => Var::Uniform,
        ("and", Some(m)) if m & 31 == 0 => Var::Uniform,
        ("bfe", _)
            if srcs
                .get(1)
                .and_then(|o| immediate(o))
                .is_some_and(|p| p >= 5) =>
        {
            Var::Uniform
        }
        ("add" | "sub", Some(k)) if aligned(k) && srcs.len() == 2 => Var::Tid,
        ("setp", Some(k)) => {
            let cmp = inst.opcode.split('.').nth(1).unwrap_or("");
            // `k < tid` is `tid > k`: mirror the comparison.
            let cmp = if tid_first {
                cmp
            } else {
                match cmp {
                    "lt" => "gt",
                    "gt" => "lt",
                    "le" => "ge",
                    "ge" => "le",
                    "lo" => "hi",
                    "hi" => "lo",
                    "ls" => "hs",
                    "hs" => "ls",
                    c => c,
                }
            };
            match cmp {
                "lt" | "ge" | "lo" | "hs" if aligned(k) => Var::Uniform,
                "le" | "gt" | "ls" | "hi" if aligned(k + 1) => Var::Uniform,
                _ => Var::Varying,
            }
        }
        _ => Var::Varying,
    }
}

/// Registers an instruction defines (its first operand, unless it is a
/// memory operand or the instruction defines nothing).
fn defs(inst: &Inst) -> Vec<&str> {
    let op = inst.opcode.as_str();
    let head = op.split('.').next().unwrap_or("");
    let no_def = matches!(
        head,
        "st" | "red"
            | "cp"
            | "bra"
            | "ret"
            | "exit"
            | "trap"
            | "fence"
            | "membar"
            | "prefetch"
            | "prefetchu"
            | "griddepcontrol"
            | "call"
            | "nanosleep"
    ) || (matches!(head, "bar" | "barrier") && !op.contains(".red"))
        || (head == "tcgen05" && !op.starts_with("tcgen05.ld"));
    match inst.operands.first() {
        Some(first) if !no_def && !first.starts_with('[') => regs(first),
        _ => Vec::new(),
    }
}

fn variance(blocks: &[Block], sources: Sources) -> HashMap<String, Var> {
    let insts: Vec<&Inst> = blocks.iter().flat_map(|b| &b.insts).collect();
    let mut defined: HashMap<String, ()> = HashMap::new();
    for i in &insts {
        for d in defs(i) {
            defined.insert(d.to_string(), ());
        }
    }
    let mut class: HashMap<String, Var> = HashMap::new();
    loop {
        let mut changed = false;
        for i in &insts {
            let ds = defs(i);
            if ds.is_empty() {
                continue;
            }
            let Some(c) = def_class(i, &class, &defined, sources) else {
                continue;
            };
            for d in ds {
                let new = join(class.get(d).copied(), c);
                if class.get(d) != Some(&new) {
                    class.insert(d.to_string(), new);
                    changed = true;
                }
            }
        }
        if !changed {
            return class;
        }
    }
}

/// Post-dominator sets (bit vectors over blocks; the exit is implicit,
/// and blocks that only abort count as post-dominated by every block).
fn post_dominators(blocks: &[Block]) -> Vec<Vec<bool>> {
    let n = blocks.len();
    let mut pd = vec![vec![true; n]; n];
    loop {
        let mut changed = false;
        for b in (0..n).rev() {
            let mut new = vec![true; n];
            let mut any = false;
            for s in &blocks[b].succs {
                match s {
                    None => {
                        new = vec![false; n];
                        any = true;
                    }
                    Some(s) => {
                        any = true;
                        for (x, v) in new.iter_mut().enumerate() {
                            *v &= pd[*s][x];
                        }
                    }
                }
            }
            if !any {
                // An abort (no successor): post-dominated by everything,
                // so it constrains no join point.
                new = vec![true; n];
            }
            new[b] = true;
            if new != pd[b] {
                pd[b] = new;
                changed = true;
            }
        }
        if !changed {
            return pd;
        }
    }
}

fn check_function(name: &str, stmts: &[(usize, String)], noreturn: &[String]) -> Vec<Finding> {
    let blocks = blocks(stmts, noreturn);
    let class = variance(&blocks, Sources::All);
    let varying = |g: &Option<String>| {
        g.as_deref()
            .is_some_and(|g| class.get(g).copied().unwrap_or(Var::Uniform) != Var::Uniform)
    };
    let mut found: Vec<Finding> = Vec::new();
    for b in &blocks {
        for i in &b.insts {
            if is_collective(&i.opcode) && varying(&i.guard) {
                found.push(Finding {
                    function: name.to_string(),
                    line: i.line,
                    opcode: i.opcode.clone(),
                    branch_line: i.line,
                    kind: Kind::Guard,
                });
            }
        }
    }
    let pd = post_dominators(&blocks);
    for (bi, b) in blocks.iter().enumerate() {
        let Some(br) = b.insts.last() else { continue };
        if !br.opcode.starts_with("bra") || !varying(&br.guard) || b.succs.len() < 2 {
            continue;
        }
        // Immediate post-dominator: the strict post-dominator whose own set
        // is this block's set minus itself (None: the exit).
        let strict: Vec<usize> = (0..blocks.len())
            .filter(|&x| x != bi && pd[bi][x])
            .collect();
        let ipdom = strict
            .iter()
            .copied()
            .find(|&p| (0..blocks.len()).all(|x| pd[p][x] == (pd[bi][x] && x != bi)));
        let mut seen = vec![false; blocks.len()];
        let mut stack: Vec<usize> = b.succs.iter().flatten().copied().collect();
        while let Some(x) = stack.pop() {
            if Some(x) == ipdom || seen[x] {
                continue;
            }
            seen[x] = true;
            for i in &blocks[x].insts {
                if is_collective(&i.opcode) {
                    let f = Finding {
                        function: name.to_string(),
                        line: i.line,
                        opcode: i.opcode.clone(),
                        branch_line: br.line,
                        kind: Kind::Region,
                    };
                    if !found.iter().any(|g| g.line == f.line) {
                        found.push(f);
                    }
                }
            }
            stack.extend(blocks[x].succs.iter().flatten().copied());
        }
    }
    for f in after_lane_loops(name, &blocks) {
        if !found.iter().any(|g| g.line == f.line) {
            found.push(f);
        }
    }
    found.sort_by_key(|f| f.line);
    found
}

/// `reach[a][b]`: block `b` is reachable from block `a` by one edge or
/// more (so `reach[b][b]` says that `b` lies on a cycle, and `a`, `b` lie
/// on a common cycle when each reaches the other).
pub(crate) fn reachability(blocks: &[Block]) -> Vec<Vec<bool>> {
    let n = blocks.len();
    let mut reach = vec![vec![false; n]; n];
    for (a, row) in reach.iter_mut().enumerate() {
        let mut stack: Vec<usize> = blocks[a].succs.iter().flatten().copied().collect();
        while let Some(x) = stack.pop() {
            if !row[x] {
                row[x] = true;
                stack.extend(blocks[x].succs.iter().flatten().copied());
            }
        }
    }
    reach
}

/// Whether an opcode requires every lane of the warp at the same
/// instruction: a `.aligned` form, or `bar.sync` / `bar.arrive` /
/// `bar.red` (which the ISA defines as `barrier.*.aligned`).
fn is_aligned(opcode: &str) -> bool {
    let mut parts = opcode.split('.');
    let head = parts.next().unwrap_or("");
    let second = parts.next().unwrap_or("");
    opcode.split('.').any(|p| p == "aligned")
        || (head == "bar" && matches!(second, "sync" | "arrive" | "red" | "cta"))
}

/// Whether an instruction makes every lane of the warp wait for all the
/// others, so that the lanes run on together from it: `bar.warp.sync` of
/// the full warp, and the non-`.aligned` CTA barriers `barrier.sync` /
/// `barrier.red` ("wait for all non-exited threads from its warp").
fn reconverges(inst: &Inst) -> bool {
    let op = inst.opcode.as_str();
    if inst.guard.is_some() {
        return false;
    }
    if op == "bar.warp.sync" {
        return inst
            .operands
            .first()
            .is_some_and(|m| matches!(m.as_str(), "-1" | "0xffffffff" | "0xFFFFFFFF"));
    }
    let mut parts = op.split('.');
    parts.next() == Some("barrier")
        && !is_aligned(op)
        && op.split('.').any(|p| p == "sync" || p == "red")
}

/// `.aligned` instructions reached from the exit of a loop whose trip
/// count depends on the lane index before a reconvergence point
/// ([`Kind::AfterLoop`]). Such a loop's lanes leave it at different
/// iterations; ptxas normally makes them wait for each other at the exit,
/// but nothing in the PTX requires it to, while a `.aligned` instruction
/// requires every lane at the same instruction. Loops that exit on a
/// barrier poll (`mbarrier.try_wait`) are not lane-indexed (every lane
/// polls the same barrier) and are left to the region check.
fn after_lane_loops(name: &str, blocks: &[Block]) -> Vec<Finding> {
    let indexed = variance(blocks, Sources::LaneIndex);
    let lane_indexed = |g: &Option<String>| {
        g.as_deref()
            .is_some_and(|g| indexed.get(g).copied().unwrap_or(Var::Uniform) != Var::Uniform)
    };
    let n = blocks.len();
    let reach = reachability(blocks);
    let mut found: Vec<Finding> = Vec::new();
    for (b, block) in blocks.iter().enumerate() {
        let Some(br) = block.insts.last() else {
            continue;
        };
        if !br.opcode.starts_with("bra") || !lane_indexed(&br.guard) || !reach[b][b] {
            continue;
        }
        // The exits: successors outside the loop (the cycle through `b`).
        let mut stack: Vec<usize> = block
            .succs
            .iter()
            .flatten()
            .copied()
            .filter(|&s| !(reach[s][b] && reach[b][s]))
            .collect();
        let mut seen = vec![false; n];
        while let Some(x) = stack.pop() {
            if std::mem::replace(&mut seen[x], true) {
                continue;
            }
            let mut joined = false;
            for i in &blocks[x].insts {
                if reconverges(i) {
                    joined = true;
                    break;
                }
                if is_aligned(&i.opcode) && !found.iter().any(|f| f.line == i.line) {
                    found.push(Finding {
                        function: name.to_string(),
                        line: i.line,
                        opcode: i.opcode.clone(),
                        branch_line: br.line,
                        kind: Kind::AfterLoop,
                    });
                }
            }
            if !joined {
                stack.extend(blocks[x].succs.iter().flatten().copied());
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(body: &str) -> String {
        format!(".version 8.6\n.target sm_100a\n.address_size 64\n\n.visible .entry k(\n\t.param .u64 k_param_0\n)\n{{\n\t.reg .pred %p<9>;\n\t.reg .b32 %r<99>;\n{body}\n}}\n")
    }

    const LD: &str = "tcgen05.ld.sync.aligned.32x32b.x16.b32 {%r60, %r61, %r62, %r63, %r64, %r65, %r66, %r67, %r68, %r69, %r70, %r71, %r72, %r73, %r74, %r75}, [%r9];";

    /// The defect this check exists for: the same collective copied into
    /// both arms of a branch on the lane (as LLVM did to the sm100 dQ
    /// epilogue).
    #[test]
    fn a_collective_in_both_arms_of_a_lane_branch_fails() {
        let ptx = kernel(&format!(
            "\tmov.u32 %r1, %tid.x;\n\tand.b32 %r2, %r1, 31;\n\tsetp.lt.u32 %p1, %r2, 16;\n\t@%p1 bra $L__BB0_2;\n\t{LD}\n\ttcgen05.wait::ld.sync.aligned;\n\tbra.uni $L__BB0_3;\n$L__BB0_2:\n\t{LD}\n\ttcgen05.wait::ld.sync.aligned;\n\tst.global.b32 [%rd1], %r60;\n$L__BB0_3:\n\tret;\n"
        ));
        let f = check(&ptx);
        let branch = 1 + ptx.lines().position(|l| l.contains("@%p1 bra")).unwrap();
        assert_eq!(f.len(), 4, "{f:?}");
        assert!(f.iter().all(|f| f.branch_line == branch), "{f:?}");
        assert!(f[0].to_string().contains("tcgen05.ld.sync.aligned"));
    }

    #[test]
    fn the_same_code_on_a_warp_uniform_branch_passes() {
        for cond in [
            "shr.u32 %r2, %r1, 5;\n\tsetp.eq.s32 %p1, %r2, 9;",
            "setp.lt.u32 %p1, %r1, 128;",
            "and.b32 %r2, %r1, -32;\n\tsetp.eq.s32 %p1, %r2, 288;",
            "add.s32 %r2, %r1, -288;\n\tsetp.lt.u32 %p1, %r2, 32;",
            "div.u32 %r2, %r1, 64;\n\tsetp.ne.s32 %p1, %r2, 0;",
            "setp.gt.u32 %p1, %r1, 255;",
        ] {
            let ptx = kernel(&format!(
                "\tmov.u32 %r1, %tid.x;\n\t{cond}\n\t@%p1 bra $L__BB0_2;\n\t{LD}\n\tbra.uni $L__BB0_3;\n$L__BB0_2:\n\t{LD}\n$L__BB0_3:\n\tret;\n"
            ));
            assert_eq!(check(&ptx), [], "{cond}");
        }
    }

    #[test]
    fn lane_dependent_conditions_are_seen_through_arithmetic_and_loads() {
        for cond in [
            "setp.eq.s32 %p1, %r1, 0;",
            "setp.lt.u32 %p1, %r1, 100;",
            "and.b32 %r2, %r1, 31;\n\tsetp.ne.s32 %p1, %r2, 0;",
            "shl.b32 %r2, %r1, 2;\n\tld.shared.b32 %r3, [%r2];\n\tsetp.ne.s32 %p1, %r3, 0;",
            "mov.u32 %r2, %laneid;\n\tsetp.ne.s32 %p1, %r2, 0;",
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%r5], %r6; selp.u32 %r2, 1, 0, p; }\n\tsetp.ne.s32 %p1, %r2, 0;",
        ] {
            let ptx = kernel(&format!(
                "\tmov.u32 %r1, %tid.x;\n\t{cond}\n\t@%p1 bra $L__BB0_2;\n\tbar.warp.sync -1;\n$L__BB0_2:\n\tret;\n"
            ));
            let f = check(&ptx);
            assert_eq!(f.len(), 1, "{cond}: {f:?}");
            assert_eq!(f[0].opcode, "bar.warp.sync");
        }
    }

    #[test]
    fn collectives_after_the_lanes_reconverge_pass() {
        // if (lane == 0) { store } ; collective after the join.
        let ptx = kernel(&format!(
            "\tmov.u32 %r1, %tid.x;\n\tand.b32 %r2, %r1, 31;\n\tsetp.ne.s32 %p1, %r2, 0;\n\t@%p1 bra $L__BB0_2;\n\tst.shared.b32 [%r3], %r2;\n$L__BB0_2:\n\t{LD}\n\t{{ .reg .pred p; setp.ne.u32 p, %r2, 0; barrier.red.popc.u32 %r4, 0, p; }}\n\tret;\n"
        ));
        assert_eq!(check(&ptx), []);
    }

    #[test]
    fn a_broadcast_from_a_constant_lane_is_uniform() {
        let body = |lane: &str| {
            kernel(&format!(
                "\tmov.u32 %r1, %tid.x;\n\tand.b32 %r2, %r1, 31;\n\tshfl.sync.idx.b32 %r3, %r2, {lane}, 0x1f, -1;\n\tsetp.lt.u32 %p1, %r3, 7;\n\t@%p1 bra $L__BB0_2;\n\tbar.warp.sync -1;\n$L__BB0_2:\n\tret;\n"
            ))
        };
        assert_eq!(check(&body("0")), []);
        // From a lane that varies, the result varies.
        assert_eq!(check(&body("%r2")).len(), 1);
    }

    #[test]
    fn a_collective_in_a_loop_with_a_lane_dependent_exit_fails() {
        let ptx = kernel(
            "\tmov.u32 %r1, %tid.x;\n\tand.b32 %r2, %r1, 31;\n$L__BB0_1:\n\tshfl.sync.bfly.b32 %r3, %r2, 1, 0x1f, -1;\n\tadd.s32 %r2, %r2, 1;\n\tsetp.lt.u32 %p1, %r2, 40;\n\t@%p1 bra $L__BB0_1;\n\tret;\n",
        );
        let f = check(&ptx);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].opcode, "shfl.sync.bfly.b32");
        // The same loop with a uniform trip count passes.
        let ptx = kernel(
            "\tmov.u32 %r1, %tid.x;\n\tmov.u32 %r2, 0;\n$L__BB0_1:\n\tshfl.sync.bfly.b32 %r3, %r1, 1, 0x1f, -1;\n\tadd.s32 %r2, %r2, 1;\n\tsetp.lt.u32 %p1, %r2, 40;\n\t@%p1 bra $L__BB0_1;\n\tret;\n",
        );
        assert_eq!(check(&ptx), []);
    }

    #[test]
    fn a_collective_under_a_lane_varying_guard_fails() {
        let ptx = kernel(
            "\tmov.u32 %r1, %tid.x;\n\tsetp.eq.s32 %p1, %r1, 0;\n\t@%p1 wgmma.fence.sync.aligned;\n\tret;\n",
        );
        let f = check(&ptx);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].branch_line, f[0].line);
    }

    /// A call to a `.noreturn` function ends its block: the code LLVM
    /// places after it is not its successor.
    #[test]
    fn a_noreturn_call_on_a_lane_branch_does_not_fall_into_the_next_block() {
        let body = format!(
            "\tmov.u32 %r1, %tid.x;\n$L__BB0_1:\n\t{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%r5], %r6; selp.u32 %r2, 1, 0, p; }}\n\tsetp.ne.s32 %p1, %r2, 0;\n\t@%p1 bra $L__BB0_3;\n\tsetp.eq.s32 %p2, %r1, 0;\n\t@%p2 bra $L__BB0_1;\n\tcall.uni fire, (param0);\n$L__BB0_5:\n\tbar.warp.sync -1;\n\tret;\n$L__BB0_3:\n\t{LD}\n\tret;\n"
        );
        let decl = ".func fire\n(\n\t.param .b32 fire_param_0\n)\n.noreturn;\n";
        let ptx = kernel(&body).replacen(".visible .entry", &format!("{decl}.visible .entry"), 1);
        assert_eq!(check(&ptx), []);
        // Read as falling through, the call would lead into the unrelated
        // block laid out after it, which would then sit in the region of
        // the wait loop's lane-dependent exit.
        let ptx = kernel(&body).replacen(
            ".visible .entry",
            &format!("{}.visible .entry", decl.replace(".noreturn;\n", "")),
            1,
        );
        assert!(!check(&ptx).is_empty());
    }

    #[test]
    fn collectives_are_recognised() {
        for op in [
            "tcgen05.ld.sync.aligned.32x32b.x16.b32",
            "tcgen05.wait::ld.sync.aligned",
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16",
            "wgmma.fence.sync.aligned",
            "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
            "shfl.sync.bfly.b32",
            "redux.sync.max.u32",
            "bar.warp.sync",
            "barrier.sync",
            "barrier.red.popc.u32",
            "tcgen05.dealloc.cta_group::1.sync.aligned.b32",
        ] {
            assert!(is_collective(op), "{op}");
        }
        for op in [
            "tcgen05.mma.cta_group::1.kind::f16",
            "tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64",
            "mbarrier.try_wait.parity.shared::cta.b64",
            "cp.async.bulk.wait_group.read",
            "st.shared.b32",
            "red.global.add.v4.f32",
        ] {
            assert!(!is_collective(op), "{op}");
        }
    }

    /// The stage-2 prologue's pattern: a store loop strided by the thread
    /// index (its trip count depends on the lane), then, on a
    /// warp-uniform branch, `tcgen05.alloc` and
    /// `relinquish_alloc_permit` (`.sync.aligned`). Nothing collective is
    /// inside a lane-dependent region, so only the after-loop rule sees
    /// it.
    fn lane_loop_then(between: &str, after: &str) -> String {
        kernel(&format!(
            "\tmov.u32 %r1, %tid.x;\n\tshl.b32 %r2, %r1, 2;\n$L__BB0_1:\n\tst.shared.b32 [%r2], 0;\n\tadd.s32 %r2, %r2, 1280;\n\tsetp.lt.u32 %p1, %r2, 16384;\n\t@%p1 bra $L__BB0_1;\n{between}\tshr.u32 %r3, %r1, 5;\n\tsetp.ne.s32 %p2, %r3, 9;\n\t@%p2 bra $L__BB0_3;\n{after}\ttcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r4], 512;\n\ttcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;\n$L__BB0_3:\n\tbarrier.sync 0;\n\tret;\n"
        ))
    }

    #[test]
    fn an_aligned_instruction_after_a_lane_dependent_loop_fails() {
        let ptx = lane_loop_then("", "");
        let f = check(&ptx);
        assert_eq!(f.len(), 2, "{f:?}");
        let exit = 1 + ptx.lines().position(|l| l.contains("@%p1 bra")).unwrap();
        assert!(
            f.iter()
                .all(|f| f.kind == Kind::AfterLoop && f.branch_line == exit),
            "{f:?}"
        );
        assert!(f[0].opcode.starts_with("tcgen05.alloc"));
        assert!(f[0].to_string().contains("no bar.warp.sync"), "{}", f[0]);
        // A partial-warp bar.warp.sync does not bring every lane together.
        let f = check(&lane_loop_then("", "\tbar.warp.sync 0xffff;\n"));
        assert_eq!(f.len(), 2, "{f:?}");
        // An `.aligned` CTA barrier needs the lanes together itself.
        let f = check(&lane_loop_then("\tbar.sync 0;\n", "\tbar.warp.sync -1;\n"));
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].opcode, "bar.sync");
    }

    #[test]
    fn a_reconvergence_point_after_the_loop_passes() {
        for (between, after) in [
            ("", "\tbar.warp.sync -1;\n"),
            ("", "\tbar.warp.sync 0xffffffff;\n"),
            ("\tbarrier.sync 0;\n", ""),
        ] {
            let f = check(&lane_loop_then(between, after));
            assert_eq!(f, [], "{between:?} {after:?}");
        }
    }

    /// Loops whose exit is a barrier poll, or whose trip count is the same
    /// in every lane, are not lane-indexed loops.
    #[test]
    fn wait_loops_and_uniform_loops_before_an_aligned_instruction_pass() {
        let poll = kernel(&format!(
            "\tmov.u32 %r6, 0;\n$L__BB0_1:\n\t{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%r5], %r6; selp.u32 %r2, 1, 0, p; }}\n\tsetp.eq.s32 %p1, %r2, 0;\n\t@%p1 bra $L__BB0_1;\n\t{LD}\n\ttcgen05.wait::ld.sync.aligned;\n\tret;\n"
        ));
        assert_eq!(check(&poll), []);
        let uniform = kernel(&format!(
            "\tmov.u32 %r1, %tid.x;\n\tmov.u32 %r2, 0;\n$L__BB0_1:\n\tst.shared.b32 [%r1], 0;\n\tadd.s32 %r2, %r2, 1;\n\tsetp.lt.u32 %p1, %r2, 12;\n\t@%p1 bra $L__BB0_1;\n\t{LD}\n\tret;\n"
        ));
        assert_eq!(check(&uniform), []);
    }

    /// Each one-line `{ ... }` scope's registers are its own: a lane-varying
    /// `p` in one scope does not make another scope's `p` lane-varying.
    #[test]
    fn scoped_registers_are_renamed_apart() {
        assert_eq!(
            scoped_registers("\t{ .reg .pred p; setp.ne.u32 p, %r2, 0; }"),
            ["p"]
        );
        assert_eq!(
            rename_register("selp.u32 %r2, 1, 0, p", "p", "p$scope7"),
            "selp.u32 %r2, 1, 0, p$scope7"
        );
        assert_eq!(
            rename_register("popc %p1, p.x, pp", "p", "q"),
            "popc %p1, p.x, pp"
        );
        let ptx = kernel(&format!(
            "\tmov.u32 %r1, %tid.x;\n\t{{ .reg .pred p; setp.ne.u32 p, %r1, 0; barrier.red.popc.u32 %r7, 0, p; }}\n\tmov.u32 %r6, 0;\n$L__BB0_1:\n\t{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%r5], %r6; selp.u32 %r2, 1, 0, p; }}\n\tsetp.eq.s32 %p1, %r2, 0;\n\t@%p1 bra $L__BB0_1;\n\t{LD}\n\tret;\n"
        ));
        let stmts = &functions(&ptx)[0].1;
        assert!(stmts
            .iter()
            .any(|(_, s)| s.contains("selp.u32 %r2, 1, 0, p$scope")));
        assert_eq!(check(&ptx), []);
    }

    /// The committed PTX files pass (`build-ptx` checks freshly built text;
    /// this catches a committed file that differs from it).
    #[test]
    fn the_committed_ptx_passes() {
        for arch in crate::ptx::ARCHS.map(|a| a.target) {
            let path = crate::ptx::ptx_path(&crate::util::repo_root(), arch);
            let text = std::fs::read_to_string(&path).unwrap();
            let f = check(&text);
            assert!(f.is_empty(), "{arch}: {}", f.len());
            // The check parsed every kernel.
            let entries = text.matches(".entry ").count();
            assert!(entries > 0 && functions(&text).len() >= entries, "{arch}");
        }
    }
}
