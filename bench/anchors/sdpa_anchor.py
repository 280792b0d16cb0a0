"""Anchor for decode attention: PyTorch SDPA (cuDNN and FlashAttention-2 backends) on the
shapes of bench/attention_bench.cu, timed by the same method, in the same device call.

Per-layer decode attention, q_len 1, GQA 32 q / 8 KV heads, d 128, f16 (as dhisparse since session 19; bf16 before: the same bytes and kernel speed), contiguous KV
[batch, 8, ctx, 128] (the best case for SDPA: no paging). Each sample is one CUDA-graph
replay of the SDPA call (eager if capture fails), timed with events, with L2 flushed by
reading a 256 MiB buffer before it; the median is reported. GB/s = K+V bytes / time.
Adapted from shared/anchors/dense_anchor.py (same backends and shapes; adds the L2 flush,
graph replay and batch 4 so that both sides are measured alike).

Appends JSON lines (commit, gpu, impl, ctx, batch, us, GBps, pages_read_frac, samples) to --out.
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HQ, HKV, D = 32, 8, 128
FLUSH_BYTES = 256 << 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--run-id", default="")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()

    dev = "cuda"
    torch.manual_seed(0)
    gpu = torch.cuda.get_device_name()
    # L2 flush by READING 256 MiB (a fill would leave dirty lines whose write-back lands in
    # the next timed call); same method as attention_bench.cu.
    flush = torch.ones(FLUSH_BYTES // 4, dtype=torch.float32, device=dev)
    out = open(args.out, "a")

    def timed(fn, reps):
        """Median µs of reps graph replays (or eager calls), L2 flushed before each."""
        fn()
        torch.cuda.synchronize()
        mode = "cuda graph replay"
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            run = g.replay
        except Exception as e:  # backend not capturable: time eager calls
            print(f"  graph capture failed ({str(e).splitlines()[0][:80]}), timing eager", flush=True)
            torch.cuda.synchronize()
            run, mode = fn, "eager"
        for _ in range(3):
            run()
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for i, (a, b) in enumerate(evs):
            flush.sum()
            a.record()
            run()
            b.record()
        torch.cuda.synchronize()
        t = [a.elapsed_time(b) * 1e3 for a, b in evs]
        return sorted(t)[len(t) // 2], t, mode

    backends = {"cudnn-sdpa": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}
    ctxs = (8192, 131072) if args.quick else (8192, 32768, 131072)
    batches = (1, 8) if args.quick else (1, 4, 8, 32)
    print(f"{'ctx':>7} {'batch':>5} {'impl':>11} {'us':>9} {'GB/s':>8}", flush=True)
    for L in ctxs:
        for B in batches:
            kv_bytes = 2 * B * HKV * L * D * 2
            q = torch.randn(B, HQ, 1, D, device=dev, dtype=torch.float16)
            k = torch.randn(B, HKV, L, D, device=dev, dtype=torch.float16)
            v = torch.randn(B, HKV, L, D, device=dev, dtype=torch.float16)
            for name, be in backends.items():
                row = {"commit": args.commit, "run_id": args.run_id, "gpu": gpu, "impl": name, "dtype": "f16", "ctx": L,
                       "batch": B, "q_len": 1, "n_heads_q": HQ, "n_heads_kv": HKV, "head_dim": D}
                try:
                    with sdpa_kernel([be]):
                        fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                        med, samples, mode = timed(fn, args.reps)
                    row.update(us=round(med, 2), GBps=round(kv_bytes / med / 1e3, 1), kv_bytes=kv_bytes,
                               pages_read_frac=1.0,
                               timing=f"{mode}, events, L2 flushed by reading 256 MiB before each sample, median",
                               samples=[round(s, 2) for s in samples])
                    print(f"{L:>7} {B:>5} {name:>11} {med:>9.1f} {kv_bytes / med / 1e3:>8.0f}", flush=True)
                except Exception as e:  # backend refuses this shape
                    row.update(error=str(e).splitlines()[0][:160])
                    print(f"{L:>7} {B:>5} {name:>11} error: {row['error']}", flush=True)
                out.write(json.dumps(row) + "\n")
                out.flush()
            del q, k, v
            torch.cuda.empty_cache()
    # HBM ceiling in this run (last: the GPU is at clock by now): device-to-device copy, bytes read + written.
    x = torch.empty(2 << 30, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    med, _, _ = timed(lambda: y.copy_(x), 10)
    copy_gbps = 2 * x.numel() / med / 1e3
    print(f"d2d copy ceiling: {copy_gbps:.0f} GB/s", flush=True)
    out.write(json.dumps({"commit": args.commit, "run_id": args.run_id, "gpu": gpu, "impl": "d2d-copy",
                          "GBps": round(copy_gbps, 1)}) + "\n")
    del x, y
    torch.cuda.empty_cache()

    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
