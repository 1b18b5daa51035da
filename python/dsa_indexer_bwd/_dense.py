"""``dense_indexer_backward`` on torch tensors: dense mode (docs/spec.md of
the repository, "Dense mode"), with the checks, output allocation, plan
cache and stream handling of ``indexer_backward``."""

from typing import NamedTuple

import torch

from . import _checks, _native
from ._torch import _DTYPES, _grad_loss_f32, _plans, _raw_stream


class DenseGrads(NamedTuple):
    """Outputs of :func:`dense_indexer_backward`."""

    grad_signal: torch.Tensor
    """f32, the shape of ``index_score``: the score gradient, 0 at the columns
    a row does not see (``index_score`` itself with ``inplace=True``)."""
    d_index_q: torch.Tensor
    """bf16, the shape of ``index_q``."""
    d_weights: torch.Tensor
    """The shape of ``weights``, of ``d_weights_dtype``."""
    d_index_k: torch.Tensor
    """The shape of ``index_k``, of ``d_index_k_dtype``."""


def _dense_plan(device, dims, opts):
    """The cached native dense plan for (device ordinal, dims, options)."""

    def build():
        sm_scale, dk, dw, deterministic = opts
        return _native.DensePlan(
            device, dims.heads, dims.head_dim, sm_scale=sm_scale, d_index_k=dk, d_weights=dw,
            deterministic=deterministic, **dims.layout_kwargs()
        )

    return _plans.get(("dense", device, dims, opts), build)


def dense_indexer_backward(
    index_q,
    weights,
    index_k,
    attn_score,
    attn_l1norm,
    index_score,
    index_lse,
    grad_loss=None,
    *,
    sm_scale=1.0,
    loss_coeff=1.0,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    q_offset=None,
    ratio=1,
    d_index_k_dtype=torch.float32,
    d_weights_dtype=torch.bfloat16,
    inplace=False,
    deterministic=False,
):
    """Dense-mode backward of the lightning indexer's KL loss: every query
    row against every causal key (docs/spec.md of the repository, "Dense mode").

    Tensors (contiguous, all on one CUDA device or all on the CPU), BSHD:
    ``index_q`` bf16 (B, S_q, H, D); ``weights`` bf16 (B, S_q, H);
    ``index_k`` bf16 (B, S_k, D); ``attn_score`` f32 (B, S_q, S_k), the
    non-negative attention mass; ``attn_l1norm`` f32 (B, S_q), its row sums;
    ``index_score`` f32 (B, S_q, S_k), the raw indexer logits; ``index_lse``
    f32 (B, S_q), their row log-sum-exp. Packed variable-length batches give
    ``cu_seqlens_q`` and ``cu_seqlens_k`` (B + 1 non-decreasing offsets from
    0, as int32 / int64 tensors or lists; a tensor on the GPU is read back
    to the host) with ``index_q`` (T_q, H, D), ``weights`` (T_q, H),
    ``index_k`` (T_k, D), the score tensors (T_q, cols) with ``cols`` at
    least the longest key sequence, and the row tensors (T_q,).

    Row ``s`` of batch ``b`` sees the key columns ``j < min((q_offset[b] + s
    + 1) // ratio, S_k(b))``. ``q_offset``: None (0), an integer for every
    batch, or one integer per batch (list, tuple or integer tensor);
    ``ratio``: an integer >= 1. ``grad_loss``: the gradient flowing into the
    loss, a one-element floating tensor on the tensors' device (read on the
    device when the kernels run), a number, or None (1.0).

    Returns :class:`DenseGrads` ``(grad_signal, d_index_q, d_weights,
    d_index_k)``, fresh tensors on the inputs' device. ``index_score`` is
    left unchanged: grad_signal is written into a copy of it, unless
    ``inplace=True``, which writes it over ``index_score`` and returns
    ``index_score`` as ``grad_signal``. ``attn_score`` is only read.

    On CUDA tensors the kernels are queued on the current stream of the
    tensors' device and the call returns without synchronising; plans are
    cached per device, layout (with ``q_offset`` and ``ratio``) and options.
    The GPU path runs on compute capability 9.0 with more than 64 score
    columns (and at most 2^29 score elements); elsewhere it raises
    ``NotImplementedError`` (move the tensors to the CPU). On CPU tensors
    the crate's dense CPU path (f64 inside, multi-threaded) runs to
    completion.

    ``deterministic=True``: every output bitwise the same from run to run
    (``d_index_k``'s sums added in a fixed order; docs/architecture.md,
    "Deterministic mode"); on CUDA tensors it runs where the GPU path does
    and raises ``NotImplementedError`` elsewhere; the CPU path is
    deterministic either way.

    Raises ``TypeError`` (a non-tensor or a wrong dtype, naming it),
    ``ValueError`` (shape, contiguity, device, layout, alignment, overlap, a
    non-finite scalar, a shape outside the supported envelope),
    ``NotImplementedError`` and ``RuntimeError`` (driver errors).
    """
    tensors = {
        "index_q": index_q,
        "weights": weights,
        "index_k": index_k,
        "attn_score": attn_score,
        "attn_l1norm": attn_l1norm,
        "index_score": index_score,
        "index_lse": index_lse,
    }
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    dims, where = _checks.check_dense_tensors(
        tensors, cu_seqlens_q, cu_seqlens_k, q_offset, ratio
    )
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic: expected a bool, got {type(deterministic).__name__}")
    sm, _, _, dk_name, dw_name, _ = _checks.check_options(
        sm_scale, loss_coeff, "global", "probs", d_index_k_dtype, d_weights_dtype, "auto"
    )
    if grad_loss is None:
        grad_loss = 1.0
    number = _checks.check_grad_loss(grad_loss, where)
    device = index_q.device

    grad_signal = index_score if inplace else index_score.clone()
    d_index_q = torch.empty(index_q.shape, dtype=torch.bfloat16, device=device)
    d_weights = torch.empty(weights.shape, dtype=_DTYPES[dw_name], device=device)
    d_index_k = torch.empty(index_k.shape, dtype=_DTYPES[dk_name], device=device)
    out = DenseGrads(grad_signal, d_index_q, d_weights, d_index_k)

    if where.type == "cpu":
        gl = number if number is not None else float(grad_loss.reshape(()).item())
        _native.dense_cpu_execute(
            dims.heads,
            dims.head_dim,
            index_q.data_ptr(),
            weights.data_ptr(),
            index_k.data_ptr(),
            attn_score.data_ptr(),
            attn_l1norm.data_ptr(),
            grad_signal.data_ptr(),
            index_lse.data_ptr(),
            d_index_q.data_ptr(),
            d_weights.data_ptr(),
            d_index_k.data_ptr(),
            gl,
            float(loss_coeff),
            sm_scale=sm,
            d_index_k_dtype=dk_name,
            d_weights_dtype=dw_name,
            **dims.layout_kwargs(),
        )
        return out

    gl = _grad_loss_f32(grad_loss, number, device)
    plan = _dense_plan(where.index, dims, (sm, dk_name, dw_name, deterministic))
    ws_bytes = plan.workspace_bytes
    workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=device) if ws_bytes else None
    # The temporaries come from torch's caching allocator on this stream, so
    # their memory is reused only by work queued after these kernels on it.
    stream = _raw_stream(where.index)
    plan.execute(
        stream,
        index_q.data_ptr(),
        weights.data_ptr(),
        index_k.data_ptr(),
        attn_score.data_ptr(),
        attn_l1norm.data_ptr(),
        index_lse.data_ptr(),
        gl.data_ptr(),
        grad_signal.data_ptr(),
        d_index_q.data_ptr(),
        d_weights.data_ptr(),
        d_index_k.data_ptr(),
        workspace.data_ptr() if workspace is not None else 0,
        ws_bytes,
        float(loss_coeff),
        dw_name,
        dk_name,
    )
    return out
