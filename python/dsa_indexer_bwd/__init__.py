"""Backward pass of the DeepSeek Sparse Attention lightning indexer for PyTorch.

``indexer_backward(index_q, weights, index_k, attn_score, index_score,
topk_indices, grad_loss, ...)`` returns ``(grad_signal, d_index_q, d_weights,
d_index_k)``: on CUDA tensors from the crate's GPU kernels, queued on the
current stream; on CPU tensors from its CPU path.
``indexer_forward`` computes the backward's ``index_score`` (the indexer's
softmax over the selected slots) and ``dense_indexer_forward`` dense mode's
logits; ``indexer_loss`` and ``dense_indexer_loss`` are the KL losses with the
crate's backward as their autograd backward. Every one is also a
``torch.library`` operator (``torch.ops.dsa_indexer.*``), traceable by
``torch.compile(fullgraph=True)``.
``dense_indexer_backward(index_q, weights, index_k, attn_score, attn_l1norm,
index_score, index_lse, grad_loss, ...)`` is dense mode (every causal key,
BSHD or packed variable-length batches), returning ``DenseGrads``. The
contract (math, key-id conventions, tolerances) is docs/spec.md of the
repository, the Python API docs/usage.md.

The package imports without torch (the checks and the native module are
torch-free); ``indexer_backward`` and ``dense_indexer_backward`` need torch.
"""

from . import _native
from ._native import cuda_device_count

__version__ = _native.__version__

try:
    import torch as _torch  # noqa: F401
except ImportError:  # pragma: no cover - exercised by the torch-free CI tests
    _torch = None

if _torch is not None:
    from ._dense import DenseGrads, dense_indexer_backward
    from ._forward import DenseScores, ForwardScores, dense_indexer_forward, indexer_forward
    from ._ops import dense_indexer_loss, indexer_loss
    from ._torch import IndexerGrads, clear_plan_cache, indexer_backward, plan_cache_size
else:

    def dense_indexer_backward(*args, **kwargs):
        """Needs torch (not installed)."""
        raise ImportError("dsa_indexer_bwd.dense_indexer_backward needs torch")

    def indexer_backward(*args, **kwargs):
        """Needs torch (not installed)."""
        raise ImportError("dsa_indexer_bwd.indexer_backward needs torch")

    def clear_plan_cache():
        """No plans without torch."""

    def plan_cache_size():
        """No plans without torch."""
        return 0

    def _needs_torch(name):
        def f(*args, **kwargs):
            raise ImportError(f"dsa_indexer_bwd.{name} needs torch")

        f.__name__ = name
        f.__doc__ = "Needs torch (not installed)."
        return f

    indexer_forward = _needs_torch("indexer_forward")
    dense_indexer_forward = _needs_torch("dense_indexer_forward")
    indexer_loss = _needs_torch("indexer_loss")
    dense_indexer_loss = _needs_torch("dense_indexer_loss")
    IndexerGrads = None
    DenseGrads = None
    ForwardScores = None
    DenseScores = None

from ._cache import PLAN_CACHE_CAPACITY  # noqa: E402

__all__ = [
    "DenseGrads",
    "DenseScores",
    "ForwardScores",
    "dense_indexer_forward",
    "dense_indexer_loss",
    "indexer_forward",
    "indexer_loss",
    "PLAN_CACHE_CAPACITY",
    "IndexerGrads",
    "clear_plan_cache",
    "cuda_device_count",
    "dense_indexer_backward",
    "indexer_backward",
    "plan_cache_size",
]
