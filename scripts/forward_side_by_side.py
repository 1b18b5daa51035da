#!/usr/bin/env python3
"""Side by side, the forward: cuDNN-frontend's SparseIndexerScoreRecompute
against this crate's `indexer_forward`, then each forward followed by its
own backward (cuDNN's IndexerBackward, this crate's `indexer_backward`), on
identical tensors, in one run on one GPU.

For each case of side_by_side.py (SPEC's "Performance workload": B=1,
S_q=8192, S_k=4096, H=64, D=128, topk 128..2048, "uniform", "ragged" and
"topk" ids; the long-context cases with --long-context on):

1. draws the inputs on the GPU with torch (side_by_side.py's recipes);
2. computes the forward's reference in f64 on the GPU in chunks of rows
   (docs/spec.md, "Forward": the softmax over each row's valid slots of
   `sum_h w[h] relu(sm_scale q[h] . k[id])`, 0 at padding);
3. times each forward with CUDA events two ways: "eager", the events
   around the Python call (the host's launch cost counts where the GPU
   waits for it, as a training step without graphs sees it), and
   "device", the stream held busy by `torch.cuda._sleep` before the
   start event so the call is queued before the GPU reaches it (the
   kernels' own time);
4. times forward then backward the same two ways: cuDNN's recompute
   feeding its IndexerBackward, this crate's `indexer_forward` feeding
   `indexer_backward` (in place: `attn_score`, overwritten by
   grad_signal on both sides, is restored before each run outside the
   timed region);
5. prints one Markdown table per part (medians, the ratio cuDNN / this
   crate, the forward's relative Frobenius error against the reference)
   and, with --json, writes JSON lines.

cuDNN's recompute has no scale (`sm_scale` must be 1, the default) and no
log-sum-exp output; this crate's `indexer_forward` returns both the
probabilities and the lse. The dK accumulator: cuDNN's IndexerBackward
adds into d_index_k (its caller zeroes it, outside its time: that zeroing
is done before each run here); this crate's zeroes its accumulator inside.
Needs torch with CUDA, this crate's Python package (`pip install ./python`)
and, for the cuDNN columns, nvidia-cudnn-frontend 1.32 (`import cudnn`);
`--help` needs none of them.
"""

import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from side_by_side import (  # noqa: E402 - the sparse script's helpers (stdlib only at import)
    build_cases,
    case_name,
    cudnn_indexer_backward,
    draw_inputs,
    gathered_chunks,
    median_event_us,
    parse_args,
)

# SPEC's forward tolerance (relative Frobenius error of the finite entries).
FORWARD_TOLERANCE = 1e-5
# GPU cycles of the sleep that keeps the stream busy while a "device"
# timed call is queued (about 2.5 ms at the H200's clocks).
SLEEP_CYCLES = 5_000_000


def reference_forward(torch, x, sm_scale):
    """SPEC's forward (probabilities) in f64 on the GPU, in chunks of rows."""
    q, w, k, ids = x["index_q"], x["weights"], x["index_k"], x["topk_indices"]
    b_n, sq, h, _ = q.shape
    out = torch.zeros(b_n, sq, ids.shape[-1], dtype=torch.float64, device=q.device)
    for b, s0, s1, _, valid, kg in gathered_chunks(torch, k, ids, torch.float64, h):
        s = sm_scale * torch.einsum("chd,ctd->cht", q[b, s0:s1].double(), kg)
        logit = (s.clamp_min(0) * w[b, s0:s1].double()[:, :, None]).sum(1)
        logit = logit.masked_fill(~valid, -math.inf)
        out[b, s0:s1] = torch.softmax(logit, -1).nan_to_num(0.0)
        del kg, s
    return out


def forward_error(torch, got, ref):
    """Relative Frobenius error over the reference's finite entries."""
    x, r = got.double().reshape(-1), ref.reshape(-1)
    if not torch.isfinite(x).all():
        return math.inf
    den = r.norm().item()
    num = (x - r).norm().item()
    return num / den if den else num


def timed(torch, fn, before, runs, warmup):
    """`{"eager": median, "device": median}` of `fn` in us (see the module
    docs; `device` is None without `torch.cuda._sleep`); `before` runs
    untimed ahead of every call."""
    sleep = getattr(torch.cuda, "_sleep", None)
    out = {"eager": median_event_us(torch, fn, before, runs, warmup)[0], "device": None}
    if sleep is not None:
        def busy():
            before()
            sleep(SLEEP_CYCLES)

        out["device"] = median_event_us(torch, fn, busy, runs, warmup)[0]
    return out


def run_cudnn(torch, x, a):
    """cuDNN's recompute alone, then recompute + IndexerBackward."""
    try:
        from cudnn.deepseek_sparse_attention import IndexerBackward, SparseIndexerScoreRecompute
    except Exception as e:  # noqa: BLE001 - reported, the case goes on
        return {"error": f"import: {type(e).__name__}: {e}"}
    q, w, k, ids = x["index_q"], x["weights"], x["index_k"], x["topk_indices"]
    attn = x["attn_score"]
    try:
        predict = torch.empty(ids.shape, dtype=torch.float32, device=q.device)
        rec = SparseIndexerScoreRecompute(
            sample_q_indexer=q, sample_k_indexer=k, sample_weights=w, sample_topk_indices=ids,
            sample_out=predict, topk_indices_global=True)
        rec.check_support()
        rec.compile()

        def forward():
            rec.execute(q, k, w, ids, predict)

        res = {"forward": timed(torch, forward, lambda: None, a.runs, a.warmup)}
        forward()
        torch.cuda.synchronize()
        res["predict"] = predict.clone()

        backward, out = cudnn_indexer_backward(torch, IndexerBackward, x, predict, a)

        def both():
            rec.execute(q, k, w, ids, predict)
            backward()

        def restore():
            out["grad_signal"].copy_(attn)
            out["d_index_k"].zero_()

        res["both"] = timed(torch, both, restore, a.runs, a.warmup)
        del rec, backward, out
        return res
    except Exception as e:  # noqa: BLE001 - unsupported shape, memory, ...
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}


def run_crate(torch, x, a):
    """This crate's forward alone, then forward + backward."""
    try:
        import dsa_indexer_bwd as dib
    except Exception as e:  # noqa: BLE001
        return {"error": f"import: {type(e).__name__}: {e}"}
    q, w, k, ids = x["index_q"], x["weights"], x["index_k"], x["topk_indices"]
    attn = x["attn_score"]
    dk_dtype = torch.float32 if a.dk == "f32" else torch.bfloat16
    try:
        def forward():
            return dib.indexer_forward(q, w, k, ids, sm_scale=a.sm_scale, key_ids="global")

        res = {"forward": timed(torch, forward, lambda: None, a.runs, a.warmup)}
        res["predict"] = forward().index_score.clone()
        work = attn.clone()

        def both():
            s = forward()
            dib.indexer_backward(q, w, k, work, s.index_score, ids, x["grad_loss"],
                                 sm_scale=a.sm_scale, loss_coeff=a.loss_coeff, key_ids="global",
                                 d_index_k_dtype=dk_dtype, inplace=True, trust_ids=True)

        res["both"] = timed(torch, both, lambda: work.copy_(attn), a.runs, a.warmup)
        del work
        return res
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}


def run_case(torch, a, c, i):
    name = case_name(c)
    print(f"[{i}] {name}: drawing inputs", file=sys.stderr, flush=True)
    x = draw_inputs(torch, c, a.seed + i, "cuda")
    ref = reference_forward(torch, x, a.sm_scale)
    row = {"case": name, "shape": dict(c, batch=1),
           "valid_slots": int((x["topk_indices"] >= 0).sum().item())}
    sides = {}
    for side, run in (("cudnn", run_cudnn), ("crate", run_crate)):
        if side == "cudnn" and a.no_cudnn:
            sides[side] = {"error": "skipped (--no-cudnn)"}
            continue
        print(f"[{i}] {name}: {side}", file=sys.stderr, flush=True)
        r = run(torch, x, a)
        if "predict" in r:
            r["error_forward"] = forward_error(torch, r.pop("predict"), ref)
            r["over"] = not r["error_forward"] <= FORWARD_TOLERANCE
        sides[side] = r
        torch.cuda.empty_cache()
    row.update(sides)
    del x, ref
    torch.cuda.empty_cache()
    return row


def cell(side, part, mode):
    v = side.get(part, {}).get(mode)
    return f"{v:.0f}" if v is not None else "-"


def ratio(row, part, mode):
    cu, me = row["cudnn"].get(part, {}).get(mode), row["crate"].get(part, {}).get(mode)
    return f"{cu / me:.2f}" if cu and me else "-"


def tables(rows):
    out = []
    for part, title in (("forward", "forward"), ("both", "forward + backward")):
        out += [f"\n{title} (us; eager: events around the Python call; device: queued behind a "
                "sleep)\n",
                "| case | cuDNN eager | this crate eager | cuDNN / this | cuDNN device "
                "| this crate device | cuDNN / this | forward error cuDNN / this crate | notes |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            cu, me = r["cudnn"], r["crate"]
            errs = " / ".join(f"{s['error_forward']:.1e}" if "error_forward" in s else "-"
                              for s in (cu, me))
            notes = [f"{who}: {s['error'][:120]}" for who, s in (("cuDNN", cu), ("crate", me))
                     if "error" in s]
            notes += [f"{who} forward over {FORWARD_TOLERANCE:g}" for who, s in
                      (("cuDNN", cu), ("crate", me)) if s.get("over")]
            out.append(f"| {r['case']} | {cell(cu, part, 'eager')} | {cell(me, part, 'eager')} "
                       f"| {ratio(r, part, 'eager')} | {cell(cu, part, 'device')} "
                       f"| {cell(me, part, 'device')} | {ratio(r, part, 'device')} | {errs} "
                       f"| {'; '.join(notes)} |")
    return "\n".join(out)


def main(argv=None):
    a = parse_args(argv, doc=__doc__, script="forward_side_by_side.py")
    import torch  # after parsing: --help needs no torch

    if not torch.cuda.is_available():
        sys.exit("forward_side_by_side: no CUDA device visible to torch")
    if a.sm_scale != 1.0 and not a.no_cudnn:
        sys.exit("forward_side_by_side: cuDNN's recompute has no scale: use --sm-scale 1 "
                 "(or --no-cudnn)")
    cases = build_cases(a)
    print(f"GPU {torch.cuda.get_device_name()}; torch {torch.__version__}; {len(cases)} cases; "
          f"{a.runs} runs after {a.warmup} warm-ups; d_index_k {a.dk}", flush=True)
    rows = []
    jf = open(a.json, "w") if a.json else None
    try:
        for i, c in enumerate(cases):
            rows.append(run_case(torch, a, c, i))
            if jf:
                clean = {k: v for k, v in rows[-1].items()}
                jf.write(json.dumps(clean, default=str) + "\n")
                jf.flush()
    finally:
        if jf:
            jf.close()
    print(tables(rows))


if __name__ == "__main__":
    main()
