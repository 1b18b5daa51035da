//! The Hopper (sm_90a) kernels, one folder each, and what they all share:
//! the 128-byte swizzle of their shared-memory operand tiles and the
//! `wgmma` matrix descriptors that address them (plain Rust, host-tested).
//! - `bwd`: the sparse backward's wgmma kernels (stage 2 after the
//!   portable stage 1): the row kernel of every H x D, the paired kernel,
//!   their deterministic twins;
//! - `dense`: dense mode's stage 1 and its warp-specialised tile kernel;
//! - `det`: deterministic mode's passes around the twins (device only);
//! - `forward`: the wgmma forward kernels (device only; the forward's
//!   sizes and the parts it shares with the portable kernel are
//!   `crate::portable::forward`).
//!
//! An operand tile is stored as "swizzle blocks": 1024-byte aligned groups
//! of rows of [`ROW_BYTES`] (64 bf16), the 16-byte chunk index of row `r`
//! XORed with `r % 8`, which is what the tensor cores read in 128-byte
//! swizzle mode and what TMA's 128-byte swizzle writes.

pub mod bwd;
pub mod dense;
sm90a_modules!(det, forward);

/// Bytes per swizzled row (64 bf16).
pub const ROW_BYTES: u32 = 128;
/// bf16 elements per swizzled row.
pub const ROW_ELEMS: u32 = ROW_BYTES / 2;
/// Bytes of one group of eight swizzled rows (the swizzle's repeat).
pub const ATOM_BYTES: u32 = 8 * ROW_BYTES;

/// Byte offset, inside a swizzle block, of byte `col_byte` (< 128) of row
/// `row`: the 16-byte chunk index is XORed with `row % 8` (the pattern the
/// tensor cores apply to 1024-byte aligned blocks in 128-byte swizzle mode).
pub const fn swizzle(row: u32, col_byte: u32) -> u32 {
    row * ROW_BYTES + ((((col_byte / 16) ^ (row % 8)) * 16) | (col_byte % 16))
}

/// Shared-memory matrix descriptor of a 128-byte-swizzled operand
/// (PTX ISA, wgmma "Matrix Descriptor Format"): bits 0-13 start address,
/// 16-29 leading-dimension byte offset, 32-45 stride-dimension byte offset
/// (each `(x & 0x3FFFF) >> 4`), 49-51 base offset (0: blocks are 1024-byte
/// aligned), 62-63 swizzle mode (1 = 128 bytes).
///
/// K-major operand (rows along M/N): `sbo` = [`ATOM_BYTES`] between groups
/// of eight rows, `lbo` unused by the hardware for swizzled K-major tiles;
/// stepping K by 16 inside a row moves `start` by 32 bytes. MN-major operand
/// (rows along K): `lbo` = bytes between 64-element blocks along M/N, `sbo`
/// = bytes between groups of eight K rows.
pub const fn desc(start: u32, lbo: u32, sbo: u32) -> u64 {
    ((start as u64 & 0x3FFFF) >> 4)
        | (((lbo as u64 & 0x3FFFF) >> 4) << 16)
        | (((sbo as u64 & 0x3FFFF) >> 4) << 32)
        | (1u64 << 62)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swizzle_is_a_permutation_of_each_block_and_matches_the_xor_rule() {
        let mut seen = [false; ATOM_BYTES as usize];
        for row in 0..8 {
            for chunk in 0..8 {
                let o = swizzle(row, chunk * 16 + 4);
                assert_eq!(o % 16, 4);
                assert_eq!(o / ROW_BYTES, row, "stays in its row");
                assert_eq!((o % ROW_BYTES) / 16, chunk ^ row);
                seen[(o - 4) as usize] = true;
            }
        }
        assert_eq!(seen.iter().filter(|&&s| s).count(), 64);
        // Rows 8.. repeat the pattern of rows 0..8 one block further on.
        assert_eq!(swizzle(11, 37), ATOM_BYTES + swizzle(3, 37));
    }

    #[test]
    fn descriptor_fields_sit_where_the_isa_puts_them() {
        let d = desc(0x1_2340, 8192, 1024);
        assert_eq!(d & 0x3FFF, 0x1234, "start >> 4 in bits 0-13");
        assert_eq!((d >> 16) & 0x3FFF, 8192 >> 4, "lbo >> 4 in bits 16-29");
        assert_eq!((d >> 32) & 0x3FFF, 1024 >> 4, "sbo >> 4 in bits 32-45");
        assert_eq!((d >> 49) & 0x7, 0, "base offset");
        assert_eq!(d >> 62, 1, "128-byte swizzle");
        // Reserved bits stay clear.
        assert_eq!(d & (0x3 << 14 | 0x3 << 30 | 0xFFFF << 46 & !(0x3 << 62)), 0);
        // Start addresses wrap at 2^18 like the ISA's encode function.
        assert_eq!(desc(0x4_0010, 0, 0) & 0x3FFF, 1);
    }
}
