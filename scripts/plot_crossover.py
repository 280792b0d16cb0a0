#!/usr/bin/env python3
"""Where sparse selection starts to pay end to end: dense TPOT / sparse TPOT against the batch's
total context (ctx x batch), from the rows of bench/results/decode_e2e.jsonl of one commit
(`bash bench/device_all.sh crossover`). Writes docs/img/sparse_crossover.png.

    python3 scripts/plot_crossover.py [COMMIT]   (default: the newest commit with 98,304-token rows)
"""
import json
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

root = Path(__file__).resolve().parent.parent
rows = [json.loads(l) for l in (root / "bench/results/decode_e2e.jsonl").read_text().splitlines() if l.strip()]
commit = sys.argv[1] if len(sys.argv) > 1 else [r["commit"] for r in rows if r.get("ctx") == 98304][-1]
rows = [r for r in rows if r["commit"] == commit and "policy" in r and r.get("graph", True) and r.get("reselect_every", 1) == 1]
dense = {(r["ctx"], r["batch"]): r["tpot_ms"] for r in rows if r["policy"] == "dense"}
series = defaultdict(list)
for r in rows:
    if r["policy"] == "dense" or (r["ctx"], r["batch"]) not in dense:
        continue
    series[(r["policy"], r["batch"])].append((r["ctx"] * r["batch"], dense[(r["ctx"], r["batch"])] / r["tpot_ms"]))

fig, ax = plt.subplots(figsize=(7.5, 4.5))
marks = {1: "o", 2: "s", 4: "^", 8: "D"}
for (pol, b), pts in sorted(series.items()):
    pts.sort()
    label = pol.replace("trace:", "").replace("@sketch4", " (sketch4)") + f", batch {b}"
    ls = "-" if "0.99" in pol else "--"
    ax.plot([p[0] / 1024 for p in pts], [p[1] for p in pts], ls, marker=marks.get(b, "x"), label=label)
ax.axhline(1.0, color="gray", lw=1)
ax.set_xscale("log", base=2)
ax.set_xlabel("context tokens in the batch (ctx x batch), thousands")
ax.set_ylabel("dense TPOT / sparse TPOT")
ax.set_title(f"8B shape on the H200: where selection pays ({commit})")
ax.legend(fontsize=7, ncol=2)
ax.grid(alpha=0.3)
out = root / "docs/img/sparse_crossover.png"
fig.tight_layout()
fig.savefig(out, dpi=120)
print(f"wrote {out}")
for (pol, b), pts in sorted(series.items()):
    print(pol, "batch", b, " ".join(f"{t // 1024}k:{s:.2f}" for t, s in sorted(pts)))
