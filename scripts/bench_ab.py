#!/usr/bin/env python3
"""Before / after table of benchmark runs, from their JSON lines.

An A/B of two builds runs each build's benchmark binary (`indexer-bench`,
`indexer-forward-bench`) with `--json FILE` in one device call, in rounds
of opposite orders (before, after, after, before). This reads those files
and prints one markdown table: per point, the median of every run of
each side, the means' ratio after / before, and the kernel each side ran
where the lines name one. A point is every field that says what was run
(kind, ids, shape, topk, d_index_k type, ...), not what was measured.
Points missing on one side are listed below the table. Standard library
only; nothing is timed here.

    bench_ab.py --before old1.jsonl old2.jsonl --after new1.jsonl new2.jsonl
"""

import argparse
import json
import sys

# Integer fields that name a point; every string field does too, except
# the ones below (what a run reports, not what it was asked).
KEY_INTS = ("batch", "seq_q", "seq_k", "seq", "heads", "dim", "topk")
NOT_KEYS = ("kernel", "binding", "gpu")


def point_key(line):
    """The fields of a JSON line that say which point it measured, or
    `None` for a line without a median (ceilings and other records)."""
    if "median_us" not in line:
        return None
    key = []
    for name, value in line.items():
        if name in NOT_KEYS:
            continue
        if isinstance(value, str) or (name in KEY_INTS and isinstance(value, int)):
            key.append((name, value))
        elif isinstance(value, bool):
            key.append((name, value))
    return tuple(key)


def read(paths):
    """`{point: ([median per file...], kernel)}` over `paths`, in order; a
    point measured twice in one file keeps its last line."""
    out = {}
    for i, path in enumerate(paths):
        with open(path) as f:
            for text in f:
                text = text.strip()
                if not text:
                    continue
                line = json.loads(text)
                key = point_key(line)
                if key is None:
                    continue
                runs, kernel = out.get(key, ([None] * len(paths), None))
                runs[i] = float(line["median_us"])
                out[key] = (runs, line.get("kernel", kernel))
    return out


def label(key):
    return ", ".join(f"{v}" if n in ("kind", "ids") else f"{n} {v}" for n, v in key)


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", nargs="+", required=True, metavar="JSONL")
    ap.add_argument("--after", nargs="+", required=True, metavar="JSONL")
    args = ap.parse_args(argv)
    before, after = read(args.before), read(args.after)
    print("| point | before (us) | after (us) | after / before | kernel before | kernel after |")
    print("|---|---|---|---|---|---|")
    missing = []
    for key, (runs_b, kern_b) in before.items():
        if key not in after:
            missing.append(("after", key))
            continue
        runs_a, kern_a = after[key]
        mb, ma = mean(runs_b), mean(runs_a)
        ratio = f"{ma / mb:.3f}" if mb and ma is not None else "-"
        fmt = lambda rs: ", ".join("-" if r is None else f"{r:.1f}" for r in rs)
        print(f"| {label(key)} | {fmt(runs_b)} | {fmt(runs_a)} | {ratio} | "
              f"{kern_b or '-'} | {kern_a or '-'} |")
    missing += [("before", key) for key in after if key not in before]
    for side, key in missing:
        print(f"\nmissing {side}: {label(key)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
