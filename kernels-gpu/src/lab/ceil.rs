//! Small kernels that measure this GPU's ceilings for the benchmark:
//! tensor-core throughput of the instruction the row kernel uses, scattered
//! f32 row reduction (per-element `red` and bulk `cp.reduce.async.bulk`),
//! gathered bf16 rows, plain copy bandwidth, and the per-slot traffic of
//! the gradient kernels (one gathered bf16 K row and one `red.v4` dK row
//! per slot, alone and together), and gathered rows streamed through a
//! shared-memory ring as the wgmma kernels consume them (`cp.async` with
//! and without the proxy fence, TMA).

use crate::abi::{CeilParams, CEIL_MIX_GATHER, CEIL_MIX_REDUCE, CEIL_MMA_CHAINS, CEIL_ROW};
use crate::abi::{
    CEIL_STREAM_FENCE, CEIL_STREAM_MAP_BYTES, CEIL_STREAM_ROWS, CEIL_STREAM_STAGES, CEIL_STREAM_TMA,
};
use crate::ptx::smem::SmemAddr;
use crate::ptx::{bulk, cp_async, global, mbarrier, mma, smem, sreg, sync, tma};

/// Independent accumulator chains per warp in [`ceil_mma_bf16`].
const CHAINS: usize = CEIL_MMA_CHAINS as usize;

/// Each warp issues `p.iters * CHAINS` `mma.sync` m16n8k16 (bf16 -> f32) on
/// register operands and writes one checksum per thread to `p.a` (f32).
///
/// # Safety
/// `p.a` must hold one f32 per launched thread.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn ceil_mma_bf16(p: CeilParams) {
    let tid = sreg::block_idx_x() * sreg::block_dim_x() + sreg::thread_idx_x();
    let a = [
        tid | 0x3f80_3f80,
        tid ^ 0x3f00_3f00,
        0x3e80_3e80,
        0x3f80_0000,
    ];
    let b = [0x3c00_3c00 ^ tid, 0x3c00_3c00];
    let mut acc = [[0.0f32; 4]; CHAINS];
    let mut i = 0;
    while i < p.iters {
        for c in acc.iter_mut() {
            // SAFETY: every lane of every warp executes the same iterations.
            unsafe { mma::mma_bf16_16816(c, a, b) };
        }
        i += 1;
    }
    let mut s = 0.0f32;
    for c in &acc {
        s += c[0] + c[1] + c[2] + c[3];
    }
    // SAFETY: one f32 per thread (caller).
    unsafe { *(p.a as *mut f32).add(tid as usize) = s };
}

/// Scattered f32 row reduction, one `red.global.add.f32` per element: warp
/// `w` adds a row of `CEIL_ROW` f32 (from registers) into row `idx[i]` of
/// `p.a` for i = w, w + warps, ... < `p.n`.
///
/// # Safety
/// `p.idx` holds `p.n` row ids below the row count of `p.a` (rows of
/// `CEIL_ROW` f32).
#[no_mangle]
pub unsafe extern "ptx-kernel" fn ceil_scatter_red(p: CeilParams) {
    let lane = sreg::thread_idx_x() % 32;
    let warps = sreg::grid_dim_x() * sreg::block_dim_x() / 32;
    let mut i = (sreg::block_idx_x() * sreg::block_dim_x() + sreg::thread_idx_x()) / 32;
    let v = 1.0f32 + lane as f32;
    while (i as u64) < p.n {
        // SAFETY: idx has n entries; each row id is in range (caller).
        unsafe {
            let r = *(p.idx as *const i32).add(i as usize) as usize;
            let row = (p.a as *mut f32).add(r * CEIL_ROW as usize);
            let mut j = lane;
            while j < CEIL_ROW {
                global::red_add_f32(row.add(j as usize), v);
                j += 32;
            }
        }
        i += warps;
    }
}

/// Scattered f32 row reduction by the bulk engine: each thread stages one
/// row in shared memory and issues one `cp.reduce.async.bulk` per index.
/// Launch with `CEIL_ROW * 4 * block_dim` bytes of dynamic shared memory.
///
/// # Safety
/// As [`ceil_scatter_red`]; `p.a` 16-byte aligned.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn ceil_scatter_bulk(p: CeilParams) {
    let t = sreg::thread_idx_x();
    let row_bytes = CEIL_ROW * 4;
    let mine = smem::base().add(t * row_bytes);
    let mut j = 0;
    while j < CEIL_ROW {
        // SAFETY: this thread's own staging row.
        unsafe { smem::st_f32(mine.add(4 * j), 1.0 + j as f32) };
        j += 1;
    }
    bulk::fence_proxy_async_shared();
    let threads = sreg::grid_dim_x() * sreg::block_dim_x();
    let mut i = sreg::block_idx_x() * sreg::block_dim_x() + t;
    while (i as u64) < p.n {
        // SAFETY: in-range row (caller); the staged row is never rewritten.
        unsafe {
            let r = *(p.idx as *const i32).add(i as usize) as usize;
            bulk::reduce_add_f32(
                (p.a as *mut f32).add(r * CEIL_ROW as usize),
                mine,
                row_bytes,
            );
        }
        bulk::commit_group();
        i += threads;
    }
    bulk::wait_group_0();
}

/// Gathered bf16 rows: warp `w` reads row `idx[i]` (`CEIL_ROW` bf16, 16
/// bytes per lane) of `p.b` for i = w, w + warps, ...; each thread writes a
/// checksum to `p.a` (u32).
///
/// # Safety
/// `p.idx` holds `p.n` in-range row ids of `p.b` (16-byte aligned rows);
/// `p.a` holds one u32 per launched thread.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn ceil_gather_bf16(p: CeilParams) {
    let tid = sreg::block_idx_x() * sreg::block_dim_x() + sreg::thread_idx_x();
    let lane = tid % 32;
    let warps = sreg::grid_dim_x() * sreg::block_dim_x() / 32;
    let vecs = CEIL_ROW * 2 / 16; // 16-byte vectors per row
    let mut i = tid / 32;
    let mut sum = 0u32;
    while (i as u64) < p.n {
        if lane < vecs {
            // SAFETY: in-range row of 16-byte aligned bf16 rows (caller).
            unsafe {
                let r = *(p.idx as *const i32).add(i as usize) as usize;
                let v = global::ld_nc_v4(
                    (p.b as *const u8).add(r * CEIL_ROW as usize * 2 + lane as usize * 16),
                );
                sum ^= v[0] ^ v[1] ^ v[2] ^ v[3];
            }
        }
        i += warps;
    }
    // SAFETY: one u32 per thread (caller).
    unsafe { *(p.a as *mut u32).add(tid as usize) = sum };
}

/// The per-slot memory traffic of the gradient kernels, without their
/// arithmetic: warp `w` takes slots i = w, w + warps, ... < `p.n` and, for
/// key row `r = idx[i]`, reads the bf16 row `r` of `p.b` (`CEIL_ROW` bf16,
/// 16 bytes per lane of the first half-warp) when `p.iters` has
/// [`CEIL_MIX_GATHER`], and adds a `CEIL_ROW`-f32 row into row `r` of `p.a`
/// with one `red.global.add.v4.f32` per lane (a 512-byte row per warp
/// instruction, as the kernels reduce dK) when it has [`CEIL_MIX_REDUCE`].
/// With both, the two streams share the memory system as they do in the
/// kernels; the gathered data only feeds a checksum, stored to row 0 of
/// `p.a` only if it equals an unlikely value (the benchmark's source is
/// zero), so the loads are not dead and no thread adds into one shared
/// address (one atomic per thread into one word would serialise them).
///
/// # Safety
/// `p.idx` holds `p.n` row ids below the row count of `p.a` (f32 rows of
/// `CEIL_ROW`) and of `p.b` (bf16 rows of `CEIL_ROW`); both 16-byte aligned.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn ceil_gather_reduce(p: CeilParams) {
    let tid = sreg::block_idx_x() * sreg::block_dim_x() + sreg::thread_idx_x();
    let lane = tid % 32;
    let warps = sreg::grid_dim_x() * sreg::block_dim_x() / 32;
    let (gather, reduce) = (
        p.iters & CEIL_MIX_GATHER != 0,
        p.iters & CEIL_MIX_REDUCE != 0,
    );
    let vecs = CEIL_ROW * 2 / 16; // 16-byte vectors per bf16 row
    let v = [1.0f32, 2.0, 3.0, 4.0];
    let mut sum = 0u32;
    let mut i = tid / 32;
    while (i as u64) < p.n {
        // SAFETY: in-range rows of 16-byte aligned buffers (caller).
        unsafe {
            let r = *(p.idx as *const i32).add(i as usize) as usize;
            if gather && lane < vecs {
                let g = global::ld_nc_v4(
                    (p.b as *const u8).add(r * CEIL_ROW as usize * 2 + lane as usize * 16),
                );
                sum ^= g[0] ^ g[1] ^ g[2] ^ g[3];
            }
            if reduce {
                let at = (p.a as *mut f32).add(r * CEIL_ROW as usize + lane as usize * 4);
                global::red_add_v4_f32(at, v);
            }
        }
        i += warps;
    }
    if sum == 0x5eed_0001 {
        // SAFETY: row 0 exists (caller).
        unsafe { *(p.a as *mut u32) = sum };
    }
}

/// Copy bandwidth: `p.n` 16-byte vectors from `p.b` to `p.a`, grid-stride.
///
/// # Safety
/// Both buffers 16-byte aligned with `p.n * 16` bytes, not overlapping.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn ceil_copy(p: CeilParams) {
    let stride = (sreg::grid_dim_x() * sreg::block_dim_x()) as u64;
    let mut i = (sreg::block_idx_x() * sreg::block_dim_x() + sreg::thread_idx_x()) as u64;
    while i < p.n {
        // SAFETY: i < n vectors in both buffers (caller).
        unsafe {
            let v = global::ld_nc_v4((p.b as *const u8).add(i as usize * 16));
            *((p.a as *mut [u32; 4]).add(i as usize)) = v;
        }
        i += stride;
    }
}

/// Bytes of one stage of [`ceil_gather_stream`]'s ring.
const STAGE_BYTES: u32 = CEIL_STREAM_ROWS * CEIL_ROW * 2;
/// Bytes of one 64-column block of a stage.
const BLOCK_BYTES: u32 = CEIL_STREAM_ROWS * 128;

/// Gathered bf16 rows streamed through a ring of `CEIL_STREAM_STAGES`
/// stages of 64 rows, `CEIL_STREAM_STAGES - 1` stages in flight: CTA `b`
/// takes chunks `b, b + grid, ...` of 64 row ids of `p.idx` (`p.n / 64`
/// chunks), waits for each, reads it back (a checksum per thread into
/// `p.a` after its map) and refills the stage consumed one iteration
/// before (at most `CEIL_STREAM_MAX_CHUNKS` chunks a CTA, whose ids it
/// copies into shared memory first). `p.iters`: [`CEIL_STREAM_TMA`] loads each row as two
/// 64-column boxes of the TMA map at the start of `p.a` (128-byte swizzle,
/// one mbarrier per stage); else 16-byte `cp.async` pieces into the same
/// swizzled layout, with [`CEIL_STREAM_FENCE`] a `fence.proxy.async` after
/// each wait.
///
/// # Safety
/// `CEIL_STREAM_THREADS` threads, `CEIL_STREAM_SMEM` bytes of dynamic
/// shared memory; `p.idx` holds `p.n` row ids of `p.b` (rows of
/// `CEIL_ROW` bf16, 16-byte aligned); `p.a` starts with a map over `p.b`
/// (`CEIL_STREAM_MAP_BYTES`, 64-byte aligned), then one u32 per launched
/// thread.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn ceil_gather_stream(p: CeilParams) {
    let tid = sreg::thread_idx_x();
    let (cta, grid) = (sreg::block_idx_x(), sreg::grid_dim_x());
    let ring = SmemAddr((smem::base().0 + 1023) & !1023);
    let bars = ring.add(CEIL_STREAM_STAGES * STAGE_BYTES);
    let sids = bars.add(64);
    let tma_mode = p.iters & CEIL_STREAM_TMA != 0;
    let fence = p.iters & CEIL_STREAM_FENCE != 0;
    let map = p.a;
    let chunks = (p.n / CEIL_STREAM_ROWS as u64) as u32;
    let mine = if cta < chunks {
        (chunks - cta)
            .div_ceil(grid)
            .min(crate::abi::CEIL_STREAM_MAX_CHUNKS)
    } else {
        0
    };
    // The CTA's row ids, chunk k at word 64 k.
    let mut w = tid;
    while w < mine * CEIL_STREAM_ROWS {
        let (k, t) = (w / CEIL_STREAM_ROWS, w % CEIL_STREAM_ROWS);
        // SAFETY: in range (caller); this thread's word of the id region.
        unsafe {
            let id = *(p.idx as *const i32).add(((cta + k * grid) * CEIL_STREAM_ROWS + t) as usize);
            smem::st_u32(sids.add(4 * w), id as u32);
        }
        w += crate::abi::CEIL_STREAM_THREADS;
    }
    if tid == 0 {
        for s in 0..CEIL_STREAM_STAGES {
            // SAFETY: this CTA's barrier words, before any use.
            unsafe { mbarrier::init(bars.add(8 * s), 1) };
        }
        mbarrier::fence_init();
    }
    // SAFETY: uniform control flow, every thread.
    unsafe { sync::bar_sync() };
    // Fills the stage of the CTA's chunk `k` (nothing past its chunks).
    let issue = |k: u32| {
        let stage = k % CEIL_STREAM_STAGES;
        let dst = ring.add(stage * STAGE_BYTES);
        if k >= mine {
            return;
        }
        let id = |t: u32| {
            // SAFETY: written before the first barrier.
            unsafe { smem::ld_u32(sids.add(4 * (k * CEIL_STREAM_ROWS + t))) as i32 }
        };
        if tma_mode {
            let bar = bars.add(8 * stage);
            // SAFETY: in-range ids and map (caller); the stage was read
            // before the barrier this thread passed last.
            unsafe {
                if tid == 0 {
                    tma::arrive_expect_tx(bar, STAGE_BYTES);
                }
                if tid < CEIL_STREAM_ROWS {
                    let r = id(tid);
                    tma::load_2d(dst.add(tid * 128), map, 0, r, bar);
                    tma::load_2d(dst.add(BLOCK_BYTES + tid * 128), map, 64, r, bar);
                }
            }
        } else {
            let pieces = CEIL_ROW * 2 / 16;
            let (first, piece) = (tid / pieces, tid % pieces);
            let per_pass = crate::abi::CEIL_STREAM_THREADS / pieces;
            let mut i = 0;
            while i < CEIL_STREAM_ROWS / per_pass {
                let row = first + per_pass * i;
                // SAFETY: in-range ids and rows (caller); the stage was read
                // before the barrier this thread passed last.
                unsafe {
                    let r = id(row) as usize;
                    let src =
                        (p.b as *const u8).add(r * CEIL_ROW as usize * 2 + piece as usize * 16);
                    let at = (piece / 8) * BLOCK_BYTES
                        + crate::tma::swizzle128_offset(row, (piece % 8) * 8);
                    cp_async::copy_16(dst.add(at), src, 16);
                }
                i += 1;
            }
            cp_async::commit_group();
        }
    };
    let mut k = 0;
    while k + 1 < CEIL_STREAM_STAGES {
        issue(k);
        k += 1;
    }
    let mut sum = 0u32;
    let mut k = 0;
    while k < mine {
        let stage = k % CEIL_STREAM_STAGES;
        if tma_mode {
            // SAFETY: the stage's barrier, its phase of chunk k.
            unsafe { mbarrier::wait_parity(bars.add(8 * stage), (k / CEIL_STREAM_STAGES) % 2) };
        } else {
            // Chunks k + 1 .. k + STAGES - 2 may still land.
            cp_async::wait_group::<{ CEIL_STREAM_STAGES as u32 - 2 }>();
            if fence {
                bulk::fence_proxy_async_shared();
            }
        }
        // SAFETY: uniform control flow, every thread.
        unsafe { sync::bar_sync() };
        let at = ring.add(stage * STAGE_BYTES + tid * 128);
        for j in 0..8 {
            // SAFETY: inside the stage, complete (waited, behind the barrier).
            sum ^= unsafe { smem::ld_u32(at.add(16 * j)) };
        }
        issue(k + CEIL_STREAM_STAGES - 1);
        k += 1;
    }
    if !tma_mode {
        cp_async::wait_all();
    }
    let out = (p.a + CEIL_STREAM_MAP_BYTES as u64) as *mut u32;
    // SAFETY: one u32 per launched thread after the map (caller).
    unsafe { *out.add((cta * crate::abi::CEIL_STREAM_THREADS + tid) as usize) = sum };
}
