#!/usr/bin/env python3
"""Latency against throughput from bench/results/serve.jsonl (bench/serve_load.py's rows) into
docs/serve_latency.png: one line per (device, model, ctx, policy), its points the offered loads
(rate or concurrency) in order of throughput; TTFT and TPOT, p50 solid and p99 dashed.

  python3 bench/plot_serve.py [--results FILE] [--out PNG] [--device cpu]
Skips with a message (exit 0) when matplotlib is not installed
(bash scripts/serve_test_env.sh --plot installs it in .venv-serve).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", default=str(ROOT / "bench" / "results" / "serve.jsonl"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "serve_latency.png"))
    ap.add_argument("--device", default=None, help="only rows of this device")
    ap.add_argument("--commit", default=None, help="only rows of this commit (prefix)")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_serve: matplotlib is not installed; no plot drawn "
              "(bash scripts/serve_test_env.sh --plot, then .venv-serve/bin/python bench/plot_serve.py)")
        return 0
    path = Path(args.results)
    if not path.exists():
        print(f"plot_serve: no {path}")
        return 1
    series: dict[tuple, list[dict]] = defaultdict(list)
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if args.device and row.get("device") != args.device:
            continue
        if args.commit and not str(row.get("commit", "")).startswith(args.commit):
            continue
        if row.get("n_ok", 0) == 0:
            continue
        series[(row.get("device"), row.get("model"), str(row.get("ctx")), row.get("policy"))].append(row)
    if not series:
        print("plot_serve: no rows to plot")
        return 1
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for (device, model, ctx, policy), rows in sorted(series.items(), key=str):
        rows.sort(key=lambda r: r["out_tok_s"])
        x = [r["out_tok_s"] for r in rows]
        label = f"{device} · {model} · ctx {ctx} · {policy}"
        for ax, metric in zip(axes, ("ttft", "tpot")):
            p50 = ax.plot(x, [r[f"{metric}_p50_ms"] for r in rows], "o-", label=label)[0]
            ax.plot(x, [r[f"{metric}_p99_ms"] for r in rows], "x--", color=p50.get_color())
            for r, xi in zip(rows, x):
                load = f"c{r['concurrency']}" if r.get("concurrency") else f"{r.get('rate')}/s"
                ax.annotate(load, (xi, r[f"{metric}_p50_ms"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    for ax, title in zip(axes, ("TTFT (ms)", "TPOT (ms)")):
        ax.set_xlabel("output tokens/s (all requests)")
        ax.set_ylabel(title)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(f"{title}: p50 solid, p99 dashed")
    axes[0].legend(fontsize=7)
    fig.suptitle("dhisparse serve: latency against throughput (bench/serve_load.py)")
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"plot_serve: {sum(len(v) for v in series.values())} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
