//! [`Plan::execute_raw`]: the dense backward on raw device addresses and a
//! raw `CUstream` (the Python extension passes PyTorch's `data_ptr()`s and
//! its current stream), as [`crate::Plan::execute_raw`] is for sparse mode.
//!
//! The checks [`Plan::execute`] makes on typed views are made here where a
//! raw address allows them: `loss_coeff` finite, the stream on the plan's
//! context, the element types of the two typed outputs, each address on
//! the plan's device (the driver's pointer attributes), workspace size,
//! alignment and overlap. That a buffer really holds the element count the
//! shape implies is the caller's promise; hence `unsafe`.

use super::gpu::Ptrs;
use super::plan::{Plan, NO_KERNEL};
use super::shape::Shape;
use crate::args::{self, Arg};
use crate::error::{Error, Result};
use crate::raw::{check_stream, on_device, raw_arg};
use crate::shape::{check_finite, GradDtype, Options};
use cudarc::driver::sys;

/// Device addresses of one call to [`Plan::execute_raw`], with the sizes
/// and types an address cannot tell. Every buffer holds exactly the element
/// count the plan's [`Shape`] implies (as in [`super::Inputs`] and
/// [`super::Outputs`]), dense row-major; `rows` is `B * S_q` (BSHD) or
/// `T_q` (packed), `cols` is [`Shape::score_cols`], `key rows` is `B * S_k`
/// or `T_k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DenseRawBuffers {
    /// bf16 `(rows, H, D)`, 16-byte aligned.
    pub index_q: u64,
    /// bf16 `(rows, H)`.
    pub weights: u64,
    /// bf16 `(key rows, D)`, 16-byte aligned.
    pub index_k: u64,
    /// f32 `(rows, cols)`: attention mass (read only).
    pub attn_score: u64,
    /// f32 `(rows,)`: its row sums.
    pub attn_l1norm: u64,
    /// f32 `(rows,)`: row log-sum-exp of the logits.
    pub index_lse: u64,
    /// One f32, read on the device when the kernels run.
    pub grad_loss: u64,
    /// f32 `(rows, cols)`: raw logits in, grad_signal out (0 at the
    /// columns a row does not see).
    pub index_score: u64,
    /// bf16 `(rows, H, D)`, 4-byte aligned.
    pub d_index_q: u64,
    /// `(rows, H)` of type `d_weights_dtype`.
    pub d_weights: u64,
    /// `(key rows, D)` of type `d_index_k_dtype`.
    pub d_index_k: u64,
    /// `workspace_bytes` bytes, 16-byte aligned (0 when none is needed).
    pub workspace: u64,
    /// Size of `workspace` in bytes (at least [`Plan::workspace_bytes`]).
    pub workspace_bytes: usize,
    /// Element type of `d_weights` (must be the plan's).
    pub d_weights_dtype: GradDtype,
    /// Element type of `d_index_k` (must be the plan's).
    pub d_index_k_dtype: GradDtype,
}

impl Plan {
    /// [`Plan::execute`] on raw device addresses, queued on the raw stream
    /// `stream` (another library's, e.g. PyTorch's current stream; null is
    /// the legacy default stream). Binds the plan's context to the calling
    /// thread for the call (restoring the thread's previous context on
    /// return), checks what the module docs list, in the order of
    /// `execute`, then launches and returns without synchronising. A failed
    /// check returns the same typed [`Error`] as `execute` before anything
    /// is launched; where the GPU path does not run ([`Plan::on_gpu`]) a
    /// call that passes every check gets [`Error::NotImplemented`], with
    /// nothing written.
    ///
    /// No cudarc event tracking applies: ordering `stream` after the
    /// writers of the inputs, and keeping the buffers alive until the
    /// launches finish, is the caller's.
    ///
    /// # Safety
    /// - The plan's context is the context of every buffer and of
    ///   `stream`: for PyTorch tensors, a plan built on
    ///   `CudaContext::new(ordinal)` (the device's primary context).
    /// - Each address in `bufs` is the start of a live device allocation
    ///   (or part of one) holding at least the element count the plan's
    ///   shape implies for it, in the element type documented on its
    ///   field; `workspace` holds `workspace_bytes` bytes.
    /// - `stream` is a valid stream (or null, or one of the driver's
    ///   special handles) that stays valid while the launches run.
    pub unsafe fn execute_raw(
        &self,
        stream: sys::CUstream,
        bufs: &DenseRawBuffers,
        loss_coeff: f32,
    ) -> Result<()> {
        check_finite("loss_coeff", loss_coeff)?;
        let ctx = &self.ctx;
        let _bound = crate::gpu::Bound::new(ctx)?;
        // SAFETY: `stream` is valid by the caller's promise.
        unsafe { check_stream(ctx, stream)? };
        let opts = self.options();
        args::grad_dtypes(opts, bufs.d_weights_dtype, bufs.d_index_k_dtype)?;
        let list = raw_args(self.shape(), opts, bufs, ctx.cu_ctx());
        let ordinal = ctx.ordinal();
        on_device(&list, ordinal)?;
        // The workspace's size counts only with an address (`raw_args`).
        let ws_len = list[11].len;
        args::check_args(&list, ctx.cu_ctx(), ordinal, ws_len, self.workspace_bytes())?;
        let Some(gpu) = &self.gpu else {
            return Err(Error::NotImplemented { what: NO_KERNEL });
        };
        let p = ptrs_of(bufs);
        // SAFETY: `stream` belongs to the plan's context (checked above,
        // or a special handle of the bound context) and outlives the
        // launches by the caller's promise; the wrapper does not own it.
        let stream = unsafe { ctx.wrap_borrowed_stream(stream) };
        // SAFETY: the addresses passed the checks above for this plan's
        // shape on its context, the workspace included (the accumulator
        // when d_index_k is bf16); their lengths and element types are the
        // caller's promise.
        unsafe { gpu.launch(&stream, &p, opts, loss_coeff) }
    }
}

/// The twelve tensors of `bufs` as the shared checks see them, in the
/// order of [`super::Inputs`] and [`super::Outputs`]; lengths are the
/// shape's (the caller's promise), so only the workspace size, alignment
/// and overlap are left to check.
fn raw_args(shape: &Shape, opts: &Options, b: &DenseRawBuffers, ctx: sys::CUcontext) -> [Arg; 12] {
    let arg =
        |name, ptr, len, elem, align, output| raw_arg(name, ptr, len, elem, align, output, ctx);
    let (score, rows) = (shape.score_len(), shape.rows());
    let (q, w, k) = (shape.q_len(), shape.w_len(), shape.k_len());
    let ws = if b.workspace == 0 {
        0
    } else {
        b.workspace_bytes
    };
    let dk_align = args::dk_align(opts.d_index_k);
    let (dw_size, dk_size) = (b.d_weights_dtype.bytes(), b.d_index_k_dtype.bytes());
    [
        arg("index_q", b.index_q, q, 2, 16, false),
        arg("weights", b.weights, w, 2, 2, false),
        arg("index_k", b.index_k, k, 2, 16, false),
        arg("attn_score", b.attn_score, score, 4, 4, false),
        arg("attn_l1norm", b.attn_l1norm, rows, 4, 4, false),
        arg("index_lse", b.index_lse, rows, 4, 4, false),
        arg("grad_loss", b.grad_loss, 1, 4, 4, false),
        arg("index_score", b.index_score, score, 4, 4, true),
        arg("d_index_q", b.d_index_q, q, 2, 4, true),
        arg("d_weights", b.d_weights, w, dw_size, 4, true),
        arg("d_index_k", b.d_index_k, k, dk_size, dk_align, true),
        arg("workspace", b.workspace, ws, 1, 16, true),
    ]
}

fn ptrs_of(b: &DenseRawBuffers) -> Ptrs {
    Ptrs {
        q: b.index_q,
        w: b.weights,
        k: b.index_k,
        attn: b.attn_score,
        l1: b.attn_l1norm,
        lse: b.index_lse,
        grad_loss: b.grad_loss,
        score: b.index_score,
        dq: b.d_index_q,
        dw: b.d_weights,
        dk: b.d_index_k,
        ws: b.workspace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape::varlen(vec![0, 3, 7], vec![0, 5, 6], 16, 64)
            .with_q_offset(vec![2, -1])
            .with_ratio(2)
    }

    fn need(opts: &Options) -> usize {
        match opts.d_index_k {
            GradDtype::F32 => 0,
            GradDtype::Bf16 => shape().k_len() * 4,
        }
    }

    /// Disjoint, aligned addresses 1 MiB apart.
    fn bufs(opts: &Options) -> DenseRawBuffers {
        let at = |i: u64| 0x1000_0000 + (i << 20);
        DenseRawBuffers {
            index_q: at(0),
            weights: at(1),
            index_k: at(2),
            attn_score: at(3),
            attn_l1norm: at(4),
            index_lse: at(5),
            grad_loss: at(6),
            index_score: at(7),
            d_index_q: at(8),
            d_weights: at(9),
            d_index_k: at(10),
            workspace: if opts.d_index_k == GradDtype::Bf16 {
                at(11)
            } else {
                0
            },
            workspace_bytes: need(opts),
            d_weights_dtype: opts.d_weights,
            d_index_k_dtype: opts.d_index_k,
        }
    }

    fn check(opts: &Options, b: &DenseRawBuffers) -> Result<()> {
        let ctx = std::ptr::null_mut();
        let list = raw_args(&shape(), opts, b, ctx);
        args::check_args(&list, ctx, 0, list[11].len, need(opts))
    }

    #[test]
    fn byte_sizes_follow_the_shape_and_the_output_types() {
        let s = shape();
        let opts = Options {
            d_index_k: GradDtype::Bf16,
            d_weights: GradDtype::F32,
            ..Options::default()
        };
        let b = bufs(&opts);
        let list = raw_args(&s, &opts, &b, std::ptr::null_mut());
        let bytes: Vec<usize> = list.iter().map(|a| a.bytes).collect();
        // 7 query rows, 6 key rows, 5 score columns.
        let (score, rows, q, w, k) = (35, 7, 7 * 16 * 64, 7 * 16, 6 * 64);
        assert_eq!(
            (s.score_len(), s.rows(), s.q_len(), s.w_len(), s.k_len()),
            (score, rows, q, w, k)
        );
        assert_eq!(
            bytes,
            [
                q * 2,
                w * 2,
                k * 2,
                score * 4,
                rows * 4,
                rows * 4,
                4,
                score * 4,
                q * 2,
                w * 4,
                k * 2,
                k * 4
            ]
        );
        let names: Vec<&str> = list.iter().map(|a| a.name).collect();
        assert_eq!(names[7], "index_score");
        assert!(list[7].output && !list[3].output);
        let p = ptrs_of(&b);
        assert_eq!(
            (p.score, p.attn, p.ws),
            (b.index_score, b.attn_score, b.workspace)
        );
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
        b.index_q += 8;
        assert!(matches!(
            check(&opts, &b),
            Err(Error::Alignment {
                tensor: "index_q",
                ..
            })
        ));
        // grad_signal is written over index_score: it must not alias the
        // read-only attention scores.
        let mut b = bufs(&opts);
        b.index_score = b.attn_score + 16;
        assert!(matches!(
            check(&opts, &b),
            Err(Error::Overlap {
                output: "index_score",
                other: "attn_score"
            })
        ));
    }
}
