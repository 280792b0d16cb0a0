#!/usr/bin/env python3
"""Selection cost by commit (issue 4): the sketch4 score, select and compact kernels timed alone and
the three in one graph, at 128k x 1 and 128k x 8, as a share of dense attention in the same call.
Reads bench/results/decode_attention.jsonl; writes docs/img/selection_history.png and prints a table.
Usage: python3 scripts/plot_selection.py [COMMIT ...]   (default: every commit with breakdown rows)"""
import json
import sys
from collections import OrderedDict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

root = Path(__file__).resolve().parent.parent
rows = [json.loads(l) for l in (root / "bench/results/decode_attention.jsonl").read_text().splitlines() if l.strip()]
base = "select-coverage-sketch4"
data = OrderedDict()  # commit -> {(batch, part): us}
for r in rows:
    if r.get("ctx") != 131072 or "us" not in r:
        continue
    imp = r.get("impl", "")
    if imp == "dhisparse-dense" or imp == base or imp.startswith(base + "/"):
        data.setdefault(r["commit"], {})[(r["batch"], imp)] = r["us"]
# Default: every commit with breakdown rows, in history order (git), but 343837a (it failed a test).
import subprocess

order = subprocess.run(["git", "-C", str(root), "rev-list", "--reverse", "--abbrev-commit", "HEAD"],
                       capture_output=True, text=True).stdout.split()
rank = {c[:7]: i for i, c in enumerate(order)}
commits = sys.argv[1:] or sorted((c for c, v in data.items() if (8, base + "/score") in v and c != "343837a"),
                                 key=lambda c: rank.get(c, len(rank)))
parts = [("score", "#4477aa"), ("select", "#ee6677"), ("compact", "#228833")]
fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
print("| commit | batch | score | select | compact | pipeline | dense | share |")
print("|---|---|---|---|---|---|---|---|")
for ax, batch in zip(axes, (1, 8)):
    xs = [c for c in commits if (batch, base + "/score") in data.get(c, {})]
    bottom = [0.0] * len(xs)
    for name, color in parts:
        ys = [data[c][(batch, f"{base}/{name}")] for c in xs]
        ax.bar(range(len(xs)), ys, bottom=bottom, color=color, label=f"{name} (alone)")
        bottom = [b + y for b, y in zip(bottom, ys)]
    pipe = [data[c].get((batch, base), float("nan")) for c in xs]
    dense = [data[c].get((batch, "dhisparse-dense"), float("nan")) for c in xs]
    ax.plot(range(len(xs)), pipe, "ko-", label="pipeline (one graph)")
    ax.plot(range(len(xs)), [0.1 * d for d in dense], "k--", label="goal: 10% of dense")
    ax.set_xticks(range(len(xs)))
    ax.set_xticklabels(xs, rotation=60, fontsize=8)
    ax.set_ylabel("us per layer")
    ax.set_title(f"sketch4 scoring + selection, 128k x {batch} (coverage 0.99, H200)")
    for c, p_, d in zip(xs, pipe, dense):
        v = data[c]
        print(f"| {c} | {batch} | {v[(batch, base + '/score')]:.1f} | {v[(batch, base + '/select')]:.1f} | "
              f"{v[(batch, base + '/compact')]:.1f} | {p_:.1f} | {d:.1f} | {100 * p_ / d:.1f}% |")
axes[0].legend(fontsize=8)
fig.tight_layout()
out = root / "docs/img/selection_history.png"
fig.savefig(out, dpi=110)
print(f"wrote {out}")
