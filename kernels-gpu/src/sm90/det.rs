//! The deterministic mode's passes (sm_90a, device only): `det_bounds`,
//! `det_key_sums`, `det_scales`, `det_finish`, and the element addition
//! the gradient kernels' deterministic twins call ([`add_pair`]). The
//! order of the passes and why they suffice: `crate::det`, whose
//! fixed-point math they run.

use crate::det::DetTables;
use crate::det::{finish, floor_exp, key_exp, magic_int, pack_pair, pow2_f32, quant_units};
use crate::det::{join_units, slot_bound, special_bit, split_units, unpack_pair, ROUND_MAGIC};
use crate::abi::{DetParams, GradParams, DET_KEY_SUM_THREADS, DET_THREADS, FLAG_LOCAL_IDS};
use crate::ptx::{arith, cvt, global, griddep, smem, sreg, sync};
use crate::score::{ids_i64, narrow_id, resolve};
use core::ops::Range;

/// Loads a thread of `det_bounds` or `det_key_sums` issues before it
/// uses any of them (head rows of `index_q`, slots): the passes do little
/// work per load, so one load at a time would leave them waiting on its
/// latency.
const LOAD_BATCH: usize = 8;

/// The bound factor of query row `row`, `|sm_scale| * sum_h |w_h| *
/// max_d |q_hd|` over the finite elements (a finite contribution has only
/// finite terms), f32::MAX where it overflows. A head row is `D / 8`
/// lanes of 16 bytes, so one warp instruction loads `256 / D` head rows;
/// heads are dealt to the CTA's warps in those groups, round robin, and
/// each thread loads [`LOAD_BATCH`] groups before it reduces them; each
/// warp's terms are summed by a fixed butterfly, in increasing head
/// order, the warps' sums in warp order: the same value every run.
///
/// # Safety
/// Every thread of the CTA ([`DET_THREADS`]) calls it with the same `row`
/// (a valid query row); 16 bytes of dynamic shared memory; `index_q`
/// 16-byte aligned, D a multiple of 8 and at most 256 (the wgmma
/// kernels' shapes).
unsafe fn row_factor(p: &DetParams, row: u32) -> f32 {
    let g = &p.grad;
    let (tid, heads, dim) = (sreg::thread_idx_x(), g.heads, p.dim);
    let (warp, lane) = (tid / 32, tid % 32);
    let q = g.index_q as *const u16;
    let w = g.weights as *const u16;
    let lanes = dim / 8;
    let per_load = 32 / lanes;
    let (sub, col) = (lane / lanes, lane % lanes);
    let round = per_load * (DET_THREADS / 32);
    let mut part = 0.0f32;
    let mut h0 = warp * per_load;
    while h0 < heads {
        // Every load of the batch first; a head past the end reads head 0
        // of the row (a valid address) and is left out below.
        let mut eight = [[0u32; 4]; LOAD_BATCH];
        let mut wv = [0.0f32; LOAD_BATCH];
        for (j, (e, wj)) in eight.iter_mut().zip(wv.iter_mut()).enumerate() {
            let h = h0 + j as u32 * round + sub;
            let h = if h < heads { h } else { 0 };
            let at = (row as usize * heads as usize + h as usize) * dim as usize + 8 * col as usize;
            // SAFETY: row < B*S_q, h < H, 8 col + 8 <= D: inside index_q,
            // 16-byte aligned (16-byte aligned base, D % 8 == 0), and
            // inside weights; neither written during the call.
            unsafe {
                *e = global::ld_nc_v4(q.add(at) as *const u8);
                *wj = cvt::bf16_to_f32(*w.add(row as usize * heads as usize + h as usize));
            }
        }
        for (j, (e, wj)) in eight.iter().zip(wv.iter()).enumerate() {
            let h = h0 + j as u32 * round + sub;
            let mut m = 0.0f32;
            for i in 0..8 {
                let v = cvt::bf16_to_f32((e[i / 2] >> (16 * (i % 2))) as u16);
                if v.is_finite() {
                    m = m.max(v.abs());
                }
            }
            // The head row's maximum over its `lanes` lanes (an aligned
            // group of a power of two: XOR stays inside it).
            let mut o = lanes / 2;
            while o > 0 {
                // SAFETY: the whole warp (the loops are warp-uniform).
                m = m.max(unsafe { sync::shfl_xor_f32(m, o) });
                o /= 2;
            }
            if h < heads && col == 0 && wj.is_finite() {
                part += wj.abs() * m;
            }
        }
        h0 += LOAD_BATCH as u32 * round;
    }
    // SAFETY: the whole warp (the loop above reconverged).
    let part = unsafe { sync::warp_sum_f32(part) };
    let s = smem::base();
    // SAFETY: 4 warps x 4 bytes of dynamic shared memory; the barrier
    // orders the writes before the reads (uniform control flow).
    unsafe {
        if lane == 0 {
            smem::st_f32(s.add(4 * warp), part);
        }
        sync::bar_sync();
        let mut r = 0.0f32;
        for i in 0..DET_THREADS / 32 {
            r += smem::ld_f32(s.add(4 * i));
        }
        let r = g.sm_scale.abs() * r;
        if r.is_finite() {
            r
        } else {
            f32::MAX
        }
    }
}

/// One thread's walk over the slots of query rows `r0..r1` (slot `t` of
/// row `r` at flat index `r * topk + t`) in steps of the CTA's threads,
/// with the query row and column kept beside the index (no division per
/// slot).
#[derive(Clone, Copy)]
struct SlotWalk {
    at: usize,
    end: usize,
    row: u32,
    col: u32,
    topk: u32,
    step: u32,
}

impl SlotWalk {
    /// The walk of thread `tid` of `threads` over rows `r0..r1` (`r0 <
    /// r1`, `topk >= 1`).
    fn new(r0: u32, r1: u32, topk: u32, tid: u32, threads: u32) -> Self {
        SlotWalk {
            at: r0 as usize * topk as usize + tid as usize,
            end: r1 as usize * topk as usize,
            row: r0 + tid / topk,
            col: tid % topk,
            topk,
            step: threads,
        }
    }

    fn live(&self) -> bool {
        self.at < self.end
    }

    fn advance(&mut self) {
        self.at += self.step as usize;
        self.row += self.step / self.topk;
        self.col += self.step % self.topk;
        if self.col >= self.topk {
            self.col -= self.topk;
            self.row += 1;
        }
    }
}

/// [`LOAD_BATCH`] slots of a walk: each slot's resolved key row (-1 for
/// padding and past the walk's end), grad_signal and query row.
struct Slots {
    key: [i32; LOAD_BATCH],
    gs: [f32; LOAD_BATCH],
    row: [u32; LOAD_BATCH],
}

/// The next [`LOAD_BATCH`] slots of `walk`: every id and grad_signal load
/// first (a slot past the end reads the walk's last slot and resolves to
/// -1), then the ids narrowed (`I64`: the ids are i64, [`narrow_id`]) and
/// resolved.
///
/// # Safety
/// `p` validated by the host, `walk` over rows inside `B*S_q`, after
/// stage 1 (the grad_signal in `attn_score`).
#[inline(always)]
unsafe fn next_slots<const I64: bool>(p: &GradParams, walk: &mut SlotWalk) -> Slots {
    let last = walk.end - 1;
    let mut raw = [0i64; LOAD_BATCH];
    let mut gs = [0.0f32; LOAD_BATCH];
    let mut row = [u32::MAX; LOAD_BATCH];
    for j in 0..LOAD_BATCH {
        let i = if walk.live() { walk.at } else { last };
        // SAFETY: i < B*S_q*topk, the ids' (of the flag's width) and
        // grad_signal's length.
        unsafe {
            raw[j] = if I64 {
                *(p.topk_indices as *const i64).add(i)
            } else {
                *(p.topk_indices as *const i32).add(i) as i64
            };
            gs[j] = *(p.attn_score as *const f32).add(i);
        }
        if walk.live() {
            row[j] = walk.row;
        }
        walk.advance();
    }
    let local = p.flags & FLAG_LOCAL_IDS != 0;
    let key = core::array::from_fn(|j| {
        if row[j] == u32::MAX {
            return -1;
        }
        let id = if I64 {
            narrow_id(raw[j])
        } else {
            raw[j] as i32
        };
        let b = if local { row[j] / p.seq_q } else { 0 };
        resolve(id, b, p)
    });
    Slots { key, gs, row }
}

/// Each query row's factor (`row_bound`), and the largest slot
/// bound of the call (`bound_max`: a maximum per CTA, then one integer
/// maximum of the bits of non-negative f32). One CTA of [`DET_THREADS`]
/// per query row. Launched as stage 1's programmatic dependent: the row
/// factor reads only `index_q` and `weights`, which stage 1 does not
/// write, so it runs before the wait for stage 1's grad_signal.
///
/// # Safety
/// `B*S_q` CTAs, [`crate::registry::DET_SMEM`] bytes of dynamic shared
/// memory; after stage 1 (the grad_signal in `attn_score`; as its
/// programmatic dependent or after it), `bound_max` zeroed before stage
/// 1; `p.grad` validated by the host.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn det_bounds(p: DetParams) {
    // The key sums may be scheduled from now on; their wait still waits
    // for this whole grid.
    // SAFETY: a scheduling hint.
    unsafe { griddep::launch_dependents() };
    let row = sreg::block_idx_x();
    let tid = sreg::thread_idx_x();
    // SAFETY: every thread of the CTA, one row.
    let r = unsafe { row_factor(&p, row) };
    if tid == 0 {
        // SAFETY: row < B*S_q: inside row_bound, which no earlier kernel
        // of the call touches.
        unsafe { *(p.row_bound as *mut f32).add(row as usize) = r };
    }
    // SAFETY: waits for stage 1 (grad_signal) before the slots are read.
    unsafe { griddep::wait() };
    // SAFETY: the kernel's contract; the flag is launch-uniform.
    let largest = unsafe {
        if ids_i64(&p.grad) {
            largest_bound::<true>(&p.grad, row, r)
        } else {
            largest_bound::<false>(&p.grad, row, r)
        }
    };
    // SAFETY: every thread (the walk above reconverged): the warps'
    // maxima through shared memory (DET_SMEM: one word per warp, written
    // after `row_factor`'s reads behind a second barrier), then one
    // reduction into `bound_max`.
    unsafe {
        let m = sync::warp_max_u32(largest);
        let s = smem::base();
        sync::bar_sync();
        if tid % 32 == 0 {
            smem::st_u32(s.add(4 * (tid / 32)), m);
        }
        sync::bar_sync();
        if tid == 0 {
            let mut m = 0u32;
            for w in 0..DET_THREADS / 32 {
                m = m.max(smem::ld_u32(s.add(4 * w)));
            }
            global::red_max_u32(p.bound_max as *mut u32, m);
        }
    }
}

/// The f32 bits of the largest bound over this thread's valid slots of
/// query row `row` (factor `r`), 0 where it has none.
///
/// # Safety
/// As [`det_bounds`], from one of its threads.
#[inline(always)]
unsafe fn largest_bound<const I64: bool>(p: &GradParams, row: u32, r: f32) -> u32 {
    let mut walk = SlotWalk::new(row, row + 1, p.topk, sreg::thread_idx_x(), DET_THREADS);
    let mut largest = 0u32;
    while walk.live() {
        // SAFETY: the caller's contract; the walk covers row `row`.
        let s = unsafe { next_slots::<I64>(p, &mut walk) };
        for j in 0..LOAD_BATCH {
            if s.key[j] >= 0 {
                if let Some(bound) = slot_bound(s.gs[j], r) {
                    largest = largest.max(bound.to_bits());
                }
            }
        }
    }
    largest
}

/// Each key row's sum of its slots' bounds in units of
/// `2^(E - QUANT_BITS)` (`E` the exponent of the largest bound), rounded
/// up (`key_sum`). CTA `c` ([`crate::det::KeySumGrid`]) bins the slots of
/// query rows `(c / windows) * rows ..` whose keys fall in window `c %
/// windows` in shared memory, two u32 per key row ([`split_units`]:
/// shared memory's 64-bit addition is a compare-and-swap loop), then adds
/// each non-empty bin to `key_sum` once: one global reduction per key row
/// and CTA instead of one per slot (integer sums in any order, so the
/// result is the same).
///
/// # Safety
/// The grid of [`crate::det::key_sum_grid`] for this call (`p.rows`,
/// `p.window`), [`DET_KEY_SUM_THREADS`] threads, `8 * p.window` bytes of
/// dynamic shared memory; after `det_bounds` (as its programmatic
/// dependent or after it); `key_sum` zeroed before.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn det_key_sums(p: DetParams) {
    // SAFETY: a scheduling hint (the exponents wait for this whole grid).
    unsafe { griddep::launch_dependents() };
    let g = &p.grad;
    let tid = sreg::thread_idx_x();
    let keys = g.batch * g.seq_k;
    let windows = keys.div_ceil(p.window);
    let (chunk, win) = (sreg::block_idx_x() / windows, sreg::block_idx_x() % windows);
    let k0 = win * p.window;
    let width = p.window.min(keys - k0);
    let r0 = chunk * p.rows;
    let r1 = (r0 + p.rows).min(g.batch * g.seq_q);
    let (lo_bins, hi_bins) = (smem::base(), smem::base().add(4 * p.window));
    // SAFETY: 8 * window bytes of dynamic shared memory: the two bin
    // arrays; each thread zeroes its own words, the barrier orders them
    // before every thread's additions (uniform control flow).
    unsafe {
        let mut k = tid;
        while k < width {
            smem::st_u32(lo_bins.add(4 * k), 0);
            smem::st_u32(hi_bins.add(4 * k), 0);
            k += DET_KEY_SUM_THREADS;
        }
        sync::bar_sync();
    }
    // SAFETY: waits for `det_bounds` (row factors, largest bound) and,
    // through it, stage 1 (grad_signal) before the slots are read.
    unsafe { griddep::wait() };
    // SAFETY: the kernel's contract; the flag is launch-uniform.
    unsafe {
        if ids_i64(g) {
            bin_slots::<true>(&p, r0..r1, k0, width);
        } else {
            bin_slots::<false>(&p, r0..r1, k0, width);
        }
    }
    // SAFETY: the barrier (uniform control flow) orders every addition
    // before the reads; k0 + k < B*S_k: inside key_sum.
    unsafe {
        sync::bar_sync();
        let mut k = tid;
        while k < width {
            let (lo, hi) = (
                smem::ld_u32(lo_bins.add(4 * k)),
                smem::ld_u32(hi_bins.add(4 * k)),
            );
            if lo | hi != 0 {
                let sum = (p.key_sum as *mut u64).add((k0 + k) as usize);
                global::red_add_u64(sum, join_units(lo, hi));
            }
            k += DET_KEY_SUM_THREADS;
        }
    }
}

/// This thread's part of `det_key_sums`' binning: the slots of the CTA's
/// query rows `rows` whose keys fall in `k0 .. k0 + width`,
/// [`LOAD_BATCH`] at a time, each slot's quantized bound added to its key
/// row's two bins.
///
/// # Safety
/// As [`det_key_sums`], from one of its threads, with its CTA's rows and
/// window, after the bins are zeroed.
#[inline(always)]
unsafe fn bin_slots<const I64: bool>(p: &DetParams, rows: Range<u32>, k0: u32, width: u32) {
    let g = &p.grad;
    let (lo_bins, hi_bins) = (smem::base(), smem::base().add(4 * p.window));
    // SAFETY: written by `det_bounds`.
    let e = floor_exp(unsafe { *(p.bound_max as *const u32) });
    let row_bound = p.row_bound as *const f32;
    let mut walk = SlotWalk::new(
        rows.start,
        rows.end,
        g.topk,
        sreg::thread_idx_x(),
        DET_KEY_SUM_THREADS,
    );
    while walk.live() {
        // SAFETY: the caller's contract; the walk covers rows r0..r1.
        let s = unsafe { next_slots::<I64>(g, &mut walk) };
        let r: [f32; LOAD_BATCH] = core::array::from_fn(|j| {
            if s.key[j] >= 0 {
                // SAFETY: a valid slot's row < B*S_q: written by
                // `det_bounds`.
                unsafe { *row_bound.add(s.row[j] as usize) }
            } else {
                0.0
            }
        });
        for j in 0..LOAD_BATCH {
            let local = s.key[j].wrapping_sub(k0 as i32) as u32;
            if s.key[j] >= 0 && local < width {
                if let Some(bound) = slot_bound(s.gs[j], r[j]) {
                    let (lo, hi) = split_units(cvt::f64_to_u64_rpi(quant_units(bound, e)));
                    // SAFETY: local < width: inside both bin arrays.
                    unsafe {
                        smem::red_add_u32(lo_bins.add(4 * local), lo);
                        smem::red_add_u32(hi_bins.add(4 * local), hi);
                    }
                }
            }
        }
    }
}

/// Each key row's fixed-point exponent (`key_exp`) from its bound sum and
/// the call's largest bound. Grid-stride over the `B*S_k` key rows.
///
/// # Safety
/// After `det_key_sums` (as its programmatic dependent or after it); any
/// grid of [`DET_THREADS`].
#[no_mangle]
pub unsafe extern "ptx-kernel" fn det_scales(p: DetParams) {
    // The twins may be scheduled from now on: their prologue reads only
    // inputs, and their wait (before any exponent is read) still waits for
    // this whole grid.
    // SAFETY: a scheduling hint.
    unsafe { griddep::launch_dependents() };
    // SAFETY: waits for the key sums.
    unsafe { griddep::wait() };
    let n = p.grad.batch as usize * p.grad.seq_k as usize;
    let stride = (sreg::grid_dim_x() * DET_THREADS) as usize;
    let mut k = (sreg::block_idx_x() * DET_THREADS + sreg::thread_idx_x()) as usize;
    while k < n {
        // SAFETY: k < B*S_k: inside the key tables.
        unsafe {
            let s = key_exp(
                *(p.key_sum as *const u64).add(k),
                *(p.bound_max as *const u32),
            );
            *(p.key_exp as *mut i32).add(k) = s;
        }
        k += stride;
    }
}

/// `d_index_k` from the fixed-point accumulator (two elements per u64
/// word, [`unpack_pair`]), the exponents and the flags
/// (`crate::det::finish`), four elements per thread and step, f32 or
/// bf16 ([`DetParams::out_bf16`]). Grid-stride over `B*S_k*D / 4`.
///
/// # Safety
/// After the gradient kernel's deterministic twin (as its programmatic
/// dependent or after it); any grid of [`DET_THREADS`]; `d_index_k`
/// 8-byte aligned (16 for f32), D a multiple of 4.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn det_finish(p: DetParams) {
    // SAFETY: waits for the twin's accumulator, flags and exponents.
    unsafe { griddep::wait() };
    let dim = p.dim as usize;
    let quads = p.grad.batch as usize * p.grad.seq_k as usize * dim / 4;
    let stride = (sreg::grid_dim_x() * DET_THREADS) as usize;
    let mut i = (sreg::block_idx_x() * DET_THREADS + sreg::thread_idx_x()) as usize;
    while i < quads {
        let e = 4 * i;
        // SAFETY: elements e..e+4 lie in one key row (D % 4 == 0) inside
        // the accumulator (16-byte aligned) and its flags; the exponent
        // table holds its row. Nothing else writes them in this kernel.
        unsafe {
            let w = global::ld_nc_v4((p.grad.dk_accum as *const u8).add(4 * e));
            let (a0, a1) = unpack_pair(w[0] as u64 | (w[1] as u64) << 32);
            let (a2, a3) = unpack_pair(w[2] as u64 | (w[3] as u64) << 32);
            let acc = [a0, a1, a2, a3];
            let flags = *(p.specials as *const u32).add(i);
            let s = *(p.key_exp as *const i32).add(e / dim);
            let v: [f32; 4] = core::array::from_fn(|j| finish(acc[j], s, (flags >> (8 * j)) as u8));
            if p.out_bf16 != 0 {
                let out = (p.d_index_k as *mut u32).add(e / 2);
                *out = cvt::pack_bf16x2(v[0], v[1]);
                *out.add(1) = cvt::pack_bf16x2(v[2], v[3]);
            } else {
                global::st_v4((p.d_index_k as *mut u8).add(4 * e), v.map(|x| x.to_bits()));
            }
        }
        i += stride;
    }
}

/// The scale `2^s_k` of key row `row`.
///
/// # Safety
/// `row < B*S_k`, `t` the call's tables, after `det_scales`.
#[inline(always)]
pub unsafe fn row_scale(t: DetTables, row: usize) -> f32 {
    // SAFETY: the caller's contract.
    pow2_f32(unsafe { *t.key_exp.add(row) })
}

/// Adds dK contributions `v` to elements `2 word` and `2 word + 1` (one
/// key row, of scale `scale`: [`row_scale`]) of the fixed-point
/// accumulator `acc`, as one `red.global.add.u64` of their
/// [`pack_pair`]: each `round(v * scale)`, through [`ROUND_MAGIC`] (one
/// `fma`) where that holds it, else `cvt.rni`; 0 and its flag where `v`
/// is not finite. Both roundings are ties-to-even of the exact product
/// (`scale` a power of two), so the path taken changes no bit.
///
/// # Safety
/// `word` inside the accumulator (`B*S_k*D / 2` words, 8-byte aligned),
/// `t` the call's tables.
#[inline(always)]
pub unsafe fn add_pair(t: DetTables, acc: *mut u64, word: usize, v: [f32; 2], scale: f32) {
    let y = v.map(|x| arith::fma_rn(x, scale, ROUND_MAGIC));
    let (lo, hi) = match (magic_int(y[0]), magic_int(y[1])) {
        (Some(lo), Some(hi)) => (lo, hi),
        // SAFETY: elements 2 word + j lie inside the flags (the caller's
        // contract).
        _ => unsafe {
            (
                slow_int(t, 2 * word, v[0], scale),
                slow_int(t, 2 * word + 1, v[1], scale),
            )
        },
    };
    // SAFETY: the caller's contract; an atomic reduction.
    unsafe { global::red_add_u64(acc.add(word), pack_pair(lo, hi)) };
}

/// `round(v * scale)` by `cvt.rni`, or 0 with element `at`'s flag set
/// where `v` is not finite.
///
/// # Safety
/// `at` inside the flags (`t`'s).
#[inline(always)]
unsafe fn slow_int(t: DetTables, at: usize, v: f32, scale: f32) -> i32 {
    if v.is_finite() {
        cvt::f32_to_s32_rni(v * scale)
    } else {
        let bit = (special_bit(v) as u32) << (8 * (at % 4));
        // SAFETY: the caller's contract; an atomic reduction.
        unsafe { global::red_or_b32(t.specials.add(at / 4), bit) };
        0
    }
}
