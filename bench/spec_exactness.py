#!/usr/bin/env python3
"""Greedy speculative decoding's exactness over many prompts (issue 24): one `dhisparse serve`
started with --speculative-k; every prompt asked twice, greedy, with the request's
`speculative_k` 0 and with the server's k; the texts must be identical. Prompts: chat questions
built from templates and subjects, and free continuations of the repository's docs at varied
offsets and lengths. One row per run in bench/results/spec_exactness.jsonl (prompts, tokens,
identical, near_ties = 0 on the CPU, whose forward is exact per row, device, policy, k).

Concurrency: the CPU forward is batch-invariant, and since session 37 a decode row that shares a
step with another request's prefill chunk reads its policy's pages as alone (docs/serving.md;
before, it read every page, so sparse policies ran with --concurrency 1), so prompts run several
at a time under every policy.

  python3 bench/spec_exactness.py --prompts 500 --policy dense --concurrency 16
  python3 bench/spec_exactness.py --prompts 500 --policy coverage:0.99 --concurrency 16
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import pathlib
import random
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests/serve"))
from dhs_server import Server  # noqa: E402

SUBJECTS = ["the sea", "prime numbers", "bread", "volcanoes", "chess", "honey bees", "trains", "winter", "owls",
            "bridges", "the moon", "rivers", "coffee", "paper", "a violin", "gardening", "deserts", "snow",
            "the alphabet", "lighthouses", "penguins", "thunderstorms", "libraries", "clocks", "mountains"]
LENGTHS = [300, 800, 2000]  # characters of free text (~75-500 tokens: the CPU's prefill bounds the count)
TEMPLATES = ["Write two sentences about {}.", "What is the most surprising fact about {}?",
             "Explain {} to a child.", "Give three tips about {}.", "Write a haiku about {}.",
             "Why do people like {}?", "Describe {} in one paragraph."]


def make_prompts(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    docs = "\n\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    out = []
    for i in range(n):
        if i % 2 == 0:
            q = rng.choice(TEMPLATES).format(rng.choice(SUBJECTS))
            out.append({"messages": [{"role": "user", "content": q}]})
        else:
            start = rng.randrange(0, len(docs) - 8000)
            out.append({"prompt": docs[start:start + rng.choice(LENGTHS)]})
    return out


def ask(server: Server, body: dict, k: int | None, tokens: int) -> str:
    req = {**body, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    if k is not None:
        req["speculative_k"] = k
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    status, r = server.post_json(path, req, timeout=900)
    if status != 200:
        raise RuntimeError(f"{status}: {r}")
    c = r["choices"][0]
    return c["message"]["content"] if "messages" in body else c["text"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=500)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--policy", default="dense")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--draft", default="sinkwindow:2")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seed", type=int, default=24)
    ap.add_argument("--verify-selection", default="", help="GPU: last-row, all-rows or per-row (the server's flag)")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default=str(ROOT / "bench/results/spec_exactness.jsonl"))
    a = ap.parse_args()
    prompts = make_prompts(a.prompts, a.seed)
    args = ["--sparse-policy", a.policy, "--speculative-k", str(a.k), "--draft-policy", a.draft,
            "--max-num-seqs", str(max(a.concurrency, 1))]
    if a.verify_selection:
        args += ["--verify-selection", a.verify_selection]
    t0 = time.monotonic()
    with Server(args, name="spec-exactness", start_timeout_s=300) as srv:
        def both(body: dict) -> tuple[str, str]:
            return ask(srv, body, 0, a.tokens), ask(srv, body, None, a.tokens)
        with cf.ThreadPoolExecutor(a.concurrency) as ex:
            pairs = list(ex.map(both, prompts))
        m = srv.wait_idle()
    identical = sum(x == y for x, y in pairs)
    device = os.environ.get("DHS_DEVICE") or "cpu"
    # On the CPU a divergence is a bug (the forward is exact per row); on the GPU the served text
    # carries no logits to tell a near-tie from one, so divergences are counted, not classified.
    row = {"model": "SmolLM2-135M-Instruct.Q4_1", "device": device, "policy": a.policy, "spec_k": a.k,
           "draft_policy": a.draft, "verify_selection": a.verify_selection or None, "prompts": len(prompts), "tokens": a.tokens * len(prompts),
           "identical": identical, "near_ties": 0 if device == "cpu" else None, "diverged": len(prompts) - identical,
           "accepted_per_verify": round(m["vllm:spec_decode_num_accepted_tokens_total"]
                                        / max(1.0, m["vllm:spec_decode_num_drafts_total"]), 3),
           "drafted_per_verify": round(m["vllm:spec_decode_num_draft_tokens_total"]
                                       / max(1.0, m["vllm:spec_decode_num_drafts_total"]), 3),
           "seconds": round(time.monotonic() - t0, 1), "commit": a.commit, "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(row))
    for (x, y), body in zip(pairs, prompts):
        if x != y:
            print("DIFF", json.dumps(body)[:120], repr(x[:80]), repr(y[:80]))
    with open(a.out, "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
