"""Torch-free tests (run by `cargo xtask test`): the native module's CPU
path against a pure-Python f64 reference, its errors, and the argument
checks of `indexer_backward` on stand-in tensors."""

import math
import unittest
from array import array

import dsa_indexer_bwd
from dsa_indexer_bwd import _checks, _native
from reference import Problem, addr, bf16_to_float, rel_err

DIMS = (2, 3, 5, 16, 64, 4)  # B, S_q, S_k, H, D, topk


def run_cpu(p, dk="float32", dw="bfloat16", **over):
    """Runs the CPU path on `p`; returns the four outputs as floats."""
    b, sq, sk, h, d, topk = p.dims
    rows = b * sq
    attn = array("f", p.attn)
    dq = array("H", [0xFFFF] * (rows * h * d))  # NaN poison
    dwb = array("f", [math.nan] * (rows * h)) if dw == "float32" else array("H", [0xFFFF] * (rows * h))
    dkb = array("f", [math.nan] * (b * sk * d)) if dk == "float32" else array("H", [0xFFFF] * (b * sk * d))
    args = dict(
        index_q=addr(p.q),
        weights=addr(p.w),
        index_k=addr(p.k),
        index_score=addr(p.score_buf),
        topk_indices=addr(p.ids),
        attn_score=addr(attn),
        d_index_q=addr(dq),
        d_weights=addr(dwb),
        d_index_k=addr(dkb),
        grad_loss=p.grad_loss,
        loss_coeff=p.loss_coeff,
    )
    args.update(over)
    _native.cpu_execute(
        p.dims,
        args["index_q"],
        args["weights"],
        args["index_k"],
        args["index_score"],
        args["topk_indices"],
        args["attn_score"],
        args["d_index_q"],
        args["d_weights"],
        args["d_index_k"],
        args["grad_loss"],
        args["loss_coeff"],
        sm_scale=p.sm_scale,
        key_ids=p.key_ids,
        score=p.score,
        d_index_k_dtype=dk,
        d_weights_dtype=dw,
    )

    def floats(buf):
        return [bf16_to_float(x) for x in buf] if buf.typecode == "H" else list(buf)

    return list(attn), floats(dq), floats(dwb), floats(dkb)


class CpuPath(unittest.TestCase):
    def test_matches_the_python_reference(self):
        for seed, key_ids, score, dk, dw in (
            (1, "global", "probs", "float32", "bfloat16"),
            (2, "local", "logprobs", "bfloat16", "float32"),
            (3, "global", "logprobs", "bfloat16", "bfloat16"),
        ):
            with self.subTest(key_ids=key_ids, score=score, dk=dk, dw=dw):
                p = Problem(seed, DIMS, key_ids, score)
                got = run_cpu(p, dk, dw)
                want = p.reference()
                bounds = (1e-6, 8e-3, 8e-3, 1.2e-2 if dk == "bfloat16" else 8e-3)
                for name, g, w, bound in zip(
                    ("grad_signal", "d_index_q", "d_weights", "d_index_k"), got, want, bounds
                ):
                    e = rel_err(g, w)
                    self.assertLessEqual(e, bound, f"{name}: relative error {e}")
                    self.assertGreater(sum(abs(x) for x in w), 0.0, f"{name}: all zero")

    def test_padding_contributes_nothing(self):
        p = Problem(4, DIMS)
        base = run_cpu(p)
        # Every padding id written as -1 instead: bit-identical d_index_q, d_weights.
        limit = DIMS[0] * DIMS[2]
        for i, v in enumerate(p.ids):
            if v >= limit:
                p.ids[i] = -1
        again = run_cpu(p)
        self.assertEqual(base[1], again[1])
        self.assertEqual(base[2], again[2])

    def test_errors_name_the_problem(self):
        p = Problem(5, DIMS)
        with self.assertRaisesRegex(ValueError, "heads"):
            bad = Problem(5, DIMS)
            bad.dims = (2, 3, 5, 24, 64, 4)
            run_cpu(bad)
        with self.assertRaisesRegex(ValueError, "grad_loss must be finite"):
            run_cpu(p, grad_loss=math.nan)
        with self.assertRaisesRegex(ValueError, "loss_coeff must be finite"):
            run_cpu(p, loss_coeff=math.inf)
        with self.assertRaisesRegex(ValueError, "d_index_q overlaps index_q"):
            run_cpu(p, d_index_q=addr(p.q))
        with self.assertRaisesRegex(ValueError, "index_k: host address 0x0"):
            run_cpu(p, index_k=0)
        with self.assertRaisesRegex(ValueError, "index_score: host address .* 4-byte aligned"):
            run_cpu(p, index_score=addr(p.score_buf) + 2)
        with self.assertRaisesRegex(ValueError, "key_ids"):
            _native.cpu_execute(DIMS, *([8] * 9), 1.0, 1.0, key_ids="row")
        with self.assertRaisesRegex(ValueError, "d_index_k"):
            _native.cpu_execute(DIMS, *([8] * 9), 1.0, 1.0, d_index_k_dtype="float16")


class Plans(unittest.TestCase):
    def test_a_plan_needs_a_cuda_device(self):
        n = _native.cuda_device_count()
        with self.assertRaisesRegex(RuntimeError, "CUDA device"):
            _native.Plan(n, DIMS, 1.0, "global", "probs", "float32", "bfloat16")

    def test_plan_arguments_are_checked_before_the_device(self):
        with self.assertRaisesRegex(ValueError, "head_dim"):
            _native.Plan(0, (1, 1, 1, 16, 96, 1), 1.0, "global", "probs", "float32", "bfloat16")
        with self.assertRaisesRegex(ValueError, "sm_scale must be finite"):
            _native.Plan(0, DIMS, math.nan, "global", "probs", "float32", "bfloat16")
        with self.assertRaisesRegex(ValueError, "backend"):
            _native.Plan(0, DIMS, 1.0, "global", "probs", "float32", "bfloat16", "ampere")


class FakeDevice:
    def __init__(self, type, index=None):
        self.type, self.index = type, index


class FakeTensor:
    """What the checks read of a torch.Tensor."""

    def __init__(self, shape, dtype, device=("cuda", 0), contiguous=True):
        self.shape = tuple(shape)
        self.dtype = "torch." + dtype
        self.device = FakeDevice(*device)
        self._contiguous = contiguous

    def is_contiguous(self):
        return self._contiguous


def tensors(b=2, sq=3, sk=5, h=16, d=64, topk=4, **over):
    t = {
        "index_q": FakeTensor((b, sq, h, d), "bfloat16"),
        "weights": FakeTensor((b, sq, h), "bfloat16"),
        "index_k": FakeTensor((b, sk, d), "bfloat16"),
        "attn_score": FakeTensor((b, sq, topk), "float32"),
        "index_score": FakeTensor((b, sq, topk), "float32"),
        "topk_indices": FakeTensor((b, sq, topk), "int64"),
    }
    t.update(over)
    return t


class Checks(unittest.TestCase):
    def test_good_arguments_give_the_sizes_and_the_device(self):
        dims, dev = _checks.check_tensors(tensors())
        self.assertEqual(tuple(dims), DIMS)
        self.assertEqual(dev, ("cuda", 0))
        i32 = tensors(topk_indices=FakeTensor((2, 3, 4), "int32"))
        self.assertEqual(tuple(_checks.check_tensors(i32)[0]), DIMS)

    def test_each_failure_names_the_tensor(self):
        cases = [
            (TypeError, "weights: expected dtype torch.bfloat16, got torch.float16",
             dict(weights=FakeTensor((2, 3, 16), "float16"))),
            (TypeError, "topk_indices: expected dtype torch.int32 or torch.int64, got torch.int16",
             dict(topk_indices=FakeTensor((2, 3, 4), "int16"))),
            (TypeError, "index_k: expected a torch.Tensor, got list", dict(index_k=[1, 2])),
            (ValueError, r"index_q: expected 4 dimensions \(B, S_q, H, D\), got shape \(2, 3, 16\)",
             dict(index_q=FakeTensor((2, 3, 16), "bfloat16"))),
            (ValueError, r"weights: expected shape \(2, 3, 16\) .*got \(2, 3, 32\)",
             dict(weights=FakeTensor((2, 3, 32), "bfloat16"))),
            (ValueError, r"index_score: expected shape \(2, 3, 4\) \(its topk = 4 from attn_score\)",
             dict(index_score=FakeTensor((2, 3, 5), "float32"))),
            (ValueError, r"index_k: expected shape \(2, 5, 64\) \(its D = 64 from index_q\)",
             dict(index_k=FakeTensor((2, 5, 128), "bfloat16"))),
            (ValueError, "attn_score: must be contiguous",
             dict(attn_score=FakeTensor((2, 3, 4), "float32", contiguous=False))),
            (ValueError, "index_k: on cuda:1, but index_q is on cuda:0",
             dict(index_k=FakeTensor((2, 5, 64), "bfloat16", ("cuda", 1)))),
            (ValueError, "topk_indices: on cpu, but index_q is on cuda:0",
             dict(topk_indices=FakeTensor((2, 3, 4), "int32", ("cpu",)))),
        ]
        for exc, msg, over in cases:
            with self.subTest(msg=msg):
                with self.assertRaisesRegex(exc, msg):
                    _checks.check_tensors(tensors(**over))

    def test_grad_loss(self):
        dev = _checks.Device("cuda", 0)
        self.assertEqual(_checks.check_grad_loss(2, dev), 2.0)
        self.assertIsNone(_checks.check_grad_loss(FakeTensor((), "bfloat16"), dev))
        self.assertIsNone(_checks.check_grad_loss(FakeTensor((1, 1), "float32"), dev))
        with self.assertRaisesRegex(ValueError, "grad_loss must be finite"):
            _checks.check_grad_loss(math.inf, dev)
        with self.assertRaisesRegex(ValueError, "one element"):
            _checks.check_grad_loss(FakeTensor((2,), "float32"), dev)
        with self.assertRaisesRegex(TypeError, "floating dtype"):
            _checks.check_grad_loss(FakeTensor((1,), "int32"), dev)
        with self.assertRaisesRegex(ValueError, "grad_loss: on cpu"):
            _checks.check_grad_loss(FakeTensor((1,), "float32", ("cpu",)), dev)
        with self.assertRaisesRegex(TypeError, "grad_loss"):
            _checks.check_grad_loss(True, dev)

    def test_options(self):
        opts = _checks.check_options(0.5, 1, "local", "logprobs", "torch.bfloat16", "float32", "auto")
        self.assertEqual(opts, (0.5, "local", "logprobs", "bfloat16", "float32", "auto"))
        bad = [
            (ValueError, "key_ids", dict(key_ids="row")),
            (ValueError, "score", dict(score="logits")),
            (ValueError, "d_index_k_dtype", dict(dk="torch.float16")),
            (ValueError, "sm_scale must be finite", dict(sm_scale=math.nan)),
            (TypeError, "loss_coeff: expected a number", dict(loss_coeff="1")),
        ]
        for exc, msg, over in bad:
            a = dict(sm_scale=1.0, loss_coeff=1.0, key_ids="global", score="probs",
                     dk="float32", dw="bfloat16", backend="auto")
            a.update(over)
            with self.subTest(msg=msg), self.assertRaisesRegex(exc, msg):
                _checks.check_options(a["sm_scale"], a["loss_coeff"], a["key_ids"], a["score"],
                                      a["dk"], a["dw"], a["backend"])

    def test_id_limit_follows_the_convention(self):
        dims = _checks.Dims(*DIMS)
        self.assertEqual(_checks.id_limit(dims, "global"), 10)
        self.assertEqual(_checks.id_limit(dims, "local"), 5)


class Package(unittest.TestCase):
    def test_imports_without_torch(self):
        self.assertEqual(dsa_indexer_bwd.__version__, _native.__version__)
        self.assertIsInstance(dsa_indexer_bwd.cuda_device_count(), int)
        try:
            import torch  # noqa: F401
        except ImportError:
            with self.assertRaisesRegex(ImportError, "needs torch"):
                dsa_indexer_bwd.indexer_backward()


if __name__ == "__main__":
    unittest.main()
