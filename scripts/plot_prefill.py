#!/usr/bin/env python3
"""Prefill attention of one layer (8B shape: 32 q / 8 KV heads, d 128, causal, batch 1) by kernel,
against cuDNN and FA2 SDPA timed in the same device call (bench/results/prefill_attention.jsonl,
`bash bench/device_all.sh prefill`); and the 8B shape's TTFT at 32k per prefill kernel from the
same call (bench/results/decode_e2e.jsonl, rows with `prefill_attention`). Writes
docs/img/prefill.png.

    python3 scripts/plot_prefill.py [COMMIT]   (default: 6c92add)
"""
import json
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

root = Path(__file__).resolve().parent.parent
commit = sys.argv[1] if len(sys.argv) > 1 else "6c92add"


def rows(name):
    return [json.loads(l) for l in (root / "bench/results" / name).read_text().splitlines() if l.strip()]


# The rows of this commit's call; the anchor rows carry the same commit. "single" is the default
# of the commit that ran: v2 until 6c92add (whose call timed v3 as "single-wgmma128ws"), v3 after
# (v2 then as "single-wgmma128").
mine = [r for r in rows("prefill_attention.jsonl") if r.get("commit") == commit]
v3_apart = any(r.get("mode") == "single-wgmma128ws" for r in mine)
label = {
    "single-mmasync": "dhisparse mma.sync (v1)",
    ("single" if v3_apart else "single-wgmma128"): "dhisparse wgmma (v2)",
    ("single-wgmma128ws" if v3_apart else "single"): "dhisparse wgmma, warp-specialized (v3, default)",
    "cudnn-sdpa": "cuDNN SDPA",
    "flash-sdpa": "FA2 SDPA",
}
tflops = defaultdict(dict)  # label -> ctx -> TFLOP/s
for r in mine:
    key = r.get("mode") if r["impl"] == "dhisparse-prefill" else r["impl"]
    if key in label:
        tflops[label[key]][r["ctx"]] = r["tflops"]
if not tflops:
    sys.exit(f"no prefill rows for commit {commit}")

ttft = defaultdict(list)  # kernel -> seconds (each alternation)
for r in rows("decode_e2e.jsonl"):
    if r.get("commit") == commit and "prefill_attention" in r:
        ttft[r["prefill_attention"]].append(r["ttft_s"])

fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
ctxs = sorted({c for v in tflops.values() for c in v})
order = ["dhisparse mma.sync (v1)", "dhisparse wgmma (v2)", "dhisparse wgmma, warp-specialized (v3, default)",
         "cuDNN SDPA", "FA2 SDPA"]
names = [n for n in order if n in tflops]
w = 0.8 / len(names)
for i, n in enumerate(names):
    xs = [j + (i - (len(names) - 1) / 2) * w for j in range(len(ctxs))]
    ys = [tflops[n].get(c, 0) for c in ctxs]
    bars = ax.bar(xs, ys, w, label=n)
    ax.bar_label(bars, fmt="%.0f", fontsize=7)
ax.set_xticks(range(len(ctxs)), [f"{c // 1024}k" for c in ctxs])
ax.set_ylabel("TFLOP/s (causal, 4·S²·h·d / 2)")
ax.set_title(f"Prefill attention, one layer (H200, {commit})")
ax.legend(fontsize=7, loc="lower right")

kern = [k for k in ("mma.sync", "wgmma", "wgmma-ws") if k in ttft]
bx.bar(kern, [min(ttft[k]) for k in kern], color="tab:gray")
for i, k in enumerate(kern):
    bx.annotate(" / ".join(f"{t:.2f}" for t in ttft[k]), (i, min(ttft[k])), ha="center", va="bottom", fontsize=8)
bx.set_ylabel("TTFT at 32k (s), 8B shape")
bx.set_title("TTFT, runs alternated in one call")

fig.tight_layout()
out = root / "docs/img/prefill.png"
fig.savefig(out, dpi=120)
print(f"wrote {out}")
