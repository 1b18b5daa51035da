"""The crate's forward and backward as PyTorch custom operators
(``torch.library``), so ``torch.compile(fullgraph=True)`` traces through them
(each is one opaque node with a fake implementation for shapes) and
``mode="reduce-overhead"`` captures them in CUDA graphs; and the indexer's KL
loss as an autograd-ready function whose backward is the crate's.

Operators (namespace ``dsa_indexer``; none mutates its inputs):

- ``sparse_forward(index_q, weights, index_k, topk_indices, sm_scale, key_ids,
  score) -> (index_score, lse)``
- ``sparse_backward(index_q, weights, index_k, attn_score, index_score,
  topk_indices, grad_loss, sm_scale, loss_coeff, key_ids, score, d_index_k_dtype,
  deterministic=False) -> (grad_signal, d_index_q, d_weights, d_index_k)``
- ``dense_forward(index_q, weights, index_k, cu_seqlens_q, cu_seqlens_k,
  score_cols, q_offset, ratio, sm_scale) -> (index_score, index_lse)``
- ``dense_backward(index_q, weights, index_k, attn_score, attn_l1norm,
  index_score, index_lse, grad_loss, cu_seqlens_q, cu_seqlens_k, q_offset,
  ratio, sm_scale, loss_coeff, d_index_k_dtype, deterministic=False) ->
  (grad_signal, d_index_q, d_weights, d_index_k)``
- ``kl_loss`` and ``dense_kl_loss``: the loss and what its backward needs
  (:func:`indexer_loss`, :func:`dense_indexer_loss`).

Dense layouts pass as integer lists: ``cu_seqlens_*`` empty for BSHD,
``q_offset`` empty for 0, ``score_cols`` 0 for the default.
"""

from typing import List, Tuple

import torch
from torch import Tensor

from ._dense import dense_indexer_backward
from ._forward import dense_indexer_forward, indexer_forward
from ._torch import indexer_backward

CLIP = 3.720075976020836e-44
"""``exp(-100)`` as the kernels compare it (an f32 subnormal)."""

_DT = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _layout(cu_q, cu_k, q_offset):
    """The Python layer's layout keywords from the operators' lists."""
    kw = {}
    if len(cu_q) > 0:
        kw["cu_seqlens_q"] = list(cu_q)
        kw["cu_seqlens_k"] = list(cu_k)
    if len(q_offset) > 0:
        kw["q_offset"] = list(q_offset)
    return kw


@torch.library.custom_op("dsa_indexer::sparse_forward", mutates_args=())
def sparse_forward(
    index_q: Tensor,
    weights: Tensor,
    index_k: Tensor,
    topk_indices: Tensor,
    sm_scale: float,
    key_ids: str,
    score: str,
) -> Tuple[Tensor, Tensor]:
    r = indexer_forward(
        index_q, weights, index_k, topk_indices, sm_scale=sm_scale, key_ids=key_ids,
        score=score,
    )
    return r.index_score, r.lse


@sparse_forward.register_fake
def _(index_q, weights, index_k, topk_indices, sm_scale, key_ids, score):
    return (
        index_q.new_empty(topk_indices.shape, dtype=torch.float32),
        index_q.new_empty(weights.shape[:2], dtype=torch.float32),
    )


@torch.library.custom_op("dsa_indexer::sparse_backward", mutates_args=())
def sparse_backward(
    index_q: Tensor,
    weights: Tensor,
    index_k: Tensor,
    attn_score: Tensor,
    index_score: Tensor,
    topk_indices: Tensor,
    grad_loss: Tensor,
    sm_scale: float,
    loss_coeff: float,
    key_ids: str,
    score: str,
    d_index_k_dtype: str,
    deterministic: bool = False,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    g = indexer_backward(
        index_q, weights, index_k, attn_score, index_score, topk_indices, grad_loss,
        sm_scale=sm_scale, loss_coeff=loss_coeff, key_ids=key_ids, score=score,
        d_index_k_dtype=_DT[d_index_k_dtype], trust_ids=True, deterministic=deterministic,
    )
    return g.grad_signal, g.d_index_q, g.d_weights, g.d_index_k


@sparse_backward.register_fake
def _(index_q, weights, index_k, attn_score, index_score, topk_indices, grad_loss, sm_scale,
      loss_coeff, key_ids, score, d_index_k_dtype, deterministic=False):
    return (
        torch.empty_like(attn_score),
        torch.empty_like(index_q),
        torch.empty_like(weights),
        index_k.new_empty(index_k.shape, dtype=_DT[d_index_k_dtype]),
    )


@torch.library.custom_op("dsa_indexer::dense_forward", mutates_args=())
def dense_forward(
    index_q: Tensor,
    weights: Tensor,
    index_k: Tensor,
    cu_seqlens_q: List[int],
    cu_seqlens_k: List[int],
    score_cols: int,
    q_offset: List[int],
    ratio: int,
    sm_scale: float,
) -> Tuple[Tensor, Tensor]:
    kw = _layout(cu_seqlens_q, cu_seqlens_k, q_offset)
    if score_cols > 0:
        kw["score_cols"] = score_cols
    r = dense_indexer_forward(index_q, weights, index_k, ratio=ratio, sm_scale=sm_scale, **kw)
    return r.index_score, r.index_lse


def _dense_cols(index_k, cu_seqlens_k, score_cols):
    if score_cols > 0:
        return score_cols
    if len(cu_seqlens_k) > 0:
        return max(b - a for a, b in zip(cu_seqlens_k, cu_seqlens_k[1:]))
    return index_k.shape[1]


@dense_forward.register_fake
def _(index_q, weights, index_k, cu_seqlens_q, cu_seqlens_k, score_cols, q_offset, ratio,
      sm_scale):
    rows = tuple(weights.shape[:-1])
    cols = _dense_cols(index_k, cu_seqlens_k, score_cols)
    return (
        index_q.new_empty(rows + (cols,), dtype=torch.float32),
        index_q.new_empty(rows, dtype=torch.float32),
    )


@torch.library.custom_op("dsa_indexer::dense_backward", mutates_args=())
def dense_backward(
    index_q: Tensor,
    weights: Tensor,
    index_k: Tensor,
    attn_score: Tensor,
    attn_l1norm: Tensor,
    index_score: Tensor,
    index_lse: Tensor,
    grad_loss: Tensor,
    cu_seqlens_q: List[int],
    cu_seqlens_k: List[int],
    q_offset: List[int],
    ratio: int,
    sm_scale: float,
    loss_coeff: float,
    d_index_k_dtype: str,
    deterministic: bool = False,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    g = dense_indexer_backward(
        index_q, weights, index_k, attn_score, attn_l1norm, index_score, index_lse, grad_loss,
        sm_scale=sm_scale, loss_coeff=loss_coeff, ratio=ratio,
        d_index_k_dtype=_DT[d_index_k_dtype], deterministic=deterministic,
        **_layout(cu_seqlens_q, cu_seqlens_k, q_offset),
    )
    return g.grad_signal, g.d_index_q, g.d_weights, g.d_index_k


@dense_backward.register_fake
def _(index_q, weights, index_k, attn_score, attn_l1norm, index_score, index_lse, grad_loss,
      cu_seqlens_q, cu_seqlens_k, q_offset, ratio, sm_scale, loss_coeff, d_index_k_dtype,
      deterministic=False):
    return (
        torch.empty_like(index_score),
        torch.empty_like(index_q),
        torch.empty_like(weights),
        index_k.new_empty(index_k.shape, dtype=_DT[d_index_k_dtype]),
    )


def _kl(target, logp, coeff, visible=None):
    """``coeff * sum t (log t - logp)`` with ``t = max(target, CLIP)`` over the
    slots whose predict is at least CLIP (``logp >= -100``; padding's ``-inf``
    fails it) and, dense, the visible columns."""
    t = target.clamp_min(CLIP)
    keep = logp >= -100.0
    if visible is not None:
        keep = keep & visible
    terms = torch.where(keep, t * (t.log() - logp), torch.zeros_like(t))
    return terms.sum() * coeff


@torch.library.custom_op("dsa_indexer::kl_loss", mutates_args=())
def kl_loss(
    index_q: Tensor,
    weights: Tensor,
    index_k: Tensor,
    topk_indices: Tensor,
    attn_score: Tensor,
    sm_scale: float,
    loss_coeff: float,
    key_ids: str,
    deterministic: bool = False,
) -> Tuple[Tensor, Tensor]:
    logp, _ = indexer_forward(
        index_q, weights, index_k, topk_indices, sm_scale=sm_scale, key_ids=key_ids,
        score="logprobs",
    )
    rows = topk_indices.shape[0] * topk_indices.shape[1]
    return _kl(attn_score, logp, loss_coeff / rows), logp


@kl_loss.register_fake
def _(index_q, weights, index_k, topk_indices, attn_score, sm_scale, loss_coeff, key_ids,
      deterministic=False):
    return (
        index_q.new_empty((), dtype=torch.float32),
        index_q.new_empty(topk_indices.shape, dtype=torch.float32),
    )


def _kl_setup(ctx, inputs, output):
    index_q, weights, index_k, topk_indices, attn_score, sm_scale, loss_coeff, key_ids = inputs[:8]
    deterministic = inputs[8] if len(inputs) > 8 else False
    ctx.save_for_backward(index_q, weights, index_k, topk_indices, attn_score, output[1])
    ctx.args = (sm_scale, loss_coeff, key_ids, str(index_k.dtype).replace("torch.", ""),
                deterministic)


def _kl_backward(ctx, grad_loss, _grad_logp):
    index_q, weights, index_k, topk_indices, attn_score, logp = ctx.saved_tensors
    sm_scale, loss_coeff, key_ids, dk, deterministic = ctx.args
    _, dq, dw, dk_ = sparse_backward(
        index_q, weights, index_k, attn_score, logp, topk_indices,
        grad_loss.reshape(1).to(torch.float32), sm_scale, loss_coeff, key_ids, "logprobs", dk,
        deterministic,
    )
    return dq, dw, dk_, None, None, None, None, None, None


kl_loss.register_autograd(_kl_backward, setup_context=_kl_setup)


def indexer_loss(
    index_q, weights, index_k, topk_indices, attn_score, *, sm_scale=1.0, loss_coeff=1.0,
    key_ids=None, deterministic=False,
):
    """The lightning indexer's KL loss (docs/spec.md, "Forward": ``loss = c *
    sum_{b,s} sum_t max(target, CLIP) (log max(target, CLIP) - log predict)``
    over the valid slots whose predict is at least CLIP, ``c = loss_coeff /
    (B * S_q)``), with ``predict`` the indexer's softmax over each row's
    selected slots computed by the crate's forward kernel.

    Differentiable in ``index_q``, ``weights`` and ``index_k``: its backward
    is the crate's backward, which saves ``index_q``, ``weights``,
    ``index_k``, ``topk_indices``, ``attn_score`` and the (B, S_q, topk)
    log-probabilities, nothing of size S_q x topk x D. ``attn_score`` (the
    target) gets no gradient. Slots with ``predict < CLIP`` are masked out of
    the loss and its gradient (plain autograd of an unmasked KL differs
    there). Tensors and ``key_ids`` as in :func:`indexer_forward`; a scalar
    f32 tensor on their device is returned. Works under
    ``torch.compile(fullgraph=True)`` and CUDA graphs. ``deterministic=True``
    runs the backward in deterministic mode (:func:`indexer_backward`):
    the gradients are bitwise the same from run to run.
    """
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic: expected a bool, got {type(deterministic).__name__}")
    if key_ids is None:
        if topk_indices.shape[0] > 1:
            raise ValueError(
                f"key_ids: B = {topk_indices.shape[0]}: say which convention topk_indices "
                "uses, key_ids='global' or key_ids='local'"
            )
        key_ids = "global"
    loss, _ = kl_loss(
        index_q, weights, index_k, topk_indices, attn_score, float(sm_scale), float(loss_coeff),
        key_ids, deterministic,
    )
    return loss


_VISIBLE = {}


def _visible_mask(index_score, cu_seqlens_q, cu_seqlens_k, q_offset, ratio):
    """Each row's visible columns as a boolean mask of ``index_score``'s shape
    (built on the first call of a layout, outside any graph capture, and
    kept)."""
    key = (index_score.device, tuple(index_score.shape), tuple(cu_seqlens_q),
           tuple(cu_seqlens_k), tuple(q_offset), ratio)
    m = _VISIBLE.get(key)
    if m is not None:
        return m
    cols = index_score.shape[-1]
    if len(cu_seqlens_q) > 0:
        batches = [(cu_seqlens_q[b], cu_seqlens_q[b + 1], cu_seqlens_k[b + 1] - cu_seqlens_k[b])
                   for b in range(len(cu_seqlens_q) - 1)]
    else:
        nb, sq, sk = index_score.shape
        batches = [(b * sq, (b + 1) * sq, sk) for b in range(nb)]
    vis = []
    for b, (r0, r1, sk) in enumerate(batches):
        off = q_offset[b] if len(q_offset) > 0 else 0
        for s in range(r1 - r0):
            vis.append(max(0, min((off + s + 1) // ratio, sk)))
    lengths = torch.tensor(vis, device=index_score.device).reshape(index_score.shape[:-1])
    m = torch.arange(cols, device=index_score.device) < lengths.unsqueeze(-1)
    _VISIBLE[key] = m
    return m


@torch.library.custom_op("dsa_indexer::dense_kl_loss", mutates_args=())
def dense_kl_loss(
    index_q: Tensor,
    weights: Tensor,
    index_k: Tensor,
    attn_score: Tensor,
    attn_l1norm: Tensor,
    cu_seqlens_q: List[int],
    cu_seqlens_k: List[int],
    q_offset: List[int],
    ratio: int,
    sm_scale: float,
    loss_coeff: float,
    deterministic: bool = False,
) -> Tuple[Tensor, Tensor, Tensor]:
    kw = _layout(cu_seqlens_q, cu_seqlens_k, q_offset)
    if len(cu_seqlens_q) > 0:
        kw["score_cols"] = attn_score.shape[-1]
    logits, lse = dense_indexer_forward(index_q, weights, index_k, ratio=ratio,
                                        sm_scale=sm_scale, **kw)
    vis = _visible_mask(logits, cu_seqlens_q, cu_seqlens_k, q_offset, ratio)
    target = attn_score / (attn_l1norm.unsqueeze(-1) + 1e-10)
    rows = lse.numel()
    return _kl(target, logits - lse.unsqueeze(-1), loss_coeff / rows, vis), logits, lse


@dense_kl_loss.register_fake
def _(index_q, weights, index_k, attn_score, attn_l1norm, cu_seqlens_q, cu_seqlens_k, q_offset,
      ratio, sm_scale, loss_coeff, deterministic=False):
    return (
        index_q.new_empty((), dtype=torch.float32),
        torch.empty_like(attn_score),
        torch.empty_like(attn_l1norm),
    )


def _dense_setup(ctx, inputs, output):
    (index_q, weights, index_k, attn_score, attn_l1norm, cu_q, cu_k, q_offset, ratio, sm_scale,
     loss_coeff) = inputs[:11]
    deterministic = inputs[11] if len(inputs) > 11 else False
    ctx.save_for_backward(index_q, weights, index_k, attn_score, attn_l1norm, output[1],
                          output[2])
    ctx.args = (list(cu_q), list(cu_k), list(q_offset), ratio, sm_scale, loss_coeff,
                str(index_k.dtype).replace("torch.", ""), deterministic)


def _dense_backward(ctx, grad_loss, _g_logits, _g_lse):
    index_q, weights, index_k, attn_score, attn_l1norm, logits, lse = ctx.saved_tensors
    cu_q, cu_k, q_offset, ratio, sm_scale, loss_coeff, dk, deterministic = ctx.args
    _, dq, dw, dk_ = dense_backward(
        index_q, weights, index_k, attn_score, attn_l1norm, logits, lse,
        grad_loss.reshape(1).to(torch.float32), cu_q, cu_k, q_offset, ratio, sm_scale,
        loss_coeff, dk, deterministic,
    )
    return dq, dw, dk_, None, None, None, None, None, None, None, None, None


dense_kl_loss.register_autograd(_dense_backward, setup_context=_dense_setup)


def dense_indexer_loss(
    index_q, weights, index_k, attn_score, attn_l1norm, *, cu_seqlens_q=None, cu_seqlens_k=None,
    q_offset=None, ratio=1, sm_scale=1.0, loss_coeff=1.0, deterministic=False,
):
    """Dense mode's KL loss (docs/spec.md, "Dense mode": ``target_j =
    max(attn_j / (l1 + 1e-10), CLIP)``, ``predict_j = exp(logit_j - lse)``
    over each row's visible columns, ``c = loss_coeff / rows``), with the
    logits from the crate's dense forward; differentiable in ``index_q``,
    ``weights`` and ``index_k`` through the crate's dense backward (saved:
    the inputs, the logits and their row log-sum-exp). Layouts as in
    :func:`dense_indexer_forward`, ``cu_seqlens`` and ``q_offset`` as
    integer lists; the packed score tensors' columns are ``attn_score``'s.
    ``deterministic=True`` runs the backward in deterministic mode
    (:func:`dense_indexer_backward`).
    """
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic: expected a bool, got {type(deterministic).__name__}")
    def ints(v):
        if v is None:
            return []
        if isinstance(v, int):
            return None
        return [int(x) for x in v]

    cu_q, cu_k = ints(cu_seqlens_q), ints(cu_seqlens_k)
    if isinstance(q_offset, int):
        batch = len(cu_q) - 1 if cu_q else index_q.shape[0]
        offs = [q_offset] * batch
    else:
        offs = ints(q_offset)
    loss, _, _ = dense_kl_loss(
        index_q, weights, index_k, attn_score, attn_l1norm, cu_q, cu_k, offs, int(ratio),
        float(sm_scale), float(loss_coeff), deterministic,
    )
    return loss
