#!/usr/bin/env python3
"""Side by side: cuDNN-frontend's IndexerBackward and this crate's
`indexer-bench --input`, on identical tensors, in one run on one GPU.

For each case (SPEC's "Performance workload": B=1, S_q=8192, S_k=4096,
H=64, D=128, topk 128..2048 with "uniform", "ragged" and "topk" ids, then
the long context S_q=4096, S_k=32768 and 131072 at topk 2048):

1. draws the inputs on the GPU with torch (the recipes of the Rust
   generators `Problem::make_ragged` and `Problem::make_topk` in
   tests/src/lib.rs, ported: the same recipe, not the same random numbers);
2. times cuDNN-frontend's IndexerBackward with CUDA events (median of
   --runs after --warmup; attn_score, which it overwrites with
   grad_signal, is restored before every run, outside the timed region),
   then runs it once more on zeroed outputs for its results;
3. writes the same tensors to a .safetensors file and runs
   `indexer-bench --input FILE --output OUT --runs N` (same method);
4. reads OUT back and computes SPEC's math in f64 (or f32) on the GPU in
   chunks of rows; prints the relative Frobenius error of each output of
   both implementations, flagged where over SPEC's tolerance;
5. prints one Markdown table (case, cuDNN us, this crate us, ratio
   cuDNN / this crate, errors) and, with --json, writes JSON lines.

A case cuDNN does not support (or that fails) is reported as such; the
crate's side still runs. Needs torch with CUDA and, for the cuDNN column,
nvidia-cudnn-frontend 1.32 (`import cudnn`); `--help` needs neither.

Inputs: q, k, weights uniform in [-1, 1] (bf16), as the Rust bench draws
them; attn_score and index_score the softmax of standard-normal logits
over each row's valid slots (zero on padding slots, as upstream softmaxes
give them); ids int32, global (B = 1); grad_loss 1, loss_coeff and
sm_scale from the flags (default 1).
"""

import argparse
import json
import math
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HEADLINE = dict(seq_q=8192, seq_k=4096, heads=64, dim=128)
TOPKS = [128, 256, 512, 1024, 2048]
ID_KINDS = ["uniform", "ragged", "topk"]

# SPEC tolerances (relative Frobenius error against the f64 reference).
TOLERANCE = {"grad_signal": 1e-6, "d_index_q": 8e-3, "d_weights": 8e-3, "d_index_k": 8e-3}
BF16_DK_EXTRA = 4e-3
OUTPUTS = ["grad_signal", "d_index_q", "d_weights", "d_index_k"]

# The "topk" ids' score (tests/src/lib.rs, TopkScore).
SINKS, SINK_BONUS = 4, 8.0
WINDOW, LOCAL_BONUS = 64, 2.5
NOISE, WAVES = 0.05, 4


# ---------------------------------------------------------------- arguments


def parse_args(argv=None, doc=None, script="side_by_side.py"):
    """The flags (shared with forward_side_by_side.py, which passes its own
    module docs and name for the help)."""
    p = argparse.ArgumentParser(
        description=(doc or __doc__).split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"Example: python3 scripts/{script} --runs 30 --json side.jsonl",
    )
    csv_int = lambda s: [int(x) for x in s.split(",") if x]
    csv_str = lambda s: [x for x in s.split(",") if x]
    p.add_argument("--topk", type=csv_int, default=TOPKS, help="topk of the headline cases (default 128,...,2048)")
    p.add_argument("--ids", type=csv_str, default=ID_KINDS, help="ids of the headline cases: uniform,ragged,topk")
    p.add_argument("--seq-q", type=int, default=HEADLINE["seq_q"])
    p.add_argument("--seq-k", type=int, default=HEADLINE["seq_k"])
    p.add_argument("--heads", type=int, default=HEADLINE["heads"])
    p.add_argument("--dim", type=int, default=HEADLINE["dim"])
    p.add_argument("--long-context", choices=["on", "off", "only"], default="on",
                   help="long-context cases after the headline ones, none, or those alone")
    p.add_argument("--long-seq-q", type=int, default=4096)
    p.add_argument("--long-seq-k", type=csv_int, default=[32768, 131072])
    p.add_argument("--long-topk", type=int, default=2048)
    p.add_argument("--long-ids", type=csv_str, default=["topk", "uniform"])
    p.add_argument("--quick", action="store_true",
                   help="a small smoke set instead (S_q 512, S_k 1024, topk 128/256, all ids; "
                        "S_q 256, S_k 16384, topk 512); --runs defaults to 5")
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
    for k in a.ids + a.long_ids:
        if k not in ID_KINDS:
            p.error(f"unknown ids {k!r} (uniform, ragged, topk)")
    return a


def build_cases(a):
    """The cases to run: dicts of seq_q, seq_k, heads, dim, topk, ids."""
    base = dict(heads=a.heads, dim=a.dim)
    if a.quick:
        out = [dict(base, seq_q=512, seq_k=1024, topk=t, ids=i) for t in (128, 256) for i in ID_KINDS]
        out += [dict(base, seq_q=256, seq_k=16384, topk=512, ids=i) for i in ("topk", "uniform")]
        return out
    out = []
    if a.long_context != "only":
        out += [dict(base, seq_q=a.seq_q, seq_k=a.seq_k, topk=t, ids=i) for t in a.topk for i in a.ids]
    if a.long_context != "off":
        out += [dict(base, seq_q=a.long_seq_q, seq_k=sk, topk=a.long_topk, ids=i)
                for sk in a.long_seq_k for i in a.long_ids]
    return out


def case_name(c):
    return f"{c['ids']} S_q={c['seq_q']} S_k={c['seq_k']} topk={c['topk']}"


# ---------------------------------------------------------------- inputs


def row_chunk(width, budget=1 << 28):
    """Rows per chunk so that a (rows, width) f32 block stays near `budget` bytes."""
    return max(1, budget // (4 * width))


def ids_uniform(torch, g, seq_q, seq_k, topk, dev):
    """topk distinct keys of all S_k per row, in random slot order."""
    out = torch.empty(seq_q, topk, dtype=torch.int32, device=dev)
    step = row_chunk(seq_k)
    for s0 in range(0, seq_q, step):
        s1 = min(seq_q, s0 + step)
        r = torch.rand(s1 - s0, seq_k, generator=g, device=dev)
        out[s0:s1] = r.topk(topk, dim=-1).indices.to(torch.int32)
    return out


def ids_ragged(torch, g, seq_q, seq_k, topk, dev):
    """Row s sees the first v = min(s//2 + 1, S_k) keys and selects
    min(v, topk) distinct ones at random, in random slot order; the
    remaining slots are -1."""
    out = torch.empty(seq_q, topk, dtype=torch.int32, device=dev)
    step = row_chunk(seq_k)
    j = torch.arange(seq_k, device=dev)
    t = torch.arange(topk, device=dev)
    for s0 in range(0, seq_q, step):
        s1 = min(seq_q, s0 + step)
        v = (torch.arange(s0, s1, device=dev) // 2 + 1).clamp(max=seq_k)
        r = torch.rand(s1 - s0, seq_k, generator=g, device=dev)
        r = torch.where(j[None, :] < v[:, None], r, torch.full_like(r, -1.0))
        idx = r.topk(topk, dim=-1).indices.to(torch.int32)
        n = v.clamp(max=topk)
        out[s0:s1] = torch.where(t[None, :] < n[:, None], idx, torch.full_like(idx, -1))
    return out


def ids_topk(torch, g, seq_q, seq_k, topk, dev):
    """The top-k keys of a structured score, in descending score order,
    -1 where a row sees fewer than topk keys. Row s sits at key position
    p = S_k - S_q + s and sees keys j <= p; with d = p - j:
    score = 8 [j < 4] + 2.5 [d < 64]
          + sum_m a_m sin(2 pi f_m j / S_k + phi_m + 2 pi r_m s / S_q)
          + 0.05 u,
    a_m uniform in [0.5, 1] normalised to sum 1, f_m in [1, 32],
    phi_m in [0, 2 pi), r_m in [0.25, 1], u uniform in [0, 1) per (s, j)."""
    two_pi = 2.0 * math.pi
    amp = torch.rand(WAVES, generator=g, device=dev) * 0.5 + 0.5
    amp = amp / amp.sum()
    freq = torch.rand(WAVES, generator=g, device=dev) * 31.0 + 1.0
    phase = torch.rand(WAVES, generator=g, device=dev) * two_pi
    drift = torch.rand(WAVES, generator=g, device=dev) * 0.75 + 0.25
    j = torch.arange(seq_k, device=dev, dtype=torch.float32)
    base = two_pi * freq[:, None] * j[None, :] / seq_k  # (M, S_k)
    bonus = (j < SINKS).float() * SINK_BONUS
    out = torch.empty(seq_q, topk, dtype=torch.int32, device=dev)
    step = row_chunk(seq_k * 2)
    for s0 in range(0, seq_q, step):
        s1 = min(seq_q, s0 + step)
        s = torch.arange(s0, s1, device=dev, dtype=torch.float32)
        p = (seq_k - seq_q) + torch.arange(s0, s1, device=dev)
        shift = phase[None, :] + two_pi * drift[None, :] * s[:, None] / seq_q  # (c, M)
        score = torch.zeros(s1 - s0, seq_k, device=dev)
        for m in range(WAVES):
            score += amp[m] * torch.sin(base[m][None, :] + shift[:, m:m + 1])
        d = p[:, None] - j[None, :].long()
        score += bonus[None, :] + ((d >= 0) & (d < WINDOW)).float() * LOCAL_BONUS
        score += NOISE * torch.rand(s1 - s0, seq_k, generator=g, device=dev)
        score = torch.where(d >= 0, score, torch.full_like(score, -math.inf))
        val, idx = score.topk(topk, dim=-1, sorted=True)
        idx = idx.to(torch.int32)
        out[s0:s1] = torch.where(val > -math.inf, idx, torch.full_like(idx, -1))
    return out


def draw_inputs(torch, c, seed, dev):
    """SPEC's tensors for case `c` (B = 1), on the GPU."""
    g = torch.Generator(device=dev).manual_seed(seed)
    sq, sk, h, d, topk = c["seq_q"], c["seq_k"], c["heads"], c["dim"], c["topk"]
    uni = lambda *shape: (torch.rand(*shape, generator=g, device=dev) * 2 - 1).to(torch.bfloat16)
    q = uni(1, sq, h, d)
    k = uni(1, sk, d)
    w = uni(1, sq, h)
    make = {"uniform": ids_uniform, "ragged": ids_ragged, "topk": ids_topk}[c["ids"]]
    ids = make(torch, g, sq, sk, topk, dev)[None].contiguous()
    valid = ids >= 0

    def probs():
        logits = torch.randn(1, sq, topk, generator=g, device=dev).masked_fill(~valid, -math.inf)
        return torch.softmax(logits, -1).nan_to_num(0.0).contiguous()

    return dict(index_q=q, weights=w, index_k=k, attn_score=probs(), index_score=probs(),
                topk_indices=ids, grad_loss=torch.ones(1, device=dev))


# ---------------------------------------------------------------- safetensors

_ST_DTYPES = {"BF16": "bfloat16", "F32": "float32", "F64": "float64", "I32": "int32", "I64": "int64",
              "F16": "float16", "U8": "uint8"}


def pack_safetensors(records, metadata):
    """The bytes of a .safetensors file: u64 LE header length, JSON header
    (dtype, shape, data_offsets of each tensor; string __metadata__), then
    the tensors' raw little-endian bytes back to back. `records`: name ->
    (safetensors dtype such as "BF16", shape, raw bytes)."""
    header, at = {}, 0
    for name, (dtype, shape, raw) in records.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(raw)]}
        at += len(raw)
    header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return b"".join([struct.pack("<Q", len(text)), text] + [r[2] for r in records.values()])


def unpack_safetensors(data):
    """name -> (dtype, shape, raw bytes) and the metadata of a file's bytes."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(bytes(data[8:8 + n]))
    meta = header.pop("__metadata__", {}) or {}
    body = memoryview(data)[8 + n:]
    out = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        out[name] = (h["dtype"], h["shape"], body[a:b])
    return out, meta


def write_safetensors(torch, path, tensors, metadata):
    """Writes torch tensors (moved to the host) and string metadata."""
    names = {v: k for k, v in _ST_DTYPES.items()}
    records = {}
    for name, t in tensors.items():
        raw = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
        records[name] = (names[str(t.dtype).replace("torch.", "")], t.shape, raw)
    with open(path, "wb") as f:
        f.write(pack_safetensors(records, metadata))


def read_safetensors(torch, path, dev):
    """The tensors of a .safetensors file (on `dev`) and its metadata."""
    with open(path, "rb") as f:
        records, meta = unpack_safetensors(f.read())
    out = {}
    for name, (dtype, shape, raw) in records.items():
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        out[name] = flat.view(getattr(torch, _ST_DTYPES[dtype])).reshape(shape).to(dev)
    return out, meta


# ---------------------------------------------------------------- cuDNN


def median_event_us(torch, fn, before, runs, warmup):
    """Median, min of `runs` timed calls of `fn` after `warmup`, in us;
    `before` runs untimed ahead of every call."""
    times = []
    for i in range(warmup + runs):
        before()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(e0.elapsed_time(e1) * 1000.0)
    return statistics.median(times), min(times)


def cudnn_indexer_backward(torch, IndexerBackward, x, isc, a):
    """cuDNN-frontend's IndexerBackward checked and compiled for the
    tensors of `x` with predict `isc`: `(call, out)`, `call()` running it
    into `out` ("grad_signal", a copy of attn_score it overwrites,
    "d_index_q", "d_weights", "d_index_k")."""
    q, w, k, ids = x["index_q"], x["weights"], x["index_k"], x["topk_indices"]
    dk_dtype = torch.float32 if a.dk == "f32" else torch.bfloat16
    out = {"grad_signal": x["attn_score"].clone(), "d_index_q": torch.empty_like(q),
           "d_weights": torch.empty_like(w),
           "d_index_k": torch.empty(k.shape, device=q.device, dtype=dk_dtype)}
    work, dq, dw, dk = (out[n] for n in ("grad_signal", "d_index_q", "d_weights", "d_index_k"))
    plan = IndexerBackward(q, w, k, dq, dw, dk, work, isc, ids, sm_scale=a.sm_scale,
                           block_I=128, topk_indices_global=True)
    plan.check_support()
    plan.compile()
    nbytes = plan.scratch_workspace_bytes()
    ws = torch.empty(nbytes, device=q.device, dtype=torch.uint8) if nbytes else None

    def call():
        plan.execute(q, w, k, dq, dw, dk, work, isc, ids, x["grad_loss"],
                     loss_coeff=a.loss_coeff, workspace=ws)

    return call, out


def run_cudnn(torch, x, a):
    """Times cuDNN-frontend's IndexerBackward on `x`; returns a result dict
    with its outputs (or an "error" entry)."""
    try:
        from cudnn.deepseek_sparse_attention import IndexerBackward
    except Exception as e:  # noqa: BLE001 - reported, the case goes on
        return {"error": f"import: {type(e).__name__}: {e}"}
    attn, isc = x["attn_score"], x["index_score"]
    try:
        t0 = time.time()
        call, out = cudnn_indexer_backward(torch, IndexerBackward, x, isc, a)
        work, dq, dw, dk = (out[n] for n in OUTPUTS)
        compile_s = time.time() - t0

        # SPEC: index_score is read only. Should cuDNN write it, it is
        # restored before every run (and for this crate's file) as well.
        isc_copy = isc.clone()
        work.copy_(attn)
        call()
        torch.cuda.synchronize()
        writes_isc = not torch.equal(isc, isc_copy)

        def restore():
            work.copy_(attn)
            if writes_isc:
                isc.copy_(isc_copy)

        med, lo = median_event_us(torch, call, restore, a.runs, a.warmup)
        # The results of one run on zeroed outputs ...
        restore()
        for t in (dq, dw, dk):
            t.zero_()
        call()
        torch.cuda.synchronize()
        res = {"median_us": med, "min_us": lo, "compile_s": compile_s,
               "grad_signal": work.clone(), "d_index_q": dq.clone(), "d_weights": dw.clone(),
               "d_index_k": dk.clone()}
        # ... and whether a second run adds to d_index_k instead of
        # overwriting it (then its times exclude a zeroing ours includes).
        restore()
        call()
        torch.cuda.synchronize()
        if writes_isc:
            isc.copy_(isc_copy)
        res["writes_index_score"] = writes_isc
        first = res["d_index_k"].double()
        res["dk_accumulates"] = bool(
            (dk.double() - 2 * first).norm() < 0.5 * (dk.double() - first).norm())
        del call, out, dq, dw, dk, work
        return res
    except Exception as e:  # noqa: BLE001 - unsupported shape, memory, ...
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}


# ---------------------------------------------------------------- this crate


def default_bench():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for p in ("./bin/indexer-bench", os.path.join(root, "target/release/indexer-bench")):
        if os.path.exists(p):
            return p
    return "./bin/indexer-bench"


def run_crate(torch, a, path, out, dev):
    """`indexer-bench --input path --output out`; its JSON line and outputs."""
    cmd = [a.bench, "--input", path, "--output", out, "--runs", str(a.runs),
           "--warmup", str(a.warmup), "--dk", a.dk]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": f"exit {p.returncode}: {p.stderr.strip()[-300:]}"}
    lines = [l for l in p.stdout.splitlines() if l.startswith("{") and '"input"' in l]
    if not lines:
        return {"error": f"no JSON line in: {p.stdout[-300:]}"}
    res = json.loads(lines[-1])
    tensors, _ = read_safetensors(torch, out, dev)
    res.update({k: tensors[k] for k in OUTPUTS})
    return res


# ---------------------------------------------------------------- reference


def gathered_chunks(torch, k, ids, f, heads):
    """The references' walk over `ids` (B, S_q, topk; global ids into the
    B*S_k rows of `k`) in chunks of rows near 256 MiB of f64 work: for each
    batch `b` and rows `s0:s1`, the chunk's ids as int64, which of them are
    valid, and their key rows in dtype `f` (a clamped row where invalid)."""
    keys, d = k.shape[0] * k.shape[1], k.shape[-1]
    b_n, sq, topk = ids.shape
    kf = k.reshape(keys, d).to(f)
    step = row_chunk(2 * topk * max(d, heads))
    for b in range(b_n):
        for s0 in range(0, sq, step):
            s1 = min(sq, s0 + step)
            idc = ids[b, s0:s1].long()
            valid = (idc >= 0) & (idc < keys)
            yield b, s0, s1, idc, valid, kf[idc.clamp(0, keys - 1)]


def reference(torch, x, a):
    """SPEC's math (sparse backward, global ids) in `a.ref` precision on
    the GPU, in chunks of rows: grad_signal, d_index_q, d_weights, d_index_k."""
    f = getattr(torch, a.ref)
    q, w, k = x["index_q"], x["weights"], x["index_k"]
    target, predict, ids = x["attn_score"].to(f), x["index_score"].to(f), x["topk_indices"]
    b_n, sq, h, d = q.shape
    keys = k.shape[0] * k.shape[1]
    c = a.loss_coeff / (b_n * sq) * float(x["grad_loss"][0])
    clip = math.exp(-100.0)
    g = -target.clamp_min(clip) * (predict >= clip).to(f) * c
    sig = g - predict * g.sum(-1, keepdim=True)
    dq = torch.zeros(b_n, sq, h, d, dtype=f, device=q.device)
    dw = torch.zeros(b_n, sq, h, dtype=f, device=q.device)
    dk = torch.zeros(keys, d, dtype=f, device=q.device)
    zero = torch.zeros((), dtype=f, device=q.device)
    for b, s0, s1, idc, valid, kg in gathered_chunks(torch, k, ids, f, h):
        qc = q[b, s0:s1].to(f)  # (c, H, D); kg (c, T, D)
        s = a.sm_scale * torch.einsum("chd,ctd->cht", qc, kg)
        gate = (s > 0) & valid[:, None, :]
        sg = sig[b, s0:s1][:, None, :]
        ds = torch.where(gate, sg * w[b, s0:s1].to(f)[:, :, None], zero)
        dw[b, s0:s1] = torch.where(gate, sg * s, zero).sum(-1)
        dq[b, s0:s1] = a.sm_scale * torch.einsum("cht,ctd->chd", ds, kg)
        contrib = a.sm_scale * torch.einsum("cht,chd->ctd", ds, qc)
        dk.index_add_(0, idc[valid], contrib[valid])
        del kg, s, gate, ds, contrib
    return {"grad_signal": sig, "d_index_q": dq, "d_weights": dw, "d_index_k": dk.reshape(k.shape)}


def rel_errors(torch, got, ref):
    """Relative Frobenius error per output (infinite where non-finite)."""
    out = {}
    for name in OUTPUTS:
        x, r = got[name].double().reshape(-1), ref[name].double().reshape(-1)
        if not torch.isfinite(x).all():
            out[name] = math.inf
            continue
        den = r.norm().item()
        num = (x - r).norm().item()
        out[name] = num / den if den else num
    return out


def over_tolerance(errs, dk):
    tol = dict(TOLERANCE)
    if dk == "bf16":
        tol["d_index_k"] += BF16_DK_EXTRA
    return [n for n in OUTPUTS if not errs[n] <= tol[n]]


# ---------------------------------------------------------------- report


def fmt_errs(side):
    if "errors" not in side:
        return "-"
    e = side["errors"]
    text = " / ".join(f"{e[n]:.1e}" for n in OUTPUTS)
    bad = side.get("over", [])
    return text + (" **over: " + ", ".join(bad) + "**" if bad else "")


# The cuDNN flags the table notes: (key in its record, note).
CUDNN_NOTES = [
    ("dk_accumulates", "cuDNN adds to d_index_k (caller zeroes it; not in its time)"),
    ("writes_index_score", "cuDNN writes index_score (restored before each run)"),
]


def table(rows, cudnn_notes=CUDNN_NOTES):
    lines = ["| case | cuDNN us | this crate us | cuDNN / this | cuDNN errors (gs / dQ / dW / dK) "
             "| this crate errors (gs / dQ / dW / dK) | notes |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        cu, me = r["cudnn"], r["crate"]
        t_cu = f"{cu['median_us']:.0f}" if "median_us" in cu else "-"
        t_me = f"{me['median_us']:.0f}" if "median_us" in me else "-"
        ratio = f"{cu['median_us'] / me['median_us']:.2f}" if "median_us" in cu and "median_us" in me else "-"
        notes = []
        if "error" in cu:
            notes.append("cuDNN: " + cu["error"].replace("|", "/")[:120])
        notes += [note for key, note in cudnn_notes if cu.get(key)]
        if "error" in me:
            notes.append("crate: " + me["error"].replace("|", "/")[:120])
        lines.append(f"| {r['case']} | {t_cu} | {t_me} | {ratio} | {fmt_errs(cu)} | {fmt_errs(me)} "
                     f"| {'; '.join(notes)} |")
    return "\n".join(lines)


def json_record(r, count="valid_slots"):
    rec = {"case": r["case"], **r["shape"], count: r[count]}
    finite = lambda v: v if not isinstance(v, float) or math.isfinite(v) else None
    for side in ("cudnn", "crate"):
        s = r[side]
        rec[side] = {k: v for k, v in s.items() if k not in OUTPUTS}
        if "errors" in rec[side]:
            rec[side]["errors"] = {k: finite(v) for k, v in rec[side]["errors"].items()}
    if "median_us" in r["cudnn"] and "median_us" in r["crate"]:
        rec["ratio_cudnn_over_crate"] = r["cudnn"]["median_us"] / r["crate"]["median_us"]
    return json.dumps(rec)


# ---------------------------------------------------------------- main


def run_cases(torch, a, cases, workdir, dev, run_case, table, json_record):
    """Runs every case (`run_case`), appending each record to `a.json` as it
    completes, removes the work directory unless it was given or kept, then
    prints the table and the cases over SPEC's tolerance."""
    rows = []
    jf = open(a.json, "w") if a.json else None
    try:
        for i, c in enumerate(cases):
            rows.append(run_case(torch, a, c, i, workdir, dev))
            if jf:
                jf.write(json_record(rows[-1]) + "\n")
                jf.flush()
    finally:
        if jf:
            jf.close()
        if not a.workdir and not a.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(table(rows))
    bad = [r["case"] for r in rows for s in ("cudnn", "crate") if r[s].get("over")]
    if bad:
        print(f"\nover SPEC tolerance: {', '.join(sorted(set(bad)))}")


def run_case(torch, a, c, i, workdir, dev):
    """Everything for one case: inputs, cuDNN, this crate, errors."""
    name = case_name(c)
    print(f"[{i}] {name}: drawing inputs", file=sys.stderr, flush=True)
    x = draw_inputs(torch, c, a.seed + i, dev)
    row = {"case": name, "shape": dict(c, batch=1),
           "valid_slots": int((x["topk_indices"] >= 0).sum().item())}
    print(f"[{i}] {name}: reference", file=sys.stderr, flush=True)
    ref = reference(torch, x, a)
    if a.no_cudnn:
        cu = {"error": "skipped (--no-cudnn)"}
    else:
        print(f"[{i}] {name}: cuDNN", file=sys.stderr, flush=True)
        cu = run_cudnn(torch, x, a)
    if "error" not in cu:
        cu["errors"] = rel_errors(torch, cu, ref)
        cu["over"] = over_tolerance(cu["errors"], a.dk)
    torch.cuda.empty_cache()
    path = os.path.join(workdir, f"case{i}.safetensors")
    out = os.path.join(workdir, f"case{i}.out.safetensors")
    meta = {"sm_scale": a.sm_scale, "loss_coeff": a.loss_coeff, "key_ids": "global",
            "score": "probs", "d_index_k": a.dk, "d_weights": "bf16", "case": name}
    write_safetensors(torch, path, x, meta)
    print(f"[{i}] {name}: this crate", file=sys.stderr, flush=True)
    me = run_crate(torch, a, path, out, dev)
    if "error" not in me:
        me["errors"] = rel_errors(torch, me, ref)
        me["over"] = over_tolerance(me["errors"], a.dk)
    if not a.keep:
        for p in (path, out):
            if os.path.exists(p):
                os.remove(p)
    row["cudnn"], row["crate"] = cu, me
    del x, ref
    torch.cuda.empty_cache()
    return row


def main(argv=None):
    a = parse_args(argv)
    import torch  # after parsing: --help needs no torch

    if not torch.cuda.is_available():
        sys.exit("side_by_side: no CUDA device visible to torch")
    a.bench = a.bench or default_bench()
    if not os.path.exists(a.bench):
        sys.exit(f"side_by_side: {a.bench}: not found (pass --bench PATH)")
    dev = "cuda"
    workdir = a.workdir or tempfile.mkdtemp(prefix="side_by_side-")
    os.makedirs(workdir, exist_ok=True)
    cases = build_cases(a)
    print(f"GPU {torch.cuda.get_device_name()}; torch {torch.__version__}; {len(cases)} cases; "
          f"{a.runs} runs after {a.warmup} warm-ups; d_index_k {a.dk}; reference {a.ref}", flush=True)
    run_cases(torch, a, cases, workdir, dev, run_case, table, json_record)


if __name__ == "__main__":
    main()
