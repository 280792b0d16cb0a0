#!/usr/bin/env python3
"""Summarise the sparse-decode results: markdown tables on stdout and plots in docs/img/.
Usage: python3 scripts/plot_sparse.py SPEED_COMMIT ACCURACY_COMMIT
  SPEED_COMMIT:    rows of bench/results/decode_attention.jsonl and decode_e2e.jsonl
  ACCURACY_COMMIT: rows of bench/results/accuracy.jsonl"""
import json
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

root = Path(__file__).resolve().parent.parent
speed, acc_commit = sys.argv[1], sys.argv[2]
img = root / "docs" / "img"
img.mkdir(parents=True, exist_ok=True)


def load(name, commit):
    p = root / "bench" / "results" / name
    rows = [json.loads(l) for l in p.read_text().splitlines() if l.strip()]
    return [r for r in rows if r.get("commit") == commit]


# ---- per-layer attention -------------------------------------------------------------
att = {}
for r in load("decode_attention.jsonl", speed):
    if "ctx" in r and "us" in r:
        att[(r["impl"], r["ctx"], r["batch"])] = r
shapes = sorted({(c, b) for (i, c, b) in att if i.startswith("dhisparse-coverage")})
impls = ["dhisparse-dense", "cudnn-sdpa", "dhisparse-coverage-0.99", "dhisparse-coverage-0.99-minmax",
         "dhisparse-coverage-0.98", "dhisparse-coverage-0.95", "dhisparse-quest-4096", "dhisparse-quest-1024"]
print("| ctx x batch | " + " | ".join(i.replace("dhisparse-", "") for i in impls) + " | select (MinMax) | select (sketch4) |")
print("|---" * (len(impls) + 3) + "|")
for c, b in shapes:
    d = att[("dhisparse-dense", c, b)]["us"]
    cells = []
    for i in impls:
        r = att.get((i, c, b))
        if r is None:
            cells.append("-")
        elif i in ("dhisparse-dense", "cudnn-sdpa"):
            cells.append(f"{r['us']:.1f}")
        else:
            cells.append(f"{r['us']:.1f} ({r['pages_read_frac']:.2f}, {d / r['us']:.2f}x)")
    for sel in ("select-coverage", "select-coverage-sketch4"):
        s = att.get((sel, c, b))
        cells.append(f"{s['us']:.1f} ({100 * s['us'] / d:.0f}% of dense)" if s else "-")
    print(f"| {c // 1024}k x {b} | " + " | ".join(cells) + " |")

fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4), squeeze=False)
for ax, (c, b) in zip(axes[0], shapes):
    names = [i for i in impls + ["select-coverage", "select-topk", "select-coverage-sketch4"] if (i, c, b) in att]
    vals = [att[(i, c, b)]["us"] for i in names]
    colors = ["#555" if i in ("dhisparse-dense", "cudnn-sdpa") else "#c33" if i.startswith("select") else "#37a"
              for i in names]
    ax.barh([n.replace("dhisparse-", "") for n in names], vals, color=colors)
    ax.set_xlabel("µs per layer (H200, L2 flushed, graph replay)")
    ax.set_title(f"decode attention {c // 1024}k × {b}, Llama-3.1-8B shape")
    ax.invert_yaxis()
fig.tight_layout()
fig.savefig(img / "sparse_attention.png", dpi=110)

# ---- end to end ---------------------------------------------------------------------------
e2e = [r for r in load("decode_e2e.jsonl", speed) if "tpot_ms" in r]
print("\n| ctx x batch | policy | pages read | TPOT ms | dense TPOT ms | dense / policy |")
print("|---|---|---|---|---|---|")
for r in e2e:
    dense = r.get("dense_tpot_ms") or r["tpot_ms"]
    print(f"| {r['ctx'] // 1024}k x {r['batch']} | {r['policy']} | {r.get('pages_read_frac', 1):.3f} | "
          f"{r['tpot_ms']:.2f} | {dense:.2f} | {dense / r['tpot_ms']:.2f} |")

# ---- accuracy -----------------------------------------------------------------------------
acc = load("accuracy.jsonl", acc_commit)
by = defaultdict(list)
for r in acc:
    by[(r["length"], r["label"])].append(r)
labels = sorted({r["label"] for r in acc}, key=lambda s: (s != "dense", s))
lengths = sorted({r["length"] for r in acc})
print("\n| length | policy | samples/task | score (mean of tasks) | top-1 agree % | KL mean | pages read |")
print("|---|---|---|---|---|---|---|")
summary = {}
for L in lengths:
    for lab in labels:
        rs = by.get((L, lab), [])
        if not rs:
            continue
        steps = sum(r["decode_steps"] for r in rs)
        score = sum(r["score"] for r in rs) / len(rs)
        top1 = sum(r["top1_agree"] * r["decode_steps"] for r in rs) / steps if steps else 100.0
        kl = sum(r["kl_mean"] * r["decode_steps"] for r in rs) / steps if steps else 0.0
        pages = sum(r["pages_read_frac"] for r in rs) / len(rs)
        summary[(L, lab)] = (score, top1, pages)
        print(f"| {L} | {lab} | {rs[0]['samples']} | {score:.1f} | {top1:.1f} | {kl:.3f} | {pages:.3f} |")

fig, axes = plt.subplots(1, 2, figsize=(12, 4))
for L in lengths:
    labs = [l for l in labels if l != "dense" and (L, l) in summary]
    axes[0].plot([summary[(L, l)][2] for l in labs], [summary[(L, l)][1] for l in labs], "o", label=f"{L} tokens")
    for l in labs:
        axes[0].annotate(l, (summary[(L, l)][2], summary[(L, l)][1]), fontsize=7)
    axes[1].bar([f"{l}\n{L}" for l in ["dense"] + labs], [summary[(L, l)][0] for l in ["dense"] + labs])
axes[0].set_xlabel("KV pages read (fraction)")
axes[0].set_ylabel("top-1 agreement with dense (%)")
axes[0].legend()
axes[0].set_title("fidelity vs pages read (teacher-forced)")
axes[1].set_ylabel("task score (mean over 7 tasks)")
axes[1].tick_params(axis="x", labelsize=6, rotation=90)
axes[1].set_title("accuracy, greedy")
fig.tight_layout()
fig.savefig(img / "sparse_accuracy.png", dpi=110)
