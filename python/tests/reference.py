"""A pure-Python f64 statement of docs/spec.md ("Math" and "Dense mode"), for
tiny problems, and the bf16 / buffer helpers of the torch-free tests."""

import math
import random
import struct
from array import array

CLIP = math.exp(-100.0)


def bf16_to_float(bits):
    return struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0]


def float_to_bf16(x):
    """Round-to-nearest-even bf16 bits of ``x`` (finite values)."""
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def addr(buf):
    """Host address of an ``array.array``."""
    return buf.buffer_info()[0]


class Problem:
    """A random problem: bf16 tensors as arrays of bits, f32 and i32 arrays."""

    def __init__(self, seed, dims, key_ids="global", score="probs"):
        rng = random.Random(seed)
        b, sq, sk, h, d, topk = dims
        self.dims, self.key_ids, self.score = dims, key_ids, score
        rows = b * sq

        def grid():  # multiples of 1/8 in [-1, 1]: q . k is exact, gates agree
            return float_to_bf16(rng.randint(-8, 8) / 8.0)

        self.q = array("H", (grid() for _ in range(rows * h * d)))
        self.w = array("H", (grid() for _ in range(rows * h)))
        self.k = array("H", (grid() for _ in range(b * sk * d)))
        ids, target, predict = [], [], []
        limit = b * sk if key_ids == "global" else sk
        for r in range(rows):
            row_ids = []
            for t in range(topk):
                u = rng.random()
                if u < 0.15:
                    row_ids.append(-1)  # padding
                elif u < 0.25:
                    row_ids.append(limit + rng.randint(0, 3))  # padding past the end
                elif key_ids == "global":
                    bb = r // sq  # keys of the row's own batch, as a real indexer picks
                    row_ids.append(bb * sk + rng.randrange(sk))
                else:
                    row_ids.append(rng.randrange(sk))
            ids += row_ids
            for dist in (target, predict):
                x = [rng.random() + 0.05 for _ in range(topk)]
                s = sum(x)
                dist += [v / s for v in x]
        self.ids = array("i", ids)
        self.attn = array("f", target)
        if score == "logprobs":
            self.score_buf = array("f", (math.log(p) for p in predict))
        else:
            self.score_buf = array("f", predict)
        self.grad_loss = 0.75
        self.loss_coeff = 1.5
        self.sm_scale = 0.5

    def resolve(self, row, idx):
        b, sq, sk = self.dims[0], self.dims[1], self.dims[2]
        if self.key_ids == "global":
            return idx if 0 <= idx < b * sk else None
        return (row // sq) * sk + idx if 0 <= idx < sk else None

    def reference(self):
        """(grad_signal, d_index_q, d_weights, d_index_k) as lists of floats."""
        b, sq, sk, h, d, topk = self.dims
        rows = b * sq
        q = [bf16_to_float(x) for x in self.q]
        w = [bf16_to_float(x) for x in self.w]
        k = [bf16_to_float(x) for x in self.k]
        c = self.loss_coeff / rows * self.grad_loss
        gs = [0.0] * (rows * topk)
        dq = [0.0] * (rows * h * d)
        dw = [0.0] * (rows * h)
        dk = [0.0] * (b * sk * d)
        sm = self.sm_scale
        for r in range(rows):
            g, pred = [], []
            for t in range(topk):
                i = r * topk + t
                s = self.score_buf[i]
                if self.score == "logprobs":
                    p, live = math.exp(s), s >= -100.0
                else:
                    p, live = s, s >= CLIP
                pred.append(p)
                g.append(-max(self.attn[i], CLIP) * c if live else 0.0)
            big_g = sum(g)
            for t in range(topk):
                gs[r * topk + t] = g[t] - pred[t] * big_g
            for t in range(topk):
                n = self.resolve(r, self.ids[r * topk + t])
                if n is None:
                    continue
                sig = gs[r * topk + t]
                krow = k[n * d:(n + 1) * d]
                for hh in range(h):
                    qo = (r * h + hh) * d
                    s = sm * sum(q[qo + j] * krow[j] for j in range(d))
                    if s <= 0.0:
                        continue
                    ds = sig * w[r * h + hh]
                    dw[r * h + hh] += sig * s
                    for j in range(d):
                        dq[qo + j] += sm * ds * krow[j]
                        dk[n * d + j] += sm * ds * q[qo + j]
        return gs, dq, dw, dk


def rel_err(got, want):
    num = sum((a - b) ** 2 for a, b in zip(got, want))
    den = sum(b * b for b in want)
    if any(math.isnan(a) for a in got):
        return math.inf
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


class DenseProblem:
    """A random dense problem (docs/spec.md, "Dense mode"): BSHD when
    ``bshd=(B, S_q, S_k)``, else packed by ``cu_q``, ``cu_k`` with
    ``cols`` score columns. bf16 tensors as arrays of bits, f32 arrays."""

    def __init__(self, seed, heads=16, head_dim=64, bshd=None, cu_q=None, cu_k=None, cols=None,
                 q_offset=None, ratio=1):
        rng = random.Random(seed)
        h, d = heads, head_dim
        if bshd is not None:
            b, sq, sk = bshd
            cu_q = [i * sq for i in range(b + 1)]
            cu_k = [i * sk for i in range(b + 1)]
            cols = sk
        elif cols is None:
            cols = max(e - s for s, e in zip(cu_k, cu_k[1:]))
        self.bshd, self.cu_q, self.cu_k, self.cols = bshd, list(cu_q), list(cu_k), cols
        self.heads, self.head_dim = h, d
        self.q_offset = list(q_offset) if q_offset is not None else None
        self.ratio = ratio
        rows, keys = cu_q[-1], cu_k[-1]

        def grid():  # multiples of 1/8 in [-1, 1]: q . k is exact, gates agree
            return float_to_bf16(rng.randint(-8, 8) / 8.0)

        self.q = array("H", (grid() for _ in range(rows * h * d)))
        self.w = array("H", (grid() for _ in range(rows * h)))
        self.k = array("H", (grid() for _ in range(keys * d)))
        attn, l1, logits, lse = [], [], [], []
        for r in range(rows):
            vis = self.row(r)[2]
            a = [rng.random() + 0.05 for _ in range(cols)]
            z = [rng.uniform(-2.0, 2.0) for _ in range(cols)]
            if vis > 2 and rng.random() < 0.5:
                z[rng.randrange(vis)] = -300.0  # below lse - 100: masked
            attn += a
            l1.append(sum(a[:vis]) if vis else 1.0)
            logits += z
            m = max(z[:vis]) if vis else 0.0
            lse.append(m + math.log(sum(math.exp(x - m) for x in z[:vis])) if vis else 0.0)
        self.attn = array("f", attn)
        self.l1 = array("f", l1)
        self.logits = array("f", logits)
        self.lse = array("f", lse)
        self.grad_loss = 0.75
        self.loss_coeff = 1.5
        self.sm_scale = 0.5

    def layout_kwargs(self):
        """The layout keywords of ``_native.dense_cpu_execute``."""
        kw = dict(ratio=self.ratio)
        if self.q_offset is not None:
            kw["q_offset"] = self.q_offset
        if self.bshd is not None:
            kw["bshd"] = tuple(self.bshd)
        else:
            kw.update(cu_seqlens_q=self.cu_q, cu_seqlens_k=self.cu_k, score_cols=self.cols)
        return kw

    def row(self, r):
        """``(key_start, S_k(b), L)`` of query row ``r``."""
        b = max(i for i in range(len(self.cu_q) - 1) if self.cu_q[i] <= r)
        s = r - self.cu_q[b]
        off = self.q_offset[b] if self.q_offset else 0
        num = off + s + 1
        sk = self.cu_k[b + 1] - self.cu_k[b]
        vis = min(num // self.ratio, sk) if num > 0 else 0
        return self.cu_k[b], sk, vis

    def reference(self):
        """(grad_signal, d_index_q, d_weights, d_index_k) as lists of floats."""
        h, d, cols = self.heads, self.head_dim, self.cols
        rows, keys = self.cu_q[-1], self.cu_k[-1]
        q = [bf16_to_float(x) for x in self.q]
        w = [bf16_to_float(x) for x in self.w]
        k = [bf16_to_float(x) for x in self.k]
        c = self.loss_coeff / rows * self.grad_loss
        gs = [0.0] * (rows * cols)
        dq = [0.0] * (rows * h * d)
        dw = [0.0] * (rows * h)
        dk = [0.0] * (keys * d)
        sm = self.sm_scale
        for r in range(rows):
            start, _, vis = self.row(r)
            g, pred = [], []
            for j in range(vis):
                i = r * cols + j
                z = self.logits[i] - self.lse[r]
                pred.append(math.exp(z))
                target = max(self.attn[i] / (self.l1[r] + 1e-10), CLIP)
                g.append(-target * c if z >= -100.0 else 0.0)
            big_g = sum(g)
            for j in range(vis):
                gs[r * cols + j] = g[j] - pred[j] * big_g
            for j in range(vis):
                n = start + j
                sig = gs[r * cols + j]
                krow = k[n * d:(n + 1) * d]
                for hh in range(h):
                    qo = (r * h + hh) * d
                    s = sm * sum(q[qo + t] * krow[t] for t in range(d))
                    if s <= 0.0:
                        continue
                    ds = sig * w[r * h + hh]
                    dw[r * h + hh] += sig * s
                    for t in range(d):
                        dq[qo + t] += sm * ds * krow[t]
                        dk[n * d + t] += sm * ds * q[qo + t]
        return gs, dq, dw, dk
