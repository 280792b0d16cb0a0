#!/usr/bin/env python3
"""Cheaper key sketches on the CPU (docs/sparse.md, "Fewer coordinates in another basis?"):
per estimator at coverage 0.99, mean pages read against mean KL(dense || policy) over the 7 tasks,
from bench/results/accuracy.jsonl (device cpu). Writes docs/img/sketch_study.png."""
import collections
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
rows = [json.loads(l) for l in open(os.path.join(root, "bench/results/accuracy.jsonl"))]
# The latest screening row of each (model, estimator) at 2,048 tokens, gamma 0.99, on the CPU.
by = collections.defaultdict(dict)
for r in rows:
    if r.get("device") != "cpu" or r.get("policy") != "coverage" or r.get("length") != 2048 or r.get("gamma") != 0.99:
        continue
    by[(r["model"], r["estimator"])][r["task"]] = r
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
for ax, model in zip(axes, ["SmolLM2-135M-Instruct.Q4_1.gguf", "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf"]):
    for (m, est), tasks in sorted(by.items()):
        if m != model or len(tasks) < 7:
            continue
        pages = sum(t["pages_read_frac"] for t in tasks.values()) / len(tasks)
        kl = sum(t["kl_mean"] for t in tasks.values()) / len(tasks)
        top1 = min(t["top1_agree"] for t in tasks.values())
        ax.scatter(pages, kl, s=40)
        ax.annotate(f"{est} (top-1 >= {top1:.1f}%)", (pages, kl), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xscale("linear")
    ax.set_yscale("log")
    ax.set_xlabel("pages read (mean over 7 tasks)")
    ax.set_ylabel("KL(dense || policy), mean")
    ax.set_title(model.split(".Q")[0] + ", 2,048 tokens, coverage 0.99", fontsize=9)
    ax.grid(alpha=0.3)
fig.tight_layout()
out = os.path.join(root, "docs/img/sketch_study.png")
fig.savefig(out, dpi=110)
print("wrote", out, file=sys.stderr)
