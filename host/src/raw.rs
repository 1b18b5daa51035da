//! [`Plan::execute_raw`]: the backward on raw device addresses and a raw
//! `CUstream`, for callers whose buffers and streams another library owns
//! (the Python extension passes PyTorch's `data_ptr()`s and its current
//! stream).
//!
//! The checks [`Plan::execute`] makes on typed views are made here where a
//! raw address allows them: `loss_coeff` finite, the stream on the plan's
//! context, the element types of the two typed outputs, each address on
//! the plan's device (the driver's pointer attributes), workspace size,
//! alignment and overlap. What cannot be seen from an address, that a
//! buffer really holds the element count the shape implies, is the
//! caller's promise; hence `unsafe`.

use crate::args::{self, Arg, Ptrs};
use crate::error::{Error, Result};
use crate::plan::Plan;
use crate::shape::{check_finite, GradDtype, Options, Shape};
use cudarc::driver::{sys, CudaContext};
use std::ffi::c_void;

/// Device addresses of one call to [`Plan::execute_raw`], with the sizes
/// and types an address cannot tell. Every buffer holds exactly the element
/// count the plan's shape implies (as in [`crate::Inputs`] and
/// [`crate::Outputs`]), dense row-major.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawBuffers {
    /// bf16 `(B, S_q, H, D)`, 16-byte aligned.
    pub index_q: u64,
    /// bf16 `(B, S_q, H)`.
    pub weights: u64,
    /// bf16 `(B, S_k, D)`, 16-byte aligned.
    pub index_k: u64,
    /// f32 `(B, S_q, topk)`.
    pub index_score: u64,
    /// `(B, S_q, topk)`, i64 (8-byte aligned) when `topk_indices_i64`,
    /// else i32; read by the kernels as they are.
    pub topk_indices: u64,
    /// One f32, read on the device when the kernels run.
    pub grad_loss: u64,
    /// f32 `(B, S_q, topk)`: targets in, grad_signal out.
    pub attn_score: u64,
    /// bf16 `(B, S_q, H, D)`.
    pub d_index_q: u64,
    /// `(B, S_q, H)` of type `d_weights_dtype`.
    pub d_weights: u64,
    /// `(B, S_k, D)` of type `d_index_k_dtype`.
    pub d_index_k: u64,
    /// `workspace_bytes` bytes, 16-byte aligned (0 when none is needed).
    pub workspace: u64,
    /// Size of `workspace` in bytes (at least [`Plan::workspace_bytes`]).
    pub workspace_bytes: usize,
    /// Element type of `d_weights` (must be the plan's).
    pub d_weights_dtype: GradDtype,
    /// Element type of `d_index_k` (must be the plan's).
    pub d_index_k_dtype: GradDtype,
    /// `topk_indices` holds i64 ids (as `torch.topk` returns them) rather
    /// than i32.
    pub topk_indices_i64: bool,
}

impl Plan {
    /// [`Plan::execute`] on raw device addresses, queued on the raw stream
    /// `stream` (another library's, e.g. PyTorch's current stream; null
    /// is the legacy default stream). Binds the plan's context to the
    /// calling thread for the call (restoring the thread's previous
    /// context on return, so a caller's notion of its current device is
    /// kept), checks what the module docs list, launches, and returns
    /// without synchronising. A failed check returns the same
    /// typed [`Error`] as `execute` before anything is launched.
    ///
    /// No cudarc event tracking applies: ordering `stream` after the
    /// writers of the inputs, and keeping the buffers alive until the
    /// launches finish, is the caller's (a PyTorch caller gets both from
    /// running on the current stream of the tensors' device and holding
    /// the tensors).
    ///
    /// # Safety
    /// - The plan's context is the context of every buffer and of
    ///   `stream`: for PyTorch tensors, a plan built on
    ///   `CudaContext::new(ordinal)` (the device's primary context, which
    ///   PyTorch uses).
    /// - Each address in `bufs` is the start of a live device allocation
    ///   (or part of one) holding at least the element count the plan's
    ///   shape implies for it, in the element type documented on its field;
    ///   `workspace` holds `workspace_bytes` bytes.
    /// - `stream` is a valid stream (or null, or one of the driver's
    ///   special handles) that stays valid while the launches run.
    pub unsafe fn execute_raw(
        &self,
        stream: sys::CUstream,
        bufs: &RawBuffers,
        loss_coeff: f32,
    ) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.execute_raw_checked(stream, bufs, loss_coeff, true) }
    }

    /// [`Plan::execute_raw`] for a caller that already knows where its
    /// buffers and stream live (PyTorch knows each tensor's device and
    /// the device of its current stream): the same checks except the
    /// driver queries of each address's device and of the stream's
    /// context, which cost a driver call each.
    ///
    /// # Safety
    /// As [`Plan::execute_raw`]; in addition every non-empty buffer is on
    /// the plan's device and `stream` belongs to the plan's context (or is
    /// null or a special handle).
    pub unsafe fn execute_raw_on_plan_device(
        &self,
        stream: sys::CUstream,
        bufs: &RawBuffers,
        loss_coeff: f32,
    ) -> Result<()> {
        // SAFETY: forwarded; the residency is the caller's promise.
        unsafe { self.execute_raw_checked(stream, bufs, loss_coeff, false) }
    }

    /// The body of both raw entries; `query_driver` asks the driver for
    /// the stream's context and each address's device.
    ///
    /// # Safety
    /// As [`Plan::execute_raw`] (and, without `query_driver`, as
    /// [`Plan::execute_raw_on_plan_device`]).
    unsafe fn execute_raw_checked(
        &self,
        stream: sys::CUstream,
        bufs: &RawBuffers,
        loss_coeff: f32,
        query_driver: bool,
    ) -> Result<()> {
        check_finite("loss_coeff", loss_coeff)?;
        let ctx = self.context();
        let _bound = crate::gpu::Bound::new(ctx)?;
        let opts = self.options();
        args::grad_dtypes(opts, bufs.d_weights_dtype, bufs.d_index_k_dtype)?;
        let ws_needed = self.workspace_bytes();
        let list = raw_args(self.shape(), opts, bufs, ctx.cu_ctx());
        let ordinal = ctx.ordinal();
        if query_driver {
            // SAFETY: `stream` is valid by the caller's promise.
            unsafe { check_stream(ctx, stream)? };
            on_device(&list, ordinal)?;
        }
        // The workspace's size counts only with an address (`raw_args`).
        args::check_args(&list, ctx.cu_ctx(), ordinal, list[10].len, ws_needed)?;
        let ptrs = ptrs_of(bufs);
        // SAFETY: `stream` belongs to the plan's context (checked above,
        // promised by the caller, or a special handle of the bound
        // context) and outlives the launches by the caller's promise; the
        // wrapper does not own it.
        let stream = unsafe { ctx.wrap_borrowed_stream(stream) };
        // SAFETY: the addresses passed the checks above; their lengths and
        // element types are the caller's promise.
        unsafe { self.launch_checked(&stream, &ptrs, bufs.topk_indices_i64, loss_coeff, None) }
    }
}

/// The eleven tensors of `bufs` as the shared checks see them, in the
/// order of [`Ptrs`]; lengths are the shape's (the caller's promise), so
/// only the workspace size, alignment and overlap are left to check.
fn raw_args(shape: &Shape, opts: &Options, b: &RawBuffers, ctx: sys::CUcontext) -> [Arg; 11] {
    let dk_align = args::dk_align(opts.d_index_k);
    let arg =
        |name, ptr, len, elem, align, output| raw_arg(name, ptr, len, elem, align, output, ctx);
    let (slots, q, w, k) = (shape.slots(), shape.q_len(), shape.w_len(), shape.k_len());
    let ws = if b.workspace == 0 {
        0
    } else {
        b.workspace_bytes
    };
    let id_bytes = if b.topk_indices_i64 { 8 } else { 4 };
    [
        arg("index_q", b.index_q, q, 2, 16, false),
        arg("weights", b.weights, w, 2, 2, false),
        arg("index_k", b.index_k, k, 2, 16, false),
        arg("index_score", b.index_score, slots, 4, 4, false),
        arg(
            "topk_indices",
            b.topk_indices,
            slots,
            id_bytes,
            id_bytes as u64,
            false,
        ),
        arg("grad_loss", b.grad_loss, 1, 4, 4, false),
        arg("attn_score", b.attn_score, slots, 4, 4, true),
        arg("d_index_q", b.d_index_q, q, 2, 4, true),
        arg(
            "d_weights",
            b.d_weights,
            w,
            b.d_weights_dtype.bytes(),
            4,
            true,
        ),
        arg(
            "d_index_k",
            b.d_index_k,
            k,
            b.d_index_k_dtype.bytes(),
            dk_align,
            true,
        ),
        arg("workspace", b.workspace, ws, 1, 16, true),
    ]
}

fn ptrs_of(b: &RawBuffers) -> Ptrs {
    Ptrs {
        index_q: b.index_q,
        weights: b.weights,
        index_k: b.index_k,
        index_score: b.index_score,
        topk_indices: b.topk_indices,
        grad_loss: b.grad_loss,
        attn_score: b.attn_score,
        d_index_q: b.d_index_q,
        d_weights: b.d_weights,
        d_index_k: b.d_index_k,
        workspace: b.workspace,
    }
}

/// The [`Arg`] of `len` elements of `elem` bytes at the raw address
/// `ptr` on `ctx`, aligned to `align`: its element count is the caller's
/// promise (`expected` is `len`), so the shared checks see its alignment
/// and overlaps.
pub(crate) fn raw_arg(
    name: &'static str,
    ptr: u64,
    len: usize,
    elem: usize,
    align: u64,
    output: bool,
    ctx: sys::CUcontext,
) -> Arg {
    Arg {
        name,
        ptr,
        bytes: len * elem,
        len,
        expected: len,
        align,
        output,
        ctx,
    }
}

/// Fails with [`Error::Device`] naming the first non-empty tensor of
/// `list` whose address is not on device `ordinal` (the driver's pointer
/// attributes).
pub(crate) fn on_device(list: &[Arg], ordinal: usize) -> Result<()> {
    for a in list.iter().filter(|a| a.bytes > 0) {
        if pointer_ordinal(a.ptr) != Some(ordinal) {
            return Err(Error::Device {
                tensor: a.name,
                expected: ordinal,
            });
        }
    }
    Ok(())
}

/// Fails with [`Error::Device`] (tensor `stream`) unless `stream` belongs
/// to `ctx`. Null and the driver's special handles (legacy and per-thread
/// default stream) mean the stream of the bound context, which is `ctx`.
///
/// # Safety
/// `stream` is a valid stream handle.
pub(crate) unsafe fn check_stream(ctx: &CudaContext, stream: sys::CUstream) -> Result<()> {
    if (stream as usize) <= 2 {
        return Ok(());
    }
    let mut owner: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: `stream` is valid by the caller's promise; `owner` is a
    // valid out-pointer.
    let r = unsafe { sys::cuStreamGetCtx(stream, &mut owner) };
    if r == sys::CUresult::CUDA_SUCCESS && owner == ctx.cu_ctx() {
        Ok(())
    } else {
        Err(Error::Device {
            tensor: "stream",
            expected: ctx.ordinal(),
        })
    }
}

/// The ordinal of the device `ptr` lives on, `None` when the driver does
/// not know the address (host memory, a freed or foreign pointer).
pub(crate) fn pointer_ordinal(ptr: u64) -> Option<usize> {
    let mut ordinal: i32 = -1;
    let attr = sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL;
    // SAFETY: the driver only reads its own tables for `ptr` and writes
    // one i32 into `ordinal`.
    let r =
        unsafe { sys::cuPointerGetAttribute(&mut ordinal as *mut i32 as *mut c_void, attr, ptr) };
    (r == sys::CUresult::CUDA_SUCCESS)
        .then(|| usize::try_from(ordinal).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::KeyIds;

    fn shape() -> Shape {
        Shape {
            batch: 2,
            seq_q: 3,
            seq_k: 5,
            heads: 16,
            head_dim: 64,
            topk: 7,
        }
    }

    /// Disjoint, aligned addresses 1 MiB apart.
    fn bufs(opts: &Options) -> RawBuffers {
        let at = |i: u64| 0x1000_0000 + (i << 20);
        RawBuffers {
            index_q: at(0),
            weights: at(1),
            index_k: at(2),
            index_score: at(3),
            topk_indices: at(4),
            grad_loss: at(5),
            attn_score: at(6),
            d_index_q: at(7),
            d_weights: at(8),
            d_index_k: at(9),
            workspace: if opts.d_index_k == GradDtype::Bf16 {
                at(10)
            } else {
                0
            },
            workspace_bytes: args::workspace_bytes(&shape(), opts),
            d_weights_dtype: opts.d_weights,
            d_index_k_dtype: opts.d_index_k,
            topk_indices_i64: false,
        }
    }

    fn check(opts: &Options, b: &RawBuffers) -> Result<()> {
        let ctx = std::ptr::null_mut();
        let list = raw_args(&shape(), opts, b, ctx);
        let need = args::workspace_bytes(&shape(), opts);
        args::check_args(&list, ctx, 0, list[10].len, need)
    }

    #[test]
    fn byte_sizes_follow_the_shape_and_the_output_types() {
        let s = shape();
        let opts = Options {
            d_index_k: GradDtype::Bf16,
            d_weights: GradDtype::F32,
            key_ids: KeyIds::Local,
            ..Options::default()
        };
        let b = bufs(&opts);
        let list = raw_args(&s, &opts, &b, std::ptr::null_mut());
        let bytes: Vec<usize> = list.iter().map(|a| a.bytes).collect();
        let (slots, q, w, k) = (s.slots(), s.q_len(), s.w_len(), s.k_len());
        assert_eq!(
            bytes,
            [
                q * 2,
                w * 2,
                k * 2,
                slots * 4,
                slots * 4,
                4,
                slots * 4,
                q * 2,
                w * 4,
                k * 2,
                k * 4
            ]
        );
        assert_eq!(ptrs_of(&b).workspace, b.workspace);
        assert!(check(&opts, &b).is_ok());
        assert!(check(&Options::default(), &bufs(&Options::default())).is_ok());
    }

    #[test]
    fn workspace_alignment_and_overlap_are_checked_on_raw_addresses() {
        let bf16_dk = Options {
            d_index_k: GradDtype::Bf16,
            ..Options::default()
        };
        let mut b = bufs(&bf16_dk);
        b.workspace_bytes -= 1;
        assert!(matches!(check(&bf16_dk, &b), Err(Error::Workspace { .. })));
        let mut b = bufs(&bf16_dk);
        b.workspace = 0;
        assert!(matches!(
            check(&bf16_dk, &b),
            Err(Error::Workspace { given: 0, .. })
        ));
        let opts = Options::default();
        let mut b = bufs(&opts);
        b.d_index_k += 4; // f32 d_index_k rows are reduced as 16-byte vectors
        assert!(matches!(
            check(&opts, &b),
            Err(Error::Alignment {
                tensor: "d_index_k",
                align: 16,
                ..
            })
        ));
        let mut b = bufs(&opts);
        b.attn_score = b.index_score + 16;
        assert!(matches!(
            check(&opts, &b),
            Err(Error::Overlap {
                output: "attn_score",
                other: "index_score"
            })
        ));
    }
}
