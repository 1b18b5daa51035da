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

# Signatures that passed the tensor checks: for each tensor (shape, dtype,
# device, contiguity), everything ``_checks.check_tensors`` reads, so a
# call with a known signature has the known outcome. Options that passed
# ``_checks.check_options``, by their raw values and types. Each cleared
# when full.
_KEPT = 256
_signatures = {}
_options = {}


def _remember(cache, key, compute):
    """``cache[key]``, computed by ``compute()`` when absent (an exception
    leaves nothing cached); the cache is cleared when it holds ``_KEPT``."""
    got = cache.get(key)
    if got is None:
        got = compute()
        if len(cache) >= _KEPT:
            cache.clear()
        cache[key] = got
    return got


def _raw_stream(index):
    """The raw handle of the current stream of CUDA device ``index`` (what
    ``torch.cuda.current_stream(index).cuda_stream`` returns, without
    building a Stream object when torch offers the direct query)."""
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if get is not None:
        return get(index)
    return torch.cuda.current_stream(index).cuda_stream


def _checked(check, tensors):
    """``check(dict(zip(names, tensors)))`` for a tuple of tensors in the
    order of ``check``'s table (names from ``_NAMES``), remembered by
    signature: a failing check raises every time, a passing one runs once."""
    sig = (check,) + tuple((t.shape, t.dtype, t.device, t.is_contiguous()) for t in tensors)
    return _remember(_signatures, sig, lambda: check(dict(zip(_NAMES[check], tensors))))


_NAMES = {
    _checks.check_tensors: tuple(n for n, _, _ in _checks.TENSORS),
    _checks.check_forward_tensors: tuple(n for n, _, _ in _checks.FORWARD),
}


def _checked_options(*raw):
    """``_checks.check_options(*raw)``, remembered by the raw values and
    their types (``True == 1`` must not pass for a number)."""
    key = raw + tuple(type(v) for v in raw)
    return _remember(_options, key, lambda: _checks.check_options(*raw))


def _grad_loss_f32(grad_loss, number, device):
    """grad_loss as a one-element f32 device tensor: the tensor itself when
    it already is one, else a converted copy (a number: a filled tensor)."""
    if number is not None:
        return torch.full((1,), number, dtype=torch.float32, device=device)
    if grad_loss.dtype == torch.float32 and grad_loss.is_contiguous():
        return grad_loss
    return grad_loss.reshape(1).to(torch.float32).contiguous()


def _plan(device, dims, opts, deterministic=False):
    """``(plan, built)``: the cached native plan for (device ordinal, dims,
    options, deterministic mode), and whether this call built it."""

    def build():
        sm_scale, key_ids, score, dk, dw, backend = opts
        return _native.Plan(
            device, tuple(dims), sm_scale, key_ids, score, dk, dw, backend, deterministic
        )

    return _plans.get_built((device, tuple(dims), opts, deterministic), build)


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
    key_ids=None,
    score="probs",
    d_index_k_dtype=torch.float32,
    d_weights_dtype=torch.bfloat16,
    inplace=False,
    backend="auto",
    trust_ids=False,
    deterministic=False,
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
    With B = 1 both conventions read every id alike and ``key_ids`` may be
    left out; with B > 1 it must be given (``"global"`` or ``"local"``), and
    the ids are checked against it (docs/spec.md, "Key ids": global ids into
    another batch's keys, or a batch of local ids with no valid id but its own
    keys as global ids, raise ``ValueError`` naming the batch), on every call
    with CPU tensors and on the first call of each plan with CUDA tensors
    (one synchronisation; skipped while a CUDA graph is being captured).
    ``trust_ids=True`` skips the check.
    ``deterministic=True``: every output bitwise the same from run to run
    (``d_index_k`` accumulated in fixed point; docs/architecture.md,
    "Deterministic mode"); on CUDA tensors it runs on the Hopper fast path
    only (compute capability 9.0, topk > 64), elsewhere it raises
    ``NotImplementedError``; the CPU path is deterministic either way.
    ``grad_loss``: the gradient flowing into the loss, a one-element floating
    tensor on the same device (read on the device when the kernels run) or a
    number.

    Returns :class:`IndexerGrads` ``(grad_signal, d_index_q, d_weights,
    d_index_k)``, fresh tensors from ``torch.empty`` on the inputs' device.
    ``attn_score`` is left unchanged: grad_signal is written into a copy of it,
    unless ``inplace=True``, which writes it over ``attn_score`` (saving a
    (B, S_q, topk) f32 copy), bumps its version counter as torch's in-place
    operations do (so a backward through a graph that saved ``attn_score``
    raises instead of reading grad_signal) and returns ``attn_score.detach()``
    as ``grad_signal``; an ``attn_score`` that requires grad is refused
    (``ValueError``) with ``inplace=True``. The returned tensors carry no
    autograd history.

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
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic: expected a bool, got {type(deterministic).__name__}")
    tensors = (index_q, weights, index_k, attn_score, index_score, topk_indices)
    for name, t in zip(_NAMES[_checks.check_tensors], tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    dims, where = _checked(_checks.check_tensors, tensors)
    key_ids = _checks.check_key_ids(key_ids, dims)
    opts = _checked_options(
        sm_scale, loss_coeff, key_ids, score, d_index_k_dtype, d_weights_dtype, backend
    )
    number = _checks.check_grad_loss(grad_loss, where)
    device = index_q.device
    _, _, _, dk_name, dw_name, _ = opts

    if inplace and attn_score.requires_grad:
        raise ValueError(
            "attn_score: requires grad; inplace=True would write grad_signal over it "
            "outside autograd: pass inplace=False (or attn_score.detach())"
        )
    ids = topk_indices
    if where.type == "cpu" and not trust_ids:
        _check_id_convention(ids, dims, key_ids)
    grad_signal = attn_score.detach() if inplace else attn_score.detach().clone()
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
        if inplace:
            _written_in_place(attn_score)
        return out

    gl = _grad_loss_f32(grad_loss, number, device)
    plan, fresh = _plan(where.index, dims, opts, deterministic)
    if fresh and not trust_ids and not torch.cuda.is_current_stream_capturing():
        _check_id_convention(ids, dims, key_ids)
    ws_bytes = plan.workspace_bytes
    workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=device) if ws_bytes else None
    # The temporaries (workspace, grad_loss copy) come from
    # torch's caching allocator on this stream, so their memory is reused only
    # by work queued after these kernels on the same stream.
    stream = _raw_stream(where.index)
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
    if inplace:
        _written_in_place(attn_score)
    return out


def _written_in_place(t):
    """Bumps ``t``'s version counter after the kernels wrote into it, as
    torch's own in-place operations do: autograd then refuses a backward
    through a graph that saved ``t`` ("modified by an inplace operation")."""
    bump = getattr(torch.autograd.graph, "increment_version", None)
    if bump is not None:
        bump(t)
    else:  # torch releases before the public function
        torch._C._increment_version(t)


def _check_id_convention(ids, dims, key_ids):
    """Raises ``ValueError`` where the ids read as the other convention
    (docs/spec.md, "Key ids"; the rule of the replay tools), B > 1 only:
    global ids into another batch's keys, or a batch b >= 1 of local ids
    with no valid id but at least two distinct ids that are its own keys as
    global ids. One synchronisation on CUDA tensors."""
    b, sk = dims.batch, dims.seq_k
    if b <= 1:
        return
    x = ids.reshape(b, -1).to(torch.int64)
    start = (torch.arange(b, device=x.device) * sk).unsqueeze(1)
    own = (x >= start) & (x < start + sk)
    big = torch.iinfo(torch.int64).max
    if key_ids == "global":
        foreign = ((x >= 0) & (x < b * sk) & ~own).sum(dim=1)
        bad = foreign > 0
    else:
        valid = ((x >= 0) & (x < sk)).sum(dim=1)
        other = own & ~((x >= 0) & (x < sk))
        lo = torch.where(other, x, torch.full_like(x, big)).amin(dim=1)
        hi = torch.where(other, x, torch.full_like(x, -1)).amax(dim=1)
        bad = (valid == 0) & (hi > lo)
        bad[0] = False
    if not bool(bad.any()):
        return
    first = int(bad.nonzero()[0, 0])
    n = x.shape[1]
    if key_ids == "global":
        why = (f"{int(foreign[first])} of its {n} ids are rows of another batch's keys "
               "as global ids")
        that = "local"
    else:
        why = (f"none of its {n} ids is a valid local id, and "
               f"{int(other[first].sum())} of them are its own keys as global ids")
        that = "global"
    raise ValueError(
        f"topk_indices: batch {first}: {why}; the ids look like {that} ids: pass "
        f"key_ids={that!r} (or trust_ids=True to use them as {key_ids} ids)"
    )
