//! The forward kernels' entries, one list: every H x D of the envelope,
//! the wgmma kernel (sm_90a) and the portable kernel (every target), with
//! the names of `crate::registry::FWD_WG`, `FWD_WG_PERSIST` and `FWD_ROWS`.

use crate::abi::FwdParams;

/// The portable kernel's entry `$name` for `$h` x `$d`.
macro_rules! rows_entry {
    ($name:ident, $h:literal, $d:literal) => {
        /// The portable forward kernel (see `forward::rows`).
        ///
        /// # Safety
        /// The forward's launch contract (`forward::rows`).
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $name(p: FwdParams) {
            // SAFETY: forwarded launch contract.
            unsafe { crate::forward::rows::forward_rows::<$h, $d>(&p) }
        }
    };
}

/// The wgmma kernel's entries for the tile `$tile`: `$name` one CTA per
/// row, `$persist` on a persistent grid.
#[cfg(kernels_arch = "sm_90a")]
macro_rules! wg_entry {
    ($name:ident, $persist:ident, $tile:ident) => {
        /// The wgmma forward kernel, one CTA per row (see `forward::wg`).
        ///
        /// # Safety
        /// The forward's launch contract (`forward::wg`).
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $name(p: FwdParams) {
            // SAFETY: forwarded launch contract.
            unsafe { crate::forward::wg::forward::<crate::forward::mma::$tile>(&p) }
        }

        /// The wgmma forward kernel on a persistent grid (see
        /// `forward::wg`).
        ///
        /// # Safety
        /// The forward's launch contract (`forward::wg`).
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $persist(p: FwdParams) {
            // SAFETY: forwarded launch contract.
            unsafe { crate::forward::wg::persistent::<crate::forward::mma::$tile>(&p) }
        }
    };
}

rows_entry!(indexer_fwd_rows_h16_d64, 16, 64);
rows_entry!(indexer_fwd_rows_h16_d128, 16, 128);
rows_entry!(indexer_fwd_rows_h32_d64, 32, 64);
rows_entry!(indexer_fwd_rows_h32_d128, 32, 128);
rows_entry!(indexer_fwd_rows_h64_d64, 64, 64);
rows_entry!(indexer_fwd_rows_h64_d128, 64, 128);
rows_entry!(indexer_fwd_rows_h128_d64, 128, 64);
rows_entry!(indexer_fwd_rows_h128_d128, 128, 128);

#[cfg(kernels_arch = "sm_90a")]
wg_entry!(
    indexer_fwd_wg_h16_d64,
    indexer_fwd_wg_persist_h16_d64,
    H16D64
);
#[cfg(kernels_arch = "sm_90a")]
wg_entry!(
    indexer_fwd_wg_h16_d128,
    indexer_fwd_wg_persist_h16_d128,
    H16D128
);
#[cfg(kernels_arch = "sm_90a")]
wg_entry!(
    indexer_fwd_wg_h32_d64,
    indexer_fwd_wg_persist_h32_d64,
    H32D64
);
#[cfg(kernels_arch = "sm_90a")]
wg_entry!(
    indexer_fwd_wg_h32_d128,
    indexer_fwd_wg_persist_h32_d128,
    H32D128
);
#[cfg(kernels_arch = "sm_90a")]
wg_entry!(
    indexer_fwd_wg_h64_d64,
    indexer_fwd_wg_persist_h64_d64,
    H64D64
);
#[cfg(kernels_arch = "sm_90a")]
wg_entry!(
    indexer_fwd_wg_h64_d128,
    indexer_fwd_wg_persist_h64_d128,
    H64D128
);
#[cfg(kernels_arch = "sm_90a")]
wg_entry!(
    indexer_fwd_wg_h128_d64,
    indexer_fwd_wg_persist_h128_d64,
    H128D64
);
#[cfg(kernels_arch = "sm_90a")]
wg_entry!(
    indexer_fwd_wg_h128_d128,
    indexer_fwd_wg_persist_h128_d128,
    H128D128
);
