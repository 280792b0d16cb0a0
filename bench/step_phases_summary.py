#!/usr/bin/env python3
"""Summarizes the CUDA runner's DHS_STEP_PHASES lines (a server's stderr, or any log holding them):
per step kind (prefill / decode) and decode-row count bucket, the steps' count and mean wall time,
the hierarchy's host time and after-step, the kernels' time, and the pages they moved — what a
step of the KV hierarchy costs beside its kernels (docs/hierarchy.md).

  python3 bench/step_phases_summary.py /tmp/dhs-load-*/stderr.log
"""
import re
import sys
from collections import defaultdict

LINE = re.compile(r"step phases: (\w+) seqs (\d+) rows (\d+) \| step ([\d.]+) ms, hierarchy host ([\d.]+) \(after-step ([\d.]+)\)"
                  r".*?kernels ([\d.]+)\).*?\| late (\d+) recalled (\d+) offloaded (\d+) hits (\d+)")


def main(paths):
    acc = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0, 0])
    for p in paths:
        for line in open(p, errors="replace"):
            m = LINE.search(line)
            if not m:
                continue
            kind, seqs = m.group(1), int(m.group(2))
            step, host, after, kernels = (float(m.group(i)) for i in (4, 5, 6, 7))
            late, rec, off, hits = (int(m.group(i)) for i in (8, 9, 10, 11))
            key = (kind, (seqs + 3) // 4 * 4)  # seqs bucketed by 4
            a = acc[key]
            a[0] += 1
            for i, v in enumerate((step, host, after, kernels), 1):
                a[i] += v
            for i, v in enumerate((late, rec, off, hits), 5):
                a[i] += v
    print(f"{'kind':8} {'seqs<=':>6} {'steps':>6} {'step ms':>8} {'host ms':>8} {'after ms':>8} {'kernels':>8} "
          f"{'late':>7} {'recalled':>8} {'offload':>8} {'hits':>8}")
    for (kind, b), a in sorted(acc.items()):
        n = a[0]
        print(f"{kind:8} {b:6d} {n:6d} {a[1]/n:8.2f} {a[2]/n:8.2f} {a[3]/n:8.2f} {a[4]/n:8.2f} "
              f"{a[5]/n:7.0f} {a[6]/n:8.0f} {a[7]/n:8.0f} {a[8]/n:8.0f}")


if __name__ == "__main__":
    main(sys.argv[1:])
