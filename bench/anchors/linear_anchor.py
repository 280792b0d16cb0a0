"""Anchor for the weight GEMMs of one decode step: PyTorch F.linear (cuBLAS) on one
Llama-3.1-8B layer's weights (fused QKV 6144x4096, O 4096x4096, fused gate/up 28672x4096,
down 4096x14336, f16), timed as `dhisparse bench` times its own (bench/e2e_bench.cpp): a
CUDA graph over 8 distinct layers' weights (3.5 GB, so nothing stays in L2 between replays),
median of 30 replays with events, divided by 8. The shapes are those of
shared/anchors/dense_anchor.py's layer_weights_gemv (which timed them eagerly).

Appends JSON lines (commit, gpu, impl, batch, us, GBps) to --out.
"""
import argparse
import json

import torch
import torch.nn.functional as F

H, I, QKV, LAYERS = 4096, 14336, 6144, 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--batch", default="1,4,8,32")
    args = ap.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    gpu = torch.cuda.get_device_name()
    shapes = [(QKV, H), (H, H), (2 * I, H), (H, I)]
    ws = [[torch.randn(o, i, device=dev, dtype=torch.float16) * 0.02 for o, i in shapes] for _ in range(LAYERS)]
    layer_bytes = sum(o * i * 2 for o, i in shapes)
    out = open(args.out, "a")
    for b in (int(x) for x in args.batch.split(",")):
        x = torch.randn(b, H, device=dev, dtype=torch.float16)
        xi = torch.randn(b, I, device=dev, dtype=torch.float16)

        def layers():
            for w in ws:
                F.linear(x, w[0])
                F.linear(x, w[1])
                F.linear(x, w[2])
                F.linear(xi, w[3])

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                layers()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            layers()
        ms = []
        for i in range(33):
            a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            e.record()
            e.synchronize()
            if i >= 3:
                ms.append(a.elapsed_time(e))
        ms.sort()
        us = ms[len(ms) // 2] * 1e3 / LAYERS
        row = {"commit": args.commit, "gpu": gpu, "impl": "torch-linear", "dtype": "f16", "model": "llama-3.1-8b-shape", "batch": b,
               "us": us, "weight_bytes": layer_bytes, "GBps": layer_bytes / us / 1e3,
               "method": "graph of 8 distinct layers, median of 30 replays / 8", "torch": torch.__version__}
        out.write(json.dumps(row) + "\n")
        print(f"{'torch-linear':26s} {b:<5d} {us:10.1f} {layer_bytes / us / 1e3:9.1f}", flush=True)


if __name__ == "__main__":
    main()
