#!/usr/bin/env python3
"""--reselect-every R: accuracy against speed, from the rows in bench/results/.
Usage: python3 scripts/plot_reselect.py
  accuracy: accuracy.jsonl rows of the device runs 8c965f4 and 34d1ae6 (SmolLM2, 4096 tokens,
            the same 81 samples per task), top-1 agreement with dense pooled over the 7 tasks
  speed:    decode_e2e.jsonl rows of the same runs (8B-shaped model, 128k x 4, budgets replayed
            from the SmolLM2 traces: 7,680 tokens in 8c965f4, this 4,096-token run in 34d1ae6)
Writes docs/img/reselect_tradeoff.png and prints the table it plots."""
import json
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

root = Path(__file__).resolve().parent.parent
res = root / "bench" / "results"


def rows(name, commits):
    return [r for r in (json.loads(l) for l in (res / name).read_text().splitlines() if l.strip())
            if r.get("commit") in commits]


# Pooled top-1 agreement per label (steps-weighted over the tasks); a label measured in both runs
# (same samples: the runs are deterministic) is taken from the later one.
acc = {}
for commit in ("8c965f4", "34d1ae6"):
    agg = defaultdict(lambda: [0.0, 0, 0.0])
    for r in rows("accuracy.jsonl", {commit}):
        if r["length"] != 4096 or r["label"] == "dense" or r["device"] != "cuda":
            continue
        a = agg[r["label"]]
        a[0] += r["top1_agree"] * r["decode_steps"]
        a[1] += r["decode_steps"]
        a[2] += r["pages_read_frac"] * r["decode_steps"]
    for label, (t, n, p) in agg.items():
        acc[label] = (t / n, p / n)

# Speed: dense / this TPOT at 128k x 4, keyed by (gamma, R) and the trace length.
speed = {}
for r in rows("decode_e2e.jsonl", {"8c965f4", "34d1ae6"}):
    if r.get("ctx") != 131072 or r.get("batch") != 4 or r.get("policy", "dense") == "dense":
        continue
    key = (r["gamma"], r.get("reselect_every", 1), "7.7k" if r["commit"] == "8c965f4" else "4k")
    speed[key] = (r["dense_tpot_ms"] / r["tpot_ms"], r["pages_read_frac"])

print("| policy (4k, 81 samples/task) | top-1 % | pages | TPOT dense/this, 128k x 4 (4k budgets) | (7.7k budgets) |")
print("|---|---|---|---|---|")
pts = []
for label, (top1, pages) in sorted(acc.items(), key=lambda kv: -kv[1][0]):
    g = float(label.split("-")[1])
    rr = int(label.split("-r")[1]) if "-r" in label else 1
    s4 = speed.get((g, rr, "4k"))
    s7 = speed.get((g, rr, "7.7k"))
    print(f"| {label} | {top1:.2f} | {pages:.3f} | {s4[0]:.2f} |" if s4 else f"| {label} | {top1:.2f} | {pages:.3f} | - |", end="")
    print(f" {s7[0]:.2f} |" if s7 else " - |")
    pts.append((label, g, rr, top1, s4, s7))

fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
for label, g, rr, top1, s4, s7 in pts:
    if g == 0.99:
        ax[0].plot(rr, top1, "o", color="C0")
        ax[0].annotate(f"R {rr}", (rr, top1), textcoords="offset points", xytext=(5, 3), fontsize=8)
    if s4:
        ax[1].plot(s4[0], top1, "s", color="C1" if rr > 1 else "C2")
        ax[1].annotate(label, (s4[0], top1), textcoords="offset points", xytext=(4, 3), fontsize=7)
ax[0].axhline(99, color="gray", ls="--", lw=0.8)
ax[0].set_xscale("log", base=2)
ax[0].set_xlabel("--reselect-every R (coverage 0.99, sketch4)")
ax[0].set_ylabel("top-1 agreement with dense, % (7 tasks pooled)")
ax[0].set_title("SmolLM2-135M, 4,096 tokens, 81 samples per task (H200)")
ax[1].axhline(99, color="gray", ls="--", lw=0.8)
ax[1].set_xlabel("TPOT dense / this, 8B shape at 128k x 4 (4k budgets replayed)")
ax[1].set_ylabel("top-1 agreement with dense, %")
ax[1].set_title("green: every step; orange: reused (R > 1)")
fig.tight_layout()
out = root / "docs" / "img" / "reselect_tradeoff.png"
fig.savefig(out, dpi=110)
print(f"wrote {out.relative_to(root)}")
