#!/usr/bin/env python3
"""Speculative decoding's acceptance on a real model (issue 24): `dhisparse generate` on free text
(the repository's docs, cut to about --ctx tokens), greedy, once without speculation and once per
(k, draft budget), each run alone. A row per run in bench/results/spec_acceptance.jsonl: drafts
accepted per verification, drafted per verification, and whether the text equals the run without
speculation (it must on the CPU: greedy speculative output is exact by construction; on the GPU
f16 roundings may flip near-ties, and a sparse verify's rows share one selection).

  python3 bench/spec_acceptance.py --ctx 4096 --k 2,4 --budgets 4,16,64 --tokens 48
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
STATS = re.compile(r"speculative: (\d+) verifies, ([0-9.]+) of ([0-9.]+) drafts accepted per verify")


def free_text(n_chars: int) -> str:
    text = "\n\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    while len(text) < n_chars:
        text += "\n\n" + text
    return text[:n_chars]


def run(binary: str, model: str, prompt_file: str, tokens: int, policy: str, k: int, budget: str,
        device: str) -> tuple[str, str, float]:
    cmd = [binary, "generate", "--device", device, "-m", model, "-f", prompt_file, "-n", str(tokens), "--ignore-eos",
           "--no-escape", "--sparse-policy", policy, "--speculative-k", str(k), "--draft-policy", f"sinkwindow:{budget}"]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return r.stdout, r.stderr.strip().splitlines()[-1], time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(ROOT / "build/dhisparse"))
    ap.add_argument("--model", default=str(ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--ctx", type=int, default=4096, help="prompt length, about (4 characters a token)")
    ap.add_argument("--k", default="2,4")
    ap.add_argument("--budgets", default="4,16,64",
                    help="draft pages per list (sinkwindow:N), or N+M: N window pages and the verifier's M heaviest")
    ap.add_argument("--policy", default="dense", help="the verifier's policy")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (on the GPU a sparse verify's rows share one selection)")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default=str(ROOT / "bench/results/spec_acceptance.jsonl"))
    a = ap.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(free_text(4 * a.ctx))
        prompt_file = f.name
    base, base_stats, base_s = run(a.bin, a.model, prompt_file, a.tokens, a.policy, 0, "16", a.device)
    n_prompt = int(re.search(r"prompt: (\d+) tokens", base_stats).group(1))
    print(f"prompt {n_prompt} tokens; without speculation: {base_s:.1f} s | {base_stats}")
    rows = []
    for k in (int(x) for x in a.k.split(",")):
        for budget in a.budgets.split(","):
            text, stats, secs = run(a.bin, a.model, prompt_file, a.tokens, a.policy, k, budget, a.device)
            m = STATS.search(stats)
            row = {"model": pathlib.Path(a.model).stem, "device": a.device, "prompt": "free text (docs/*.md)",
                   "prompt_tokens": n_prompt, "tokens": a.tokens, "verify_policy": a.policy, "spec_k": k,
                   "draft_policy": f"sinkwindow:{budget}",
                   "draft_budget_tokens": sum(int(x) for x in budget.split("+")) * 16,
                   "verifies": int(m.group(1)), "accepted_per_verify": float(m.group(2)),
                   "drafted_per_verify": float(m.group(3)), "identical_to_plain": text == base,
                   "seconds": round(secs, 2), "commit": a.commit, "date": time.strftime("%Y-%m-%d")}
            rows.append(row)
            print(json.dumps(row))
    pathlib.Path(prompt_file).unlink()
    with open(a.out, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
