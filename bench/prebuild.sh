#!/usr/bin/env bash
# Builds (here, where the project's Debian dependencies are) everything the GPU
# run needs, for sm_90a, and packs it into .devcarry/bin.tar.xz with libfmt: the
# lent GPU machine lacks some -dev packages (PCRE2), so binaries travel.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# DHS_BUILD_DIR: the build directory (default build-cu; a helper's own, e.g. build-gcu).
bd=${DHS_BUILD_DIR:-build-cu}
cmake -S . -B "$bd" -DCMAKE_CUDA_ARCHITECTURES=90a -DDHS_TESTS=ON > "$bd.configure.log" 2>&1
cmake --build "$bd" -j"$(nproc)" --target dhisparse dhisparse-bench attention_bench prefill_bench gpu_vs_cpu_greedy recall_bench spec_exactness_gpu \
  test_page_recall test_tier_split test_tier_land test_land_overlap test_lru_select test_lru_mirror test_row_union_gpu test_cuda_tiers test_decode_attention test_prefill_attention test_cuda_ops test_cuda_sampling test_page_select test_llama_cuda test_reuse_lists test_draft_seeds test_gemv test_quant_gemv test_packed_gemv test_cuda_serving test_cuda_verify tier_host_cost
rm -rf .devcarry/bin && mkdir -p .devcarry/bin
cp "$bd"/dhisparse "$bd"/dhisparse-bench "$bd"/bench/{attention_bench,prefill_bench,gpu_vs_cpu_greedy,recall_bench,spec_exactness_gpu} "$bd"/bench/tier_host_cost/tier_host_cost \
   "$bd"/tests/{test_page_recall,test_tier_split,test_tier_land,test_land_overlap,test_lru_select,test_lru_mirror,test_row_union_gpu,test_cuda_tiers,test_decode_attention,test_prefill_attention,test_cuda_ops,test_cuda_sampling,test_page_select,test_llama_cuda,test_reuse_lists,test_draft_seeds,test_gemv,test_quant_gemv,test_packed_gemv,test_cuda_serving,test_cuda_verify} \
   /usr/lib/x86_64-linux-gnu/libfmt.so.9 /usr/lib/x86_64-linux-gnu/libcpp-httplib.so.0.11 /usr/lib/x86_64-linux-gnu/libbrotli{dec,enc,common}.so.1 .devcarry/bin/
# DHS_HOSTCOST_BASE: a tier_host_cost built from an earlier commit, carried as tier_host_cost.base
# for device_all.sh's hostcost A/B on the lent machine's host.
if [ -n "${DHS_HOSTCOST_BASE:-}" ]; then cp "$DHS_HOSTCOST_BASE" .devcarry/bin/tier_host_cost.base; fi
# One xz stream with a dictionary larger than any binary: the test binaries share most of their
# code (the library is linked into each), so the archive is ~8 MB instead of ~39 MB and the
# binaries and one model part travel together.
tar -C .devcarry -cf - bin | xz -T1 -9 --lzma2=dict=192MiB > .devcarry/bin.tar.xz && rm -rf .devcarry/bin
# The default model in three parts of 32 MiB (64 MiB per device call, tracked files included: one
# part and the binaries fit together): bench/device_all.sh joins them and checks the hash.
if [ -f models/SmolLM2-135M-Instruct.Q4_1.gguf ] && [ ! -f .devcarry/smol.part.ac ]; then
  rm -f .devcarry/smol.part.*
  split -b 32M models/SmolLM2-135M-Instruct.Q4_1.gguf .devcarry/smol.part.
fi
ls -la .devcarry
