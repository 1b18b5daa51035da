//! Where the stage-2 kernel keeps its tensor-core operands in shared memory
//! and the `tcgen05.mma` descriptors that read them, per K step. The kernel
//! uses exactly these functions; the tests check every element each
//! descriptor addresses (by the ISA's canonical-layout formulas in
//! [`super::desc::model_kmajor`] / [`super::desc::model_mnmajor`]) against where the
//! producer (TMA, or the compute warps) put it.
//!
//! Storage (all 128-byte swizzled, regions of 64 columns of bf16):
//! - q `[head][d]`: regions d 0..64 and 64..128, 64 rows each;
//! - K stage `[slot][d]`: regions d 0..64 and 64..128, 128 rows each
//!   (written by `tile::gather4`, four slot rows per instruction);
//! - dS `[head][slot]`: regions slot 0..64 and 64..128, 64 rows each.
//!
//! The three GEMMs of a chunk:
//! - S = q K^T: M = 64 heads, N = 128 slots, K = D; A = q (K-major),
//!   B = K (K-major);
//! - dQ += dS K: M = 64 heads, N = 128 (D), K = 128 slots; A = dS
//!   (K-major), B = K (MN-major: D contiguous);
//! - dK = dS^T q: M = 128 slots, N = 128 (D), K = heads; A = dS (MN-major:
//!   slots contiguous), B = q (MN-major).

use super::budget::{SM100_CHUNK, SM100_DIM, SMEM_DS_REGION, SMEM_K_REGION, SMEM_Q_REGION};
use super::desc::{
    instr_desc_f16, kmajor_step, mnmajor_step, sw128_kmajor, sw128_mnmajor, Accum, F16Kind, Major,
};
use crate::tma::swizzle128_offset;

/// Byte offset of q element `(h, d)` in a q buffer.
pub const fn q_at(h: u32, d: u32) -> u32 {
    (d / 64) * SMEM_Q_REGION + swizzle128_offset(h, d % 64)
}

/// Byte offset of K element `(slot, d)` in a K stage.
pub const fn k_at(slot: u32, d: u32) -> u32 {
    (d / 64) * SMEM_K_REGION + swizzle128_offset(slot, d % 64)
}

/// Byte offset of dS element `(h, slot)` in the dS buffer.
pub const fn ds_at(h: u32, slot: u32) -> u32 {
    (slot / 64) * SMEM_DS_REGION + swizzle128_offset(h, slot % 64)
}

/// Byte offset in a K stage where gather4 number `g` (slots `4g..4g+4`)
/// of column half `half` (D columns `64 half ..`) lands.
pub const fn gather4_dst(g: u32, half: u32) -> u32 {
    half * SMEM_K_REGION + g * 4 * 128
}

/// Instruction descriptor of S = q K^T.
pub const IDESC_S: u32 = instr_desc_f16(
    64,
    SM100_CHUNK,
    F16Kind::Bf16,
    Accum::F32,
    Major::K,
    Major::K,
);
/// Instruction descriptor of dQ += dS K.
pub const IDESC_DQ: u32 = instr_desc_f16(
    64,
    SM100_DIM,
    F16Kind::Bf16,
    Accum::F32,
    Major::K,
    Major::MN,
);
/// Instruction descriptor of dK = dS^T q.
pub const IDESC_DK: u32 = instr_desc_f16(
    SM100_CHUNK,
    SM100_DIM,
    F16Kind::Bf16,
    Accum::F32,
    Major::MN,
    Major::MN,
);

/// K steps (16 each) of S (over D) and of dQ (over the chunk's slots).
pub const S_STEPS: u32 = SM100_DIM / 16;
/// See [`S_STEPS`].
pub const DQ_STEPS: u32 = SM100_CHUNK / 16;
/// K steps of dK for `heads` heads (only real heads: padded ones are zero).
pub const fn dk_steps(heads: u32) -> u32 {
    heads / 16
}

/// `(a, b)` descriptors of S step `ks` for q at `q` and the K stage at `k`
/// (shared-window addresses).
pub const fn s_descs(q: u32, k: u32, ks: u32) -> (u64, u64) {
    (
        sw128_kmajor(q + kmajor_step(ks, SMEM_Q_REGION)),
        sw128_kmajor(k + kmajor_step(ks, SMEM_K_REGION)),
    )
}

/// `(a, b)` descriptors of dQ step `ks`.
pub const fn dq_descs(ds: u32, k: u32, ks: u32) -> (u64, u64) {
    (
        sw128_kmajor(ds + kmajor_step(ks, SMEM_DS_REGION)),
        sw128_mnmajor(k + mnmajor_step(ks), SMEM_K_REGION),
    )
}

/// `(a, b)` descriptors of dK step `ks`.
pub const fn dk_descs(ds: u32, q: u32, ks: u32) -> (u64, u64) {
    (
        sw128_mnmajor(ds + mnmajor_step(ks), SMEM_DS_REGION),
        sw128_mnmajor(q + mnmajor_step(ks), SMEM_Q_REGION),
    )
}

#[cfg(test)]
mod tests {
    use super::super::desc::{model_kmajor, model_mnmajor};
    use super::*;

    /// Decodes (start, LBO, SBO, swizzle) of a descriptor.
    fn fields(d: u64) -> (u32, u32, u32, u64) {
        let f = |s: u32| (((d >> s) & 0x3fff) as u32) << 4;
        (f(0), f(16), f(32), d >> 61)
    }

    /// Address of element `(mn, kk)` of operand `which` (0 = A, 1 = B) of an
    /// MMA with instruction descriptor `idesc` and smem descriptor `d`: the
    /// major-ness comes from the instruction descriptor's transpose bit
    /// (15 for A, 16 for B), the strides from the smem descriptor.
    fn addr(idesc: u32, which: u32, d: u64, mn: u32, kk: u32) -> u32 {
        let (start, lbo, sbo, sw) = fields(d);
        assert_eq!(sw, 2, "128-byte swizzle");
        if (idesc >> (15 + which)) & 1 == 1 {
            model_mnmajor(start, lbo, sbo, mn, kk)
        } else {
            model_kmajor(start, sbo, mn, kk)
        }
    }

    // Buffers at 1024-aligned addresses as in the kernel (any such base).
    const Q: u32 = 0x1_0000;
    const K: u32 = 0x0_8000;
    const DS: u32 = 0x1_8000;

    #[test]
    fn s_descriptors_address_q_and_k_where_they_are_stored() {
        for ks in 0..S_STEPS {
            let (a, b) = s_descs(Q, K, ks);
            for kk in 0..16 {
                let d = ks * 16 + kk;
                for h in 0..64 {
                    assert_eq!(
                        addr(IDESC_S, 0, a, h, kk),
                        Q + q_at(h, d),
                        "A ks {ks} h {h} kk {kk}"
                    );
                }
                for slot in 0..128 {
                    assert_eq!(
                        addr(IDESC_S, 1, b, slot, kk),
                        K + k_at(slot, d),
                        "B ks {ks} slot {slot}"
                    );
                }
            }
        }
    }

    #[test]
    fn dq_descriptors_address_ds_and_k_where_they_are_stored() {
        for ks in 0..DQ_STEPS {
            let (a, b) = dq_descs(DS, K, ks);
            for kk in 0..16 {
                let slot = ks * 16 + kk;
                for h in 0..64 {
                    assert_eq!(addr(IDESC_DQ, 0, a, h, kk), DS + ds_at(h, slot));
                }
                for d in 0..128 {
                    assert_eq!(
                        addr(IDESC_DQ, 1, b, d, kk),
                        K + k_at(slot, d),
                        "ks {ks} d {d} kk {kk}"
                    );
                }
            }
        }
    }

    #[test]
    fn dk_descriptors_address_ds_and_q_where_they_are_stored() {
        for heads in [32u32, 64] {
            for ks in 0..dk_steps(heads) {
                let (a, b) = dk_descs(DS, Q, ks);
                for kk in 0..16 {
                    let h = ks * 16 + kk;
                    assert!(h < heads);
                    for slot in 0..128 {
                        assert_eq!(addr(IDESC_DK, 0, a, slot, kk), DS + ds_at(h, slot));
                    }
                    for d in 0..128 {
                        assert_eq!(addr(IDESC_DK, 1, b, d, kk), Q + q_at(h, d));
                    }
                }
            }
        }
    }

    #[test]
    fn gather4_destinations_hold_the_rows_k_at_expects() {
        // gather4 g writes slot rows 4g..4g+4, 128 bytes each, swizzled by
        // address; k_at must find slot s, column c inside that write.
        for g in 0..32 {
            for half in 0..2 {
                let dst = gather4_dst(g, half);
                assert_eq!(dst % 512, 0, "gather4 destinations are 512-byte aligned");
                for r in 0..4 {
                    for c in 0..64 {
                        let unswizzled = dst + r * 128 + c * 2;
                        assert_eq!(
                            super::super::desc::swizzle128(unswizzled),
                            k_at(4 * g + r, 64 * half + c)
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn instruction_descriptors_have_the_gemm_shapes() {
        let shape = |i: u32| (((i >> 24) & 0x1f) << 4, ((i >> 17) & 0x3f) << 3);
        assert_eq!(shape(IDESC_S), (64, 128));
        assert_eq!(shape(IDESC_DQ), (64, 128));
        assert_eq!(shape(IDESC_DK), (128, 128));
        assert_eq!((IDESC_S >> 15) & 3, 0b00);
        assert_eq!((IDESC_DQ >> 15) & 3, 0b10, "B MN-major");
        assert_eq!((IDESC_DK >> 15) & 3, 0b11, "A and B MN-major");
        assert_eq!(dk_steps(32), 2);
        assert_eq!(dk_steps(64), 4);
    }
}
