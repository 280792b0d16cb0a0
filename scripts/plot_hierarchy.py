#!/usr/bin/env python3
"""The KV hierarchy's decode throughput against its bandwidth floor (issue 23), from
bench/results/hierarchy.jsonl.
Usage: python3 scripts/plot_hierarchy.py
  rows: `dhisparse-bench --hierarchy` (bench/device_all.sh stages hierarchy, hierrows, hieroverlap,
  landoverlap): the 8B shape with random weights and KV, 128k contexts, coverage budgets replayed
  from SmolLM2-135M's traces (or dense), the HBM KV pool capped at 32 GiB, a host tier (host_kv_gib
  > 0) or none. floor_tok_s: weights + selected pages + sketch at the measured HBM copy rate, the
  step's late pages at the measured PCIe rate (hierarchy_bench.cpp). Only rows with a host tier are
  drawn, in file order (which is commit order), one colour per (policy, batch).
Writes docs/img/hierarchy_floor.png and prints the table it plots."""
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

root = Path(__file__).resolve().parent.parent
rows = [json.loads(l) for l in (root / "bench" / "results" / "hierarchy.jsonl").read_text().splitlines() if l.strip()]
rows = [r for r in rows if r.get("host_kv_gib", 0) > 0 and r.get("floor_tok_s")]


def series(r):
    pol = r["policy"].replace("trace:", "").replace("@sketch4", "")
    return f"{pol}, batch {r['batch']}"


def session(r):
    m = re.search(r"session (\d+)", str(r.get("note", "")))
    return f"s{m.group(1)}" if m else ""


keys = sorted({series(r) for r in rows})
fig, ax = plt.subplots(figsize=(10, 4.2))
markers = "osD^v<>"
for i, k in enumerate(keys):
    xs = [j for j, r in enumerate(rows) if series(r) == k]
    ys = [rows[j]["tok_s"] / rows[j]["floor_tok_s"] for j in xs]
    ax.plot(xs, ys, markers[i % len(markers)], label=k, alpha=0.8)
ax.axhline(0.8, color="grey", ls="--", lw=1)
ax.text(len(rows) - 1, 0.81, "issue 23's goal: 80% of the floor", color="grey", fontsize=8, ha="right")
# the sessions' spans along the x axis
last, start = None, 0
for j, r in enumerate(rows + [{"note": "end"}]):
    s = session(r) if j < len(rows) else "end"
    if s != last and last is not None:
        if last:
            ax.axvspan(start - 0.5, j - 0.5, color="0.93" if len(ax.patches) % 2 else "0.86", zorder=0)
            ax.text((start + j - 1) / 2, 0.02, last, ha="center", fontsize=7)
        start = j
    last = s
ax.set_ylim(0, 1)
ax.set_xlabel("hierarchy.jsonl rows with the host tier, in commit order (shaded: the session that measured them)")
ax.set_ylabel("tok/s over the floor's tok/s")
gpus = sorted({r.get("gpu", "?").replace("NVIDIA ", "") for r in rows})
ax.set_title(f"KV hierarchy, 8B shape at 128k, HBM KV capped at 32 GiB + host tier (harness; {', '.join(gpus)})", fontsize=10)
ax.legend(fontsize=7, loc="upper left", ncol=2)
fig.tight_layout()
out = root / "docs" / "img" / "hierarchy_floor.png"
fig.savefig(out, dpi=110)
print(f"{'commit':8} {'gpu':22} {'series':32} {'tok/s':>7} {'floor':>7} {'frac':>5}  note")
for r in rows:
    print(f"{r['commit']:8} {r.get('gpu', '')[:22]:22} {series(r):32} {r['tok_s']:7.1f} {r['floor_tok_s']:7.1f} "
          f"{r['tok_s'] / r['floor_tok_s']:5.2f}  {str(r.get('note', ''))[:40]}")
print(f"wrote {out}")
