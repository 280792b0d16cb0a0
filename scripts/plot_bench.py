#!/usr/bin/env python3
"""Summarise bench/results/*.jsonl for one commit: markdown tables on stdout and
plots in docs/img/. Usage: python3 scripts/plot_bench.py COMMIT [RUN_ID_PREFIX]
(RUN_ID_PREFIX: only rows whose run_id starts with it, for a commit timed in several calls)"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

root = Path(__file__).resolve().parent.parent
commit = sys.argv[1]
run_prefix = sys.argv[2] if len(sys.argv) > 2 else ""
img = root / "docs" / "img"
img.mkdir(parents=True, exist_ok=True)


def load(name):
    p = root / "bench" / "results" / name
    rows = [json.loads(l) for l in p.read_text().splitlines() if l.strip()]
    return [r for r in rows if r.get("commit") == commit and str(r.get("run_id", "")).startswith(run_prefix)]


att = [r for r in load("decode_attention.jsonl") if "ctx" in r and "us" in r]
# Last row per (impl, ctx, batch).
best = {}
for r in att:
    best[(r["impl"], r["ctx"], r["batch"])] = r
shapes = sorted({(c, b) for (_, c, b) in best})
impls = ["dhisparse-dense", "cudnn-sdpa", "fa2", "dhisparse-sparse30"]
print("| ctx × batch | dhisparse dense µs (TB/s) | cuDNN SDPA µs | FA2 µs | SDPA / ours | sparse 30% µs | dense / sparse |")
print("|---|---|---|---|---|---|---|")
for c, b in shapes:
    g = lambda i: best.get((i, c, b))
    d, s, f, sp = g("dhisparse-dense"), g("cudnn-sdpa"), g("fa2"), g("dhisparse-sparse30")
    if not d:
        continue
    cell = lambda x: f"{x['us']:.1f}" if x else "–"
    print(f"| {c // 1024}k × {b} | {d['us']:.1f} ({d['GBps'] / 1000:.2f}) | {cell(s)} | {cell(f)} | "
          f"{(s['us'] / d['us']) if s else float('nan'):.2f} | {cell(sp)} | {(d['us'] / sp['us']) if sp else float('nan'):.2f} |")

fig, ax = plt.subplots(figsize=(9, 4.5))
labels = [f"{c // 1024}k×{b}" for c, b in shapes]
w = 0.2
for k, impl in enumerate(impls):
    ys = [best[(impl, c, b)]["us"] if (impl, c, b) in best else 0 for c, b in shapes]
    ax.bar([i + (k - 1.5) * w for i in range(len(shapes))], ys, w, label=impl)
ax.set_yscale("log")
ax.set_xticks(range(len(shapes)), labels, rotation=45)
ax.set_ylabel("µs per layer (log)")
ax.set_title(f"Decode attention, Llama-3.1-8B shape, H200 (commit {commit})")
ax.legend()
fig.tight_layout()
fig.savefig(img / "decode_attention.png", dpi=110)

# Dense rows only (sparse policies: scripts/plot_sparse.py), plain graph launches excluded when both
# were timed (the last row of a shape wins).
e2e = {}
for r in load("decode_e2e.jsonl"):
    if "tpot_ms" in r and r.get("policy", "dense") == "dense" and r.get("pdl", True):
        e2e[(r["ctx"], r["batch"])] = r
e2e = [e2e[k] for k in sorted(e2e)]
print()
print("| ctx × batch | TPOT ms | floor ms (weights + KV at device-copy rate) | TPOT / floor | tokens/s |")
print("|---|---|---|---|---|")
for r in e2e:
    print(f"| {r['ctx'] // 1024}k × {r['batch']} | {r['tpot_ms']:.2f} | {r['floor_ms']:.2f} | {r['tpot_ms'] / r['floor_ms']:.2f} | {r['batch'] / r['tpot_ms'] * 1e3:.0f} |")
for r in load("decode_e2e.jsonl"):
    if "ttft_s" in r:
        print(f"\nprefill {r['prefill_tokens']} tokens: TTFT {r['ttft_s']:.2f} s ({r['prefill_tok_s']:.0f} tokens/s)", end="")
print()
fig, ax = plt.subplots(figsize=(7, 4))
for ctx in sorted({r["ctx"] for r in e2e}):
    rs = [r for r in e2e if r["ctx"] == ctx]
    ax.plot([r["batch"] for r in rs], [r["tpot_ms"] for r in rs], "o-", label=f"{ctx // 1024}k TPOT")
    ax.plot([r["batch"] for r in rs], [r["floor_ms"] for r in rs], "x--", alpha=0.6, label=f"{ctx // 1024}k floor")
ax.set_xscale("log", base=2)
ax.set_xlabel("batch")
ax.set_ylabel("ms per output token")
ax.set_title(f"8B-shape decode step (graph replay), H200 (commit {commit})")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(img / "decode_e2e.png", dpi=110)
