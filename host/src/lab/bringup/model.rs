//! The pure side of the MMA probes: deterministic inputs, the CPU product,
//! and a model of what a probe kernel writes under a given reading of the
//! hardware ([`Model`]): the kernels' assumptions, or one of the
//! alternatives the design doc lists as unconfirmed. The diagnosis
//! compares a real output with the model's outputs to name the reading
//! that explains it.

use super::{Gemm, ProbeSpec};
use half::bf16;
use kernels_gpu::abi::{PROBE_K_GATHER4, SM100_PROBE_HEADS, SM100_PROBE_TMEM_FILL};
use kernels_gpu::sm100::budget::{OFF_DK, OFF_DS, OFF_K, OFF_Q, SM100_CHUNK};
use kernels_gpu::sm100::desc::{kmajor_offset, model_kmajor, model_mnmajor, swizzle128};
use kernels_gpu::sm100::operands::{
    dk_descs, dk_steps, dq_descs, ds_at, gather4_dst, k_at, q_at, s_descs, DQ_STEPS, IDESC_DK,
    IDESC_DQ, IDESC_S, S_STEPS,
};
use kernels_gpu::sm100::tmem::{lane_m64, m128_row_of, m64_row_of, warp_lane_base};

/// N of every probe GEMM, and the row length of every operand.
pub const N: usize = SM100_CHUNK as usize;
/// Heads (rows of q and dS; K of dK).
pub const HEADS: usize = SM100_PROBE_HEADS as usize;
/// Tensor-memory lanes (rows of the raw dump).
pub const LANES: usize = 128;
/// Rows of the probes' key matrix: more than a chunk, so the ids can be
/// distinct and scattered, and no multiple of a tile, so gathered rows
/// come from unaligned positions of the map.
pub const KEY_ROWS: usize = 300;
/// Input values are `k / VALUE_DENOM` for `|k| <= VALUE_MAX_NUM`: exact in
/// bf16, products exact multiples of `1 / VALUE_DENOM^2`, and every sum of
/// up to 128 of them exact in f32 (far below 2^24 steps), in any order.
pub const VALUE_DENOM: f64 = 8.0;
/// See [`VALUE_DENOM`].
pub const VALUE_MAX_NUM: u64 = 8;
/// What the host writes into `out` and `lanes` before a launch: a NaN no
/// product produces, so cells the kernel never wrote are recognisable.
pub const HOST_FILL: u32 = 0x7fbb_bbbb;
/// What [`simulate`] writes for an accumulator element that reads shared
/// memory no probe wrote (the hardware would read whatever is there): a
/// wildcard when a simulated output is compared with a real one.
pub const SIM_UNDEFINED: u32 = 0x7fcc_cccc;
/// The tensor-memory fill the probe kernels write before the MMA.
pub const TMEM_FILL: u32 = SM100_PROBE_TMEM_FILL;

/// Multiplier of the slot -> key-row map `ids[t] = (ID_STRIDE t + ID_OFFSET)
/// % KEY_ROWS` (coprime to `KEY_ROWS`, so the ids are distinct).
const ID_STRIDE: usize = 37;
/// See [`ID_STRIDE`].
const ID_OFFSET: usize = 11;
const _: () = assert!(!KEY_ROWS.is_multiple_of(ID_STRIDE) && N <= KEY_ROWS);

/// The inputs of every probe.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeInputs {
    /// `[head][d]`, `HEADS x N`.
    pub q: Vec<bf16>,
    /// Key rows, `KEY_ROWS x N`.
    pub k: Vec<bf16>,
    /// Slot `t` of the K stage holds key row `ids[t]`; `N` distinct rows.
    pub ids: Vec<i32>,
    /// `[head][slot]`, `HEADS x N`.
    pub ds: Vec<bf16>,
}

/// splitmix64: a fixed, dependency-free sequence, so the inputs (and any
/// diagnosis quoted from them) are the same on every machine.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `len` values `k / 8`, `k` in `-8..=8`, from seed `seed`.
pub fn small_values(seed: u64, len: usize) -> Vec<bf16> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            let k = (splitmix(&mut s) % (2 * VALUE_MAX_NUM + 1)) as f64 - VALUE_MAX_NUM as f64;
            bf16::from_f64(k / VALUE_DENOM)
        })
        .collect()
}

/// The probes' inputs (deterministic).
pub fn probe_inputs() -> ProbeInputs {
    ProbeInputs {
        q: small_values(1, HEADS * N),
        k: small_values(2, KEY_ROWS * N),
        ids: (0..N)
            .map(|t| ((ID_STRIDE * t + ID_OFFSET) % KEY_ROWS) as i32)
            .collect(),
        ds: small_values(3, HEADS * N),
    }
}

/// Element `(slot, d)` of the K stage: key row `ids[slot]`.
fn k_elem(x: &ProbeInputs, slot: usize, d: usize) -> bf16 {
    x.k[x.ids[slot] as usize * N + d]
}

/// Output rows (M) of a GEMM.
pub fn rows(g: Gemm) -> usize {
    match g {
        Gemm::S | Gemm::Dq => HEADS,
        Gemm::Dk => N,
    }
}

/// The CPU product, `rows(g) x N` row-major (exact: see [`VALUE_DENOM`]):
/// `S[h][t] = q[h] . K[t]`, `dQ[h][d] = sum_t dS[h][t] K[t][d]`,
/// `dK[t][d] = sum_h dS[h][t] q[h][d]`.
pub fn reference(g: Gemm, x: &ProbeInputs) -> Vec<f64> {
    let f = |v: bf16| v.to_f64();
    let mut out = vec![0.0; rows(g) * N];
    for (i, o) in out.iter_mut().enumerate() {
        let (r, c) = (i / N, i % N);
        *o = match g {
            Gemm::S => (0..N).map(|d| f(x.q[r * N + d]) * f(k_elem(x, c, d))).sum(),
            Gemm::Dq => (0..N)
                .map(|t| f(x.ds[r * N + t]) * f(k_elem(x, t, c)))
                .sum(),
            Gemm::Dk => (0..HEADS)
                .map(|h| f(x.ds[h * N + r]) * f(x.q[h * N + c]))
                .sum(),
        };
    }
    out
}

/// Where `tile::gather4` puts the 128-byte-swizzled rows it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gather4Swizzle {
    /// By shared-memory address (the pattern repeats every 1024 bytes), so
    /// a gather4 at offset 512 writes rows 4..8 of an 8-row atom: what
    /// stage 2 assumes.
    ByAddress,
    /// Relative to each instruction's destination: every gather4 writes
    /// its four rows with the pattern of rows 0..4.
    PerInstruction,
}

/// The roles of LBO and SBO in a 128-byte-swizzled MN-major descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MnStrides {
    /// LBO steps between 64-element MN blocks, SBO between 8-row K groups:
    /// what stage 2 assumes.
    LboAcrossMn,
    /// The other way round.
    Swapped,
}

/// What the 128-byte swizzle of an MMA operand read is anchored to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwizzleAnchor {
    /// The shared-memory address (the same image TMA writes), so a K step
    /// may move the descriptor's start 32 bytes into a swizzled row: what
    /// stage 2 assumes.
    Address,
    /// The offset from the descriptor's start address.
    DescriptorStart,
}

/// Where an M = 64 MMA (`cta_group::1`, not `.ws`) puts accumulator row
/// `r`, column `c`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum M64Lanes {
    /// Layout F: rows `16q..16q+16` in lanes `32q..32q+16`, all N columns:
    /// what stage 2 assumes.
    LayoutF,
    /// Row `r` in lane `r`.
    Identity,
    /// Column halves folded (the `.ws` layout E): lane `r + 64 (c / 64)`,
    /// column `c % 64`.
    FoldedHalves,
}

/// One reading of the hardware: a choice for each unconfirmed point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Model {
    /// See [`Gather4Swizzle`].
    pub gather4: Gather4Swizzle,
    /// See [`MnStrides`].
    pub mn_major: MnStrides,
    /// See [`SwizzleAnchor`].
    pub swizzle: SwizzleAnchor,
    /// See [`M64Lanes`].
    pub m64: M64Lanes,
}

impl Model {
    /// What the kernels assume.
    pub const ASSUMED: Model = Model {
        gather4: Gather4Swizzle::ByAddress,
        mn_major: MnStrides::LboAcrossMn,
        swizzle: SwizzleAnchor::Address,
        m64: M64Lanes::LayoutF,
    };

    /// The deviations from [`Model::ASSUMED`], in words (empty for it).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.gather4 == Gather4Swizzle::PerInstruction {
            parts.push(
                "gather4 swizzles relative to each instruction's destination (not by address)",
            );
        }
        if self.mn_major == MnStrides::Swapped {
            parts.push("MN-major LBO and SBO roles swapped (LBO between 8-row K groups, SBO between 64-wide MN blocks)");
        }
        if self.swizzle == SwizzleAnchor::DescriptorStart {
            parts.push("the MMA anchors the 128-byte swizzle at the descriptor start (so K steps inside a swizzled row read the wrong 16-byte chunks)");
        }
        match self.m64 {
            M64Lanes::LayoutF => {}
            M64Lanes::Identity => parts.push("M = 64 accumulator row r sits in TMEM lane r (not layout F)"),
            M64Lanes::FoldedHalves => parts.push("M = 64 accumulator folded: row r, column c in lane r + 64 (c / 64), column c % 64 (layout E, not F)"),
        }
        parts.join("; and ")
    }

    /// Every reading that can change what `spec` writes, other than
    /// [`Model::ASSUMED`] (each unconfirmed point the probe exercises,
    /// alone and combined).
    pub fn alternatives(spec: &ProbeSpec) -> Vec<Model> {
        let g = spec.gemm;
        let gather = g != Gemm::Dk && spec.flags & PROBE_K_GATHER4 != 0;
        let gather4: &[Gather4Swizzle] = if gather {
            &[Gather4Swizzle::ByAddress, Gather4Swizzle::PerInstruction]
        } else {
            &[Gather4Swizzle::ByAddress]
        };
        let mn: &[MnStrides] = if g == Gemm::S {
            &[MnStrides::LboAcrossMn]
        } else {
            &[MnStrides::LboAcrossMn, MnStrides::Swapped]
        };
        // dK's operands are MN-major, whose steps move whole atoms: the
        // anchor makes no difference there.
        let anchors: &[SwizzleAnchor] = if g == Gemm::Dk {
            &[SwizzleAnchor::Address]
        } else {
            &[SwizzleAnchor::Address, SwizzleAnchor::DescriptorStart]
        };
        let lanes: &[M64Lanes] = if g == Gemm::Dk {
            &[M64Lanes::LayoutF]
        } else {
            &[
                M64Lanes::LayoutF,
                M64Lanes::Identity,
                M64Lanes::FoldedHalves,
            ]
        };
        let mut out = Vec::new();
        for &gather4 in gather4 {
            for &mn_major in mn {
                for &swizzle in anchors {
                    for &m64 in lanes {
                        let m = Model {
                            gather4,
                            mn_major,
                            swizzle,
                            m64,
                        };
                        if m != Model::ASSUMED {
                            out.push(m);
                        }
                    }
                }
            }
        }
        out
    }
}

/// What a probe kernel writes, as f32 bit patterns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeOutput {
    /// `rows(g) x N`, row-major, read through stage 2's lane mapping.
    pub out: Vec<u32>,
    /// `LANES x N`: tensor-memory lane `l`, accumulator column `c`.
    pub lanes: Vec<u32>,
    /// The kernel's status words (`PROBE_STATUS_*`): zero in the output
    /// of a launch that completed, since a probe that gives up on a wait
    /// traps (its words are then read after the failed launch).
    pub status: [u32; 2],
}

/// Shared memory as a probe leaves it before the MMA (bf16 bits by
/// 2-byte unit from the dynamic base; `None` where nothing was written).
type Image = Vec<Option<u16>>;

fn put(img: &mut Image, byte: u32, v: bf16) {
    img[(byte / 2) as usize] = Some(v.to_bits());
}

/// The operands of `spec` where its kernel stages them, as `m` says the
/// hardware places gather4 rows.
fn smem_image(spec: &ProbeSpec, x: &ProbeInputs, m: &Model) -> Image {
    let mut img = vec![None; (OFF_DK / 2) as usize];
    let g = spec.gemm;
    if g != Gemm::Dk {
        if spec.flags & PROBE_K_GATHER4 != 0 {
            // Gather4 `j` writes slots 4j..4j+4, 128 bytes each, per half.
            for j in 0..(N / 4) as u32 {
                for half in 0..2 {
                    let dst = OFF_K + gather4_dst(j, half);
                    for (r, c) in (0..4u32).flat_map(|r| (0..64u32).map(move |c| (r, c))) {
                        let unswizzled = r * 128 + c * 2;
                        let at = match m.gather4 {
                            Gather4Swizzle::ByAddress => swizzle128(dst + unswizzled),
                            Gather4Swizzle::PerInstruction => dst + swizzle128(unswizzled),
                        };
                        let v = k_elem(x, (4 * j + r) as usize, (64 * half + c) as usize);
                        put(&mut img, at, v);
                    }
                }
            }
        } else {
            for (t, d) in (0..N).flat_map(|t| (0..N).map(move |d| (t, d))) {
                put(&mut img, OFF_K + k_at(t as u32, d as u32), k_elem(x, t, d));
            }
        }
    }
    // The q tile loads (box of 64 rows at a 1024-byte boundary) and the
    // stores place q alike.
    for (h, c) in (0..HEADS).flat_map(|h| (0..N).map(move |c| (h, c))) {
        if g != Gemm::Dq {
            put(&mut img, OFF_Q + q_at(h as u32, c as u32), x.q[h * N + c]);
        }
        if g != Gemm::S {
            put(
                &mut img,
                OFF_DS + ds_at(h as u32, c as u32),
                x.ds[h * N + c],
            );
        }
    }
    img
}

/// `(start, LBO, SBO)` of a shared-memory descriptor, in bytes.
fn fields(d: u64) -> (u32, u32, u32) {
    let f = |s: u32| (((d >> s) & 0x3fff) as u32) << 4;
    (f(0), f(16), f(32))
}

/// Address `m` says the MMA reads for element `(mn, kk)` of an operand.
fn operand_addr(m: &Model, desc: u64, mn_major: bool, mn: u32, kk: u32) -> u32 {
    let (start, lbo, sbo) = fields(desc);
    let (lbo, sbo) = match m.mn_major {
        MnStrides::LboAcrossMn => (lbo, sbo),
        MnStrides::Swapped => (sbo, lbo),
    };
    // The canonical layouts with the swizzle on the address (start 0 gives
    // the swizzled offset alone).
    let at = |start: u32| {
        if mn_major {
            model_mnmajor(start, lbo, sbo, mn, kk)
        } else {
            model_kmajor(start, sbo, mn, kk)
        }
    };
    match m.swizzle {
        SwizzleAnchor::Address => at(start),
        SwizzleAnchor::DescriptorStart => start + at(0),
    }
}

/// The probe's MMA steps: `(idesc, a, b)` with stage 2's descriptors for
/// operands at their offsets from the dynamic shared-memory base (which is
/// 1024-byte aligned, so the swizzle sees the same address bits).
fn steps(g: Gemm) -> Vec<(u32, u64, u64)> {
    match g {
        Gemm::S => (0..S_STEPS)
            .map(|s| {
                let (a, b) = s_descs(OFF_Q, OFF_K, s);
                (IDESC_S, a, b)
            })
            .collect(),
        Gemm::Dq => (0..DQ_STEPS)
            .map(|s| {
                let (a, b) = dq_descs(OFF_DS, OFF_K, s);
                (IDESC_DQ, a, b)
            })
            .collect(),
        Gemm::Dk => (0..dk_steps(SM100_PROBE_HEADS))
            .map(|s| {
                let (a, b) = dk_descs(OFF_DS, OFF_Q, s);
                (IDESC_DK, a, b)
            })
            .collect(),
    }
}

/// The accumulator `m` says the MMA steps compute (NaN where a product
/// read shared memory no probe wrote).
fn accumulate(g: Gemm, img: &Image, m: &Model) -> Vec<f64> {
    let read = |a: u32| {
        img.get((a / 2) as usize)
            .copied()
            .flatten()
            .map_or(f64::NAN, |b| bf16::from_bits(b).to_f64())
    };
    const K_STEP: usize = 16;
    let rows = rows(g);
    let mut acc = vec![0.0; rows * N];
    for (idesc, a, b) in steps(g) {
        let (a_mn, b_mn) = ((idesc >> 15) & 1 == 1, (idesc >> 16) & 1 == 1);
        // Each operand element of the step once, then the products.
        let fetch = |desc: u64, mn_major: bool, lines: usize| -> Vec<f64> {
            (0..lines * K_STEP)
                .map(|i| {
                    let (mn, kk) = ((i / K_STEP) as u32, (i % K_STEP) as u32);
                    read(operand_addr(m, desc, mn_major, mn, kk))
                })
                .collect()
        };
        let (av, bv) = (fetch(a, a_mn, rows), fetch(b, b_mn, N));
        for (i, v) in acc.iter_mut().enumerate() {
            let (ar, br) = (
                &av[(i / N) * K_STEP..][..K_STEP],
                &bv[(i % N) * K_STEP..][..K_STEP],
            );
            *v += ar.iter().zip(br).map(|(x, y)| x * y).sum::<f64>();
        }
    }
    acc
}

/// `(lane, column)` where `m` says accumulator element `(r, c)` lives.
fn cell(g: Gemm, m: &Model, r: usize, c: usize) -> (usize, usize) {
    if g == Gemm::Dk {
        return (r, c);
    }
    match m.m64 {
        M64Lanes::LayoutF => (lane_m64(r as u32) as usize, c),
        M64Lanes::Identity => (r, c),
        M64Lanes::FoldedHalves => (r + 64 * (c / 64), c % 64),
    }
}

/// The rows stage 2's read-back takes from the lanes: `out` as the probe
/// kernel writes it (rows no lane maps to keep [`HOST_FILL`]).
pub fn read_back(g: Gemm, lanes: &[u32]) -> Vec<u32> {
    let mut out = vec![HOST_FILL; rows(g) * N];
    for warp in 0..4u32 {
        for lane in 0..32u32 {
            let row = match g {
                Gemm::Dk => Some(m128_row_of(warp, lane)),
                _ => m64_row_of(warp, lane),
            };
            if let Some(r) = row {
                let l = (warp_lane_base(warp) + lane) as usize;
                let r = r as usize;
                out[r * N..(r + 1) * N].copy_from_slice(&lanes[l * N..(l + 1) * N]);
            }
        }
    }
    out
}

/// What the probe kernel of `spec` writes if the hardware behaves as `m`
/// says: operands staged, MMA steps read through the descriptors, the
/// accumulator placed in tensor memory (over the fill), read back.
pub fn simulate(spec: &ProbeSpec, x: &ProbeInputs, m: &Model) -> ProbeOutput {
    let g = spec.gemm;
    let acc = accumulate(g, &smem_image(spec, x, m), m);
    let mut lanes = vec![TMEM_FILL; LANES * N];
    for (i, v) in acc.iter().enumerate() {
        let (l, c) = cell(g, m, i / N, i % N);
        lanes[l * N + c] = if v.is_nan() {
            SIM_UNDEFINED
        } else {
            (*v as f32).to_bits()
        };
    }
    ProbeOutput {
        out: read_back(g, &lanes),
        lanes,
        status: [0; 2],
    }
}

/// The smoke kernel's operands: `a` 128 x 16 and `b` 64 x 16 (row-major
/// bf16, values as [`small_values`]).
pub fn smoke_inputs() -> (Vec<bf16>, Vec<bf16>) {
    (
        small_values(4, SMOKE_M * SMOKE_K),
        small_values(5, SMOKE_N * SMOKE_K),
    )
}

/// Shape of the smoke kernel's MMA (`kernels-gpu/src/sm100/smoke.rs`).
pub const SMOKE_M: usize = 128;
/// See [`SMOKE_M`].
pub const SMOKE_N: usize = 64;
/// See [`SMOKE_M`].
pub const SMOKE_K: usize = 16;
/// The smoke kernel's no-swizzle K-major layout: LBO (between core
/// matrices adjacent along K) and SBO (between 8-row groups).
const SMOKE_LBO: u32 = 128;
/// See [`SMOKE_LBO`].
const SMOKE_SBO: u32 = 256;

/// `a b^T` (128 x 64) as the smoke kernel computes it; with `swapped`,
/// as it would if the hardware took LBO and SBO the other way round in the
/// no-swizzle K-major layout.
pub fn smoke_product(a: &[bf16], b: &[bf16], swapped: bool) -> Vec<f64> {
    // Where the kernel stores element (r, k), and where the hardware reads
    // it back from.
    let (lbo, sbo) = if swapped {
        (SMOKE_SBO, SMOKE_LBO)
    } else {
        (SMOKE_LBO, SMOKE_SBO)
    };
    let tile = |m: &[bf16], rows: usize| {
        let mut img = vec![bf16::ZERO; rows * SMOKE_K];
        for (r, k) in (0..rows).flat_map(|r| (0..SMOKE_K).map(move |k| (r, k))) {
            let at = kmajor_offset(r as u32, k as u32, SMOKE_LBO, SMOKE_SBO) / 2;
            img[at as usize] = m[r * SMOKE_K + k];
        }
        move |r: usize, k: usize| {
            img[(kmajor_offset(r as u32, k as u32, lbo, sbo) / 2) as usize].to_f64()
        }
    };
    let (ra, rb) = (tile(a, SMOKE_M), tile(b, SMOKE_N));
    (0..SMOKE_M * SMOKE_N)
        .map(|i| {
            let (r, c) = (i / SMOKE_N, i % SMOKE_N);
            (0..SMOKE_K).map(|k| ra(r, k) * rb(c, k)).sum()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::PROBES;
    use super::*;

    #[test]
    fn inputs_are_exact_small_eighths_and_ids_are_distinct_rows() {
        let x = probe_inputs();
        assert_eq!(x, probe_inputs(), "deterministic");
        assert_eq!(
            (x.q.len(), x.k.len(), x.ds.len()),
            (HEADS * N, KEY_ROWS * N, HEADS * N)
        );
        for v in x.q.iter().chain(&x.k).chain(&x.ds) {
            let k = v.to_f64() * VALUE_DENOM;
            assert_eq!(k, k.round(), "{v} is a multiple of 1/8");
            assert!(k.abs() <= VALUE_MAX_NUM as f64);
        }
        // Every value of the range occurs (the inputs are not degenerate).
        let distinct: std::collections::BTreeSet<i64> =
            x.q.iter()
                .map(|v| (v.to_f64() * VALUE_DENOM) as i64)
                .collect();
        assert_eq!(distinct.len(), 2 * VALUE_MAX_NUM as usize + 1);
        let ids: std::collections::BTreeSet<i32> = x.ids.iter().copied().collect();
        assert_eq!(ids.len(), N);
        assert!(x.ids.iter().all(|&i| (0..KEY_ROWS as i32).contains(&i)));
    }

    #[test]
    fn reference_is_the_product_and_exact_in_f32() {
        let x = probe_inputs();
        let f = |v: bf16| v.to_f64();
        for g in [Gemm::S, Gemm::Dq, Gemm::Dk] {
            let r = reference(g, &x);
            assert_eq!(r.len(), rows(g) * N);
            for v in &r {
                // Multiples of 1/64, well inside f32's exact range.
                assert_eq!(v * 64.0, (v * 64.0).round());
                assert_eq!(*v as f32 as f64, *v);
            }
        }
        // Spot values written out.
        let s = reference(Gemm::S, &x);
        let want: f64 = (0..N)
            .map(|d| f(x.q[3 * N + d]) * f(x.k[x.ids[5] as usize * N + d]))
            .sum();
        assert_eq!(s[3 * N + 5], want);
        let dq = reference(Gemm::Dq, &x);
        let want: f64 = (0..N)
            .map(|t| f(x.ds[7 * N + t]) * f(x.k[x.ids[t] as usize * N + 100]))
            .sum();
        assert_eq!(dq[7 * N + 100], want);
        let dk = reference(Gemm::Dk, &x);
        let want: f64 = (0..HEADS)
            .map(|h| f(x.ds[h * N + 90]) * f(x.q[h * N + 2]))
            .sum();
        assert_eq!(dk[90 * N + 2], want);
    }

    #[test]
    fn the_assumed_model_reproduces_the_reference_for_every_probe() {
        // Staging, the stage-2 descriptors read through the ISA's canonical
        // layouts, the lane mapping and the read-back compose to the
        // product: what the hardware must do for a probe to pass.
        let x = probe_inputs();
        for spec in &PROBES {
            let sim = simulate(spec, &x, &Model::ASSUMED);
            let want = reference(spec.gemm, &x);
            for (i, (&got, &w)) in sim.out.iter().zip(&want).enumerate() {
                assert_eq!(f32::from_bits(got) as f64, w, "{} element {i}", spec.name);
            }
            if spec.gemm != Gemm::Dk {
                // Layout F leaves lanes 16..32 of every sub-partition alone.
                for l in (0..LANES).filter(|l| l % 32 >= 16) {
                    assert!(sim.lanes[l * N..(l + 1) * N]
                        .iter()
                        .all(|&v| v == TMEM_FILL));
                }
            }
        }
    }

    #[test]
    fn every_alternative_changes_what_its_probe_writes() {
        // Otherwise the probe could not tell it from the assumption.
        let x = probe_inputs();
        for spec in &PROBES {
            let base = simulate(spec, &x, &Model::ASSUMED);
            let alts = Model::alternatives(spec);
            assert!(!alts.is_empty(), "{}", spec.name);
            for m in alts {
                let sim = simulate(spec, &x, &m);
                assert_ne!(sim.lanes, base.lanes, "{}: {}", spec.name, m.describe());
            }
        }
    }

    #[test]
    fn smoke_product_is_a_times_b_transposed_and_swapped_strides_differ() {
        let (a, b) = smoke_inputs();
        let p = smoke_product(&a, &b, false);
        for (i, v) in p.iter().enumerate() {
            let (r, c) = (i / SMOKE_N, i % SMOKE_N);
            let want: f64 = (0..SMOKE_K)
                .map(|k| a[r * SMOKE_K + k].to_f64() * b[c * SMOKE_K + k].to_f64())
                .sum();
            assert_eq!(*v, want);
        }
        assert_ne!(smoke_product(&a, &b, true), p);
    }
}
