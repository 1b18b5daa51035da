//! The wgmma forward kernels' entries, one list: every H x D of the
//! envelope, one CTA per row and persistent, with the names of
//! `crate::registry::FWD_WG` and `FWD_WG_PERSIST`.

use crate::abi::FwdParams;

/// The wgmma kernel's entries for the tile `$tile`: `$name` one CTA per
/// row, `$persist` on a persistent grid.
macro_rules! wg_entry {
    ($name:ident, $persist:ident, $tile:ident) => {
        /// The wgmma forward kernel, one CTA per row (see `sm90::forward::wg`).
        ///
        /// # Safety
        /// The forward's launch contract (`sm90::forward::wg`).
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $name(p: FwdParams) {
            // SAFETY: forwarded launch contract.
            unsafe { super::wg::forward::<super::mma::$tile>(&p) }
        }

        /// The wgmma forward kernel on a persistent grid (see
        /// `sm90::forward::wg`).
        ///
        /// # Safety
        /// The forward's launch contract (`sm90::forward::wg`).
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $persist(p: FwdParams) {
            // SAFETY: forwarded launch contract.
            unsafe { super::wg::persistent::<super::mma::$tile>(&p) }
        }
    };
}

wg_entry!(
    indexer_fwd_wg_h16_d64,
    indexer_fwd_wg_persist_h16_d64,
    H16D64
);
wg_entry!(
    indexer_fwd_wg_h16_d128,
    indexer_fwd_wg_persist_h16_d128,
    H16D128
);
wg_entry!(
    indexer_fwd_wg_h32_d64,
    indexer_fwd_wg_persist_h32_d64,
    H32D64
);
wg_entry!(
    indexer_fwd_wg_h32_d128,
    indexer_fwd_wg_persist_h32_d128,
    H32D128
);
wg_entry!(
    indexer_fwd_wg_h64_d64,
    indexer_fwd_wg_persist_h64_d64,
    H64D64
);
wg_entry!(
    indexer_fwd_wg_h64_d128,
    indexer_fwd_wg_persist_h64_d128,
    H64D128
);
wg_entry!(
    indexer_fwd_wg_h128_d64,
    indexer_fwd_wg_persist_h128_d64,
    H128D64
);
wg_entry!(
    indexer_fwd_wg_h128_d128,
    indexer_fwd_wg_persist_h128_d128,
    H128D128
);
