//! The kernel/host contract: the `#[repr(C)]` parameter structs, their flag
//! bits, and the launch constants (threads, dynamic shared memory, grids)
//! that both sides compute with, so the two cannot drift apart. Which
//! kernels exist, under which names and in which PTX, is
//! [`crate::registry`].
//!
//! Device pointers travel as `u64` so the structs are plain data on both
//! sides; the host fills them from `CUdeviceptr`s after validation.
//!
//! This module uses no other module of the crate (every other one may use
//! it).

/// Flag bit in [`GradParams::flags`]: ids are local to their batch
/// (`0 <= id < S_k`, the kernel adds `b * S_k`); otherwise global.
pub const FLAG_LOCAL_IDS: u32 = 1 << 0;
/// Flag bit: `index_score` holds log-probabilities rather than probabilities.
pub const FLAG_LOG_SCORE: u32 = 1 << 1;
/// Flag bit: `d_weights` is written as f32 rather than bf16.
pub const FLAG_DW_F32: u32 = 1 << 2;
/// Flag bit (Hopper fast path only): the stage-1 kernel also
/// writes, for each query row, the number of [`ROW_CHUNK_SLOTS`]-slot chunks
/// up to and including the last one holding a valid slot, as a `u16` over
/// the first two bytes of that row's `d_weights` block
/// ([`GradParams::heads`] elements, at least 16).
/// The stage-2 kernel reads it after `griddepcontrol.wait`, skips the
/// row's trailing all-padding chunks (their gradients are exactly zero),
/// and overwrites it with the row's d_weights.
pub const FLAG_ROW_CHUNKS: u32 = 1 << 3;
/// Flag bit (Hopper fast path only): the row kernel runs after the paired
/// kernel (`registry::SM90_WG_PAIR`) in the same execute and exits at once
/// when the dispatch test (`sm90::bwd::pair_sample`) chose the paired kernel;
/// the paired kernel exits when it did not. Exactly one of them computes
/// the gradients.
pub const FLAG_PAIR_DISPATCH: u32 = 1 << 4;
/// Flag bit: `topk_indices` holds i64 ids (`torch.topk`'s type) rather
/// than i32, 8-byte aligned (host-checked). The kernels read each id as
/// an i64 and narrow it with `score::narrow_id`: anything outside
/// `0..=i32::MAX` becomes -1, so an id such as `2^32 + 5` stays padding
/// and is never truncated into a valid row.
pub const FLAG_IDS_I64: u32 = 1 << 5;
/// Flag bit in [`FwdParams::flags`]: dense mode's forward (the columns of
/// row `r` are its keys `key_start[r] + j` for `j < visible[r]`, written as
/// raw logits, 0 past them); otherwise sparse (ids in `topk_indices`, the
/// row's softmax written, as probabilities or, with [`FLAG_LOG_SCORE`],
/// log-probabilities).
pub const FLAG_FWD_DENSE: u32 = 1 << 7;
/// Slots per chunk of the count [`FLAG_ROW_CHUNKS`] asks for (the wgmma
/// kernel's chunk).
pub const ROW_CHUNK_SLOTS: u32 = 64;
/// The fewest heads whose `d_weights` row block carries that count (16
/// bf16 elements: 32 bytes, room for the `u16`).
pub const ROW_CHUNK_MIN_HEADS: u32 = 16;
/// Largest topk whose chunk count fits the `u16`.
pub const ROW_CHUNK_MAX_TOPK: u32 = u16::MAX as u32 * ROW_CHUNK_SLOTS;

/// Byte offset in `d_weights` of the chunk count of query row `row`
/// ([`FLAG_ROW_CHUNKS`]): the start of the row's block of `heads`
/// elements, f32 or bf16 by [`FLAG_DW_F32`] in `flags`. The one
/// definition stage 1 (writer, `heads` from [`GradParams::heads`]) and the
/// wgmma kernels (readers, their compile-time heads) share.
pub const fn row_chunks_at(row: u32, heads: u32, flags: u32) -> usize {
    let elem = if flags & FLAG_DW_F32 != 0 { 4 } else { 2 };
    row as usize * heads as usize * elem
}

/// Parameters of the fused row kernel (score gradient + gradients), one CTA
/// per query row `(b, s)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GradParams {
    /// `index_q`, bf16 `(B, S_q, H, D)`, 16-byte aligned.
    pub index_q: u64,
    /// `weights`, bf16 `(B, S_q, H)`.
    pub weights: u64,
    /// `index_k`, bf16 `(B, S_k, D)`, 16-byte aligned.
    pub index_k: u64,
    /// `attn_score`, f32 `(B, S_q, topk)`: read as target, overwritten with grad_signal.
    pub attn_score: u64,
    /// `index_score`, f32 `(B, S_q, topk)`: read only.
    pub index_score: u64,
    /// `topk_indices`, i32 `(B, S_q, topk)`, or i64 with [`FLAG_IDS_I64`]
    /// (then 8-byte aligned).
    pub topk_indices: u64,
    /// `grad_loss`, one f32 on the device, read at run time.
    pub grad_loss: u64,
    /// `d_index_q`, bf16 `(B, S_q, H, D)`, 4-byte aligned.
    pub d_index_q: u64,
    /// `d_weights`, bf16 or f32 (see [`FLAG_DW_F32`]) `(B, S_q, H)`.
    pub d_weights: u64,
    /// f32 `(B, S_k, D)` accumulator for `d_index_k`, zeroed before the launch.
    pub dk_accum: u64,
    /// Batch size B.
    pub batch: u32,
    /// Query rows per batch S_q.
    pub seq_q: u32,
    /// Key rows per batch S_k.
    pub seq_k: u32,
    /// Slots per query row.
    pub topk: u32,
    /// Softmax scale applied to `q . k`.
    pub sm_scale: f32,
    /// `loss_coeff / (B * S_q)`; the kernel multiplies by `grad_loss[0]`.
    pub coeff: f32,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// Heads H of `index_q`, `weights` and `d_weights` (the kernels built
    /// for one H do not read it; stage 1, which serves every H, finds each
    /// row's `d_weights` block with it for [`FLAG_ROW_CHUNKS`]).
    pub heads: u32,
}

/// Parameters of the forward kernels (`portable::forward`, `sm90::forward`): one CTA per query row.
/// Flags: [`FLAG_LOCAL_IDS`], [`FLAG_IDS_I64`], [`FLAG_LOG_SCORE`] (sparse
/// output as log-probabilities), [`FLAG_FWD_DENSE`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FwdParams {
    /// `index_q`, bf16 `(rows, H, D)`, 16-byte aligned.
    pub index_q: u64,
    /// `weights`, bf16 `(rows, H)`.
    pub weights: u64,
    /// `index_k`, bf16 `(key rows, D)`, 16-byte aligned.
    pub index_k: u64,
    /// Sparse: `topk_indices`, i32 or i64 ([`FLAG_IDS_I64`], then 8-byte
    /// aligned) `(rows, cols)`. Dense: unused (0).
    pub topk_indices: u64,
    /// Dense: u32 `(rows,)`, each row's visible key count (`<= cols`).
    pub visible: u64,
    /// Dense: u32 `(rows,)`, the key row of each row's column 0.
    pub key_start: u64,
    /// f32 `(rows, cols)`, written: probabilities, log-probabilities or
    /// (dense) raw logits.
    pub score: u64,
    /// f32 `(rows,)`, written: each row's log-sum-exp over its valid slots
    /// (`-inf` for a row with none).
    pub lse: u64,
    /// Query rows (the grid), `B * S_q`.
    pub rows: u32,
    /// Query rows per batch (sparse: the batch of a row for local ids).
    pub seq_q: u32,
    /// Key rows per batch.
    pub seq_k: u32,
    /// Slots (sparse: topk) or columns (dense) per row.
    pub cols: u32,
    /// Batch size B (sparse: global ids are valid below `B * S_k`).
    pub batch: u32,
    /// Scale applied to `q . k`.
    pub sm_scale: f32,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// Keeps the struct a multiple of 8 bytes on both sides.
    pub _pad: u32,
}

/// Parameters of the dense mode's stage-1 kernel
/// (`indexer_dense_score_grad`): the dense score gradient of one query row
/// per CTA, written over `index_score`, the zeroing of the f32 dK
/// accumulator and, with [`FLAG_ROW_CHUNKS`], each row's chunk count for
/// the wgmma kernel that follows.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DenseParams {
    /// `attn_score`, f32 `(rows, cols)`: attention mass, read only.
    pub attn_score: u64,
    /// `attn_l1norm`, f32 `(rows,)`.
    pub attn_l1norm: u64,
    /// `index_score`, f32 `(rows, cols)`: raw logits in, grad_signal out
    /// (0 at the columns a row does not see).
    pub index_score: u64,
    /// `index_lse`, f32 `(rows,)`.
    pub index_lse: u64,
    /// `grad_loss`, one f32 on the device.
    pub grad_loss: u64,
    /// u32 `(rows,)`: the visible key count `L` of each row (`<= cols`),
    /// computed by the plan.
    pub visible: u64,
    /// `d_weights` (the chunk counts go over its row blocks, as in
    /// [`GradParams`]).
    pub d_weights: u64,
    /// The f32 dK accumulator to zero, 16-byte aligned.
    pub dk_accum: u64,
    /// f32 elements of the accumulator (a multiple of 4).
    pub dk_len: u64,
    /// Query rows (the grid).
    pub rows: u32,
    /// Columns per row of the score tensors.
    pub cols: u32,
    /// `loss_coeff / rows`; the kernel multiplies by `grad_loss[0]`.
    pub coeff: f32,
    /// [`FLAG_ROW_CHUNKS`] and [`FLAG_DW_F32`] as in [`GradParams::flags`].
    pub flags: u32,
    /// Heads H (the d_weights row block of the chunk count).
    pub heads: u32,
    /// Keeps the struct a multiple of 8 bytes on both sides.
    pub _pad: u32,
}

/// Parameter of dense mode's tile kernel (`indexer_dense_bwd_wg_h64_d128`):
/// stage 2 over whole key tiles, after dense stage 1 wrote grad_signal
/// over `index_score`. Its grid is one CTA per work item (`items`). The
/// tensor maps come first, at the offsets of [`Sm100Params`]
/// (`SM100_K_MAP_OFFSET`, `SM100_Q_MAP_OFFSET`), and are passed the same
/// way ([`TensorMap`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DenseTileParams {
    /// Tile map over `index_k` as `(key rows, 128)` bf16, box 64 x 64,
    /// 128-byte swizzle, zero fill (`tma::q_tile_map` with 64
    /// rows): one box is one swizzle block of a K tile.
    pub k_map: TensorMap,
    /// Tile map over `index_q` as `(rows * 64, 128)` bf16, the same box:
    /// one box is one swizzle block of a row's q tile.
    pub q_map: TensorMap,
    /// `index_q`, bf16 `(rows, 64, 128)`, 16-byte aligned.
    pub index_q: u64,
    /// `weights`, bf16 `(rows, 64)`.
    pub weights: u64,
    /// `index_k`, bf16 `(key rows, 128)`, 16-byte aligned.
    pub index_k: u64,
    /// grad_signal, f32 `(rows, cols)` (dense stage 1's output, written
    /// over `index_score`): 0 at the columns a row does not see.
    pub grad_signal: u64,
    /// u32 `(rows,)`: each row's visible key count `L` (`<= cols`).
    pub visible: u64,
    /// The work items, [`DENSE_ITEM_WORDS`] u32 each (`DenseItem`).
    pub items: u64,
    /// `d_index_q`, bf16 `(rows, 64, 128)`.
    pub d_index_q: u64,
    /// `d_weights`, bf16 or f32 ([`FLAG_DW_F32`]) `(rows, 64)`.
    pub d_weights: u64,
    /// The f32 dK accumulator `(key rows, 128)`, 16-byte aligned, zeroed
    /// by dense stage 1: each key item adds its sums once.
    pub dk_accum: u64,
    /// Items (the grid).
    pub n_items: u32,
    /// Columns per row of grad_signal.
    pub cols: u32,
    /// `sm_scale`.
    pub sm_scale: f32,
    /// [`FLAG_DW_F32`].
    pub flags: u32,
}

/// Parameter of dense mode's deterministic tile kernel
/// (`indexer_dense_bwd_wg_det_h64_d128`): the tile kernel's parameter
/// (first, so that its tensor maps stay at the same offsets) and the
/// turn table (`sm90::dense::turns`): u32 word 0 hands out the work items in
/// arrival order, word `1 + c` counts the key items of chain `c` that
/// added their dK sums. Zeroed before dense stage 1.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DenseDetTileParams {
    /// The tile kernel's parameter.
    pub tile: DenseTileParams,
    /// The turn table, `1 + chains` u32 (4-byte aligned).
    pub turns: u64,
}

/// u32 words per work item of the dense tile kernel.
pub const DENSE_ITEM_WORDS: usize = 8;
/// Item kind (word 0) of a row item: `[ROWS, row0, nrows, key_start,
/// tiles, 0, 0, 0]`: query rows `row0..row0 + nrows` (`nrows` 1 or 2, one
/// batch), whose keys start at key row `key_start`; `tiles` key tiles of 64
/// cover the longest row's visible keys. It writes the rows' dQ and dW.
pub const DENSE_ITEM_ROWS: u32 = 0;
/// Item kind (word 0) of a key item: `[KEYS, key_start, col0, nkeys,
/// row_begin, row_end, chain, turn]`: keys `col0..col0 + nkeys` (`nkeys <= 128`)
/// of the batch whose key 0 is key row `key_start`, against the query rows
/// `row_begin..row_end` of that batch (a run of at most
/// `sm90::dense::ITEM_MAX_ROWS` of the rows that see one of them). It adds
/// the keys' dK sums over those rows to the accumulator, once. The runs
/// of one 128-key tile form two chains (`chain`, `chain + 1`: its first and
/// its second 64 keys) in which the run starting at the batch's first
/// seeing row takes turn 0, the next turn 1, and so on; the
/// deterministic twin adds a run's sums only after the turns before it
/// (the default kernel ignores both words).
pub const DENSE_ITEM_KEYS: u32 = 1;
/// Threads per CTA of the dense tile kernel: two consumer warpgroups and
/// a producer warpgroup (one warp of which loads; the others only give
/// their registers to the consumers).
pub const DENSE_TILE_THREADS: u32 = 384;

/// Threads per CTA of the dense stage-1 kernel (one query row per CTA).
pub const DENSE_STAGE1_THREADS: u32 = 256;
/// Its dynamic shared memory: one f32 partial of `G` per warp.
pub const DENSE_STAGE1_SMEM: u32 = DENSE_STAGE1_THREADS / 32 * 4;

/// Parameters of the f32 -> bf16 cast of the `d_index_k` accumulator.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CastParams {
    /// f32 source, 16-byte aligned.
    pub src: u64,
    /// bf16 destination, 8-byte aligned.
    pub dst: u64,
    /// Number of elements.
    pub len: u64,
}

/// Parameters of the deterministic mode's kernels (`det`): the
/// deterministic twins of the wgmma kernels and the passes around them.
/// `grad` is the call's, with `dk_accum` pointing at the i32 fixed-point
/// accumulator ([`DetLayout::acc`]) instead of an f32 one; the other
/// pointers are the tables of [`DetLayout`] in the workspace and the
/// output.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DetParams {
    /// The gradient kernels' parameters.
    pub grad: GradParams,
    /// u64 per key row: the sum of its slots' quantized bounds.
    pub key_sum: u64,
    /// One u32: the largest slot bound's f32 bits (over the call).
    pub bound_max: u64,
    /// u32 per four elements of the accumulator: one byte of
    /// non-finite flags (`det::POS_INF`, `NEG_INF`, `NAN`) per element.
    pub specials: u64,
    /// i32 per key row: the fixed-point exponent of its accumulator row.
    pub key_exp: u64,
    /// f32 per query row: the row's bound factor (`det::row_factor`).
    pub row_bound: u64,
    /// `d_index_k`, f32 or bf16 ([`DetParams::out_bf16`]) `(B, S_k, D)`,
    /// 8-byte aligned: written by `det_finish` only.
    pub d_index_k: u64,
    /// `det_key_sums`: query rows per CTA ([`crate::det::KeySumGrid`]).
    pub rows: u32,
    /// 1: `d_index_k` is bf16, 0: f32.
    pub out_bf16: u32,
    /// Head dimension D.
    pub dim: u32,
    /// `det_key_sums`: key rows per window (the bins of one CTA).
    pub window: u32,
}

/// Threads per CTA of the deterministic mode's passes (`det_bounds`: one
/// query row per CTA; `det_scales`, `det_finish`: grid-stride; not
/// `det_key_sums`, [`DET_KEY_SUM_THREADS`]).
pub const DET_THREADS: u32 = 128;
/// Threads per CTA of `det_key_sums` (many rows per CTA, see
/// `det::KeySumGrid`).
pub const DET_KEY_SUM_THREADS: u32 = 512;
/// CTAs of the grid-stride passes (`det_scales`, `det_finish`) per SM.
pub const DET_CTAS_PER_SM: u32 = 8;

/// Byte offsets of the deterministic mode's tables in the workspace
/// (each 16-byte aligned). Stage 1 zeroes `acc` (as it zeroes the f32
/// accumulator of the default mode); `key_sum .. key_exp` is zeroed by a
/// memset before the passes; `key_exp` and `row_bound` are written whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DetLayout {
    /// i32 `(B*S_k, D)`: the fixed-point accumulator, two elements per u64
    /// word (`det::pack_pair`).
    pub acc: u64,
    /// u64 per key row.
    pub key_sum: u64,
    /// One u32.
    pub bound_max: u64,
    /// u8 per accumulator element.
    pub specials: u64,
    /// i32 per key row.
    pub key_exp: u64,
    /// f32 per query row.
    pub row_bound: u64,
    /// Total bytes.
    pub bytes: u64,
}

/// [`DetLayout`] for `key_rows` (B*S_k) rows of `dim` elements and `rows`
/// (B*S_q) query rows.
pub const fn det_layout(key_rows: u64, rows: u64, dim: u64) -> DetLayout {
    const fn up(x: u64) -> u64 {
        x.div_ceil(16) * 16
    }
    let elems = key_rows * dim;
    let acc = 0;
    let key_sum = acc + up(4 * elems);
    let bound_max = key_sum + up(8 * key_rows);
    let specials = bound_max + 16;
    let key_exp = specials + up(elems);
    let row_bound = key_exp + up(4 * key_rows);
    let bytes = row_bound + up(4 * rows);
    DetLayout {
        acc,
        key_sum,
        bound_max,
        specials,
        key_exp,
        row_bound,
        bytes,
    }
}

/// Parameters of the toolchain smoke kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SmokeParams {
    /// u32 input, `len` elements.
    pub input: u64,
    /// u32 output, `len` elements.
    pub output: u64,
    /// Number of elements; a multiple of [`SMOKE_THREADS`].
    pub len: u32,
    /// Keeps the struct a multiple of 8 bytes.
    pub _pad: u32,
}

/// Parameters of the ceiling kernels (`ceil_*`), see `kernels-gpu/src/lab/ceil.rs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CeilParams {
    /// Destination / accumulator buffer.
    pub a: u64,
    /// Source buffer.
    pub b: u64,
    /// i32 row ids (scatter, gather).
    pub idx: u64,
    /// Element count: row ids, or 16-byte vectors for the copy.
    pub n: u64,
    /// Loop iterations (MMA throughput); mode bits of the gather-reduce
    /// ceiling.
    pub iters: u32,
    /// Keeps the struct a multiple of 8 bytes.
    pub _pad: u32,
}

/// Row length, in elements, of the scatter and gather ceilings (the D of
/// the SPEC workload).
pub const CEIL_ROW: u32 = 128;
/// `CeilParams::iters` bit of [`crate::registry::CEIL_GATHER_REDUCE`]: gather the K rows.
pub const CEIL_MIX_GATHER: u32 = 1;
/// `CeilParams::iters` bit of [`crate::registry::CEIL_GATHER_REDUCE`]: reduce the dK rows.
pub const CEIL_MIX_REDUCE: u32 = 2;
/// `CeilParams::iters` bit of [`crate::registry::CEIL_GATHER_STREAM`]: the
/// rows by TMA (one 64-column box per row half, mbarrier per stage), else
/// by 16-byte `cp.async`.
pub const CEIL_STREAM_TMA: u32 = 1;
/// `CeilParams::iters` bit of [`crate::registry::CEIL_GATHER_STREAM`]
/// (`cp.async` only): `fence.proxy.async` after each stage's wait, as a
/// kernel whose `wgmma` reads the rows needs.
pub const CEIL_STREAM_FENCE: u32 = 2;
/// Stages of [`crate::registry::CEIL_GATHER_STREAM`]'s ring: 64 rows of
/// `CEIL_ROW` bf16 each (16 KiB, two 64-column swizzle blocks).
pub const CEIL_STREAM_STAGES: u32 = 4;
/// Rows per stage of [`crate::registry::CEIL_GATHER_STREAM`].
pub const CEIL_STREAM_ROWS: u32 = 64;
/// Threads of [`crate::registry::CEIL_GATHER_STREAM`].
pub const CEIL_STREAM_THREADS: u32 = 128;
/// Most chunks of 64 rows one CTA of [`crate::registry::CEIL_GATHER_STREAM`]
/// takes: their row ids are copied into shared memory before the walk,
/// so that no row waits for its id's load.
pub const CEIL_STREAM_MAX_CHUNKS: u32 = 64;
/// Dynamic shared memory of [`crate::registry::CEIL_GATHER_STREAM`]: the
/// ring, its mbarriers, the row ids, the 1024-byte alignment slack.
pub const CEIL_STREAM_SMEM: u32 = CEIL_STREAM_STAGES * CEIL_STREAM_ROWS * CEIL_ROW * 2
    + 64
    + CEIL_STREAM_MAX_CHUNKS * CEIL_STREAM_ROWS * 4
    + 1024;
/// Bytes at the start of `CeilParams::a` of
/// [`crate::registry::CEIL_GATHER_STREAM`] holding the TMA map over `b`
/// (64-byte aligned); the threads' checksums follow.
pub const CEIL_STREAM_MAP_BYTES: u32 = 128;
/// Threads per CTA of the bulk scatter ceiling (each stages one row).
pub const CEIL_BULK_THREADS: u32 = 64;
/// Dynamic shared memory of the bulk scatter ceiling.
pub const CEIL_BULK_SMEM_BYTES: u32 = CEIL_BULK_THREADS * CEIL_ROW * 4;
/// Independent MMA chains per warp in the MMA ceiling kernel.
pub const CEIL_MMA_CHAINS: u32 = 8;

/// Parameters of the sm_100f tcgen05 smoke kernel (compiled and assembled
/// for sm_100f, not executed): `out = a * b^T` for a 128 x 16 bf16 `a` and a
/// 64 x 16 bf16 `b` (both row-major), f32 `out` 128 x 64, from tiles in the
/// no-swizzle canonical layout. When `tmap` is non-zero, rows 0..4 of the
/// map are also fetched into shared memory with one TMA gather4 (which
/// exercises the wrapper; the MMA does not read them).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sm100SmokeParams {
    /// bf16 128 x 16.
    pub a: u64,
    /// bf16 64 x 16.
    pub b: u64,
    /// f32 128 x 64.
    pub out: u64,
    /// Optional `CUtensorMap` (global memory) with box 16 x 1, or 0.
    pub tmap: u64,
}

/// Threads of the one CTA of the sm_100f smoke kernel (four warps: one per
/// tensor-memory sub-partition of its M = 128 accumulator).
pub const SM100_SMOKE_THREADS: u32 = 128;
/// Dynamic shared memory of the sm_100f smoke kernel: barriers and the
/// tensor-memory slot (1024 bytes), A (128 x 16 bf16), B (64 x 16 bf16),
/// the gather4 destination (4 x 16 bf16).
pub const SM100_SMOKE_SMEM: u32 = 1024 + (128 + 64 + 4) * 16 * 2;

/// Parameters of the sm_100f bring-up probes (`sm100_probe_*`, one CTA of
/// [`SM100_PROBE_THREADS`]; compiled and assembled for sm_100f, not
/// executed): one GEMM of a stage-2 chunk, from operands staged in shared
/// memory where stage 2 keeps them, with stage 2's instruction and
/// shared-memory descriptors, read back with its tensor-memory lane
/// mapping (`kernels-gpu/src/sm100/probe.rs`). The tensor maps come first,
/// at the offsets of [`Sm100Params`] (`SM100_K_MAP_OFFSET`,
/// `SM100_Q_MAP_OFFSET`), and are passed the same way.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sm100ProbeParams {
    /// Gather4 map over `k` as stage 2 encodes it (box 64 x 1, 128-byte
    /// swizzle); read when [`PROBE_K_GATHER4`] is set.
    pub k_map: TensorMap,
    /// Tile map over `q` as stage 2 encodes it (box 64 x
    /// [`SM100_PROBE_HEADS`], 128-byte swizzle); read when [`PROBE_Q_TMA`]
    /// is set.
    pub q_map: TensorMap,
    /// bf16 `SM100_PROBE_HEADS x 128` (`[head][d]`), 16-byte aligned.
    pub q: u64,
    /// bf16 key rows, 128 columns each, 16-byte aligned.
    pub k: u64,
    /// i32, 128: slot `t` of the K stage holds key row `ids[t]` (valid rows).
    pub ids: u64,
    /// bf16 `SM100_PROBE_HEADS x 128` (`[head][slot]`), 4-byte aligned.
    pub ds: u64,
    /// f32 `M x 128`, row-major (M = 64 for S and dQ, 128 for dK): the
    /// accumulator as stage 2 reads it (`sm100::tmem` lane mapping).
    pub out: u64,
    /// f32 `128 x 128`: tensor-memory lane `l`, accumulator column `c` at
    /// `l * 128 + c`, every lane, as `tcgen05.ld.32x32b` returns it (before
    /// the MMA, the kernel fills these cells with [`SM100_PROBE_TMEM_FILL`]).
    pub lanes: u64,
    /// u32 x [`PROBE_STATUS_WORDS`] in host-mapped memory (the device
    /// address of a mapped pinned allocation), zeroed by the host: word
    /// [`PROBE_STATUS_TMA`] becomes 1 when the TMA loads did not complete
    /// within the probe's limit (one second), word [`PROBE_STATUS_MMA`]
    /// when the MMA commit did not arrive within two. The probe then traps
    /// (the launch fails and the context is lost), so the host reads the
    /// words from its own mapping after the failed synchronization.
    pub status: u64,
    /// `PROBE_*` bits.
    pub flags: u32,
    /// Keeps the struct a multiple of 8 bytes.
    pub _pad: u32,
}

/// Words of [`Sm100ProbeParams::status`].
pub const PROBE_STATUS_WORDS: usize = 2;
/// See [`Sm100ProbeParams::status`].
pub const PROBE_STATUS_TMA: usize = 0;
/// See [`Sm100ProbeParams::status`].
pub const PROBE_STATUS_MMA: usize = 1;

/// [`Sm100ProbeParams::flags`] bit: the K stage is filled by stage 2's
/// `tile::gather4` loads through `k_map` (else by shared-memory stores at
/// `sm100::operands::k_at`).
pub const PROBE_K_GATHER4: u32 = 1 << 0;
/// [`Sm100ProbeParams::flags`] bit: the q buffer is filled by stage 2's TMA
/// tile loads through `q_map` (else by stores at `sm100::operands::q_at`).
pub const PROBE_Q_TMA: u32 = 1 << 1;

/// Threads of a probe CTA: one warp per tensor-memory sub-partition.
pub const SM100_PROBE_THREADS: u32 = 128;
/// Heads of the probes' q and dS (the full M = 64 tile, so dK takes
/// `64 / 16` K steps).
pub const SM100_PROBE_HEADS: u32 = 64;
/// Bytes after the probes' operands (stage 2's K stage 0, q buffer 0 and dS
/// tile, at their stage-2 offsets) for two mbarriers and the tensor-memory
/// address slot.
pub const SM100_PROBE_BAR_BYTES: u32 = 32;

/// What the probes write into every accumulator cell of their sub-partition
/// before the MMA (a NaN no product of finite inputs produces), so that
/// cells the MMA leaves alone are recognisable in
/// [`Sm100ProbeParams::lanes`].
pub const SM100_PROBE_TMEM_FILL: u32 = 0x7fa5_a5a5;
// One warp per tensor-memory sub-partition; the fill is a NaN. (That the
// probes' operands are a full head tile within an sm_100 CTA's shared
// memory is asserted in `sm100::budget`.)
const _: () = assert!(SM100_PROBE_THREADS == 4 * 32);
const _: () = assert!(f32::from_bits(SM100_PROBE_TMEM_FILL).is_nan());

/// A `CUtensorMap` (the driver's opaque 128-byte tensor map, which must be
/// 64-byte aligned) passed to a kernel by value, as CUDA's
/// `__grid_constant__` parameters are: the kernel hands its parameter-space
/// address to `cp.async.bulk.tensor`.
///
/// rustc's nvptx64 kernel ABI rejects by-value parameters aligned above 16
/// bytes, so the type is 16-byte aligned here, the maps sit at multiples
/// of 64 bytes inside [`Sm100Params`], and the link step raises the
/// parameter's declared alignment to [`TENSOR_MAP_ALIGN`] in the PTX
/// (`.param .align 64`, see `xtask/src/link.rs`), which is what makes the
/// driver place it on a 64-byte boundary.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TensorMap(pub [u64; 16]);

/// Parameters of the sm_100f stage-2 kernels (`sm100_stage2_*`; compiled
/// and assembled for sm_100f, not executed). The tensor maps come first
/// (parameter offsets 0 and 128, 64-byte aligned).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sm100Params {
    /// Gather4 map over `index_k` as `(B*S_k, D)` bf16, box 64 x 1, 128-byte
    /// swizzle, zero fill (`tma::gather_map`).
    pub k_map: TensorMap,
    /// Tile map over `index_q` as `(B*S_q*H, D)` bf16, box 64 x H, 128-byte
    /// swizzle (`tma::q_tile_map`).
    pub q_map: TensorMap,
    /// Pointers, sizes and scalars, as for the row kernel; `dk_accum` is
    /// zeroed by the stage-1 kernel of the same `execute`.
    pub p: GradParams,
}

/// Alignment of a tensor map in the kernel parameter space.
pub const TENSOR_MAP_ALIGN: u32 = 64;

/// Byte offset of [`Sm100Params::k_map`] in the kernel parameter.
pub const SM100_K_MAP_OFFSET: u32 = 0;
/// Byte offset of [`Sm100Params::q_map`] in the kernel parameter.
pub const SM100_Q_MAP_OFFSET: u32 = 128;

/// Warps per stage-1 CTA.
pub const STAGE1_WARPS: u32 = 8;
/// Threads per stage-1 CTA.
pub const STAGE1_THREADS: u32 = 32 * STAGE1_WARPS;
/// Slots each stage-1 thread holds in registers per pass over a row.
pub const STAGE1_UNROLL: u32 = 8;
/// Dynamic shared memory of the stage-1 kernel: per warp, its partial of
/// the row sum G, its partial of the live-slot count from the row's last
/// slots, and its partial of the count from a full scan.
pub const STAGE1_SMEM: u32 = 3 * STAGE1_WARPS * 4;
/// Head dimension whose accumulator the stage-1 kernel zeroes.
pub const STAGE1_DIM: u32 = 128;

/// Warps that share one stage-1 row: the fewest (a power of two, at most
/// [`STAGE1_WARPS`]) whose threads hold a whole row of `topk` slots in
/// registers at [`STAGE1_UNROLL`] slots each, so each slot's scores are
/// read from memory once (longer rows make two passes).
pub const fn stage1_warps_per_row(topk: u32) -> u32 {
    let need = topk.div_ceil(32 * STAGE1_UNROLL);
    let mut w = 1;
    while w < need && w < STAGE1_WARPS {
        w *= 2;
    }
    w
}

/// Query rows per stage-1 CTA at this topk.
pub const fn stage1_rows_per_cta(topk: u32) -> u32 {
    STAGE1_WARPS / stage1_warps_per_row(topk)
}

/// Stage-1 grid for `rows` query rows of `topk` slots: one CTA per
/// [`stage1_rows_per_cta`] rows, at least one (the launch also zeroes the
/// dK accumulator).
pub const fn stage1_grid(rows: u32, topk: u32) -> u32 {
    let g = rows.div_ceil(stage1_rows_per_cta(topk));
    if g == 0 {
        1
    } else {
        g
    }
}

/// Threads per CTA of the stage-2 kernels: compute warpgroup (warps 0-3),
/// reduce warpgroup (4-7), K-load warp (8), MMA warp (9).
pub const SM100_STAGE2_THREADS: u32 = 320;

/// Head dimension of the stage-2 kernels.
pub const SM100_DIM: u32 = 128;

/// Threads per CTA of the smoke kernel.
pub const SMOKE_THREADS: u32 = 128;
/// Dynamic shared memory of the smoke kernel: one mbarrier (8 bytes, padded
/// to 16) followed by one u32 per thread.
pub const SMOKE_SMEM_BYTES: u32 = 16 + 4 * SMOKE_THREADS;

/// Threads per CTA of the cast kernel.
pub const CAST_THREADS: u32 = 256;
/// Elements each cast thread converts per step (one 16-byte load).
pub const CAST_VEC: u32 = 4;

/// Name of the watchdog's configuration in watchdog builds of the PTX
/// (`--cfg kernels_watchdog`, made by `cargo xtask gpu-bundle` for the
/// bring-up kit): a module global of type [`WatchdogConfig`] that the host
/// fills after loading the module.
pub const WATCHDOG_SYMBOL: &str = "INDEXER_WATCHDOG";

/// Threads of the watchdog probe.
pub const WATCHDOG_PROBE_THREADS: u32 = 64;
/// Dynamic shared memory of the watchdog probe (one mbarrier).
pub const WATCHDOG_PROBE_SMEM: u32 = 16;
/// [`WatchdogRecord::magic`] of a written record.
pub const WATCHDOG_MAGIC: u32 = 0x5744_4f47;
/// [`WatchdogRecord::tag`] of a wait that carries no tag.
pub const WATCHDOG_NO_TAG: u32 = u32::MAX;

/// The tag a stage-2 wait reports: barrier index (bits 24..32) and the
/// phase it waits for (bits 0..24, modulo 2^24).
pub const fn watchdog_tag(bar: u32, phase: u32) -> u32 {
    (bar << 24) | (phase & 0x00ff_ffff)
}

/// Barrier index and phase of a tag made by [`watchdog_tag`] (`None` for
/// [`WATCHDOG_NO_TAG`]).
pub const fn watchdog_untag(tag: u32) -> Option<(u32, u32)> {
    if tag == WATCHDOG_NO_TAG {
        None
    } else {
        Some((tag >> 24, tag & 0x00ff_ffff))
    }
}

/// The watchdog's configuration (module global [`WATCHDOG_SYMBOL`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchdogConfig {
    /// Device address of a host-mapped [`WatchdogRecord`] (0: none).
    pub record: u64,
    /// Nanoseconds a single mbarrier wait may take before the watchdog
    /// fires (0: waits are unbounded, as in ordinary builds).
    pub limit_ns: u64,
    /// Set by the first thread that fires (device-scope arbitration).
    pub claimed: u32,
    /// Padding.
    pub _pad: u32,
}

/// What the watchdog records before it traps: which thread gave up on
/// which barrier. Written to host-mapped memory, so it survives the trap
/// that kills the CUDA context.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchdogRecord {
    /// [`WATCHDOG_MAGIC`] once the record is complete (written last).
    pub magic: u32,
    /// `%ctaid.x`.
    pub cta: u32,
    /// `%tid.x / 32`.
    pub warp: u32,
    /// `%tid.x % 32`.
    pub lane: u32,
    /// `%smid`.
    pub sm: u32,
    /// Shared-memory offset of the barrier from the dynamic base.
    pub barrier_offset: u32,
    /// The parity waited for.
    pub parity: u32,
    /// [`watchdog_tag`] of the wait, or [`WATCHDOG_NO_TAG`].
    pub tag: u32,
    /// Microseconds waited when it fired.
    pub elapsed_us: u32,
    /// Padding to 64 bytes.
    pub _pad: [u32; 7],
}
const _: () = assert!(core::mem::size_of::<WatchdogRecord>() == 64);
const _: () = assert!(core::mem::size_of::<WatchdogConfig>() == 24);
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_chunk_counts_sit_at_the_start_of_each_d_weights_row() {
        assert_eq!(row_chunks_at(0, 64, 0), 0);
        assert_eq!(row_chunks_at(3, 64, 0), 3 * 64 * 2);
        assert_eq!(
            row_chunks_at(3, 64, FLAG_DW_F32 | FLAG_ROW_CHUNKS),
            3 * 64 * 4
        );
        assert_eq!(
            row_chunks_at(3, 64, FLAG_LOCAL_IDS),
            row_chunks_at(3, 64, 0)
        );
        assert_eq!(row_chunks_at(5, 16, 0), 5 * 32);
        assert_eq!(row_chunks_at(5, 128, FLAG_DW_F32), 5 * 512);
    }

    #[test]
    fn stage1_grid_covers_every_row_with_at_least_one_cta() {
        for topk in [
            1u32,
            64,
            128,
            256,
            257,
            512,
            1000,
            1024,
            2048,
            2049,
            1 << 20,
        ] {
            let (w, r) = (stage1_warps_per_row(topk), stage1_rows_per_cta(topk));
            assert!(w.is_power_of_two() && w <= STAGE1_WARPS, "topk {topk}");
            assert_eq!(w * r, STAGE1_WARPS);
            // A row fits one register pass whenever a whole CTA can hold it,
            // with the fewest warps that do.
            let span = 32 * w * STAGE1_UNROLL;
            if topk <= 32 * STAGE1_WARPS * STAGE1_UNROLL {
                assert!(topk <= span && (w == 1 || topk > span / 2), "topk {topk}");
            } else {
                assert_eq!(w, STAGE1_WARPS);
            }
            assert_eq!(stage1_grid(0, topk), 1);
            assert_eq!(stage1_grid(1, topk), 1);
            assert_eq!(stage1_grid(r, topk), 1);
            assert_eq!(stage1_grid(r + 1, topk), 2);
            assert!(stage1_grid(8192, topk) * r >= 8192);
            assert!((stage1_grid(8192, topk) - 1) * r < 8192);
        }
        assert_eq!(stage1_warps_per_row(2048), 8);
        assert_eq!(stage1_warps_per_row(512), 2);
        assert_eq!(stage1_warps_per_row(256), 1);
    }

    #[test]
    fn param_structs_have_the_layout_the_device_expects() {
        assert_eq!(core::mem::size_of::<GradParams>(), 10 * 8 + 8 * 4);
        assert_eq!(core::mem::size_of::<CastParams>(), 24);
        assert_eq!(core::mem::size_of::<SmokeParams>(), 24);
        assert_eq!(core::mem::size_of::<CeilParams>(), 40);
        assert_eq!(core::mem::size_of::<TensorMap>(), 128);
        assert_eq!(core::mem::align_of::<TensorMap>(), 16);
        assert_eq!(SM100_K_MAP_OFFSET % TENSOR_MAP_ALIGN, 0);
        assert_eq!(SM100_Q_MAP_OFFSET % TENSOR_MAP_ALIGN, 0);
        assert_eq!(
            core::mem::offset_of!(Sm100Params, k_map) as u32,
            SM100_K_MAP_OFFSET
        );
        assert_eq!(
            core::mem::offset_of!(Sm100Params, q_map) as u32,
            SM100_Q_MAP_OFFSET
        );
        assert_eq!(core::mem::offset_of!(Sm100Params, p), 256);
        assert_eq!(core::mem::size_of::<Sm100Params>(), 256 + 112);
        // The probes pass their maps at stage 2's offsets.
        assert_eq!(
            core::mem::offset_of!(Sm100ProbeParams, k_map) as u32,
            SM100_K_MAP_OFFSET
        );
        assert_eq!(
            core::mem::offset_of!(Sm100ProbeParams, q_map) as u32,
            SM100_Q_MAP_OFFSET
        );
        assert_eq!(core::mem::size_of::<Sm100ProbeParams>(), 256 + 7 * 8 + 8);
        assert_eq!(core::mem::size_of::<Sm100SmokeParams>(), 32);
        assert_eq!(
            core::mem::offset_of!(DenseTileParams, k_map) as u32,
            SM100_K_MAP_OFFSET
        );
        assert_eq!(
            core::mem::offset_of!(DenseTileParams, q_map) as u32,
            SM100_Q_MAP_OFFSET
        );
    }
}
