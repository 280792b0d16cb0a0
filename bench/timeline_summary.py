#!/usr/bin/env python3
"""Per-kernel time inside captured decode steps, from an Nsight Systems GPU trace.

    nsys profile --cuda-graph-trace=node --trace=cuda -o tl dhisparse bench ...
    nsys stats --report cuda_gpu_trace --format csv -o tl tl.nsys-rep
    python3 bench/timeline_summary.py tl_cuda_gpu_trace.csv

Also reads `ncu --csv --metrics gpu__time_duration.sum` output (kernels serialized: busy times, no
gaps). A step starts at each embedding kernel; steps are grouped by whether they ran page scoring
(sparse) or not (dense), and the first two of each group are dropped (capture and warm-up).
For each kernel name: launches per step, mean busy time per step, and the mean idle gap before
it (from the previous kernel's end: launch latency, the previous grid's drain). Printed last: the
step's span, its kernels' busy time and the sum of gaps.
"""
import csv
import sys
from collections import defaultdict


def short(name):
    for pre in ("void ", "dhs::cuda::", "dhs::", "(anonymous namespace)::", "<unnamed>::", "unnamed>::"):
        name = name.replace(pre, "")
    return name.split("(")[0].split("<")[0][:48]


def load(path):
    with open(path, newline="") as f:
        text = f.read().splitlines()
    # ncu --csv prints its own lines first; the table starts at the header row.
    first = next(i for i, l in enumerate(text) if l.startswith('"ID"') or l.startswith("Start"))
    rows = list(csv.DictReader(text[first:]))
    if "Kernel Name" in rows[0]:
        # Nsight Compute (gpu__time_duration per kernel, serialized): busy times only, laid end to end.
        out, t = [], 0
        for r in sorted(rows, key=lambda r: int(r["ID"])):
            if r.get("Metric Name") != "gpu__time_duration.sum":
                continue
            v = float(r["Metric Value"].replace(",", ""))
            dur = int(v * (1000 if r.get("Metric Unit") == "usecond" else 1e6 if r.get("Metric Unit") == "msecond" else 1))
            out.append((t, dur, short(r["Kernel Name"])))
            t += dur
        return out
    key_start = next(k for k in rows[0] if k.startswith("Start"))
    key_dur = next(k for k in rows[0] if k.startswith("Duration"))
    out = []
    for r in rows:
        name = r.get("Name", "")
        if "[CUDA" in name:  # memcpy / memset rows
            continue
        out.append((int(float(r[key_start])), int(float(r[key_dur])), short(name)))
    out.sort()
    return out


def steps_of(kernels):
    steps, cur = [], []
    for k in kernels:
        if k[2].startswith("embedding") and cur:
            steps.append(cur)
            cur = []
        cur.append(k)
    # The kernels after the last embedding are dropped: a profile cut at --launch-count ends
    # inside a step, and a complete last step cannot be told from a cut one.
    return [s for s in steps if len(s) > 20]


def summarise(label, steps):
    steps = steps[2:]
    if not steps:
        return
    n = len(steps)
    busy, count, gap = defaultdict(float), defaultdict(int), defaultdict(float)
    span = busy_all = gap_all = 0.0
    for s in steps:
        span += (s[-1][0] + s[-1][1] - s[0][0]) / 1e3
        prev_end = None
        for start, dur, name in s:
            busy[name] += dur / 1e3
            count[name] += 1
            busy_all += dur / 1e3
            if prev_end is not None:
                g = max(0, start - prev_end) / 1e3
                gap[name] += g
                gap_all += g
            prev_end = max(prev_end or 0, start + dur)
    print(f"== {label}: {n} steps")
    print(f"{'kernel':48s} {'per step':>8s} {'busy us':>9s} {'gap us':>8s}")
    for name in sorted(busy, key=lambda k: -busy[k]):
        print(f"{name:48s} {count[name] / n:8.1f} {busy[name] / n:9.1f} {gap[name] / n:8.1f}")
    print(f"step span {span / n:.1f} us, kernels busy {busy_all / n:.1f} us, gaps {gap_all / n:.1f} us\n")


def main():
    kernels = load(sys.argv[1])
    steps = steps_of(kernels)
    sparse = [s for s in steps if any("score" in k[2] for k in s)]
    dense = [s for s in steps if not any("score" in k[2] for k in s)]
    # Decode steps only: prefill steps run the prefill attention kernel.
    dense = [s for s in dense if not any("prefill" in k[2] for k in s)]
    summarise("dense decode", dense)
    summarise("sparse decode", sparse)


if __name__ == "__main__":
    main()
