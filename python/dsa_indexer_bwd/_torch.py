"""``indexer_backward`` on torch tensors: checks, output allocation, the plan
cache, and the call into the native module (GPU) or the CPU path."""

from typing import NamedTuple

import torch

from . import _checks, _native
from ._cache import PlanCache


class IndexerGrads(NamedTuple):
    """Outputs of :func:`indexer_backward`."""

    grad_signal: torch.Tensor
    """f32 (B, S_q, topk): the score gradient (``attn_score`` itself with ``inplace=True``)."""
    d_index_q: torch.Tensor
    """bf16 (B, S_q, H, D)."""
    d_weights: torch.Tensor
    """(B, S_q, H) of ``d_weights_dtype``."""
    d_index_k: torch.Tensor
    """(B, S_k, D) of ``d_index_k_dtype``."""


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

_plans = PlanCache()


def _plan(device, dims, opts):
    """The cached native plan for (device ordinal, dims, options)."""

    def build():
        sm_scale, key_ids, score, dk, dw, backend = opts
        return _native.Plan(device, tuple(dims), sm_scale, key_ids, score, dk, dw, backend)

    return _plans.get((device, tuple(dims), opts), build)


def clear_plan_cache():
    """Drops every cached plan (a device's kernel module is unloaded when no
    plan and no call holds it)."""
    _plans.clear()


def plan_cache_size():
    """Number of cached plans (one per device, shape or dense layout, and set of
    options used; sparse and dense plans alike), at most
    ``PLAN_CACHE_CAPACITY``: the least recently used plan is dropped first."""
    return len(_plans)


def _narrow_ids(ids, dims, key_ids):
    """int64 ids as int32 for the CPU path (whose reference takes i32), every
    invalid id (negative, or past the end for the convention) as -1, so that
    narrowing can never turn padding into a valid id. The GPU path passes
    int64 ids to the kernels as they are.
    """
    limit = _checks.id_limit(dims, key_ids)
    valid = (ids >= 0) & (ids < limit)
    return ids.masked_fill(~valid, -1).to(torch.int32)


def indexer_backward(
    index_q,
    weights,
    index_k,
    attn_score,
    index_score,
    topk_indices,
    grad_loss,
    *,
    sm_scale=1.0,
    loss_coeff=1.0,
    key_ids="global",
    score="probs",
    d_index_k_dtype=torch.float32,
    d_weights_dtype=torch.bfloat16,
    inplace=False,
    backend="auto",
):
    """Backward of the lightning indexer's KL loss (docs/spec.md of the repository).

    Tensors (dense, contiguous, all on one CUDA device or all on the CPU):
    ``index_q`` bf16 (B, S_q, H, D); ``weights`` bf16 (B, S_q, H); ``index_k``
    bf16 (B, S_k, D); ``attn_score`` f32 (B, S_q, topk), the target
    probabilities; ``index_score`` f32 (B, S_q, topk), the predict
    probabilities (``score="probs"``) or their natural logs
    (``score="logprobs"``); ``topk_indices`` int32 or int64 (B, S_q, topk),
    key ids, global rows of ``index_k`` viewed as (B*S_k, D) or rows of the
    query's own batch (``key_ids="local"``), any invalid id being padding.
    ``grad_loss``: the gradient flowing into the loss, a one-element floating
    tensor on the same device (read on the device when the kernels run) or a
    number.

    Returns :class:`IndexerGrads` ``(grad_signal, d_index_q, d_weights,
    d_index_k)``, fresh tensors from ``torch.empty`` on the inputs' device.
    ``attn_score`` is left unchanged: grad_signal is written into a copy of it,
    unless ``inplace=True``, which writes it over ``attn_score`` (saving a
    (B, S_q, topk) f32 copy) and returns ``attn_score`` as ``grad_signal``.

    On CUDA tensors the kernels are queued on the current stream of the
    tensors' device (``torch.cuda.current_stream(device)``) and the call
    returns without synchronising; plans are cached per device, shape and
    options. On CPU tensors the crate's CPU path (f64 inside, multi-threaded)
    runs to completion.

    Raises ``TypeError`` (a non-tensor or a wrong dtype, naming it),
    ``ValueError`` (shape, contiguity, device, alignment, overlap, a non-finite
    scalar, a shape outside the supported envelope) and ``RuntimeError``
    (unsupported GPU, driver errors).
    """
    tensors = {
        "index_q": index_q,
        "weights": weights,
        "index_k": index_k,
        "attn_score": attn_score,
        "index_score": index_score,
        "topk_indices": topk_indices,
    }
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    dims, where = _checks.check_tensors(tensors)
    opts = _checks.check_options(
        sm_scale, loss_coeff, key_ids, score, d_index_k_dtype, d_weights_dtype, backend
    )
    number = _checks.check_grad_loss(grad_loss, where)
    device = index_q.device
    _, _, _, dk_name, dw_name, _ = opts

    ids = topk_indices
    grad_signal = attn_score if inplace else attn_score.clone()
    d_index_q = torch.empty(index_q.shape, dtype=torch.bfloat16, device=device)
    d_weights = torch.empty(weights.shape, dtype=_DTYPES[dw_name], device=device)
    d_index_k = torch.empty(index_k.shape, dtype=_DTYPES[dk_name], device=device)
    out = IndexerGrads(grad_signal, d_index_q, d_weights, d_index_k)

    if where.type == "cpu":
        if ids.dtype == torch.int64:
            ids = _narrow_ids(ids, dims, key_ids)
        gl = number if number is not None else float(grad_loss.reshape(()).item())
        _native.cpu_execute(
            tuple(dims),
            index_q.data_ptr(),
            weights.data_ptr(),
            index_k.data_ptr(),
            index_score.data_ptr(),
            ids.data_ptr(),
            grad_signal.data_ptr(),
            d_index_q.data_ptr(),
            d_weights.data_ptr(),
            d_index_k.data_ptr(),
            gl,
            float(loss_coeff),
            sm_scale=opts[0],
            key_ids=key_ids,
            score=score,
            d_index_k_dtype=dk_name,
            d_weights_dtype=dw_name,
        )
        return out

    if number is not None:
        gl = torch.full((1,), number, dtype=torch.float32, device=device)
    else:
        gl = grad_loss.reshape(1).to(torch.float32).contiguous()
    plan = _plan(where.index, dims, opts)
    ws_bytes = plan.workspace_bytes
    workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=device) if ws_bytes else None
    # The temporaries (workspace, grad_loss copy) come from
    # torch's caching allocator on this stream, so their memory is reused only
    # by work queued after these kernels on the same stream.
    stream = torch.cuda.current_stream(device).cuda_stream
    plan.execute(
        stream,
        index_q.data_ptr(),
        weights.data_ptr(),
        index_k.data_ptr(),
        index_score.data_ptr(),
        ids.data_ptr(),
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
        ids.dtype == torch.int64,
    )
    return out
