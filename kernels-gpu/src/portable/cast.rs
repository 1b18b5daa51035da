//! Stage 3: cast of the f32 `d_index_k` accumulator to bf16.

use crate::abi::{CastParams, CAST_VEC};
use crate::ptx::{cvt, global, sreg};

/// Grid-stride cast, [`CAST_VEC`] elements per thread per step.
///
/// # Safety
/// `p.src` (16-byte aligned) and `p.dst` (8-byte aligned) must be valid for
/// `p.len` elements and not overlap.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn cast_f32_to_bf16(p: CastParams) {
    let stride = (sreg::grid_dim_x() * sreg::block_dim_x()) as u64;
    let mut i = (sreg::block_idx_x() * sreg::block_dim_x() + sreg::thread_idx_x()) as u64;
    let vec = CAST_VEC as u64;
    let src = p.src as *const u8;
    let dst = p.dst as *mut u32;
    while i * vec < p.len {
        let e = i * vec;
        if e + vec <= p.len {
            // SAFETY: elements e..e+4 exist; 16-byte aligned since src is and e % 4 == 0.
            let v = unsafe { global::ld_nc_v4(src.add(4 * e as usize)) };
            let lo = cvt::pack_bf16x2(f32::from_bits(v[0]), f32::from_bits(v[1]));
            let hi = cvt::pack_bf16x2(f32::from_bits(v[2]), f32::from_bits(v[3]));
            // SAFETY: dst elements e..e+4 exist; two aligned u32 stores.
            unsafe {
                *dst.add(e as usize / 2) = lo;
                *dst.add(e as usize / 2 + 1) = hi;
            }
        } else {
            let mut j = e;
            while j < p.len {
                // SAFETY: j < len for both buffers.
                unsafe {
                    let x = *(p.src as *const f32).add(j as usize);
                    let w = cvt::pack_bf16x2(x, 0.0);
                    *(p.dst as *mut u16).add(j as usize) = w as u16;
                }
                j += 1;
            }
        }
        i += stride;
    }
}
