//! The wgmma kernel's product and head sum: `S^T = K q^T` of one chunk
//! (M = 64 slots, N = H heads, K = D; A the chunk's K rows, B the row's q
//! tile, both K-major swizzle blocks), then each slot's logit from the
//! thread's accumulators ([`fwd::fragment_logits`]) and the quad's sum.
//!
//! The shapes are types ([`Tile`]): one per H x D, each naming its
//! accumulator array and its `wgmma` wrapper.

use crate::portable::forward::load::Row;
use crate::portable::forward::{self as fwd, CHUNK};
use crate::ptx::smem::SmemAddr;
use crate::ptx::{sync, wgmma};
use crate::sm90::{desc, ATOM_BYTES};

/// One H x D shape of the forward's wgmma kernel.
pub(super) trait Tile {
    /// Heads (the N of the product).
    const H: u32;
    /// Head dimension (its K).
    const D: u32;
    /// The kernel's shared-memory layout.
    const L: fwd::FwdSmem = fwd::smem(Self::H, Self::D);
    /// The thread's accumulators of an `m64nH` tile.
    type Acc: Copy;
    /// Zeroed accumulators (the chains accumulate from the first step).
    const ZERO: Self::Acc;
    /// The product `acc += A B` on descriptors of both operands' first
    /// and (D = 128) second swizzle block, waited for.
    ///
    /// # Safety
    /// As the `ptx::wgmma::fwd_*` wrappers.
    unsafe fn product(acc: &mut Self::Acc, a0: u64, b0: u64, a1: u64, b1: u64);
    /// The accumulators in register order.
    fn regs(acc: &Self::Acc) -> &[f32];
}

/// Declares a [`Tile`] type: `one` for an accumulator of one register
/// array (`[[f32; N]; 1]`, handed to the wrapper as `[f32; N]`), `two` for
/// the `m64n128` tile's two halves.
macro_rules! tile {
    ($(#[$doc:meta])* $name:ident, $h:literal, $d:literal, one $n:literal, $f:ident) => {
        tile!(@ $(#[$doc])* $name, $h, $d, [[f32; $n]; 1], [[0.0; $n]], |acc| &mut acc[0], $f);
    };
    ($(#[$doc:meta])* $name:ident, $h:literal, $d:literal, two, $f:ident) => {
        tile!(@ $(#[$doc])* $name, $h, $d, [[f32; 32]; 2], [[0.0; 32]; 2], |acc| acc, $f);
    };
    (@ $(#[$doc:meta])* $name:ident, $h:literal, $d:literal, $acc:ty, $zero:expr, |$a:ident| $arg:expr, $f:ident) => {
        $(#[$doc])*
        pub(super) struct $name;
        impl Tile for $name {
            const H: u32 = $h;
            const D: u32 = $d;
            type Acc = $acc;
            const ZERO: $acc = $zero;
            #[inline(always)]
            unsafe fn product($a: &mut $acc, a0: u64, b0: u64, a1: u64, b1: u64) {
                // SAFETY: forwarded.
                unsafe { wgmma::$f($arg, a0, b0, a1, b1) }
            }
            #[inline(always)]
            fn regs(acc: &$acc) -> &[f32] {
                acc.as_flattened()
            }
        }
    };
}

tile!(
    /// H = 16, D = 64.
    H16D64, 16, 64, one 8, fwd_m64n16_k64
);
tile!(
    /// H = 16, D = 128.
    H16D128, 16, 128, one 8, fwd_m64n16_k128
);
tile!(
    /// H = 32, D = 64.
    H32D64, 32, 64, one 16, fwd_m64n32_k64
);
tile!(
    /// H = 32, D = 128.
    H32D128, 32, 128, one 16, fwd_m64n32_k128
);
tile!(
    /// H = 64, D = 64.
    H64D64, 64, 64, one 32, fwd_m64n64_k64
);
tile!(
    /// H = 64, D = 128.
    H64D128, 64, 128, one 32, fwd_m64n64_k128
);
tile!(
    /// H = 128, D = 64.
    H128D64, 128, 64, two, fwd_m64n128_k64
);
tile!(
    /// H = 128, D = 128.
    H128D128, 128, 128, two, fwd_m64n128_k128
);

/// The product of chunk `c` (K buffer `c % STAGES`) against the row's q
/// tile.
///
/// # Safety
/// Whole warpgroup, uniform control flow; the chunk's K rows and the q
/// tile complete, fenced for the async proxy and behind a barrier.
#[inline(always)]
pub(super) unsafe fn product<T: Tile>(r: &Row<'_>, c: u32) -> T::Acc {
    let kb: SmemAddr = r.kbuf(c % fwd::STAGES);
    let q = r.base.add(r.l.q);
    let a0 = desc(kb.0, 16, ATOM_BYTES);
    let a1 = desc(kb.0 + fwd::K_BLOCK, 16, ATOM_BYTES);
    let b0 = desc(q.0, 16, ATOM_BYTES);
    let b1 = desc(q.0 + r.l.q_block, 16, ATOM_BYTES);
    let mut acc = T::ZERO;
    // SAFETY: the caller's contract.
    unsafe { T::product(&mut acc, a0, b0, a1, b1) };
    acc
}

/// This thread's head weights for [`logits`]: element `2 j + e` is head
/// `8 j + 2 (tid % 4) + e`'s, for `j < H / 8` (the rest zero), and whether
/// this thread's weights allow the scaled head sum
/// ([`fwd::scaled_heads_ok`]).
///
/// # Safety
/// The weights are in shared memory behind a barrier.
#[inline(always)]
pub(super) unsafe fn weights<T: Tile>(r: &Row<'_>) -> ([f32; 32], bool) {
    let c = 2 * (r.tid % 4);
    let mut w = [0.0f32; 32];
    let mut ok = true;
    let mut j = 0;
    while j < T::H / 8 {
        // SAFETY: the caller's contract; the heads are below H.
        unsafe {
            w[2 * j as usize] = super::load::weight(r, 8 * j + c);
            w[2 * j as usize + 1] = super::load::weight(r, 8 * j + c + 1);
        }
        ok &= fwd::scaled_heads_ok(r.p.sm_scale, w[2 * j as usize]);
        ok &= fwd::scaled_heads_ok(r.p.sm_scale, w[2 * j as usize + 1]);
        j += 1;
    }
    (w, ok)
}
// H = 128 is the most heads: 16 column groups of 8.
const _: () = assert!(2 * (128 / 8) == 32);

/// The weights of [`weights`] times `sm_scale`, for the scaled head sum.
#[inline(always)]
pub(super) fn scaled(mut w: [f32; 32], sm_scale: f32) -> [f32; 32] {
    let mut i = 0;
    while i < 32 {
        w[i] *= sm_scale;
        i += 1;
    }
    w
}

/// The logits of this thread's two slots of the chunk (`16 w + g` and
/// `+ 8`), the same in the four lanes of each quad: with `fast` (the same
/// in every thread of the CTA) the scaled head sum on `w` from
/// [`scaled`], else the gated one on `w` from [`weights`].
///
/// # Safety
/// Full warps (the quad sums are shuffles); `fast` CTA-uniform.
#[inline(always)]
pub(super) unsafe fn logits<T: Tile>(
    r: &Row<'_>,
    acc: &T::Acc,
    w: &[f32; 32],
    fast: bool,
) -> [f32; 2] {
    let c = 2 * (r.tid % 4);
    let at = |col: u32| w[2 * (col / 8) as usize + (col % 2) as usize];
    let l = if fast {
        fwd::fragment_logits_scaled(T::regs(acc), c, at)
    } else {
        fwd::fragment_logits(T::regs(acc), c, r.p.sm_scale, at)
    };
    // SAFETY: full warps, after the uniform branch joined.
    unsafe { [sync::quad_sum_f32(l[0]), sync::quad_sum_f32(l[1])] }
}

/// This thread's two slots of a chunk ([`logits`]' order).
#[inline(always)]
pub(super) fn my_slots(tid: u32) -> [u32; 2] {
    let (w, g) = (tid / 32, (tid % 32) / 4);
    [16 * w + g, 16 * w + g + 8]
}
const _: () = assert!(CHUNK == 64);
