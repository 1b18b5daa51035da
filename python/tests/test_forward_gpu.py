"""The forward, the torch.library operators and the autograd-ready losses on
torch tensors: `indexer_forward` and `dense_indexer_forward` against a torch
f64 statement of docs/spec.md ("Forward") on the GPU and the CPU;
`torch.library.opcheck` on every operator; the gradients of `indexer_loss`
and `dense_indexer_loss` against plain torch autograd of the same loss;
`torch.compile(fullgraph=True)` eager-equal, also with
`mode="reduce-overhead"` (CUDA graphs) and on a side stream.

Needs torch; the GPU cases need a CUDA device (each skips without one).
"""

import math
import unittest

try:
    import torch
except ImportError:  # the torch-free CI run
    raise unittest.SkipTest("torch is not installed")

from dsa_indexer_bwd import (
    dense_indexer_forward,
    dense_indexer_loss,
    indexer_forward,
    indexer_loss,
)

HAS_CUDA = torch.cuda.is_available()
CLIP = math.exp(-100.0)


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def problem(b, sq, sk, h, d, topk, key_ids, device, seed=0, ids_dtype=torch.int64):
    g = torch.Generator().manual_seed(seed)
    q = (torch.rand(b, sq, h, d, generator=g) * 2 - 1).bfloat16()
    w = (torch.rand(b, sq, h, generator=g) * 2 - 1).bfloat16()
    k = (torch.rand(b, sk, d, generator=g) * 2 - 1).bfloat16()
    ids = torch.stack([torch.stack([torch.randperm(sk, generator=g)[:topk] for _ in range(sq)])
                       for _ in range(b)])
    if key_ids == "global":
        ids = ids + (torch.arange(b) * sk).view(b, 1, 1)
    pad = torch.rand(b, sq, topk, generator=g) < 0.15
    pad[0, 0] = True  # a row without a valid slot
    ids = torch.where(pad, torch.full_like(ids, -1), ids).to(ids_dtype)
    target = torch.softmax(torch.randn(b, sq, topk, generator=g) * 2, -1)
    target = torch.where(pad, torch.zeros_like(target), target)
    return [x.to(device).contiguous() for x in (q, w, k, ids, target)]


def dense_problem(b, s, h, d, seed):
    """A causal dense problem on the GPU: q, w, k (bf16, uniform in
    [-1, 1)), the causal mask, attention scores on it and their row sums."""
    g = torch.Generator().manual_seed(seed)
    q = ((torch.rand(b, s, h, d, generator=g) * 2 - 1).bfloat16()).cuda()
    w = ((torch.rand(b, s, h, generator=g) * 2 - 1).bfloat16()).cuda()
    k = ((torch.rand(b, s, d, generator=g) * 2 - 1).bfloat16()).cuda()
    causal = torch.tril(torch.ones(s, s, dtype=torch.bool)).cuda()
    attn = torch.rand(b, s, s, generator=g).cuda() * causal
    return q, w, k, causal, attn, attn.sum(-1)


def torch_logits(q, w, k, ids, sm_scale, key_ids):
    """f64 logits (B, S_q, topk) and the validity of each slot."""
    b, sq, h, d = q.shape
    sk = k.shape[1]
    flat = k.reshape(b * sk, d).double()
    ids64 = ids.long()
    if key_ids == "local":
        valid = (ids64 >= 0) & (ids64 < sk)
        rows = ids64 + (torch.arange(b, device=q.device) * sk).view(b, 1, 1)
    else:
        valid = (ids64 >= 0) & (ids64 < b * sk)
        rows = ids64
    kk = flat[torch.where(valid, rows, torch.zeros_like(rows))]  # (b, sq, topk, d)
    s = torch.einsum("bshd,bstd->bsht", q.double(), kk) * sm_scale
    logit = (w.double().unsqueeze(-1) * s.clamp_min(0)).sum(2)
    return logit, valid


def torch_forward(q, w, k, ids, sm_scale, key_ids):
    logit, valid = torch_logits(q, w, k, ids, sm_scale, key_ids)
    masked = torch.where(valid, logit, torch.full_like(logit, -math.inf))
    lse = torch.logsumexp(masked, -1)
    logp = masked - lse.unsqueeze(-1)
    return logp, lse, valid


class ForwardTest(unittest.TestCase):
    def check_forward(self, device, kernel="auto"):
        for key_ids in ("global", "local"):
            for ids_dtype in (torch.int32, torch.int64):
                q, w, k, ids, _ = problem(2, 9, 70, 64, 128, 40, key_ids, device)
                ids = ids.to(ids_dtype)
                logp, lse, valid = torch_forward(q, w, k, ids, 0.125, key_ids)
                for score in ("probs", "logprobs"):
                    kw = dict(sm_scale=0.125, key_ids=key_ids, score=score)
                    if device == "cuda":
                        kw["kernel"] = kernel
                    got = indexer_forward(q, w, k, ids, **kw)
                    fin = torch.isfinite(lse)
                    self.assertTrue(torch.equal(torch.isfinite(got.lse), fin))
                    self.assertLess(rel(got.lse[fin], lse[fin]), 1e-5)
                    want = logp if score == "logprobs" else logp.exp()
                    if score == "logprobs":
                        self.assertTrue(bool((got.index_score[~valid] == -math.inf).all()))
                        self.assertLess(rel(got.index_score[valid], want[valid]), 1e-5)
                    else:
                        self.assertTrue(bool((got.index_score[~valid] == 0).all()))
                        want = torch.where(valid, want, torch.zeros_like(want))
                        self.assertLess(rel(got.index_score, want), 1e-5)

    @unittest.skipUnless(HAS_CUDA, "needs a CUDA device")
    def test_gpu_forward_matches_torch(self):
        self.check_forward("cuda")
        self.check_forward("cuda", kernel="portable")

    def test_cpu_forward_matches_torch(self):
        self.check_forward("cpu")

    @unittest.skipUnless(HAS_CUDA, "needs a CUDA device")
    def test_dense_forward_matches_torch(self):
        for packed in (False, True):
            g = torch.Generator().manual_seed(3)
            h, d = 32, 64
            if packed:
                cu_q, cu_k, offs = [0, 20, 50], [0, 30, 80], [5, 0]
                tq, tk = 50, 80
                q = (torch.rand(tq, h, d, generator=g) * 2 - 1).bfloat16().cuda()
                w = (torch.rand(tq, h, generator=g) * 2 - 1).bfloat16().cuda()
                k = (torch.rand(tk, d, generator=g) * 2 - 1).bfloat16().cuda()
                got = dense_indexer_forward(q, w, k, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                            q_offset=offs, sm_scale=0.3)
                batches = [(0, 20, 0, 30, 5), (20, 50, 30, 80, 0)]
            else:
                q = (torch.rand(2, 40, h, d, generator=g) * 2 - 1).bfloat16().cuda()
                w = (torch.rand(2, 40, h, generator=g) * 2 - 1).bfloat16().cuda()
                k = (torch.rand(2, 40, d, generator=g) * 2 - 1).bfloat16().cuda()
                got = dense_indexer_forward(q, w, k, sm_scale=0.3)
                batches = None
            cols = got.index_score.shape[-1]
            if batches is None:
                logit = (w.double().unsqueeze(-1) *
                         (torch.einsum("bshd,btd->bsht", q.double(), k.double()) * 0.3)
                         .clamp_min(0)).sum(2)
                vis = torch.arange(cols, device="cuda") < (torch.arange(40, device="cuda") + 1
                                                           ).view(1, 40, 1)
                vis = vis.expand(2, 40, cols)
            else:
                logit = torch.zeros(50, cols, dtype=torch.float64, device="cuda")
                vis = torch.zeros(50, cols, dtype=torch.bool, device="cuda")
                for r0, r1, k0, k1, off in batches:
                    s = torch.einsum("shd,td->sht", q[r0:r1].double(), k[k0:k1].double()) * 0.3
                    lg = (w[r0:r1].double().unsqueeze(-1) * s.clamp_min(0)).sum(1)
                    logit[r0:r1, :k1 - k0] = lg
                    pos = torch.arange(r1 - r0, device="cuda") + off + 1
                    vis[r0:r1] = torch.arange(cols, device="cuda") < pos.clamp(max=k1 - k0
                                                                              ).unsqueeze(1)
            want = torch.where(vis, logit, torch.zeros_like(logit))
            lse = torch.logsumexp(torch.where(vis, logit, torch.full_like(logit, -math.inf)), -1)
            self.assertLess(rel(got.index_score, want), 1e-5)
            fin = torch.isfinite(lse)
            self.assertLess(rel(got.index_lse[fin], lse[fin]), 1e-5)


def torch_loss(q, w, k, ids, target, sm_scale, loss_coeff, key_ids):
    """The same masked KL loss by plain torch autograd (f64)."""
    logp, _, valid = torch_forward(q, w, k, ids, sm_scale, key_ids)
    t = target.double().clamp_min(CLIP)
    keep = valid & (logp >= -100)
    terms = torch.where(keep, t * (t.log() - logp), torch.zeros_like(t))
    return terms.sum() * loss_coeff / (ids.shape[0] * ids.shape[1])


@unittest.skipUnless(HAS_CUDA, "needs a CUDA device")
class OpsTest(unittest.TestCase):
    def test_opcheck(self):
        q, w, k, ids, target = problem(1, 6, 90, 16, 64, 70, "global", "cuda")
        gl = torch.ones(1, device="cuda")
        ops = torch.ops.dsa_indexer
        logp, _ = ops.sparse_forward(q, w, k, ids, 0.2, "global", "logprobs")
        qg, wg, kg = (x.clone().requires_grad_() for x in (q, w, k))
        cases = [
            (ops.sparse_forward, (q, w, k, ids, 0.2, "global", "probs")),
            (ops.sparse_backward, (q, w, k, target, logp, ids, gl, 0.2, 1.0, "global",
                                   "logprobs", "float32")),
            (ops.kl_loss, (qg, wg, kg, ids, target, 0.2, 1.0, "global")),
            (ops.sparse_backward, (q, w, k, target, logp, ids, gl, 0.2, 1.0, "global",
                                   "logprobs", "float32", True)),
            (ops.kl_loss, (qg, wg, kg, ids, target, 0.2, 1.0, "global", True)),
        ]
        dq = (torch.rand(1, 30, 16, 64, device="cuda") - 0.5).bfloat16()
        dw = (torch.rand(1, 30, 16, device="cuda") - 0.5).bfloat16()
        dk = (torch.rand(1, 30, 64, device="cuda") - 0.5).bfloat16()
        cases.append((ops.dense_forward, (dq, dw, dk, [], [], 0, [], 1, 0.3)))
        for op, args in cases:
            torch.library.opcheck(op, args)

    def test_indexer_loss_gradients_match_torch_autograd(self):
        for key_ids in ("global", "local"):
            q, w, k, ids, target = problem(2, 12, 200, 64, 128, 100, key_ids, "cuda", seed=5)
            leaves = [x.clone().requires_grad_() for x in (q, w, k)]
            loss = indexer_loss(*leaves, ids, target, sm_scale=0.1, loss_coeff=2.0,
                                key_ids=key_ids)
            loss.backward()
            ref = [x.detach().double().requires_grad_() for x in (q, w, k)]
            want = torch_loss(*ref, ids, target, 0.1, 2.0, key_ids)
            want.backward()
            self.assertLess(abs(float(loss) - float(want)), 1e-5 * abs(float(want)))
            for name, a, b in zip(("d_index_q", "d_weights", "d_index_k"), leaves, ref):
                self.assertLess(rel(a.grad, b.grad), 8e-3, name)

    def test_deterministic_loss_gradients_repeat_bit_for_bit(self):
        # Keys shared by many rows (S_k near topk), so the default mode's dK
        # scatter lands in varying orders; the deterministic loss's
        # gradients stay bitwise equal and match plain autograd.
        q, w, k, ids, target = problem(2, 64, 100, 64, 128, 96, "local", "cuda", seed=9)
        grads = []
        for _ in range(3):
            leaves = [x.clone().requires_grad_() for x in (q, w, k)]
            indexer_loss(*leaves, ids, target, sm_scale=0.1, loss_coeff=2.0, key_ids="local",
                         deterministic=True).backward()
            grads.append([x.grad for x in leaves])
        for g in grads[1:]:
            for name, a, b in zip(("d_index_q", "d_weights", "d_index_k"), grads[0], g):
                self.assertTrue(torch.equal(a.view(torch.int16), b.view(torch.int16)), name)
        ref = [x.detach().double().requires_grad_() for x in (q, w, k)]
        torch_loss(*ref, ids, target, 0.1, 2.0, "local").backward()
        for name, a, b in zip(("d_index_q", "d_weights", "d_index_k"), grads[0], ref):
            self.assertLess(rel(a, b.grad), 8e-3, name)

    def test_dense_loss_gradients_match_torch_autograd(self):
        b, s = 1, 96
        q, w, k, causal, attn, l1 = dense_problem(b, s, 64, 128, seed=9)
        leaves = [x.clone().requires_grad_() for x in (q, w, k)]
        loss = dense_indexer_loss(*leaves, attn, l1, sm_scale=0.1)
        loss.backward()
        ref = [x.detach().double().requires_grad_() for x in (q, w, k)]
        sc = torch.einsum("bshd,btd->bsht", ref[0], ref[2]) * 0.1
        logit = (ref[1].unsqueeze(-1) * sc.clamp_min(0)).sum(2)
        masked = torch.where(causal, logit, torch.full_like(logit, -math.inf))
        logp = masked - torch.logsumexp(masked, -1, keepdim=True)
        t = (attn.double() / (l1.double().unsqueeze(-1) + 1e-10)).clamp_min(CLIP)
        keep = causal & (logp >= -100)
        want = torch.where(keep, t * (t.log() - logp), torch.zeros_like(t)).sum() / (b * s)
        want.backward()
        self.assertLess(abs(float(loss) - float(want)), 1e-5 * abs(float(want)))
        for name, a, r in zip(("d_index_q", "d_weights", "d_index_k"), leaves, ref):
            self.assertLess(rel(a.grad, r.grad), 8e-3, name)

    def test_deterministic_dense_loss_gradients_repeat_bit_for_bit(self):
        q, w, k, _, attn, l1 = dense_problem(1, 520, 64, 128, seed=11)
        grads = []
        for _ in range(3):
            leaves = [x.clone().requires_grad_() for x in (q, w, k)]
            dense_indexer_loss(*leaves, attn, l1, sm_scale=0.1, deterministic=True).backward()
            grads.append([x.grad for x in leaves])
        for gr in grads[1:]:
            for name, a, c in zip(("d_index_q", "d_weights", "d_index_k"), grads[0], gr):
                self.assertTrue(torch.equal(a.view(torch.int16), c.view(torch.int16)), name)
        leaves = [x.clone().requires_grad_() for x in (q, w, k)]
        dense_indexer_loss(*leaves, attn, l1, sm_scale=0.1).backward()
        for name, a, c in zip(("d_index_q", "d_weights", "d_index_k"), grads[0], leaves):
            self.assertLess(rel(a, c.grad), 1e-3, name)

    def test_compiled_losses_equal_eager(self):
        q, w, k, ids, target = problem(1, 16, 256, 64, 128, 128, "global", "cuda", seed=2)

        def step(q, w, k):
            return indexer_loss(q, w, k, ids, target, sm_scale=0.1)

        def grads(fn):
            leaves = [x.clone().requires_grad_() for x in (q, w, k)]
            loss = fn(*leaves)
            loss.backward()
            return [loss.detach().clone()] + [x.grad.clone() for x in leaves]

        eager = grads(step)
        for mode in ("default", "reduce-overhead"):
            torch._dynamo.reset()
            compiled = torch.compile(step, fullgraph=True, mode=mode)
            for _ in range(3):  # warm-up, capture, replay
                got = grads(compiled)
            for a, b in zip(got, eager):
                self.assertTrue(torch.equal(a, b) or rel(a, b) < 1e-6, mode)
        # A side stream: the kernels run on the current stream.
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            side = grads(step)
        torch.cuda.synchronize()
        for a, b in zip(side, eager):
            self.assertLess(rel(a, b), 1e-6)


if __name__ == "__main__":
    unittest.main()
