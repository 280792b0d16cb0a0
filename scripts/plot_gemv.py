#!/usr/bin/env python3
"""The decode step's weight GEMMs on the tensor-core GEMV: one layer's four GEMMs per batch
(bench/results/weight_gemm.jsonl, `bash bench/device_all.sh gemvtc`) and the decode step's TPOT
before and after it, from the A/B rows of one call (bench/results/decode_e2e.jsonl: rows with
gemv_tc false are the kernels before). Writes docs/img/gemv.png.

    python3 scripts/plot_gemv.py [GEMM_COMMIT [AB_COMMIT]]   (defaults: a48e6db, 37c5f9c)
"""
import json
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

root = Path(__file__).resolve().parent.parent
gemm_commit = sys.argv[1] if len(sys.argv) > 1 else "a48e6db"
ab_commit = sys.argv[2] if len(sys.argv) > 2 else "37c5f9c"


def rows(name):
    return [json.loads(l) for l in (root / "bench/results" / name).read_text().splitlines() if l.strip()]


# Left: one layer's GEMMs, µs per batch size, per implementation (the engine's default ring only).
gemm = defaultdict(dict)
for r in rows("weight_gemm.jsonl"):
    if r["commit"] != gemm_commit:
        continue
    if r["impl"] == "dhisparse-gemv" and not r.get("ring", "").startswith("default"):
        continue
    gemm[r["impl"]][r["batch"]] = r["us"]
labels = {"dhisparse-cublaslt": "cuBLASLt", "dhisparse-gemv-cudacore": "CUDA-core GEMV",
          "dhisparse-gemv": "tensor-core GEMV (default)"}

# Right: dense and sparse TPOT, before (gemv_tc false) and now, mean of the call's runs.
tpot = defaultdict(list)
for r in rows("decode_e2e.jsonl"):
    if r["commit"] != ab_commit or "gemv_tc" not in r:
        continue
    pol = "dense" if r["policy"] == "dense" else "sparse"
    tpot[(r["ctx"], r["batch"], pol, r["gemv_tc"])].append(r["tpot_ms"])

fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
batches = sorted({b for v in gemm.values() for b in v})
width = 0.8 / max(1, len(labels))
for i, (impl, lab) in enumerate(labels.items()):
    ys = [gemm[impl].get(b, float("nan")) for b in batches]
    a1.bar([j + i * width for j in range(len(batches))], ys, width, label=lab)
a1.set_xticks([j + width for j in range(len(batches))], [str(b) for b in batches])
a1.set_xlabel("rows of activations (batch)")
a1.set_ylabel("µs per layer (4 GEMMs, 436 MB)")
a1.set_title(f"Llama-3.1-8B layer's weight GEMMs, H200 ({gemm_commit})")
a1.legend(fontsize=8)

shapes = sorted({(c, b) for (c, b, _, _) in tpot})


def mean(v):
    return sum(v) / len(v) if v else float("nan")


for i, pol in enumerate(("dense", "sparse")):
    ys = [100.0 * (mean(tpot[(c, b, pol, True)]) / mean(tpot[(c, b, pol, False)]) - 1.0) for (c, b) in shapes]
    a2.bar([j + i * 0.4 for j in range(len(shapes))], ys, 0.4,
           label="dense" if pol == "dense" else "sparse (γ 0.99 traced budgets)")
a2.axhline(0.0, color="black", linewidth=0.8)
a2.set_xticks([j + 0.2 for j in range(len(shapes))], [f"{c // 1024}k×{b}" for (c, b) in shapes], rotation=30)
a2.set_ylabel("TPOT change, tensor-core GEMV vs before (%)")
a2.set_title(f"8B-shape decode step, A/B in one call ({ab_commit})")
a2.legend(fontsize=8)
fig.tight_layout()
out = root / "docs/img/gemv.png"
fig.savefig(out, dpi=110)
print(out)
