"""`indexer_backward` on torch tensors against a torch f64 statement of
docs/spec.md ("Math"): GPU cases (int32 and int64 ids, both key-id
conventions, f32 and bf16 d_index_k, both d_weights types and score kinds,
two kernel paths), the in-place option, a side stream, CUDA-graph replay
with a new grad_loss, errors on real tensors, and the CPU path.

Needs torch; the GPU cases need a CUDA device (each skips without one).
Run with `python -m pytest -v python/tests/test_gpu.py` or
`python python/tests/test_gpu.py`.
"""

import math
import unittest

try:
    import torch
except ImportError:  # the torch-free CI run
    raise unittest.SkipTest("torch is not installed")

import dsa_indexer_bwd
from dsa_indexer_bwd import indexer_backward

CLIP = math.exp(-100.0)
HAS_CUDA = torch.cuda.is_available()
BOUNDS = {"grad_signal": 1e-6, "d_index_q": 8e-3, "d_weights": 8e-3, "d_index_k": 8e-3}


def make_problem(dims, key_ids, ids_dtype, score, device, seed=0, grid=True):
    """Random inputs: bf16 q, w, k (multiples of 1/8 when `grid`, so every
    q . k is exact and the ReLU gates agree with the reference), softmax
    targets and predicts, ids into the row's own batch with padding as -1,
    as ids past the end and (int64) as ids past 2^32."""
    b, sq, sk, h, d, topk = dims
    g = torch.Generator().manual_seed(seed)

    def vals(*shape):
        if grid:
            return (torch.randint(-8, 9, shape, generator=g).float() / 8).bfloat16()
        return (torch.rand(shape, generator=g) * 2 - 1).bfloat16()

    q, w, k = vals(b, sq, h, d), vals(b, sq, h), vals(b, sk, d)
    ids = torch.randint(0, sk, (b, sq, topk), generator=g, dtype=torch.int64)
    if key_ids == "global":
        ids += (torch.arange(b) * sk).view(b, 1, 1)
    u = torch.rand(b, sq, topk, generator=g)
    limit = b * sk if key_ids == "global" else sk
    ids = torch.where(u < 0.1, torch.full_like(ids, -1), ids)
    ids = torch.where((u >= 0.1) & (u < 0.15), torch.full_like(ids, limit + 3), ids)
    if ids_dtype == torch.int64:
        # Padding that a plain narrowing to int32 would turn into key 5.
        ids = torch.where((u >= 0.15) & (u < 0.2), torch.full_like(ids, 2**32 + 5), ids)
    ids = ids.to(ids_dtype)
    target = torch.softmax(torch.randn(b, sq, topk, generator=g) * 2, -1)
    predict = torch.softmax(torch.randn(b, sq, topk, generator=g) * 2, -1)
    index_score = predict.log() if score == "logprobs" else predict
    grad_loss = torch.tensor([0.75])
    t = (q, w, k, target, index_score, ids, grad_loss)
    return tuple(x.to(device).contiguous() for x in t)


def reference(q, w, k, attn, index_score, ids, grad_loss, sm_scale, loss_coeff, key_ids, score):
    """The spec's math in f64 (on the tensors' device)."""
    b, sq, h, d = q.shape
    sk = k.shape[1]
    q, w, k = q.double(), w.double(), k.double()
    attn, index_score = attn.double(), index_score.double()
    c = loss_coeff / (b * sq) * float(grad_loss.reshape(()).item())
    if score == "logprobs":
        pred, live = index_score.exp(), index_score >= -100.0
    else:
        pred, live = index_score, index_score >= CLIP
    gsig = torch.where(live, -attn.clamp_min(CLIP) * c, torch.zeros_like(attn))
    gsig = gsig - pred * gsig.sum(-1, keepdim=True)
    ids = ids.long()
    if key_ids == "global":
        valid = (ids >= 0) & (ids < b * sk)
        n = ids
    else:
        valid = (ids >= 0) & (ids < sk)
        n = ids + (torch.arange(b, device=ids.device) * sk).view(b, 1, 1)
    n = torch.where(valid, n, torch.zeros_like(n))
    kg = k.reshape(b * sk, d)[n]  # (B, S_q, topk, D)
    s = sm_scale * torch.einsum("bshd,bstd->bsht", q, kg)
    gate = (s > 0) & valid[:, :, None, :]
    zero = torch.zeros_like(s)
    ds = torch.where(gate, gsig[:, :, None, :] * w[..., None], zero)
    dw = torch.where(gate, gsig[:, :, None, :] * s, zero).sum(-1)
    dq = sm_scale * torch.einsum("bsht,bstd->bshd", ds, kg)
    contrib = sm_scale * torch.einsum("bsht,bshd->bstd", ds, q)
    dk = torch.zeros(b * sk, d, dtype=torch.float64, device=q.device)
    dk.index_add_(0, n.reshape(-1), contrib.reshape(-1, d))
    return {"grad_signal": gsig, "d_index_q": dq, "d_weights": dw, "d_index_k": dk.view(b, sk, d)}


def rel_err(got, want):
    got, want = got.double(), want.double()
    den = want.norm()
    return float((got - want).norm() / den) if den > 0 else float((got - want).norm())


class Case:
    def __init__(self, dims, key_ids, ids_dtype, dk, dw, score, sm_scale=0.5, loss_coeff=1.5):
        self.dims, self.key_ids, self.ids_dtype = dims, key_ids, ids_dtype
        self.dk, self.dw, self.score = dk, dw, score
        self.sm_scale, self.loss_coeff = sm_scale, loss_coeff

    def __repr__(self):
        return (f"dims={self.dims} ids={self.key_ids}/{self.ids_dtype} dk={self.dk} "
                f"dw={self.dw} score={self.score}")

    def check(self, test, device, **kw):
        x = make_problem(self.dims, self.key_ids, self.ids_dtype, self.score, device)
        attn_before = x[3].clone()
        out = indexer_backward(
            *x, sm_scale=self.sm_scale, loss_coeff=self.loss_coeff, key_ids=self.key_ids,
            score=self.score, d_index_k_dtype=self.dk, d_weights_dtype=self.dw, **kw)
        if device != "cpu":
            torch.cuda.synchronize(device)
        want = reference(*x, self.sm_scale, self.loss_coeff, self.key_ids, self.score)
        test.assertTrue(torch.equal(x[3], attn_before), f"{self}: attn_score changed")
        test.assertEqual(out.d_index_k.dtype, self.dk)
        test.assertEqual(out.d_weights.dtype, self.dw)
        test.assertEqual(out.d_index_q.dtype, torch.bfloat16)
        errs = {}
        for name, bound in BOUNDS.items():
            got = getattr(out, name)
            if name == "d_index_k" and self.dk == torch.bfloat16:
                bound = 1.2e-2
            test.assertTrue(torch.isfinite(got).all(), f"{self}: {name} not finite")
            errs[name] = rel_err(got, want[name])
            test.assertLessEqual(errs[name], bound, f"{self}: {name} error {errs[name]:.3g}")
        print(f"{self}: " + " ".join(f"{n} {e:.2e}" for n, e in errs.items()))
        return x, out


# The wgmma fast path (sm_90: H = 64, D = 128, topk > 64) and the row kernels.
SHAPES = [(2, 64, 300, 64, 128, 128), (1, 50, 200, 16, 64, 72)]


def cases():
    i = 0
    for dims in SHAPES:
        for ids_dtype in (torch.int32, torch.int64):
            for key_ids in ("global", "local"):
                for dk in (torch.float32, torch.bfloat16):
                    dw = (torch.bfloat16, torch.float32)[i % 2]
                    score = ("probs", "logprobs")[(i // 2) % 2]
                    i += 1
                    yield Case(dims, key_ids, ids_dtype, dk, dw, score)


@unittest.skipUnless(HAS_CUDA, "no CUDA device")
class Gpu(unittest.TestCase):
    def test_matches_the_f64_reference(self):
        for case in cases():
            with self.subTest(case=repr(case)):
                case.check(self, "cuda")

    def test_deterministic_mode_repeats_itself_bit_for_bit(self):
        # Keys shared by many rows (S_k small against S_q * topk), so the
        # default mode's f32 scatter lands in varying orders; the
        # deterministic mode's outputs stay equal bit for bit, on the
        # current stream and on a side stream, and within the bounds.
        for dk in (torch.float32, torch.bfloat16):
            case = Case((2, 64, 40, 64, 128, 256), "local", torch.int64, dk, torch.float32, "probs")
            with self.subTest(case=repr(case)):
                x, first = case.check(self, "cuda", deterministic=True)
                side = torch.cuda.Stream()
                for run in range(3):
                    stream = side if run == 2 else torch.cuda.current_stream()
                    with torch.cuda.stream(stream):
                        again = indexer_backward(
                            *x, sm_scale=case.sm_scale, loss_coeff=case.loss_coeff,
                            key_ids="local", d_index_k_dtype=dk,
                            d_weights_dtype=torch.float32, deterministic=True)
                    stream.synchronize()
                    for name in BOUNDS:
                        self.assertTrue(
                            torch.equal(getattr(first, name).view(-1).view(torch.uint8),
                                        getattr(again, name).view(-1).view(torch.uint8)),
                            f"{case}: run {run}: {name} differs")

    def test_deterministic_mode_where_it_does_not_run(self):
        # topk <= 64: the mma.sync kernels, which have no deterministic twin.
        x = make_problem((1, 8, 64, 64, 128, 64), "global", torch.int32, "probs", "cuda")
        with self.assertRaisesRegex(NotImplementedError, "deterministic"):
            indexer_backward(*x, deterministic=True)
        with self.assertRaisesRegex(TypeError, "deterministic: expected a bool"):
            indexer_backward(*x, deterministic=1)

    def test_continuous_values(self):
        dims = SHAPES[0]
        x = make_problem(dims, "global", torch.int32, "probs", "cuda", seed=3, grid=False)
        out = indexer_backward(*x, key_ids="global")
        torch.cuda.synchronize()
        want = reference(*x, 1.0, 1.0, "global", "probs")
        for name, bound in BOUNDS.items():
            self.assertLessEqual(rel_err(getattr(out, name), want[name]), bound, name)

    def test_inplace_writes_grad_signal_over_attn_score(self):
        dims = SHAPES[0]
        x = make_problem(dims, "global", torch.int64, "probs", "cuda", seed=1)
        want = reference(*x, 1.0, 1.0, "global", "probs")
        attn = x[3]
        out = indexer_backward(*x, inplace=True, key_ids="global")
        torch.cuda.synchronize()
        self.assertEqual(out.grad_signal.data_ptr(), attn.data_ptr())
        self.assertLessEqual(rel_err(attn, want["grad_signal"]), 1e-6)

    def test_runs_on_the_current_stream(self):
        dims = SHAPES[1]
        x = make_problem(dims, "local", torch.int32, "probs", "cuda", seed=2)
        base = indexer_backward(*x, key_ids="local")
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = indexer_backward(*x, key_ids="local")
        side.synchronize()
        self.assertTrue(torch.equal(out.grad_signal, base.grad_signal))
        self.assertTrue(torch.equal(out.d_index_q, base.d_index_q))
        self.assertTrue(torch.equal(out.d_weights, base.d_weights))

    def test_grad_loss_is_read_on_the_device_under_graph_replay(self):
        dims = SHAPES[0]
        x = list(make_problem(dims, "global", torch.int32, "probs", "cuda", seed=4))
        gl = x[6]
        indexer_backward(*x, key_ids="global")  # warm-up: plan built outside capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = indexer_backward(*x, key_ids="global", d_index_k_dtype=torch.float32)
        gl.fill_(2.0)
        graph.replay()
        torch.cuda.synchronize()
        want = reference(*x, 1.0, 1.0, "global", "probs")
        for name, bound in BOUNDS.items():
            self.assertLessEqual(rel_err(getattr(out, name), want[name]), bound, name)

    def test_a_number_as_grad_loss_and_the_plan_cache(self):
        dims = SHAPES[1]
        x = make_problem(dims, "global", torch.int32, "probs", "cuda", seed=5)
        dsa_indexer_bwd.clear_plan_cache()
        a = indexer_backward(*x[:6], 0.75)
        b = indexer_backward(*x)
        torch.cuda.synchronize()
        self.assertEqual(dsa_indexer_bwd.plan_cache_size(), 1)
        self.assertTrue(torch.equal(a.d_index_q, b.d_index_q))
        indexer_backward(*x, sm_scale=0.25)
        self.assertEqual(dsa_indexer_bwd.plan_cache_size(), 2)

    def test_errors_name_the_tensor(self):
        dims = SHAPES[1]
        q, w, k, attn, score, ids, gl = make_problem(dims, "global", torch.int32, "probs", "cuda")
        with self.assertRaisesRegex(TypeError, "index_k: expected dtype torch.bfloat16"):
            indexer_backward(q, w, k.float(), attn, score, ids, gl)
        with self.assertRaisesRegex(ValueError, "index_q: must be contiguous"):
            qt = q.transpose(2, 3).contiguous().transpose(2, 3)
            indexer_backward(qt, w, k, attn, score, ids, gl)
        with self.assertRaisesRegex(ValueError, "index_score: on cpu"):
            indexer_backward(q, w, k, attn, score.cpu(), ids, gl)
        with self.assertRaisesRegex(ValueError, "grad_loss: on cpu"):
            indexer_backward(q, w, k, attn, score, ids, gl.cpu())
        with self.assertRaisesRegex(ValueError, "heads"):
            b, sq, h, d = q.shape
            q24 = torch.zeros(b, sq, 24, d, dtype=torch.bfloat16, device="cuda")
            w24 = torch.zeros(b, sq, 24, dtype=torch.bfloat16, device="cuda")
            indexer_backward(q24, w24, k, attn, score, ids, gl)
        with self.assertRaisesRegex(ValueError, "loss_coeff must be finite"):
            indexer_backward(q, w, k, attn, score, ids, gl, loss_coeff=math.inf)
        with self.assertRaisesRegex(ValueError, "index_k: device address .* 16-byte aligned"):
            flat = torch.zeros(k.numel() + 1, dtype=torch.bfloat16, device="cuda")
            indexer_backward(q, w, flat[1:].view(k.shape), attn, score, ids, gl)

    @unittest.skipUnless(torch.cuda.device_count() > 1, "one CUDA device")
    def test_a_second_device(self):
        torch.cuda.set_device(0)
        dsa_indexer_bwd.clear_plan_cache()  # the plan is built in this call
        Case(SHAPES[1], "global", torch.int64, torch.float32, torch.bfloat16,
             "probs").check(self, "cuda:1")
        # The driver context bound for the call is not left behind.
        self.assertEqual(torch.cuda.current_device(), 0)
        self.assertEqual(torch.zeros(1, device="cuda").device.index, 0)

    def test_gpu_and_cpu_paths_agree(self):
        dims = (1, 8, 40, 16, 64, 24)
        x = make_problem(dims, "local", torch.int64, "logprobs", "cuda", seed=6)
        kw = dict(key_ids="local", score="logprobs", d_index_k_dtype=torch.bfloat16)
        g = indexer_backward(*x, **kw)
        c = indexer_backward(*(t.cpu() for t in x), **kw)
        torch.cuda.synchronize()
        self.assertLessEqual(rel_err(g.grad_signal.cpu(), c.grad_signal), 1e-6)
        for name in ("d_index_q", "d_weights", "d_index_k"):
            self.assertLessEqual(rel_err(getattr(g, name).cpu(), getattr(c, name)), 1.2e-2, name)


class Safety(unittest.TestCase):
    """What a trainer could get wrong without noticing: the id convention,
    in-place writes autograd saved, NumPy scalars (CPU tensors, and CUDA ones
    where there is a GPU)."""

    def devices(self):
        return ["cpu"] + (["cuda"] if HAS_CUDA else [])

    def test_the_id_convention_is_said_and_checked(self):
        dims = (2, 6, 20, 16, 64, 8)
        for device in self.devices():
            dsa_indexer_bwd.clear_plan_cache()
            with self.subTest(device=device):
                x = make_problem(dims, "global", torch.int32, "probs", device, seed=7)
                with self.assertRaisesRegex(ValueError, "key_ids: B = 2"):
                    indexer_backward(*x)
                indexer_backward(*x, key_ids="global")
                # Local ids (padding written as S_k) given as global ids.
                y = list(make_problem(dims, "local", torch.int32, "probs", device, seed=7))
                y[5] = y[5].clone()
                y[5][:, :, 0] = 20
                # CUDA tensors are checked on a plan's first call.
                dsa_indexer_bwd.clear_plan_cache()
                with self.assertRaisesRegex(ValueError, "batch 0: .* another batch's keys"):
                    indexer_backward(*y, key_ids="global")
                indexer_backward(*y, key_ids="local")
                indexer_backward(*y, key_ids="global", trust_ids=True)
                # Global ids given as local ids: batch 1 would be all padding.
                dsa_indexer_bwd.clear_plan_cache()
                with self.assertRaisesRegex(ValueError, "batch 1: none of its 48 ids"):
                    indexer_backward(*x, key_ids="local")
                # B = 1: both conventions read every id alike; no key_ids needed.
                one = make_problem((1, 6, 20, 16, 64, 8), "global", torch.int32, "probs", device)
                indexer_backward(*one)

    def test_inplace_bumps_the_version_and_outputs_carry_no_history(self):
        dims = (1, 4, 16, 16, 64, 8)
        for device in self.devices():
            with self.subTest(device=device):
                x = list(make_problem(dims, "global", torch.int32, "probs", device))
                # attn_score saved by autograd (a product with a leaf).
                leaf = torch.ones_like(x[3]).requires_grad_()
                loss = (leaf * x[3]).sum()
                before = x[3]._version
                out = indexer_backward(*x, inplace=True)
                self.assertGreater(x[3]._version, before)
                with self.assertRaisesRegex(RuntimeError, "modified by an inplace operation"):
                    loss.backward()
                for name in out._fields:
                    t = getattr(out, name)
                    self.assertIsNone(t.grad_fn, name)
                    self.assertFalse(t.requires_grad, name)
                # An attn_score that requires grad is refused with inplace=True,
                # and its copy carries no history with inplace=False.
                x[3] = x[3].clone().requires_grad_()
                with self.assertRaisesRegex(ValueError, "attn_score: requires grad"):
                    indexer_backward(*x, inplace=True)
                out = indexer_backward(*x)
                self.assertIsNone(out.grad_signal.grad_fn)

    def test_numpy_grad_loss(self):
        import numpy as np

        dims = (1, 4, 16, 16, 64, 8)
        for device in self.devices():
            with self.subTest(device=device):
                x = make_problem(dims, "global", torch.int32, "probs", device)
                want = indexer_backward(*x[:6], 0.75)
                for gl in (np.float32(0.75), np.array([0.75], np.float32), np.float64(0.75)):
                    got = indexer_backward(*x[:6], gl)
                    self.assertTrue(torch.equal(got.d_index_q, want.d_index_q), repr(gl))
                with self.assertRaisesRegex(ValueError, "one element"):
                    indexer_backward(*x[:6], np.ones(2, np.float32))
                with self.assertRaisesRegex(ValueError, "finite"):
                    indexer_backward(*x[:6], np.float32("inf"))


class Cpu(unittest.TestCase):
    """The CPU path through torch (runs without a GPU)."""

    def test_matches_the_f64_reference(self):
        dims = (2, 6, 20, 16, 64, 12)
        for ids_dtype in (torch.int32, torch.int64):
            for key_ids in ("global", "local"):
                case = Case(dims, key_ids, ids_dtype, torch.bfloat16, torch.float32, "logprobs")
                with self.subTest(case=repr(case)):
                    case.check(self, "cpu")

    def test_a_bool_option_is_refused_after_a_valid_call(self):
        # The option checks are remembered: True (== 1 == 1.0) must not
        # pass as the scale a previous call used.
        x = make_problem((1, 4, 16, 16, 64, 8), "global", torch.int32, "probs", "cpu")
        indexer_backward(*x, sm_scale=1.0, loss_coeff=1)
        for kw in ({"sm_scale": True}, {"loss_coeff": True}):
            with self.subTest(**kw), self.assertRaisesRegex(TypeError, "expected a number, got bool"):
                indexer_backward(*x, **kw)

    def test_deterministic_cpu_path_repeats_itself(self):
        case = Case((2, 6, 20, 16, 64, 12), "global", torch.int32, torch.float32, torch.float32,
                    "probs")
        x, a = case.check(self, "cpu", deterministic=True)
        b = indexer_backward(*x, sm_scale=case.sm_scale, loss_coeff=case.loss_coeff,
                             key_ids="global", d_weights_dtype=torch.float32, deterministic=True)
        self.assertTrue(torch.equal(a.d_index_k, b.d_index_k))

    def test_inplace(self):
        x = make_problem((1, 4, 16, 16, 64, 8), "global", torch.int32, "probs", "cpu")
        attn = x[3]
        out = indexer_backward(*x, inplace=True)
        self.assertEqual(out.grad_signal.data_ptr(), attn.data_ptr())


if __name__ == "__main__":
    unittest.main(verbosity=2)
