//! Tensor maps on the host: the `cuTensorMapEncodeTiled` arguments of a
//! map whose geometry `kernels_gpu::tma` gives, and their encoding at a
//! call's device address. One module for every path that loads through
//! TMA (dense mode's tile kernel on sm_90a, the sm_100f path).

use crate::error::Result;
use cudarc::driver::sys;
use kernels_gpu::abi::TensorMap;
use kernels_gpu::tma::Map2d;

/// Arguments of `cuTensorMapEncodeTiled` for a 2D bf16 map, 128-byte
/// swizzle (plain data, so the geometry is testable without a GPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TiledArgs {
    /// `globalDim`, innermost first.
    pub dims: [u64; 2],
    /// `globalStrides` (rank - 1 entries, bytes).
    pub strides: [u64; 1],
    /// `boxDim`, innermost first.
    pub box_dims: [u32; 2],
    /// `elementStrides`.
    pub element_strides: [u32; 2],
}

impl TiledArgs {
    /// The arguments of map `m` (unit element strides).
    pub fn of(m: &Map2d) -> TiledArgs {
        TiledArgs {
            dims: m.dims,
            strides: [m.row_stride],
            box_dims: m.box_dims,
            element_strides: [1, 1],
        }
    }
    /// Bytes one box brings into shared memory.
    #[cfg(test)]
    pub(crate) fn box_bytes(&self) -> u32 {
        self.box_dims[0] * self.box_dims[1] * 2
    }
}

/// Encodes one bf16 map at device address `base` (the sm_100f path's
/// maps, dense mode's tile kernel's, and the bring-up probes', which so
/// get stage 2's maps).
pub(crate) fn encode(base: u64, a: &TiledArgs) -> Result<TensorMap> {
    let mut raw = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: host-side encoding into `raw` (128 bytes); the argument arrays
    // live across the call and hold `rank` (or rank - 1) entries; the
    // address is only recorded, not dereferenced.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            raw.as_mut_ptr(),
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            2,
            base as *mut std::ffi::c_void,
            a.dims.as_ptr(),
            a.strides.as_ptr(),
            a.box_dims.as_ptr(),
            a.element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        .result()?;
    }
    // SAFETY: zero-initialised, then written by the driver.
    let raw = unsafe { raw.assume_init() };
    Ok(TensorMap(raw.opaque))
}
