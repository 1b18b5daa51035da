//! Pins the operands of every `tcgen05.mma` of the stage-2 kernels in the
//! committed Blackwell PTX against values derived here, field by field,
//! from the PTX ISA's descriptor tables and the operand layouts of
//! `docs/sm100-design.md` ("Layouts and descriptors"), not from the kernel
//! crate's encoders (`kernels-gpu/src/sm100/desc.rs`, `operands.rs`): a
//! wrong bit in an encoder, or a code-generation change that alters one,
//! fails here. Test-only: `build-ptx --check` keeps the committed file
//! equal to what the sources build, so checking it checks the build.
//!
//! How the operands appear in the PTX (the kernels build them with `const
//! fn`s, LLVM folds the constant parts):
//! - the instruction descriptor is an immediate, `mov.b32 %rI, <imm>;`,
//!   into the register the MMA reads;
//! - each shared-memory descriptor is `or.b64 %rdD, %rdS, <imm>;`, where
//!   `<imm>` holds every field but the start address, and `%rdS` is
//!   `cvt.u64.u32` of `bfe.u32 %rS, <address>, 4, 14`, i.e. the ISA's
//!   `matrix-descriptor-encode(address) = (address & 0x3FFFF) >> 4` in
//!   bits 0-13. The address is a run-time shared-memory address (the
//!   dynamic shared-memory base plus buffer offsets), not an immediate, so
//!   what is pinned for it is that encoding, not a value.

use std::collections::HashMap;

/// One field of a descriptor: name, lowest bit, width in bits.
#[derive(Clone, Copy, Debug)]
struct Field {
    name: &'static str,
    lsb: u32,
    width: u32,
}

const fn field(name: &'static str, lsb: u32, width: u32) -> Field {
    Field { name, lsb, width }
}

impl Field {
    fn get(self, v: u64) -> u64 {
        (v >> self.lsb) & ((1u64 << self.width) - 1)
    }
    fn put(self, value: u64) -> u64 {
        assert!(value < 1 << self.width, "{} = {value} overflows", self.name);
        value << self.lsb
    }
}

/// PTX ISA 9.1, section 9.7.16.4.2 "Instruction descriptor"
/// (`#tcgen05-instruction-descriptor`), Table 42 ("Instruction descriptor
/// format for .kind::tf32, .kind::f16, .kind::f8f6f4 and .kind::i8"), with
/// the `.kind::f16` values:
/// bits 0-1 sparsity selector, 2 sparsity (dense = 0), 3 saturate (0 for
/// non-integer types), 4-5 dtype (F16 = 0, F32 = 1), 6 reserved, 7-9 atype
/// (F16 = 0, BF16 = 1), 10-12 btype (same encoding), 13/14 negate A/B,
/// 15/16 transpose A/B (no transpose = 0), 17-22 N >> 3, 23 reserved,
/// 24-28 M >> 4, 29 reserved, 30-31 maximum shift (0 outside `.ws`).
mod idesc {
    use super::{field, Field};
    pub const SPARSITY_SELECTOR: Field = field("sparsity selector", 0, 2);
    pub const SPARSITY: Field = field("sparsity", 2, 1);
    pub const SATURATE: Field = field("saturate", 3, 1);
    pub const DTYPE: Field = field("dtype", 4, 2);
    pub const RESERVED_6: Field = field("reserved bit 6", 6, 1);
    pub const ATYPE: Field = field("atype", 7, 3);
    pub const BTYPE: Field = field("btype", 10, 3);
    pub const NEGATE_A: Field = field("negate A", 13, 1);
    pub const NEGATE_B: Field = field("negate B", 14, 1);
    pub const TRANSPOSE_A: Field = field("transpose A", 15, 1);
    pub const TRANSPOSE_B: Field = field("transpose B", 16, 1);
    pub const N_SHR3: Field = field("N >> 3", 17, 6);
    pub const RESERVED_23: Field = field("reserved bit 23", 23, 1);
    pub const M_SHR4: Field = field("M >> 4", 24, 5);
    pub const RESERVED_29: Field = field("reserved bit 29", 29, 1);
    pub const MAX_SHIFT: Field = field("maximum shift", 30, 2);
    pub const ALL: [Field; 16] = [
        SPARSITY_SELECTOR,
        SPARSITY,
        SATURATE,
        DTYPE,
        RESERVED_6,
        ATYPE,
        BTYPE,
        NEGATE_A,
        NEGATE_B,
        TRANSPOSE_A,
        TRANSPOSE_B,
        N_SHR3,
        RESERVED_23,
        M_SHR4,
        RESERVED_29,
        MAX_SHIFT,
    ];
    /// dtype F32.
    pub const DTYPE_F32: u64 = 1;
    /// atype / btype BF16 (`.kind::f16`).
    pub const TYPE_BF16: u64 = 1;
}

/// PTX ISA 9.1, section 9.7.16.4.1 "Shared memory descriptor"
/// (`#tcgen05-shared-memory-descriptor`), Table 40:
/// bits 0-13 matrix-descriptor-encode(start address), 16-29
/// matrix-descriptor-encode(leading dimension byte offset), 32-45
/// matrix-descriptor-encode(stride dimension byte offset), 46-48 fixed
/// 0b001, 49-51 matrix base offset, 52 leading dimension stride mode (0:
/// relative byte offset), 53-60 fixed 0, 61-63 swizzling mode (0 none,
/// 1 128-byte with 32-byte atomicity, 2 128-byte, 4 64-byte, 6 32-byte);
/// `matrix-descriptor-encode(x) = (x & 0x3FFFF) >> 4`. Bits 14-15 and
/// 30-31 are not in the table and must stay 0.
mod sdesc {
    use super::{field, Field};
    pub const START: Field = field("start address", 0, 14);
    pub const GAP_14: Field = field("bits 14-15", 14, 2);
    pub const LBO: Field = field("leading dimension byte offset", 16, 14);
    pub const GAP_30: Field = field("bits 30-31", 30, 2);
    pub const SBO: Field = field("stride dimension byte offset", 32, 14);
    pub const FIXED_001: Field = field("fixed 0b001", 46, 3);
    pub const BASE_OFFSET: Field = field("matrix base offset", 49, 3);
    pub const LBO_MODE: Field = field("leading dimension stride mode", 52, 1);
    pub const FIXED_0: Field = field("fixed 0", 53, 8);
    pub const SWIZZLE: Field = field("swizzling mode", 61, 3);
    pub const ALL: [Field; 10] = [
        START,
        GAP_14,
        LBO,
        GAP_30,
        SBO,
        FIXED_001,
        BASE_OFFSET,
        LBO_MODE,
        FIXED_0,
        SWIZZLE,
    ];
    /// Swizzling mode "128-Byte swizzling".
    pub const SWIZZLE_128B: u64 = 2;
    /// matrix-descriptor-encode of a byte offset.
    pub const fn encode(bytes: u64) -> u64 {
        (bytes & 0x3ffff) >> 4
    }
}

/// Bytes of one swizzled row: 64 bf16, the 128-byte swizzle span.
const ROW_BYTES: u64 = 128;
/// Rows of one swizzle atom (the pattern repeats every 8 rows, 1024 bytes).
const ATOM_ROWS: u64 = 8;
/// Rows of a q (heads, H padded to 64) or dS (heads) region.
const HEAD_ROWS: u64 = 64;
/// Slots per chunk: rows of a K-stage region (one per slot), N of S, M of dK.
const CHUNK: u64 = 128;
/// Head dimension D: N of dQ and dK, K of S.
const DIM: u64 = 128;
/// M of S and dQ: the heads tile (H = 32 zero-padded to 64).
const HEADS_TILE: u64 = 64;
/// K of one `tcgen05.mma.kind::f16` (PTX ISA, tcgen05 "Matrix shape":
/// K = 16 for `.kind::f16`).
const MMA_K: u64 = 16;

/// Expected constant part (all fields but the start address) of the
/// descriptor of a 128-byte-swizzled bf16 operand, from the ISA's stride
/// definitions (section 9.7.16.3, "Major-ness supported by strides"):
/// - SBO, both major-nesses: the offset between groups of 8 rows (8 rows of
///   128 bytes: 1024);
/// - LBO, K-major swizzled: "not used, assumed to be 1" (encoded as 1);
///   MN-major swizzled: "stride from the first (swizzle-byte-size/16) rows
///   to the next (swizzle-byte-size/16) rows" (128-bit rows: the next
///   64-element block along M/N, i.e. the next region of the tile,
///   `mn_block_bytes` apart).
///
/// Base offset 0: every tile starts on a 1024-byte boundary.
fn smem_desc_const(mn_block_bytes: Option<u64>) -> u64 {
    let lbo = match mn_block_bytes {
        None => 1,
        Some(b) => sdesc::encode(b),
    };
    sdesc::LBO.put(lbo)
        | sdesc::SBO.put(sdesc::encode(ATOM_ROWS * ROW_BYTES))
        | sdesc::FIXED_001.put(0b001)
        | sdesc::BASE_OFFSET.put(0)
        | sdesc::LBO_MODE.put(0)
        | sdesc::SWIZZLE.put(sdesc::SWIZZLE_128B)
}

/// Expected instruction descriptor of a dense bf16 x bf16 -> f32 MMA.
fn idesc_bf16_f32(m: u64, n: u64, transpose_a: bool, transpose_b: bool) -> u32 {
    let v = idesc::DTYPE.put(idesc::DTYPE_F32)
        | idesc::ATYPE.put(idesc::TYPE_BF16)
        | idesc::BTYPE.put(idesc::TYPE_BF16)
        | idesc::TRANSPOSE_A.put(transpose_a as u64)
        | idesc::TRANSPOSE_B.put(transpose_b as u64)
        | idesc::N_SHR3.put(n >> 3)
        | idesc::M_SHR4.put(m >> 4);
    u32::try_from(v).expect("32-bit descriptor")
}

/// One of the three GEMMs of a chunk, as the design lays its operands out.
#[derive(Clone, Copy, Debug)]
struct Gemm {
    name: &'static str,
    idesc: u32,
    a: u64,
    b: u64,
    /// K steps per chunk (`K / MMA_K`) for `heads` real heads.
    steps: fn(u64) -> u64,
}

/// The GEMMs (`docs/sm100-design.md`, "Layouts and descriptors"): q
/// `[head][d]` in regions of 64 d columns (64 head rows each), the K stage
/// `[slot][d]` in regions of 64 d columns (128 slot rows each), dS
/// `[head][slot]` in regions of 64 slot columns (64 head rows each).
/// K-major operands are not transposed, MN-major ones are.
fn gemms() -> [Gemm; 3] {
    let q_region = HEAD_ROWS * ROW_BYTES;
    let k_region = CHUNK * ROW_BYTES;
    let ds_region = HEAD_ROWS * ROW_BYTES;
    [
        // S = q K^T: M = heads, N = slots, K = D; q and K both K-major.
        Gemm {
            name: "S = q K^T",
            idesc: idesc_bf16_f32(HEADS_TILE, CHUNK, false, false),
            a: smem_desc_const(None),
            b: smem_desc_const(None),
            steps: |_| DIM / MMA_K,
        },
        // dQ += dS K: M = heads, N = D, K = slots; dS K-major, K MN-major
        // (D contiguous, blocks of 64 d one K region apart).
        Gemm {
            name: "dQ += dS K",
            idesc: idesc_bf16_f32(HEADS_TILE, DIM, false, true),
            a: smem_desc_const(None),
            b: smem_desc_const(Some(k_region)),
            steps: |_| CHUNK / MMA_K,
        },
        // dK = dS^T q: M = slots, N = D, K = heads (real heads only); dS
        // MN-major (slots contiguous), q MN-major (D contiguous).
        Gemm {
            name: "dK = dS^T q",
            idesc: idesc_bf16_f32(CHUNK, DIM, true, true),
            a: smem_desc_const(Some(ds_region)),
            b: smem_desc_const(Some(q_region)),
            steps: |heads| heads / MMA_K,
        },
    ]
}

/// The operands of one `tcgen05.mma` as the PTX materialises them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mma {
    idesc: u32,
    a: u64,
    b: u64,
}

/// The body of each `.entry` of `ptx`, by name.
fn entries(ptx: &str) -> Vec<(&str, &str)> {
    let starts: Vec<(usize, &str)> = ptx
        .match_indices(".entry ")
        .filter_map(|(i, _)| {
            let rest = &ptx[i + ".entry ".len()..];
            Some((i, rest.split('(').next()?.trim()))
        })
        .collect();
    starts
        .iter()
        .enumerate()
        .map(|(k, &(i, name))| {
            let end = starts.get(k + 1).map_or(ptx.len(), |s| s.0);
            (name, &ptx[i..end])
        })
        .collect()
}

/// The instructions of a kernel body: comments, directives, labels, the
/// braces of inline-asm scopes and guard predicates removed; one
/// `(opcode, operands)` per statement (a braced vector operand stays split
/// over several entries, its first starting with `{`).
fn statements(body: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for line in body.lines() {
        let code = line.split("//").next().unwrap_or("");
        for st in code.split(';') {
            let st = st
                .trim()
                .trim_start_matches('{')
                .trim_end_matches('}')
                .trim();
            if st.is_empty() || st.starts_with('.') || st.ends_with(':') {
                continue;
            }
            let st = match st.strip_prefix('@') {
                Some(guarded) => guarded.split_once(char::is_whitespace).map_or("", |x| x.1),
                None => st,
            };
            let (op, rest) = st.split_once(char::is_whitespace).unwrap_or((st, ""));
            let operands = rest
                .split(',')
                .map(|o| o.trim().to_string())
                .filter(|o| !o.is_empty())
                .collect();
            out.push((op.to_string(), operands));
        }
    }
    out
}

/// Registers a statement writes: its first operand, or the braced list a
/// vector instruction writes.
fn dests(operands: &[String]) -> Vec<String> {
    let Some(first) = operands.first() else {
        return Vec::new();
    };
    if !first.starts_with('{') {
        return vec![first.clone()];
    }
    let mut out = Vec::new();
    for o in operands {
        out.push(o.trim_matches(['{', '}', ' ']).to_string());
        if o.ends_with('}') {
            break;
        }
    }
    out
}

/// An integer immediate as LLVM prints it (decimal, negative for 64-bit
/// values with bit 63 set) or in hex.
fn immediate(s: &str) -> Option<u64> {
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        return u64::from_str_radix(h, 16).ok();
    }
    s.parse::<u64>()
        .ok()
        .or_else(|| s.parse::<i64>().ok().map(|v| v as u64))
}

/// The operands of every `tcgen05.mma` in one kernel body, each resolved to
/// its single definition in the forms the module docs describe.
fn kernel_mmas(body: &str) -> Result<Vec<Mma>, String> {
    let st = statements(body);
    let mut defs: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, (op, operands)) in st.iter().enumerate() {
        if op.starts_with("tcgen05.mma") || op.starts_with("st.") || op.starts_with("red.") {
            continue;
        }
        for d in dests(operands) {
            defs.entry(d).or_default().push(i);
        }
    }
    let def = |reg: &str| -> Result<&(String, Vec<String>), String> {
        match defs.get(reg).map(Vec::as_slice) {
            Some([i]) => Ok(&st[*i]),
            Some(v) => Err(format!("{reg} is written {} times, expected once", v.len())),
            None => Err(format!("{reg} is never written")),
        }
    };
    let smem_desc = |reg: &str| -> Result<u64, String> {
        let (op, o) = def(reg)?;
        if op != "or.b64" || o.len() != 3 {
            return Err(format!(
                "{reg}: `{op} {}`, expected or.b64 with an immediate",
                o.join(", ")
            ));
        }
        let (src, imm) = match (immediate(&o[1]), immediate(&o[2])) {
            (None, Some(c)) => (&o[1], c),
            (Some(c), None) => (&o[2], c),
            _ => {
                return Err(format!(
                    "{reg}: `or.b64 {}` has no single immediate",
                    o.join(", ")
                ))
            }
        };
        let (op, c) = def(src)?;
        if op != "cvt.u64.u32" || c.len() != 2 {
            return Err(format!(
                "{reg}: start field from `{op}`, expected cvt.u64.u32"
            ));
        }
        let (op, e) = def(&c[1])?;
        // matrix-descriptor-encode: bits 4..18 of the address into 0..14.
        if op != "bfe.u32" || e.len() != 4 || e[2] != "4" || e[3] != "14" {
            return Err(format!(
                "{reg}: start address encoded by `{op} {}`, expected bfe.u32 <addr>, 4, 14",
                e.join(", ")
            ));
        }
        Ok(imm)
    };
    let mut out = Vec::new();
    for (op, o) in &st {
        if !op.starts_with("tcgen05.mma") {
            continue;
        }
        if op != "tcgen05.mma.cta_group::1.kind::f16" || o.len() != 5 {
            return Err(format!("unexpected MMA `{op} {}`", o.join(", ")));
        }
        let (iop, io) = def(&o[3])?;
        let idesc = match (iop.as_str(), io.get(1).and_then(|v| immediate(v))) {
            ("mov.b32" | "mov.u32", Some(v)) => {
                u32::try_from(v).map_err(|_| format!("{}: {v} is not 32-bit", o[3]))?
            }
            _ => {
                return Err(format!(
                    "instruction descriptor {} from `{iop} {}`, expected mov.b32 of an immediate",
                    o[3],
                    io.join(", ")
                ))
            }
        };
        out.push(Mma {
            idesc,
            a: smem_desc(&o[1])?,
            b: smem_desc(&o[2])?,
        });
    }
    Ok(out)
}

/// Field-by-field differences of `got` from `want`.
fn diff(fields: &[Field], got: u64, want: u64, what: &str) -> Vec<String> {
    fields
        .iter()
        .filter(|f| f.get(got) != f.get(want))
        .map(|f| {
            format!(
                "{what} {} = {} (expected {})",
                f.name,
                f.get(got),
                f.get(want)
            )
        })
        .collect()
}

/// Mismatches of an MMA's operands from `g`'s.
fn mismatches(m: &Mma, g: &Gemm) -> Vec<String> {
    let mut d = diff(&idesc::ALL, m.idesc as u64, g.idesc as u64, "idesc");
    d.extend(diff(&sdesc::ALL, m.a, g.a, "A desc"));
    d.extend(diff(&sdesc::ALL, m.b, g.b, "B desc"));
    d
}

/// Checks the stage-2 kernel `name` (`heads` real heads) of `ptx`: every
/// MMA is one of the three GEMMs with exactly the derived operands, and
/// their counts are `c` chunks' worth of K steps for one `c >= 1`.
/// Returns `c`.
fn check_kernel(ptx: &str, name: &str, heads: u64) -> Result<u64, String> {
    let body = entries(ptx)
        .into_iter()
        .find(|e| e.0 == name)
        .ok_or_else(|| format!("{name}: no such entry"))?
        .1;
    let mmas = kernel_mmas(body).map_err(|e| format!("{name}: {e}"))?;
    let gemms = gemms();
    let mut counts = [0u64; 3];
    for (i, m) in mmas.iter().enumerate() {
        let bad = gemms.map(|g| mismatches(m, &g));
        if let Some(g) = bad.iter().position(Vec::is_empty) {
            counts[g] += 1;
            continue;
        }
        // Not one of the three: name the differences from the closest.
        let fewest = bad.iter().map(Vec::len).min().unwrap_or(0);
        let closest: Vec<String> = (0..3)
            .filter(|&g| bad[g].len() == fewest)
            .map(|g| format!("{}: {}", gemms[g].name, bad[g].join(", ")))
            .collect();
        return Err(format!(
            "{name}: MMA #{i} (idesc {:#x}, A {:#x}, B {:#x}) matches no GEMM; closest {}",
            m.idesc,
            m.a,
            m.b,
            closest.join("; or ")
        ));
    }
    let per_chunk = gemms.map(|g| (g.steps)(heads));
    let chunks = counts[0] / per_chunk[0];
    if chunks == 0 || (0..3).any(|g| counts[g] != chunks * per_chunk[g]) {
        return Err(format!(
            "{name}: MMA counts (S, dQ, dK) = {counts:?}, expected a multiple >= 1 of {per_chunk:?}"
        ));
    }
    Ok(chunks)
}

/// Checks the bring-up probe `name` of `ptx`, which runs GEMM `g` (index
/// into [`gemms`]) once for `heads` heads: every MMA has exactly that
/// GEMM's derived operands, and there are one chunk's worth of them. So a
/// probe that passes on hardware vouches for the operands stage 2 uses.
fn check_probe(ptx: &str, name: &str, g: usize, heads: u64) -> Result<(), String> {
    let body = entries(ptx)
        .into_iter()
        .find(|e| e.0 == name)
        .ok_or_else(|| format!("{name}: no such entry"))?
        .1;
    let mmas = kernel_mmas(body).map_err(|e| format!("{name}: {e}"))?;
    let gemm = gemms()[g];
    for (i, m) in mmas.iter().enumerate() {
        let bad = mismatches(m, &gemm);
        if !bad.is_empty() {
            return Err(format!(
                "{name}: MMA #{i} is not {}: {}",
                gemm.name,
                bad.join(", ")
            ));
        }
    }
    let want = (gemm.steps)(heads);
    if mmas.len() as u64 != want {
        return Err(format!(
            "{name}: {} MMAs, expected the {want} K steps of one {}",
            mmas.len(),
            gemm.name
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels_gpu::registry::{self, stage2_kernel, SM100_HEADS, SM100_TOPKS};

    /// The committed Blackwell PTX of `variant` (its entry of the sm_100
    /// family in `archs`): the product's, or the lab's (the probes, the
    /// smoke kernel).
    fn blackwell_ptx_of(archs: &[crate::ptx::Arch], variant: crate::ptx::Variant) -> String {
        let archs: Vec<_> = archs
            .iter()
            .filter(|a| a.target.starts_with("sm_100"))
            .collect();
        assert_eq!(archs.len(), 1, "one Blackwell PTX file");
        let path = variant.ptx_path(&crate::util::repo_root(), archs[0].target);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn blackwell_ptx() -> String {
        blackwell_ptx_of(&crate::ptx::ARCHS, crate::ptx::Variant::Committed)
    }

    fn blackwell_lab_ptx() -> String {
        blackwell_ptx_of(&crate::ptx::LAB_ARCHS, crate::ptx::Variant::Lab)
    }

    fn check_all(ptx: &str) -> Result<Vec<(String, u64)>, String> {
        let mut out = Vec::new();
        for t in SM100_TOPKS {
            for h in SM100_HEADS {
                let name = stage2_kernel(t, h).expect("specialization").name;
                out.push((name.to_string(), check_kernel(ptx, name, h as u64)?));
            }
        }
        Ok(out)
    }

    #[test]
    fn the_tables_cover_every_bit_once() {
        for (fields, bits) in [(&idesc::ALL[..], 32), (&sdesc::ALL[..], 64)] {
            let mut seen = 0u128;
            for f in fields {
                let mask = ((1u128 << f.width) - 1) << f.lsb;
                assert_eq!(seen & mask, 0, "{} overlaps", f.name);
                seen |= mask;
            }
            assert_eq!(seen, (1u128 << bits) - 1);
        }
    }

    #[test]
    fn derived_values_read_back_as_the_isa_fields() {
        let [s, dq, dk] = gemms();
        // Spot values straight from the tables, independent of `put`.
        // S: F32 (1 << 4), BF16 A/B (1 << 7, 1 << 10), N 128 (16 << 17),
        // M 64 (4 << 24).
        assert_eq!(
            s.idesc,
            (1 << 4) | (1 << 7) | (1 << 10) | (16 << 17) | (4 << 24)
        );
        assert_eq!(dq.idesc, s.idesc | (1 << 16));
        assert_eq!(
            dk.idesc,
            (s.idesc & !(0x1f << 24)) | (1 << 15) | (1 << 16) | (8 << 24)
        );
        // K-major 128B swizzle: LBO 1, SBO 1024 >> 4, 0b001 at 46, swizzle 2 at 61.
        assert_eq!(s.a, (1 << 16) | (64 << 32) | (1 << 46) | (2 << 61));
        // MN-major: LBO = region bytes >> 4 (16 KiB for K, 8 KiB for q, dS).
        assert_eq!(dq.b, (1024 << 16) | (64 << 32) | (1 << 46) | (2 << 61));
        assert_eq!(dk.a, (512 << 16) | (64 << 32) | (1 << 46) | (2 << 61));
        assert_eq!(dk.b, dk.a);
    }

    #[test]
    fn committed_ptx_descriptors_match_the_isa_tables() {
        let ptx = blackwell_ptx();
        let checked = check_all(&ptx).unwrap_or_else(|e| panic!("{e}"));
        for (name, chunks) in &checked {
            println!(
                "{name}: the three GEMMs' descriptors as derived, {chunks} chunk(s) of K steps"
            );
        }
        assert_eq!(checked.len(), registry::SM100_STAGE2.len());
        let lab = blackwell_lab_ptx();
        let probes = probe_gemms();
        for (name, g) in probes {
            check_probe(&lab, name, g, PROBE_HEADS).unwrap_or_else(|e| panic!("{e}"));
            println!("{name}: one chunk of {} as derived", gemms()[g].name);
        }
        // Every tcgen05.mma of both files is in a checked kernel or the
        // smoke kernel (which has its own shape).
        for (name, body) in entries(&ptx).into_iter().chain(entries(&lab)) {
            if body.contains("tcgen05.mma") {
                assert!(
                    checked.iter().any(|c| c.0 == name)
                        || probes.iter().any(|p| p.0 == name)
                        || name == registry::SM100_SMOKE.name,
                    "{name} has unchecked MMAs"
                );
            }
        }
    }

    /// Heads of the probes' dK (its K).
    const PROBE_HEADS: u64 = kernels_gpu::abi::SM100_PROBE_HEADS as u64;

    /// Each probe kernel and the index of its GEMM in [`gemms`].
    fn probe_gemms() -> [(&'static str, usize); 3] {
        use registry::{SM100_PROBE_DK, SM100_PROBE_DQ, SM100_PROBE_S};
        [
            (SM100_PROBE_S.name, 0),
            (SM100_PROBE_DQ.name, 1),
            (SM100_PROBE_DK.name, 2),
        ]
    }

    #[test]
    fn a_probe_with_another_gemm_or_step_count_is_caught() {
        let ptx = blackwell_lab_ptx();
        let (s, dq) = (probe_gemms()[0].0, probe_gemms()[1].0);
        // The S probe's MMAs are not dQ's.
        let e = check_probe(&ptx, s, 1, PROBE_HEADS).unwrap_err();
        assert!(e.contains("is not dQ += dS K"), "{e}");
        // A planted kernel of one chunk for PLANTED_HEADS holds 8 S MMAs
        // among others: not a probe of S.
        let (i, a, b) = derived();
        let k = planted(i, a, b, "4, 14");
        assert!(check_probe(&k, "k", 0, PLANTED_HEADS).is_err());
        // The dQ probe's descriptor constant edited: caught by field.
        let [_, g, _] = gemms();
        let start = ptx.find(&format!(".entry {dq}(")).unwrap();
        let end = start
            + 1
            + ptx[start + 1..]
                .find(".entry ")
                .unwrap_or(ptx.len() - start - 1);
        let swapped = (g.b & !(0x3fff << 16)) | (64 << 16);
        let body = ptx[start..end].replace(&format!(", {};", g.b), &format!(", {swapped};"));
        let edited = format!("{}{}{}", &ptx[..start], body, &ptx[end..]);
        let e = check_probe(&edited, dq, 1, PROBE_HEADS).unwrap_err();
        assert!(
            e.contains("B desc leading dimension byte offset = 64"),
            "{e}"
        );
    }

    /// `heads` of the planted kernel: dK has H / 16 = 1 step per chunk.
    const PLANTED_HEADS: u64 = 16;

    /// A kernel holding one chunk of MMAs (each GEMM's K steps for
    /// [`PLANTED_HEADS`]) in the form LLVM emits, with the given operand
    /// constants for the first MMA of each GEMM and the derived ones for
    /// the others, and the start address encoded by `bfe.u32 .., <bfe>`.
    fn planted(idesc: [u32; 3], a: [u64; 3], b: [u64; 3], bfe: &str) -> String {
        let gemms = gemms();
        let mut s = String::from(".visible .entry k(\n)\n{\n\tmov.u32 %r1, smem;\n");
        let mut r = 10;
        for (g, gemm) in gemms.iter().enumerate() {
            for step in 0..(gemm.steps)(PLANTED_HEADS) {
                let (i, a, b) = if step == 0 {
                    (idesc[g], a[g], b[g])
                } else {
                    (gemm.idesc, gemm.a, gemm.b)
                };
                s += &format!(
                    "\tadd.s32 %r{r}, %r1, {off};\n\
                     \tbfe.u32 %r{r1}, %r{r}, {bfe};\n\
                     \tcvt.u64.u32 %rd{r}, %r{r1};\n\
                     \tor.b64 %rd{r2}, %rd{r}, {a};\n\
                     \tbfe.u32 %r{r3}, %r1, {bfe};\n\
                     \tcvt.u64.u32 %rd{r3}, %r{r3};\n\
                     \tor.b64 %rd{r4}, %rd{r3}, {b};\n\
                     \tmov.b32 %r{r5}, {i};\n\
                     \t// begin inline asm\n\
                     \t{{ .reg .pred p; setp.ne.b32 p, %r2, 0; tcgen05.mma.cta_group::1.kind::f16 [%r3], %rd{r2}, %rd{r4}, %r{r5}, p; }}\n\
                     \t// end inline asm\n",
                    off = 32 * step,
                    r1 = r + 1,
                    r2 = r + 2,
                    r3 = r + 3,
                    r4 = r + 4,
                    r5 = r + 5,
                    a = a as i64,
                    b = b as i64,
                );
                r += 10;
            }
        }
        s + "\tret;\n}\n"
    }

    fn derived() -> ([u32; 3], [u64; 3], [u64; 3]) {
        let g = gemms();
        (g.map(|g| g.idesc), g.map(|g| g.a), g.map(|g| g.b))
    }

    #[test]
    fn a_planted_kernel_with_the_derived_values_passes() {
        let (i, a, b) = derived();
        let k = planted(i, a, b, "4, 14");
        assert_eq!(k.matches("tcgen05.mma").count(), 8 + 8 + 1);
        assert_eq!(check_kernel(&k, "k", PLANTED_HEADS), Ok(1));
        // The step counts are checked: with H = 32, dK needs two MMAs.
        let e = check_kernel(&k, "k", 32).unwrap_err();
        assert!(e.contains("MMA counts"), "{e}");
        // And a missing step is caught.
        let last = k.rfind("\tadd.s32").unwrap();
        let end = k[last..].find("// end inline asm").unwrap() + last;
        let short = format!("{}{}", &k[..last], &k[end..]);
        let e = check_kernel(&short, "k", PLANTED_HEADS).unwrap_err();
        assert!(e.contains("MMA counts"), "{e}");
    }

    #[test]
    fn every_flipped_descriptor_bit_is_caught() {
        let (i, a, b) = derived();
        for g in 0..3 {
            for bit in 0..32 {
                let mut x = i;
                x[g] ^= 1 << bit;
                let r = check_kernel(&planted(x, a, b, "4, 14"), "k", PLANTED_HEADS);
                assert!(r.is_err(), "idesc bit {bit} of GEMM {g} not caught");
            }
            for bit in 0..64 {
                for operand in 0..2 {
                    let (mut xa, mut xb) = (a, b);
                    let v = if operand == 0 { &mut xa } else { &mut xb };
                    v[g] ^= 1 << bit;
                    let r = check_kernel(&planted(i, xa, xb, "4, 14"), "k", PLANTED_HEADS);
                    assert!(
                        r.is_err(),
                        "smem desc bit {bit} of operand {operand} of GEMM {g} not caught"
                    );
                }
            }
        }
        // The failure names the field.
        let mut x = i;
        x[1] ^= 1 << 16;
        let e = check_kernel(&planted(x, a, b, "4, 14"), "k", PLANTED_HEADS).unwrap_err();
        assert!(e.contains("transpose B = 0 (expected 1)"), "{e}");
    }

    #[test]
    fn a_wrong_start_address_encoding_is_caught() {
        let (i, a, b) = derived();
        for bfe in ["4, 13", "3, 14", "0, 14"] {
            let e = check_kernel(&planted(i, a, b, bfe), "k", PLANTED_HEADS).unwrap_err();
            assert!(e.contains("expected bfe.u32 <addr>, 4, 14"), "{bfe}: {e}");
        }
    }

    #[test]
    fn edits_of_the_committed_ptx_are_caught() {
        let ptx = blackwell_ptx();
        let [s, dq, _] = gemms();
        let name = stage2_kernel(128, 64).unwrap().name;
        // Every materialisation of a constant inside the kernel (the
        // kernels after it are left as they are).
        let edit = |from: String, to: String| -> String {
            let start = ptx.find(&format!(".entry {name}(")).unwrap();
            let end = start
                + 1
                + ptx[start + 1..]
                    .find(".entry ")
                    .unwrap_or(ptx.len() - start - 1);
            let kernel = &ptx[start..end];
            assert!(kernel.contains(&from), "{from} not in {name}");
            format!(
                "{}{}{}",
                &ptx[..start],
                kernel.replace(&from, &to),
                &ptx[end..]
            )
        };
        // dQ's instruction descriptor without its B transpose bit.
        let bad = edit(
            format!(", {};", dq.idesc),
            format!(", {};", dq.idesc & !(1 << 16)),
        );
        let e = check_kernel(&bad, name, 64).unwrap_err();
        assert!(e.contains("transpose B = 0 (expected 1)"), "{e}");
        // S's K-major descriptor constant with the 64-byte swizzle code.
        let sw64 = (s.a & !(7 << 61)) | (4 << 61);
        let bad = edit(format!(", {};", s.a), format!(", {};", sw64 as i64));
        let e = check_kernel(&bad, name, 64).unwrap_err();
        assert!(e.contains("swizzling mode = 4 (expected 2)"), "{e}");
        // A start address encoded from bit 5.
        let bad = edit(", 4, 14;".into(), ", 5, 14;".into());
        let e = check_kernel(&bad, name, 64).unwrap_err();
        assert!(e.contains("expected bfe.u32"), "{e}");
        // The untouched text passes, so the edits are what failed.
        assert!(check_kernel(&ptx, name, 64).is_ok());
    }
}
