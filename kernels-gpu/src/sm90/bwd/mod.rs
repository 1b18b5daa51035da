//! The sparse backward's wgmma kernels (sm_90a, stage 2 after the portable
//! stage 1): tile constants and the shared-memory layout, as plain Rust
//! that the host tests and the device kernel share.
//!
//! The kernel (`wg`, device only) handles one query row per CTA like the
//! `mma.sync` row kernel, but runs S = q K^T, dQ += dS K and dK = dS^T q on
//! `wgmma` with both operands read by the tensor cores straight from
//! 128-byte-swizzled shared memory: one read per warpgroup instead of one
//! per warp, which was the measured limit of the `mma.sync` kernel.
//!
//! Every operand tile is stored as swizzle blocks (`crate::sm90`). The
//! same bytes serve as a K-major operand (rows
//! along M/N, 64 elements of K per row) and as an MN-major one (rows along
//! K, 64 elements of M/N per row), so no tile is ever transposed:
//! - `q`: blocks of `HEADS` rows (a head each) x 64 of D; two blocks for
//!   D = 128, one for D = 64.
//! - K chunk: blocks of `CHUNK` rows (a slot each) x 64 of D; two per buffer
//!   for D = 128, one for D = 64.
//! - dS: one block of `HEADS` rows (a head each) x `CHUNK` slots.
//!
//! The kernel exists for every H in {16, 32, 64, 128} and D in {64, 128}:
//! H = 64 with D = 128 ([`SM90_WG`](crate::registry::SM90_WG)) and D = 64 ([`SM90_WG_D64`](crate::registry::SM90_WG_D64)),
//! H = 32 and 16 (e.g. [`SM90_WG_H32`](crate::registry::SM90_WG_H32), [`SM90_WG_H16_D64`](crate::registry::SM90_WG_H16_D64): the M = 64
//! head tile with its rows `H..64` zero, `Q_HEADS`) and H = 128
//! ([`SM90_WG_H128`](crate::registry::SM90_WG_H128), [`SM90_WG_H128_D64`](crate::registry::SM90_WG_H128_D64): two halves of a CTA on one
//! row's two 64-head halves); each D has its layout ([`smem`]), derived
//! from D by const arithmetic. The role modules read D, the D-dependent
//! sizes (`DIM`, `Q_BYTES`, `K_BYTES`, `DK_STRIDE`, `SMEM`, `PAIR`,
//! `SPLIT`) and the problem's heads (`Q_HEADS`) from their parent: this
//! module for H = 64, D = 128, and `d64`, `h32`, `h16`, `h128` and the
//! `_d64` ones, which compile the same source files a second time as
//! their own children (`role_modules!`; plain constants, so the H = 64,
//! D = 128 kernels compile as before). The paired kernel is H = 64,
//! D = 128 only.

mod sched;

use super::{ROW_BYTES, ROW_ELEMS};

// The kernels (device only): the entries and the item order (`wg`), the
// context and named barriers (`ctx`), one module per role.
sm90a_modules!(ctx, entry, gate, load, mma, pair, reduce, row_end, wg);

/// Compiles the role modules' source files (and the body, `wg`) again as
/// children of the module that invokes it, which shadows the constants
/// they read from their parent (`DIM`, `Q_HEADS`, ...). Invoked from a
/// `mod.rs` one directory below this one (`d64/`, `h32/`, `h16/`,
/// `h128/`): the paths are relative to that file's directory.
#[cfg(all(target_arch = "nvptx64", kernels_arch = "sm_90a"))]
macro_rules! role_modules {
    () => {
        #[path = "../ctx.rs"]
        mod ctx;
        #[path = "../gate.rs"]
        mod gate;
        #[path = "../load.rs"]
        mod load;
        #[path = "../mma.rs"]
        mod mma;
        #[path = "../pair.rs"]
        mod pair;
        #[path = "../reduce.rs"]
        mod reduce;
        #[path = "../row_end.rs"]
        mod row_end;
        #[path = "../wg.rs"]
        mod wg;
    };
}

/// The D = 64 sizes the role modules read from their parent, for a
/// module that compiles them for D = 64 (`d64`, `h32_d64`, `h16_d64`,
/// `h128_d64`): q and K tiles of one swizzle block, staged dK rows of
/// 64 + 8 f32, the D = 64 layout and its two-half launch shape, and the
/// products split between the warpgroups (`SPLIT`: warpgroup 0 computes
/// dQ += dS K and stores d_index_q, warpgroup 1 computes dK = dS^T q and
/// stages it, each an `m64n64k16` chain on whole blocks).
#[cfg(all(target_arch = "nvptx64", kernels_arch = "sm_90a"))]
macro_rules! d64_sizes {
    () => {
        /// Head dimension.
        const DIM: u32 = 64;
        /// Bytes of the `q` tile.
        const Q_BYTES: u32 = q_bytes(DIM);
        /// Bytes of one K chunk buffer.
        const K_BYTES: u32 = k_bytes(DIM);
        /// Bytes per staged dK row.
        const DK_STRIDE: u32 = dk_stride(DIM);
        /// The layout.
        const SMEM: WgSmem = SMEM_D64;
        /// The launch shape of two halves on it.
        const PAIR: PairLayout = PAIR_D64;
        /// Warpgroup 0 computes dQ, warpgroup 1 dK.
        const SPLIT: bool = true;
    };
}

/// The entry of a wgmma row kernel whose body `role_modules!` compiled in
/// the invoking module (two warpgroups on one row, launched alone): the
/// dispatch test, which computes at once (the host sets
/// `FLAG_PAIR_DISPATCH` only for H = 64, D = 128), then `wg::stage2`.
#[cfg(all(target_arch = "nvptx64", kernels_arch = "sm_90a"))]
macro_rules! row_entry {
    ($(#[$doc:meta])* $name:ident, $det:ident) => {
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $name(p: crate::abi::GradParams) {
            // SAFETY: forwarded launch contract; the whole CTA runs the
            // test.
            unsafe {
                let go = pair::dispatch::<false>(&p);
                wg::stage2::<false, 0, false>(&p, crate::det::DetTables::NONE, go)
            }
        }

        /// The deterministic twin of the entry above (`crate::det`).
        ///
        /// # Safety
        /// As the entry above on `p.grad`, after `det_scales` of `p`.
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $det(p: crate::abi::DetParams) {
            // SAFETY: forwarded launch contract; the whole CTA runs the
            // test.
            unsafe {
                let go = pair::dispatch::<false>(&p.grad);
                wg::stage2::<false, 0, true>(&p.grad, crate::det::DetTables::of(&p), go)
            }
        }
    };
}

/// The entry of an H = 128 kernel whose body `role_modules!` compiled in
/// the invoking module: the row kernel's dispatch test (it computes at
/// once) before the CTA splits into its two halves, each running
/// `wg::stage2` with `PAIRED` on its 64 heads of the same rows.
#[cfg(all(target_arch = "nvptx64", kernels_arch = "sm_90a"))]
macro_rules! halves_entry {
    ($(#[$doc:meta])* $name:ident, $det:ident) => {
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $name(p: crate::abi::GradParams) {
            // SAFETY: forwarded launch contract; the whole CTA runs the
            // test before the halves split.
            unsafe {
                let go = pair::dispatch::<false>(&p);
                let none = crate::det::DetTables::NONE;
                if crate::ptx::sreg::thread_idx_x() < THREADS {
                    wg::stage2::<true, 0, false>(&p, none, go)
                } else {
                    wg::stage2::<true, 1, false>(&p, none, go)
                }
            }
        }

        /// The deterministic twin of the entry above (`crate::det`).
        ///
        /// # Safety
        /// As the entry above on `p.grad`, after `det_scales` of `p`.
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $det(p: crate::abi::DetParams) {
            // SAFETY: forwarded launch contract; the whole CTA runs the
            // test before the halves split.
            unsafe {
                let go = pair::dispatch::<false>(&p.grad);
                let det = crate::det::DetTables::of(&p);
                if crate::ptx::sreg::thread_idx_x() < THREADS {
                    wg::stage2::<true, 0, true>(&p.grad, det, go)
                } else {
                    wg::stage2::<true, 1, true>(&p.grad, det, go)
                }
            }
        }
    };
}

// The other shapes' kernels: the role modules compiled again with their
// constants (`role_modules!`, `d64_sizes!`) and their entries
// (`row_entry!`, `halves_entry!`).
sm90a_modules!(d64, h128, h128_d64, h16, h16_d64, h32, h32_d64);

pub use sched::{pair_grid, row_chunks, row_grid, Pos, Walk, SKIP_MIN_TOPK};

// The kernels of this module, by their registry entries (sm_90a PTX only):
// - `SM90_WG`: the wgmma row kernel (H = 64, D = 128);
// - `SM90_WG_D64`: its body on `SMEM_D64`, the two warpgroups splitting the
//   products instead of the D columns (`SPLIT`);
// - `SM90_WG_H32`, `SM90_WG_H16`: the body and layout of `SM90_WG` with the
//   q tile's rows `H..63` zero and the padded heads' weights 0 (`Q_HEADS`);
//   `SM90_WG_H32_D64`, `SM90_WG_H16_D64` the same on the D = 64 body;
// - `SM90_WG_PAIR`: one CTA per SM of two halves, each half the row
//   kernel's two warpgroups on its own copy of `SMEM`, walking rows `2 p`
//   and `2 p + 1` of the same pairs in step, so that where the two rows
//   select the same key in the same slot the pair reduces the sum of both
//   dK rows once (`PAIR`);
// - `SM90_WG_H128` (`SM90_WG_H128_D64` on the D = 64 body, `PAIR_D64`): the
//   paired kernel's body with both halves of a CTA on the same row, half
//   `h` holding heads `64 h .. 64 h + 64` (`HEAD_HALVES` in `ctx`); every
//   item is fused (one dK product over all 128 heads, alternating between
//   the halves, each key row reduced once).

/// Heads of the wgmma kernel (the M = 64 of one warpgroup MMA).
pub const HEADS: u32 = 64;
/// Head dimension of the paired kernel and of [`SM90_WG`](crate::registry::SM90_WG).
pub const DIM: u32 = 128;
/// Head dimensions of the wgmma row kernels ([`SM90_WG`](crate::registry::SM90_WG),
/// [`SM90_WG_D64`](crate::registry::SM90_WG_D64)).
pub const DIMS: [u32; 2] = [DIM, 64];
/// Slots per chunk (the N of S, the K of dQ, the M of dK).
pub const CHUNK: u32 = 64;
/// Threads per CTA: two warpgroups.
pub const THREADS: u32 = 256;
/// Warpgroups per CTA.
pub const WARPGROUPS: u32 = THREADS / 128;
/// Reduction depth of one `wgmma` (bf16).
pub const MMA_K: u32 = 16;
/// Padding (f32 elements) of each staged dK row: keeps rows 16-byte
/// aligned for the vector loads, and with a row stride of 8 banks mod 32
/// the eight rows one half-warp writes with 64-bit stores hit distinct banks.
pub const DK_PAD: u32 = 8;
/// Bytes reserved to align the start of dynamic shared memory to 1024.
pub const ALIGN_SLACK: u32 = 1024;

/// Bytes of the `q` tile (D = 128).
pub const Q_BYTES: u32 = q_bytes(DIM);
/// Bytes of one K chunk buffer (D = 128).
pub const K_BYTES: u32 = k_bytes(DIM);
/// Bytes of one column block (64 of D) of a K chunk buffer.
pub const K_BLOCK: u32 = CHUNK * ROW_BYTES;
/// Bytes of one column block (64 of D) of the q tile.
pub const Q_BLOCK: u32 = HEADS * ROW_BYTES;
/// Bytes of the dS tile.
pub const DS_BYTES: u32 = HEADS * CHUNK * 2;
/// Bytes per staged dK row (D = 128).
pub const DK_STRIDE: u32 = dk_stride(DIM);

/// Bytes of the `q` tile for head dimension `d`.
pub const fn q_bytes(d: u32) -> u32 {
    HEADS * d * 2
}
/// Bytes of one K chunk buffer for head dimension `d`.
pub const fn k_bytes(d: u32) -> u32 {
    CHUNK * d * 2
}
/// Bytes per staged dK row for head dimension `d` (a stride of 8 banks
/// mod 32 for both dimensions: 136 and 72 words).
pub const fn dk_stride(d: u32) -> u32 {
    (d + DK_PAD) * 4
}

/// How the two warpgroups share a chunk's dQ and dK products in the role
/// modules compiled here (D = 128): each takes 64 of the D columns of both.
/// `d64` compiles them again with `SPLIT = true`: warpgroup 0 computes dQ
/// (and stores d_index_q), warpgroup 1 computes and stages dK, each over
/// all 64 columns, so both use the D = 128 kernel's `m64n64k16` chains and
/// descriptors on whole swizzle blocks.
#[cfg_attr(
    not(all(target_arch = "nvptx64", kernels_arch = "sm_90a")),
    allow(dead_code)
)]
const SPLIT: bool = false;

/// Heads of the problem in the role modules compiled here: all the tile's
/// rows. `h32` and `h16` compile them again with 32 and 16: the q tile's
/// rows `Q_HEADS..HEADS` are zero-filled by the q loads, the padded heads'
/// weights are 0 (so their dS and d_weights partials are 0 and they add
/// nothing to dK), and only the real heads are read from `index_q` /
/// `weights` and stored to d_index_q / d_weights. `h128` compiles them with
/// 128 under the paired body: each half of the CTA takes one 64-head half
/// of the row.
#[cfg_attr(
    not(all(target_arch = "nvptx64", kernels_arch = "sm_90a")),
    allow(dead_code)
)]
const Q_HEADS: u32 = HEADS;

/// Bytes per slot of a raw-id set: room for an i64 id.
pub const IDS_SLOT_BYTES: u32 = 8;

/// Byte offsets of the kernel's shared-memory regions, relative to the
/// 1024-byte aligned base.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgSmem {
    /// Two q tiles (swizzle blocks), [`Q_BYTES`] apart: the current row's
    /// and the next row's (prefetched while the current one runs).
    pub q: u32,
    /// Two K chunk buffers, [`K_BYTES`] apart.
    pub k: u32,
    /// dS tile.
    pub ds: u32,
    /// dK staging, `CHUNK` rows of [`DK_STRIDE`] bytes.
    pub dk: u32,
    /// grad_signal of the slots, two sets of `CHUNK` f32.
    pub gs: u32,
    /// Resolved key rows (-1 padding), two sets of `CHUNK` i32.
    pub rows: u32,
    /// Raw key ids as loaded (`cp.async`), two sets of `CHUNK` slots of
    /// [`IDS_SLOT_BYTES`]: an i64 id each (`FLAG_IDS_I64`), or i32 ids
    /// packed in the first half of each set.
    pub ids: u32,
    /// Key rows of the chunk whose staged dK rows are being reduced,
    /// `CHUNK` i32.
    pub red_rows: u32,
    /// weights as f32, two rows of `HEADS` values (current, next).
    pub w: u32,
    /// d_weights partials, `THREADS / 32 * HEADS` f32.
    pub red: u32,
    /// Bytes used after the aligned base.
    pub used: u32,
    /// Dynamic shared memory to request (used + alignment slack).
    pub bytes: u32,
}

/// The layout for D = 128 (all tiles 1024-byte aligned).
pub const SMEM: WgSmem = smem(DIM);
/// The layout for D = 64 (q, K and the dK staging half as wide).
pub const SMEM_D64: WgSmem = smem(64);

/// The layout for head dimension `d` (64 or 128): every tile a whole number
/// of 1024-byte swizzle blocks from the aligned base.
pub const fn smem(d: u32) -> WgSmem {
    let q = 0;
    let k = q + 2 * q_bytes(d);
    let ds = k + 2 * k_bytes(d);
    let dk = ds + DS_BYTES;
    let gs = dk + CHUNK * dk_stride(d);
    let rows = gs + 2 * CHUNK * 4;
    let ids = rows + 2 * CHUNK * 4;
    let red_rows = ids + 2 * CHUNK * IDS_SLOT_BYTES;
    let w = red_rows + CHUNK * 4;
    let red = w + 2 * HEADS * 4;
    let used = red + THREADS / 32 * HEADS * 4;
    WgSmem {
        q,
        k,
        ds,
        dk,
        gs,
        rows,
        ids,
        red_rows,
        w,
        red,
        used,
        bytes: used + ALIGN_SLACK,
    }
}

/// The kernels of the wgmma path for one shape (heads, head dimension).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgRow {
    /// The wgmma kernel ([`SM90_WG`](crate::registry::SM90_WG), [`SM90_WG_D64`](crate::registry::SM90_WG_D64),
    /// [`SM90_WG_H32`](crate::registry::SM90_WG_H32), [`SM90_WG_H16`](crate::registry::SM90_WG_H16) or [`SM90_WG_H128`](crate::registry::SM90_WG_H128)).
    pub kernel: &'static str,
    /// The stage-1 kernel launched ahead of it (zeroing a `B*S_k*D`
    /// accumulator).
    pub stage1: &'static str,
    /// The layout of one pair of warpgroups ([`smem`] of its D).
    pub smem: WgSmem,
    /// Threads per CTA: [`THREADS`], or `PAIR.threads` for H = 128 (two
    /// halves on one row).
    pub threads: u32,
    /// Dynamic shared memory to request: `smem.bytes`, or `PAIR.bytes`.
    pub bytes: u32,
    /// Resident CTAs per SM the persistent grid counts on (the launch
    /// bounds): [`CTAS_PER_SM`], or 1 for H = 128.
    pub ctas_per_sm: u32,
    /// Whether the paired kernel exists for this shape (H = 64, D = 128).
    pub paired: bool,
}

impl WgRow {
    /// The persistent grid for `rows` query rows on `sms` SMs (one row per
    /// CTA at a time, rows dealt round robin).
    pub const fn grid(&self, rows: u32, sms: u32) -> u32 {
        crate::sched::persistent_grid(rows, sms, self.ctas_per_sm)
    }
}

/// The wgmma path's kernels for `heads` x `dim`, or `None` for a shape it
/// does not take (H in {16, 32, 64, 128} with D in {64, 128}).
pub const fn wg_row(heads: u32, dim: u32) -> Option<WgRow> {
    // Two warpgroups on one row, two CTAs per SM.
    const fn row(kernel: &'static str, stage1: &'static str, smem: WgSmem, paired: bool) -> WgRow {
        WgRow {
            kernel,
            stage1,
            smem,
            threads: THREADS,
            bytes: smem.bytes,
            ctas_per_sm: CTAS_PER_SM,
            paired,
        }
    }
    // H = 128: the two halves of one CTA per SM on one row.
    const fn halves(
        kernel: &'static str,
        stage1: &'static str,
        smem: WgSmem,
        launch: PairLayout,
    ) -> WgRow {
        WgRow {
            kernel,
            stage1,
            smem,
            threads: launch.threads,
            bytes: launch.bytes,
            ctas_per_sm: 1,
            paired: false,
        }
    }
    let (s1, s1_d64) = (
        crate::registry::STAGE1.name,
        crate::registry::STAGE1_D64.name,
    );
    match (heads, dim) {
        (HEADS, DIM) => Some(row(crate::registry::SM90_WG.name, s1, SMEM, true)),
        (32, DIM) => Some(row(crate::registry::SM90_WG_H32.name, s1, SMEM, false)),
        (16, DIM) => Some(row(crate::registry::SM90_WG_H16.name, s1, SMEM, false)),
        (HEADS, 64) => Some(row(
            crate::registry::SM90_WG_D64.name,
            s1_d64,
            SMEM_D64,
            false,
        )),
        (32, 64) => Some(row(
            crate::registry::SM90_WG_H32_D64.name,
            s1_d64,
            SMEM_D64,
            false,
        )),
        (16, 64) => Some(row(
            crate::registry::SM90_WG_H16_D64.name,
            s1_d64,
            SMEM_D64,
            false,
        )),
        (128, DIM) => Some(halves(crate::registry::SM90_WG_H128.name, s1, SMEM, PAIR)),
        (128, 64) => Some(halves(
            crate::registry::SM90_WG_H128_D64.name,
            s1_d64,
            SMEM_D64,
            PAIR_D64,
        )),
        _ => None,
    }
}

/// Resident CTAs per SM the kernel is built for (launch bounds).
pub const CTAS_PER_SM: u32 = 2;
// The launch bounds the link step writes (`registry`) are the ones this
// layout and the persistent grid count on.
const _: () = assert!(crate::registry::SM90_WG.threads == THREADS);
const _: () = assert!(matches!(
    crate::registry::SM90_WG.bounds,
    crate::registry::Bounds::Exact {
        min_ctas: CTAS_PER_SM
    }
));
const _: () = {
    let ks = [
        crate::registry::SM90_WG_D64,
        crate::registry::SM90_WG_H32,
        crate::registry::SM90_WG_H16,
        crate::registry::SM90_WG_H32_D64,
        crate::registry::SM90_WG_H16_D64,
    ];
    let mut i = 0;
    while i < ks.len() {
        assert!(ks[i].threads == THREADS);
        assert!(matches!(
            ks[i].bounds,
            crate::registry::Bounds::Exact {
                min_ctas: CTAS_PER_SM
            }
        ));
        i += 1;
    }
};

/// Launch shape of the paired kernel ([`SM90_WG_PAIR`](crate::registry::SM90_WG_PAIR)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PairLayout {
    /// Threads per CTA: two halves of [`THREADS`].
    pub threads: u32,
    /// Bytes between the two halves' copies of [`SMEM`] (1024-aligned).
    pub half_stride: u32,
    /// Offset, in each half's copy, of that half's item votes: two sets (by
    /// item parity) of one u32 per warp of the half, nonzero when one of
    /// the warp's slots holds different key rows in the two halves. In the
    /// padding after [`SMEM`]'s regions.
    pub votes: u32,
    /// Dynamic shared memory to request.
    pub bytes: u32,
}

/// Bytes of one set of a half's item votes (one u32 per warp).
pub const VOTE_SET_BYTES: u32 = (THREADS / 32) * 4;

/// The launch shape of a kernel of two halves on `smem`: two copies of
/// the layout, the second on the next 1024-byte boundary.
pub const fn pair_layout(smem: WgSmem) -> PairLayout {
    let half_stride = smem.used.div_ceil(1024) * 1024;
    PairLayout {
        threads: 2 * THREADS,
        half_stride,
        votes: smem.used,
        bytes: 2 * half_stride + ALIGN_SLACK,
    }
}

/// The paired kernel's launch shape (and H = 128, D = 128's):
/// [`pair_layout`] of [`SMEM`].
pub const PAIR: PairLayout = pair_layout(SMEM);
/// The launch shape of H = 128, D = 64: [`pair_layout`] of [`SMEM_D64`].
pub const PAIR_D64: PairLayout = pair_layout(SMEM_D64);
// The votes fit in the padding (the paired layout is no larger for them)
// and are read as 16-byte vectors.
const _: () = assert!(PAIR.votes + 2 * VOTE_SET_BYTES <= PAIR.half_stride);
const _: () = assert!(PAIR.votes.is_multiple_of(16) && VOTE_SET_BYTES == 32);
const _: () = assert!(crate::registry::SM90_WG_PAIR.threads == PAIR.threads);
const _: () = {
    let ks = [
        crate::registry::SM90_WG_H128,
        crate::registry::SM90_WG_H128_D64,
    ];
    let mut i = 0;
    while i < ks.len() {
        assert!(ks[i].threads == PAIR.threads && PAIR_D64.threads == PAIR.threads);
        assert!(matches!(
            ks[i].bounds,
            crate::registry::Bounds::Max { min_ctas: 1 }
        ));
        i += 1;
    }
};
// The D = 64 votes fit as well.
const _: () = assert!(PAIR_D64.votes + 2 * VOTE_SET_BYTES <= PAIR_D64.half_stride);

/// Row pairs the dispatch test samples.
pub const PAIR_SAMPLES: u32 = 8;
/// Leading slots of each sampled pair the dispatch test compares.
pub const PAIR_SAMPLE_SLOTS: u32 = 32;

/// Pair sampled by the dispatch test's `i`-th sample (`i <` [`PAIR_SAMPLES`])
/// among `pairs >= 1` row pairs: the midpoints of eight equal ranges (not
/// pair 0, whose causal rows hold a single key).
pub const fn pair_sample(pairs: u32, i: u32) -> u32 {
    ((2 * i as u64 + 1) * pairs as u64 / (2 * PAIR_SAMPLES as u64)) as u32
}

/// Leading slots of each sampled pair the dispatch test compares at this
/// topk: `min(topk, PAIR_SAMPLE_SLOTS)`.
pub fn sampled_slots(topk: u32) -> u32 {
    topk.min(PAIR_SAMPLE_SLOTS)
}

/// Whether a sampled slot counts as a match: the same valid (`>= 0`) id in
/// both rows of the pair.
pub const fn sample_hit(x: i32, y: i32) -> bool {
    x >= 0 && x == y
}

/// The dispatch test's verdict: the paired kernel runs when at least half
/// of the sampled slots (`PAIR_SAMPLES` pairs x their first
/// [`sampled_slots`]) are matches ([`sample_hit`]). Every CTA of both
/// kernels computes it from the same samples, so they agree; it only picks
/// the faster kernel, both are correct on any ids.
pub fn pairs_match(matches: u32, topk: u32) -> bool {
    let n = sampled_slots(topk);
    matches > 0 && 2 * matches >= PAIR_SAMPLES * n
}

/// The dispatch test on ids held by the host (`rows x topk`, row major):
/// what every CTA of both kernels computes on the device (sampled pairs
/// [`pair_sample`], their first [`sampled_slots`], [`sample_hit`],
/// [`pairs_match`]). For tests and tools that want to know which kernel
/// a problem runs; `false` for an odd number of rows (no paired kernel).
pub fn ids_pair_up(ids: &[i32], rows: u32, topk: u32) -> bool {
    let pairs = rows / 2;
    if rows % 2 == 1 || pairs == 0 || ids.len() < rows as usize * topk as usize {
        return false;
    }
    let mut matches = 0;
    for i in 0..PAIR_SAMPLES {
        let a = (2 * pair_sample(pairs, i) * topk) as usize;
        for t in 0..sampled_slots(topk) as usize {
            if sample_hit(ids[a + t], ids[a + topk as usize + t]) {
                matches += 1;
            }
        }
    }
    pairs_match(matches, topk)
}

/// Whether the paired kernel runs `rows` query rows: it takes them in
/// pairs `(2 p, 2 p + 1)`, so their number must be even (odd counts run the
/// row kernel).
pub const fn supports_pairs(rows: u64, topk: u64) -> bool {
    rows.is_multiple_of(2) && supports(rows, topk)
}

/// The kernel needs at least two chunks per row (the next row's q tile is
/// loaded during the current row's first chunk and must be complete before
/// its last chunk ends), indexes slots `row * topk + t` in u32, and reads
/// the row's chunk count as a u16.
pub const fn supports(rows: u64, topk: u64) -> bool {
    topk > CHUNK as u64
        && rows * topk <= u32::MAX as u64
        && topk <= crate::abi::ROW_CHUNK_MAX_TOPK as u64
}

/// Shared memory of one H100/H200 SM (228 KiB), of which the driver
/// reserves 1 KiB per resident CTA.
const SMEM_PER_SM: u32 = 228 * 1024;
/// Shared memory the driver reserves per CTA.
const SMEM_RESERVED_PER_CTA: u32 = 1024;

// CTAS_PER_SM CTAs per SM (launch bounds) must fit, for both dimensions.
const _: () = assert!(CTAS_PER_SM * (SMEM.bytes + SMEM_RESERVED_PER_CTA) <= SMEM_PER_SM);
const _: () = assert!(CTAS_PER_SM * (SMEM_D64.bytes + SMEM_RESERVED_PER_CTA) <= SMEM_PER_SM);
// One paired CTA per SM must fit, its halves 1024-byte aligned.
const _: () = assert!(PAIR.bytes + SMEM_RESERVED_PER_CTA <= SMEM_PER_SM);
const _: () = assert!(PAIR.half_stride.is_multiple_of(1024) && PAIR.half_stride >= SMEM.used);
// Operand tiles start on swizzle-pattern boundaries.
const fn layout_ok(d: u32) -> bool {
    let l = smem(d);
    l.q.is_multiple_of(1024)
        && l.k.is_multiple_of(1024)
        && l.ds.is_multiple_of(1024)
        && q_bytes(d).is_multiple_of(1024)
        && k_bytes(d).is_multiple_of(1024)
        && l.dk.is_multiple_of(16)
        && dk_stride(d).is_multiple_of(16)
        // Whole 64-column swizzle blocks of D.
        && d.is_multiple_of(ROW_ELEMS)
        && d / ROW_ELEMS <= WARPGROUPS
}
const _: () = {
    assert!(layout_ok(DIM) && layout_ok(64));
    assert!(K_BLOCK.is_multiple_of(1024) && Q_BLOCK.is_multiple_of(1024));
    // The D = 64 tiles are one swizzle block each.
    assert!(q_bytes(64) == Q_BLOCK && k_bytes(64) == K_BLOCK);
    // The gather gives each thread the same number of K vectors.
    assert!((CHUNK * DIM / 8).is_multiple_of(THREADS));
    assert!((CHUNK * 64 / 8).is_multiple_of(THREADS));
    // Bank spread of the staged dK rows: 8 banks mod 32.
    assert!(dk_stride(DIM) / 4 % 32 == 8 && dk_stride(64) / 4 % 32 == 8);
};
// The stage-1 chunk count is in this kernel's chunks, and every H it runs
// (16 and up) has room for it in d_weights.
const _: () =
    assert!(crate::abi::ROW_CHUNK_SLOTS == CHUNK && crate::abi::ROW_CHUNK_MIN_HEADS <= 16);
// One warpgroup MMA covers all heads (M = 64); the S tile of a chunk is
// split into one 32-slot half per warpgroup; dQ and dK into 64-column
// halves of D; the dS tile is one swizzled row (64 slots) per head.
const _: () = assert!(HEADS == 64 && CHUNK == 64 && DIM == 128 && WARPGROUPS == 2);
const _: () = assert!(CHUNK / WARPGROUPS == 32 && DIM / WARPGROUPS == ROW_ELEMS);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm90::{desc, swizzle, ATOM_BYTES};

    #[test]
    fn supports_bounds_topk_and_slot_indices() {
        assert!(supports(1 << 20, 4095) && !supports(1 << 20, 4096));
        assert!(supports(1, 65_535 * 64) && !supports(1, 65_535 * 64 + 1));
    }

    #[test]
    fn pair_layout_holds_two_copies_of_the_row_layout_on_one_sm() {
        let (p, used) = (PAIR, SMEM.used);
        assert_eq!(p.threads, 2 * THREADS);
        assert!(p.half_stride >= used && p.half_stride.is_multiple_of(1024));
        assert!(
            p.half_stride - used < 1024,
            "no more padding than alignment needs"
        );
        assert_eq!(p.bytes, 2 * p.half_stride + ALIGN_SLACK);
        assert!(p.bytes + SMEM_RESERVED_PER_CTA <= SMEM_PER_SM);
        assert_eq!(pair_grid(8192, 132), 132);
        assert_eq!(pair_grid(10, 132), 5);
        assert!(supports_pairs(8192, 2048) && !supports_pairs(8191, 2048));
        assert!(
            !supports_pairs(8192, 64),
            "the row kernel's own limits apply"
        );
    }

    #[test]
    fn dispatch_samples_spread_pairs_and_needs_half_the_slots_to_match() {
        // Midpoints of eight equal ranges: distinct, ascending, in range,
        // never pair 0 once there are enough pairs.
        let s: std::vec::Vec<u32> = (0..PAIR_SAMPLES).map(|i| pair_sample(4096, i)).collect();
        assert_eq!(s, [256, 768, 1280, 1792, 2304, 2816, 3328, 3840]);
        for pairs in [1u32, 2, 7, 8, 9, 1 << 30] {
            for i in 0..PAIR_SAMPLES {
                assert!(pair_sample(pairs, i) < pairs, "pairs {pairs} sample {i}");
            }
        }
        // Threshold: half of 8 x min(topk, 32) sampled slots, never zero.
        assert!(pairs_match(128, 2048) && !pairs_match(127, 2048));
        assert!(pairs_match(4, 1) && !pairs_match(3, 1));
        assert!(!pairs_match(0, 0));
    }

    #[test]
    fn dispatch_test_on_host_ids_tells_ragged_rows_from_uniform_ones() {
        let (rows, topk) = (512u32, 100u32);
        // Slot-aligned causal ids (key t in slot t, rows 2i and 2i + 1
        // identical): row r sees keys 0 ..= r / 2 in its first slots.
        let ragged: std::vec::Vec<i32> = (0..rows * topk)
            .map(|i| {
                let (r, t) = (i / topk, i % topk);
                if t <= r / 2 {
                    t as i32
                } else {
                    -1
                }
            })
            .collect();
        assert!(ids_pair_up(&ragged, rows, topk));
        // Odd rows shifted by one key: no slot matches.
        let shifted: std::vec::Vec<i32> = (0..rows * topk)
            .map(|i| ((i % topk) + (i / topk) % 2) as i32)
            .collect();
        assert!(!ids_pair_up(&shifted, rows, topk));
        // Padding never counts as a match.
        assert!(!ids_pair_up(
            &std::vec![-1; (rows * topk) as usize],
            rows,
            topk
        ));
        // Odd row counts and short buffers run the row kernel.
        assert!(!ids_pair_up(
            &ragged[..((rows - 1) * topk) as usize],
            rows - 1,
            topk
        ));
        assert!(!ids_pair_up(&ragged[..10], rows, topk));
    }

    /// The tensor cores' view of a 128-byte-swizzled operand (PTX ISA,
    /// "Shared Memory Matrix Layout", 128B swizzle mode): the unswizzled
    /// byte address, with the 16-byte chunk bits 4-6 XORed with the row
    /// bits 7-9 of the address (absolute: the tiles are 1024-aligned).
    fn hw_swizzle(addr: u32) -> u32 {
        addr ^ (((addr >> 7) & 7) << 4)
    }

    /// Address the hardware reads for element (`r` along M/N, `e` along K,
    /// `e < 16`) of one K step of a K-major operand described by `d`.
    fn k_major(d: u64, r: u32, e: u32) -> u32 {
        let start = ((d & 0x3FFF) << 4) as u32;
        let sbo = (((d >> 32) & 0x3FFF) << 4) as u32;
        hw_swizzle(start + (r / 8) * sbo + (r % 8) * ROW_BYTES + 2 * e)
    }

    /// Address the hardware reads for element (`k` along K, `k < 16`, `n`
    /// along M/N) of one K step of an MN-major operand described by `d`.
    fn mn_major(d: u64, k: u32, n: u32) -> u32 {
        let start = ((d & 0x3FFF) << 4) as u32;
        let lbo = (((d >> 16) & 0x3FFF) << 4) as u32;
        let sbo = (((d >> 32) & 0x3FFF) << 4) as u32;
        hw_swizzle(start + (n / 64) * lbo + (k / 8) * sbo + (k % 8) * ROW_BYTES + 2 * (n % 64))
    }

    /// Where the kernel writes element (`r`, `col`) of a tile at `base` of
    /// 64-column swizzle blocks `block` bytes apart (`load`, `gate`).
    fn tile(base: u32, block: u32, r: u32, col: u32) -> u32 {
        base + (col / 64) * block + swizzle(r, (col % 64) * 2)
    }

    /// `desc` with its start advanced by `units` of 16 bytes, as the
    /// wgmma wrappers step K.
    fn step(d: u64, units: u64) -> u64 {
        d + units
    }

    /// The kernel's descriptors and the wrappers' K steps (in 16-byte
    /// units, `ptx::wgmma`) address every operand element where the tiles
    /// hold it, for D = 128 (validated on the H200) and D = 64: S = q K^T
    /// (both K-major, K = D), dQ = dS K (dS K-major, K MN-major, K =
    /// slots), dK = dS^T q (both MN-major, K = heads). D = 64 uses one
    /// column block (`SPLIT`: one warpgroup per product, block 0).
    #[test]
    fn descriptors_address_the_tiles_for_both_head_dims() {
        const S_STEPS_128: [u64; 8] = [0, 2, 4, 6, 512, 514, 516, 518];
        // (Also the K-major A steps of dQ: 32 bytes each.)
        const S_STEPS_64: [u64; 4] = [0, 2, 4, 6];
        const MN_STEPS: [u64; 4] = [0, 128, 256, 384];
        for (dim, l, s_steps) in [
            (128u32, SMEM, &S_STEPS_128[..]),
            (64, SMEM_D64, &S_STEPS_64[..]),
        ] {
            assert_eq!(s_steps.len() as u32 * MMA_K, dim);
            // Row kernel base 0 and a second, 1024-aligned one.
            for base in [0u32, 3 * 1024] {
                let (q, k, ds) = (
                    base + l.q + q_bytes(dim),
                    base + l.k + k_bytes(dim),
                    base + l.ds,
                );
                // Column blocks per warpgroup: D = 128 one each; D = 64
                // block 0 for the one that computes.
                let blocks: &[u32] = if dim == 128 { &[0, 1] } else { &[0] };
                for wg in 0..WARPGROUPS {
                    // S: q (heads x D) against this warpgroup's 32 slots.
                    let da = desc(q, 16, ATOM_BYTES);
                    let db = desc(k + wg * 32 * ROW_BYTES, 16, ATOM_BYTES);
                    for (st, &u) in s_steps.iter().enumerate() {
                        let kk = st as u32 * MMA_K;
                        for e in 0..MMA_K {
                            for h in 0..HEADS {
                                assert_eq!(
                                    k_major(step(da, u), h, e),
                                    tile(q, Q_BLOCK, h, kk + e),
                                    "S A D={dim} h={h} d={}",
                                    kk + e
                                );
                            }
                            for s in 0..32 {
                                assert_eq!(
                                    k_major(step(db, u), s, e),
                                    tile(k, K_BLOCK, 32 * wg + s, kk + e),
                                    "S B D={dim} slot={s}"
                                );
                            }
                        }
                    }
                }
                for &blk in blocks {
                    // dQ: A = dS (heads x slots) K-major, B = K MN-major.
                    let da = desc(ds, 16, ATOM_BYTES);
                    let db = desc(k + blk * K_BLOCK, K_BLOCK, ATOM_BYTES);
                    // dK: A = dS MN-major (slots along M), B = q MN-major.
                    let ka = desc(ds, K_BLOCK, ATOM_BYTES);
                    let kb = desc(q + blk * Q_BLOCK, Q_BLOCK, ATOM_BYTES);
                    for (st, &u) in MN_STEPS.iter().enumerate() {
                        let kk = st as u32 * MMA_K;
                        for e in 0..MMA_K {
                            for n in 0..64 {
                                let col = 64 * blk + n;
                                assert_eq!(
                                    k_major(step(da, S_STEPS_64[st]), n, e),
                                    tile(ds, K_BLOCK, n, kk + e),
                                    "dQ A"
                                );
                                assert_eq!(
                                    mn_major(step(db, u), e, col - 64 * blk),
                                    tile(k, K_BLOCK, kk + e, col),
                                    "dQ B D={dim} slot={} col={col}",
                                    kk + e
                                );
                                assert_eq!(
                                    mn_major(step(ka, u), e, n),
                                    tile(ds, K_BLOCK, kk + e, n),
                                    "dK A"
                                );
                                assert_eq!(
                                    mn_major(step(kb, u), e, col - 64 * blk),
                                    tile(q, Q_BLOCK, kk + e, col),
                                    "dK B D={dim} head={} col={col}",
                                    kk + e
                                );
                            }
                        }
                    }
                }
                // Every product stays inside its tiles: the last K step's
                // last row ends inside q / the K buffer.
                assert!(tile(q, Q_BLOCK, HEADS - 1, dim - 1) < q + q_bytes(dim));
                assert!(tile(k, K_BLOCK, CHUNK - 1, dim - 1) < k + k_bytes(dim));
            }
        }
    }

    #[test]
    fn d64_layout_is_half_as_wide_and_fits_two_ctas() {
        let (l, w) = (SMEM_D64, SMEM);
        let offs = [
            l.q, l.k, l.ds, l.dk, l.gs, l.rows, l.ids, l.red_rows, l.w, l.red, l.used,
        ];
        assert!(offs.windows(2).all(|p| p[0] < p[1]), "{l:?}");
        assert!(offs.iter().all(|o| o.is_multiple_of(16)), "{l:?}");
        // One swizzle block per q tile and K buffer; two of each.
        assert_eq!(
            (l.q, l.k, l.ds),
            (0, 2 * Q_BLOCK, 2 * Q_BLOCK + 2 * K_BLOCK)
        );
        assert_eq!(l.k - l.q, (w.k - w.q) / 2);
        assert_eq!(l.dk - l.ds, HEADS * CHUNK * 2);
        // Staged dK rows of 64 + 8 f32.
        assert_eq!(l.gs - l.dk, CHUNK * 72 * 4);
        // Slot data, weights and partials as for D = 128.
        assert_eq!(l.used - l.gs, w.used - w.gs);
        assert_eq!((l.used, l.bytes), (64_256, 65_280));
        assert!(CTAS_PER_SM * (l.bytes + SMEM_RESERVED_PER_CTA) <= SMEM_PER_SM);
        // The kernels of each dimension.
        let (a, b) = (wg_row(64, 128).unwrap(), wg_row(64, 64).unwrap());
        assert_eq!(
            (a.kernel, a.smem, a.paired),
            (crate::registry::SM90_WG.name, SMEM, true)
        );
        assert_eq!(
            (b.kernel, b.smem, b.paired),
            (crate::registry::SM90_WG_D64.name, SMEM_D64, false)
        );
        for r in [a, b] {
            assert_eq!(
                (r.threads, r.bytes, r.ctas_per_sm),
                (THREADS, r.smem.bytes, CTAS_PER_SM)
            );
        }
        assert_eq!(a.stage1, crate::registry::STAGE1.name);
        assert_eq!(b.stage1, "indexer_score_grad_d64");
        assert!(wg_row(64, 96).is_none() && wg_row(64, 256).is_none());
        assert_eq!(DIMS, [128, 64]);
    }

    #[test]
    fn other_heads_take_their_dimension_s_layout_and_stage1_without_pairs() {
        let (s1, s1_d64) = (
            crate::registry::STAGE1.name,
            crate::registry::STAGE1_D64.name,
        );
        for (h, name, name_d64) in [
            (32, "indexer_bwd_wg_h32_d128", "indexer_bwd_wg_h32_d64"),
            (16, "indexer_bwd_wg_h16_d128", "indexer_bwd_wg_h16_d64"),
        ] {
            for (d, name, smem, stage1) in [(128, name, SMEM, s1), (64, name_d64, SMEM_D64, s1_d64)]
            {
                let r = wg_row(h, d).unwrap();
                assert_eq!(r.kernel, name);
                assert_eq!(r.smem, smem, "the M = 64 tile, padded");
                assert_eq!(r.stage1, stage1);
                assert_eq!(
                    (r.threads, r.bytes, r.ctas_per_sm),
                    (THREADS, smem.bytes, CTAS_PER_SM)
                );
                assert!(!r.paired);
            }
        }
        assert_eq!(crate::registry::SM90_WG_H32.name, "indexer_bwd_wg_h32_d128");
        assert_eq!(crate::registry::SM90_WG_H16.name, "indexer_bwd_wg_h16_d128");
        // H = 128: the paired layout and launch shape, one CTA per SM.
        let r = wg_row(128, 128).unwrap();
        assert_eq!(r.kernel, "indexer_bwd_wg_h128_d128");
        assert_eq!((r.smem, r.stage1), (SMEM, crate::registry::STAGE1.name));
        assert_eq!(
            (r.threads, r.bytes, r.ctas_per_sm),
            (PAIR.threads, PAIR.bytes, 1)
        );
        assert!(!r.paired);
        assert_eq!(r.grid(5, 132), 5);
        assert_eq!(r.grid(1000, 132), 132);
        let r = wg_row(128, 64).unwrap();
        assert_eq!(r.kernel, "indexer_bwd_wg_h128_d64");
        assert_eq!(
            (r.smem, r.stage1),
            (SMEM_D64, crate::registry::STAGE1_D64.name)
        );
        assert_eq!(
            (r.threads, r.bytes, r.ctas_per_sm),
            (PAIR_D64.threads, PAIR_D64.bytes, 1)
        );
        // Two copies of the D = 64 layout, each 1024-aligned.
        assert_eq!(PAIR_D64.half_stride, 64_512);
        assert_eq!(PAIR_D64.bytes, 2 * 64_512 + ALIGN_SLACK);
        assert!(wg_row(128, 96).is_none());
        for h in [8, 48, 256] {
            assert!(wg_row(h, 128).is_none(), "H = {h}");
        }
    }

    #[test]
    fn layout_is_ordered_aligned_and_fits_two_ctas() {
        let l = SMEM;
        let offs = [
            l.q, l.k, l.ds, l.dk, l.gs, l.rows, l.ids, l.red_rows, l.w, l.red, l.used,
        ];
        assert!(offs.windows(2).all(|p| p[0] < p[1]), "{l:?}");
        assert!(offs.iter().all(|o| o.is_multiple_of(16)), "{l:?}");
        assert_eq!(l.k - l.q, 2 * HEADS * DIM * 2);
        assert_eq!(l.ds - l.k, 2 * CHUNK * DIM * 2);
        assert_eq!(l.bytes, l.used + 1024);
        assert!(CTAS_PER_SM * (l.bytes + SMEM_RESERVED_PER_CTA) <= SMEM_PER_SM);
    }
}
