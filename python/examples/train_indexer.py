#!/usr/bin/env python3
"""A small DSA lightning indexer trained with this crate's `indexer_loss`
under `torch.compile(fullgraph=True, mode="reduce-overhead")`, beside the
same module trained with plain torch autograd of the same loss: the loss
curves should match to bf16 rounding (the relative difference is printed
per step).

The module projects token states to the indexer's `index_q` (H x D heads),
`weights` (H) and `index_k` (D); each step selects every query row's top-k
keys by the indexer's own (causal) scores, takes the target from a fixed
"main attention" over the selected keys, and takes one Adam step on the KL
loss. Exits 1 when the worst relative loss difference exceeds
`--tolerance` (bf16 rounding). Needs torch with CUDA and the package;
`--help` needs neither.
"""

import argparse
import math


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--seq", type=int, default=1024, help="tokens S (S_q = S_k)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--topk", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-compile", action="store_true", help="run the crate's side eagerly")
    ap.add_argument("--tolerance", type=float, default=1e-2,
                    help="largest relative loss difference accepted (bf16 inputs); exit 1 above")
    return ap.parse_args()


def main():
    args = parse()
    import torch

    from dsa_indexer_bwd import indexer_loss

    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    s, hid, h, d, topk = args.seq, args.hidden, args.heads, args.dim, args.topk
    sm_scale = d ** -0.5

    class Indexer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wq = torch.nn.Linear(hid, h * d, bias=False)
            self.ww = torch.nn.Linear(hid, h, bias=False)
            self.wk = torch.nn.Linear(hid, d, bias=False)

        def forward(self, x):
            q = self.wq(x).view(1, s, h, d).to(torch.bfloat16)
            w = (self.ww(x) * h ** -0.5).view(1, s, h).to(torch.bfloat16)
            k = self.wk(x).view(1, s, d).to(torch.bfloat16)
            return q, w, k

    x = torch.randn(s, hid, device=dev)
    causal = torch.tril(torch.ones(s, s, dtype=torch.bool, device=dev))
    # The fixed main attention the indexer learns to imitate.
    att_logits = torch.randn(s, s, device=dev) * 3
    att = torch.softmax(att_logits.masked_fill(~causal, -math.inf), -1)

    def select(q, w, k):
        """Each row's top-k keys by the indexer's own causal scores (-1 where
        a row sees fewer), and the main attention over them as the target."""
        with torch.no_grad():
            sc = torch.einsum("shd,td->sht", q[0].float(), k[0].float()) * sm_scale
            logit = (w[0].float().unsqueeze(-1) * sc.relu()).sum(1)
            logit = logit.masked_fill(~causal, -math.inf)
            vals, ids = logit.topk(topk, dim=-1)
            ids = torch.where(torch.isfinite(vals), ids, torch.full_like(ids, -1))
            t = torch.gather(att, 1, ids.clamp_min(0)) * (ids >= 0)
            t = t / t.sum(-1, keepdim=True)
        return ids.view(1, s, topk), t.view(1, s, topk).contiguous()

    def torch_loss(q, w, k, ids, target):
        """The same loss by plain torch autograd (gathers K per slot)."""
        valid = ids >= 0
        kk = k[0][ids[0].clamp_min(0)].float()  # (S, topk, D)
        sc = torch.einsum("shd,std->sht", q[0].float(), kk) * sm_scale
        logit = (w[0].float().unsqueeze(-1) * sc.relu()).sum(1).unsqueeze(0)
        logit = logit.masked_fill(~valid, -math.inf)
        logp = logit - torch.logsumexp(logit, -1, keepdim=True)
        tt = target.clamp_min(math.exp(-100))
        keep = valid & (logp >= -100)
        terms = torch.where(keep, tt * (tt.log() - logp), torch.zeros_like(tt))
        return terms.sum() / s

    def crate_loss(q, w, k, ids, target):
        return indexer_loss(q, w, k, ids, target, sm_scale=sm_scale)

    a, b = Indexer().to(dev), Indexer().to(dev)
    b.load_state_dict(a.state_dict())
    opt_a = torch.optim.Adam(a.parameters(), lr=args.lr)
    opt_b = torch.optim.Adam(b.parameters(), lr=args.lr)

    def step_a(x, ids, target):
        q, w, k = a(x)
        return crate_loss(q, w, k, ids, target)

    run_a = step_a if args.no_compile else torch.compile(
        step_a, fullgraph=True, mode="reduce-overhead")
    print(f"GPU {torch.cuda.get_device_name()}; torch {torch.__version__}; S={s} H={h} D={d} "
          f"topk={topk}; crate side {'eager' if args.no_compile else 'compiled (fullgraph, reduce-overhead)'}")
    worst = 0.0
    for step in range(args.steps):
        with torch.no_grad():
            ids, target = select(*a(x))
        opt_a.zero_grad(set_to_none=True)
        la = run_a(x, ids, target)
        la.backward()
        opt_a.step()
        opt_b.zero_grad(set_to_none=True)
        lb = torch_loss(*b(x), ids, target)
        lb.backward()
        opt_b.step()
        fa, fb = float(la), float(lb)
        diff = abs(fa - fb) / max(abs(fb), 1e-30)
        worst = max(worst, diff)
        print(f"step {step:3d}: loss crate {fa:.6f}  torch {fb:.6f}  rel diff {diff:.2e}")
    print(f"worst relative difference over {args.steps} steps: {worst:.2e} "
          f"(tolerance {args.tolerance:.0e})")
    if not worst <= args.tolerance:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
