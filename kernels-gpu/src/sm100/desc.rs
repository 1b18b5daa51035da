//! Encoders of the two tcgen05 descriptors, following the bit layouts of
//! the PTX ISA ("Shared memory descriptor" and "Instruction descriptor" of
//! the tcgen05 section). `const fn`, so kernels can build them at compile
//! time and the host unit tests pin every field.

/// Swizzle modes of the shared-memory descriptor (bits 61..64).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Swizzle {
    /// No swizzling (canonical 8x16-byte core matrices).
    None = 0,
    /// 128-byte swizzle with 32-byte atoms.
    B128Atom32 = 1,
    /// 128-byte swizzle.
    B128 = 2,
    /// 64-byte swizzle.
    B64 = 4,
    /// 32-byte swizzle.
    B32 = 6,
}

/// Shared-memory matrix descriptor of `tcgen05.mma` operands:
/// - bits 0..14: start address >> 4
/// - bits 16..30: leading-dimension byte offset >> 4
/// - bits 32..46: stride-dimension byte offset >> 4
/// - bits 46..49: fixed 0b001
/// - bits 49..52: matrix base offset (0 for tiles aligned to the swizzle pattern)
/// - bit 52: leading-dimension offset mode (0: relative)
/// - bits 61..64: swizzle mode
///
/// Addresses and offsets must be multiples of 16 and below 2^18.
pub const fn smem_desc(start: u32, lbo: u32, sbo: u32, swizzle: Swizzle) -> u64 {
    field14(start)
        | (field14(lbo) << 16)
        | (field14(sbo) << 32)
        | (1u64 << 46)
        | ((swizzle as u64) << 61)
}

/// A byte address or offset as the 14-bit field of a descriptor (>> 4).
const fn field14(v: u32) -> u64 {
    ((v >> 4) & 0x3fff) as u64
}

/// Operand element types of `tcgen05.mma.kind::f16`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum F16Kind {
    /// IEEE half.
    F16 = 0,
    /// bfloat16.
    Bf16 = 1,
}

/// Accumulator type (bits 4..6 of the instruction descriptor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Accum {
    /// f16 accumulation.
    F16 = 0,
    /// f32 accumulation.
    F32 = 1,
}

/// Operand major-ness (bits 15 and 16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Major {
    /// The reduction dimension K is contiguous.
    K = 0,
    /// M (for A) or N (for B) is contiguous.
    MN = 1,
}

/// Instruction descriptor of dense `tcgen05.mma.kind::f16`:
/// - bits 0..4: sparsity and saturation (0 for dense, no saturate)
/// - bits 4..6: D type; bits 7..10: A type; bits 10..13: B type
/// - bits 13, 14: negate A, B (0)
/// - bits 15, 16: A major, B major
/// - bits 17..23: N >> 3; bits 24..29: M >> 4
/// - bits 30..32: max shift (0: not a .ws instruction)
///
/// Panics (at compile time when const-evaluated) on shapes the
/// instruction does not support with dense `cta_group::1` (PTX ISA,
/// tcgen05 "Matrix Shape" table): M in {64, 128}, N a multiple of 8 in
/// 8..=256 (the step of 16 applies to `cta_group::2` only).
pub const fn instr_desc_f16(
    m: u32,
    n: u32,
    ab: F16Kind,
    d: Accum,
    a_major: Major,
    b_major: Major,
) -> u32 {
    assert!(
        m == 64 || m == 128,
        "cta_group::1 kind::f16 supports M = 64 or 128"
    );
    assert!(n >= 8 && n <= 256, "N must be in 8..=256");
    assert!(n.is_multiple_of(8), "N step is 8");
    ((d as u32) << 4)
        | ((ab as u32) << 7)
        | ((ab as u32) << 10)
        | ((a_major as u32) << 15)
        | ((b_major as u32) << 16)
        | ((n >> 3) << 17)
        | ((m >> 4) << 24)
}

/// Byte offset of element `(row, k)` (bf16) in a K-major tile stored in the
/// no-swizzle canonical layout: 8-row x 16-byte core matrices, `lbo` bytes
/// between core matrices adjacent along K, `sbo` bytes between core
/// matrices adjacent along rows. These `lbo`/`sbo` go into [`smem_desc`].
pub const fn kmajor_offset(row: u32, k: u32, lbo: u32, sbo: u32) -> u32 {
    (row / 8) * sbo + (k / 8) * lbo + (row % 8) * 16 + (k % 8) * 2
}

/// Bytes of one 128-byte swizzle atom (8 rows of 128 bytes); also the SBO
/// of every 128-byte-swizzled operand here (8-row groups packed densely).
pub const SW128_ATOM: u32 = 1024;

/// Descriptor of a K-major operand in the 128-byte-swizzled canonical
/// layout: rows 128 bytes apart, 8-row groups [`SW128_ATOM`] apart (SBO);
/// LBO is unused for swizzled K-major layouts ("assumed 1": encoded 1).
pub const fn sw128_kmajor(start: u32) -> u64 {
    smem_desc(start, 16, SW128_ATOM, Swizzle::B128)
}

/// Descriptor of an MN-major operand in the 128-byte-swizzled canonical
/// layout: 64 MN-contiguous bf16 per 128-byte row, K rows 128 bytes apart,
/// 8-row K groups [`SW128_ATOM`] apart (SBO), and `lbo` bytes from one
/// 64-element MN block to the next (the ISA's LBO for swizzled MN-major
/// layouts: "stride from the first (swizzle-byte-size/16) rows to the next").
pub const fn sw128_mnmajor(start: u32, lbo: u32) -> u64 {
    smem_desc(start, lbo, SW128_ATOM, Swizzle::B128)
}

/// Start-address offset of MMA K step `ks` (16 bf16 per step) of a K-major
/// 128-byte-swizzled operand stored as regions of 64 K-columns,
/// `region_bytes` apart: 32 bytes per step inside an atom row.
pub const fn kmajor_step(ks: u32, region_bytes: u32) -> u32 {
    (ks / 4) * region_bytes + (ks % 4) * 32
}

/// Start-address offset of MMA K step `ks` of an MN-major 128-byte-swizzled
/// operand: 16 K rows are two whole atoms.
pub const fn mnmajor_step(ks: u32) -> u32 {
    ks * 2 * SW128_ATOM
}

/// The 128-byte swizzle as the hardware applies it to a shared-memory
/// address (pattern repeating every 1024 bytes): bits 4..7 ^= bits 7..10.
pub const fn swizzle128(addr: u32) -> u32 {
    addr ^ (((addr >> 7) & 7) << 4)
}

/// Address of element `(m, kk)` (`kk` < 16, one MMA K step) of a K-major
/// 128-byte-swizzled operand described by start address `start` and `sbo`,
/// as the canonical layout `((8, m), (64, k)) : ((128 B, SBO), (2 B, -))`
/// defines it (swizzle applied to the address).
pub const fn model_kmajor(start: u32, sbo: u32, m: u32, kk: u32) -> u32 {
    swizzle128(start + (m / 8) * sbo + (m % 8) * 128 + kk * 2)
}

/// Address of element `(mn, kk)` (`kk` < 16) of an MN-major 128-byte
/// swizzled operand: `((64, n), (8, k)) : ((2 B, LBO), (128 B, SBO))`.
pub const fn model_mnmajor(start: u32, lbo: u32, sbo: u32, mn: u32, kk: u32) -> u32 {
    swizzle128(start + (mn / 64) * lbo + (kk / 8) * sbo + (kk % 8) * 128 + (mn % 64) * 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smem_descriptor_fields_land_on_the_isa_bits() {
        let d = smem_desc(0x1_2340, 0x80, 0x400, Swizzle::B128);
        assert_eq!(d & 0x3fff, 0x1234, "start address >> 4 in bits 0..14");
        assert_eq!((d >> 16) & 0x3fff, 0x8, "LBO >> 4 in bits 16..30");
        assert_eq!((d >> 32) & 0x3fff, 0x40, "SBO >> 4 in bits 32..46");
        assert_eq!((d >> 46) & 0x7, 0b001, "fixed 0b001 in bits 46..49");
        assert_eq!((d >> 49) & 0x7, 0, "base offset");
        assert_eq!((d >> 52) & 1, 0, "relative LBO mode");
        assert_eq!(d >> 61, 2, "128B swizzle code");
        assert_eq!(smem_desc(0, 0, 0, Swizzle::None), 1 << 46);
        assert_eq!(smem_desc(0, 0, 0, Swizzle::B32) >> 61, 6);
        assert_eq!(smem_desc(0, 0, 0, Swizzle::B64) >> 61, 4);
        assert_eq!(smem_desc(0, 0, 0, Swizzle::B128Atom32) >> 61, 1);
        // Bits 14..16, 30..32 and 53..61 stay zero.
        let all = smem_desc(0x3fff0, 0x3fff0, 0x3fff0, Swizzle::B32);
        assert_eq!(all & ((0b11 << 14) | (0b11 << 30) | (0xff << 53)), 0);
    }

    #[test]
    fn instruction_descriptor_fields_land_on_the_isa_bits() {
        let i = instr_desc_f16(128, 256, F16Kind::Bf16, Accum::F32, Major::K, Major::K);
        assert_eq!(i & 0xf, 0, "dense, no saturate");
        assert_eq!((i >> 4) & 0x3, 1, "f32 accumulator");
        assert_eq!((i >> 7) & 0x7, 1, "A bf16");
        assert_eq!((i >> 10) & 0x7, 1, "B bf16");
        assert_eq!((i >> 13) & 0x3, 0, "no negation");
        assert_eq!((i >> 15) & 0x3, 0, "both K-major");
        assert_eq!((i >> 17) & 0x3f, 32, "N >> 3");
        assert_eq!((i >> 23) & 1, 0, "reserved bit 23");
        assert_eq!((i >> 24) & 0x1f, 8, "M >> 4");
        assert_eq!(i >> 29, 0, "reserved bit 29, max shift 0");
        let j = instr_desc_f16(64, 8, F16Kind::F16, Accum::F16, Major::MN, Major::MN);
        assert_eq!(j, (1 << 15) | (1 << 16) | (1 << 17) | (4 << 24));
    }

    #[test]
    #[should_panic]
    fn unsupported_m_is_rejected() {
        let _ = instr_desc_f16(32, 64, F16Kind::Bf16, Accum::F32, Major::K, Major::K);
    }

    #[test]
    #[should_panic]
    fn n_not_a_multiple_of_8_is_rejected() {
        let _ = instr_desc_f16(128, 20, F16Kind::Bf16, Accum::F32, Major::K, Major::K);
    }

    #[test]
    fn n_in_steps_of_8_is_accepted_for_both_m() {
        // cta_group::1 dense kind::f16: N = 8, 16, 24, ... 256 for M = 64 and 128.
        let i = instr_desc_f16(128, 24, F16Kind::Bf16, Accum::F32, Major::K, Major::K);
        assert_eq!((i >> 17) & 0x3f, 3);
        let j = instr_desc_f16(64, 256, F16Kind::Bf16, Accum::F32, Major::K, Major::K);
        assert_eq!((j >> 17) & 0x3f, 32);
    }

    #[test]
    fn kmajor_layout_is_a_bijection_onto_the_tile() {
        // A 64 x 64 bf16 tile: 8 x 8 core matrices of 128 bytes; K-adjacent
        // core matrices 128 bytes apart, row-adjacent ones 1024 bytes apart.
        let (rows, ks, lbo, sbo) = (64u32, 64u32, 128u32, 1024u32);
        let mut seen = std::vec![false; (rows * ks) as usize];
        for r in 0..rows {
            for k in 0..ks {
                let off = kmajor_offset(r, k, lbo, sbo);
                assert_eq!(off % 2, 0);
                let slot = (off / 2) as usize;
                assert!(!seen[slot], "({r}, {k}) collides");
                seen[slot] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
        // Eight consecutive k of one row are 16 contiguous bytes.
        assert_eq!(
            kmajor_offset(9, 7, lbo, sbo) - kmajor_offset(9, 0, lbo, sbo),
            14
        );
    }

    #[test]
    fn sw128_descriptors_encode_the_isa_fields() {
        let k = sw128_kmajor(0x8000);
        assert_eq!(k & 0x3fff, 0x800);
        assert_eq!((k >> 16) & 0x3fff, 1, "LBO unused for swizzled K-major: 1");
        assert_eq!((k >> 32) & 0x3fff, 1024 >> 4);
        assert_eq!(k >> 61, 2);
        let m = sw128_mnmajor(0x8000, 16384);
        assert_eq!((m >> 16) & 0x3fff, 16384 >> 4);
        assert_eq!((m >> 32) & 0x3fff, 1024 >> 4);
        assert_eq!((m >> 46) & 7, 1);
        assert_eq!(kmajor_step(5, 8192), 8192 + 32);
        assert_eq!(mnmajor_step(3), 3 * 2048);
    }

    #[test]
    fn swizzle128_matches_the_tma_image() {
        for row in 0..128u32 {
            for col in 0..64u32 {
                assert_eq!(
                    swizzle128(row * 128 + col * 2),
                    crate::tma::swizzle128_offset(row, col)
                );
            }
        }
    }
}
