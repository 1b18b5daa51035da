//! The arguments of [`crate::Plan::execute`] and every check it makes on
//! them before the first write.
//!
//! SPEC ("Contract of `execute`") asks that a bad call return a typed error
//! naming the tensor and leave every buffer untouched, so all of this runs
//! before anything is launched. The checks run in a fixed order, so a call
//! with several faults always gets the same error: `loss_coeff` finite, the
//! stream on the plan's context, the element types of the two typed
//! outputs; then, over all eleven tensors in the order of [`Ptrs`]: context,
//! element count, workspace size, alignment, overlap of each output with
//! every other tensor.
//!
//! Nothing here launches or depends on the plan or the launchers: the plan
//! passes its shape, options and context in, and gets plain device
//! addresses ([`Ptrs`]) back.

use crate::error::{Error, Result};
use crate::shape::{check_finite, GradDtype, Options, Shape};
use cudarc::driver::{
    sys, CudaContext, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice,
    SyncOnDrop,
};
use half::bf16;
use std::sync::Arc;

mod sealed {
    pub trait Sealed {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
}

/// Element type of `topk_indices`: `i32`, or `i64` as `torch.topk`
/// returns them. The kernels read either width as it is (no conversion
/// pass); an i64 id is valid under the same rule as an i32 one, so any
/// value outside `0..=i32::MAX` (a negative one, or one such as
/// `2^32 + 5`) is padding, never truncated into a valid row.
pub trait TopkId:
    cudarc::driver::DeviceRepr + Copy + Send + Sync + 'static + sealed::Sealed
{
    /// Whether the ids are i64 (the kernels' `FLAG_IDS_I64`).
    const I64: bool;
    /// The id as the kernels resolve it: an i32 as it is; an i64 in
    /// `0..=i32::MAX` narrowed, any other i64 -1 (padding).
    fn narrow(self) -> i32;
}

impl TopkId for i32 {
    const I64: bool = false;
    fn narrow(self) -> i32 {
        self
    }
}

impl TopkId for i64 {
    const I64: bool = true;
    fn narrow(self) -> i32 {
        kernels_gpu::score::narrow_id(self)
    }
}

/// Read-only device inputs of [`crate::Plan::execute`]. `I`, the element
/// type of `topk_indices`, is `i32` or `i64` ([`TopkId`]); it is inferred
/// from the view, so `topk_indices: ids.as_view()` works for either.
pub struct Inputs<'a, I = i32> {
    /// bf16 `(B, S_q, H, D)`, 16-byte aligned.
    pub index_q: CudaView<'a, bf16>,
    /// bf16 `(B, S_q, H)`.
    pub weights: CudaView<'a, bf16>,
    /// bf16 `(B, S_k, D)`, 16-byte aligned.
    pub index_k: CudaView<'a, bf16>,
    /// f32 `(B, S_q, topk)`: predict probabilities or log-probabilities.
    pub index_score: CudaView<'a, f32>,
    /// i32 or i64 `(B, S_q, topk)`: key ids (invalid ids are padding);
    /// 8-byte aligned when i64.
    pub topk_indices: CudaView<'a, I>,
    /// One f32: upstream gradient of the loss, read on the device when the
    /// kernels run (so a captured graph picks up new values).
    pub grad_loss: CudaView<'a, f32>,
}

/// A gradient output in one of the two supported element types.
pub enum GradOut<'a> {
    /// f32 elements.
    F32(CudaViewMut<'a, f32>),
    /// bf16 elements.
    Bf16(CudaViewMut<'a, bf16>),
}

impl GradOut<'_> {
    pub(crate) fn dtype(&self) -> GradDtype {
        match self {
            GradOut::F32(_) => GradDtype::F32,
            GradOut::Bf16(_) => GradDtype::Bf16,
        }
    }
}

/// Device outputs of [`crate::Plan::execute`].
pub struct Outputs<'a> {
    /// f32 `(B, S_q, topk)`: target probabilities on entry, grad_signal on return.
    pub attn_score: CudaViewMut<'a, f32>,
    /// bf16 `(B, S_q, H, D)`, 4-byte aligned.
    pub d_index_q: CudaViewMut<'a, bf16>,
    /// `(B, S_q, H)` in the plan's `d_weights` type.
    pub d_weights: GradOut<'a>,
    /// `(B, S_k, D)` in the plan's `d_index_k` type.
    pub d_index_k: GradOut<'a>,
    /// At least [`crate::Plan::workspace_bytes`] bytes, 16-byte aligned
    /// (`None` allowed when that is zero).
    pub workspace: Option<CudaViewMut<'a, u8>>,
}

/// Device workspace a plan of `shape` and `opts` needs: the f32
/// accumulator of `d_index_k` when that output is bf16, zero otherwise;
/// in deterministic mode the tables of `abi::det_layout` (the i32
/// accumulator first), whatever `d_index_k`'s type.
pub(crate) fn workspace_bytes(shape: &Shape, opts: &Options) -> usize {
    if opts.deterministic {
        return shape.det_layout().bytes as usize;
    }
    match opts.d_index_k {
        GradDtype::F32 => 0,
        GradDtype::Bf16 => shape.k_len() * 4,
    }
}

/// Device addresses of a checked call (0 for a missing workspace).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ptrs {
    pub index_q: u64,
    pub weights: u64,
    pub index_k: u64,
    pub index_score: u64,
    pub topk_indices: u64,
    pub grad_loss: u64,
    pub attn_score: u64,
    pub d_index_q: u64,
    pub d_weights: u64,
    pub d_index_k: u64,
    pub workspace: u64,
}

impl Ptrs {
    /// Where the kernels accumulate dK: the workspace when there is one
    /// (`workspace_bytes > 0`: the f32 accumulator of a bf16 `d_index_k`,
    /// or the deterministic mode's i32 one at its start), else
    /// `d_index_k` itself.
    pub(crate) fn dk_accum(&self, workspace_bytes: usize) -> u64 {
        if workspace_bytes > 0 {
            self.workspace
        } else {
            self.d_index_k
        }
    }
}

/// The addresses of a call that passed every check, and the guards that
/// keep cudarc's event tracking right: taking an address orders `stream`
/// after earlier writers of that buffer, and dropping the guard (after the
/// launches) records this call's use.
pub(crate) struct Checked<'a> {
    pub ptrs: Ptrs,
    /// `topk_indices` holds i64 ids (the kernels' `FLAG_IDS_I64`).
    pub ids_i64: bool,
    _guards: [Option<SyncOnDrop<'a>>; 11],
}

/// What the checks compare the arguments with: the plan's shape, options
/// and context.
pub(crate) struct Expected<'a> {
    pub shape: &'a Shape,
    pub opts: &'a Options,
    pub ctx: &'a Arc<CudaContext>,
}

/// The element types of the two typed outputs against the options: an
/// [`Error::Dtype`] naming the first that differs (`execute`, the raw
/// entry and the dense plan all check them first).
pub(crate) fn grad_dtypes(
    opts: &Options,
    d_weights: GradDtype,
    d_index_k: GradDtype,
) -> Result<()> {
    for (tensor, expected, got) in [
        ("d_weights", opts.d_weights, d_weights),
        ("d_index_k", opts.d_index_k, d_index_k),
    ] {
        if expected != got {
            return Err(Error::Dtype {
                tensor,
                expected: expected.name(),
                actual: got.name(),
            });
        }
    }
    Ok(())
}

/// Runs every check of `execute` on its arguments, in the order of the
/// module docs, and returns their device addresses; an error leaves every
/// buffer untouched.
pub(crate) fn check<'a, I: TopkId>(
    want: &Expected<'_>,
    stream: &'a CudaStream,
    inputs: &'a Inputs<'_, I>,
    outputs: &'a mut Outputs<'_>,
    loss_coeff: f32,
) -> Result<Checked<'a>> {
    check_finite("loss_coeff", loss_coeff)?;
    let ordinal = want.ctx.ordinal();
    if stream.context().cu_ctx() != want.ctx.cu_ctx() {
        return Err(Error::Device {
            tensor: "stream",
            expected: ordinal,
        });
    }
    grad_dtypes(
        want.opts,
        outputs.d_weights.dtype(),
        outputs.d_index_k.dtype(),
    )?;
    let ws_needed = workspace_bytes(want.shape, want.opts);
    let held = collect(want, stream, inputs, outputs);
    let args = held.each_ref().map(|(a, _)| *a);
    let guards = held.map(|(_, g)| g);
    let ws_len = args[10].len;
    check_args(&args, want.ctx.cu_ctx(), ordinal, ws_len, ws_needed)?;
    // `collect` returns the tensors in the order of `Ptrs`' fields.
    let p = args.map(|a| a.ptr);
    Ok(Checked {
        ptrs: Ptrs {
            index_q: p[0],
            weights: p[1],
            index_k: p[2],
            index_score: p[3],
            topk_indices: p[4],
            grad_loss: p[5],
            attn_score: p[6],
            d_index_q: p[7],
            d_weights: p[8],
            d_index_k: p[9],
            workspace: p[10],
        },
        ids_i64: I::I64,
        _guards: guards,
    })
}

/// One tensor argument as the checks see it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Arg {
    pub name: &'static str,
    pub ptr: u64,
    pub bytes: usize,
    pub len: usize,
    pub expected: usize,
    pub align: u64,
    pub output: bool,
    pub ctx: sys::CUcontext,
}

/// The eleven tensors of a call in the order of [`Ptrs`], each with what
/// the plan expects of it (element count, alignment the kernels need) and
/// the guard of its address (none for an absent workspace).
fn collect<'a, I: TopkId>(
    want: &Expected<'_>,
    stream: &'a CudaStream,
    inputs: &'a Inputs<'_, I>,
    outputs: &'a mut Outputs<'_>,
) -> [(Arg, Option<SyncOnDrop<'a>>); 11] {
    let s = want.shape;
    let Outputs {
        attn_score,
        d_index_q,
        d_weights,
        d_index_k,
        workspace,
    } = outputs;
    let dk_align = dk_align(want.opts.d_index_k);
    let g = |(arg, guard): (Arg, SyncOnDrop<'a>)| (arg, Some(guard));
    [
        g(input("index_q", &inputs.index_q, stream, s.q_len(), 16)),
        g(input("weights", &inputs.weights, stream, s.w_len(), 2)),
        g(input("index_k", &inputs.index_k, stream, s.k_len(), 16)),
        g(input(
            "index_score",
            &inputs.index_score,
            stream,
            s.slots(),
            4,
        )),
        g(ids_input(&inputs.topk_indices, stream, s.slots())),
        g(input("grad_loss", &inputs.grad_loss, stream, 1, 4)),
        g(output("attn_score", attn_score, stream, s.slots(), 4)),
        g(output("d_index_q", d_index_q, stream, s.q_len(), 4)),
        g(grad("d_weights", d_weights, stream, s.w_len(), 4)),
        g(grad("d_index_k", d_index_k, stream, s.k_len(), dk_align)),
        match workspace {
            Some(v) => {
                let len = v.len();
                g(output("workspace", v, stream, len, 16))
            }
            None => (
                Arg {
                    name: "workspace",
                    ptr: 0,
                    bytes: 0,
                    len: 0,
                    expected: 0,
                    align: 16,
                    output: true,
                    ctx: want.ctx.cu_ctx(),
                },
                None,
            ),
        },
    ]
}

fn ctx_of(stream: &Arc<CudaStream>) -> sys::CUcontext {
    stream.context().cu_ctx()
}

/// `name` of `expected` elements as an input [`Arg`], with the guard of
/// its address.
pub(crate) fn input<'a, T>(
    name: &'static str,
    v: &'a CudaView<'_, T>,
    stream: &'a CudaStream,
    expected: usize,
    align: u64,
) -> (Arg, SyncOnDrop<'a>) {
    let (ptr, guard) = v.device_ptr(stream);
    let arg = Arg {
        name,
        ptr,
        bytes: v.len() * std::mem::size_of::<T>(),
        len: v.len(),
        expected,
        align,
        output: false,
        ctx: ctx_of(v.stream()),
    };
    (arg, guard)
}

/// `topk_indices` of element type `I`: `expected` ids, aligned to the
/// element (4 bytes for i32, 8 for i64: the kernels read each id whole).
pub(crate) fn ids_input<'a, I: TopkId>(
    v: &'a CudaView<'_, I>,
    stream: &'a CudaStream,
    expected: usize,
) -> (Arg, SyncOnDrop<'a>) {
    let (ptr, guard) = v.device_ptr(stream);
    (
        ids_arg::<I>(ptr, v.len(), expected, ctx_of(v.stream())),
        guard,
    )
}

/// The [`Arg`] of `len` ids of type `I` at `ptr`.
fn ids_arg<I: TopkId>(ptr: u64, len: usize, expected: usize, ctx: sys::CUcontext) -> Arg {
    let elem = std::mem::size_of::<I>();
    Arg {
        name: "topk_indices",
        ptr,
        bytes: len * elem,
        len,
        expected,
        align: elem as u64,
        output: false,
        ctx,
    }
}

/// `name` of `expected` elements as an output [`Arg`], with the guard of
/// its address.
pub(crate) fn output<'a, T>(
    name: &'static str,
    v: &'a mut CudaViewMut<'_, T>,
    stream: &'a CudaStream,
    expected: usize,
    align: u64,
) -> (Arg, SyncOnDrop<'a>) {
    let (len, ctx) = (v.len(), ctx_of(v.stream()));
    let (ptr, guard) = v.device_ptr_mut(stream);
    let arg = Arg {
        name,
        ptr,
        bytes: len * std::mem::size_of::<T>(),
        len,
        expected,
        align,
        output: true,
        ctx,
    };
    (arg, guard)
}

/// A gradient output of either element type as an output [`Arg`].
pub(crate) fn grad<'a>(
    name: &'static str,
    g: &'a mut GradOut<'_>,
    stream: &'a CudaStream,
    expected: usize,
    align: u64,
) -> (Arg, SyncOnDrop<'a>) {
    match g {
        GradOut::F32(v) => output(name, v, stream, expected, align),
        GradOut::Bf16(v) => output(name, v, stream, expected, align),
    }
}

/// Alignment `d_index_k` needs: an f32 one is the accumulator itself,
/// whose rows are bulk-reduced (16-byte aligned); a bf16 one is written by
/// u32 stores.
pub(crate) fn dk_align(d_index_k: GradDtype) -> u64 {
    match d_index_k {
        GradDtype::F32 => 16,
        GradDtype::Bf16 => 4,
    }
}

/// The checks over all tensors, each kind over all of them before the
/// next: context (against the plan's `ctx`, device `ordinal`), element
/// count, workspace size, alignment, overlap of each non-empty output with
/// every other non-empty tensor. `ws_len` bytes of workspace were given,
/// `ws_needed` are needed.
pub(crate) fn check_args(
    args: &[Arg],
    ctx: sys::CUcontext,
    ordinal: usize,
    ws_len: usize,
    ws_needed: usize,
) -> Result<()> {
    if let Some(a) = args.iter().find(|a| a.ctx != ctx) {
        return Err(Error::Device {
            tensor: a.name,
            expected: ordinal,
        });
    }
    if let Some(a) = args.iter().find(|a| a.len != a.expected) {
        return Err(Error::Length {
            tensor: a.name,
            expected: a.expected,
            actual: a.len,
        });
    }
    if ws_len < ws_needed {
        return Err(Error::Workspace {
            required: ws_needed,
            given: ws_len,
        });
    }
    let live = || args.iter().filter(|a| a.bytes > 0);
    if let Some(a) = live().find(|a| a.ptr % a.align != 0) {
        return Err(Error::Alignment {
            tensor: a.name,
            address: a.ptr,
            align: a.align,
        });
    }
    for (i, o) in args.iter().enumerate().filter(|(_, a)| a.output) {
        for (j, other) in args.iter().enumerate() {
            if i != j && o.bytes > 0 && other.bytes > 0 && overlaps(o, other) {
                return Err(Error::Overlap {
                    output: o.name,
                    other: other.name,
                });
            }
        }
    }
    Ok(())
}

/// Whether the byte ranges of `a` and `b` share a byte.
fn overlaps(a: &Arg, b: &Arg) -> bool {
    let (a0, a1) = (a.ptr, a.ptr + a.bytes as u64);
    let (b0, b1) = (b.ptr, b.ptr + b.bytes as u64);
    a0 < b1 && b0 < a1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A context handle for the checks to compare; never dereferenced.
    fn plan_ctx() -> sys::CUcontext {
        std::ptr::null_mut()
    }

    fn other_ctx() -> sys::CUcontext {
        std::ptr::dangling_mut()
    }

    /// `name` of `len` f32 elements at `ptr`, as the plan expects it.
    fn arg(name: &'static str, ptr: u64, len: usize, output: bool) -> Arg {
        Arg {
            name,
            ptr,
            bytes: len * 4,
            len,
            expected: len,
            align: 16,
            output,
            ctx: plan_ctx(),
        }
    }

    /// Two inputs and two outputs, 1 KiB each, 4 KiB apart, no workspace.
    fn good() -> Vec<Arg> {
        vec![
            arg("in0", 0x10000, 256, false),
            arg("in1", 0x11000, 256, false),
            arg("out0", 0x12000, 256, true),
            arg("out1", 0x13000, 256, true),
            Arg {
                bytes: 0,
                len: 0,
                expected: 0,
                ..arg("workspace", 0, 0, true)
            },
        ]
    }

    /// The checks with the last argument as the workspace.
    fn check(args: &[Arg], ws_needed: usize) -> Result<()> {
        let ws_len = args.last().map_or(0, |a| a.len);
        check_args(args, plan_ctx(), 3, ws_len, ws_needed)
    }

    /// `good()` with `topk_indices` of type `I` (100 ids at `ptr`) in
    /// place of `in1`, as `collect` builds it.
    fn with_ids<I: TopkId>(ptr: u64, len: usize) -> Vec<Arg> {
        let mut args = good();
        args[1] = ids_arg::<I>(ptr, len, 100, plan_ctx());
        args
    }

    #[test]
    fn i64_ids_need_eight_byte_alignment_and_their_own_length() {
        assert_eq!((i32::I64, i64::I64), (false, true));
        for ptr in [0x11000, 0x11008] {
            assert!(check(&with_ids::<i64>(ptr, 100), 0).is_ok(), "{ptr:#x}");
        }
        // 4-byte aligned: enough for i32 ids, not for i64.
        assert!(check(&with_ids::<i32>(0x11004, 100), 0).is_ok());
        assert!(matches!(
            check(&with_ids::<i64>(0x11004, 100), 0),
            Err(Error::Alignment {
                tensor: "topk_indices",
                address: 0x11004,
                align: 8
            })
        ));
        // The length counts ids, whatever their width.
        for len in [99, 101, 200] {
            assert!(matches!(
                check(&with_ids::<i64>(0x11000, len), 0),
                Err(Error::Length {
                    tensor: "topk_indices",
                    expected: 100,
                    actual
                }) if actual == len
            ));
        }
        // 100 i64 ids span 800 bytes: an output 400 bytes on overlaps them
        // (it would not overlap 100 i32 ids).
        let mut args = with_ids::<i64>(0x11000, 100);
        args[2].ptr = 0x11000 + 400;
        assert!(matches!(
            check(&args, 0),
            Err(Error::Overlap {
                output: "out0",
                other: "topk_indices"
            })
        ));
        let mut args = with_ids::<i32>(0x11000, 100);
        args[2].ptr = 0x11000 + 400;
        assert!(check(&args, 0).is_ok());
    }

    #[test]
    fn narrowing_treats_every_id_outside_the_i32_range_as_padding() {
        assert_eq!(7i32.narrow(), 7);
        assert_eq!((-5i32).narrow(), -5);
        assert_eq!(7i64.narrow(), 7);
        assert_eq!((i32::MAX as i64).narrow(), i32::MAX);
        for v in [-1i64, -2, i64::MIN, 1 << 31, (1 << 32) + 5, i64::MAX] {
            assert_eq!(v.narrow(), -1, "{v}");
        }
    }

    #[test]
    fn well_formed_arguments_pass() {
        assert!(check(&good(), 0).is_ok());
    }

    #[test]
    fn overlap_is_half_open_and_symmetric() {
        let a = arg("a", 100, 4, true); // bytes [100, 116)
        for (ptr, len, want) in [
            (116, 4, false), // adjacent after
            (84, 4, false),  // adjacent before: [84, 100)
            (115, 1, true),  // last byte
            (88, 4, true),   // [88, 104)
            (104, 1, true),  // inside
            (0, 1000, true), // around
        ] {
            let b = arg("b", ptr, len, false);
            assert_eq!(overlaps(&a, &b), want, "{ptr} {len}");
            assert_eq!(overlaps(&b, &a), want, "{ptr} {len}");
        }
    }

    #[test]
    fn an_output_overlapping_any_other_tensor_is_rejected() {
        // Output over an input: named as (output, input).
        let mut args = good();
        args[2].ptr = args[1].ptr + 512;
        assert!(matches!(
            check(&args, 0),
            Err(Error::Overlap {
                output: "out0",
                other: "in1"
            })
        ));
        // Two outputs: the first output in order is named.
        let mut args = good();
        args[3].ptr = args[2].ptr;
        assert!(matches!(
            check(&args, 0),
            Err(Error::Overlap {
                output: "out0",
                other: "out1"
            })
        ));
        // Two inputs may share memory; empty tensors overlap nothing.
        let mut args = good();
        args[1].ptr = args[0].ptr;
        args[4].ptr = args[2].ptr + 8;
        assert!(check(&args, 0).is_ok());
    }

    #[test]
    fn checks_run_in_order_context_length_workspace_alignment_overlap() {
        // Every fault at once: the context is reported first.
        let mut args = good();
        args[3].ctx = other_ctx();
        args[1].len = 3;
        args[0].ptr += 4;
        args[2].ptr = args[3].ptr;
        assert!(matches!(
            check(&args, 64),
            Err(Error::Device {
                tensor: "out1",
                expected: 3
            })
        ));
        args[3].ctx = plan_ctx();
        assert!(matches!(
            check(&args, 64),
            Err(Error::Length {
                tensor: "in1",
                expected: 256,
                actual: 3
            })
        ));
        args[1].len = 256;
        assert!(matches!(
            check(&args, 64),
            Err(Error::Workspace {
                required: 64,
                given: 0
            })
        ));
        assert!(matches!(
            check(&args, 0),
            Err(Error::Alignment {
                tensor: "in0",
                align: 16,
                ..
            })
        ));
        args[0].ptr -= 4;
        assert!(matches!(check(&args, 0), Err(Error::Overlap { .. })));
        args[2].ptr = 0x12000;
        assert!(check(&args, 0).is_ok());
    }

    #[test]
    fn empty_tensors_skip_alignment_and_the_workspace_is_counted_in_bytes() {
        let mut args = good();
        args[4].ptr = 3; // no bytes: the address is not checked
        assert!(check(&args, 0).is_ok());
        args[4] = Arg {
            bytes: 256,
            len: 256,
            expected: 256,
            ..arg("workspace", 0x20000, 0, true)
        };
        assert!(check(&args, 256).is_ok());
        assert!(matches!(
            check(&args, 257),
            Err(Error::Workspace {
                required: 257,
                given: 256
            })
        ));
    }

    #[test]
    fn the_accumulator_is_the_workspace_only_for_a_bf16_d_index_k() {
        let shape = Shape {
            batch: 2,
            seq_q: 3,
            seq_k: 5,
            heads: 16,
            head_dim: 64,
            topk: 7,
        };
        let f32_dk = Options::default();
        let bf16_dk = Options {
            d_index_k: GradDtype::Bf16,
            ..f32_dk
        };
        assert_eq!(workspace_bytes(&shape, &f32_dk), 0);
        assert_eq!(workspace_bytes(&shape, &bf16_dk), 2 * 5 * 64 * 4);
        let p = Ptrs {
            d_index_k: 0x100,
            workspace: 0x200,
            ..Ptrs::default()
        };
        assert_eq!(p.dk_accum(workspace_bytes(&shape, &f32_dk)), 0x100);
        assert_eq!(p.dk_accum(workspace_bytes(&shape, &bf16_dk)), 0x200);
    }
}
