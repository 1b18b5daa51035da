//! The wgmma forward kernels (sm_90a, device only): one CTA per query row,
//! or rows in turn on a persistent grid. Their sizes, layouts and launch
//! envelope, and the loads and row softmax they share with the portable
//! kernel, are `crate::portable::forward`'s; here are the walk (`wg`), its
//! loads (`load`), the product and head sum (`mma`) and the entries
//! (`entry`).

mod entry;
mod load;
mod mma;
mod wg;
