#!/usr/bin/env python3
"""Prefill attention of one layer (8B shape: 32 q / 8 KV heads, d 128, causal, batch 1) by kernel,
against cuDNN and FA2 SDPA timed in the same device call (bench/results/prefill_attention.jsonl,
`bash bench/device_all.sh prefill`); and the 8B shape's TTFT at 32k per prefill kernel from the
same call (bench/results/decode_e2e.jsonl, rows with `prefill_attention`; 32k, and 128k where
timed). Writes docs/img/prefill.png.

    python3 scripts/plot_prefill.py [COMMIT [TTFT_COMMIT]]   (default: 56d1525; TTFT_COMMIT: the
    call whose TTFT rows to show, when COMMIT's call did not time TTFT)
"""
import json
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

root = Path(__file__).resolve().parent.parent
commit = sys.argv[1] if len(sys.argv) > 1 else "56d1525"
ttft_commit = sys.argv[2] if len(sys.argv) > 2 else commit


def rows(name):
    return [json.loads(l) for l in (root / "bench/results" / name).read_text().splitlines() if l.strip()]


# The rows of this commit's call; the anchor rows carry the same commit. "single" is the default
# of the commit that ran: v2 until 6c92add (whose call timed v3 as "single-wgmma128ws"), v3 from
# 6c92add (v2 then as "single-wgmma128"), v4 (ping-pong consumers, 3-tile ring) from 285de1c (v3
# then as "single-wgmma128ws").
mine = [r for r in rows("prefill_attention.jsonl") if r.get("commit") == commit]
modes = {r.get("mode") for r in mine}
V1, V2, V3, V4 = ("dhisparse mma.sync (v1)", "dhisparse wgmma (v2)", "dhisparse wgmma, warp-specialized (v3)",
                  "dhisparse v3 + ping-pong, 3-tile ring (v4)")
if "single-wgmma128ws-pp" in modes and "single-wgmma128ws" in modes:  # 285de1c on: v4 is the default
    label = {"single-mmasync": V1, "single-wgmma128": V2, "single-wgmma128ws": V3, "single": V4 + ", default"}
elif "single-wgmma128ws" in modes:  # 6c92add: v2 the default, v3 beside it
    label = {"single-mmasync": V1, "single": V2, "single-wgmma128ws": V3}
else:
    label = {"single-mmasync": V1, "single-wgmma128": V2, "single": V3 + ", default"}
label.update({"cudnn-sdpa": "cuDNN SDPA", "flash-sdpa": "FA2 SDPA"})
tflops = defaultdict(dict)  # label -> ctx -> TFLOP/s
for r in mine:
    key = r.get("mode") if r["impl"] == "dhisparse-prefill" else r["impl"]
    if key in label:
        tflops[label[key]][r["ctx"]] = r["tflops"]
if not tflops:
    sys.exit(f"no prefill rows for commit {commit}")

ttft = defaultdict(list)  # (prompt tokens, kernel) -> seconds (each alternation)
for r in rows("decode_e2e.jsonl"):
    if r.get("commit") == ttft_commit and "prefill_attention" in r:
        ttft[(r["prefill_tokens"], r["prefill_attention"])].append(r["ttft_s"])

fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 5), gridspec_kw={"width_ratios": [3, 2]})
ctxs = sorted({c for v in tflops.values() for c in v})
order = [V1, V2, V3, V3 + ", default", V4 + ", default", "cuDNN SDPA", "FA2 SDPA"]
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
ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3)

kern_order = ["mma.sync", "wgmma", "wgmma-ws", "wgmma-ws-pp", "wgmma-ws-pp-s3"]
short = {"mma.sync": "v1", "wgmma": "v2", "wgmma-ws": "v3", "wgmma-ws-pp": "v3+pp", "wgmma-ws-pp-s3": "v4"}
keys = sorted(ttft, key=lambda k: (k[0], kern_order.index(k[1]) if k[1] in kern_order else 99))
bx.bar(range(len(keys)), [k[0] / min(ttft[k]) / 1e3 for k in keys],
       color=["tab:gray" if k[0] <= 32768 else "tab:brown" for k in keys])
for i, k in enumerate(keys):
    bx.annotate(" / ".join(f"{t:.2f}" for t in ttft[k]) + " s", (i, k[0] / min(ttft[k]) / 1e3), ha="center", va="bottom",
                fontsize=6)
bx.set_xticks(range(len(keys)), [f"{n // 1024}k\n{short.get(k, k)}" for n, k in keys], fontsize=8)
bx.set_ylabel("prefill tokens/s (thousands), 8B shape")
bx.set_title(f"Chunked prefill (TTFT above the bars), one call ({ttft_commit})", fontsize=10)

fig.tight_layout()
out = root / "docs/img/prefill.png"
fig.savefig(out, dpi=120)
print(f"wrote {out}")
