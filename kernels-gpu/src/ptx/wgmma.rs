//! Warpgroup MMA (`wgmma`, sm_90a): 128 threads (four consecutive warps,
//! the first a multiple of four) multiply operands read from shared memory
//! through matrix descriptors (`crate::sm90::desc`), accumulating f32 in
//! registers.
//!
//! Each wrapper takes the descriptors of the first K step and derives the
//! others inside the asm by adding fixed offsets to the start-address field
//! (16-byte units; the tiles of `crate::sm90` never carry out of the
//! 14-bit field), so only two 64-bit values are live outside the asm.
//!
//! The synchronous wrappers issue a whole K chain (`wgmma.fence`, the
//! `mma_async`s, `commit_group`, `wait_group 0`) in one `asm!` block, so
//! the accumulators are never touched by compiler-generated code while the
//! hardware still writes them (reading them before `wait_group` is
//! undefined behaviour). The issue/wait pair keeps the accumulators as
//! in/out operands of both halves for the same reason.
//!
//! The templates are assembled by small macros (`mma!` for one
//! `mma_async`, `step!` for a later K step, `open_chain!` / `close_chain!`
//! around a chain, `regs16!` / `regs32!` for the accumulator lists), and
//! `asm_acc16!` / `asm_acc32!` add the accumulator operands; the PTX they
//! produce is byte-identical to the written-out strings they replaced.
//!
//! Accumulator layout of `m64nNk16` (thread `t` of the warpgroup, warp
//! `w = t / 32`, lane `l`, `g = l / 4`, `c = 2 * (l % 4)`): register
//! `4 * j + i` holds `D[16 w + g + 8 * (i / 2)][8 j + c + i % 2]`.

use core::arch::asm;

/// The accumulator list of an `m64n32` tile in a template: `{d0, ..., d15}`.
macro_rules! regs16 {
    () => {
        "{{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}}}"
    };
}

/// The accumulator list of an `m64n64` tile in a template: `{d0, ..., d31}`.
macro_rules! regs32 {
    () => {
        "{{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}}}"
    };
}

/// One `wgmma.mma_async` (bf16 operands, f32 accumulators) of `$shape` on
/// the accumulator list `$regs`, with descriptors `$a` and `$b` (template
/// operands or asm registers), scale-d from the predicate `p`, unit
/// scales, and the transpose flags `$ta` / `$tb` (1 = MN-major).
macro_rules! mma {
    ($shape:literal, $regs:expr, $a:literal, $b:literal, $ta:literal, $tb:literal) => {
        concat!(
            "wgmma.mma_async.sync.aligned.",
            $shape,
            ".f32.bf16.bf16 ",
            $regs,
            ", ",
            $a,
            ", ",
            $b,
            ", p, 1, 1, ",
            $ta,
            ", ",
            $tb,
            ";"
        )
    };
}

/// A later K step: `ak = $a + $da`, `bk = $b + $db` (the descriptors'
/// start addresses advanced, in 16-byte units; registers `ak`, `bk`
/// declared in the template), then [`mma`] on them.
macro_rules! step {
    ($shape:literal, $regs:expr, $a:literal, $da:literal, $b:literal, $db:literal, $ta:literal, $tb:literal) => {
        concat!(
            "add.s64 ak, ",
            $a,
            ", ",
            $da,
            ";\n",
            "add.s64 bk, ",
            $b,
            ", ",
            $db,
            ";\n",
            mma!($shape, $regs, "ak", "bk", $ta, $tb)
        )
    };
}

/// Opens a K chain: `wgmma.fence`, a scope with the predicate `p` (true:
/// accumulate into the registers) and the step registers `ak`, `bk`.
macro_rules! open_chain {
    () => {
        "wgmma.fence.sync.aligned;\n{{\n.reg .pred p;\n.reg .b64 ak, bk;\nsetp.eq.u32 p, 1, 1;"
    };
}

/// Closes the scope of [`open_chain`] and commits the chain's group.
macro_rules! close_chain {
    () => {
        "}}\nwgmma.commit_group.sync.aligned;"
    };
}

/// The four `m64n64k16` steps of dK += dS^T q on the accumulators `d`
/// ([`dk_m64n64`]'s layouts: A `$a` and B `$b` MN-major, step `k` 2048
/// bytes further), inside a chain.
macro_rules! dk_steps {
    ($a:literal, $b:literal) => {
        concat!(
            mma!("m64n64k16", regs32!(), $a, $b, 1, 1),
            "\n",
            step!("m64n64k16", regs32!(), $a, 128, $b, 128, 1, 1),
            "\n",
            step!("m64n64k16", regs32!(), $a, 256, $b, 256, 1, 1),
            "\n",
            step!("m64n64k16", regs32!(), $a, 384, $b, 384, 1, 1)
        )
    };
}

/// `asm!` with the 8 accumulator registers of an `m64n16` tile as its
/// first operands `d0`..`d7` (in/out), then the given ones, then
/// `options(nostack)`.
macro_rules! asm_acc8 {
    ($acc:expr, [$($t:expr),* $(,)?], $($op:tt)*) => {
        asm!(
            $($t),*,
            d0 = inout(reg32) $acc[0],
            d1 = inout(reg32) $acc[1],
            d2 = inout(reg32) $acc[2],
            d3 = inout(reg32) $acc[3],
            d4 = inout(reg32) $acc[4],
            d5 = inout(reg32) $acc[5],
            d6 = inout(reg32) $acc[6],
            d7 = inout(reg32) $acc[7],
            $($op)*
            options(nostack),
        )
    };
}

/// [`asm_acc8`] for the 16 accumulator registers of an `m64n32` tile
/// (`d8`..`d15` passed on as the first of the given operands): the
/// wrappers below differ only in their templates.
macro_rules! asm_acc16 {
    ($acc:expr, [$($t:expr),* $(,)?], $($op:tt)*) => {
        asm_acc8!(
            $acc,
            [$($t),*],
            d8 = inout(reg32) $acc[8],
            d9 = inout(reg32) $acc[9],
            d10 = inout(reg32) $acc[10],
            d11 = inout(reg32) $acc[11],
            d12 = inout(reg32) $acc[12],
            d13 = inout(reg32) $acc[13],
            d14 = inout(reg32) $acc[14],
            d15 = inout(reg32) $acc[15],
            $($op)*
        )
    };
}

/// [`asm_acc16`] for the 32 accumulator registers of an `m64n64` tile
/// (`d16`..`d31` passed on as the first of the given operands).
macro_rules! asm_acc32 {
    ($acc:expr, [$($t:expr),* $(,)?], $($op:tt)*) => {
        asm_acc16!(
            $acc,
            [$($t),*],
            d16 = inout(reg32) $acc[16],
            d17 = inout(reg32) $acc[17],
            d18 = inout(reg32) $acc[18],
            d19 = inout(reg32) $acc[19],
            d20 = inout(reg32) $acc[20],
            d21 = inout(reg32) $acc[21],
            d22 = inout(reg32) $acc[22],
            d23 = inout(reg32) $acc[23],
            d24 = inout(reg32) $acc[24],
            d25 = inout(reg32) $acc[25],
            d26 = inout(reg32) $acc[26],
            d27 = inout(reg32) $acc[27],
            d28 = inout(reg32) $acc[28],
            d29 = inout(reg32) $acc[29],
            d30 = inout(reg32) $acc[30],
            d31 = inout(reg32) $acc[31],
            $($op)*
        )
    };
}

/// Issues `D(64x32) += A(64x128) B(128x32)` without waiting: eight
/// `m64n32k16` steps, A and B K-major, stored as two 64-column swizzle
/// blocks 8192 bytes apart (step `k` starts `32 (k % 4)` bytes into a row of
/// block `k / 4`). Complete it with [`wait_m64n32`].
///
/// # Safety
/// As the synchronous wrappers; in addition nothing may read or write
/// `acc` (or overwrite the shared operands) before the matching wait on
/// the same array, and no other wgmma group may be committed in between
/// (the wait drains all).
#[inline(always)]
pub unsafe fn issue_s_m64n32(acc: &mut [f32; 16], a: u64, b: u64) {
    // SAFETY: forwarded from the caller. `acc` is an in/out operand here and at the wait, so the compiler keeps
    // it in place and does not use its values in between. Not `pure`/`nomem`: it
    // reads shared memory and is warpgroup-collective.
    unsafe {
        asm_acc16!(
            acc,
            [
                open_chain!(),
                mma!("m64n32k16", regs16!(), "{a}", "{b}", 0, 0),
                step!("m64n32k16", regs16!(), "{a}", 2, "{b}", 2, 0, 0),
                step!("m64n32k16", regs16!(), "{a}", 4, "{b}", 4, 0, 0),
                step!("m64n32k16", regs16!(), "{a}", 6, "{b}", 6, 0, 0),
                step!("m64n32k16", regs16!(), "{a}", 512, "{b}", 512, 0, 0),
                step!("m64n32k16", regs16!(), "{a}", 514, "{b}", 514, 0, 0),
                step!("m64n32k16", regs16!(), "{a}", 516, "{b}", 516, 0, 0),
                step!("m64n32k16", regs16!(), "{a}", 518, "{b}", 518, 0, 0),
                close_chain!(),
            ],
            a = in(reg64) a,
            b = in(reg64) b,
        )
    }
}

/// [`issue_s_m64n32`] over K = 64 (D = 64): four `m64n32k16` steps, A and
/// B K-major, one 64-column swizzle block each (step `k` starts `32 k`
/// bytes into a row). Complete it with [`wait_m64n32`].
///
/// # Safety
/// As [`issue_s_m64n32`].
#[inline(always)]
pub unsafe fn issue_s_m64n32_k64(acc: &mut [f32; 16], a: u64, b: u64) {
    // SAFETY: as `issue_s_m64n32`.
    unsafe {
        asm_acc16!(
            acc,
            [
                open_chain!(),
                mma!("m64n32k16", regs16!(), "{a}", "{b}", 0, 0),
                step!("m64n32k16", regs16!(), "{a}", 2, "{b}", 2, 0, 0),
                step!("m64n32k16", regs16!(), "{a}", 4, "{b}", 4, 0, 0),
                step!("m64n32k16", regs16!(), "{a}", 6, "{b}", 6, 0, 0),
                close_chain!(),
            ],
            a = in(reg64) a,
            b = in(reg64) b,
        )
    }
}

/// `wgmma.wait_group 0` completing an [`issue_s_m64n32`] (or
/// [`issue_s_m64n32_k64`]): `acc` holds the
/// result afterwards.
///
/// # Safety
/// Whole warpgroup; `acc` is the array given to the issue.
#[inline(always)]
pub unsafe fn wait_m64n32(acc: &mut [f32; 16]) {
    // SAFETY: a wait; `acc` as in/out operands marks the point where its
    // values become defined for the compiler.
    unsafe {
        asm_acc16!(
            acc,
            [
                "wgmma.wait_group.sync.aligned 0;",
                // Names the accumulators (a PTX comment) so they are operands.
                "// {d0} {d1} {d2} {d3} {d4} {d5} {d6} {d7} {d8} {d9} {d10} {d11} {d12} {d13} {d14} {d15}",
            ],
        )
    }
}

/// `D(64x64) += A(64x64) B(64x64)`, four `m64n64k16` steps: A K-major (one
/// swizzle block of 64 columns, step `k` 32 bytes further into each row),
/// B MN-major (rows along K, step `k` 16 rows = 2048 bytes further).
///
/// # Safety
/// All 128 threads of the warpgroup execute it together (`.sync.aligned`);
/// `a`/`b` describe 1024-byte aligned, 128-byte swizzled tiles inside the
/// launch's shared memory, covering every K step, whose generic-proxy
/// writes were made visible by `fence.proxy.async.shared::cta` and a
/// barrier.
#[inline(always)]
pub unsafe fn dq_m64n64(acc: &mut [f32; 32], a: u64, b: u64) {
    // SAFETY: forwarded from the caller. The asm waits for its own group,
    // so the accumulators are final when it returns. Not `pure`/`nomem`:
    // it reads shared memory and is warpgroup-collective.
    unsafe {
        asm_acc32!(
            acc,
            [
                open_chain!(),
                mma!("m64n64k16", regs32!(), "{a}", "{b}", 0, 1),
                step!("m64n64k16", regs32!(), "{a}", 2, "{b}", 128, 0, 1),
                step!("m64n64k16", regs32!(), "{a}", 4, "{b}", 256, 0, 1),
                step!("m64n64k16", regs32!(), "{a}", 6, "{b}", 384, 0, 1),
                close_chain!(),
                "wgmma.wait_group.sync.aligned 0;",
            ],
            a = in(reg64) a,
            b = in(reg64) b,
        )
    }
}

/// `D(64x64) += A(64x64) B(64x64)`, four `m64n64k16` steps: A and B
/// MN-major (rows along K, step `k` 16 rows = 2048 bytes further).
///
/// # Safety
/// All 128 threads of the warpgroup execute it together (`.sync.aligned`);
/// `a`/`b` describe 1024-byte aligned, 128-byte swizzled tiles inside the
/// launch's shared memory, covering every K step, whose generic-proxy
/// writes were made visible by `fence.proxy.async.shared::cta` and a
/// barrier.
#[inline(always)]
pub unsafe fn dk_m64n64(acc: &mut [f32; 32], a: u64, b: u64) {
    // SAFETY: forwarded from the caller. The asm waits for its own group,
    // so the accumulators are final when it returns. Not `pure`/`nomem`:
    // it reads shared memory and is warpgroup-collective.
    unsafe {
        asm_acc32!(
            acc,
            [
                open_chain!(),
                dk_steps!("{a}", "{b}"),
                close_chain!(),
                "wgmma.wait_group.sync.aligned 0;",
            ],
            a = in(reg64) a,
            b = in(reg64) b,
        )
    }
}

/// [`dk_m64n64`] over K = 128 from two tile pairs: four `m64n64k16` steps
/// on (`a0`, `b0`), then four on (`a1`, `b1`) (each pair laid out as
/// [`dk_m64n64`]'s). The paired kernel's dK of two rows whose slots hold the
/// same key rows: `[dS_a; dS_b]^T [q_a; q_b]`, one product for both.
///
/// # Safety
/// As [`dk_m64n64`], for both pairs of tiles.
#[inline(always)]
pub unsafe fn dk_m64n64_k128(acc: &mut [f32; 32], a0: u64, b0: u64, a1: u64, b1: u64) {
    // SAFETY: forwarded from the caller. The asm waits for its own group,
    // so the accumulators are final when it returns. Not `pure`/`nomem`:
    // it reads shared memory and is warpgroup-collective.
    unsafe {
        asm_acc32!(
            acc,
            [
                open_chain!(),
                dk_steps!("{a0}", "{b0}"),
                dk_steps!("{a1}", "{b1}"),
                close_chain!(),
                "wgmma.wait_group.sync.aligned 0;",
            ],
            a0 = in(reg64) a0,
            b0 = in(reg64) b0,
            a1 = in(reg64) a1,
            b1 = in(reg64) b1,
        )
    }
}

/// The four A registers of K step `$k` in a template (`{a<4k>}, ...,
/// {a<4k+3>}`), for the register-A forms.
macro_rules! regs_a {
    (0) => {
        "{{{a0}, {a1}, {a2}, {a3}}}"
    };
    (1) => {
        "{{{a4}, {a5}, {a6}, {a7}}}"
    };
    (2) => {
        "{{{a8}, {a9}, {a10}, {a11}}}"
    };
    (3) => {
        "{{{a12}, {a13}, {a14}, {a15}}}"
    };
}

/// `$mac!($head, a0 = in(reg32) $a[0], ..., a15 = in(reg32) $a[15],
/// $op)`: the 16 A-fragment registers of a register-A form (`regs_a`) as
/// operands of the asm macro `$mac`.
macro_rules! with_a16 {
    ($mac:ident, ($($head:tt)*), $a:expr, $($op:tt)*) => {
        $mac!(
            $($head)*,
            a0 = in(reg32) $a[0],
            a1 = in(reg32) $a[1],
            a2 = in(reg32) $a[2],
            a3 = in(reg32) $a[3],
            a4 = in(reg32) $a[4],
            a5 = in(reg32) $a[5],
            a6 = in(reg32) $a[6],
            a7 = in(reg32) $a[7],
            a8 = in(reg32) $a[8],
            a9 = in(reg32) $a[9],
            a10 = in(reg32) $a[10],
            a11 = in(reg32) $a[11],
            a12 = in(reg32) $a[12],
            a13 = in(reg32) $a[13],
            a14 = in(reg32) $a[14],
            a15 = in(reg32) $a[15],
            $($op)*
        )
    };
}

/// One `m64n64k16` step of [`issue_rs_s_m64n64_k128`]: A registers of K
/// step `$k`, B at `{b}` + `$db` (16-byte units), scale-d `$p`.
macro_rules! rs_s_step {
    ($k:tt, $db:literal, $p:literal) => {
        concat!(
            "add.s64 bk, {b}, ",
            $db,
            ";\nwgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 ",
            regs32!(),
            ", ",
            regs_a!($k),
            ", bk, ",
            $p,
            ", 1, 1, 0;"
        )
    };
}

/// Issues `D(64x64) = A(64x128) B(128x64)` without waiting (overwriting
/// `acc`, whose values on entry are ignored: the first step's scale-d is
/// 0, so callers need not zero it): eight `m64n64k16` steps, B K-major in
/// two 64-column swizzle blocks 8192 bytes apart (step `k` starts
/// `32 (k % 4)` bytes into a row of block `k / 4`). A's first 64 columns
/// come from registers, `a` (K step `k` in `a[4k..4k + 4]`, the `m64k16`
/// layout of `sm90::dense::frag_at`); steps 4..7 read its second swizzle
/// block from shared memory at `a_hi` (K-major, laid out as B's): half of
/// A's shared-memory reads for 16 registers. Dense mode's logits: q of a
/// row against 64 keys, or 64 keys against q of a row. Complete it with
/// [`wait_1_m64n64`].
///
/// # Safety
/// All 128 threads of the warpgroup execute it together (`.sync.aligned`);
/// `a_hi`/`b` describe 1024-byte aligned, 128-byte swizzled tiles inside
/// the launch's shared memory whose writes are visible to the async proxy
/// (TMA writes completed on an mbarrier this thread waited for); nothing
/// reads or writes `acc`, overwrites the tiles or changes the registers of
/// `a` before a wait that completes this group, with `acc` as its
/// operand.
#[inline(always)]
pub unsafe fn issue_rs_s_m64n64_k128(acc: &mut [f32; 32], a: &[u32; 16], a_hi: u64, b: u64) {
    // SAFETY: forwarded from the caller; `acc` is an in/out operand here
    // and at the wait.
    unsafe {
        with_a16!(
            asm_acc32,
            (acc, [
                "wgmma.fence.sync.aligned;\n{{\n.reg .pred p, z;\n.reg .b64 ak, bk;\nsetp.eq.u32 p, 1, 1;\nsetp.ne.u32 z, 1, 1;",
                rs_s_step!(0, 0, "z"),
                rs_s_step!(1, 2, "p"),
                rs_s_step!(2, 4, "p"),
                rs_s_step!(3, 6, "p"),
                step!("m64n64k16", regs32!(), "{ah}", 0, "{b}", 512, 0, 0),
                step!("m64n64k16", regs32!(), "{ah}", 2, "{b}", 514, 0, 0),
                step!("m64n64k16", regs32!(), "{ah}", 4, "{b}", 516, 0, 0),
                step!("m64n64k16", regs32!(), "{ah}", 6, "{b}", 518, 0, 0),
                close_chain!(),
            ]),
            a,
            ah = in(reg64) a_hi,
            b = in(reg64) b,
        )
    }
}

/// `wgmma.wait_group 1`: every group but the newest is complete, among
/// them the one that wrote `acc`, whose values are defined afterwards.
///
/// # Safety
/// Whole warpgroup; `acc` is the array of a group committed before the
/// newest one.
#[inline(always)]
pub unsafe fn wait_1_m64n64(acc: &mut [f32; 32]) {
    // SAFETY: a wait; `acc` as in/out operands marks the point where its
    // values become defined for the compiler.
    unsafe {
        asm_acc32!(
            acc,
            [
                "wgmma.wait_group.sync.aligned 1;",
                // Names the accumulators (a PTX comment) so they are operands.
                concat!("// ", regs32!()),
            ],
        )
    }
}

/// The accumulator list of an `m64n128` tile in a template: `{d0, ...,
/// d31, e0, ..., e31}` (the first 64 columns, then the last 64).
macro_rules! regs64 {
    () => {
        "{{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}, {e0}, {e1}, {e2}, {e3}, {e4}, {e5}, {e6}, {e7}, {e8}, {e9}, {e10}, {e11}, {e12}, {e13}, {e14}, {e15}, {e16}, {e17}, {e18}, {e19}, {e20}, {e21}, {e22}, {e23}, {e24}, {e25}, {e26}, {e27}, {e28}, {e29}, {e30}, {e31}}}"
    };
}

/// [`asm_acc32`] for an `m64n128` accumulator held as two halves: `$d0`
/// as `d0`..`d31`, `$d1` as `e0`..`e31` (in/out), then the given operands.
macro_rules! asm_acc64 {
    ($d0:expr, $d1:expr, [$($t:expr),* $(,)?], $($op:tt)*) => {
        asm_acc32!(
            $d0,
            [$($t),*],
            e0 = inout(reg32) $d1[0],
            e1 = inout(reg32) $d1[1],
            e2 = inout(reg32) $d1[2],
            e3 = inout(reg32) $d1[3],
            e4 = inout(reg32) $d1[4],
            e5 = inout(reg32) $d1[5],
            e6 = inout(reg32) $d1[6],
            e7 = inout(reg32) $d1[7],
            e8 = inout(reg32) $d1[8],
            e9 = inout(reg32) $d1[9],
            e10 = inout(reg32) $d1[10],
            e11 = inout(reg32) $d1[11],
            e12 = inout(reg32) $d1[12],
            e13 = inout(reg32) $d1[13],
            e14 = inout(reg32) $d1[14],
            e15 = inout(reg32) $d1[15],
            e16 = inout(reg32) $d1[16],
            e17 = inout(reg32) $d1[17],
            e18 = inout(reg32) $d1[18],
            e19 = inout(reg32) $d1[19],
            e20 = inout(reg32) $d1[20],
            e21 = inout(reg32) $d1[21],
            e22 = inout(reg32) $d1[22],
            e23 = inout(reg32) $d1[23],
            e24 = inout(reg32) $d1[24],
            e25 = inout(reg32) $d1[25],
            e26 = inout(reg32) $d1[26],
            e27 = inout(reg32) $d1[27],
            e28 = inout(reg32) $d1[28],
            e29 = inout(reg32) $d1[29],
            e30 = inout(reg32) $d1[30],
            e31 = inout(reg32) $d1[31],
            $($op)*
        )
    };
}

/// One `m64n128k16` step of [`issue_rs_m64n128_k64`]: A registers of K
/// step `$k`, B at `{b}` + `$db` (16-byte units).
macro_rules! rs_step {
    ($k:tt, $db:literal) => {
        concat!(
            "add.s64 bk, {b}, ",
            $db,
            ";\nwgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 ",
            regs64!(),
            ", ",
            regs_a!($k),
            ", bk, p, 1, 1, 1;"
        )
    };
}

/// Issues `[D0 D1](64x128) += A(64x64) B(64x128)` without waiting, A in
/// registers: A is the bf16 fragment `a` (K step `k` in `a[4k..4k + 4]`,
/// the `m64k16` A layout: what an `m64n64` accumulator packs into,
/// `sm90::dense::pack_a`); B is MN-major (rows along K, step `k` 16 rows =
/// 2048 bytes further) in two 64-column swizzle blocks, the descriptor's
/// `lbo` the bytes between them; columns `0..64` accumulate into `d0` and
/// `64..128` into `d1` (the `m64n128` accumulator list is `d0` then `d1`).
/// Four `m64n128k16` steps in one group. Dense mode's dQ += dS K and
/// dK += dS^T q. Complete it with [`wait_0_m64n128`] (or a later
/// `wait_group` that covers it).
///
/// # Safety
/// As [`issue_rs_s_m64n64_k128`] for `b`, whose `lbo` is the offset of the
/// second block, and for `d0` / `d1`; in addition the registers of `a`
/// keep their values until the group completes: the caller writes new A
/// values only after a `wait_group` that covers it.
#[inline(always)]
pub unsafe fn issue_rs_m64n128_k64(d0: &mut [f32; 32], d1: &mut [f32; 32], a: &[u32; 16], b: u64) {
    // SAFETY: forwarded from the caller; all 64 accumulators are in/out
    // operands here and at the wait.
    unsafe {
        with_a16!(
            asm_acc64,
            (d0, d1, [
                "wgmma.fence.sync.aligned;\n{{\n.reg .pred p;\n.reg .b64 bk;\nsetp.eq.u32 p, 1, 1;",
                rs_step!(0, 0),
                rs_step!(1, 128),
                rs_step!(2, 256),
                rs_step!(3, 384),
                close_chain!(),
            ]),
            a,
            b = in(reg64) b,
        )
    }
}

/// `wgmma.wait_group 0` completing an [`issue_rs_m64n128_k64`]: `d0` and
/// `d1` hold the sums afterwards.
///
/// # Safety
/// Whole warpgroup; `d0` / `d1` are the arrays given to the issue.
#[inline(always)]
pub unsafe fn wait_0_m64n128(d0: &mut [f32; 32], d1: &mut [f32; 32]) {
    // SAFETY: a wait; the accumulators as in/out operands mark the point
    // where their values become defined for the compiler.
    unsafe {
        asm_acc64!(
            d0,
            d1,
            [
                "wgmma.wait_group.sync.aligned 0;",
                concat!("// ", regs64!())
            ],
        )
    }
}

/// Marks `acc` as defined here (an empty `asm!` with the registers as
/// in/out operands): instructions that set it, such as zeroing, stay
/// before this point and so before any product issued after it. ptxas
/// serialises every `wgmma` of a function where a non-wgmma instruction
/// writes an accumulator while a group is in flight.
#[inline(always)]
pub fn pin_m64n64(acc: &mut [f32; 32]) {
    // SAFETY: an empty template; the registers pass through unchanged.
    unsafe { asm_acc32!(acc, [concat!("// pinned ", regs32!())],) }
}

/// The accumulator list of an `m64n16` tile in a template: `{d0, ..., d7}`.
macro_rules! regs8 {
    () => {
        "{{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}}}"
    };
}

/// The K chain of the forward's `S^T = K q^T` on an `m64nN` accumulator
/// list: A (a K chunk, [`crate::portable::forward::CHUNK`] rows) and B (a q tile, N
/// rows) both K-major in 64-column swizzle blocks, step `k` of a block
/// `32 k` bytes into each row; with K = 128 the second blocks start at
/// `{a1}` / `{b1}`. Committed and waited for.
macro_rules! fwd_chain {
    ($shape:literal, $regs:expr, k64) => {
        concat!(
            open_chain!(),
            mma!($shape, $regs, "{a0}", "{b0}", 0, 0),
            "\n",
            step!($shape, $regs, "{a0}", 2, "{b0}", 2, 0, 0),
            "\n",
            step!($shape, $regs, "{a0}", 4, "{b0}", 4, 0, 0),
            "\n",
            step!($shape, $regs, "{a0}", 6, "{b0}", 6, 0, 0),
            "\n",
        )
    };
    ($shape:literal, $regs:expr, k128) => {
        concat!(
            fwd_chain!($shape, $regs, k64),
            mma!($shape, $regs, "{a1}", "{b1}", 0, 0),
            "\n",
            step!($shape, $regs, "{a1}", 2, "{b1}", 2, 0, 0),
            "\n",
            step!($shape, $regs, "{a1}", 4, "{b1}", 4, 0, 0),
            "\n",
            step!($shape, $regs, "{a1}", 6, "{b1}", 6, 0, 0),
            "\n",
        )
    };
}

/// One forward product wrapper: `D(64 x N) += A(64 x K) B(K x N)` on the
/// tile's accumulators, issued, committed and waited for in one `asm!`.
macro_rules! fwd_product {
    ($(#[$doc:meta])* $name:ident, $acc_ty:ty, $shape:literal, $regs:ident, $asm:ident, $k:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// All 128 threads of the warpgroup execute it together
        /// (`.sync.aligned`); the descriptors describe 1024-byte aligned,
        /// 128-byte swizzled K-major tiles inside the launch's shared
        /// memory covering every K step (`a1`/`b1` unused with K = 64),
        /// whose generic-proxy writes were made visible by
        /// `fence.proxy.async.shared::cta` and a barrier; no other wgmma
        /// group is in flight (the wait drains all).
        #[inline(always)]
        pub unsafe fn $name(acc: &mut $acc_ty, a0: u64, b0: u64, a1: u64, b1: u64) {
            // SAFETY: forwarded from the caller. The asm waits for its own
            // group, so the accumulators are final when it returns. Not
            // `pure`/`nomem`: it reads shared memory and is
            // warpgroup-collective.
            unsafe {
                $asm!(
                    acc,
                    [
                        fwd_chain!($shape, $regs!(), $k),
                        close_chain!(),
                        "wgmma.wait_group.sync.aligned 0;",
                        // Names the second blocks (a PTX comment): unused
                        // by the K = 64 chain.
                        "// {a1} {b1}",
                    ],
                    a0 = in(reg64) a0,
                    b0 = in(reg64) b0,
                    a1 = in(reg64) a1,
                    b1 = in(reg64) b1,
                )
            }
        }
    };
}

fwd_product!(
    /// The forward's product for H = 16, D = 64: four `m64n16k16` steps.
    fwd_m64n16_k64, [f32; 8], "m64n16k16", regs8, asm_acc8, k64
);
fwd_product!(
    /// The forward's product for H = 16, D = 128: eight `m64n16k16` steps.
    fwd_m64n16_k128, [f32; 8], "m64n16k16", regs8, asm_acc8, k128
);
fwd_product!(
    /// The forward's product for H = 32, D = 64: four `m64n32k16` steps.
    fwd_m64n32_k64, [f32; 16], "m64n32k16", regs16, asm_acc16, k64
);
fwd_product!(
    /// The forward's product for H = 32, D = 128: eight `m64n32k16` steps.
    fwd_m64n32_k128, [f32; 16], "m64n32k16", regs16, asm_acc16, k128
);
fwd_product!(
    /// The forward's product for H = 64, D = 64: four `m64n64k16` steps.
    fwd_m64n64_k64, [f32; 32], "m64n64k16", regs32, asm_acc32, k64
);
fwd_product!(
    /// The forward's product for H = 64, D = 128: eight `m64n64k16` steps.
    fwd_m64n64_k128, [f32; 32], "m64n64k16", regs32, asm_acc32, k128
);

/// `asm_acc64` on one `[[f32; 32]; 2]` accumulator (the `m64n128` tile's
/// first and last 64 columns).
macro_rules! asm_acc64_pair {
    ($acc:expr, [$($t:expr),* $(,)?], $($op:tt)*) => {{
        let [d0, d1] = $acc;
        asm_acc64!(d0, d1, [$($t),*], $($op)*)
    }};
}

fwd_product!(
    /// The forward's product for H = 128, D = 64: four `m64n128k16` steps.
    fwd_m64n128_k64, [[f32; 32]; 2], "m64n128k16", regs64, asm_acc64_pair, k64
);
fwd_product!(
    /// The forward's product for H = 128, D = 128: eight `m64n128k16` steps.
    fwd_m64n128_k128, [[f32; 32]; 2], "m64n128k16", regs64, asm_acc64_pair, k128
);
