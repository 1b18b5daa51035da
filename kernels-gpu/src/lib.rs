//! Device kernels of the DeepSeek Sparse Attention lightning-indexer backward.
//!
//! This crate is compiled twice:
//! - for `nvptx64-nvidia-cuda` by `cargo xtask build-ptx` (pinned nightly,
//!   `-Zbuild-std=core`), producing the committed PTX in `ptx/`;
//! - as an ordinary `no_std` rlib for the host, which imports the
//!   `#[repr(C)]` parameter structs and launch constants ([`abi`]), the
//!   kernels' names, launch bounds and targets ([`registry`]) and the
//!   shared-memory budgets instead of repeating them, and the committed PTX texts
//!   ([`PTX_SM90A`], [`PTX_SM100F`], [`PTX_SM90`]) with the machine code
//!   assembled from them ([`SASS_SM90A`], [`SASS_SM100A`], [`SASS_SM103A`],
//!   [`SASS_SM120`]) that the host embeds, and the lab's PTX of the
//!   instruments ([`PTX_LAB_SM90A`], [`PTX_LAB_SM100F`], [`SASS_LAB_SM90A`]).
//!
//! Raw `asm!` lives only in `ptx` (device builds only).
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, asm_experimental_arch, stdarch_nvptx)
)]
// `#[rustc_force_inline]` (inlining in MIR, before LLVM) for the steps of
// the sm_90a wgmma kernels: see `sm90::bwd::wg`.
#![cfg_attr(
    all(target_arch = "nvptx64", kernels_arch = "sm_90a"),
    feature(rustc_attrs),
    allow(internal_features)
)]
// The lab build (`kernels_lab`) compiles the product's device helpers
// without the product's entries, so most of them are unused there.
#![cfg_attr(kernels_lab, allow(dead_code, unused_imports, unused_macros))]
#[cfg(test)]
extern crate std;

/// Declares child modules that exist in the sm_90a product build only (the
/// kernels' role modules; their parents' constants and host-tested
/// functions compile everywhere).
macro_rules! sm90a_modules {
    ($($m:ident),* $(,)?) => {
        $(
            #[cfg(all(target_arch = "nvptx64", kernels_arch = "sm_90a", not(kernels_lab)))]
            mod $m;
        )*
    };
}

pub mod abi;
pub mod det;
pub mod portable;
pub mod registry;
pub mod sched;
pub mod score;
pub mod sm100;
pub mod sm90;
#[cfg(test)]
mod testing;
pub mod tma;

#[cfg(target_arch = "nvptx64")]
pub mod ptx;

// The product's entries exist in the product builds only (not
// `kernels_lab`); the instruments in the lab builds only, for sm_90a and
// sm_100f (`lab`, `registry::Home`).
#[cfg(all(
    target_arch = "nvptx64",
    kernels_lab,
    any(kernels_arch = "sm_90a", kernels_arch = "sm_100f")
))]
mod lab;
#[cfg(all(target_arch = "nvptx64", kernels_watchdog))]
pub mod watchdog;

/// The committed PTX of the sm_90a module (Hopper: H100, H200), as
/// written by `cargo xtask build-ptx`. Host builds only: the device build
/// must not depend on its own output.
#[cfg(not(target_arch = "nvptx64"))]
pub const PTX_SM90A: &str = include_str!("../ptx/kernels_sm_90a.ptx");
/// The committed PTX of the sm_100f module (Blackwell sm_100 family).
#[cfg(not(target_arch = "nvptx64"))]
pub const PTX_SM100F: &str = include_str!("../ptx/kernels_sm_100f.ptx");
/// The committed portable PTX (`sm_90`, no architecture-specific features).
#[cfg(not(target_arch = "nvptx64"))]
pub const PTX_SM90: &str = include_str!("../ptx/kernels_sm_90.ptx");

/// The committed lab PTX for sm_90a (`lab`: the instruments alone, built
/// with `--cfg kernels_lab`), which no plan loads.
#[cfg(not(target_arch = "nvptx64"))]
pub const PTX_LAB_SM90A: &str = include_str!("../ptx/lab_sm_90a.ptx");
/// The committed lab PTX for the sm_100 family (the Blackwell bring-up
/// kernels among them; compiled, not executed).
#[cfg(not(target_arch = "nvptx64"))]
pub const PTX_LAB_SM100F: &str = include_str!("../ptx/lab_sm_100f.ptx");
/// Machine code of [`PTX_LAB_SM90A`] for `sm_90a`.
#[cfg(not(target_arch = "nvptx64"))]
pub const SASS_LAB_SM90A: &[u8] = include_bytes!("../sass/lab_sm_90a.cubin");
/// Machine code (a cubin) of [`PTX_SM90A`] for `sm_90a`, assembled by the
/// pinned `ptxas` in `cargo xtask build-ptx`: loads on compute capability
/// 9.0 only, with no JIT compilation.
#[cfg(not(target_arch = "nvptx64"))]
pub const SASS_SM90A: &[u8] = include_bytes!("../sass/kernels_sm_90a.cubin");
/// Machine code of [`PTX_SM100F`] for `sm_100a` (compute capability 10.0;
/// compiled, not executed).
#[cfg(not(target_arch = "nvptx64"))]
pub const SASS_SM100A: &[u8] = include_bytes!("../sass/kernels_sm_100a.cubin");
/// Machine code of [`PTX_SM100F`] for `sm_103a` (compute capability 10.3;
/// compiled, not executed).
#[cfg(not(target_arch = "nvptx64"))]
pub const SASS_SM103A: &[u8] = include_bytes!("../sass/kernels_sm_103a.cubin");
/// Machine code of [`PTX_SM90`] for `sm_120`, which every GPU of compute
/// capability 12.x runs (compiled, not executed).
#[cfg(not(target_arch = "nvptx64"))]
pub const SASS_SM120: &[u8] = include_bytes!("../sass/kernels_sm_120.cubin");

/// Device panics cannot unwind: trap, which fails the launch with an error the
/// host sees at the next synchronisation.
#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    ptx::sync::trap()
}
