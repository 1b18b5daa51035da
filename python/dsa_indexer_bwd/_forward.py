"""The forward on torch tensors (docs/spec.md of the repository, "Forward"):
``indexer_forward`` (the indexer's softmax over each row's selected slots and
its log-sum-exp, the backward's ``index_score``) and ``dense_indexer_forward``
(dense mode's raw logits over the causal keys and their log-sum-exp), with
the checks, output allocation, plan cache and stream handling of
``indexer_backward``."""

from typing import NamedTuple

import torch

from . import _checks, _native
from ._torch import _NAMES, _check_id_convention, _checked, _plans, _raw_stream


class ForwardScores(NamedTuple):
    """Outputs of :func:`indexer_forward`."""

    index_score: torch.Tensor
    """f32 (B, S_q, topk): probabilities (0 at padding) or log-probabilities
    (``-inf`` at padding)."""
    lse: torch.Tensor
    """f32 (B, S_q): each row's log-sum-exp (``-inf`` without a valid slot)."""


class DenseScores(NamedTuple):
    """Outputs of :func:`dense_indexer_forward`."""

    index_score: torch.Tensor
    """f32, (B, S_q, S_k) or (T_q, score_cols): raw logits over each row's
    visible keys, 0 past them."""
    index_lse: torch.Tensor
    """f32, (B, S_q) or (T_q,): each row's log-sum-exp."""


def indexer_forward(
    index_q,
    weights,
    index_k,
    topk_indices,
    *,
    sm_scale=1.0,
    key_ids=None,
    score="probs",
    kernel="auto",
    trust_ids=False,
):
    """The lightning indexer's score at each row's selected slots:
    ``logit[b,s,t] = sum_h weights[b,s,h] * relu(sm_scale * index_q[b,s,h,:] .
    index_k[key(t),:])`` over the valid slots, then the row's softmax.

    Tensors as in :func:`indexer_backward`: ``index_q`` bf16 (B, S_q, H, D),
    ``weights`` bf16 (B, S_q, H), ``index_k`` bf16 (B, S_k, D),
    ``topk_indices`` int32 or int64 (B, S_q, topk), any invalid id padding,
    ``key_ids`` as there (required for B > 1, checked against the ids on CPU
    calls and a CUDA plan's first call unless ``trust_ids``). ``score``:
    ``"probs"`` or ``"logprobs"``; ``kernel``: ``"auto"`` or ``"portable"``
    (the kernel of GPUs without a wgmma module).

    Returns :class:`ForwardScores` ``(index_score, lse)``: fresh tensors on
    the inputs' device, computed on the current stream (CUDA, no
    synchronisation) or by the crate's CPU path. Raises as
    :func:`indexer_backward` does.
    """
    tensors = (index_q, weights, index_k, topk_indices)
    for name, t in zip(_NAMES[_checks.check_forward_tensors], tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    dims, where = _checked(_checks.check_forward_tensors, tensors)
    key_ids = _checks.check_key_ids(key_ids, dims)
    opts = _checks.check_forward_options(sm_scale, key_ids, score, kernel)
    device = index_q.device
    out = ForwardScores(
        torch.empty(topk_indices.shape, dtype=torch.float32, device=device),
        torch.empty(weights.shape[:2], dtype=torch.float32, device=device),
    )
    ids = topk_indices
    wide = ids.dtype == torch.int64
    if where.type == "cpu":
        if not trust_ids:
            _check_id_convention(ids, dims, key_ids)
        _native.cpu_forward(
            tuple(dims),
            index_q.data_ptr(),
            weights.data_ptr(),
            index_k.data_ptr(),
            ids.data_ptr(),
            out.index_score.data_ptr(),
            out.lse.data_ptr(),
            sm_scale=opts[0],
            key_ids=key_ids,
            score=score,
            ids_i64=wide,
        )
        return out
    key = ("forward", where.index, tuple(dims), opts)
    plan, fresh = _plans.get_built(
        key, lambda: _native.ForwardPlan(where.index, tuple(dims), *opts)
    )
    if fresh and not trust_ids and not torch.cuda.is_current_stream_capturing():
        _check_id_convention(ids, dims, key_ids)
    plan.execute(
        _raw_stream(where.index),
        index_q.data_ptr(),
        weights.data_ptr(),
        index_k.data_ptr(),
        ids.data_ptr(),
        out.index_score.data_ptr(),
        out.lse.data_ptr(),
        wide,
    )
    return out


def dense_indexer_forward(
    index_q,
    weights,
    index_k,
    *,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    q_offset=None,
    ratio=1,
    score_cols=None,
    sm_scale=1.0,
    kernel="auto",
):
    """Dense mode's forward: the raw logits of every query row against its
    visible causal keys (0 past them) and their row log-sum-exp, exactly the
    ``index_score`` and ``index_lse`` that :func:`dense_indexer_backward`
    takes. Layouts as there: BSHD ``index_q`` (B, S_q, H, D), ``weights``
    (B, S_q, H), ``index_k`` (B, S_k, D); or packed with ``cu_seqlens_q``,
    ``cu_seqlens_k`` and ``score_cols`` (default: the longest key sequence).

    Returns :class:`DenseScores` ``(index_score, index_lse)``.
    """
    tensors = {"index_q": index_q, "weights": weights, "index_k": index_k}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    dims, where = _checks.check_dense_forward_tensors(
        tensors, cu_seqlens_q, cu_seqlens_k, q_offset, ratio, score_cols
    )
    opts = _checks.check_forward_options(sm_scale, "global", "probs", kernel)
    device = index_q.device
    rows_shape = tuple(weights.shape[:-1])
    out = DenseScores(
        torch.empty(rows_shape + (dims.score_cols,), dtype=torch.float32, device=device),
        torch.empty(rows_shape, dtype=torch.float32, device=device),
    )
    if where.type == "cpu":
        _native.dense_cpu_forward(
            dims.heads,
            dims.head_dim,
            index_q.data_ptr(),
            weights.data_ptr(),
            index_k.data_ptr(),
            out.index_score.data_ptr(),
            out.index_lse.data_ptr(),
            sm_scale=opts[0],
            **dims.layout_kwargs(),
        )
        return out
    key = ("dense_forward", where.index, dims, opts)

    def build():
        return _native.DenseForwardPlan(
            where.index, dims.heads, dims.head_dim, sm_scale=opts[0], kernel=kernel,
            **dims.layout_kwargs()
        )

    plan = _plans.get(key, build)
    plan.execute(
        _raw_stream(where.index),
        index_q.data_ptr(),
        weights.data_ptr(),
        index_k.data_ptr(),
        out.index_score.data_ptr(),
        out.index_lse.data_ptr(),
    )
    return out
