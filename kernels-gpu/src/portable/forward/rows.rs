//! The portable forward kernel's body (every target): one CTA of
//! `THREADS` threads per query row, one chunk at a time, no tensor cores.
//! The GPUs without a wgmma module run it (and tests run it on Hopper).
//!
//! Per chunk: the K rows are loaded into shared memory (rows of `D / 2 + 1`
//! words, so the 32 lanes of a warp, which read 32 different rows at the
//! same column, hit 32 banks), then thread `t` takes slot `t % 64` and
//! half `t / 64` of the heads: its slot's K row in registers, each head's
//! `q . k` against the q tile (one word read by the whole warp at a time),
//! the half's head sum; the second half's sums pass through shared memory
//! to the first, which adds them (first half + second half) and stores the
//! logit (or [`PAD_MARK`] at padding). The row's end is the wgmma
//! kernel's ([`super::softmax`]).

use super::load::{load_weights, Row};
use super::softmax::{rewrite, row_lse};
use super::{exp_fast, head_term, pieces, rows_smem, Lse, CHUNK, PAD_MARK, THREADS};
use crate::abi::FwdParams;
use crate::ptx::smem::{self as sh, SmemAddr};
use crate::ptx::{cvt, global, sreg, sync};

use super::rows_stride_words as stride_words;
// Each thread takes one slot of one head half.
const _: () = assert!(THREADS == 2 * CHUNK);

/// The two bf16 of a word as f32.
#[inline(always)]
fn pair(w: u32) -> (f32, f32) {
    (
        cvt::bf16_to_f32(w as u16),
        cvt::bf16_to_f32((w >> 16) as u16),
    )
}

/// The kernel body for `H` heads and head dimension `D`.
///
/// # Safety
/// Launched with `super::THREADS` threads, one CTA per row (grid =
/// `p.rows`), `super::rows_smem(H, D).bytes` of dynamic shared memory, and
/// a `FwdParams` whose pointers and sizes the host validated.
#[inline(always)]
pub(super) unsafe fn forward_rows<const H: u32, const D: u32>(p: &FwdParams) {
    // SAFETY: the launch contract.
    let r = unsafe { Row::new(p, sreg::block_idx_x(), D, rows_smem(H, D)) };
    let q = r.base.add(r.l.q);
    let kb = r.base.add(r.l.k);
    // The q tile (H x D bf16, unpadded: a warp reads one word at a time)
    // and the weights as f32.
    let mut v = r.tid;
    while v < H * pieces(D) {
        // SAFETY: inside the row's q; 16-byte aligned.
        let w = unsafe {
            global::ld_nc_v4(
                (p.index_q as *const u8)
                    .add(r.row as usize * (H * D * 2) as usize + 16 * v as usize),
            )
        };
        // SAFETY: inside the q region.
        unsafe { sh::st_v4_u32(q.add(16 * v), w) };
        v += THREADS;
    }
    // SAFETY: read after the first chunk's barrier.
    unsafe { load_weights(&r, H) };
    let (slot, half) = (r.tid % CHUNK, r.tid / CHUNK);
    let part = r.base.add(r.l.part);
    let flags = r.keys(0);
    let mut lse = Lse::EMPTY;
    let mut c = 0;
    while c < r.chunks() {
        // SAFETY: the previous chunk's readers passed the barrier at the
        // end of its iteration.
        unsafe { load_chunk::<D>(&r, c, kb, flags) };
        // SAFETY: uniform control flow, every thread.
        unsafe { sync::bar_sync() };
        // SAFETY: written before the barrier.
        let valid = unsafe { sh::ld_u32(flags.add(4 * slot)) } != 0;
        // SAFETY: the chunk and the q tile are behind the barrier.
        let sum = unsafe { half_sum::<H, D>(&r, q, kb, slot, half) };
        if half == 1 {
            // SAFETY: this slot's word; read after the next barrier.
            unsafe { sh::st_f32(part.add(4 * slot), sum) };
        }
        // SAFETY: uniform control flow, every thread.
        unsafe { sync::bar_sync() };
        if half == 0 && c * CHUNK + slot < p.cols {
            // SAFETY: written before the barrier.
            let l = sum + unsafe { sh::ld_f32(part.add(4 * slot)) };
            let bits = if valid {
                lse.push(l, exp_fast);
                l.to_bits()
            } else {
                PAD_MARK
            };
            // SAFETY: a slot of the row.
            unsafe { *(p.score as *mut u32).add(r.flat(c * CHUNK + slot)) = bits };
        }
        // SAFETY: uniform control flow, every thread: the next chunk's
        // loads rewrite K rows, flags and sums read above.
        unsafe { sync::bar_sync() };
        c += 1;
    }
    // SAFETY: every thread, uniform control flow.
    unsafe {
        let v = row_lse(&r, lse);
        rewrite(&r, v);
    }
}

/// Loads chunk `c`'s K rows (padding rows zero) into `kb` as rows of
/// [`stride_words`] words, and each slot's validity (1 or 0) into `flags`
/// (key set 0).
///
/// # Safety
/// The launch contract; nobody reads the regions until the next barrier.
#[inline(always)]
unsafe fn load_chunk<const D: u32>(r: &Row<'_>, c: u32, kb: SmemAddr, flags: SmemAddr) {
    let per_row = pieces(D);
    let mut v = r.tid;
    while v < CHUNK * per_row {
        let (row, piece) = (v / per_row, v % per_row);
        let slot = c * CHUNK + row;
        let id = if r.dense() || slot >= r.p.cols {
            0
        } else {
            // SAFETY: slot < cols.
            unsafe { r.global_id(slot) }
        };
        let key = r.key_of(slot, id);
        let w = if key >= 0 {
            // SAFETY: a valid key row; 16-byte aligned.
            unsafe {
                global::ld_nc_v4(
                    (r.p.index_k as *const u8)
                        .add(key as usize * (D * 2) as usize + 16 * piece as usize),
                )
            }
        } else {
            [0; 4]
        };
        let at = kb.add(4 * (row * stride_words(D) + 4 * piece));
        let mut j = 0;
        while j < 4 {
            // SAFETY: inside the chunk's padded rows.
            unsafe { sh::st_u32(at.add(4 * j), w[j as usize]) };
            j += 1;
        }
        if piece == 0 {
            // SAFETY: this slot's flag.
            unsafe { sh::st_u32(flags.add(4 * row), (key >= 0) as u32) };
        }
        v += THREADS;
    }
}

/// Head half `half`'s share of slot `slot`'s logit: `sum_h w[h] * relu(sm_scale * q[h] . k)`
/// over heads `half * H / 2 ..`, in head order, each dot product in column
/// order.
///
/// # Safety
/// The chunk, the q tile and the weights are in shared memory behind a
/// barrier.
#[inline(always)]
unsafe fn half_sum<const H: u32, const D: u32>(
    r: &Row<'_>,
    q: SmemAddr,
    kb: SmemAddr,
    slot: u32,
    half: u32,
) -> f32 {
    let mut k = [0u32; 64];
    let row = kb.add(4 * slot * stride_words(D));
    let mut j = 0;
    while j < D / 2 {
        // SAFETY: inside the slot's row.
        k[j as usize] = unsafe { sh::ld_u32(row.add(4 * j)) };
        j += 1;
    }
    let mut sum = 0.0f32;
    let mut h = half * H / 2;
    while h < (half + 1) * H / 2 {
        let qh = q.add(h * D * 2);
        let mut dot = 0.0f32;
        let mut j = 0;
        while j < D / 2 {
            // SAFETY: inside the q tile.
            let (q0, q1) = pair(unsafe { sh::ld_u32(qh.add(4 * j)) });
            let (k0, k1) = pair(k[j as usize]);
            dot = dot + q0 * k0;
            dot = dot + q1 * k1;
            j += 1;
        }
        // SAFETY: inside the weights region.
        let w = unsafe { sh::ld_f32(r.base.add(r.l.w + 4 * h)) };
        sum += head_term(dot, r.p.sm_scale, w);
        h += 1;
    }
    sum
}
