#!/usr/bin/env python3
"""Speculative acceptance traces for the 8B-shape bench (issue 24): pools the drafts kept per
verification of `dhisparse eval --speculative-k` rows (bench/results/accuracy.jsonl) for one model,
length, verifier label, draft policy and k, and writes them as a trace that `dhisparse bench
--spec-trace FILE` replays (TPOT = (k draft + verify) / (kept + 1)).

  python3 scripts/acceptance_trace.py --model SmolLM2-135M-Instruct.Q4_1.gguf --length 7680 \
      --label coverage-0.99 --draft sinkwindow:16+16 --k 3 \
      --out bench/results/acceptance_trace_smollm2_7680_sinkwindow16p16.json
"""
from __future__ import annotations

import argparse
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=str(ROOT / "bench/results/accuracy.jsonl"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--length", type=int, required=True)
    ap.add_argument("--label", default="coverage-0.99", help="the verifier's row label")
    ap.add_argument("--draft", required=True, help="the rows' draft_policy")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    kept = drafted = verifies = 0
    commits, tasks, samples = set(), set(), 0
    for line in open(a.rows):
        r = json.loads(line)
        if (r.get("model") != a.model or r.get("length") != a.length or r.get("label") != a.label
                or r.get("draft_policy") != a.draft or r.get("spec_k") != a.k or r.get("device") != a.device):
            continue
        kept += r["spec_accepted"]
        drafted += r["spec_drafted"]
        verifies += r["spec_verifies"]
        commits.add(r["commit"])
        tasks.add(r["task"])
        samples += r["samples"]
    if verifies == 0:
        raise SystemExit("no matching rows")
    trace = {"kind": "acceptance_trace", "model": a.model, "length": a.length, "verify_policy": a.label,
             "draft_policy": a.draft, "k": a.k, "device": a.device, "accepted_per_verify": round(kept / verifies, 4),
             "drafted_per_verify": round(drafted / verifies, 4), "verifies": verifies, "samples": samples,
             "tasks": sorted(tasks), "commits": sorted(commits),
             "source": "dhisparse eval --speculative-k rows in bench/results/accuracy.jsonl (the eval's RULER-style tasks)"}
    pathlib.Path(a.out).write_text(json.dumps(trace, indent=1) + "\n")
    print(json.dumps(trace))


if __name__ == "__main__":
    main()
