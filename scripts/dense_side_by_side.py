#!/usr/bin/env python3
"""Side by side, dense mode: cuDNN-frontend's DenseIndexerBackward and this
crate's `indexer-bench --dense-input`, on identical tensors, in one run on
one GPU.

For each case (causal, ratio 1 and q_offset 0 unless --ratio says
otherwise, H=64, D=128: BSHD with B=1 and S_q = S_k in {4096, 8192}, then
one packed variable-length batch, cu_seqlens_q = cu_seqlens_k =
[0, 1000, 3048, 7000, 8192]):

1. draws the inputs on the GPU with torch;
2. times cuDNN-frontend's DenseIndexerBackward with CUDA events (median of
   --runs after --warmup; index_score, which it overwrites with
   grad_signal, is restored before every run, outside the timed region),
   then runs it once more on zeroed outputs for its results;
3. writes the same tensors to a .safetensors file (the names of
   `indexer-dense-replay`) and runs `indexer-bench --dense-input FILE
   --output OUT --runs N` (same method);
4. reads OUT back and computes SPEC's dense math in f64 (or f32) on the
   GPU in chunks of rows, independently of the Rust code; prints the
   relative Frobenius error of each output of both implementations,
   flagged where over SPEC's tolerance;
5. prints one Markdown table (case, cuDNN us, this crate us, ratio
   cuDNN / this crate, errors) and, with --json, writes JSON lines.

A case cuDNN does not support (or that fails) is reported as such; the
crate's side still runs. Needs torch with CUDA and, for the cuDNN column,
nvidia-cudnn-frontend 1.32 (`import cudnn`); `--help` needs neither.

Inputs: q, k, weights uniform in [-1, 1] (bf16); index_score raw logits,
2 x standard normal, with index_lse their row log-sum-exp over the
visible columns j < L; attn_score the softmax of standard-normal logits
over the visible columns times H (the shape of a main attention's
probabilities summed over H heads; rows sum to about H, so the division
by attn_l1norm matters), attn_l1norm its row sums; grad_loss 1, sm_scale
and loss_coeff from the flags (default 1).

cuDNN's dense API takes SPEC's inputs as they are (raw logits and their
lse, raw attention mass and its row sums; c = loss_coeff / (B*S_q), or
/ T_q when packed, times grad_loss read on the device; ratio and
cu_seqlens as SPEC has them; packed score tensors (T_q, max_seqlen_k)).
One difference is adapted here: past a row's visible columns cuDNN writes
grad_signal's zeros only up to the next multiple of its block_I (128) and
leaves the rest of the row as it was, where SPEC (and this crate) write 0
at every column j >= L. So index_score holds 0 at every column a row does
not see; then both leave the same tensor and grad_signal is compared
whole. Both timed calls include their own zeroing of the f32 dK
accumulator (cuDNN memsets it inside execute) and, with --dk bf16, the
cast. As in side_by_side.py, the events bracket the Python call, so
cuDNN's host-side launch cost counts where the GPU waits for it.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from side_by_side import (  # noqa: E402 - the sparse script's helpers (stdlib only at import)
    OUTPUTS,
    default_bench,
    median_event_us,
    over_tolerance,
    read_safetensors,
    rel_errors,
    row_chunk,
    run_cases,
    write_safetensors,
)
from side_by_side import json_record as sbs_json_record  # noqa: E402
from side_by_side import table as sbs_table  # noqa: E402

SEQS = [4096, 8192]
CU_SEQLENS = [0, 1000, 3048, 7000, 8192]
LOGIT_SCALE = 2.0
BLOCK_I = 128  # cuDNN's block of key columns (its default)


# ---------------------------------------------------------------- arguments


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: python3 scripts/dense_side_by_side.py --bench bundle/bin/indexer-bench "
               "--runs 30 --json dense.jsonl",
    )
    csv_int = lambda s: [int(x) for x in s.split(",") if x]
    p.add_argument("--seqs", type=csv_int, default=SEQS, help="S_q = S_k of the BSHD cases (default 4096,8192)")
    p.add_argument("--cu-seqlens", type=csv_int, default=CU_SEQLENS,
                   help="cu_seqlens_q = cu_seqlens_k of the packed case (default 0,1000,3048,7000,8192)")
    p.add_argument("--packed", choices=["on", "off", "only"], default="on",
                   help="the packed case after the BSHD ones, none, or it alone")
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--ratio", type=int, default=1, help="key compression ratio (both sides)")
    p.add_argument("--quick", action="store_true",
                   help="a small smoke set instead (BSHD S 1024; packed 0,100,612,1024); --runs defaults to 5")
    p.add_argument("--runs", type=int, default=None, help="timed runs per case (default 30, 5 with --quick)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--dk", choices=["f32", "bf16"], default="f32", help="element type of d_index_k (both sides)")
    p.add_argument("--sm-scale", type=float, default=1.0)
    p.add_argument("--loss-coeff", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--bench", default=None,
                   help="indexer-bench binary (default ./bin/indexer-bench, else target/release/indexer-bench)")
    p.add_argument("--workdir", default=None, help="where case files go (default a temporary folder, removed)")
    p.add_argument("--keep", action="store_true", help="keep the case files")
    p.add_argument("--ref", choices=["float64", "float32"], default="float64", help="precision of the reference")
    p.add_argument("--no-cudnn", action="store_true", help="time this crate only")
    p.add_argument("--json", default=None, help="also write one JSON line per case here")
    a = p.parse_args(argv)
    if a.runs is None:
        a.runs = 5 if a.quick else 30
    cu = a.cu_seqlens
    if len(cu) < 2 or cu[0] != 0 or any(y < x for x, y in zip(cu, cu[1:])) or cu[-1] < 1:
        p.error(f"--cu-seqlens {cu}: needs 0 first, non-decreasing, at least one row")
    if a.ratio < 1:
        p.error("--ratio must be >= 1")
    return a


def build_cases(a):
    """The cases: dicts of layout ("bshd" with seq, or "packed" with cu),
    heads, dim, ratio."""
    base = dict(heads=a.heads, dim=a.dim, ratio=a.ratio)
    seqs, cu = ([1024], [0, 100, 612, 1024]) if a.quick else (a.seqs, a.cu_seqlens)
    out = []
    if a.packed != "only":
        out += [dict(base, layout="bshd", seq=s) for s in seqs]
    if a.packed != "off":
        out.append(dict(base, layout="packed", cu=list(cu)))
    return out


def case_name(c):
    if c["layout"] == "bshd":
        name = f"causal BSHD S={c['seq']}"
    else:
        name = "packed causal cu=[" + ",".join(map(str, c["cu"])) + "]"
    return name + (f" ratio={c['ratio']}" if c["ratio"] != 1 else "")


def segments(c):
    """Per batch: (first query row, end, first key row, end) in the flat
    (rows, ...) views. Queries and keys share cu_seqlens when packed."""
    if c["layout"] == "bshd":
        return [(0, c["seq"], 0, c["seq"])]
    cu = c["cu"]
    return [(cu[b], cu[b + 1], cu[b], cu[b + 1]) for b in range(len(cu) - 1)]


def score_cols(c):
    """Columns of the score tensors: S_k, or the longest key sequence."""
    return max(k1 - k0 for _, _, k0, k1 in segments(c))


def file_layout(c):
    """name -> (safetensors dtype, shape) of the case file: what
    `read_dense_case` (tests/src/dense_io.rs) reads, and what cuDNN's
    DenseIndexerBackward takes (BSHD, or THD when packed)."""
    h, d, cols = c["heads"], c["dim"], score_cols(c)
    rows, keys = segments(c)[-1][1], segments(c)[-1][3]
    if c["layout"] == "bshd":
        lead, klead, srow = [1, rows], [1, keys], [1, rows]
    else:
        lead, klead, srow = [rows], [keys], [rows]
    out = {
        "index_q": ("BF16", lead + [h, d]),
        "weights": ("BF16", lead + [h]),
        "index_k": ("BF16", klead + [d]),
        "attn_score": ("F32", srow + [cols]),
        "attn_l1norm": ("F32", srow),
        "index_score": ("F32", srow + [cols]),
        "index_lse": ("F32", srow),
        "grad_loss": ("F32", [1]),
    }
    if c["layout"] == "packed":
        n = len(c["cu"])
        out["cu_seqlens_q"] = ("I32", [n])
        out["cu_seqlens_k"] = ("I32", [n])
    return out


# ---------------------------------------------------------------- inputs


def visible(torch, c, dev):
    """(rows,) int64: L = min((s + 1) // ratio, S_k(b)) of every query row
    (q_offset 0), written out from SPEC's rule."""
    parts = []
    for q0, q1, k0, k1 in segments(c):
        s = torch.arange(q1 - q0, device=dev)
        parts.append(((s + 1) // c["ratio"]).clamp(max=k1 - k0))
    return torch.cat(parts)


def draw_inputs(torch, c, seed, dev):
    """SPEC's dense tensors for case `c`, on the GPU, shaped as
    `file_layout(c)` says; 0 in both score tensors past each row's L."""
    g = torch.Generator(device=dev).manual_seed(seed)
    h, d, cols = c["heads"], c["dim"], score_cols(c)
    rows, keys = segments(c)[-1][1], segments(c)[-1][3]
    uni = lambda *shape: (torch.rand(*shape, generator=g, device=dev) * 2 - 1).to(torch.bfloat16)
    q, w, k = uni(rows, h, d), uni(rows, h), uni(keys, d)
    vis = visible(torch, c, dev)
    logits = torch.empty(rows, cols, device=dev)
    attn = torch.empty(rows, cols, device=dev)
    lse = torch.empty(rows, device=dev)
    l1 = torch.empty(rows, device=dev)
    j = torch.arange(cols, device=dev)
    step = row_chunk(cols * 4)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        mask = j[None, :] < vis[r0:r1, None]
        z = (torch.randn(r1 - r0, cols, generator=g, device=dev) * LOGIT_SCALE).masked_fill(~mask, 0.0)
        logits[r0:r1] = z
        lse[r0:r1] = torch.logsumexp(z.double().masked_fill(~mask, -math.inf), -1).nan_to_num(neginf=0.0).float()
        m = torch.randn(r1 - r0, cols, generator=g, device=dev).masked_fill(~mask, -math.inf)
        m = (torch.softmax(m, -1).nan_to_num(0.0) * h).masked_fill(~mask, 0.0)
        attn[r0:r1] = m
        l1[r0:r1] = m.double().sum(-1).float()
    x = dict(index_q=q, weights=w, index_k=k, attn_score=attn, attn_l1norm=l1, index_score=logits,
             index_lse=lse, grad_loss=torch.ones(1, device=dev))
    if c["layout"] == "packed":
        cu = torch.tensor(c["cu"], dtype=torch.int32, device=dev)
        x["cu_seqlens_q"], x["cu_seqlens_k"] = cu, cu.clone()
    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32, "I32": torch.int32}
    for name, (dt, shape) in file_layout(c).items():
        x[name] = x[name].reshape(shape).contiguous()
        assert x[name].dtype == dtypes[dt], (name, x[name].dtype, dt)
    return x


# ---------------------------------------------------------------- cuDNN


def run_cudnn(torch, x, c, a):
    """Times cuDNN-frontend's DenseIndexerBackward on `x`; returns a result
    dict with its outputs (or an "error" entry)."""
    try:
        from cudnn.deepseek_sparse_attention import DenseIndexerBackward
    except Exception as e:  # noqa: BLE001 - reported, the case goes on
        return {"error": f"import: {type(e).__name__}: {e}"}
    q, w, k = x["index_q"], x["weights"], x["index_k"]
    attn, l1, logits, lse = x["attn_score"], x["attn_l1norm"], x["index_score"], x["index_lse"]
    packed = c["layout"] == "packed"
    cu_q, cu_k = x.get("cu_seqlens_q"), x.get("cu_seqlens_k")
    segs = segments(c)
    thd = dict(is_thd=True, batch=len(segs), max_seqlen_q=max(q1 - q0 for q0, q1, _, _ in segs),
               max_seqlen_k=score_cols(c)) if packed else {}
    dk_dtype = torch.float32 if a.dk == "f32" else torch.bfloat16
    try:
        t0 = time.time()
        dq, dw = torch.empty_like(q), torch.empty_like(w)
        dk = torch.empty(k.shape, device=q.device, dtype=dk_dtype)
        work = logits.clone()  # index_score: logits in, grad_signal out
        plan = DenseIndexerBackward(q, w, k, dq, dw, dk, attn, l1, work, lse, sm_scale=a.sm_scale,
                                    block_I=BLOCK_I, ratio=c["ratio"], **thd)
        plan.check_support()
        plan.compile()
        nbytes = plan.scratch_workspace_bytes()
        ws = torch.empty(nbytes, device=q.device, dtype=torch.uint8) if nbytes else None

        def call():
            plan.execute(q, w, k, dq, dw, dk, attn, l1, work, lse, x["grad_loss"],
                         loss_coeff=a.loss_coeff, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, workspace=ws)

        # SPEC: attn_score is read only. Should cuDNN write it, it is
        # restored before every run (and for this crate's file) as well.
        attn_copy = attn.clone()
        call()  # the first call compiles its kernels
        torch.cuda.synchronize()
        compile_s = time.time() - t0
        writes_attn = not torch.equal(attn, attn_copy)

        def restore():
            work.copy_(logits)
            if writes_attn:
                attn.copy_(attn_copy)

        med, lo = median_event_us(torch, call, restore, a.runs, a.warmup)
        # The results of one run on zeroed outputs.
        restore()
        for t in (dq, dw, dk):
            t.zero_()
        call()
        torch.cuda.synchronize()
        res = {"median_us": med, "min_us": lo, "compile_s": compile_s, "workspace_bytes": nbytes,
               "writes_attn_score": writes_attn, "grad_signal": work.clone(), "d_index_q": dq.clone(),
               "d_weights": dw.clone(), "d_index_k": dk.clone()}
        if writes_attn:
            attn.copy_(attn_copy)
        del plan, ws, dq, dw, dk, work, attn_copy
        return res
    except Exception as e:  # noqa: BLE001 - unsupported shape, memory, ...
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}


# ---------------------------------------------------------------- this crate


def run_crate(torch, a, c, path, out, dev):
    """`indexer-bench --dense-input path --output out`; its JSON line and outputs."""
    cmd = [a.bench, "--dense-input", path, "--output", out, "--runs", str(a.runs),
           "--warmup", str(a.warmup), "--ratio", str(c["ratio"]), "--sm-scale", repr(a.sm_scale),
           "--loss-coeff", repr(a.loss_coeff), "--dk", a.dk, "--dw", "bf16"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or [""])[-1]  # the error line, not the shape before it
        return {"error": f"exit {p.returncode}: {last[-300:]}"}
    lines = [l for l in p.stdout.splitlines() if l.startswith("{") and '"dense_input"' in l]
    if not lines:
        return {"error": f"no JSON line in: {p.stdout[-300:]}"}
    res = json.loads(lines[-1])
    tensors, _ = read_safetensors(torch, out, dev)
    res.update({k: tensors[k] for k in OUTPUTS})
    return res


# ---------------------------------------------------------------- reference


def reference(torch, x, c, a):
    """SPEC's dense math in `a.ref` precision on the GPU, batch by batch in
    chunks of rows, each chunk over the key columns its last row sees:
    grad_signal (0 past L), d_index_q, d_weights, d_index_k."""
    f = getattr(torch, a.ref)
    h, d, cols = c["heads"], c["dim"], score_cols(c)
    q, w = x["index_q"].reshape(-1, h, d), x["weights"].reshape(-1, h)
    k = x["index_k"].reshape(-1, d)
    logits, attn = x["index_score"].reshape(-1, cols), x["attn_score"].reshape(-1, cols)
    lse, l1 = x["index_lse"].reshape(-1), x["attn_l1norm"].reshape(-1)
    rows, dev = q.shape[0], q.device
    coef = a.loss_coeff / rows * float(x["grad_loss"][0])
    clip = math.exp(-100.0)
    vis = visible(torch, c, dev)
    zero = torch.zeros((), dtype=f, device=dev)
    sig = torch.zeros(rows, cols, dtype=f, device=dev)
    dq = torch.zeros(rows, h, d, dtype=f, device=dev)
    dw = torch.zeros(rows, h, dtype=f, device=dev)
    dk = torch.zeros(k.shape[0], d, dtype=f, device=dev)
    for q0, q1, k0, k1 in segments(c):
        kb = k[k0:k1].to(f)
        step = max(1, (1 << 28) // (h * max(1, k1 - k0) * 8))
        for s0 in range(q0, q1, step):
            s1 = min(q1, s0 + step)
            n = int(vis[s0:s1].max().item())
            if n == 0:
                continue
            mask = torch.arange(n, device=dev)[None, :] < vis[s0:s1, None]
            lp = logits[s0:s1, :n].to(f) - lse[s0:s1, None].to(f)
            target = (attn[s0:s1, :n].to(f) / (l1[s0:s1, None].to(f) + 1e-10)).clamp_min(clip)
            g = torch.where(mask & (lp >= -100.0), -target * coef, zero)
            sg = torch.where(mask, g - torch.exp(lp) * g.sum(-1, keepdim=True), zero)
            sig[s0:s1, :n] = sg
            qc, kc = q[s0:s1].to(f), kb[:n]
            s = a.sm_scale * torch.einsum("chd,jd->chj", qc, kc)
            gate = (s > 0) & mask[:, None, :]
            sgh = sg[:, None, :]
            ds = torch.where(gate, sgh * w[s0:s1].to(f)[:, :, None], zero)
            dw[s0:s1] = torch.where(gate, sgh * s, zero).sum(-1)
            dq[s0:s1] = a.sm_scale * torch.einsum("chj,jd->chd", ds, kc)
            dk[k0:k0 + n] += a.sm_scale * torch.einsum("chj,chd->jd", ds, qc)
            del s, gate, ds, sgh, lp, target, g
    return {"grad_signal": sig, "d_index_q": dq, "d_weights": dw, "d_index_k": dk}


# ---------------------------------------------------------------- report


def table(rows):
    return sbs_table(rows, [("writes_attn_score", "cuDNN writes attn_score (restored before each run)")])


def json_record(r):
    return sbs_json_record(r, count="visible")


# ---------------------------------------------------------------- main


def judge(torch, side, ref, a):
    """Adds the errors against `ref` to a side's result (unless it failed)."""
    if "error" not in side:
        side["errors"] = rel_errors(torch, side, ref)
        side["over"] = over_tolerance(side["errors"], a.dk)


def run_case(torch, a, c, i, workdir, dev):
    """Everything for one case: inputs, cuDNN, this crate, errors."""
    name = case_name(c)
    say = lambda what: print(f"[{i}] {name}: {what}", file=sys.stderr, flush=True)
    say("drawing inputs")
    x = draw_inputs(torch, c, a.seed + i, dev)
    vis = visible(torch, c, dev)
    row = {"case": name, "shape": dict(c, score_cols=score_cols(c)), "visible": int(vis.sum().item())}
    say("reference")
    ref = reference(torch, x, c, a)
    if a.no_cudnn:
        cu = {"error": "skipped (--no-cudnn)"}
    else:
        say("cuDNN")
        cu = run_cudnn(torch, x, c, a)
    judge(torch, cu, ref, a)
    torch.cuda.empty_cache()
    path = os.path.join(workdir, f"dense{i}.safetensors")
    out = os.path.join(workdir, f"dense{i}.out.safetensors")
    meta = {"sm_scale": a.sm_scale, "loss_coeff": a.loss_coeff, "ratio": c["ratio"], "mode": "dense",
            "d_index_k": a.dk, "d_weights": "bf16", "case": name}
    write_safetensors(torch, path, x, meta)
    say("this crate")
    me = run_crate(torch, a, c, path, out, dev)
    judge(torch, me, ref, a)
    if not a.keep:
        for p in (path, out):
            if os.path.exists(p):
                os.remove(p)
    row["cudnn"], row["crate"] = cu, me
    del x, ref
    torch.cuda.empty_cache()
    return row


def cudnn_version():
    try:
        import cudnn
        return getattr(cudnn, "__version__", "?")
    except Exception as e:  # noqa: BLE001 - only for the header line
        return f"not importable ({type(e).__name__})"


def main(argv=None):
    a = parse_args(argv)
    import torch  # after parsing: --help needs no torch

    if not torch.cuda.is_available():
        sys.exit("dense_side_by_side: no CUDA device visible to torch")
    a.bench = a.bench or default_bench()
    if not os.path.exists(a.bench):
        sys.exit(f"dense_side_by_side: {a.bench}: not found (pass --bench PATH)")
    dev = "cuda"
    workdir = a.workdir or tempfile.mkdtemp(prefix="dense_side_by_side-")
    os.makedirs(workdir, exist_ok=True)
    cases = build_cases(a)
    print(f"GPU {torch.cuda.get_device_name()}; torch {torch.__version__}; cuDNN-frontend "
          f"{'skipped' if a.no_cudnn else cudnn_version()}; {len(cases)} cases; {a.runs} runs after "
          f"{a.warmup} warm-ups; d_index_k {a.dk}; reference {a.ref}", flush=True)
    run_cases(torch, a, cases, workdir, dev, run_case, table, json_record)


if __name__ == "__main__":
    main()
