//! Warpgroup MMA (`wgmma`, sm_90a): 128 threads (four consecutive warps,
//! the first a multiple of four) multiply operands read from shared memory
//! through matrix descriptors (`crate::sm90::desc`), accumulating f32 in registers.
//!
//! Each wrapper issues a whole K chain (`wgmma.fence`, the `mma_async`s,
//! `commit_group`, `wait_group 0`) in one `asm!` block. The accumulators
//! are therefore never touched by compiler-generated code while the
//! hardware still writes them (reading them before `wait_group` is
//! undefined behaviour, and Rust has no way to tell LLVM that); overlap
//! comes from the other warpgroups of the SM instead.
//!
//! Accumulator layout of `m64nNk16` (thread `t` of the warpgroup, warp
//! `w = t / 32`, lane `l`, `g = l / 4`, `c = 2 * (l % 4)`): register
//! `4 * j + i` holds `D[16 w + g + 8 * (i / 2)][8 j + c + i % 2]`.

use core::arch::asm;

/// `D(64x32) += A(64x128) B(128x32)`: eight `m64n32k16` steps, A and B
/// K-major (`a[k]`, `b[k]` the descriptors of step `k`).
///
/// # Safety
/// All 128 threads of the warpgroup execute it together (`.sync.aligned`);
/// every descriptor describes a 1024-byte aligned, 128-byte swizzled tile
/// inside the launch's shared memory whose generic-proxy writes were made
/// visible by `fence.proxy.async.shared::cta` and a barrier.
#[inline(always)]
pub unsafe fn m64n32_kmajor_k8(acc: &mut [f32; 16], a: [u64; 8], b: [u64; 8]) {
    // SAFETY: forwarded from the caller. The asm waits for its own group
    // (`wait_group 0`), so the accumulators are final when it returns and
    // the compiler may treat it as an ordinary instruction sequence. Not
    // `pure`/`nomem`: it reads shared memory and is warpgroup-collective.
    unsafe {
        asm!(
            "wgmma.fence.sync.aligned;",
            "{{",
            ".reg .pred p;",
            "setp.eq.u32 p, 1, 1;",
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}}}, {a0}, {b0}, p, 1, 1, 0, 0;",
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}}}, {a1}, {b1}, p, 1, 1, 0, 0;",
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}}}, {a2}, {b2}, p, 1, 1, 0, 0;",
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}}}, {a3}, {b3}, p, 1, 1, 0, 0;",
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}}}, {a4}, {b4}, p, 1, 1, 0, 0;",
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}}}, {a5}, {b5}, p, 1, 1, 0, 0;",
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}}}, {a6}, {b6}, p, 1, 1, 0, 0;",
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}}}, {a7}, {b7}, p, 1, 1, 0, 0;",
            "}}",
            "wgmma.commit_group.sync.aligned;",
            "wgmma.wait_group.sync.aligned 0;",
            d0 = inout(reg32) acc[0],
            d1 = inout(reg32) acc[1],
            d2 = inout(reg32) acc[2],
            d3 = inout(reg32) acc[3],
            d4 = inout(reg32) acc[4],
            d5 = inout(reg32) acc[5],
            d6 = inout(reg32) acc[6],
            d7 = inout(reg32) acc[7],
            d8 = inout(reg32) acc[8],
            d9 = inout(reg32) acc[9],
            d10 = inout(reg32) acc[10],
            d11 = inout(reg32) acc[11],
            d12 = inout(reg32) acc[12],
            d13 = inout(reg32) acc[13],
            d14 = inout(reg32) acc[14],
            d15 = inout(reg32) acc[15],
            a0 = in(reg64) a[0],
            a1 = in(reg64) a[1],
            a2 = in(reg64) a[2],
            a3 = in(reg64) a[3],
            a4 = in(reg64) a[4],
            a5 = in(reg64) a[5],
            a6 = in(reg64) a[6],
            a7 = in(reg64) a[7],
            b0 = in(reg64) b[0],
            b1 = in(reg64) b[1],
            b2 = in(reg64) b[2],
            b3 = in(reg64) b[3],
            b4 = in(reg64) b[4],
            b5 = in(reg64) b[5],
            b6 = in(reg64) b[6],
            b7 = in(reg64) b[7],
            options(nostack),
        )
    }
}

/// `D(64x64) += A(64x64) B(64x64)`: four `m64n64k16` steps, A K-major, B
/// MN-major (transposed, `imm-trans-b = 1`).
///
/// # Safety
/// All 128 threads of the warpgroup execute it together (`.sync.aligned`);
/// every descriptor describes a 1024-byte aligned, 128-byte swizzled tile
/// inside the launch's shared memory whose generic-proxy writes were made
/// visible by `fence.proxy.async.shared::cta` and a barrier.
#[inline(always)]
pub unsafe fn m64n64_ak_bmn_k4(acc: &mut [f32; 32], a: [u64; 4], b: [u64; 4]) {
    // SAFETY: forwarded from the caller. The asm waits for its own group
    // (`wait_group 0`), so the accumulators are final when it returns and
    // the compiler may treat it as an ordinary instruction sequence. Not
    // `pure`/`nomem`: it reads shared memory and is warpgroup-collective.
    unsafe {
        asm!(
            "wgmma.fence.sync.aligned;",
            "{{",
            ".reg .pred p;",
            "setp.eq.u32 p, 1, 1;",
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}}}, {a0}, {b0}, p, 1, 1, 0, 1;",
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}}}, {a1}, {b1}, p, 1, 1, 0, 1;",
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}}}, {a2}, {b2}, p, 1, 1, 0, 1;",
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}}}, {a3}, {b3}, p, 1, 1, 0, 1;",
            "}}",
            "wgmma.commit_group.sync.aligned;",
            "wgmma.wait_group.sync.aligned 0;",
            d0 = inout(reg32) acc[0],
            d1 = inout(reg32) acc[1],
            d2 = inout(reg32) acc[2],
            d3 = inout(reg32) acc[3],
            d4 = inout(reg32) acc[4],
            d5 = inout(reg32) acc[5],
            d6 = inout(reg32) acc[6],
            d7 = inout(reg32) acc[7],
            d8 = inout(reg32) acc[8],
            d9 = inout(reg32) acc[9],
            d10 = inout(reg32) acc[10],
            d11 = inout(reg32) acc[11],
            d12 = inout(reg32) acc[12],
            d13 = inout(reg32) acc[13],
            d14 = inout(reg32) acc[14],
            d15 = inout(reg32) acc[15],
            d16 = inout(reg32) acc[16],
            d17 = inout(reg32) acc[17],
            d18 = inout(reg32) acc[18],
            d19 = inout(reg32) acc[19],
            d20 = inout(reg32) acc[20],
            d21 = inout(reg32) acc[21],
            d22 = inout(reg32) acc[22],
            d23 = inout(reg32) acc[23],
            d24 = inout(reg32) acc[24],
            d25 = inout(reg32) acc[25],
            d26 = inout(reg32) acc[26],
            d27 = inout(reg32) acc[27],
            d28 = inout(reg32) acc[28],
            d29 = inout(reg32) acc[29],
            d30 = inout(reg32) acc[30],
            d31 = inout(reg32) acc[31],
            a0 = in(reg64) a[0],
            a1 = in(reg64) a[1],
            a2 = in(reg64) a[2],
            a3 = in(reg64) a[3],
            b0 = in(reg64) b[0],
            b1 = in(reg64) b[1],
            b2 = in(reg64) b[2],
            b3 = in(reg64) b[3],
            options(nostack),
        )
    }
}

/// `D(64x64) += A(64x64) B(64x64)`: four `m64n64k16` steps, A and B
/// MN-major (`imm-trans-a = imm-trans-b = 1`).
///
/// # Safety
/// All 128 threads of the warpgroup execute it together (`.sync.aligned`);
/// every descriptor describes a 1024-byte aligned, 128-byte swizzled tile
/// inside the launch's shared memory whose generic-proxy writes were made
/// visible by `fence.proxy.async.shared::cta` and a barrier.
#[inline(always)]
pub unsafe fn m64n64_amn_bmn_k4(acc: &mut [f32; 32], a: [u64; 4], b: [u64; 4]) {
    // SAFETY: forwarded from the caller. The asm waits for its own group
    // (`wait_group 0`), so the accumulators are final when it returns and
    // the compiler may treat it as an ordinary instruction sequence. Not
    // `pure`/`nomem`: it reads shared memory and is warpgroup-collective.
    unsafe {
        asm!(
            "wgmma.fence.sync.aligned;",
            "{{",
            ".reg .pred p;",
            "setp.eq.u32 p, 1, 1;",
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}}}, {a0}, {b0}, p, 1, 1, 1, 1;",
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}}}, {a1}, {b1}, p, 1, 1, 1, 1;",
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}}}, {a2}, {b2}, p, 1, 1, 1, 1;",
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}}}, {a3}, {b3}, p, 1, 1, 1, 1;",
            "}}",
            "wgmma.commit_group.sync.aligned;",
            "wgmma.wait_group.sync.aligned 0;",
            d0 = inout(reg32) acc[0],
            d1 = inout(reg32) acc[1],
            d2 = inout(reg32) acc[2],
            d3 = inout(reg32) acc[3],
            d4 = inout(reg32) acc[4],
            d5 = inout(reg32) acc[5],
            d6 = inout(reg32) acc[6],
            d7 = inout(reg32) acc[7],
            d8 = inout(reg32) acc[8],
            d9 = inout(reg32) acc[9],
            d10 = inout(reg32) acc[10],
            d11 = inout(reg32) acc[11],
            d12 = inout(reg32) acc[12],
            d13 = inout(reg32) acc[13],
            d14 = inout(reg32) acc[14],
            d15 = inout(reg32) acc[15],
            d16 = inout(reg32) acc[16],
            d17 = inout(reg32) acc[17],
            d18 = inout(reg32) acc[18],
            d19 = inout(reg32) acc[19],
            d20 = inout(reg32) acc[20],
            d21 = inout(reg32) acc[21],
            d22 = inout(reg32) acc[22],
            d23 = inout(reg32) acc[23],
            d24 = inout(reg32) acc[24],
            d25 = inout(reg32) acc[25],
            d26 = inout(reg32) acc[26],
            d27 = inout(reg32) acc[27],
            d28 = inout(reg32) acc[28],
            d29 = inout(reg32) acc[29],
            d30 = inout(reg32) acc[30],
            d31 = inout(reg32) acc[31],
            a0 = in(reg64) a[0],
            a1 = in(reg64) a[1],
            a2 = in(reg64) a[2],
            a3 = in(reg64) a[3],
            b0 = in(reg64) b[0],
            b1 = in(reg64) b[1],
            b2 = in(reg64) b[2],
            b3 = in(reg64) b[3],
            options(nostack),
        )
    }
}
