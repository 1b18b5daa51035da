//! The forward kernels: the indexer's score at each row's selected slots
//! (sparse: `logit[t] = sum_h w[h] * relu(sm_scale * q[h,:] . k[n_t,:])`
//! over the valid slots, then the row's softmax and its log-sum-exp) and
//! dense mode's raw logits over each row's visible keys with their
//! log-sum-exp. The math is `docs/spec.md`, "Forward".
//!
//! Two kernels compute it, CTAs of [`THREADS`] threads, each walking a
//! query row's slots in chunks of [`CHUNK`] (the portable kernel one row
//! per CTA; the persistent wgmma kernel rows in turn, [`persistent`]):
//! - the wgmma kernel (sm_90a, `crate::sm90::forward`): K rows gathered by `cp.async` into
//!   128-byte-swizzled shared memory one chunk ahead of use ([`DIST`]),
//!   [`CTAS_PER_SM`] rows per SM, one
//!   `wgmma` product `S^T = K q^T` per chunk (M = 64 slots, N = H heads,
//!   K = D) with the row's q tile as the B operand, the head sum in
//!   registers;
//! - the portable kernel (every target, `rows`): the same walk with plain
//!   loads and FMAs, for GPUs without a wgmma module (and tests).
//!
//! Both store every slot's logit as soon as its chunk is done (padding
//! slots the marker [`PAD_MARK`]), keep a running maximum and scaled sum
//! per thread ([`Lse`]), merge those in a fixed order at the row's end,
//! and then rewrite the row's slots as probabilities or log-probabilities
//! (sparse) or zero the columns past the visible ones (dense), reading
//! back only the stored values. Every sum runs in a fixed order, so the
//! outputs are bitwise reproducible.
//!
//! This module is plain Rust shared by both kernels and the host (sizes,
//! layouts, the launch envelope, the arithmetic the host tests check);
//! its device-only children are the portable kernel and the parts both
//! kernels run (`load`, `softmax`).

use crate::abi::{FwdParams, FLAG_FWD_DENSE, FLAG_IDS_I64, FLAG_LOCAL_IDS};

// The portable kernel (device only): its entries and body; the loads and
// the row's softmax, which the wgmma kernels (`crate::sm90::forward`) use
// too.
#[cfg(all(target_arch = "nvptx64", not(kernels_lab)))]
mod entry;
#[cfg(target_arch = "nvptx64")]
pub(crate) mod load;
#[cfg(target_arch = "nvptx64")]
mod rows;
#[cfg(target_arch = "nvptx64")]
pub(crate) mod softmax;

/// Slots per chunk: the M of the wgmma product.
pub const CHUNK: u32 = 64;
/// Threads per CTA: one warpgroup.
pub const THREADS: u32 = 128;
/// Warps per CTA.
pub const WARPS: u32 = THREADS / 32;
/// Chunks of K rows the wgmma kernel has in flight while it multiplies
/// one. One: every chunk in flight takes a K buffer, whose shared memory
/// costs resident CTAs, and resident rows hide the gathers' latency better
/// than a deeper walk of fewer rows (two buffers let four CTAs of H = 64,
/// D = 128 reside; [`CTAS_PER_SM`] is the launch bounds' floor).
pub const DIST: u32 = 1;
/// Resident CTAs per SM the wgmma kernels are built for (launch bounds:
/// at least this many), every shape.
pub const CTAS_PER_SM: u32 = crate::registry::FWD_WG_CTAS;
/// Sparse rows of at most this many slots, of shapes with at least
/// [`PERSISTENT_MIN_QROW`] elements of q per row, run the wgmma kernel on a
/// persistent grid ([`persistent`]): there a row spends much of its time
/// in the latency of its prologue loads (the q tile above all), which a
/// persistent CTA issues before the previous row's end. Longer rows, and
/// dense rows (of unequal lengths), run one CTA per row, handed out by the
/// hardware as CTAs finish; so do small q tiles, whose loads are short.
pub const PERSISTENT_MAX_COLS: u32 = 4 * CHUNK;
/// See [`PERSISTENT_MAX_COLS`]: `H * D` of the smallest q tile that takes
/// the persistent grid.
pub const PERSISTENT_MIN_QROW: u32 = 4096;

/// Whether a sparse plan of `heads` x `dim` and `cols` slots per row takes
/// the persistent wgmma kernel (`registry::FwdKind::Persistent`).
pub const fn persistent(heads: u32, dim: u32, cols: u32) -> bool {
    cols <= PERSISTENT_MAX_COLS && heads * dim >= PERSISTENT_MIN_QROW
}

/// K buffers of the wgmma kernel: the chunk being multiplied and the
/// [`DIST`] in flight (a chunk's gather starts after the barrier that
/// follows the last product on its buffer).
pub const STAGES: u32 = DIST + 1;
/// Chunks ahead of its gather that a chunk's key ids are copied: the
/// copy's group completes [`DIST`] chunks later, in time for the chunk's
/// resolution one iteration before its gather.
pub const IDS_AHEAD: u32 = DIST + 1;
/// Id sets: a chunk's ids live from their copy to their resolution, one
/// iteration before the gather, and a set is copied into again only after
/// a barrier past that read.
pub const ID_SETS: u32 = IDS_AHEAD + 1;
/// Resolved key sets: chunk `c`'s key rows are written one iteration
/// before its gather and read by its gather and by its logits' stores
/// [`DIST`] iterations after the gather, then rewritten only after a
/// barrier past that read.
pub const KEY_SETS: u32 = DIST + 3;
/// Bytes per slot of an id set: room for an i64 id.
pub const ID_BYTES: u32 = 8;
/// Bytes per swizzled row (64 bf16), and of one column block of a tile.
pub const ROW_BYTES: u32 = 128;
/// bf16 elements per swizzled row.
pub const ROW_ELEMS: u32 = ROW_BYTES / 2;
/// Reserved to align the start of dynamic shared memory to 1024 bytes.
pub const ALIGN_SLACK: u32 = 1024;
/// Shared memory of one H100/H200 SM, and what the driver keeps per CTA.
const SMEM_PER_SM: u32 = 228 * 1024;
const SMEM_RESERVED_PER_CTA: u32 = 1024;
/// Resident CTAs per SM the portable kernels are built for (launch
/// bounds).
pub const ROWS_CTAS_PER_SM: u32 = 2;

/// Heads and head dimensions the kernels are built for.
pub const HEADS: [u32; 4] = [16, 32, 64, 128];
/// See [`HEADS`].
pub const DIMS: [u32; 2] = [64, 128];

/// 16-byte pieces of one K row of `d` bf16.
pub const fn pieces(d: u32) -> u32 {
    d * 2 / 16
}
/// Rows one pass of the CTA's gather covers (each thread one piece).
pub const fn rows_per_pass(d: u32) -> u32 {
    THREADS / pieces(d)
}
/// Passes of the gather over a chunk: the K rows (and ids) each thread
/// handles per chunk.
pub const fn passes(d: u32) -> u32 {
    CHUNK / rows_per_pass(d)
}

/// Byte offsets of one kernel's shared-memory regions (from the 1024-byte
/// aligned base) for `h` heads and head dimension `d`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FwdSmem {
    /// The row's q tile: `d / 64` column blocks of `h` swizzled rows
    /// (`h * 128` bytes each), the wgmma B operand (K-major).
    pub q: u32,
    /// Bytes between the q tile's column blocks.
    pub q_block: u32,
    /// [`STAGES`] K chunk buffers of `d / 64` blocks of [`CHUNK`] swizzled
    /// rows, [`k_bytes`] apart (the portable kernel: one unswizzled chunk).
    pub k: u32,
    /// The row's weights as f32, `h` values.
    pub w: u32,
    /// Resolved key rows, [`KEY_SETS`] sets of [`CHUNK`] i32 (-1
    /// padding); the portable kernel keeps its chunk's validity flags in
    /// set 0.
    pub keys: u32,
    /// The warps' softmax partials ([`Lse`], two f32 each), then the row's
    /// log-sum-exp.
    pub lse: u32,
    /// The portable kernel's second-half head sums, [`CHUNK`] f32.
    pub part: u32,
    /// Key ids, [`ID_SETS`] sets of [`CHUNK`] slots of [`ID_BYTES`] (an
    /// i64 id, or an i32 one in the first four bytes).
    pub ids: u32,
    /// Bytes used after the aligned base.
    pub used: u32,
    /// Dynamic shared memory to request (used + alignment slack).
    pub bytes: u32,
}

/// Bytes of one K chunk buffer for head dimension `d`.
pub const fn k_bytes(d: u32) -> u32 {
    CHUNK * d * 2
}
/// Bytes of one column block (64 of D) of a K chunk buffer.
pub const K_BLOCK: u32 = CHUNK * ROW_BYTES;

/// Whether `ctas` CTAs of layout `l` fit on one SM.
const fn fits(l: FwdSmem, ctas: u32) -> bool {
    ctas * (l.bytes + SMEM_RESERVED_PER_CTA) <= SMEM_PER_SM
}

/// The wgmma kernel's layout for `h` heads and head dimension `d`:
/// [`STAGES`] K buffers.
pub const fn smem(h: u32, d: u32) -> FwdSmem {
    layout(h, d, STAGES * k_bytes(d))
}

/// Words per K row in the portable kernel's shared memory: `d / 2` words
/// and one of padding, so 32 lanes reading 32 rows at the same column hit
/// 32 banks.
pub const fn rows_stride_words(d: u32) -> u32 {
    d / 2 + 1
}

/// The portable kernel's layout: one padded, unswizzled K chunk.
pub const fn rows_smem(h: u32, d: u32) -> FwdSmem {
    layout(h, d, align(CHUNK * rows_stride_words(d) * 4, 1024))
}

/// Regions in order, the K region `k_total` bytes.
const fn layout(h: u32, d: u32, k_total: u32) -> FwdSmem {
    let q = 0;
    let q_block = h * ROW_BYTES;
    let k = align(q + q_block * (d / ROW_ELEMS), 1024);
    let w = k + k_total;
    let keys = w + h * 4;
    let lse = keys + KEY_SETS * CHUNK * 4;
    let part = lse + (WARPS * 2 + 4) * 4;
    let ids = part + CHUNK * 4;
    let used = ids + ID_SETS * CHUNK * ID_BYTES;
    FwdSmem {
        q,
        q_block,
        k,
        w,
        keys,
        lse,
        part,
        ids,
        used,
        bytes: used + ALIGN_SLACK,
    }
}

const fn align(x: u32, a: u32) -> u32 {
    x.div_ceil(a) * a
}

// The walk's set rings (`wg`): ids copied before they are resolved, each
// chunk's live bit kept in a ring of 8 from its resolution to its product.
const _: () = assert!(IDS_AHEAD < ID_SETS && DIST + 2 <= 8);

/// The layout of every shape fits [`CTAS_PER_SM`] on one SM (the
/// portable kernel's [`ROWS_CTAS_PER_SM`]), and the tiles start on
/// 1024-byte swizzle-pattern boundaries.
const _: () = {
    let mut i = 0;
    while i < HEADS.len() {
        let mut j = 0;
        while j < DIMS.len() {
            let (h, d) = (HEADS[i], DIMS[j]);
            let l = smem(h, d);
            assert!(fits(l, CTAS_PER_SM));
            assert!(
                l.q.is_multiple_of(1024)
                    && l.k.is_multiple_of(1024)
                    && k_bytes(d).is_multiple_of(1024)
            );
            // Swizzle atoms of 8 rows: every q block is whole atoms, and
            // a block of 16 heads (the smallest) 2048 bytes.
            assert!(l.q_block.is_multiple_of(1024));
            assert!(l.w.is_multiple_of(16) && l.lse.is_multiple_of(8) && l.ids.is_multiple_of(8));
            assert!(l.keys.is_multiple_of(16) && l.lse >= l.keys + KEY_SETS * CHUNK * 4);
            // Every thread gathers whole passes.
            assert!(THREADS.is_multiple_of(pieces(d)) && CHUNK.is_multiple_of(rows_per_pass(d)));
            // The portable kernel keeps a q tile of h rows of d bf16 in the
            // q region, and fits 12.x GPUs (99 KiB per block).
            let rl = rows_smem(h, d);
            assert!(h * d * 2 <= rl.k - rl.q && rl.bytes <= 99 * 1024);
            assert!(fits(rl, ROWS_CTAS_PER_SM));
            j += 1;
        }
        i += 1;
    }
    // One warpgroup: the wgmma product's M = 64 rows are its four warps'.
    assert!(THREADS == 128 && CHUNK == 64 && WARPS == 4);
    // The registry launches every forward kernel with these threads and
    // their residency.
    assert!(crate::registry::FWD_THREADS == THREADS);
    let mut k = 0;
    while k < crate::registry::FWD_WG.len() {
        let (a, b) = (crate::registry::FWD_WG[k], crate::registry::FWD_ROWS[k]);
        let c = crate::registry::FWD_WG_PERSIST[k];
        assert!(a.threads == THREADS && b.threads == THREADS && c.threads == THREADS);
        assert!(matches!(
            a.bounds,
            crate::registry::Bounds::Exact {
                min_ctas: CTAS_PER_SM
            }
        ));
        assert!(matches!(
            c.bounds,
            crate::registry::Bounds::Exact {
                min_ctas: CTAS_PER_SM
            }
        ));
        assert!(matches!(
            b.bounds,
            crate::registry::Bounds::Exact {
                min_ctas: ROWS_CTAS_PER_SM
            }
        ));
        k += 1;
    }
};

/// Whether the forward kernels take a problem of `rows` query rows and
/// `cols` slots (or dense columns) per row: one CTA per row (grid.x), and
/// flat slot indices `row * cols + t` in 64 bits on the device.
pub const fn supports(rows: u64, cols: u64) -> bool {
    rows >= 1 && rows <= i32::MAX as u64 && cols >= 1 && cols <= u32::MAX as u64
}

/// Chunks the kernels walk for a row with `n` slots (sparse: topk; dense:
/// the visible columns, 0 for none).
pub const fn chunks(n: u32) -> u32 {
    n.div_ceil(CHUNK)
}

/// The first key row of query row `row`'s batch (`(row / S_q) S_k`):
/// where its local ids start.
#[inline(always)]
pub fn batch_keys(p: &FwdParams, row: u32) -> u32 {
    (row / p.seq_q) * p.seq_k
}

/// The key row slot `slot` of a query row reads, or -1 for padding:
/// sparse, the id `id` (already narrowed, [`crate::score::narrow_id`])
/// resolved by the plan's convention (local ids from the row's
/// [`batch_keys`], `first_key`); dense, `key_start + slot` for
/// `slot < visible`.
#[inline(always)]
pub fn key_row(
    p: &FwdParams,
    first_key: u32,
    slot: u32,
    id: i32,
    visible: u32,
    key_start: u32,
) -> i32 {
    if slot >= p.cols {
        return -1;
    }
    if p.flags & FLAG_FWD_DENSE != 0 {
        return if slot < visible {
            (key_start + slot) as i32
        } else {
            -1
        };
    }
    if id < 0 {
        return -1;
    }
    if p.flags & FLAG_LOCAL_IDS != 0 {
        if (id as u32) < p.seq_k {
            (first_key + id as u32) as i32
        } else {
            -1
        }
    } else if (id as u64) < p.batch as u64 * p.seq_k as u64 {
        id
    } else {
        -1
    }
}

/// Whether `p.topk_indices` holds i64 ids.
#[inline(always)]
pub const fn ids_i64(p: &FwdParams) -> bool {
    p.flags & FLAG_IDS_I64 != 0
}

/// One head's term of a slot's logit: `w * relu(sm_scale * acc)`, the
/// gate `sm_scale * acc > 0` false for NaN (as the backward's gate).
#[inline(always)]
pub fn head_term(acc: f32, sm_scale: f32, w: f32) -> f32 {
    let s = acc * sm_scale;
    if s > 0.0 {
        w * s
    } else {
        0.0
    }
}

/// A slot's logit from one thread's share of the wgmma accumulator of an
/// `m64nHk16` product (`acc[4 j + i]` holds `S[16 w + g + 8 (i / 2)][8 j +
/// c + i % 2]`, `c = 2 (lane % 4)`): the thread's partial sums of rows
/// `16 w + g` and `+ 8` over its `H / 4` heads, in head order. The four
/// lanes of a quad then add their partials (`xor 1`, then `xor 2`).
/// `w(col)` is the head's weight.
#[inline(always)]
pub fn fragment_logits(acc: &[f32], c: u32, sm_scale: f32, w: impl Fn(u32) -> f32) -> [f32; 2] {
    let mut l = [0.0f32; 2];
    let mut j = 0;
    while 4 * j < acc.len() as u32 {
        let (w0, w1) = (w(8 * j + c), w(8 * j + c + 1));
        let a = &acc[4 * j as usize..4 * j as usize + 4];
        l[0] += head_term(a[0], sm_scale, w0) + head_term(a[1], sm_scale, w1);
        l[1] += head_term(a[2], sm_scale, w0) + head_term(a[3], sm_scale, w1);
        j += 1;
    }
    l
}

/// `a * b + c`: rounded once on the GPU (`fma.rn`), twice on the host
/// (whose tests compare within tolerances).
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        crate::ptx::arith::fma_rn(a, b, c)
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        a * b + c
    }
}

/// Whether a row may take the scaled head sum ([`fragment_logits_scaled`]):
/// with `sm_scale > 0` and a finite weight `w`, `w * relu(sm_scale * acc)`
/// is `(sm_scale * w) * max(acc, 0)` up to rounding, a NaN `acc` closing
/// the gate in both (`max` ignores NaN). A non-finite weight or a
/// non-positive scale keeps [`head_term`]'s exact gate.
#[inline(always)]
pub fn scaled_heads_ok(sm_scale: f32, w: f32) -> bool {
    sm_scale > 0.0 && w.is_finite()
}

/// [`fragment_logits`] for a row that passed [`scaled_heads_ok`]: `ws(col)`
/// is the head's `sm_scale * w`, each term one `max` and one `fma`.
#[inline(always)]
pub fn fragment_logits_scaled(acc: &[f32], c: u32, ws: impl Fn(u32) -> f32) -> [f32; 2] {
    let mut l = [0.0f32; 2];
    let mut j = 0;
    while 4 * j < acc.len() as u32 {
        let (w0, w1) = (ws(8 * j + c), ws(8 * j + c + 1));
        let a = &acc[4 * j as usize..4 * j as usize + 4];
        l[0] = fma(w1, a[1].max(0.0), fma(w0, a[0].max(0.0), l[0]));
        l[1] = fma(w1, a[3].max(0.0), fma(w0, a[2].max(0.0), l[1]));
        j += 1;
    }
    l
}

/// Where thread `t` of the warpgroup holds element `reg` of an `m64nN`
/// accumulator: `(row, column)` (PTX ISA, wgmma "Matrix fragments for
/// `.m64nNk16`").
pub const fn fragment_at(t: u32, reg: u32) -> (u32, u32) {
    let (w, l) = (t / 32, t % 32);
    let (g, c) = (l / 4, 2 * (l % 4));
    let (j, i) = (reg / 4, reg % 4);
    (16 * w + g + 8 * (i / 2), 8 * j + c + i % 2)
}

/// A running softmax normaliser over logits: the largest one `m` and
/// `s = sum exp(l - m)`. Empty: `m = -inf, s = 0`. Logits of `-inf` add no
/// mass and are skipped, so the result does not depend on the order of
/// the logits or of the merges: a NaN or `+inf` logit makes `s` NaN
/// (whatever came before or after), and a row whose logits are all `-inf`
/// stays empty (log-sum-exp `-inf`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lse {
    /// The largest logit pushed (NaN ignored by `max`), or `-inf`.
    pub m: f32,
    /// `sum exp(l - m)`.
    pub s: f32,
}

impl Lse {
    /// Nothing pushed.
    pub const EMPTY: Lse = Lse {
        m: f32::NEG_INFINITY,
        s: 0.0,
    };

    /// Whether nothing with mass was pushed or merged.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.m == f32::NEG_INFINITY && self.s == 0.0
    }

    /// Adds logit `x`.
    #[inline(always)]
    pub fn push(&mut self, x: f32, exp: impl Fn(f32) -> f32) {
        if x == f32::NEG_INFINITY {
            return;
        }
        self.merge(Lse { m: x, s: 1.0 }, exp);
    }

    /// Adds the logits `o` summarised.
    #[inline(always)]
    pub fn merge(&mut self, o: Lse, exp: impl Fn(f32) -> f32) {
        if o.is_empty() {
            return;
        }
        if self.is_empty() {
            *self = o;
            return;
        }
        // A NaN logit pushed first leaves `m` NaN (and `s` becomes NaN at
        // the next merge, whichever side is larger); `m` then takes the
        // other side's maximum.
        let m = if o.m > self.m || self.m.is_nan() {
            o.m
        } else {
            self.m
        };
        let s = self.s * exp(self.m - m) + o.s * exp(o.m - m);
        *self = Lse { m, s };
    }

    /// `m + ln(s)`: `-inf` when empty.
    #[inline(always)]
    pub fn value(&self) -> f32 {
        self.m + lnf(self.s)
    }
}

/// `ln(x)` in f32 to about 1 ulp without the `lg2.approx` instruction:
/// `x = 2^e (1 + f)` with `1 + f` in `[sqrt(1/2), sqrt(2))`, then
/// `ln(1 + f) = 2 atanh(f / (2 + f))` by its odd series to `z^11`
/// (truncation below 2e-10). `ln(0) = -inf`, `ln(inf) = inf`, NaN and
/// negative arguments give NaN; subnormal arguments are scaled up first.
#[inline(always)]
pub fn lnf(x: f32) -> f32 {
    if x.is_nan() || x < 0.0 {
        return f32::NAN;
    }
    if x == 0.0 {
        return f32::NEG_INFINITY;
    }
    if x == f32::INFINITY {
        return x;
    }
    let (x, bias) = if x < f32::MIN_POSITIVE {
        (x * 16_777_216.0, 24)
    } else {
        (x, 0)
    };
    let bits = x.to_bits();
    let mut e = ((bits >> 23) & 0xFF) as i32 - 127 - bias;
    let mut m = f32::from_bits((bits & 0x007F_FFFF) | 0x3F80_0000);
    if m > core::f32::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let f = m - 1.0;
    let z = f / (2.0 + f);
    let z2 = z * z;
    let mut p = 1.0 / 11.0;
    p = p * z2 + 1.0 / 9.0;
    p = p * z2 + 1.0 / 7.0;
    p = p * z2 + 1.0 / 5.0;
    p = p * z2 + 1.0 / 3.0;
    p = p * z2 + 1.0;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let ef = e as f32;
    (2.0 * z * p + ef * LN2_LO) + ef * LN2_HI
}

/// What the walk stores at a padding slot before the row's end: a NaN
/// whose payload no arithmetic produces (the GPU's NaN results are the
/// canonical `0x7fffffff`, and an f32 widened from a bf16 NaN has zero low
/// bits), so the rewrite tells padding from a NaN logit by the bits alone.
pub const PAD_MARK: u32 = 0xffba_dbad;

/// What the row's rewrite writes at a slot: sparse, the probability
/// `exp(l - lse)` (or the log-probability `l - lse` when `log`) of a valid
/// slot and 0 (`-inf`) at padding; dense, the raw logit `l` of a visible
/// column and 0 past the visible ones. `exp` is the exponential used.
#[inline(always)]
pub fn output(
    valid: bool,
    l: f32,
    lse: f32,
    dense: bool,
    log: bool,
    exp: impl Fn(f32) -> f32,
) -> f32 {
    match (dense, valid, log) {
        (true, true, _) => l,
        (true, false, _) => 0.0,
        (false, true, true) => l - lse,
        (false, true, false) => exp(l - lse),
        (false, false, true) => f32::NEG_INFINITY,
        (false, false, false) => 0.0,
    }
}

/// `e^x` from the hardware's `2^x` (`ex2.approx.ftz`, relative error
/// about 2^-22) on `x log2(e)`: the kernels' exponential. `-inf` gives 0,
/// NaN NaN; results below the smallest normal f32 flush to 0.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn exp_fast(x: f32) -> f32 {
    crate::ptx::arith::ex2_approx_ftz(x * core::f32::consts::LOG2_E)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::score::expf;
    use std::vec::Vec;

    #[test]
    fn short_rows_of_large_q_tiles_take_the_persistent_grid() {
        assert!(persistent(64, 128, 128));
        assert!(persistent(64, 128, PERSISTENT_MAX_COLS));
        assert!(!persistent(64, 128, PERSISTENT_MAX_COLS + 1));
        assert!(persistent(32, 128, 200) && persistent(64, 64, 1));
        assert!(persistent(128, 64, 256) && persistent(128, 128, 100));
        assert!(!persistent(16, 64, 128) && !persistent(16, 128, 128));
        assert!(!persistent(32, 64, 128));
    }

    #[test]
    fn lnf_is_within_two_ulp_of_std() {
        let mut worst = 0.0f64;
        let mut x = 1e-30f32;
        while x < 1e30 {
            for k in 0..97 {
                let v = x * (1.0 + k as f32 / 97.0);
                let want = (v as f64).ln();
                let got = lnf(v) as f64;
                let ulp = (want.abs() as f32).max(f32::MIN_POSITIVE);
                let ulp = (f32::from_bits(ulp.to_bits() + 1) - ulp) as f64;
                let err = (got - want).abs() / ulp;
                worst = worst.max(err);
            }
            x *= 1.7;
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        // Near 1 the result is tiny: relative accuracy there too.
        for v in [1.0f32, 1.0 + 1e-6, 0.999_999, 1.5, 2.0, 1024.0, 2048.0] {
            let (got, want) = (lnf(v) as f64, (v as f64).ln());
            assert!(
                (got - want).abs() <= 2e-7 * want.abs().max(1e-6),
                "{v}: {got} vs {want}"
            );
        }
        assert_eq!(lnf(1.0), 0.0);
        assert_eq!(lnf(0.0), f32::NEG_INFINITY);
        assert_eq!(lnf(f32::INFINITY), f32::INFINITY);
        assert!(lnf(-1.0).is_nan() && lnf(f32::NAN).is_nan());
        let sub = f32::from_bits(1);
        assert!(((lnf(sub) as f64) - (sub as f64).ln()).abs() < 1e-5);
    }

    fn lse_of(xs: &[f32]) -> Lse {
        let mut a = Lse::EMPTY;
        for &x in xs {
            a.push(x, expf);
        }
        a
    }

    #[test]
    fn lse_matches_f64_and_does_not_depend_on_the_order() {
        let xs: Vec<f32> = (0..300)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.7)
            .collect();
        let m = xs
            .iter()
            .cloned()
            .fold(f64::NEG_INFINITY, |a, x| a.max(x as f64));
        let want = m + xs.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
        let fwd = lse_of(&xs).value() as f64;
        assert!((fwd - want).abs() <= 2e-6 * want.abs(), "{fwd} vs {want}");
        // Merging halves in either order gives the same within rounding.
        let (a, b) = xs.split_at(123);
        let (mut x, mut y) = (lse_of(a), lse_of(b));
        let (xa, yb) = (x, y);
        x.merge(yb, expf);
        y.merge(xa, expf);
        assert!((x.value() as f64 - want).abs() <= 2e-6 * want.abs());
        assert!((y.value() as f64 - want).abs() <= 2e-6 * want.abs());
    }

    #[test]
    fn lse_of_non_finite_logits_is_the_same_in_any_order() {
        let cases: [(&[f32], Option<f32>); 6] = [
            (&[], Some(f32::NEG_INFINITY)),
            (
                &[f32::NEG_INFINITY, f32::NEG_INFINITY],
                Some(f32::NEG_INFINITY),
            ),
            (&[f32::NEG_INFINITY, 2.0], Some(2.0)),
            (&[f32::NAN, 1.0, 3.0], None),
            (&[f32::INFINITY, 1.0], None),
            (&[1.0, f32::INFINITY, f32::NEG_INFINITY], None),
        ];
        for (xs, want) in cases {
            let mut orders = std::vec![xs.to_vec()];
            let mut r = xs.to_vec();
            r.reverse();
            orders.push(r);
            for o in orders {
                let v = lse_of(&o).value();
                match want {
                    Some(w) => assert_eq!(v, w, "{o:?}"),
                    None => assert!(v.is_nan(), "{o:?}: {v}"),
                }
                // Merged one by one from singletons: the same.
                let mut acc = Lse::EMPTY;
                for &x in &o {
                    acc.merge(lse_of(&[x]), expf);
                }
                match want {
                    Some(w) => assert_eq!(acc.value(), w, "{o:?}"),
                    None => assert!(acc.value().is_nan(), "{o:?}"),
                }
            }
        }
    }

    #[test]
    fn fragment_map_covers_the_tile_once_per_shape() {
        for n in HEADS {
            let regs = n / 2;
            let mut seen = std::vec![0u32; (64 * n) as usize];
            for t in 0..THREADS {
                for reg in 0..regs {
                    let (r, c) = fragment_at(t, reg);
                    assert!(r < 64 && c < n);
                    seen[(r * n + c) as usize] += 1;
                }
            }
            assert!(seen.iter().all(|&k| k == 1), "n = {n}");
        }
    }

    #[test]
    fn fragment_logits_and_the_quad_sum_give_each_slot_its_logit() {
        // An S tile with varied signs; a quad's partials add up to the
        // logit of each of its two rows.
        let n = 64u32;
        let s = |r: u32, c: u32| ((r * 7 + c * 13) % 23) as f32 - 9.0;
        let w = |c: u32| 0.25 + c as f32 / 64.0;
        let sm = 0.5f32;
        for quad in 0..32 {
            let (warp, g) = (quad / 8, quad % 8);
            let mut sums = [0.0f32; 2];
            for lane_c in 0..4 {
                let t = warp * 32 + g * 4 + lane_c;
                let acc: Vec<f32> = (0..n / 2)
                    .map(|reg| {
                        let (r, c) = fragment_at(t, reg);
                        s(r, c)
                    })
                    .collect();
                let l = fragment_logits(&acc, 2 * lane_c, sm, w);
                sums[0] += l[0];
                sums[1] += l[1];
            }
            for (k, row) in [16 * warp + g, 16 * warp + g + 8].into_iter().enumerate() {
                let want: f32 = (0..n).map(|c| head_term(s(row, c), sm, w(c))).sum();
                assert!(
                    (sums[k] - want).abs() <= 1e-4 * want.abs().max(1.0),
                    "{row}"
                );
            }
        }
    }

    #[test]
    fn the_scaled_head_sum_matches_the_gated_one() {
        let n = 64u32;
        let s = |r: u32, c: u32| ((r * 7 + c * 13) % 23) as f32 - 9.0 + 0.37 * (c % 3) as f32;
        let w = |c: u32| 0.25 - c as f32 / 50.0;
        let sm = 0.3f32;
        assert!((0..n).all(|c| scaled_heads_ok(sm, w(c))));
        assert!(!scaled_heads_ok(0.0, 1.0) && !scaled_heads_ok(-1.0, 1.0));
        assert!(!scaled_heads_ok(1.0, f32::INFINITY) && !scaled_heads_ok(1.0, f32::NAN));
        for t in 0..THREADS {
            let mut acc: Vec<f32> = (0..n / 2)
                .map(|reg| {
                    let (r, c) = fragment_at(t, reg);
                    s(r, c)
                })
                .collect();
            acc[3] = f32::NAN; // closes the gate in both
            let c = 2 * (t % 4);
            let exact = fragment_logits(&acc, c, sm, w);
            let scaled = fragment_logits_scaled(&acc, c, |col| sm * w(col));
            for k in 0..2 {
                assert!(
                    (exact[k] - scaled[k]).abs() <= 1e-5 * exact[k].abs().max(1.0),
                    "{t}: {exact:?} vs {scaled:?}"
                );
            }
        }
    }

    #[test]
    fn head_term_is_closed_for_nan_and_non_positive_scores() {
        assert_eq!(head_term(2.0, 0.5, 3.0), 3.0);
        assert_eq!(head_term(-2.0, 0.5, 3.0), 0.0);
        assert_eq!(head_term(2.0, -0.5, 3.0), 0.0);
        assert_eq!(head_term(f32::NAN, 1.0, 3.0), 0.0);
        assert!(head_term(1.0, 1.0, f32::NAN).is_nan());
    }

    #[test]
    fn key_rows_follow_the_conventions_and_dense_visibility() {
        let mut p = FwdParams {
            batch: 2,
            seq_q: 3,
            seq_k: 5,
            cols: 4,
            ..FwdParams::default()
        };
        assert_eq!(batch_keys(&p, 4), 5, "row 4 is batch 1");
        assert_eq!(key_row(&p, batch_keys(&p, 4), 0, 7, 0, 0), 7);
        assert_eq!(key_row(&p, batch_keys(&p, 4), 0, 10, 0, 0), -1);
        assert_eq!(key_row(&p, batch_keys(&p, 4), 0, -1, 0, 0), -1);
        assert_eq!(
            key_row(&p, batch_keys(&p, 4), 4, 1, 0, 0),
            -1,
            "slot past cols"
        );
        p.flags = FLAG_LOCAL_IDS;
        assert_eq!(
            key_row(&p, batch_keys(&p, 4), 0, 2, 0, 0),
            7,
            "row 4 is batch 1"
        );
        assert_eq!(
            key_row(&p, batch_keys(&p, 4), 0, 5, 0, 0),
            -1,
            "never the next batch"
        );
        p.flags = FLAG_FWD_DENSE;
        assert_eq!(key_row(&p, 0, 2, 0, 3, 10), 12);
        assert_eq!(key_row(&p, 0, 3, 0, 3, 10), -1);
    }

    #[test]
    fn the_padding_mark_is_a_nan_no_arithmetic_makes() {
        let m = f32::from_bits(PAD_MARK);
        assert!(m.is_nan());
        assert_ne!(PAD_MARK, 0x7fff_ffff, "the GPU's canonical NaN");
        assert_ne!(PAD_MARK & 0xffff, 0, "a bf16 NaN widened has zero low bits");
        assert_ne!(PAD_MARK, f32::NAN.to_bits());
    }

    #[test]
    fn outputs_by_mode() {
        assert_eq!(output(true, 2.0, 2.0, false, false, expf), 1.0);
        assert_eq!(output(true, 1.0, 3.0, false, true, expf), -2.0);
        assert_eq!(
            output(false, 1.0, 3.0, false, true, expf),
            f32::NEG_INFINITY
        );
        assert_eq!(output(false, 1.0, 3.0, false, false, expf), 0.0);
        assert_eq!(output(true, 5.0, 3.0, true, false, expf), 5.0);
        assert_eq!(output(false, 5.0, 3.0, true, true, expf), 0.0);
    }

    #[test]
    fn layouts_and_gather_split() {
        assert_eq!((pieces(128), rows_per_pass(128), passes(128)), (16, 8, 8));
        assert_eq!((pieces(64), rows_per_pass(64), passes(64)), (8, 16, 4));
        let l = smem(64, 128);
        assert_eq!(l.q_block, 8192);
        assert_eq!(l.k, 16384);
        assert_eq!((STAGES, KEY_SETS, ID_SETS), (2, 4, 3));
        assert_eq!(l.w, l.k + 2 * 16384);
        assert_eq!(l.bytes, 53296);
        assert!(supports(8192, 2048) && !supports(0, 1) && !supports(1, 0));
        assert_eq!([0, 1, 64, 65, 2048].map(chunks), [0, 1, 1, 2, 32]);
    }
}
