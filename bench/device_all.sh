#!/usr/bin/env bash
# Everything GPU in one device call (after bench/prebuild.sh here): the cuda tests,
# compute-sanitizer memcheck + racecheck on the attention, append and sampling
# kernels, the decode-attention bench with the PyTorch SDPA/FA2 anchor in the same
# call, the 8B-shape end-to-end bench, the prefill bench with its anchor, and — when
# the default model is present in models/ — the GPU-vs-CPU model test and a
# `generate --device cuda`. JSON lines go to $OUT; a short table is printed last.
#   DHS_COMMIT=abc1234 bash bench/device_all.sh [model]   # "model": only the model steps
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dhs_out}
mkdir -p "$OUT" /tmp/dhs ~/dhs && { [ ! -f .devcarry/smol.part.aa ] || cp .devcarry/smol.part.aa ~/dhs/; } && { [ ! -f .devcarry/smol.part.ab ] || cp .devcarry/smol.part.ab ~/dhs/; } && tar -C /tmp/dhs -xJf .devcarry/bin.tar.xz
B=/tmp/dhs/bin
export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-} DHS_TEST_DATA=$PWD/tests/data DHS_MODELS_DIR=$PWD/models
C=${DHS_COMMIT:-unknown}
summary=()
run() { local name=$1; shift; echo "== $name"; "$@" > "$OUT/$name.log" 2>&1; local rc=$?; summary+=("$(printf '%-34s rc=%s  %s' "$name" "$rc" "$(grep -m1 -E 'PASSED|FAILED|passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|Skipped' "$OUT/$name.log" | cut -c1-80)")"); tail -3 "$OUT/$name.log"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv | tee "$OUT/gpu.txt"

if [ "${1:-}" != model ]; then
  run attention_bench "$B/attention_bench" --out "$OUT/decode_attention.jsonl" --commit "$C"
  run sdpa_anchor python3 bench/anchors/sdpa_anchor.py --out "$OUT/decode_attention.jsonl" --commit "$C"
  run e2e_bench "$B/dhisparse" bench --ctx 8192,32768,131072 --batch 1,4,8,32 --prefill 32768,131072 --out "$OUT/decode_e2e.jsonl" --commit "$C"
  run prefill_bench "$B/prefill_bench" --ctx 32768,131072 --out "$OUT/prefill_attention.jsonl"
  run sdpa_prefill_anchor python3 bench/anchors/sdpa_prefill_anchor.py --out "$OUT/prefill_attention.jsonl"
  for t in test_decode_attention test_prefill_attention test_cuda_ops test_cuda_sampling; do run "$t" "$B/$t"; done
  for tool in memcheck racecheck; do
    for t in test_decode_attention test_prefill_attention test_cuda_ops test_cuda_sampling; do
      DHS_TEST_QUICK=1 run "sanitizer_${tool}_$t" timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 "$B/$t"
    done
  done
fi
# The default model travels in two parts over two calls (64 MiB per call) into ~/dhs.
if [ -f ~/dhs/smol.part.aa ] && [ -f ~/dhs/smol.part.ab ]; then
  mkdir -p models && cat ~/dhs/smol.part.aa ~/dhs/smol.part.ab > models/SmolLM2-135M-Instruct.Q4_1.gguf
  echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  models/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c || rm -f models/*.gguf
fi
if [ -f models/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
  run test_llama_cuda "$B/test_llama_cuda"
  run generate_cuda "$B/dhisparse" generate --device cuda -m models/SmolLM2-135M-Instruct.Q4_1.gguf --chat -p "What is the capital of France?" -n 48
  cat "$OUT/generate_cuda.log"
fi
echo; echo "== summary"; printf '%s\n' "${summary[@]}"
