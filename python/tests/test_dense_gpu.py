"""`dense_indexer_backward` on torch tensors against a torch f64 statement
of docs/spec.md ("Dense mode"): BSHD and packed problems with per-batch
offsets and compressed keys (cu_seqlens as int32 / int64 tensors and as
lists), both d_index_k and d_weights types, columns past a row's visible
keys never read, the in-place option, the plan cache, errors on real
tensors, and the CPU path.

Needs torch; the GPU cases need a CUDA device (each skips without one); the
GPU path itself needs compute capability 9.0 (elsewhere those cases skip).
Run with `python -m pytest -v python/tests/test_dense_gpu.py` or
`python python/tests/test_dense_gpu.py`.
"""

import math
import unittest

try:
    import torch
except ImportError:  # the torch-free CI run
    raise unittest.SkipTest("torch is not installed")

import dsa_indexer_bwd
from dsa_indexer_bwd import dense_indexer_backward

CLIP = math.exp(-100.0)
HAS_CUDA = torch.cuda.is_available()
SM90 = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
BOUNDS = {"grad_signal": 1e-6, "d_index_q": 8e-3, "d_weights": 8e-3, "d_index_k": 8e-3}
NAMES = ("index_q", "weights", "index_k", "attn_score", "attn_l1norm", "index_score",
         "index_lse", "grad_loss")


class Layout:
    """A dense layout: BSHD ``(B, S_q, S_k)`` or packed ``cu_q``, ``cu_k``
    with ``cols`` score columns; ``q_offset`` per batch (or None), ``ratio``."""

    def __init__(self, heads, head_dim, bshd=None, cu_q=None, cu_k=None, cols=None,
                 q_offset=None, ratio=1):
        self.heads, self.head_dim, self.bshd = heads, head_dim, bshd
        if bshd is not None:
            b, sq, sk = bshd
            cu_q, cu_k = [i * sq for i in range(b + 1)], [i * sk for i in range(b + 1)]
            cols = sk
        elif cols is None:
            cols = max(e - s for s, e in zip(cu_k, cu_k[1:]))
        self.cu_q, self.cu_k, self.cols = list(cu_q), list(cu_k), cols
        self.q_offset, self.ratio = q_offset, ratio

    def __repr__(self):
        where = f"bshd={self.bshd}" if self.bshd else f"cu_q={self.cu_q} cu_k={self.cu_k}"
        return (f"H={self.heads} D={self.head_dim} {where} cols={self.cols} "
                f"q_offset={self.q_offset} ratio={self.ratio}")

    def rows(self):
        """Per query row: ``(key_start, L)`` (docs/spec.md's visibility rule)."""
        out = []
        for b in range(len(self.cu_q) - 1):
            off = self.q_offset[b] if self.q_offset is not None else 0
            sk = self.cu_k[b + 1] - self.cu_k[b]
            for s in range(self.cu_q[b + 1] - self.cu_q[b]):
                num = off + s + 1
                out.append((self.cu_k[b], min(num // self.ratio, sk) if num > 0 else 0))
        return out

    def shape(self, *tail, rows=True):
        """A tensor shape: ``(B, S_q, *tail)`` / ``(B, S_k, *tail)`` or packed."""
        if self.bshd is not None:
            b, sq, sk = self.bshd
            return (b, sq if rows else sk, *tail)
        return (self.cu_q[-1] if rows else self.cu_k[-1], *tail)

    def kwargs(self, cu_dtype=None):
        kw = dict(q_offset=self.q_offset, ratio=self.ratio)
        if self.bshd is None:
            cq, ck = self.cu_q, self.cu_k
            if cu_dtype is not None:
                cq, ck = torch.tensor(cq, dtype=cu_dtype), torch.tensor(ck, dtype=cu_dtype)
            kw.update(cu_seqlens_q=cq, cu_seqlens_k=ck)
        return kw


def visible_mask(layout):
    """(rows, cols) bool: column j < the row's L."""
    lim = torch.tensor([v for _, v in layout.rows()])
    return torch.arange(layout.cols)[None, :] < lim[:, None]


def make_problem(layout, device, seed=0, poison=False):
    """Random inputs: bf16 q, w, k on a grid of 1/8 (exact q . k), positive
    attention with its visible row sums, logits (some masked by lse - 100)
    with their visible log-sum-exp. `poison`: NaN at every invisible column
    of both score tensors (never read, by the spec)."""
    g = torch.Generator().manual_seed(seed)
    h, d, cols = layout.heads, layout.head_dim, layout.cols

    def vals(*shape):
        return (torch.randint(-8, 9, shape, generator=g).float() / 8).bfloat16()

    q, w = vals(*layout.shape(h, d)), vals(*layout.shape(h))
    k = vals(*layout.shape(d, rows=False))
    n = layout.cu_q[-1]
    vis = visible_mask(layout)
    attn = torch.rand(n, cols, generator=g) + 0.05
    logits = torch.randn(n, cols, generator=g) * 2
    masked = torch.rand(n, cols, generator=g) < 0.03  # logit - lse < -100
    logits = torch.where(masked, torch.full_like(logits, -300.0), logits)
    l1 = torch.where(vis, attn, torch.zeros_like(attn)).sum(-1)
    l1 = torch.where(l1 > 0, l1, torch.ones_like(l1))
    lse = torch.where(vis, logits.double(), torch.full_like(logits.double(), -math.inf))
    lse = lse.logsumexp(-1).float()
    lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    if poison:
        attn = torch.where(vis, attn, torch.full_like(attn, math.nan))
        logits = torch.where(vis, logits, torch.full_like(logits, math.nan))
    rs = layout.shape(rows=True)
    scores = layout.shape(cols)
    t = (q, w, k, attn.reshape(scores), l1.reshape(rs), logits.reshape(scores), lse.reshape(rs),
         torch.tensor([0.75]))
    return tuple(x.to(device).contiguous() for x in t)


def reference(layout, x, sm_scale, loss_coeff):
    """The spec's dense math in f64 (on the CPU), as flat (rows, ...) tensors."""
    q, w, k, attn, l1, logits, lse, grad_loss = (t.cpu().double() for t in x)
    h, d, cols = layout.heads, layout.head_dim, layout.cols
    n = layout.cu_q[-1]
    q, w, k = q.reshape(n, h, d), w.reshape(n, h), k.reshape(-1, d)
    attn, logits = attn.reshape(n, cols), logits.reshape(n, cols)
    l1, lse = l1.reshape(n), lse.reshape(n)
    vis = visible_mask(layout)
    c = loss_coeff / n * float(grad_loss.reshape(()))
    z = logits - lse[:, None]
    zero = torch.zeros_like(z)
    pred = torch.where(vis, z.exp(), zero)
    target = (attn / (l1[:, None] + 1e-10)).clamp_min(CLIP)
    g = torch.where(vis & (z >= -100.0), -target * c, zero)
    gs = torch.where(vis, g - pred * g.sum(-1, keepdim=True), zero)
    start = torch.tensor([s for s, _ in layout.rows()])
    key = start[:, None] + torch.arange(cols)[None, :]
    key = torch.where(vis, key, torch.zeros_like(key))
    kg = k[key]  # (rows, cols, D)
    s = sm_scale * torch.einsum("rhd,rcd->rhc", q, kg)
    gate = (s > 0) & vis[:, None, :]
    zs = torch.zeros_like(s)
    ds = torch.where(gate, gs[:, None, :] * w[..., None], zs)
    dw = torch.where(gate, gs[:, None, :] * s, zs).sum(-1)
    dq = sm_scale * torch.einsum("rhc,rcd->rhd", ds, kg)
    contrib = sm_scale * torch.einsum("rhc,rhd->rcd", ds, q)
    dk = torch.zeros_like(k)
    dk.index_add_(0, key[vis], contrib[vis])
    return {"grad_signal": gs, "d_index_q": dq, "d_weights": dw, "d_index_k": dk}


def rel_err(got, want):
    got, want = got.detach().cpu().double().reshape(want.shape), want.double()
    den = want.norm()
    return float((got - want).norm() / den) if den > 0 else float((got - want).norm())


class Case:
    def __init__(self, layout, dk=torch.float32, dw=torch.bfloat16, cu_dtype=None,
                 sm_scale=0.5, loss_coeff=1.5):
        self.layout, self.dk, self.dw, self.cu_dtype = layout, dk, dw, cu_dtype
        self.sm_scale, self.loss_coeff = sm_scale, loss_coeff

    def __repr__(self):
        return f"{self.layout} dk={self.dk} dw={self.dw} cu={self.cu_dtype}"

    def check(self, test, device, seed=0, poison=False, **kw):
        x = make_problem(self.layout, device, seed, poison)
        before = x[5].clone()
        out = dense_indexer_backward(
            *x, sm_scale=self.sm_scale, loss_coeff=self.loss_coeff, d_index_k_dtype=self.dk,
            d_weights_dtype=self.dw, **self.layout.kwargs(self.cu_dtype), **kw)
        if device != "cpu":
            torch.cuda.synchronize(device)
        want = reference(self.layout, x, self.sm_scale, self.loss_coeff)
        if not kw.get("inplace"):  # NaN poison compares equal to itself here
            test.assertTrue(torch.equal(x[5].nan_to_num(7.0), before.nan_to_num(7.0)),
                            f"{self}: index_score changed")
        test.assertEqual(out.grad_signal.shape, x[5].shape)
        test.assertEqual(out.d_index_q.shape, x[0].shape)
        test.assertEqual(out.d_weights.shape, x[1].shape)
        test.assertEqual(out.d_index_k.shape, x[2].shape)
        test.assertEqual(out.d_index_k.dtype, self.dk)
        test.assertEqual(out.d_weights.dtype, self.dw)
        errs = {}
        for name, bound in BOUNDS.items():
            got = getattr(out, name)
            if name == "d_index_k" and self.dk == torch.bfloat16:
                bound = 1.2e-2
            test.assertTrue(torch.isfinite(got).all(), f"{self}: {name} not finite")
            errs[name] = rel_err(got, want[name])
            test.assertLessEqual(errs[name], bound, f"{self}: {name} error {errs[name]:.3g}")
        # Columns a row does not see get exactly 0.
        vis = visible_mask(self.layout).to(out.grad_signal.device)
        hidden = out.grad_signal.reshape(vis.shape)[~vis]
        test.assertTrue(bool((hidden == 0).all()), f"{self}: grad_signal past L not 0")
        print(f"{self}: " + " ".join(f"{n} {e:.2e}" for n, e in errs.items()))
        return x, out


# More than 64 score columns: the GPU path's envelope.
BSHD = [
    Layout(64, 128, bshd=(2, 96, 80), q_offset=[0, 16]),
    Layout(16, 64, bshd=(1, 300, 75), ratio=4),
]
PACKED = Layout(32, 64, cu_q=[0, 100, 100, 230], cu_k=[0, 90, 120, 200], cols=96,
                q_offset=[-5, 0, 30], ratio=2)


@unittest.skipUnless(HAS_CUDA, "no CUDA device")
class Gpu(unittest.TestCase):
    def setUp(self):
        if not SM90:
            self.skipTest("the dense GPU path needs compute capability 9.0")

    def test_bshd_matches_the_f64_reference(self):
        for i, layout in enumerate(BSHD):
            for dk, dw in ((torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)):
                case = Case(layout, dk, dw)
                with self.subTest(case=repr(case)):
                    case.check(self, "cuda", seed=i)

    def test_packed_matches_the_f64_reference(self):
        for cu_dtype, dk in ((torch.int32, torch.float32), (torch.int64, torch.bfloat16),
                             (None, torch.float32)):
            case = Case(PACKED, dk, torch.float32, cu_dtype)
            with self.subTest(case=repr(case)):
                case.check(self, "cuda", seed=3)

    def test_columns_past_a_row_s_keys_are_not_read(self):
        for layout in (BSHD[1], PACKED):
            with self.subTest(layout=repr(layout)):
                Case(layout).check(self, "cuda", seed=4, poison=True)

    def test_inplace_writes_grad_signal_over_index_score(self):
        layout = BSHD[0]
        x = make_problem(layout, "cuda", seed=5)
        want = reference(layout, x, 1.0, 1.0)
        score, attn = x[5], x[3].clone()
        out = dense_indexer_backward(*x, inplace=True, **layout.kwargs())
        torch.cuda.synchronize()
        self.assertEqual(out.grad_signal.data_ptr(), score.data_ptr())
        self.assertLessEqual(rel_err(score, want["grad_signal"]), 1e-6)
        self.assertTrue(torch.equal(x[3], attn), "attn_score changed")

    def test_a_number_or_none_as_grad_loss_and_the_plan_cache(self):
        layout = BSHD[1]
        x = make_problem(layout, "cuda", seed=6)
        dsa_indexer_bwd.clear_plan_cache()
        a = dense_indexer_backward(*x[:7], 0.75, **layout.kwargs())
        b = dense_indexer_backward(*x, **layout.kwargs())
        torch.cuda.synchronize()
        self.assertEqual(dsa_indexer_bwd.plan_cache_size(), 1)
        self.assertTrue(torch.equal(a.d_index_q, b.d_index_q))
        one = dense_indexer_backward(*x[:7], **layout.kwargs())  # grad_loss 1.0
        want = reference(layout, x[:7] + (torch.tensor([1.0]),), 1.0, 1.0)
        torch.cuda.synchronize()
        self.assertLessEqual(rel_err(one.grad_signal, want["grad_signal"]), 1e-6)
        dense_indexer_backward(*x, q_offset=3, ratio=layout.ratio)
        dense_indexer_backward(*x, ratio=2)
        self.assertEqual(dsa_indexer_bwd.plan_cache_size(), 3)

    def test_errors_name_the_tensor(self):
        layout = BSHD[1]
        q, w, k, attn, l1, score, lse, gl = make_problem(layout, "cuda")
        kw = layout.kwargs()
        with self.assertRaisesRegex(TypeError, "index_lse: expected dtype torch.float32"):
            dense_indexer_backward(q, w, k, attn, l1, score, lse.double(), gl, **kw)
        with self.assertRaisesRegex(TypeError, "attn_l1norm: expected a torch.Tensor"):
            dense_indexer_backward(q, w, k, attn, l1.tolist(), score, lse, gl, **kw)
        with self.assertRaisesRegex(ValueError, "attn_score: must be contiguous"):
            at = attn.transpose(1, 2).contiguous().transpose(1, 2)
            dense_indexer_backward(q, w, k, at, l1, score, lse, gl, **kw)
        with self.assertRaisesRegex(ValueError, r"index_score: expected shape \(1, 300, 75\)"):
            dense_indexer_backward(q, w, k, attn, l1, score[:, :, :74].contiguous(), lse, gl, **kw)
        with self.assertRaisesRegex(ValueError, "attn_l1norm: on cpu"):
            dense_indexer_backward(q, w, k, attn, l1.cpu(), score, lse, gl, **kw)
        with self.assertRaisesRegex(ValueError, "grad_loss: on cpu"):
            dense_indexer_backward(q, w, k, attn, l1, score, lse, gl.cpu(), **kw)
        with self.assertRaisesRegex(ValueError, "cu_seqlens_q and cu_seqlens_k"):
            dense_indexer_backward(q, w, k, attn, l1, score, lse, gl, cu_seqlens_q=[0, 300])
        with self.assertRaisesRegex(ValueError, "q_offset: expected 1 entries"):
            dense_indexer_backward(q, w, k, attn, l1, score, lse, gl, q_offset=[0, 1])
        with self.assertRaisesRegex(ValueError, "ratio"):
            dense_indexer_backward(q, w, k, attn, l1, score, lse, gl, ratio=0)
        with self.assertRaisesRegex(ValueError, "loss_coeff must be finite"):
            dense_indexer_backward(q, w, k, attn, l1, score, lse, gl, loss_coeff=math.nan, **kw)
        with self.assertRaisesRegex(ValueError, "index_k: device address .* 16-byte aligned"):
            flat = torch.zeros(k.numel() + 1, dtype=torch.bfloat16, device="cuda")
            dense_indexer_backward(q, w, flat[1:].view(k.shape), attn, l1, score, lse, gl, **kw)
        pq, pw, pk, pa, pl, ps, plse, pgl = make_problem(PACKED, "cuda")
        with self.assertRaisesRegex(ValueError, "cu_seqlens_k: ends at 199, but index_k has 200"):
            dense_indexer_backward(pq, pw, pk, pa, pl, ps, plse, pgl, cu_seqlens_q=PACKED.cu_q,
                                   cu_seqlens_k=[0, 90, 120, 199])
        with self.assertRaisesRegex(TypeError, "cu_seqlens_q: expected dtype torch.int32"):
            dense_indexer_backward(pq, pw, pk, pa, pl, ps, plse, pgl,
                                   cu_seqlens_q=torch.tensor(PACKED.cu_q, dtype=torch.float32),
                                   cu_seqlens_k=PACKED.cu_k)

    def test_deterministic_mode_repeats_itself_bit_for_bit(self):
        # 600 query rows: each key tile's sums come from three runs of rows
        # (the tile twin's chains); H = 16, D = 64 runs the sparse twins.
        for layout, dk in ((Layout(64, 128, bshd=(1, 600, 600)), torch.float32),
                           (Layout(16, 64, bshd=(1, 300, 200), ratio=2), torch.bfloat16)):
            case = Case(layout, dk, torch.float32)
            with self.subTest(case=repr(case)):
                x, first = case.check(self, "cuda", seed=8, deterministic=True)
                for _ in range(2):
                    again = dense_indexer_backward(
                        *x, sm_scale=case.sm_scale, loss_coeff=case.loss_coeff,
                        d_index_k_dtype=dk, d_weights_dtype=torch.float32,
                        deterministic=True, **layout.kwargs())
                    for name in ("grad_signal", "d_index_q", "d_weights", "d_index_k"):
                        a, b = getattr(first, name), getattr(again, name)
                        self.assertTrue(torch.equal(a.view(torch.int8), b.view(torch.int8)),
                                        f"{case}: {name}")
        x = make_problem(BSHD[0], "cuda")
        with self.assertRaisesRegex(TypeError, "deterministic: expected a bool"):
            dense_indexer_backward(*x, deterministic=1, **BSHD[0].kwargs())

    def test_few_columns_are_not_implemented_on_the_gpu(self):
        layout = Layout(16, 64, bshd=(1, 8, 16))
        x = make_problem(layout, "cuda")
        with self.assertRaisesRegex(NotImplementedError, "dense mode"):
            dense_indexer_backward(*x)

    def test_gpu_and_cpu_paths_agree(self):
        layout = PACKED
        x = make_problem(layout, "cuda", seed=7)
        kw = dict(d_index_k_dtype=torch.bfloat16, **layout.kwargs(torch.int64))
        g = dense_indexer_backward(*x, **kw)
        c = dense_indexer_backward(*(t.cpu() for t in x), **kw)
        torch.cuda.synchronize()
        self.assertLessEqual(rel_err(g.grad_signal, c.grad_signal), 1e-6)
        for name in ("d_index_q", "d_weights", "d_index_k"):
            self.assertLessEqual(rel_err(getattr(g, name), getattr(c, name).double()), 1.2e-2, name)


class Cpu(unittest.TestCase):
    """The dense CPU path through torch (runs without a GPU)."""

    SMALL = [
        Layout(16, 64, bshd=(2, 6, 5), q_offset=[0, 3], ratio=2),
        Layout(16, 64, cu_q=[0, 4, 4, 9], cu_k=[0, 6, 7, 12], cols=8, q_offset=[2, 0, -1]),
    ]

    def test_matches_the_f64_reference(self):
        for layout in self.SMALL:
            for cu_dtype in ((None,) if layout.bshd else (torch.int32, torch.int64, None)):
                case = Case(layout, torch.bfloat16, torch.float32, cu_dtype)
                with self.subTest(case=repr(case)):
                    case.check(self, "cpu", seed=8)

    def test_columns_past_a_row_s_keys_are_not_read(self):
        Case(self.SMALL[1]).check(self, "cpu", seed=9, poison=True)

    def test_inplace(self):
        layout = self.SMALL[0]
        x = make_problem(layout, "cpu", seed=10)
        score = x[5]
        out = dense_indexer_backward(*x, inplace=True, **layout.kwargs())
        self.assertEqual(out.grad_signal.data_ptr(), score.data_ptr())


if __name__ == "__main__":
    unittest.main(verbosity=2)
