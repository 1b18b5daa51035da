"""Argument checks of ``indexer_backward``.

Written against the parts of the tensor interface they read (``shape``,
``dtype``, ``device.type``, ``device.index``, ``is_contiguous()``), so they
run, and are tested, without torch. Each failure names the tensor:
``TypeError`` for a wrong element type or a non-tensor, ``ValueError``
for everything else.
"""

import math
from typing import NamedTuple

KEY_IDS = ("global", "local")
SCORES = ("probs", "logprobs")
GRAD_DTYPES = ("float32", "bfloat16")
BACKENDS = ("auto", "hopper", "blackwell")

# name -> (element types accepted, dimension names of the shape)
TENSORS = (
    ("index_q", ("bfloat16",), ("B", "S_q", "H", "D")),
    ("weights", ("bfloat16",), ("B", "S_q", "H")),
    ("index_k", ("bfloat16",), ("B", "S_k", "D")),
    ("attn_score", ("float32",), ("B", "S_q", "topk")),
    ("index_score", ("float32",), ("B", "S_q", "topk")),
    ("topk_indices", ("int32", "int64"), ("B", "S_q", "topk")),
)


class Dims(NamedTuple):
    """The sizes of one call."""

    batch: int
    seq_q: int
    seq_k: int
    heads: int
    head_dim: int
    topk: int


class Device(NamedTuple):
    """Where the tensors of a call live: ``("cuda", ordinal)`` or ``("cpu", None)``."""

    type: str
    index: object


def dtype_name(dtype):
    """``torch.bfloat16`` -> ``"bfloat16"`` (also accepts the plain name)."""
    s = str(dtype)
    return s[len("torch."):] if s.startswith("torch.") else s


def _device(t):
    d = t.device
    return Device(d.type, d.index if d.type == "cuda" else None)


def _describe(shape):
    return "(" + ", ".join(str(int(n)) for n in shape) + ")"


def check_tensors(tensors):
    """Checks the six tensors (a dict by name) and returns ``(Dims, Device)``.

    Order: each tensor's kind and element type, then its number of
    dimensions, then the sizes shared between tensors, then contiguity,
    then that all live on one device (CPU, or one CUDA device).
    """
    for name, dtypes, _ in TENSORS:
        t = tensors[name]
        if not all(hasattr(t, a) for a in ("shape", "dtype", "device", "is_contiguous")):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        got = dtype_name(t.dtype)
        if got not in dtypes:
            want = " or ".join(f"torch.{d}" for d in dtypes)
            raise TypeError(f"{name}: expected dtype {want}, got torch.{got}")
    sizes = {}
    for name, _, dims in TENSORS:
        shape = tuple(int(n) for n in tensors[name].shape)
        if len(shape) != len(dims):
            raise ValueError(
                f"{name}: expected {len(dims)} dimensions {_describe_names(dims)}, "
                f"got shape {_describe(shape)}"
            )
        for dim, n in zip(dims, shape):
            if dim not in sizes:
                sizes[dim] = (n, name)
            elif sizes[dim][0] != n:
                want = tuple(sizes.get(d, (d, None))[0] for d in dims)
                raise ValueError(
                    f"{name}: expected shape {_describe_mixed(want)} (its {dim} = "
                    f"{sizes[dim][0]} from {sizes[dim][1]}), got {_describe(shape)}"
                )
    for name, _, _ in TENSORS:
        if not tensors[name].is_contiguous():
            raise ValueError(f"{name}: must be contiguous (call .contiguous() first)")
    first = _device(tensors["index_q"])
    if first.type not in ("cuda", "cpu"):
        raise ValueError(f"index_q: expected a CUDA or CPU tensor, got device {first.type}")
    for name, _, _ in TENSORS[1:]:
        d = _device(tensors[name])
        if d != first:
            raise ValueError(
                f"{name}: on {_where(d)}, but index_q is on {_where(first)}; "
                "all tensors must be on one device"
            )
    dims = Dims(*(sizes[d][0] for d in ("B", "S_q", "S_k", "H", "D", "topk")))
    return dims, first


def check_grad_loss(grad_loss, device):
    """``grad_loss``: a finite number, or a one-element floating tensor on
    ``device``. Returns ``None`` for a tensor (the caller converts it to
    float32) and the float for a number."""
    if isinstance(grad_loss, (int, float)) and not isinstance(grad_loss, bool):
        if not math.isfinite(grad_loss):
            raise ValueError(f"grad_loss must be finite, got {grad_loss}")
        return float(grad_loss)
    if not all(hasattr(grad_loss, a) for a in ("shape", "dtype", "device")):
        raise TypeError(
            f"grad_loss: expected a one-element tensor or a number, got {type(grad_loss).__name__}"
        )
    n = 1
    for s in grad_loss.shape:
        n *= int(s)
    if n != 1:
        raise ValueError(f"grad_loss: expected one element, got shape {_describe(grad_loss.shape)}")
    name = dtype_name(grad_loss.dtype)
    if name not in ("float32", "float64", "float16", "bfloat16"):
        raise TypeError(f"grad_loss: expected a floating dtype, got torch.{name}")
    d = _device(grad_loss)
    if d != device:
        raise ValueError(
            f"grad_loss: on {_where(d)}, but index_q is on {_where(device)}; "
            "all tensors must be on one device"
        )
    return None


def check_options(sm_scale, loss_coeff, key_ids, score, d_index_k_dtype, d_weights_dtype, backend):
    """Normalises and checks the options; returns a tuple usable as a cache key:
    ``(sm_scale, key_ids, score, d_index_k, d_weights, backend)``."""
    for name, v in (("sm_scale", sm_scale), ("loss_coeff", loss_coeff)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{name}: expected a number, got {type(v).__name__}")
        if not math.isfinite(v):
            raise ValueError(f"{name} must be finite, got {v}")
    for name, v, allowed in (
        ("key_ids", key_ids, KEY_IDS),
        ("score", score, SCORES),
        ("backend", backend, BACKENDS),
    ):
        if v not in allowed:
            raise ValueError(f"{name}: expected one of {allowed}, got {v!r}")
    dk = dtype_name(d_index_k_dtype)
    dw = dtype_name(d_weights_dtype)
    for name, v in (("d_index_k_dtype", dk), ("d_weights_dtype", dw)):
        if v not in GRAD_DTYPES:
            raise ValueError(f"{name}: expected torch.float32 or torch.bfloat16, got {v}")
    return (float(sm_scale), key_ids, score, dk, dw, backend)


def id_limit(dims, key_ids):
    """One past the largest valid key id: ``B * S_k`` (global) or ``S_k`` (local)."""
    return dims.batch * dims.seq_k if key_ids == "global" else dims.seq_k


def _where(d):
    return "cpu" if d.type == "cpu" else f"{d.type}:{d.index}"


def _describe_names(dims):
    return "(" + ", ".join(dims) + ")"


def _describe_mixed(parts):
    return "(" + ", ".join(str(p) for p in parts) + ")"
