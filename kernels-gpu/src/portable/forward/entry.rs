//! The portable forward kernel's entries, one per H x D of the envelope,
//! with the names of `crate::registry::FWD_ROWS` (the wgmma kernels'
//! entries are `crate::sm90::forward`'s).

use crate::abi::FwdParams;

/// The portable kernel's entry `$name` for `$h` x `$d`.
macro_rules! rows_entry {
    ($name:ident, $h:literal, $d:literal) => {
        /// The portable forward kernel (see `portable::forward::rows`).
        ///
        /// # Safety
        /// The forward's launch contract (`portable::forward::rows`).
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $name(p: FwdParams) {
            // SAFETY: forwarded launch contract.
            unsafe { super::rows::forward_rows::<$h, $d>(&p) }
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
