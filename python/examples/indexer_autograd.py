"""A small lightning indexer trained with its KL loss, whose backward is
``dsa_indexer_bwd.indexer_backward`` (a ``torch.autograd.Function``).

The module projects hidden states to the indexer's q (B, S, H, D), weights
(B, S, H) and k (B, S, D), picks each query's top-k causal keys from its own
scores, and returns the loss against the main attention's distribution over
those keys. Autograd reaches the projections through the Function's
backward, which returns the crate's ``d_index_q``, ``d_weights`` and
``d_index_k``.

Run on a machine with a CUDA GPU (it falls back to the CPU path on CPU
tensors, slowly): it trains a few steps and checks one step's parameter
gradients against plain torch autograd of the same loss.

    python python/examples/indexer_autograd.py
"""

import math

import torch
from torch import nn

from dsa_indexer_bwd import indexer_backward

CLIP = math.exp(-100.0)


def indexer_logits(q, w, k, ids, sm_scale):
    """The forward for the selected keys: ``logit[b,s,t] = sum_h w[b,s,h] *
    relu(sm_scale * q[b,s,h,:] . k[n,:])`` with ``n = ids[b,s,t]`` a global row
    of k seen as (B*S_k, D); padding slots (invalid ids) get -inf. In f32."""
    b, _, _, d = q.shape
    rows = b * k.shape[1]
    ids = ids.long()
    valid = (ids >= 0) & (ids < rows)
    kg = k.reshape(rows, d)[torch.where(valid, ids, torch.zeros_like(ids))]
    s = torch.relu(sm_scale * torch.einsum("bshd,bstd->bsht", q.float(), kg.float()))
    logits = torch.einsum("bsh,bsht->bst", w.float(), s)
    return logits.masked_fill(~valid, float("-inf"))


def kl_loss(logp, target, loss_coeff):
    """The loss the crate differentiates (docs/spec.md): per row, the cross
    entropy of the clipped targets against the predicted log-probabilities,
    over the slots whose log-probability is at least -100, times
    ``loss_coeff / (B*S_q)``. It differs from KL(target || predict) by a
    constant, so the gradients are the KL loss's."""
    live = logp >= -100.0
    ce = -(target.clamp_min(CLIP) * torch.where(live, logp, torch.zeros_like(logp))).sum()
    return ce * loss_coeff / (logp.shape[0] * logp.shape[1])


class IndexerKLLoss(torch.autograd.Function):
    """loss = kl_loss(log_softmax(indexer_logits(q, w, k, ids)), target)."""

    @staticmethod
    def forward(ctx, q, w, k, topk_ids, target, sm_scale, loss_coeff):
        with torch.no_grad():
            logp = torch.log_softmax(indexer_logits(q, w, k, topk_ids, sm_scale), -1)
            loss = kl_loss(logp, target, loss_coeff)
        ctx.save_for_backward(q, w, k, topk_ids, target, logp)
        ctx.sm_scale, ctx.loss_coeff = sm_scale, loss_coeff
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        q, w, k, topk_ids, target, logp = ctx.saved_tensors
        # The default inplace=False writes grad_signal into a copy: `target`
        # is a saved tensor and stays intact.
        g = indexer_backward(
            q, w, k, target, logp, topk_ids, grad_loss,
            sm_scale=ctx.sm_scale, loss_coeff=ctx.loss_coeff, score="logprobs",
            d_index_k_dtype=k.dtype, d_weights_dtype=w.dtype,
        )
        return g.d_index_q, g.d_weights, g.d_index_k, None, None, None, None


class LightningIndexer(nn.Module):
    def __init__(self, dim, heads=64, head_dim=128, topk=64):
        super().__init__()
        self.heads, self.head_dim, self.topk = heads, head_dim, topk
        self.wq = nn.Linear(dim, heads * head_dim, bias=False)
        self.wk = nn.Linear(dim, head_dim, bias=False)
        self.ww = nn.Linear(dim, heads, bias=False)
        self.sm_scale = head_dim ** -0.5

    def project(self, x):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.heads, self.head_dim).contiguous()
        return q, self.ww(x).contiguous(), self.wk(x).contiguous()

    @torch.no_grad()
    def select(self, q, w, k):
        """Each query's top-k causal keys by the indexer's own score, as
        global ids; -1 where a query has fewer than topk visible keys."""
        b, s = q.shape[:2]
        scores = torch.einsum("bsh,bsht->bst", w.float(), torch.relu(
            self.sm_scale * torch.einsum("bshd,btd->bsht", q.float(), k.float())))
        causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        top = scores.topk(min(self.topk, s), dim=-1)
        ids = top.indices + (torch.arange(b, device=q.device) * s).view(b, 1, 1)
        ids = ids.masked_fill(top.values == float("-inf"), -1)
        if ids.shape[-1] < self.topk:
            ids = torch.nn.functional.pad(ids, (0, self.topk - ids.shape[-1]), value=-1)
        return ids.contiguous()

    def forward(self, x, target_of, loss_coeff=1.0, use_crate=True):
        """Loss for hidden states ``x`` (B, S, dim); ``target_of(ids)`` gives the
        main attention's distribution (B, S, topk) over the chosen keys."""
        q, w, k = self.project(x)
        ids = self.select(q, w, k)
        target = target_of(ids)
        if use_crate:
            return IndexerKLLoss.apply(q, w, k, ids, target, self.sm_scale, loss_coeff)
        logp = torch.log_softmax(indexer_logits(q, w, k, ids, self.sm_scale), -1)
        return kl_loss(logp, target, loss_coeff)


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16
    b, s, dim = 2, 256, 256
    model = LightningIndexer(dim).to(device, dtype)
    x = torch.randn(b, s, dim, device=device, dtype=dtype)
    # A stand-in for the main attention: a fixed random distribution over
    # each query's chosen keys, zero on padding.
    noise = torch.randn(b, s, model.topk, device=device)

    def target_of(ids):
        return torch.softmax(noise.masked_fill(ids < 0, float("-inf")), -1).contiguous()

    grads = []
    for use_crate in (True, False):
        model.zero_grad()
        model(x, target_of, use_crate=use_crate).backward()
        grads.append({n: p.grad.float().clone() for n, p in model.named_parameters()})
    for n in grads[0]:
        e = ((grads[0][n] - grads[1][n]).norm() / grads[1][n].norm()).item()
        print(f"{n}: crate vs torch autograd, relative error {e:.2e}")
        # Both sides round d_index_k to bf16 before the wk product, whose
        # sum over all rows cancels strongly: a few 1e-2 there is expected.
        assert e < 5e-2, n

    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(5):
        opt.zero_grad()
        loss = model(x, target_of)
        loss.backward()
        opt.step()
        print(f"step {step}: loss {loss.item():.5f}")


if __name__ == "__main__":
    main()
