//! The entry of the dense tile kernel: the context, and the dispatch of
//! the CTA's work item to its kind.

use super::ctx::Ctx;
use super::{keys, rows};
use crate::abi::{
    DenseTileParams, DENSE_ITEM_KEYS, DENSE_ITEM_ROWS, DENSE_ITEM_WORDS, DENSE_TILE_THREADS,
};
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{griddep, sreg, sync};
use crate::registry::DENSE_WG;

const _: () = assert!(DENSE_WG.threads == DENSE_TILE_THREADS);

/// Dense stage 2 over key tiles, H = 64, D = 128 (module note). Launch:
/// grid `p.n_items`, [`DENSE_TILE_THREADS`] threads, `SMEM.bytes` of
/// dynamic shared memory, as a programmatic dependent of dense stage 1.
///
/// # Safety
/// `p` built by the dense plan from validated buffers: `index_q`,
/// `weights`, `index_k`, grad_signal and `visible` of the shape the items
/// describe (`index_q`, `index_k` 16-byte aligned, `visible[r] <= cols`
/// and at most the key count of the row's batch), every item well formed
/// (`abi::DENSE_ITEM_*`: in-range rows and keys of one batch; key items
/// covering every key row once, row items every query row once), outputs
/// disjoint from the inputs.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn indexer_dense_bwd_wg_h64_d128(p: DenseTileParams) {
    // grad_signal is stage 1's output: nothing is read before this.
    // SAFETY: orders the CTA after stage 1.
    unsafe { griddep::wait() };
    let tid = sreg::thread_idx_x();
    let raw = smem::base().0;
    let c = Ctx {
        p: &p,
        tid,
        wg: tid / 128,
        t: tid % 128,
        base: SmemAddr((raw + 1023) & !1023),
    };
    let item = p.items as *const u32;
    let at = sreg::block_idx_x() as usize * DENSE_ITEM_WORDS;
    // SAFETY: block < n_items, inside the item array; CTA-uniform loads.
    let w = |i: usize| unsafe { *item.add(at + i) };
    // SAFETY: the launch contract; every thread takes the same arm.
    unsafe {
        match w(0) {
            DENSE_ITEM_ROWS => rows::run(&c, w(1), w(2), w(3), w(4)),
            DENSE_ITEM_KEYS => keys::run(&c, w(1), w(2), w(3), w(4), w(5)),
            _ => sync::trap(),
        }
    }
}
