"""Anchor for prefill attention: PyTorch SDPA causal prefill, one layer,
Llama-3.1-8B heads (32 q / 8 KV, d 128), batch 1, prompts 32k and 128k.

Runs in the same device call as bench/prefill_bench.cu and appends JSON lines
(commit, gpu, impl, ctx, batch, us, tflops, samples) to the same file, so the
headline is a ratio taken in one run. cuDNN SDPA with enable_gqa=True where it
accepts it, else with K/V expanded to 32 heads (noted in the row); the flash
backend (FA2) is timed too. FLOPs: 4*S^2*h*d / 2 for causal, as for ours.

    python3 bench/anchors/sdpa_prefill_anchor.py [--ctx 32768,131072] [--out FILE]
"""
import argparse
import json
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HQ, HKV, D = 32, 8, 128


def bench(fn, reps):
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1e3)
    return sorted(samples)[len(samples) // 2], samples


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", default="32768,131072")
    ap.add_argument("--out", default="bench/results/prefill_attention.jsonl")
    args = ap.parse_args()
    commit = os.environ.get("DHS_COMMIT", "unknown")
    gpu = torch.cuda.get_device_name()
    torch.manual_seed(0)
    rows = []
    for S in [int(x) for x in args.ctx.split(",")]:
        flops = 4.0 * S * S * HQ * D / 2
        reps = 30 if S <= 32768 else 3
        q = torch.empty(1, HQ, S, D, device="cuda", dtype=torch.float16).uniform_(-2, 2)
        k = torch.empty(1, HKV, S, D, device="cuda", dtype=torch.float16).uniform_(-1, 1)
        v = torch.empty(1, HKV, S, D, device="cuda", dtype=torch.float16).uniform_(-1, 1)
        for name, backend in (("cudnn-sdpa", SDPBackend.CUDNN_ATTENTION), ("flash-sdpa", SDPBackend.FLASH_ATTENTION)):
            row = dict(commit=commit, gpu=gpu, impl=name, dtype="f16", ctx=S, batch=1, n_heads_q=HQ, n_heads_kv=HKV, head_dim=D,
                       torch=torch.__version__)
            try:
                with sdpa_kernel([backend]):
                    try:
                        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                        fn()
                        row["gqa"] = "enable_gqa"
                    except RuntimeError:
                        ke = k.repeat_interleave(HQ // HKV, dim=1)
                        ve = v.repeat_interleave(HQ // HKV, dim=1)
                        fn = lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=True)
                        fn()
                        row["gqa"] = "expanded"
                    us, samples = bench(fn, reps)
                row.update(us=round(us, 1), tflops=round(flops / us * 1e-6, 1), samples_us=[round(s) for s in samples])
            except Exception as e:  # refused or out of memory: say so in the row
                row.update(error=str(e).splitlines()[0][:200])
            print(json.dumps(row), flush=True)
            rows.append(row)
            torch.cuda.empty_cache()
        del q, k, v
        torch.cuda.empty_cache()
    with open(args.out, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
