"""Torch-free tests (run by `cargo xtask test`): the native module's CPU
paths (sparse and dense) against a pure-Python f64 reference, their errors,
and the argument checks of `indexer_backward` and `dense_indexer_backward`
on stand-in tensors."""

import math
import unittest
from array import array

import dsa_indexer_bwd
from dsa_indexer_bwd import _checks, _native
from reference import DenseProblem, Problem, addr, bf16_to_float, rel_err

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

    def test_grad_loss_from_numpy(self):
        """NumPy scalars are numbers (numbers.Real, as Fraction here) and a
        one-element floating NumPy array is read as its value; NumPy 2
        arrays have a string `device`, which must not reach the tensor
        checks."""
        from fractions import Fraction

        dev = _checks.Device("cuda", 0)
        self.assertEqual(_checks.check_grad_loss(Fraction(3, 4), dev), 0.75)

        class Kind:
            def __init__(self, kind):
                self.kind = kind

            def __str__(self):
                return "float32" if self.kind == "f" else "int32"

        class Array:
            """What the checks read of a numpy.ndarray."""

            def __init__(self, values, kind="f"):
                self.values, self.dtype = values, Kind(kind)
                self.shape, self.size, self.device = (len(values),), len(values), "cpu"

            def reshape(self, shape):
                assert shape == () and self.size == 1
                return self.values[0]

        Array.__module__ = "numpy"
        self.assertEqual(_checks.check_grad_loss(Array([0.75]), dev), 0.75)
        with self.assertRaisesRegex(ValueError, "one element, got a numpy array of shape"):
            _checks.check_grad_loss(Array([1.0, 2.0]), dev)
        with self.assertRaisesRegex(TypeError, "floating numpy value"):
            _checks.check_grad_loss(Array([1], kind="i"), dev)
        with self.assertRaisesRegex(ValueError, "finite"):
            _checks.check_grad_loss(Array([math.nan]), dev)

    def test_key_ids_must_be_said_for_several_batches(self):
        one = _checks.Dims(1, 3, 5, 16, 64, 4)
        two = _checks.Dims(2, 3, 5, 16, 64, 4)
        self.assertEqual(_checks.check_key_ids(None, one), "global")
        self.assertEqual(_checks.check_key_ids("local", two), "local")
        with self.assertRaisesRegex(ValueError, "key_ids: B = 2: say which convention"):
            _checks.check_key_ids(None, two)

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


def run_dense_cpu(p, dk="float32", dw="bfloat16", **over):
    """Runs the dense CPU path on `p`; returns the four outputs as floats."""
    h, d = p.heads, p.head_dim
    rows, keys = p.cu_q[-1], p.cu_k[-1]
    gs = array("f", p.logits)  # logits in, grad_signal out
    dq = array("H", [0xFFFF] * (rows * h * d))  # NaN poison

    def poison(n, dtype):
        return array("f", [math.nan] * n) if dtype == "float32" else array("H", [0xFFFF] * n)

    dwb, dkb = poison(rows * h, dw), poison(keys * d, dk)
    args = dict(
        index_q=addr(p.q), weights=addr(p.w), index_k=addr(p.k), attn_score=addr(p.attn),
        attn_l1norm=addr(p.l1), index_score=addr(gs), index_lse=addr(p.lse),
        d_index_q=addr(dq), d_weights=addr(dwb), d_index_k=addr(dkb),
        grad_loss=p.grad_loss, loss_coeff=p.loss_coeff,
    )
    kw = p.layout_kwargs()
    kw.update(sm_scale=p.sm_scale, d_index_k_dtype=dk, d_weights_dtype=dw)
    for key, v in over.items():
        (args if key in args else kw)[key] = v
    _native.dense_cpu_execute(p.heads, p.head_dim, *args.values(), **kw)

    def floats(buf):
        return [bf16_to_float(x) for x in buf] if buf.typecode == "H" else list(buf)

    return list(gs), floats(dq), floats(dwb), floats(dkb)


DENSE_PROBLEMS = (
    # BSHD, per-batch offsets, compressed keys.
    dict(bshd=(2, 4, 6), q_offset=[3, 0], ratio=2),
    # Packed: an empty query batch, a negative offset, padded score columns.
    dict(cu_q=[0, 3, 3, 7], cu_k=[0, 5, 6, 10], cols=6, q_offset=[1, 0, -2]),
)


class DenseCpuPath(unittest.TestCase):
    def test_matches_the_python_reference(self):
        for i, layout in enumerate(DENSE_PROBLEMS):
            for dk, dw in (("float32", "bfloat16"), ("bfloat16", "float32")):
                with self.subTest(layout=layout, dk=dk, dw=dw):
                    p = DenseProblem(10 + i, **layout)
                    got = run_dense_cpu(p, dk, dw)
                    want = p.reference()
                    bounds = (1e-6, 8e-3, 8e-3, 1.2e-2 if dk == "bfloat16" else 8e-3)
                    for name, g, w, bound in zip(
                        ("grad_signal", "d_index_q", "d_weights", "d_index_k"), got, want, bounds
                    ):
                        e = rel_err(g, w)
                        self.assertLessEqual(e, bound, f"{name}: relative error {e}")
                        self.assertGreater(sum(abs(x) for x in w), 0.0, f"{name}: all zero")

    def test_invisible_columns_get_zero(self):
        p = DenseProblem(12, **DENSE_PROBLEMS[1])
        gs = run_dense_cpu(p)[0]
        for r in range(p.cu_q[-1]):
            vis = p.row(r)[2]
            row = gs[r * p.cols:(r + 1) * p.cols]
            self.assertEqual(row[vis:], [0.0] * (p.cols - vis), f"row {r}")

    def test_errors_name_the_problem(self):
        p = DenseProblem(13, **DENSE_PROBLEMS[0])
        cases = [
            (ValueError, "layout: give bshd", dict(bshd=None)),
            (ValueError, "cu_seqlens", dict(bshd=None, cu_seqlens_q=[1, 8], cu_seqlens_k=[0, 12])),
            (ValueError, "q_offset", dict(q_offset=[1, 2, 3])),
            (ValueError, "ratio", dict(ratio=0)),
            (ValueError, "grad_loss must be finite", dict(grad_loss=math.nan)),
            (ValueError, "loss_coeff must be finite", dict(loss_coeff=math.inf)),
            (ValueError, "d_index_q overlaps index_q", dict(d_index_q=addr(p.q))),
            (ValueError, "index_score overlaps attn_score", dict(index_score=addr(p.attn))),
            (ValueError, "index_k: host address 0x0", dict(index_k=0)),
            (ValueError, "attn_l1norm: host address .* 4-byte aligned",
             dict(attn_l1norm=addr(p.l1) + 2)),
            (ValueError, "d_weights", dict(d_weights_dtype="float16")),
        ]
        for exc, msg, over in cases:
            with self.subTest(msg=msg), self.assertRaisesRegex(exc, msg):
                run_dense_cpu(p, **over)
        with self.assertRaisesRegex(ValueError, "heads"):
            _native.dense_cpu_execute(24, 64, *([8] * 10), 1.0, 1.0, bshd=(1, 1, 1))


class DensePlans(unittest.TestCase):
    def test_a_plan_needs_a_cuda_device(self):
        n = _native.cuda_device_count()
        with self.assertRaisesRegex(RuntimeError, "CUDA device"):
            _native.DensePlan(n, 16, 64, bshd=(1, 4, 4))

    def test_plan_arguments_are_checked_before_the_device(self):
        with self.assertRaisesRegex(ValueError, "head_dim"):
            _native.DensePlan(0, 16, 96, bshd=(1, 4, 4))
        with self.assertRaisesRegex(ValueError, "layout"):
            _native.DensePlan(0, 16, 64, cu_seqlens_q=[0, 4])
        with self.assertRaisesRegex(ValueError, "score_cols"):
            _native.DensePlan(0, 16, 64, cu_seqlens_q=[0, 4], cu_seqlens_k=[0, 5], score_cols=3)
        with self.assertRaisesRegex(ValueError, "q_offset"):
            _native.DensePlan(0, 16, 64, bshd=(2, 4, 4), q_offset=[0])
        with self.assertRaisesRegex(ValueError, "sm_scale must be finite"):
            _native.DensePlan(0, 16, 64, bshd=(1, 4, 4), sm_scale=math.nan)


def dense_tensors(packed=False, **over):
    if packed:  # T_q = 7, T_k = 10, cols = 6
        t = {
            "index_q": FakeTensor((7, 16, 64), "bfloat16"),
            "weights": FakeTensor((7, 16), "bfloat16"),
            "index_k": FakeTensor((10, 64), "bfloat16"),
            "attn_score": FakeTensor((7, 6), "float32"),
            "attn_l1norm": FakeTensor((7,), "float32"),
            "index_score": FakeTensor((7, 6), "float32"),
            "index_lse": FakeTensor((7,), "float32"),
        }
    else:  # B = 2, S_q = 3, S_k = 5
        t = {
            "index_q": FakeTensor((2, 3, 16, 64), "bfloat16"),
            "weights": FakeTensor((2, 3, 16), "bfloat16"),
            "index_k": FakeTensor((2, 5, 64), "bfloat16"),
            "attn_score": FakeTensor((2, 3, 5), "float32"),
            "attn_l1norm": FakeTensor((2, 3), "float32"),
            "index_score": FakeTensor((2, 3, 5), "float32"),
            "index_lse": FakeTensor((2, 3), "float32"),
        }
    t.update(over)
    return t


class DenseChecks(unittest.TestCase):
    CU_Q, CU_K = [0, 3, 3, 7], [0, 5, 6, 10]

    def test_bshd(self):
        dims, dev = _checks.check_dense_tensors(dense_tensors(), q_offset=4, ratio=2)
        self.assertEqual(dev, ("cuda", 0))
        self.assertEqual((dims.heads, dims.head_dim, dims.bshd), (16, 64, (2, 3, 5)))
        self.assertEqual((dims.score_cols, dims.q_offset, dims.ratio), (5, (4, 4), 2))
        self.assertEqual(dims.batch, 2)
        self.assertEqual(dims.layout_kwargs(), dict(bshd=(2, 3, 5), q_offset=[4, 4], ratio=2))
        hash(dims)

    def test_packed(self):
        dims, _ = _checks.check_dense_tensors(
            dense_tensors(True), self.CU_Q, tuple(self.CU_K), q_offset=[1, 0, -2])
        self.assertIsNone(dims.bshd)
        self.assertEqual(dims.cu_seqlens_q, tuple(self.CU_Q))
        self.assertEqual(dims.cu_seqlens_k, tuple(self.CU_K))
        self.assertEqual((dims.score_cols, dims.q_offset, dims.batch), (6, (1, 0, -2), 3))
        kw = dims.layout_kwargs()
        self.assertEqual(kw["cu_seqlens_q"], self.CU_Q)
        self.assertEqual(kw["score_cols"], 6)

    def test_each_failure_names_the_tensor(self):
        cq, ck = self.CU_Q, self.CU_K
        cases = [
            (TypeError, "attn_l1norm: expected dtype torch.float32, got torch.bfloat16",
             dict(attn_l1norm=FakeTensor((2, 3), "bfloat16")), {}),
            (ValueError, r"index_lse: expected 2 dimensions \(B, S_q\), got shape \(6\)",
             dict(index_lse=FakeTensor((6,), "float32")), {}),
            (ValueError, r"attn_score: expected shape \(2, 3, 5\) \(its S_k = 5 from index_k\)",
             dict(attn_score=FakeTensor((2, 3, 4), "float32")), {}),
            (ValueError, "index_score: must be contiguous",
             dict(index_score=FakeTensor((2, 3, 5), "float32", contiguous=False)), {}),
            (ValueError, "index_lse: on cpu, but index_q is on cuda:0",
             dict(index_lse=FakeTensor((2, 3), "float32", ("cpu",))), {}),
            (ValueError, "give both", {}, dict(cu_seqlens_q=cq)),
            (ValueError, "q_offset: expected 2 entries", {}, dict(q_offset=[1])),
            (TypeError, "q_offset: expected an integer", {}, dict(q_offset=1.5)),
            (ValueError, "ratio: expected an integer >= 1", {}, dict(ratio=0)),
            (TypeError, "ratio: expected an integer", {}, dict(ratio=True)),
        ]
        for exc, msg, over, kw in cases:
            with self.subTest(msg=msg), self.assertRaisesRegex(exc, msg):
                _checks.check_dense_tensors(dense_tensors(**over), **kw)
        packed = [
            (ValueError, r"index_q: expected 3 dimensions \(T_q, H, D\)",
             dict(index_q=FakeTensor((2, 3, 16, 64), "bfloat16")), cq, ck),
            (ValueError, "cu_seqlens_q: must start at 0", {}, [1, 3, 3, 7], ck),
            (ValueError, "cu_seqlens_k: must be non-decreasing, got 6 then 5 at index 2", {},
             cq, [0, 6, 5, 10]),
            (ValueError, "cu_seqlens_q: ends at 6, but index_q has 7 rows", {}, [0, 3, 3, 6], ck),
            (ValueError, "cu_seqlens_k: expected 4 offsets", {}, cq, [0, 10]),
            (ValueError, "cu_seqlens_q: expected at least 2 offsets", {}, [0], ck),
            (TypeError, "cu_seqlens_k: expected a list", {}, cq, "0,5"),
            (TypeError, "cu_seqlens_q: expected an integer", {}, [0, 3.0, 3, 7], ck),
            (ValueError, r"attn_score: 3 columns, fewer than the longest key sequence \(5\)",
             dict(attn_score=FakeTensor((7, 3), "float32"),
                  index_score=FakeTensor((7, 3), "float32")), cq, ck),
        ]
        for exc, msg, over, q, k in packed:
            with self.subTest(msg=msg), self.assertRaisesRegex(exc, msg):
                _checks.check_dense_tensors(dense_tensors(True, **over), q, k)


def python_forward(p, sm_scale, log):
    """The forward of `p` in pure-Python f64: (scores, lse)."""
    b, sq, sk, h, d, topk = p.dims
    limit = b * sk if p.key_ids == "global" else sk
    q = [bf16_to_float(x) for x in p.q]
    w = [bf16_to_float(x) for x in p.w]
    k = [bf16_to_float(x) for x in p.k]
    scores, lses = [], []
    for r in range(b * sq):
        logits = []
        for t in range(topk):
            i = p.ids[r * topk + t]
            if not 0 <= i < limit:
                logits.append(None)
                continue
            n = i if p.key_ids == "global" else (r // sq) * sk + i
            total = 0.0
            for hh in range(h):
                s = sum(q[(r * h + hh) * d + j] * k[n * d + j] for j in range(d)) * sm_scale
                total += w[r * h + hh] * max(s, 0.0)
            logits.append(total)
        vals = [x for x in logits if x is not None]
        if not vals:
            lse = -math.inf
        else:
            m = max(vals)
            lse = m + math.log(sum(math.exp(x - m) for x in vals))
        lses.append(lse)
        for x in logits:
            if x is None:
                scores.append(-math.inf if log else 0.0)
            else:
                scores.append(x - lse if log else math.exp(x - lse))
    return scores, lses


class ForwardCpuPath(unittest.TestCase):
    def run_forward(self, p, log, sm_scale=0.25):
        b, sq, sk, h, d, topk = p.dims
        score = array("f", [math.nan] * (b * sq * topk))
        lse = array("f", [math.nan] * (b * sq))
        _native.cpu_forward(p.dims, addr(p.q), addr(p.w), addr(p.k), addr(p.ids), addr(score),
                            addr(lse), sm_scale=sm_scale, key_ids=p.key_ids,
                            score="logprobs" if log else "probs")
        return list(score), list(lse)

    def test_matches_the_python_reference(self):
        for key_ids in ("global", "local"):
            for log in (False, True):
                p = Problem(11, DIMS, key_ids=key_ids)
                got_s, got_l = self.run_forward(p, log)
                want_s, want_l = python_forward(p, 0.25, log)
                fin = [i for i, v in enumerate(want_s) if math.isfinite(v)]
                self.assertTrue(all(got_s[i] == want_s[i] for i in range(len(want_s))
                                    if not math.isfinite(want_s[i])))
                self.assertLess(rel_err([got_s[i] for i in fin], [want_s[i] for i in fin]), 1e-6)
                fl = [i for i, v in enumerate(want_l) if math.isfinite(v)]
                self.assertLess(rel_err([got_l[i] for i in fl], [want_l[i] for i in fl]), 1e-6)

    def test_errors_name_the_problem(self):
        p = Problem(12, DIMS)
        with self.assertRaisesRegex(ValueError, "sm_scale"):
            self.run_forward(p, False, sm_scale=math.inf)
        with self.assertRaisesRegex(ValueError, "kernel"):
            _native.ForwardPlan(0, DIMS, 1.0, "global", "probs", "fast")
        with self.assertRaisesRegex(ValueError, "heads"):
            _native.ForwardPlan(0, (1, 2, 3, 48, 64, 4), 1.0, "global", "probs")

    def test_forward_checks(self):
        t = tensors()
        del t["attn_score"], t["index_score"]
        dims, dev = _checks.check_forward_tensors(t)
        self.assertEqual(tuple(dims), DIMS)
        t["topk_indices"] = FakeTensor((2, 4, 4), "int64")
        with self.assertRaisesRegex(ValueError, "topk_indices"):
            _checks.check_forward_tensors(t)
        self.assertEqual(_checks.check_forward_options(1, "local", "logprobs", "portable"),
                         (1.0, "local", "logprobs", "portable"))
        with self.assertRaisesRegex(ValueError, "kernel"):
            _checks.check_forward_options(1.0, "global", "probs", "fast")
        dense = {
            "index_q": FakeTensor((7, 16, 64), "bfloat16"),
            "weights": FakeTensor((7, 16), "bfloat16"),
            "index_k": FakeTensor((9, 64), "bfloat16"),
        }
        dd, _ = _checks.check_dense_forward_tensors(dense, [0, 3, 7], [0, 4, 9])
        self.assertEqual(dd.score_cols, 5)
        dd, _ = _checks.check_dense_forward_tensors(dense, [0, 3, 7], [0, 4, 9], score_cols=8)
        self.assertEqual(dd.score_cols, 8)
        with self.assertRaisesRegex(ValueError, "score_cols"):
            _checks.check_dense_forward_tensors(dense, [0, 3, 7], [0, 4, 9], score_cols=4)


class PlanCacheBound(unittest.TestCase):
    def test_least_recently_used_goes_first(self):
        from dsa_indexer_bwd._cache import PlanCache

        built = []

        def build(key):
            def f():
                built.append(key)
                return ("plan", key)

            return f

        cache = PlanCache(capacity=3)
        for key in [1, 2, 3]:
            self.assertEqual(cache.get(key, build(key)), ("plan", key))
        self.assertEqual(cache.get(1, build(1)), ("plan", 1))  # hit: 1 is now newest
        cache.get(4, build(4))  # evicts 2, the least recently used
        self.assertEqual(len(cache), 3)
        cache.get(2, build(2))  # rebuilt; evicts 3
        cache.get(1, build(1))  # still there
        self.assertEqual(built, [1, 2, 3, 4, 2])

    def test_get_built_says_whether_it_built(self):
        from dsa_indexer_bwd._cache import PlanCache

        cache = PlanCache(capacity=2)
        self.assertEqual(cache.get_built("a", lambda: 1), (1, True))
        self.assertEqual(cache.get_built("a", lambda: 2), (1, False))
        cache.get("b", lambda: 3)
        cache.get("c", lambda: 4)  # evicts "a"
        self.assertEqual(cache.get_built("a", lambda: 5), (5, True))

    def test_a_varlen_loop_stays_bounded(self):
        from dsa_indexer_bwd._cache import PLAN_CACHE_CAPACITY, PlanCache

        cache = PlanCache()
        for t in range(10 * PLAN_CACHE_CAPACITY):
            cache.get(("dims", t), lambda: object())
            self.assertLessEqual(len(cache), PLAN_CACHE_CAPACITY)
        self.assertEqual(len(cache), PLAN_CACHE_CAPACITY)
        cache.clear()
        self.assertEqual(len(cache), 0)
        with self.assertRaisesRegex(ValueError, "at least 1"):
            PlanCache(capacity=0)


class Package(unittest.TestCase):
    def test_imports_without_torch(self):
        self.assertEqual(dsa_indexer_bwd.__version__, _native.__version__)
        self.assertIsInstance(dsa_indexer_bwd.cuda_device_count(), int)
        try:
            import torch  # noqa: F401
        except ImportError:
            with self.assertRaisesRegex(ImportError, "needs torch"):
                dsa_indexer_bwd.indexer_backward()
            with self.assertRaisesRegex(ImportError, "needs torch"):
                dsa_indexer_bwd.dense_indexer_backward()


if __name__ == "__main__":
    unittest.main()
