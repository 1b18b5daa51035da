"""Argument checks of ``indexer_backward``.

Written against the parts of the tensor interface they read (``shape``,
``dtype``, ``device.type``, ``device.index``, ``is_contiguous()``), so they
run, and are tested, without torch. Each failure names the tensor:
``TypeError`` for a wrong element type or a non-tensor, ``ValueError``
for everything else.
"""

import math
import numbers
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
    sizes, first = _check_table(tensors, TENSORS)
    dims = Dims(*(sizes[d][0] for d in ("B", "S_q", "S_k", "H", "D", "topk")))
    return dims, first


def _check_table(tensors, table):
    """The checks of :func:`check_tensors` over ``table`` (rows as in
    ``TENSORS``); returns ``({dim: (size, tensor name)}, Device)``."""
    for name, dtypes, _ in table:
        t = tensors[name]
        if not all(hasattr(t, a) for a in ("shape", "dtype", "device", "is_contiguous")):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        got = dtype_name(t.dtype)
        if got not in dtypes:
            want = " or ".join(f"torch.{d}" for d in dtypes)
            raise TypeError(f"{name}: expected dtype {want}, got torch.{got}")
    sizes = {}
    for name, _, dims in table:
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
    for name, _, _ in table:
        if not tensors[name].is_contiguous():
            raise ValueError(f"{name}: must be contiguous (call .contiguous() first)")
    lead = table[0][0]
    first = _device(tensors[lead])
    if first.type not in ("cuda", "cpu"):
        raise ValueError(f"{lead}: expected a CUDA or CPU tensor, got device {first.type}")
    for name, _, _ in table[1:]:
        d = _device(tensors[name])
        if d != first:
            raise ValueError(
                f"{name}: on {_where(d)}, but {lead} is on {_where(first)}; "
                "all tensors must be on one device"
            )
    return sizes, first


# Dense mode (docs/spec.md, "Dense mode"): BSHD and packed tensors.
DENSE_BSHD = (
    ("index_q", ("bfloat16",), ("B", "S_q", "H", "D")),
    ("weights", ("bfloat16",), ("B", "S_q", "H")),
    ("index_k", ("bfloat16",), ("B", "S_k", "D")),
    ("attn_score", ("float32",), ("B", "S_q", "S_k")),
    ("attn_l1norm", ("float32",), ("B", "S_q")),
    ("index_score", ("float32",), ("B", "S_q", "S_k")),
    ("index_lse", ("float32",), ("B", "S_q")),
)
DENSE_PACKED = (
    ("index_q", ("bfloat16",), ("T_q", "H", "D")),
    ("weights", ("bfloat16",), ("T_q", "H")),
    ("index_k", ("bfloat16",), ("T_k", "D")),
    ("attn_score", ("float32",), ("T_q", "cols")),
    ("attn_l1norm", ("float32",), ("T_q",)),
    ("index_score", ("float32",), ("T_q", "cols")),
    ("index_lse", ("float32",), ("T_q",)),
)


class DenseDims(NamedTuple):
    """The sizes of one dense call (hashable: part of the plan cache key).
    ``bshd`` is ``(B, S_q, S_k)`` or ``None`` when packed; then
    ``cu_seqlens_q``, ``cu_seqlens_k`` are tuples of B + 1 offsets and
    ``score_cols`` the columns of the score tensors."""

    heads: int
    head_dim: int
    bshd: object
    cu_seqlens_q: object
    cu_seqlens_k: object
    score_cols: int
    q_offset: tuple
    ratio: int

    @property
    def batch(self):
        return self.bshd[0] if self.bshd is not None else len(self.cu_seqlens_q) - 1

    def layout_kwargs(self):
        """The layout keywords of ``_native.DensePlan`` and ``dense_cpu_execute``."""
        kw = dict(q_offset=list(self.q_offset), ratio=self.ratio)
        if self.bshd is not None:
            kw["bshd"] = self.bshd
        else:
            kw.update(cu_seqlens_q=list(self.cu_seqlens_q),
                      cu_seqlens_k=list(self.cu_seqlens_k), score_cols=self.score_cols)
        return kw


def _int(name, v):
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError(f"{name}: expected an integer, got {type(v).__name__}")
    return int(v.__index__())


def _ints(name, v):
    """A list of ints from a list, a tuple, or a 1-D int32 / int64 tensor."""
    if all(hasattr(v, a) for a in ("shape", "dtype", "tolist")):
        dt = dtype_name(v.dtype)
        if dt not in ("int32", "int64"):
            raise TypeError(f"{name}: expected dtype torch.int32 or torch.int64, got torch.{dt}")
        if len(v.shape) != 1:
            raise ValueError(f"{name}: expected 1 dimension, got shape {_describe(v.shape)}")
        return [int(x) for x in v.tolist()]
    if not isinstance(v, (list, tuple)):
        raise TypeError(f"{name}: expected a list or an integer tensor, got {type(v).__name__}")
    return [_int(name, x) for x in v]


def _cu_seqlens(name, v, total, total_name):
    """Checks ``cu_seqlens``: B + 1 >= 2 offsets from 0, non-decreasing,
    ending at the packed tensors' row count ``total``."""
    cu = _ints(name, v)
    if len(cu) < 2:
        raise ValueError(f"{name}: expected at least 2 offsets (B + 1), got {len(cu)}")
    if cu[0] != 0:
        raise ValueError(f"{name}: must start at 0, got {cu[0]}")
    for i in range(1, len(cu)):
        if cu[i] < cu[i - 1]:
            raise ValueError(
                f"{name}: must be non-decreasing, got {cu[i - 1]} then {cu[i]} at index {i}"
            )
    if cu[-1] != total:
        raise ValueError(f"{name}: ends at {cu[-1]}, but {total_name} has {total} rows")
    return tuple(cu)


def check_dense_tensors(tensors, cu_seqlens_q=None, cu_seqlens_k=None, q_offset=None, ratio=1):
    """Checks the seven dense tensors (a dict by name) and the layout
    arguments; returns ``(DenseDims, Device)``.

    BSHD without ``cu_seqlens``, packed with both. Order: the tensors as in
    :func:`check_tensors` (against ``DENSE_BSHD`` or ``DENSE_PACKED``), then
    ``cu_seqlens_q``, ``cu_seqlens_k`` (same length, each from 0 to its
    tensor's row count, non-decreasing; the score columns at least the
    longest key sequence), then ``q_offset`` (an integer for every batch, or
    one per batch), then ``ratio`` (an integer >= 1).
    """
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k: give both (packed) or neither (BSHD)")
    packed = cu_seqlens_q is not None
    sizes, device = _check_table(tensors, DENSE_PACKED if packed else DENSE_BSHD)

    def packed_cols(longest):
        cols = sizes["cols"][0]
        if cols < longest:
            raise ValueError(
                f"attn_score: {cols} columns, fewer than the longest key sequence ({longest})"
            )
        return cols

    return _dense_dims(sizes, cu_seqlens_q, cu_seqlens_k, q_offset, ratio, packed_cols), device


def _dense_dims(sizes, cu_seqlens_q, cu_seqlens_k, q_offset, ratio, packed_cols):
    """The layout checks shared by the dense backward and forward, after the
    tensors' (``sizes`` from :func:`_check_table`): ``cu_seqlens_q``,
    ``cu_seqlens_k`` (packed when given), the score columns
    (``packed_cols(longest key sequence)``, which raises for too few;
    BSHD: S_k), ``q_offset``, ``ratio``. Returns the :class:`DenseDims`."""
    heads, head_dim = sizes["H"][0], sizes["D"][0]
    if cu_seqlens_q is not None:
        cu_q = _cu_seqlens("cu_seqlens_q", cu_seqlens_q, sizes["T_q"][0], "index_q")
        cu_k = _cu_seqlens("cu_seqlens_k", cu_seqlens_k, sizes["T_k"][0], "index_k")
        if len(cu_q) != len(cu_k):
            raise ValueError(
                f"cu_seqlens_k: expected {len(cu_q)} offsets (as cu_seqlens_q), got {len(cu_k)}"
            )
        cols = packed_cols(max(b - a for a, b in zip(cu_k, cu_k[1:])))
        bshd, batch = None, len(cu_q) - 1
    else:
        cu_q = cu_k = None
        bshd = (sizes["B"][0], sizes["S_q"][0], sizes["S_k"][0])
        cols, batch = bshd[2], bshd[0]
    if q_offset is None:
        offsets = ()
    elif isinstance(q_offset, (list, tuple)) or hasattr(q_offset, "shape"):
        offsets = tuple(_ints("q_offset", q_offset))
        if len(offsets) != batch:
            raise ValueError(
                f"q_offset: expected {batch} entries (one per batch), got {len(offsets)}"
            )
    else:
        offsets = (_int("q_offset", q_offset),) * batch
    ratio = _int("ratio", ratio)
    if ratio < 1:
        raise ValueError(f"ratio: expected an integer >= 1, got {ratio}")
    return DenseDims(heads, head_dim, bshd, cu_q, cu_k, cols, offsets, ratio)


def check_grad_loss(grad_loss, device):
    """``grad_loss``: a finite number, or a one-element floating tensor on
    ``device``. Returns ``None`` for a tensor (the caller converts it to
    float32) and the float for a number."""
    if isinstance(grad_loss, numbers.Real) and not isinstance(grad_loss, bool):
        # Python and NumPy scalars alike (NumPy registers its scalar types).
        if not math.isfinite(grad_loss):
            raise ValueError(f"grad_loss must be finite, got {grad_loss}")
        return float(grad_loss)
    if type(grad_loss).__module__.split(".")[0] == "numpy":
        return _numpy_grad_loss(grad_loss)
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


def check_key_ids(key_ids, dims):
    """The id convention: ``key_ids`` as given, or ``"global"`` when it is
    ``None`` and B = 1 (where both conventions read every id alike). With
    B > 1 it must be given: a wrong guess silently reads other batches' keys."""
    if key_ids is None:
        if dims.batch > 1:
            raise ValueError(
                f"key_ids: B = {dims.batch}: say which convention topk_indices uses, "
                "key_ids='global' (rows of the flat (B*S_k, D) keys) or key_ids='local' "
                "(rows of the query's own batch)"
            )
        return "global"
    return key_ids


def _numpy_grad_loss(a):
    """A one-element floating NumPy array as a float (the number path)."""
    shape = tuple(getattr(a, "shape", ()))
    if getattr(a, "size", None) != 1:
        raise ValueError(f"grad_loss: expected one element, got a numpy array of shape {shape}")
    kind = getattr(getattr(a, "dtype", None), "kind", None)
    if kind != "f":
        raise TypeError(f"grad_loss: expected a floating numpy value, got dtype {a.dtype}")
    v = float(a.reshape(()))
    if not math.isfinite(v):
        raise ValueError(f"grad_loss must be finite, got {v}")
    return v


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


# The forward (docs/spec.md, "Forward"): sparse inputs, and dense inputs
# (BSHD or packed) without the score tensors.
FORWARD = (
    ("index_q", ("bfloat16",), ("B", "S_q", "H", "D")),
    ("weights", ("bfloat16",), ("B", "S_q", "H")),
    ("index_k", ("bfloat16",), ("B", "S_k", "D")),
    ("topk_indices", ("int32", "int64"), ("B", "S_q", "topk")),
)
DENSE_FORWARD_BSHD = DENSE_BSHD[:3]
DENSE_FORWARD_PACKED = DENSE_PACKED[:3]
KERNELS = ("auto", "portable")


def check_forward_tensors(tensors):
    """Checks the four sparse forward tensors; returns ``(Dims, Device)``."""
    sizes, first = _check_table(tensors, FORWARD)
    dims = Dims(*(sizes[d][0] for d in ("B", "S_q", "S_k", "H", "D", "topk")))
    return dims, first


def check_dense_forward_tensors(
    tensors, cu_seqlens_q=None, cu_seqlens_k=None, q_offset=None, ratio=1, score_cols=None
):
    """Checks the three dense forward tensors and the layout arguments as
    :func:`check_dense_tensors` does; ``score_cols`` (packed only; default
    the longest key sequence) sets the columns of the outputs. Returns
    ``(DenseDims, Device)``."""
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k: give both (packed) or neither (BSHD)")
    packed = cu_seqlens_q is not None
    table = DENSE_FORWARD_PACKED if packed else DENSE_FORWARD_BSHD
    sizes, device = _check_table(tensors, table)
    if not packed and score_cols is not None:
        raise ValueError("score_cols: only for packed layouts (BSHD has S_k columns)")

    def packed_cols(longest):
        cols = longest if score_cols is None else _int("score_cols", score_cols)
        if cols < max(longest, 1):
            raise ValueError(
                f"score_cols: {cols}, fewer than the longest key sequence ({longest})"
            )
        return cols

    return _dense_dims(sizes, cu_seqlens_q, cu_seqlens_k, q_offset, ratio, packed_cols), device


def check_forward_options(sm_scale, key_ids, score, kernel):
    """``(sm_scale, key_ids, score, kernel)`` checked, as a cache key."""
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)):
        raise TypeError(f"sm_scale: expected a number, got {type(sm_scale).__name__}")
    if not math.isfinite(sm_scale):
        raise ValueError(f"sm_scale must be finite, got {sm_scale}")
    for name, v, allowed in (
        ("key_ids", key_ids, KEY_IDS),
        ("score", score, SCORES),
        ("kernel", kernel, KERNELS),
    ):
        if v not in allowed:
            raise ValueError(f"{name}: expected one of {allowed}, got {v!r}")
    return (float(sm_scale), key_ids, score, kernel)
