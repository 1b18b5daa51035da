//! The deterministic mode's passes (device only): `det_bounds`,
//! `det_scales`, `det_finish`, and the element addition the gradient
//! kernels' deterministic twins call ([`add`]). The order of the passes
//! and why they suffice: the parent module's note.

use super::DetTables;
use super::{finish, floor_exp, key_exp, pow2_f32, quant_units, slot_bound, special_bit};
use crate::abi::{DetParams, DET_THREADS};
use crate::ptx::{cvt, global, smem, sreg, sync};
use crate::score::{load_id, resolve};

/// The bound factor of query row `row`, `|sm_scale| * sum_h |w_h| *
/// max_d |q_hd|` over the finite elements (a finite contribution has only
/// finite terms), f32::MAX where it overflows. Heads are dealt to the
/// CTA's warps round robin, each warp's sum in head order, the warps'
/// sums added in warp order: the same value every run.
///
/// # Safety
/// Every thread of the CTA ([`DET_THREADS`]) calls it with the same `row`
/// (a valid query row); 16 bytes of dynamic shared memory.
unsafe fn row_factor(p: &DetParams, row: u32) -> f32 {
    let g = &p.grad;
    let (tid, heads, dim) = (sreg::thread_idx_x(), g.heads, p.dim);
    let (warp, lane) = (tid / 32, tid % 32);
    let q = g.index_q as *const u16;
    let w = g.weights as *const u16;
    let mut part = 0.0f32;
    let mut h = warp;
    while h < heads {
        let base = (row as usize * heads as usize + h as usize) * dim as usize;
        let mut m = 0u32;
        let mut d = lane;
        while d < dim {
            // SAFETY: row < B*S_q, h < H, d < D: inside index_q.
            let x = cvt::bf16_to_f32(unsafe { *q.add(base + d as usize) });
            if x.is_finite() {
                m = m.max(x.abs().to_bits());
            }
            d += 32;
        }
        // SAFETY: the whole warp (the loop over heads is warp-uniform).
        let m = f32::from_bits(unsafe { sync::warp_max_u32(m) });
        // SAFETY: inside weights.
        let wv = cvt::bf16_to_f32(unsafe { *w.add(row as usize * heads as usize + h as usize) });
        if wv.is_finite() {
            part += wv.abs() * m;
        }
        h += DET_THREADS / 32;
    }
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

/// Phase 0 ([`DetParams::phase`]): each query row's factor
/// (`row_bound`), and the largest slot bound of the call (`bound_max`:
/// a maximum per CTA, then one integer maximum of the bits of
/// non-negative f32). Phase 1: each key row's sum of its slots' bounds in
/// units of `2^(E - QUANT_BITS)` (`E` the exponent of the largest bound),
/// rounded up (`key_sum`). One CTA of [`DET_THREADS`] per query row.
///
/// # Safety
/// `B*S_q` CTAs, [`crate::registry::DET_SMEM`] bytes of dynamic shared
/// memory; after stage 1 (the grad_signal in `attn_score`), phase 1 after
/// phase 0, `key_sum` and `bound_max` zeroed before phase 0; `p.grad`
/// validated by the host.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn det_bounds(p: DetParams) {
    let g = &p.grad;
    let row = sreg::block_idx_x();
    let tid = sreg::thread_idx_x();
    let r = if p.phase == 0 {
        // SAFETY: every thread of the CTA, one row.
        let r = unsafe { row_factor(&p, row) };
        if tid == 0 {
            // SAFETY: row < B*S_q: inside row_bound.
            unsafe { *(p.row_bound as *mut f32).add(row as usize) = r };
        }
        r
    } else {
        // SAFETY: written by phase 0.
        unsafe { *(p.row_bound as *const f32).add(row as usize) }
    };
    // Phase 1: the units of the quantized bounds.
    let e = if p.phase == 0 {
        0
    } else {
        // SAFETY: written by phase 0.
        floor_exp(unsafe { *(p.bound_max as *const u32) })
    };
    let b = row / g.seq_q;
    let mut largest = 0u32;
    let mut t = tid;
    while t < g.topk {
        let i = row as usize * g.topk as usize + t as usize;
        // SAFETY: i < B*S_q*topk, the ids' and grad_signal's length.
        let (key, gs) = unsafe {
            (
                resolve(load_id(g, i), b, g),
                *(g.attn_score as *const f32).add(i),
            )
        };
        if key >= 0 {
            if let Some(bound) = slot_bound(gs, r) {
                if p.phase == 0 {
                    largest = largest.max(bound.to_bits());
                } else {
                    let units = cvt::f64_to_u64_rpi(quant_units(bound, e));
                    // SAFETY: key < B*S_k: inside key_sum.
                    unsafe {
                        global::red_add_u64((p.key_sum as *mut u64).add(key as usize), units)
                    };
                }
            }
        }
        t += DET_THREADS;
    }
    if p.phase == 0 {
        // SAFETY: every thread (the loop above reconverged): the warps'
        // maxima through shared memory (DET_SMEM: one word per warp,
        // written after `row_factor`'s reads behind a second barrier),
        // then one reduction into `bound_max`.
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
}

/// Each key row's fixed-point exponent (`key_exp`) from its bound sum and
/// the call's largest bound. Grid-stride over the `B*S_k` key rows.
///
/// # Safety
/// After both phases of `det_bounds`; any grid of [`DET_THREADS`].
#[no_mangle]
pub unsafe extern "ptx-kernel" fn det_scales(p: DetParams) {
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

/// `d_index_k` from the fixed-point accumulator, the exponents and the
/// flags (`super::finish`), four elements per thread and step, f32 or
/// bf16 ([`DetParams::out_bf16`]). Grid-stride over `B*S_k*D / 4`.
///
/// # Safety
/// After the gradient kernel's deterministic twin; any grid of
/// [`DET_THREADS`]; `d_index_k` 8-byte aligned (16 for f32), D a multiple
/// of 4.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn det_finish(p: DetParams) {
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
            let acc = global::ld_nc_v4((p.grad.dk_accum as *const u8).add(4 * e));
            let flags = *(p.specials as *const u32).add(i);
            let s = *(p.key_exp as *const i32).add(e / dim);
            let v: [f32; 4] =
                core::array::from_fn(|j| finish(acc[j] as i32, s, (flags >> (8 * j)) as u8));
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

/// Adds dK contribution `v` to element `at` of the fixed-point
/// accumulator `acc` (whose key row has scale `scale`, [`row_scale`]):
/// `round(v * scale)`, or its flag where `v` is not finite.
///
/// # Safety
/// `at` inside the accumulator and its flags (`t`'s).
#[inline(always)]
pub unsafe fn add(t: DetTables, acc: *mut i32, at: usize, v: f32, scale: f32) {
    // SAFETY: the caller's contract; both are atomic reductions.
    unsafe {
        if v.is_finite() {
            global::red_add_s32(acc.add(at), cvt::f32_to_s32_rni(v * scale));
        } else {
            let bit = (special_bit(v) as u32) << (8 * (at % 4));
            global::red_or_b32(t.specials.add(at / 4), bit);
        }
    }
}
