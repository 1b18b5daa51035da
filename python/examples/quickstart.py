"""One backward (on the GPU when there is one, else the CPU path), checked
against torch autograd of the same loss."""
import torch
from dsa_indexer_bwd import indexer_backward

dev = "cuda" if torch.cuda.is_available() else "cpu"
B, S, H, D, TOPK = 1, 256, 64, 128, 128
scale = D**-0.5
q, w, k = (torch.randn(*s, device=dev).bfloat16() for s in [(B, S, H, D), (B, S, H), (B, S, D)])
ids = torch.randint(0, S, (B, S, TOPK), device=dev)  # int64 key ids (global: B = 1)
target = torch.softmax(torch.randn(B, S, TOPK, device=dev), -1)  # the main attention's distribution
qf, wf, kf = (t.float().requires_grad_() for t in (q, w, k))
logits = torch.einsum("bsh,bsht->bst", wf, torch.relu(scale * torch.einsum("bshd,bstd->bsht", qf, kf[0][ids])))
logp = torch.log_softmax(logits, -1)
(-(target * logp).sum() / (B * S)).backward()  # the KL loss up to a constant; grad_loss = 1
out = indexer_backward(q, w, k, target, logp.detach(), ids, 1.0, sm_scale=scale, score="logprobs")
print(f"ran on {dev}")
for name, got, want in [("d_index_q", out.d_index_q, qf.grad), ("d_weights", out.d_weights, wf.grad), ("d_index_k", out.d_index_k, kf.grad)]:
    print(f"{name}: relative error {((got.float() - want).norm() / want.norm()).item():.2e}")
