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
/// instruction does not support with cta_group::1: M in {64, 128}, N a
/// multiple of 8 (M = 64) or 16 (M = 128) in 8..=256.
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
    assert!(
        n.is_multiple_of(if m == 64 { 8 } else { 16 }),
        "N step is 8 (M=64) or 16 (M=128)"
    );
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
    fn n_not_a_multiple_of_16_with_m128_is_rejected() {
        let _ = instr_desc_f16(128, 24, F16Kind::Bf16, Accum::F32, Major::K, Major::K);
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
}
