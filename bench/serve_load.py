#!/usr/bin/env python3
"""Load generator for `dhisparse serve` (or any OpenAI-compatible server): Poisson arrivals at
--rate requests/s or a fixed --concurrency, prompt and output length distributions, streaming
requests whose timing gives TTFT, TPOT, inter-token latency and throughput at p50/p90/p99. One
JSON row per run is appended to bench/results/serve.jsonl (bench/plot_serve.py draws them).

  # against a running server
  python3 bench/serve_load.py --base-url http://127.0.0.1:8000 --dataset chat --num-prompts 200 --rate 4
  # start one (tests/serve/dhs_server.py) on the default model, fixed concurrency, long prompts
  python3 bench/serve_load.py --launch --dataset synthetic --prompt-len 8000 --output-len 64 \
      --concurrency 4 --num-prompts 16 --ctx 8k --policy dense

Datasets: `synthetic` — completions whose prompts are token ids sliced from a long text of
seeded random words (exact lengths, 8k-128k tokens or any --prompt-len); `chat` — short chat
requests. --output-len is exact (ignore_eos). TPOT per request is (e2e - ttft) / (n_out - 1);
ITL is the gap between successive streamed events (the server may carry several tokens in one
event when the client reads slowly, so ITL is per event).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "serve.jsonl"

# A seeded vocabulary of plain words: prompts are made of these, so tokenization is stable.
WORDS = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue "
         "side kind head house service friend father power hour game line end member law car city community "
         "name president team minute idea kid body information back parent face others level office door health "
         "person art war history party result change morning reason research girl guy moment air teacher force "
         "education river stone glass orbit maple ember cloud north seven quiet").split()
CHAT_PROMPTS = ["Write a haiku about {w}.", "Explain {w} to a child in two sentences.", "What is the opposite of {w}?",
                "Give three facts about {w}.", "Tell a short story that mentions {w}.", "Translate '{w}' to French.",
                "Why does {w} matter?", "List five words that rhyme with {w}."]


def parse_range(s: str) -> tuple[int, int]:
    if "-" in s:
        a, b = s.split("-", 1)
        return int(float(a.rstrip("kK")) * (1000 if a[-1] in "kK" else 1)), \
            int(float(b.rstrip("kK")) * (1000 if b[-1] in "kK" else 1))
    v = int(float(s.rstrip("kK")) * (1000 if s[-1] in "kK" else 1))
    return v, v


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@dataclass
class Req:
    idx: int
    body: dict
    path: str
    n_prompt: int = 0
    # results
    ok: bool = False
    error: str = ""
    start: float = 0.0
    ttft: float | None = None
    e2e: float | None = None
    n_out: int = 0
    event_times: list[float] = field(default_factory=list)


async def build_requests(client: httpx.AsyncClient, args, model: str) -> list[Req]:
    rng = random.Random(args.seed)
    plo, phi = parse_range(args.prompt_len)
    olo, ohi = parse_range(args.output_len)
    reqs = []
    if args.dataset == "synthetic":
        # One long text, tokenized once; each prompt is a slice of its ids at a random offset.
        need = phi + 64
        n_words = need + need // 2
        ids: list[int] = []
        while len(ids) < need:
            text = " ".join(rng.choice(WORDS) for _ in range(n_words))
            r = await client.post("/tokenize", json={"prompt": text, "add_special_tokens": False})
            r.raise_for_status()
            ids = r.json()["tokens"]
            n_words *= 2
        for i in range(args.num_prompts):
            n = rng.randint(plo, phi)
            off = rng.randint(0, len(ids) - n)
            body = {"model": model, "prompt": ids[off:off + n], "max_tokens": rng.randint(olo, ohi),
                    "ignore_eos": True, "temperature": args.temperature, "stream": True,
                    "stream_options": {"include_usage": True}}
            reqs.append(Req(i, body, "/v1/completions", n))
    else:
        for i in range(args.num_prompts):
            content = rng.choice(CHAT_PROMPTS).format(w=rng.choice(WORDS))
            body = {"model": model, "messages": [{"role": "user", "content": content}],
                    "max_tokens": rng.randint(olo, ohi), "ignore_eos": True, "temperature": args.temperature,
                    "stream": True, "stream_options": {"include_usage": True}}
            reqs.append(Req(i, body, "/v1/chat/completions"))
    return reqs


async def run_one(client: httpx.AsyncClient, r: Req, bar) -> None:
    r.start = time.perf_counter()
    try:
        async with client.stream("POST", r.path, json=r.body) as resp:
            if resp.status_code != 200:
                r.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                ev = json.loads(data)
                if "error" in ev:
                    r.error = str(ev["error"])[:200]
                    return
                now = time.perf_counter()
                if ev.get("usage"):
                    r.n_out = ev["usage"]["completion_tokens"]
                    r.n_prompt = ev["usage"]["prompt_tokens"]
                for ch in ev.get("choices", []):
                    text = ch.get("text") if "text" in ch else (ch.get("delta") or {}).get("content")
                    if text:
                        if r.ttft is None:
                            r.ttft = now - r.start
                        r.event_times.append(now)
        r.e2e = time.perf_counter() - r.start
        r.ok = r.ttft is not None
        if not r.ok:
            r.error = "no token streamed"
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        r.error = repr(e)[:200]
    finally:
        bar.update(1)


class SimpleBar:
    def __init__(self, total: int):
        self.total, self.n, self.t0 = total, 0, time.monotonic()

    def update(self, k: int) -> None:
        self.n += k
        if sys.stderr.isatty() or self.n == self.total or self.n % max(1, self.total // 20) == 0:
            w = 30
            done = int(w * self.n / self.total)
            print(f"\r[{'#' * done}{'.' * (w - done)}] {self.n}/{self.total} {time.monotonic() - self.t0:.0f}s",
                  end="" if self.n < self.total else "\n", file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


def make_bar(total: int, disable: bool):
    if disable:
        return SimpleBar(total)
    try:
        from tqdm import tqdm
        return tqdm(total=total, unit="req", file=sys.stderr)
    except ImportError:
        return SimpleBar(total)


async def drive(args, base_url: str) -> dict:
    # identity: cpp-httplib 0.11 gzips text/event-stream for a client that accepts gzip and does not
    # flush per event, which would hold every token back to the stream's end.
    headers = {"Accept-Encoding": "identity"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    limits = httpx.Limits(max_connections=max(args.concurrency or 0, 1024), max_keepalive_connections=1024)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, limits=limits,
                                 timeout=httpx.Timeout(args.timeout)) as client:
        models = (await client.get("/v1/models")).json()
        model = args.model or models["data"][0]["id"]
        version = (await client.get("/version")).json().get("version", "") if args.device is None else ""
        reqs = await build_requests(client, args, model)
        rng = random.Random(args.seed + 1)
        sem = asyncio.Semaphore(args.concurrency) if args.concurrency else None
        bar = make_bar(len(reqs), args.no_tqdm)

        async def gated(r: Req):
            if sem:
                async with sem:
                    await run_one(client, r, bar)
            else:
                await run_one(client, r, bar)

        before = await scrape(client)
        tasks = []
        t0 = time.perf_counter()
        for r in reqs:
            tasks.append(asyncio.create_task(gated(r)))
            if args.rate and math.isfinite(args.rate):
                await asyncio.sleep(rng.expovariate(args.rate))  # Poisson arrivals
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
        bar.close()
        after = await scrape(client)
    return {"model": model, "version": version, "reqs": reqs, "duration": duration, "metrics": (before, after)}


async def scrape(client: httpx.AsyncClient) -> dict[str, float]:
    """The server's /metrics, every sample (empty for a server without them or that we cannot
    parse). Every sample, not a list of names: a row that read a metric the list lacked silently
    lost it (the KV hierarchy's kv_page_cost_us and admissions_deferred_io until session 32)."""
    sys.path.insert(0, str(ROOT / "tests" / "serve"))
    from dhs_server import parse_metrics
    try:
        return parse_metrics((await client.get("/metrics")).text)
    except (httpx.HTTPError, ValueError):
        return {}


def git_commit() -> str:
    if os.environ.get("DHS_COMMIT"):
        return os.environ["DHS_COMMIT"]  # a copy of the tree without .git (the GPU machine)
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def summarize(args, res: dict) -> dict:
    reqs: list[Req] = res["reqs"]
    ok = [r for r in reqs if r.ok]
    ttft = [r.ttft * 1e3 for r in ok]
    tpot = [(r.e2e - r.ttft) / (r.n_out - 1) * 1e3 for r in ok if r.n_out > 1]
    itl = [(b - a) * 1e3 for r in ok for a, b in zip(r.event_times, r.event_times[1:])]
    e2e = [r.e2e * 1e3 for r in ok]
    out_tokens = sum(r.n_out for r in ok)
    dur = res["duration"]
    # (A launched server runs where DHS_DEVICE says; /version names no device.)
    launched_on = os.environ.get("DHS_DEVICE", "") if args.launch else ""
    device = args.device or launched_on or ("cpu" if "cuda" not in res["version"].lower() else res["version"])
    row = {
        "commit": git_commit(), "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "device": device, "model": res["model"],
        "ctx": args.ctx or (args.prompt_len if args.dataset == "synthetic" else "chat"), "policy": args.policy, "dataset": args.dataset,
        "concurrency": args.concurrency or None, "rate": args.rate if args.rate and math.isfinite(args.rate) else None,
        "num_prompts": len(reqs), "prompt_len": args.prompt_len if args.dataset == "synthetic" else None,
        "output_len": args.output_len, "n_ok": len(ok), "n_failed": len(reqs) - len(ok),
        "duration_s": round(dur, 3), "req_s": round(len(ok) / dur, 4), "out_tok_s": round(out_tokens / dur, 2),
        "in_tok_s": round(sum(r.n_prompt for r in ok) / dur, 2),
    }
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e)):
        for p in (50, 90, 99):
            v = pct(xs, p)
            row[f"{name}_p{p}_ms"] = round(v, 3) if v is not None else None
    before, after = res.get("metrics", ({}, {}))
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    if delta.get("dhisparse:kv_pages_total", 0) > 0:
        row["pages_read_frac"] = round(delta["dhisparse:kv_pages_read_total"] / delta["dhisparse:kv_pages_total"], 4)
    if "vllm:num_preemptions_total" in delta:
        row["preemptions"] = int(delta["vllm:num_preemptions_total"])
    # The KV hierarchy (--cpu-kv-gb): the server's tier settings, and what its steps did.
    if args.launch:
        sa = args.server_args.split()

        def opt(name: str) -> str | None:
            return sa[sa.index(name) + 1] if name in sa and sa.index(name) + 1 < len(sa) else None

        row["host_kv_gib"] = float(opt("--cpu-kv-gb") or opt("--swap-space") or 0)
        row["kv_blocks"] = int(opt("--num-gpu-blocks-override") or 0) or None
        if row["host_kv_gib"] > 0:
            row["kv_recall"] = opt("--kv-recall") or "layer"
            row["kv_device_budget"] = opt("--kv-device-budget") or "0"
            row["kv_io_admit"] = opt("--kv-io-admit") or "throughput"
    hits, late = delta.get("dhisparse:kv_tier_hits_total", 0), delta.get("dhisparse:kv_tier_late_total", 0)
    if hits + late > 0:
        row["tier_hit_rate"] = round(hits / (hits + late), 4)
        for k in ("late", "recalled", "offloaded", "dropped"):
            row[f"tier_{k}_pages"] = int(delta.get(f"dhisparse:kv_tier_{k}_total", 0))
        if delta.get("dhisparse:kv_tier_steps_total", 0) > 0:  # (CUDA: steps over the host tier, overlapped landing)
            row["tier_steps"] = int(delta["dhisparse:kv_tier_steps_total"])
            row["land_overlapped_steps"] = int(delta.get("dhisparse:kv_land_overlapped_steps_total", 0))
    if row.get("host_kv_gib", 0) > 0 and "dhisparse:kv_page_cost_us" in after:
        # (a gauge: its value at the end; admissions deferred by the link: the run's count)
        row["kv_page_cost_us"] = round(after["dhisparse:kv_page_cost_us"], 4)
        row["admissions_deferred_io"] = int(delta.get("dhisparse:admissions_deferred_io_total", 0))
        if "dhisparse:kv_step_page_cost_us" in after:  # (the throughput rule: its share, its price, the step's fixed part)
            row["admissions_deferred_throughput"] = int(delta.get("dhisparse:admissions_deferred_throughput_total", 0))
            row["kv_step_page_cost_us"] = round(after["dhisparse:kv_step_page_cost_us"], 4)
            row["kv_step_fixed_ms"] = round(after.get("dhisparse:kv_step_fixed_ms", -1.0), 4)
            row["kv_budget_target_miss"] = round(after.get("dhisparse:kv_budget_target_miss", 0.0), 5)
    if delta.get("vllm:spec_decode_num_drafts_total", 0) > 0:  # speculative decoding: verifies, drafts, kept
        row["spec_verifies"] = int(delta["vllm:spec_decode_num_drafts_total"])
        row["spec_draft_tokens"] = int(delta.get("vllm:spec_decode_num_draft_tokens_total", 0))
        row["spec_accepted_tokens"] = int(delta.get("vllm:spec_decode_num_accepted_tokens_total", 0))
    # Saturated decode: the window in which every request of the run had its first token and none
    # had its last, i.e. all of them decoding together (a run of N requests at concurrency N on a
    # server with max-num-seqs >= N). Events in it per second, times tokens per event over the run
    # (1.0 when each token is its own event), is the decode throughput that `dhisparse bench`
    # measures for batch N; empty when the requests never all decoded at once.
    if ok and all(r.event_times for r in ok):
        w0 = max(r.event_times[0] for r in ok)
        w1 = min(r.event_times[-1] for r in ok)
        n_events = sum(len(r.event_times) for r in ok)
        in_window = sum(1 for r in ok for t in r.event_times if w0 < t <= w1)
        if w1 > w0 and in_window > 0:
            row["decode_window_s"] = round(w1 - w0, 3)
            row["tok_per_event"] = round(out_tokens / n_events, 4)
            row["decode_tok_s"] = round(in_window / (w1 - w0) * out_tokens / n_events, 2)
    if args.bench_tok_s:
        row["bench_tok_s"] = args.bench_tok_s
        if "decode_tok_s" in row:
            row["vs_bench"] = round(row["decode_tok_s"] / args.bench_tok_s, 4)
    if args.note:
        row["note"] = args.note
    # Every sample (llama-bench's habit), rounded to 0.1 ms.
    row["samples"] = {"ttft_ms": [round(x, 1) for x in ttft], "tpot_ms": [round(x, 2) for x in tpot],
                      "n_out": [r.n_out for r in ok]}
    errors = [r.error for r in reqs if not r.ok]
    if errors:
        row["errors"] = errors[:10]
    return row


def print_report(row: dict) -> None:
    print(f"\n{row['n_ok']}/{row['num_prompts']} ok in {row['duration_s']:.1f} s  "
          f"({row['device']}, {row['model']}, ctx {row['ctx']}, policy {row['policy']}, "
          f"{'concurrency ' + str(row['concurrency']) if row['concurrency'] else ''}"
          f"{' rate ' + str(row['rate']) + '/s' if row['rate'] else ''})")
    print(f"  requests/s {row['req_s']:.3f}   output tokens/s {row['out_tok_s']:.1f}   input tokens/s {row['in_tok_s']:.0f}")
    print(f"  {'':6} {'p50':>10} {'p90':>10} {'p99':>10}  (ms)")
    for name in ("ttft", "tpot", "itl", "e2e"):
        vals = [row[f"{name}_p{p}_ms"] for p in (50, 90, 99)]
        print(f"  {name:6} " + " ".join(f"{v:10.1f}" if v is not None else f"{'-':>10}" for v in vals))
    if "pages_read_frac" in row:
        print(f"  KV pages read by decode: {row['pages_read_frac']:.3f} of all; preemptions {row.get('preemptions', 0)}")
    if "tier_hit_rate" in row:
        print(f"  KV tiers: hit rate {row['tier_hit_rate']:.3f}, late {row['tier_late_pages']}, recalled "
              f"{row['tier_recalled_pages']}, offloaded {row['tier_offloaded_pages']} pages")
    if "decode_tok_s" in row:
        print(f"  all {row['n_ok']} decoding together for {row['decode_window_s']:.1f} s: {row['decode_tok_s']:.1f} tok/s"
              f" ({row['tok_per_event']:.3f} tokens per event)")
    if "vs_bench" in row:
        print(f"  vs dhisparse bench: {row['vs_bench']:.3f} of {row['bench_tok_s']} tok/s")
    if row.get("errors"):
        print(f"  errors (first): {row['errors'][:3]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (without /v1)")
    ap.add_argument("--launch", action="store_true", help="start `dhisparse serve` (DHS_BIN, DHS_MODEL) for the run")
    ap.add_argument("--server-args", default="", help="with --launch: extra serve flags, one string")
    ap.add_argument("--api-key", default=os.environ.get("DHS_API_KEY", ""))
    ap.add_argument("--model", default="", help="model name (default: the first of /v1/models)")
    ap.add_argument("--dataset", choices=["synthetic", "chat"], default="chat")
    ap.add_argument("--prompt-len", default="8k", help="synthetic prompt tokens: N or A-B (k = 1000), e.g. 8k-128k")
    ap.add_argument("--output-len", default="64", help="output tokens: N or A-B (exact: ignore_eos)")
    ap.add_argument("--num-prompts", type=int, default=100)
    ap.add_argument("--rate", type=float, default=None, help="Poisson arrivals, requests/s (inf: all at once)")
    ap.add_argument("--concurrency", type=int, default=0, help="requests in flight at most (0: no bound)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=3600.0, help="per request, seconds")
    ap.add_argument("--device", default=None, help='"cpu" or the GPU name for the row (default: from /version)')
    ap.add_argument("--ctx", default="", help="context label for the row (default: --prompt-len, or 'chat')")
    ap.add_argument("--policy", default="dense", help="sparse policy label for the row (the server's --sparse-policy)")
    ap.add_argument("--bench-tok-s", type=float, default=None, help="what `dhisparse bench` gives for the same batch")
    ap.add_argument("--note", default="")
    ap.add_argument("--results", default=str(RESULTS), help="JSONL file the row is appended to ('' for none)")
    ap.add_argument("--no-tqdm", action="store_true")
    args = ap.parse_args()
    if not args.rate and not args.concurrency:
        args.rate = math.inf

    server = None
    base_url = args.base_url
    if args.launch:
        sys.path.insert(0, str(ROOT / "tests" / "serve"))
        from dhs_server import Server
        server = Server(args.server_args.split(), api_key=args.api_key or None, name="load").start()
        base_url = server.url
    try:
        res = asyncio.run(drive(args, base_url))
    finally:
        if server:
            server.stop()
    row = summarize(args, res)
    print_report(row)
    if args.results:
        Path(args.results).parent.mkdir(parents=True, exist_ok=True)
        with open(args.results, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"  row appended to {args.results}")
    return 0 if row["n_ok"] == row["num_prompts"] else 1


if __name__ == "__main__":
    sys.exit(main())
