//! The gate of the wgmma kernels (each warpgroup on its 32 slots of S, all
//! 64 heads): S > 0 selects, dS = grad_signal x weight (bf16, swizzled into
//! the dS tile for the dQ and dK products), and this thread's d_weights
//! partials `sum grad_signal x S` of its two heads.

use super::ctx::Ctx;
use super::mma::wait_s;
use crate::sm90::swizzle;
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{bulk, cvt};

/// The gate's inputs: the weights of this thread's two heads and the
/// grad_signal of its eight slots (four pairs).
pub(super) type GateIn = ([f32; 2], [[f32; 2]; 4]);

/// Loads the gate's inputs from the weights `sw` and grad_signal set
/// `sgs` of the item (written before a barrier).
fn gate_in<const PAIRED: bool, const HALF: u32>(
    c: &Ctx<'_, PAIRED, HALF>,
    sw: SmemAddr,
    sgs: SmemAddr,
) -> GateIn {
    let (wg, wi, g) = (c.wg, c.wi, c.g);
    // SAFETY: written before a barrier; read only.
    unsafe {
        let wh = [
            smem::ld_f32(sw.add(4 * (16 * wi + g))),
            smem::ld_f32(sw.add(4 * (16 * wi + g + 8))),
        ];
        let mut gs = [[0.0f32; 2]; 4];
        for (j, x) in gs.iter_mut().enumerate() {
            *x = smem::ld_v2_f32(sgs.add(4 * (wg * 32 + 8 * j as u32 + c.c)));
        }
        (wh, gs)
    }
}

/// Waits for the item's S (`s`) and loads the gate's inputs. The row
/// kernel loads them before the S wait, so their latency passes during
/// it; the paired kernel, at its limit of 128 registers, after it.
///
/// # Safety
/// Whole warpgroup; `s` is the array of the issue.
#[rustc_force_inline]
pub(super) unsafe fn wait_s_and_inputs<const PAIRED: bool, const HALF: u32>(
    c: &Ctx<'_, PAIRED, HALF>,
    s: &mut [f32; 16],
    sw: SmemAddr,
    sgs: SmemAddr,
) -> GateIn {
    let inputs = || gate_in(c, sw, sgs);
    let early = if PAIRED { None } else { Some(inputs()) };
    // SAFETY: the caller's contract.
    unsafe { wait_s(s) };
    early.unwrap_or_else(inputs)
}

/// The gate on S (`s`, this warpgroup's 32 slots): dS into the dS tile
/// (bf16, swizzled), d_weights partials added to `dw`; then the fence
/// that makes dS visible to the tensor cores (async proxy).
///
/// Padding slots need no test here: their K rows were zero-filled, so S
/// is exactly 0 (or NaN when q holds an infinity) and `S > 0` is false,
/// whatever grad_signal holds there.
///
/// # Safety
/// The dS tile's previous readers (the previous item's products) are
/// complete (barrier M).
#[rustc_force_inline]
pub(super) unsafe fn gate<const PAIRED: bool, const HALF: u32>(
    c: &Ctx<'_, PAIRED, HALF>,
    s: &[f32; 16],
    (wh, gsv): GateIn,
    dw: &mut [f32; 2],
) {
    let (wg, wi, g, sm_scale) = (c.wg, c.wi, c.g, c.sm_scale);
    // SAFETY: each thread stores its own dS pairs (distinct (head, slot)
    // pairs); the caller's contract.
    unsafe {
        for j in 0..4u32 {
            let tl = wg * 32 + 8 * j + c.c;
            let gs = gsv[j as usize];
            for (half, dwh) in dw.iter_mut().enumerate() {
                let h = 16 * wi + g + 8 * half as u32;
                let mut ds = [0.0f32; 2];
                for i in 0..2 {
                    let sv = s[(4 * j) as usize + 2 * half + i] * sm_scale;
                    if sv > 0.0 {
                        ds[i] = gs[i] * wh[half];
                        *dwh += gs[i] * sv;
                    }
                }
                smem::st_u32(
                    c.sds.add(swizzle(h, tl * 2)),
                    cvt::pack_bf16x2(ds[0], ds[1]),
                );
            }
        }
        bulk::fence_proxy_async_shared();
    }
}
