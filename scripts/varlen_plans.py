#!/usr/bin/env python3
"""Plans in a packed variable-length loop, from Python: per-call time of
``indexer_backward`` when the length T changes every step, against a loop of
one fixed T, and the host time of a call.

A benchmark (it prints numbers; nothing fails on a time). Three loops on one
GPU, B = 1, H = 64, D = 128, S_q = S_k = T, global uniform ids, f32 dK:

1. varlen: T drawn anew every step from [T0 - SPAN, T0] (so nearly every
   step needs a plan for a shape it has not seen), --steps steps;
2. fixed: T = T0 - SPAN / 2 (the varlen loop's mean) every step;
3. host: --host-calls back-to-back calls of a small problem, no
   synchronisation: the host time of one call; and the time of building
   one native plan of a new shape from Python.

Loops 1 and 2 synchronise after every call and time call + synchronise with
a host clock, so a plan build or a JIT stall in a step shows in that step.
The very first call of the process (which loads the kernel module) is
reported apart; then both loops run in two halves, in the order fixed,
varlen, varlen, fixed, so that a drift of the GPU's clocks over the run
weighs on both alike. The comparison: mean, median, p99 and max per call,
and the ratio varlen / fixed of the means.

Needs torch with CUDA and the package (``pip install ./python``); ``--help``
needs neither.
"""

import argparse
import statistics
import time


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--t0", type=int, default=8192, help="largest T (default 8192)")
    ap.add_argument("--span", type=int, default=256, help="T drawn from [t0 - span, t0]")
    ap.add_argument("--topk", type=int, default=512)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--host-calls", type=int, default=500)
    ap.add_argument("--seed", type=int, default=2026)
    return ap.parse_args()


def summary(name, times_us):
    """Prints the statistics of ``times_us[1:]``; returns their mean."""
    first, rest = times_us[0], sorted(times_us[1:])
    mean = statistics.fmean(rest)
    p99 = rest[min(len(rest) - 1, round(0.99 * (len(rest) - 1)))]
    print(
        f"{name}: {len(rest)} calls after the first: mean {mean:.1f} us, "
        f"median {statistics.median(rest):.1f} us, p99 {p99:.1f} us, max {rest[-1]:.1f} us"
    )
    return mean


def main():
    args = parse()
    import torch

    import dsa_indexer_bwd as dib

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    h, d, topk, tmax = 64, 128, args.topk, args.t0
    tmin = tmax - args.span
    assert topk <= tmin, "every row's ids are drawn among the first t0 - span keys"

    def uniform(*shape):
        return (torch.rand(*shape, generator=gen, device=dev) * 2 - 1).to(torch.bfloat16)

    # Inputs for the largest T; a step of length T takes the first T rows.
    q = uniform(1, tmax, h, d)
    w = uniform(1, tmax, h)
    k = uniform(1, tmax, d)
    ids = torch.rand(tmax, tmin, generator=gen, device=dev).argsort(dim=1)[:, :topk]
    ids = ids.to(torch.int32).reshape(1, tmax, topk).contiguous()
    logits = torch.randn(2, 1, tmax, topk, generator=gen, device=dev)
    attn_all, score_all = torch.softmax(logits, dim=-1).unbind(0)
    grad_loss = torch.ones(1, device=dev)

    def call(t):
        return dib.indexer_backward(
            q[:, :t], w[:, :t], k[:, :t], attn_all[:, :t].clone(), score_all[:, :t],
            ids[:, :t], grad_loss,
        )

    def loop(lengths):
        times = []
        for t in lengths:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            call(t)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e6)
        return times

    rng = torch.Generator().manual_seed(args.seed)
    varlen_t = torch.randint(tmin, tmax + 1, (args.steps,), generator=rng).tolist()
    fixed_t = [tmax - args.span // 2] * args.steps
    print(
        f"GPU {torch.cuda.get_device_name()}; torch {torch.__version__}; B=1 H={h} D={d} "
        f"topk={topk}; varlen T in [{tmin}, {tmax}] ({len(set(varlen_t))} distinct T in "
        f"{args.steps} steps), fixed T={fixed_t[0]}; plan cache capacity "
        f"{dib.PLAN_CACHE_CAPACITY}"
    )
    dib.clear_plan_cache()
    first = loop([fixed_t[0]])[0]
    print(f"first call of the process (loads the kernel module): {first / 1e3:.2f} ms")
    half = args.steps // 2
    fixed, varlen = loop(fixed_t[:half]), loop(varlen_t[:half])
    varlen += loop(varlen_t[half:])
    fixed += loop(fixed_t[half:])
    print(f"plans cached after the loops: {dib.plan_cache_size()}")
    v = summary("varlen loop", [first] + varlen)
    f = summary("fixed loop", [first] + fixed)
    print(f"varlen / fixed per-call time (mean after the first call): {v / f:.4f}")

    # One native plan of a new shape, built from Python (what a varlen step
    # pays on top of a fixed one).
    times = []
    for t in range(tmin - 200, tmin):
        t0 = time.perf_counter()
        dib._native.Plan(0, (1, t, t, h, d, topk), 1.0, "global", "probs", "float32",
                         "bfloat16", "auto")
        times.append((time.perf_counter() - t0) * 1e6)
    times.sort()
    print(f"native plan of a new shape from Python: median {times[100]:.1f} us, "
          f"max {times[-1]:.1f} us (200 shapes)")

    # Host time: a small problem, back-to-back calls, no synchronisation.
    t = 256
    call(t)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.host_calls):
        call(t)
    host = (time.perf_counter() - t0) / args.host_calls * 1e6
    torch.cuda.synchronize()
    print(f"host time per call (T={t}, {args.host_calls} calls, no sync): {host:.1f} us")


if __name__ == "__main__":
    main()
