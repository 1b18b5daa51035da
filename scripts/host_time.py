#!/usr/bin/env python3
"""Host time of one `indexer_backward` call from Python, and where it goes.

A benchmark (it prints numbers; nothing fails on a time). On one GPU, a
small problem (B = 1, S_q = S_k = 256, H = 64, D = 128, topk 512, global
uniform ids, f32 dK) so the kernels take less than the host:

- `indexer_backward`: host time per call over 500 calls in bursts of 50
  (a synchronisation between bursts, none inside one, so the launch queue
  never fills), then 500 calls back to back;
- the same through the torch.library operator `dsa_indexer::sparse_backward`;
- the parts of a call: the tensor checks (remembered by signature, and the
  full checks of a first call), the option checks, the raw current stream,
  the native `execute` (checks and launches), the four output tensors;
- the floors of this host: one `torch.empty`, one `clone`, one one-kernel
  torch operation, `torch.cuda.current_stream`, `data_ptr`.

Needs torch with CUDA and the package (`pip install ./python`); `--help`
needs neither.
"""

import argparse
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--burst", type=int, default=50)
    args = ap.parse_args()
    import torch

    import dsa_indexer_bwd as dib
    from dsa_indexer_bwd import _checks as C
    from dsa_indexer_bwd import _torch as T

    dev = torch.device("cuda")
    torch.manual_seed(0)
    t, h, d, topk = 256, 64, 128, 512
    q = torch.randn(1, t, h, d, device=dev).bfloat16()
    w = torch.randn(1, t, h, device=dev).bfloat16()
    k = torch.randn(1, t, d, device=dev).bfloat16()
    ids = torch.randint(0, t, (1, t, topk), device=dev, dtype=torch.int32)
    attn = torch.softmax(torch.randn(1, t, topk, device=dev), -1)
    score = torch.softmax(torch.randn(1, t, topk, device=dev), -1)
    gl = torch.ones(1, device=dev)

    def host(f):
        """Host microseconds per call of `f`, in bursts (see the docs)."""
        f()
        torch.cuda.synchronize()
        total = 0.0
        for _ in range(args.calls // args.burst):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.burst):
                f()
            total += time.perf_counter() - t0
        torch.cuda.synchronize()
        return total / (args.calls // args.burst * args.burst) * 1e6

    def call():
        return dib.indexer_backward(q, w, k, attn, score, ids, gl)

    print(f"GPU {torch.cuda.get_device_name()}; torch {torch.__version__}; B=1 S={t} H={h} "
          f"D={d} topk={topk}")
    print(f"indexer_backward: host {host(call):.1f} us per call (bursts of {args.burst})")
    call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.calls):
        call()
    back = (time.perf_counter() - t0) / args.calls * 1e6
    torch.cuda.synchronize()
    print(f"indexer_backward: host {back:.1f} us per call ({args.calls} back to back, no sync)")
    op = torch.ops.dsa_indexer.sparse_backward
    print(f"dsa_indexer::sparse_backward: host "
          f"{host(lambda: op(q, w, k, attn, score, ids, gl, 1.0, 1.0, 'global', 'probs', 'float32')):.1f} us")

    ts = (q, w, k, attn, score, ids)
    names = T._NAMES[C.check_tensors]
    print("parts of a call:")
    print(f"  tensor checks, known signature: {host(lambda: T._checked(C.check_tensors, ts)):.2f} us")
    print(f"  tensor checks, in full: {host(lambda: C.check_tensors(dict(zip(names, ts)))):.2f} us")
    raw = (1.0, 1.0, "global", "probs", torch.float32, torch.bfloat16, "auto")
    print(f"  option checks: {host(lambda: T._checked_options(*raw)):.2f} us")
    print(f"  raw current stream: {host(lambda: T._raw_stream(0)):.2f} us")
    dims, _ = C.check_tensors(dict(zip(names, ts)))
    plan, _ = T._plan(0, dims, C.check_options(*raw))
    gs, dq, dw = attn.clone(), torch.empty_like(q), torch.empty_like(w)
    dk = torch.empty(k.shape, dtype=torch.float32, device=dev)
    wsb = plan.workspace_bytes
    ws = torch.empty(max(wsb, 1), dtype=torch.uint8, device=dev)
    argv = (T._raw_stream(0), q.data_ptr(), w.data_ptr(), k.data_ptr(), score.data_ptr(),
            ids.data_ptr(), gl.data_ptr(), gs.data_ptr(), dq.data_ptr(), dw.data_ptr(),
            dk.data_ptr(), ws.data_ptr() if wsb else 0, wsb, 1.0, "bfloat16", "float32", False)
    print(f"  native execute (checks, launches): {host(lambda: plan.execute(*argv)):.2f} us")

    def outputs():
        return (torch.empty(q.shape, dtype=torch.bfloat16, device=dev),
                torch.empty(w.shape, dtype=torch.bfloat16, device=dev),
                torch.empty(k.shape, dtype=torch.float32, device=dev), attn.detach().clone())

    print(f"  the four outputs (three empty, grad_signal a clone): {host(outputs):.2f} us")
    print("floors of this host:")
    print(f"  torch.empty: {host(lambda: torch.empty(q.shape, dtype=torch.bfloat16, device=dev)):.2f} us")
    print(f"  clone: {host(lambda: attn.clone()):.2f} us")
    xs = torch.randn(64, device=dev)
    print(f"  one-kernel torch op (add_): {host(lambda: xs.add_(1.0)):.2f} us")
    print(f"  torch.cuda.current_stream: {host(lambda: torch.cuda.current_stream(dev).cuda_stream):.2f} us")
    print(f"  data_ptr: {host(lambda: q.data_ptr()):.3f} us")


if __name__ == "__main__":
    main()
