//! Device kernels of the DeepSeek Sparse Attention lightning-indexer backward.
//!
//! This crate is compiled twice:
//! - for `nvptx64-nvidia-cuda` by `cargo xtask build-ptx` (pinned nightly,
//!   `-Zbuild-std=core`), producing the committed PTX in `ptx/`;
//! - as an ordinary `no_std` rlib for the host, which imports [`params`]
//!   (kernel names, launch shapes, shared-memory budgets and the `#[repr(C)]`
//!   parameter structs) instead of repeating them.
//!
//! Raw `asm!` lives only in `ptx` (device builds only).
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, asm_experimental_arch, stdarch_nvptx)
)]

#[cfg(test)]
extern crate std;

pub mod params;
pub mod score;
pub mod sm100;
pub mod sm90;
pub mod tiles;

#[cfg(target_arch = "nvptx64")]
pub mod ptx;

#[cfg(target_arch = "nvptx64")]
mod cast;
#[cfg(target_arch = "nvptx64")]
mod ceil;
#[cfg(target_arch = "nvptx64")]
mod grad;
#[cfg(target_arch = "nvptx64")]
mod smoke;
#[cfg(target_arch = "nvptx64")]
mod stage1;

/// Device panics cannot unwind: trap, which fails the launch with an error the
/// host sees at the next synchronisation.
#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    ptx::sync::trap()
}
