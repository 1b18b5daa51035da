//! The instruments: kernels that measure or probe the GPU and the
//! toolchain, never the product. They are built into their own PTX files
//! (`--cfg kernels_lab`: `ptx/lab_sm_90a.ptx`, `ptx/lab_sm_100f.ptx`),
//! which hold nothing else and which no plan loads; the product files hold
//! none of them (`registry::Home`).
//!
//! - [`ceil`]: the benchmark's ceilings (tensor-core throughput, scattered
//!   f32 row reduction, row gathers, copies);
//! - [`smoke`]: the toolchain proof (dynamic shared memory, an mbarrier,
//!   inline PTX).
//!
//! The Blackwell bring-up kernels (the tcgen05 smoke test and the one-MMA
//! probes of stage 2) are lab kernels too, but live beside stage 2 in
//! `sm100/` (`probe`, `smoke`): a probe runs stage 2's own private
//! operand placement and MMA steps, so that it tests the real thing.

pub mod ceil;
pub mod smoke;
