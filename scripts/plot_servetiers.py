#!/usr/bin/env python3
"""Serving with and without the KV hierarchy's host tier (issue 23), from bench/results/serve.jsonl.
Usage: python3 scripts/plot_servetiers.py
  rows: the `servetiers` stage of bench/device_all.sh (notes starting "servetiers"): the default model
  behind `dhisparse serve --device cuda`, 7,000 + 128 tokens a request, coverage 0.99, the KV pool
  capped at 2,000 blocks (cap, ahead, land) or not (uncapped); ahead / land add a 4 GiB host tier
  with auto budgets. For each configuration and load the latest row is taken.
Writes docs/img/serve_tiers.png and prints the table it plots."""
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

root = Path(__file__).resolve().parent.parent
rows = [json.loads(l) for l in (root / "bench" / "results" / "serve.jsonl").read_text().splitlines() if l.strip()]
# (not plotted: diagnostic runs, with a per-step log on, and A/B runs of a non-default setting —
# an environment override DHS_..., or a server flag in the note)
rows = [r for r in rows if str(r.get("note", "")).startswith("servetiers")
        and not any(w in r["note"] for w in ("diagnostic", "DHS_", "--"))]
CONFIGS = ["cap", "ahead", "land", "uncapped"]
LABELS = {"cap": "capped pool,\nno host tier", "ahead": "capped + host,\nrecall ahead", "land": "capped + host,\nlanding",
          "uncapped": "every page\nin HBM"}


def config(r):
    return r["note"].split()[1]


def load(r):
    return "saturation" if r.get("rate") is None else f"rate {r['rate']:g}/s"


latest = {}
for r in rows:  # (file order is time order: later rows replace earlier ones)
    latest[(config(r), load(r))] = r
loads = sorted({k[1] for k in latest}, key=lambda s: (s != "saturation", s))
print(f"{'config':10} {'load':12} {'commit':8} {'req/s':>7} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} {'TPOT p99':>9} {'hit':>6}")
for ld in loads:
    for c in CONFIGS:
        r = latest.get((c, ld))
        if r:
            print(f"{c:10} {ld:12} {r['commit']:8} {r['req_s']:7.2f} {r['ttft_p50_ms']:9.0f} {r['ttft_p99_ms']:9.0f} "
                  f"{r['tpot_p50_ms']:9.1f} {r['tpot_p99_ms']:9.1f} {r.get('tier_hit_rate', float('nan')):6.3f}")

fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
x = range(len(CONFIGS))
width = 0.8 / max(1, len(loads))
for j, ld in enumerate(loads):
    got = [latest.get((c, ld)) for c in CONFIGS]
    off = [i + (j - (len(loads) - 1) / 2) * width for i in x]
    axes[0].bar(off, [r["req_s"] if r else 0 for r in got], width, label=ld)
    for k, (name, ax) in enumerate((("tpot", axes[1]), ("ttft", axes[2]))):
        p50 = [r[f"{name}_p50_ms"] if r else 0 for r in got]
        p99 = [r[f"{name}_p99_ms"] if r else 0 for r in got]
        ax.bar(off, p50, width, label=f"{ld} p50", color=f"C{j}")
        ax.scatter(off, p99, marker="_", s=200, color=f"C{j}", label=f"{ld} p99", zorder=3)
for ax, title in zip(axes, ("throughput (requests/s)", "TPOT (ms)", "TTFT (ms)")):
    ax.set_xticks(list(x))
    ax.set_xticklabels([LABELS[c] for c in CONFIGS], fontsize=8)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
axes[1].set_yscale("log")
axes[2].set_yscale("log")
axes[0].legend(fontsize=8)
axes[1].legend(fontsize=7)
dev = rows[-1]["device"] if rows else "?"
fig.suptitle(f"Serving 16 requests of 7k tokens with and without the host tier ({dev}, default model, coverage 0.99; "
             "saturation: all 16 at once)", fontsize=10)
fig.tight_layout()
out = root / "docs" / "img" / "serve_tiers.png"
fig.savefig(out, dpi=110)
print(f"wrote {out.relative_to(root)}")
