#!/usr/bin/env bash
# Everything GPU, in as few device calls as the 64 MiB-per-call limit allows (after
# bench/prebuild.sh here). Stages, in the order given:
#   tests  the cuda tests (DHS_TESTS: which), compute-sanitizer memcheck + racecheck on the
#          attention, append, selection and sampling kernels (DHS_SANITIZE: which tests)
#   packed quant_gemv v2 (packed Q8_0 / Q4_K / FP8): test, sanitizers, bandwidth rows, greedy vs
#          the CPU with FP8 (default model) and packed Q4_K (Qwen, when its parts are in ~/dhs)
#   weights the 8B shape's TPOT per weight format (f16, FP8, Q8_0, Q4_K), dense and coverage 0.99
#   tiers  the KV hierarchy on the device: test_tier_split (+ memcheck, racecheck), test_page_recall,
#          test_cuda_tiers (the engine with a host tier, default model)
#   lru    the bucketed LRU's victims on the device (test_lru_select against select_many, memcheck,
#          racecheck, the 4M-slot timing against select_many on the host); the LRU's mirror in HBM
#          (test_lru_mirror against kv/lru_mirror.h, memcheck, racecheck)
#   hostcost the hierarchy's host bookkeeping per step on this machine's CPUs (tier_host_cost,
#          128k x 3 and x 4 with landing; A/B with tier_host_cost.base where carried)
#   hierarchy the KV hierarchy's throughput beyond HBM (8B shape, 128k, HBM KV capped at 32 GiB, host
#          tier, replayed churn; DHS_HIER_UNCAPPED=1: also 128k x 8 uncapped): hierarchy.jsonl
#   hieroverlap the after-step's recalls while the next step runs against before it (--sync-recalls),
#          landing, 128k x 3 and x 4 at HBM 32 GiB, with the SDPA anchor: hierarchy.jsonl
#   hiermirror the LRU mirrored in HBM against the stamps' scan (DHS_LRU_MIRROR=0/1 alternated, landing,
#          128k x 3 and x 4 at HBM 32 GiB) with the SDPA anchor; test_cuda_tiers' mirror case
#   hieradopt the landed pages adopted on the device against the binaries before (.devcarry/bin_base.tar.xz),
#          alternated, landing at 128k x 3 and x 4 (HBM 32 GiB), with the SDPA anchor: hierarchy.jsonl
#   hiertimeline Nsight Compute over the tiered step's graph nodes (128k x 4, HBM 32 GiB, 5.5% churn):
#          per-kernel time, the late part's attention over mapped DRAM among them
#   hieruncapped 128k x 8 with no HBM cap over both tiers (landing and recall-ahead), the SDPA anchor
#          first (an H200: it does not fit an H100's HBM plus the 72 GiB the host pins): hierarchy.jsonl
#   hierrows the hierarchy's rows at other policies (DHS_HIER_ROWS: POLICY,BATCH,BUFFER,CHURN[,TRACE]),
#          landing, HBM 32 GiB, host 72 GiB, with the SDPA anchor: hierarchy.jsonl
#   servetiers the KV hierarchy under the serving load generator (default model, KV pool capped at
#          2,000 blocks; no host tier / landing / recall-ahead / uncapped): serve.jsonl
#          (DHS_SERVE_CFGS, DHS_SERVE_LOADS: which of "cap land ahead uncapped", "sat rate2")
#   servespec speculation under the serving load generator: --speculative-k 0 / auto alternated at
#          saturation, one at a time and Poisson arrivals (default model; the 8B shape, random weights)
#   spec   speculative decoding: test_cuda_verify (+ memcheck), draft / verify step times of the
#          8B shape at 128k x 1 / 4 (TPOT at replayed acceptance rates) with the SDPA anchor
#   fp8draft speculative drafts on FP8 copies of the projections: GPU tests + memcheck, draft / verify
#          step times with f16 and FP8 drafts (8B shape, SDPA anchor), the default model's acceptance
#   fp8eval `dhisparse eval` on the default model with f16 and FP8 projections (dense, 4k)
#   model  (default model present) GPU-vs-CPU model test and `generate --device cuda` dense
#          and sparse
#   eval   `dhisparse eval` on the default model (SmolLM2-135M, 8k native context) at 4k and
#          7.5k tokens; writes accuracy rows and the budget trace the benches replay
#   evalq  the same on Qwen2.5-Coder-0.5B (32k native) at 30k tokens, when its parts are in ~/dhs
#   sparse the selection kernels alone (one short call): test_page_select, memcheck + racecheck,
#          attention_bench --quick (selection breakdown) with the SDPA anchor, e2e TPOT at
#          128k x 1/4 with dense, MinMax- and sketch4-chosen traced budgets and Quest
#   crossover e2e TPOT, dense against traced coverage budgets, 32k-128k x batch 1, 2, 4 (--dense-below)
#   pdl    e2e TPOT with the decode chain as programmatic dependents and without (--no-pdl), alternated
#   timeline Nsight Systems over decode steps: per-kernel time and gaps inside the graph
#   profile Nsight Compute on the select and sketch-score kernels, and the select kernel at every
#          cluster size (attention_bench --select-only)
#   reselect --reselect-every: the reuse kernel's test against the CPU definition, memcheck and
#          racecheck on it, the GPU-vs-CPU model test (pages read equal), selection cost per step
#          (attention_bench --quick with the SDPA anchor) and e2e TPOT at 128k x 1/4 for R = 1..8
#   gemvtc the tensor-core GEMV: tests, sanitizers, one layer's GEMMs, e2e A/B against the kernels before
#   gemm   one layer's weight GEMMs per batch size (dhisparse bench) and PyTorch F.linear beside them
#   prefill the prefill attention kernels: tests, sanitizers, one layer at 32k / 128k (wgmma and
#          mma.sync in one call) with the cuDNN / FA2 anchor, TTFT at 32k (DHS_TTFT_LEN=32768,131072: also 128k)
#   prefillprof Nsight Compute on the prefill kernel at 32k (default and v3 forms) and the default's
#          SASS with stall samples
#   probe  attention_bench --probe: the timing floor, the dense kernel without its merge, HBM read
#          rate by chunk size (256 B - 4 KiB, in order / shuffled)
#   refresh decode attention (all shapes) with the SDPA anchor, e2e TPOT 8k-128k x 1/4/8, TTFT 32k
#   bench  decode attention (dense, traced budgets, Quest, selection cost) with the PyTorch
#          SDPA/FA2 anchor in the same call, the 8B-shape end-to-end bench (dense and sparse
#          TPOT), prefill with its anchor
# Model parts travel one per call into ~/dhs (.devcarry/smol.part.a[a-c], .devcarry/qwen/part.??)
# and are joined and hash-checked here. The tracked tree is ~19 MiB, so a 32 MiB part fits beside
# the binaries (8.9 MiB) or the wheels (8 MiB), not both: carry bin + part aa, then wheels + part
# ab, then part ac alone (the binaries stay unpacked in /tmp/dhs/bin and the wheels installed in
# /tmp/dhs/py while the machine is warm). JSON lines and logs go to $OUT; a table is printed last.
#   DHS_COMMIT=abc1234 bash bench/device_all.sh tests model eval bench
# DHS_EVAL_SECONDS: time budget of an eval stage (samples per task are sized from a calibration
# run, at most 100); DHS_EVAL_SAMPLES fixes them; DHS_EVAL_POLICIES, DHS_EVAL_LENGTHS override
# the policies and the default model's lengths.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dhs_out}
mkdir -p "$OUT" /tmp/dhs ~/dhs
for f in .devcarry/smol.part.* .devcarry/qwen/part.*; do [ -f "$f" ] && cp "$f" ~/dhs/"$(basename "$f" | sed 's/^part\./qwen.part./')"; done
[ -f .devcarry/bin.tar.xz ] && tar -C /tmp/dhs -xJf .devcarry/bin.tar.xz
B=/tmp/dhs/bin
export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-} DHS_TEST_DATA=$PWD/tests/data DHS_MODELS_DIR=$PWD/models
C=${DHS_COMMIT:-unknown}
summary=()
# A step's summary line: a sanitizer's verdict where there is one (GTest prints its own verdict, and
# "Skipped" for cases DHS_TEST_QUICK leaves out, before it), else the first verdict of the log.
verdict() { grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$1" || grep -m1 -E 'PASSED|FAILED|passed|failed|Skipped' "$1"; }
# The hierarchy stages' configuration per batch (HB): batch 3 at buffer 1.0 and the default model's
# churn there (3%), batch 4 at buffer 0.5 (5.5%).
hier_batch() { if [ "$1" = 3 ]; then HB=(--batch 3 --buffer 1.0 --churn 0.03); else HB=(--batch 4 --buffer 0.5 --churn 0.055); fi; }
run() { local name=$1; shift; echo "== $name"; "$@" > "$OUT/$name.log" 2>&1; local rc=$?; summary+=("$(printf '%-34s rc=%s  %s' "$name" "$rc" "$(verdict "$OUT/$name.log" | cut -c1-80)")"); tail -3 "$OUT/$name.log"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv | tee "$OUT/gpu.txt"
[ -x $B/dhisparse ] || { echo "no binaries: run bench/prebuild.sh and carry .devcarry/bin.tar.xz"; exit 0; }

SMOL=models/SmolLM2-135M-Instruct.Q4_1.gguf
QWEN=/tmp/dhs/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf
if [ ! -f $SMOL ] && [ -f ~/dhs/smol.part.aa ]; then  # (all parts there, or the hash check fails)
  mkdir -p models && cat ~/dhs/smol.part.* > $SMOL
  echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $SMOL" | sha256sum -c || rm -f $SMOL
fi
if [ "$(ls ~/dhs/qwen.part.* 2>/dev/null | wc -l)" = 10 ]; then
  cat ~/dhs/qwen.part.* > $QWEN
  echo "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32  $QWEN" | sha256sum -c || rm -f $QWEN
fi

# The Python packages of tests/serve (openai, httpx, pytest, tqdm): the device has no PyPI, so
# their wheels travel in .devcarry/wheels (pip download, here, for the device's Python too: it is
# 3.12 — `pip download -d .devcarry/wheels --only-binary=:all: --python-version 3.12 -r
# tests/serve/requirements.txt`) and install into $PY once.
PY=/tmp/dhs/py
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
pyserve() {
  python3 -c "import sys; sys.path.insert(0, '$PY'); import openai, httpx, pytest" 2>/dev/null && return 0
  [ -d .devcarry/wheels ] || { echo "no wheels: carry .devcarry/wheels (pip download -r tests/serve/requirements.txt)"; return 1; }
  python3 -m pip install -q --no-index --find-links .devcarry/wheels --target $PY -r tests/serve/requirements.txt > "$OUT/pip.log" 2>&1 \
    || { echo "pip install failed"; tail -5 "$OUT/pip.log"; return 1; }
}

# One eval stage: calibrate on 1 sample per task at the longest length, then as many samples
# (<= 100) as the time budget allows. $1 name, $2 model, $3 lengths, $4 quest budget (pages).
eval_stage() {
  local name=$1 model=$2 lengths=$3 quest=$4 budget=${DHS_EVAL_SECONDS:-300}
  # sketch4 page masses (the engine's estimator here); MinMax (Quest's bound) beside it.
  local pols=${DHS_EVAL_POLICIES:-"coverage:0.95,coverage:0.98,coverage:0.99,coverage:0.99@minmax,topk:$quest@minmax"}
  local longest=${lengths##*,} n_len t0 t1 per n
  n_len=$(echo "$lengths" | tr ',' '\n' | wc -l)
  t0=$(date +%s.%N)
  "$B/dhisparse" eval --device cuda -m "$model" --estimator sketch4 --lengths "$longest" --samples 1 --policies "$pols" --seed 99 \
    > "$OUT/${name}_calib.log" 2>&1
  t1=$(date +%s.%N)
  per=$(python3 -c "print(($t1 - $t0) / 7)")
  n=$(python3 -c "print(max(2, min(100, int($budget / ($per * $n_len * 7)))))")  # 7 tasks
  [ -n "${DHS_EVAL_SAMPLES:-}" ] && n=$DHS_EVAL_SAMPLES
  echo "$name: calibration $(printf %.2f "$per") s per sample at $longest tokens -> $n samples per task and length"
  run "$name" timeout $((budget * 2)) "$B/dhisparse" eval --device cuda -m "$model" --estimator sketch4 --lengths "$lengths" --samples "$n" --policies "$pols" \
    --out "$OUT/accuracy.jsonl" --trace-out "$OUT/budget_trace_$name.json" --commit "$C"
  tail -40 "$OUT/$name.log"
}

for stage in "$@"; do
  case $stage in
    tests)
      T="${DHS_TESTS-test_decode_attention test_prefill_attention test_cuda_ops test_cuda_sampling test_page_select test_reuse_lists test_gemv test_quant_gemv test_packed_gemv test_cuda_serving}"
      for t in $T; do run "$t" timeout 240 "$B/$t"; done  # (test_gemv: 48-160 s, by the machine)
      # Sanitizers: DHS_SANITIZE lists the tests (default: the selection kernels; all of the
      # attention, ops and sampling tests last ran clean at 1f99105 / 897a6b3, kernels as d3157ed).
      # Racecheck is slow: the small shapes only.
      for t in ${DHS_SANITIZE:-test_page_select}; do
        # (test_prefill_attention: its small and edge-list cases under both tools, all 11 kernel forms)
        mfilter=(); [ "$t" = test_prefill_attention ] && mfilter=(--gtest_filter='*Small*:*EmptyAndOnePage*')
        DHS_TEST_QUICK=1 run "sanitizer_memcheck_$t" timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/$t" "${mfilter[@]}"
        # (racecheck, test_page_select: its small shapes only; the others whole)
        filter=("${mfilter[@]}"); [ "$t" = test_page_select ] && filter=(--gtest_filter='*Smol*:*Summ*')
        DHS_TEST_QUICK=1 run "sanitizer_racecheck_$t" timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/$t" "${filter[@]}"
      done ;;
    packed)
      # quant_gemv v2 (packed Q8_0 / Q4_K / FP8): its test, both sanitizers, the bandwidth rows
      # beside the copy rate; then the engine on it: greedy against the CPU (default model with
      # FP8; Qwen Q4_K_M packed when its parts are here) and FP8 accuracy against f16.
      run test_packed_gemv timeout 240 "$B/test_packed_gemv"
      DHS_TEST_QUICK=1 run sanitizer_memcheck_test_packed_gemv timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/test_packed_gemv"
      DHS_TEST_QUICK=1 run sanitizer_racecheck_test_packed_gemv timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/test_packed_gemv"
      DHS_CUDA_BENCH=1 DHS_BENCH_OUT="$OUT/quant_gemv.jsonl" DHS_COMMIT="$C" run packed_gemv_bandwidth timeout 200 "$B/test_packed_gemv" --gtest_filter='*Bandwidth*'
      grep -E "^bw |^layer |d2d" "$OUT/packed_gemv_bandwidth.log"
      if [ -f $SMOL ]; then
        run greedy_smol_fp8 timeout 200 "$B/gpu_vs_cpu_greedy" -m $SMOL --quantization fp8 --out "$OUT/gpu_vs_cpu_greedy.jsonl" --commit "$C"
        run generate_cuda_fp8 "$B/dhisparse" generate --device cuda -m $SMOL --quantization fp8 --chat -p "What is the capital of France?" -n 48
      fi
      if [ -f $QWEN ]; then
        run greedy_qwen_packed timeout 300 "$B/gpu_vs_cpu_greedy" -m $QWEN --gpu-weights packed --out "$OUT/gpu_vs_cpu_greedy.jsonl" --commit "$C"
      fi ;;
    weights)
      # The 8B shape's TPOT per weight format (random packed weights, traced coverage budgets from
      # the default model), 8k x 1 and 128k x 1 / 4, dense and coverage 0.99, with the SDPA anchor.
      TRACE=bench/results/budget_trace_smollm2_sketch4.json
      run sdpa_anchor timeout 90 python3 bench/anchors/sdpa_anchor.py --quick --out "$OUT/decode_attention.jsonl" --commit "$C"
      run e2e_weights timeout 400 "$B/dhisparse" bench --ctx 8192,131072 --batch 1,4 --prefill 2048 \
        --policies dense,trace:coverage-0.99@sketch4 --trace "$TRACE" --trace-len 7680 --weights f16,fp8,q8_0,q4_k \
        --out "$OUT/decode_e2e.jsonl" --no-gemm --commit "$C"
      grep -vE "^prefill" "$OUT/e2e_weights.log" | tail -34 ;;
    tiers)
      # The KV hierarchy's recall-ahead read on the device (issue 23): the split / merge kernels
      # against the CPU, memcheck and racecheck on them, the I/O engine's test, and (default model
      # here) the engine's greedy tokens with a host tier equal all-resident.
      run test_tier_split timeout 120 "$B/test_tier_split"
      DHS_TEST_QUICK=1 run sanitizer_memcheck_test_tier_split timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/test_tier_split"
      DHS_TEST_QUICK=1 run sanitizer_racecheck_test_tier_split timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/test_tier_split"
      run test_page_recall timeout 120 "$B/test_page_recall"
      # Landing (a layer's late pages copied into HBM in the step) against kv/tier_land.h, and memcheck on it.
      run test_tier_land timeout 120 "$B/test_tier_land"
      run sanitizer_memcheck_test_tier_land timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/test_tier_land"
      [ -f $SMOL ] && { run test_cuda_tiers timeout 300 "$B/test_cuda_tiers"; grep -E "^cuda" "$OUT/test_cuda_tiers.log"; }
      # The in-step read's speed: attention over late pages in place from pinned DRAM vs HBM.
      run recall_late timeout 200 "$B/recall_bench" --only-late --host-gib 4 --out "$OUT/page_recall.jsonl" --commit "$C"
      grep -E "late_attention" "$OUT/recall_late.log" | cut -c1-220 ;;
    lru)
      # The bucketed LRU's selection on the device (backend/cuda/lru_select.h) against the CPU's.
      run test_lru_select timeout 200 env DHS_CUDA_BENCH=1 "$B/test_lru_select"; grep -E "^lru_select" "$OUT/test_lru_select.log"
      run sanitizer_memcheck_test_lru_select timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/test_lru_select" --gtest_filter=-*Bandwidth*
      run sanitizer_racecheck_test_lru_select timeout 300 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/test_lru_select" --gtest_filter=*ManyTiles*:*Refuses*
      # The LRU's mirror in HBM (backend/cuda/lru_mirror.h) against kv/lru_mirror.h.
      run test_lru_mirror timeout 200 "$B/test_lru_mirror"
      run sanitizer_memcheck_test_lru_mirror timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/test_lru_mirror" --gtest_filter=*CpuStatement*
      run sanitizer_racecheck_test_lru_mirror timeout 300 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/test_lru_mirror" --gtest_filter=*CpuStatement* ;;
    hostcost)
      # The hierarchy's host bookkeeping per step on this machine's CPUs (bench/tier_host_cost: the
      # 8B shape's pages, 32 GiB of HBM slots, landing), 128k x 3 and x 4; with tier_host_cost.base
      # (prebuild.sh DHS_HOSTCOST_BASE) the two binaries interleaved, three runs each; and the current
      # one with --mirror (the LRU mirrored on the device: its patch instead of the stamps' scan).
      # Each also with --hook (the CUDA runner's relocate hook emulated, as the engine has it).
      for b in 3 4; do
        hier_batch $b
        for i in 1 2 3; do
          for hook in "" --hook; do
            for bin in tier_host_cost tier_host_cost.base tier_host_cost+mirror; do
              mir=; [ "$bin" = tier_host_cost+mirror ] && { bin=tier_host_cost; mir=--mirror; }
              [ -x "$B/$bin" ] || continue
              cm=$C; [ "$bin" = tier_host_cost.base ] && cm=${DHS_HOSTCOST_BASE_COMMIT:-base}
              log="hostcost_${bin}${mir}_b${b}${hook}_$i"
              run "$log" timeout 300 "$B/$bin" --ctx 131072 "${HB[@]}" --land $hook $mir --steps 10 --commit "$cm" \
                --machine "$GPU host, $(nproc) CPUs" --out "$OUT/hierarchy_host_cost.jsonl"
              grep -E "^mean|after by part" "$OUT/$log.log"
            done
          done
        done
      done ;;
    landoverlap)
      # The landing beside the resident part's attention (CudaModelOptions::land_overlap, sessions
      # 38-39): the overlapped form and the rule's per-step choice against the serial form, the
      # split's late-keys form against the CPU (and memcheck), then the hierarchy bench with the rule
      # in each mode of DHS_OVL_ORDER (default "off auto"; DHS_LAND_OVERLAP off | on | auto),
      # alternated, landing, HBM 32 GiB, host 72 GiB, the SDPA anchor first; DHS_OVL_BATCHES: which
      # batches (default "3 4"). Rows to hierarchy.jsonl. With the default model here,
      # test_cuda_tiers (the greedy identity with it on among them). DHS_OVL_TESTS: "split"
      # (default: the tests above and memcheck), "tiers" (test_cuda_tiers alone), "none".
      case ${DHS_OVL_TESTS:-split} in
        split) run test_land_overlap timeout 300 "$B/test_land_overlap"; grep -E "^(on|auto|other)" "$OUT/test_land_overlap.log"
               DHS_TEST_QUICK=1 run sanitizer_memcheck_test_land_overlap timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/test_land_overlap" --gtest_filter=*Auto*
               run test_tier_split timeout 120 "$B/test_tier_split"
               DHS_TEST_QUICK=1 run sanitizer_memcheck_test_tier_split timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/test_tier_split" --gtest_filter=*EqualsTheCpu* ;;
      esac
      [ -f $SMOL ] && [ "${DHS_OVL_TESTS:-split}" != none ] && { run test_cuda_tiers timeout 400 "$B/test_cuda_tiers"; grep -E "^cuda|OK|FAILED" "$OUT/test_cuda_tiers.log" | head -30; }
      TRACE=bench/results/budget_trace_smollm2_sketch4.json
      H=(--hierarchy --ctx 131072 --trace "$TRACE" --trace-len 7680 --hierarchy-out "$OUT/hierarchy.jsonl" --commit "$C" --steps ${DHS_HIER_STEPS:-12})
      SP=trace:coverage-0.99@sketch4
      run sdpa_anchor timeout 90 python3 bench/anchors/sdpa_anchor.py --quick --out "$OUT/decode_attention.jsonl" --commit "$C"
      for b in ${DHS_OVL_BATCHES:-3 4}; do
        hier_batch "$b"
        for which in ${DHS_OVL_ORDER:-off auto}; do
          export DHS_LAND_OVERLAP=$which
          run hier_b${b}_land_ovl_$which timeout 240 "$B/dhisparse" bench "${H[@]}" --policies $SP --hbm-kv-gib 32 --host-kv-gib 72 "${HB[@]}" --land
          grep -hE "^ctx" "$OUT/hier_b${b}_land_ovl_$which.log"
        done
        unset DHS_LAND_OVERLAP
      done ;;
    hierarchy)
      # Throughput beyond HBM (issue 23; bench/hierarchy_bench.cpp): the 8B shape at 128k with the
      # HBM KV pool capped at 32 GiB — dense and sparse with every page in HBM (batch 1: a 128k
      # request is 16 GiB), then sparse with the host tier at the batch the two tiers hold (a step
      # reads ~30% of each request's pages: 4 x 0.305 x 16 GiB x 1.5 fits 32 GiB; 3 at buffer 1.0)
      # with the churn measured on the default model at that buffer (5.5% / 3% of the reads), then
      # 128k x 8 uncapped. Rows to hierarchy.jsonl; the SDPA anchor first.
      TRACE=bench/results/budget_trace_smollm2_sketch4.json
      H=(--hierarchy --ctx 131072 --trace "$TRACE" --trace-len 7680 --hierarchy-out "$OUT/hierarchy.jsonl" --commit "$C" --steps ${DHS_HIER_STEPS:-12})
      SP=trace:coverage-0.99@sketch4
      run sdpa_anchor timeout 90 python3 bench/anchors/sdpa_anchor.py --quick --out "$OUT/decode_attention.jsonl" --commit "$C"
      run hier_hbm_only timeout 200 "$B/dhisparse" bench "${H[@]}" --policies dense,$SP --hbm-kv-gib 32
      run hier_tiered_b4 timeout 240 "$B/dhisparse" bench "${H[@]}" --policies $SP --hbm-kv-gib 32 --host-kv-gib 72 --batch 4 --buffer 0.5 --churn 0.055
      run hier_tiered_b3 timeout 240 "$B/dhisparse" bench "${H[@]}" --policies $SP --hbm-kv-gib 32 --host-kv-gib 72 --batch 3 --buffer 1.0 --churn 0.03
      # Landing: late pages copied into reserved HBM slots in the step (each miss crosses PCIe once).
      run hier_tiered_b4_land timeout 240 "$B/dhisparse" bench "${H[@]}" --policies $SP --hbm-kv-gib 32 --host-kv-gib 72 --batch 4 --buffer 0.5 --churn 0.055 --land
      run hier_tiered_b3_land timeout 240 "$B/dhisparse" bench "${H[@]}" --policies $SP --hbm-kv-gib 32 --host-kv-gib 72 --batch 3 --buffer 1.0 --churn 0.03 --land
      [ -n "${DHS_HIER_UNCAPPED:-}" ] && run hier_uncapped_b8 timeout 300 "$B/dhisparse" bench "${H[@]}" --policies $SP --hbm-kv-gib 0 --host-kv-gib 72 --batch 8 --buffer 0.5 --churn 0.055
      grep -hE "^ctx|^  forward|^gpu|error" "$OUT"/hier_*.log ;;
    hieruncapped)
      # 128k x 8 with no HBM cap (issue 23: it cannot fit HBM — 128 GiB of KV beside 16 GB of
      # weights — and runs over both tiers; an H200), on the recall-ahead schedule and with landing,
      # the SDPA anchor first. Rows to hierarchy.jsonl.
      TRACE=bench/results/budget_trace_smollm2_sketch4.json
      H=(--hierarchy --ctx 131072 --trace "$TRACE" --trace-len 7680 --hierarchy-out "$OUT/hierarchy.jsonl" --commit "$C" --steps ${DHS_HIER_STEPS:-12})
      SP=trace:coverage-0.99@sketch4
      run sdpa_anchor timeout 90 python3 bench/anchors/sdpa_anchor.py --quick --out "$OUT/decode_attention.jsonl" --commit "$C"
      for mode in ${DHS_UNCAPPED_MODES:-land ahead}; do
        extra=(); [ "$mode" = land ] && extra=(--land)
        run hier_uncapped_b8_$mode timeout 280 "$B/dhisparse" bench "${H[@]}" --policies $SP --hbm-kv-gib 0 \
          --host-kv-gib ${DHS_UNCAPPED_HOST_GIB:-72} --batch 8 --buffer 0.5 --churn 0.055 "${extra[@]}"
        grep -hE "^ctx|^  forward|^  tiers|^gpu|error|rror" "$OUT/hier_uncapped_b8_$mode.log" | head -8
      done ;;
    hierrows)
      # Rows of the hierarchy at other policies than coverage 0.99 (issue 23: the same at γ 0.95 and
      # with SoloHead), landing, HBM 32 GiB, host tier 72 GiB, the SDPA anchor first. DHS_HIER_ROWS:
      # entries POLICY,BATCH,BUFFER,CHURN[,TRACE] (the churn measured on the default model at that
      # policy and buffer: hierarchy_hit_rate.jsonl). Rows to hierarchy.jsonl.
      run sdpa_anchor timeout 90 python3 bench/anchors/sdpa_anchor.py --quick --out "$OUT/decode_attention.jsonl" --commit "$C"
      for row in ${DHS_HIER_ROWS:-trace:coverage-0.95@sketch4,6,0.5,0.10 trace:coverage-0.95@sketch4,6,1.0,0.08}; do
        IFS=, read -r pol b buf churn tr <<< "$row"
        tr=${tr:-bench/results/budget_trace_smollm2_sketch4.json}
        tag=$(echo "${pol}_b${b}_buf${buf}" | tr -c 'A-Za-z0-9_.\n' '_')
        run hierrow_$tag timeout 240 "$B/dhisparse" bench --hierarchy --ctx 131072 --trace "$tr" --trace-len 7680 \
          --hierarchy-out "$OUT/hierarchy.jsonl" --commit "$C" --steps ${DHS_HIER_STEPS:-12} --policies "$pol" \
          --hbm-kv-gib 32 --host-kv-gib 72 --batch "$b" --buffer "$buf" --churn "$churn" --land
        grep -hE "^ctx|^  forward|^  tiers|error" "$OUT/hierrow_$tag.log"
      done ;;
    hieroverlap)
      # The after-step's recalls while the next step runs (EngineOptions::kv_overlap_recalls) against
      # before it (--sync-recalls), alternated, with landing at batch 3 and 4 (HBM 32 GiB); the SDPA
      # anchor first. DHS_HIER_BATCHES: which (default "3 4"). Rows to hierarchy.jsonl.
      TRACE=bench/results/budget_trace_smollm2_sketch4.json
      H=(--hierarchy --ctx 131072 --trace "$TRACE" --trace-len 7680 --hierarchy-out "$OUT/hierarchy.jsonl" --commit "$C" --steps ${DHS_HIER_STEPS:-12})
      SP=trace:coverage-0.99@sketch4
      run sdpa_anchor timeout 90 python3 bench/anchors/sdpa_anchor.py --quick --out "$OUT/decode_attention.jsonl" --commit "$C"
      for b in ${DHS_HIER_BATCHES:-3 4}; do
        hier_batch "$b"
        run hier_b${b}_land_overlap timeout 240 "$B/dhisparse" bench "${H[@]}" --policies $SP --hbm-kv-gib 32 --host-kv-gib 72 "${HB[@]}" --land
        run hier_b${b}_land_sync timeout 240 "$B/dhisparse" bench "${H[@]}" --policies $SP --hbm-kv-gib 32 --host-kv-gib 72 "${HB[@]}" --land --sync-recalls
      done
      grep -hE "^ctx|^  forward|^gpu|error" "$OUT"/hier_b*.log ;;
    hiermirror)
      # The LRU mirrored in HBM (DHS_LRU_MIRROR=1: the step's reads written as the LRU's last uses
      # and copied back) against the read stamps' scan, alternated, landing at batch 3 and 4 (HBM 32
      # GiB, host 72 GiB), the SDPA anchor first; then test_cuda_tiers' mirror case (the default
      # model, when its parts are joined). Rows to hierarchy.jsonl (lru_mirror true / false).
      TRACE=bench/results/budget_trace_smollm2_sketch4.json
      SP=trace:coverage-0.99@sketch4
      run sdpa_anchor timeout 90 python3 bench/anchors/sdpa_anchor.py --quick --out "$OUT/decode_attention.jsonl" --commit "$C"
      for b in ${DHS_HIER_BATCHES:-3 4}; do
        hier_batch "$b"
        for mir in ${DHS_MIRROR_ORDER:-0 1 0 1}; do
          run hier_b${b}_mirror$mir timeout 240 env DHS_LRU_MIRROR=$mir "$B/dhisparse" bench --hierarchy --ctx 131072 --trace "$TRACE" \
            --trace-len 7680 --hierarchy-out "$OUT/hierarchy.jsonl" --commit "$C" --steps ${DHS_HIER_STEPS:-12} --policies $SP \
            --hbm-kv-gib 32 --host-kv-gib 72 "${HB[@]}" --land
          grep -hE "^ctx|^  forward|^  tiers|error" "$OUT/hier_b${b}_mirror$mir.log"
        done
      done
      if [ -f "$DHS_MODELS_DIR/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
        run test_cuda_tiers_mirror timeout 300 "$B/test_cuda_tiers" --gtest_filter=*Mirror*
      fi ;;
    hieradopt)
      # The landed pages adopted on the device (the host's adoption in flight, session 31) against the
      # binaries before it (.devcarry/bin_base.tar.xz, DHS_BASE_COMMIT names them), alternated, landing
      # with the overlap at batch 3 and 4 (HBM 32 GiB); the SDPA anchor first. Rows to hierarchy.jsonl.
      [ -f .devcarry/bin_base.tar.xz ] || { echo "hieradopt: no .devcarry/bin_base.tar.xz"; continue; }
      mkdir -p /tmp/dhs/base && tar -C /tmp/dhs/base -xJf .devcarry/bin_base.tar.xz
      TRACE=bench/results/budget_trace_smollm2_sketch4.json
      SP=trace:coverage-0.99@sketch4
      run sdpa_anchor timeout 90 python3 bench/anchors/sdpa_anchor.py --quick --out "$OUT/decode_attention.jsonl" --commit "$C"
      for b in ${DHS_HIER_BATCHES:-3 4}; do
        hier_batch "$b"
        for which in ${DHS_ADOPT_ORDER:-base new base new}; do
          if [ $which = base ]; then BIN=/tmp/dhs/base/bin CC=${DHS_BASE_COMMIT:-base}; else BIN=$B CC=$C; fi
          run hier_b${b}_adopt_$which timeout 240 env LD_LIBRARY_PATH=$BIN "$BIN/dhisparse" bench --hierarchy --ctx 131072 --trace "$TRACE" \
            --trace-len 7680 --hierarchy-out "$OUT/hierarchy.jsonl" --commit "$CC" --steps ${DHS_HIER_STEPS:-12} --policies $SP \
            --hbm-kv-gib 32 --host-kv-gib 72 "${HB[@]}" --land
          grep -hE "^ctx|^  forward|^  tiers|error" "$OUT/hier_b${b}_adopt_$which.log"
        done
      done ;;
    hiertimeline)
      # Where the tiered step's forward goes (docs/hierarchy.md: ~34 ms of the batch-4 forward not
      # explained by its hits and its late bytes): Nsight Compute times every node of the captured
      # steps serialized (clocks and L2 as they are), the late part's attention over mapped DRAM
      # among them; timeline_summary.py groups them per step. 128k x 4, HBM 32 GiB, 5.5% churn
      # (DHS_TL_ARGS: other bench flags, e.g. "--batch 3 --buffer 1.0 --churn 0.03 --land").
      TRACE=bench/results/budget_trace_smollm2_sketch4.json
      run ncu_nodes_tiered timeout 500 ncu --graph-profiling node --metrics gpu__time_duration.sum --cache-control none \
        --clock-control none --launch-skip ${DHS_TL_SKIP:-0} --launch-count ${DHS_TL_LAUNCHES:-6000} --csv \
        "$B/dhisparse" bench --hierarchy --ctx 131072 --trace "$TRACE" --trace-len 7680 --policies trace:coverage-0.99@sketch4 \
        --hbm-kv-gib 32 --host-kv-gib 72 ${DHS_TL_ARGS:---batch 4 --buffer 0.5 --churn 0.055} --steps 4 --hierarchy-out /tmp/dhs/tl_hier.jsonl --commit "$C"
      run timeline_tiered python3 bench/timeline_summary.py "$OUT/ncu_nodes_tiered.log"
      cat "$OUT/timeline_tiered.log" ;;
    spec)
      # Speculative decoding on the device (issue 24): verify rows against decoding one at a
      # time, memcheck on them, the engine's greedy output with and without speculation (default
      # model, when its parts are here), then draft / verify step times of the 8B shape at 128k
      # x 1 / 4 (dense and traced coverage 0.99 verification) with the SDPA anchor.
      TRACE=bench/results/budget_trace_smollm2_sketch4.json
      # Per-row selections read as their union: the merge against kv/page_lists.h (+ memcheck,
      # racecheck) and attention with row masks against the CPU.
      if [ "${DHS_SPEC_TESTS:-1}" = 1 ]; then  # (DHS_SPEC_TESTS=0: the step times only)
      run test_row_union_gpu timeout 120 "$B/test_row_union_gpu"
      run sanitizer_memcheck_test_row_union_gpu timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/test_row_union_gpu"
      run sanitizer_racecheck_test_row_union_gpu timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/test_row_union_gpu"
      run test_decode_attention_masks timeout 120 "$B/test_decode_attention" --gtest_filter='*RowMasks*'
      run test_cuda_verify timeout 240 "$B/test_cuda_verify"
      grep -E "^verify|^decode after|^sparse verify|^engine" "$OUT/test_cuda_verify.log"
      DHS_TEST_QUICK=1 run sanitizer_memcheck_test_cuda_verify timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$B/test_cuda_verify" --gtest_filter='CudaVerify.VerifyRows*:CudaVerify.Sparse*:CudaVerify.Draft*'
      fi
      run sdpa_anchor timeout 90 python3 bench/anchors/sdpa_anchor.py --quick --out "$OUT/decode_attention.jsonl" --commit "$C"
      run e2e_spec timeout 300 "$B/dhisparse" bench --ctx ${DHS_SPEC_CTX:-131072} --batch ${DHS_SPEC_BATCH:-1,4} --prefill 0 --no-gemm \
        --policies dense,trace:coverage-0.99@sketch4 --trace "$TRACE" --trace-len 7680 --spec-k ${DHS_SPEC_K:-2,4,7} \
        --draft-pages ${DHS_DRAFT_PAGES:-16} --out "$OUT/decode_e2e.jsonl" --spec-out "$OUT/spec_e2e.jsonl" --commit "$C"
      grep -vE "^prefill" "$OUT/e2e_spec.log" | tail -60
      # Each verify row its own coverage set (the exact form): the sparse verifier only.
      run e2e_spec_per_row timeout 200 "$B/dhisparse" bench --ctx ${DHS_SPEC_CTX:-131072} --batch ${DHS_SPEC_BATCH:-1,4} --prefill 0 --no-gemm \
        --policies trace:coverage-0.99@sketch4 --trace "$TRACE" --trace-len 7680 --spec-k ${DHS_SPEC_K:-2,4,7} \
        --draft-pages ${DHS_DRAFT_PAGES:-16} --verify-selection per-row --out "$OUT/decode_e2e.jsonl" --spec-out "$OUT/spec_e2e.jsonl" --commit "$C"
      grep -E "alpha 0.9" "$OUT/e2e_spec_per_row.log"
      # The same rows' union read once with row masks (per_row_union, experimental): the A/B.
      run e2e_spec_per_row_union timeout 200 "$B/dhisparse" bench --ctx ${DHS_SPEC_CTX:-131072} --batch ${DHS_SPEC_BATCH:-1,4} --prefill 0 --no-gemm \
        --policies trace:coverage-0.99@sketch4 --trace "$TRACE" --trace-len 7680 --spec-k ${DHS_SPEC_K:-2,4,7} \
        --draft-pages ${DHS_DRAFT_PAGES:-16} --verify-selection per-row-union --out "$OUT/decode_e2e.jsonl" --spec-out "$OUT/spec_e2e.jsonl" --commit "$C"
      grep -E "alpha 0.9" "$OUT/e2e_spec_per_row_union.log" ;;
    fp8draft)
      # Drafts on FP8 copies of the projections (--draft-quantization fp8, session 44): the GPU
      # tests (bit-equal to an FP8 model on draft steps, to the f16 model elsewhere; the engine's
      # greedy output with FP8 drafts equal to plain decoding) + memcheck, then step times of the
      # 8B shape with f16 and FP8 drafts alternated (seeded, k 3, traced coverage 0.99 verify,
      # replayed acceptance; SDPA anchor first; DHS_SPEC_BATCH: 1 on an H100, 1,4 on an H200),
      # then the default model's acceptance with both (f16 projections, 7,680 tokens).
      TRACE=bench/results/budget_trace_smollm2_sketch4.json
      ST=bench/results/acceptance_trace_smollm2_7680_sinkwindow16p16.json,bench/results/acceptance_trace_qwen05_30720_sinkwindow16p16.json
      run test_fp8_drafts timeout 200 "$B/test_cuda_verify" --gtest_filter='*Fp8*:*EngineSpeculative*'
      grep -E "engine on" "$OUT/test_fp8_drafts.log"
      DHS_TEST_QUICK=1 run sanitizer_memcheck_fp8_drafts timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$B/test_cuda_verify" --gtest_filter='*DraftStepsOnFp8*'
      run sdpa_anchor timeout 90 python3 bench/anchors/sdpa_anchor.py --quick --out "$OUT/decode_attention.jsonl" --commit "$C"
      for dq in none fp8 none fp8; do
        run e2e_draft_$dq timeout 200 "$B/dhisparse" bench --ctx 131072 --batch ${DHS_SPEC_BATCH:-1} --prefill 0 --no-gemm \
          --policies dense,trace:coverage-0.99@sketch4 --trace "$TRACE" --trace-len 7680 --spec-k 3 --draft-pages 16 --draft-seeds 16 \
          --spec-trace "$ST" --spec-alpha 0.9 --draft-quantization $dq --out "$OUT/decode_e2e.jsonl" --spec-out "$OUT/spec_e2e.jsonl" --commit "$C"
        grep -E "spec k" "$OUT/e2e_draft_$dq.log" | head -4
      done
      [ -f $SMOL ] || { echo "fp8draft: default model missing (acceptance not run)"; continue; }
      for dq in none fp8; do
        run eval_draft_$dq timeout 300 "$B/dhisparse" eval --device cuda -m $SMOL --estimator sketch4 --gpu-weights f16 --lengths 7680 \
          --samples ${DHS_EVAL_SAMPLES:-10} --policies coverage:0.99 --seed 7 --speculative-k 3 --draft-policy sinkwindow:16+16 \
          --draft-quantization $dq --out "$OUT/accuracy.jsonl" --commit "$C"
        tail -9 "$OUT/eval_draft_$dq.log"
      done ;;
    fp8eval)
      # FP8 accuracy against f16 weights on the default model (dense and coverage 0.99, 4k; DHS_EVAL_SAMPLES per task).
      [ -f $SMOL ] || { echo "fp8eval: default model missing"; continue; }
      for q in none fp8; do
        run eval_smol_$q timeout 280 "$B/dhisparse" eval --device cuda -m $SMOL --quantization $q --lengths ${DHS_EVAL_LENGTHS:-4096} \
          --samples ${DHS_EVAL_SAMPLES:-40} --policies coverage:0.99 --seed 7 --out "$OUT/accuracy_weights.jsonl" --commit "$C"
        tail -12 "$OUT/eval_smol_$q.log"
      done ;;
    model)
      [ -f $SMOL ] || { echo "model: default model missing"; continue; }
      run test_llama_cuda "$B/test_llama_cuda"
      run generate_cuda "$B/dhisparse" generate --device cuda -m $SMOL --chat -p "What is the capital of France?" -n 48
      run generate_cuda_sparse "$B/dhisparse" generate --device cuda -m $SMOL --chat --sparse-policy coverage --gamma 0.95 --estimator sketch4 \
        -p "What is the capital of France?" -n 48
      cat "$OUT/generate_cuda.log" "$OUT/generate_cuda_sparse.log" ;;
    eval)
      [ -f $SMOL ] && eval_stage eval_smollm2 $SMOL ${DHS_EVAL_LENGTHS:-4096,7680} 32 || echo "eval: default model missing" ;;
    evalq)
      [ -f $QWEN ] && eval_stage eval_qwen05 $QWEN 30720 128 || echo "evalq: Qwen parts missing ($(ls ~/dhs | tr '\n' ' '))" ;;
    sparse)
      TRACE=bench/results/budget_trace_smollm2_sketch4.json
      run test_page_select timeout 150 "$B/test_page_select"
      DHS_TEST_QUICK=1 run sanitizer_memcheck_test_page_select timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/test_page_select"
      DHS_TEST_QUICK=1 run sanitizer_racecheck_test_page_select timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/test_page_select" --gtest_filter='*Smol*'
      run attention_bench timeout 150 "$B/attention_bench" --quick --trace "$TRACE" --trace-len 7680 --out "$OUT/decode_attention.jsonl" --commit "$C"
      run sdpa_anchor timeout 90 python3 bench/anchors/sdpa_anchor.py --quick --out "$OUT/decode_attention.jsonl" --commit "$C"
      run e2e_bench timeout 200 "$B/dhisparse" bench --ctx 131072 --batch 1,4 --prefill 2048 \
        --policies dense,trace:coverage-0.99,trace:coverage-0.99@sketch4,trace:coverage-0.95@sketch4,quest:4096 \
        --trace "$TRACE" --trace-len 7680 --out "$OUT/decode_e2e.jsonl" --no-gemm --commit "$C"
      grep -E "select" "$OUT/attention_bench.log" | tail -12
      tail -12 "$OUT/e2e_bench.log" ;;
    crossover)
      # Where selection starts to pay end to end (what --dense-below should be): dense against the
      # traced coverage budgets at 32k-128k x batch 1, 2, 4 on the 8B shape.
      TRACE=bench/results/budget_trace_smollm2_sketch4.json
      run e2e_crossover timeout 400 "$B/dhisparse" bench --ctx 32768,65536,98304,131072 --batch 1,2,4 --prefill 2048 \
        --policies dense,trace:coverage-0.99@sketch4,trace:coverage-0.95@sketch4 \
        --trace "$TRACE" --trace-len 7680 --out "$OUT/decode_e2e.jsonl" --no-gemm --commit "$C"
      tail -16 "$OUT/e2e_crossover.log" ;;
    pdl)
      # The decode chain as programmatic dependents (pdl_launch.h) against plain launches, the same
      # call, alternated twice: e2e TPOT, dense and traced coverage budgets.
      TRACE=bench/results/budget_trace_smollm2_sketch4.json
      for rep in 1 2; do
        for flag in --no-pdl ""; do
          tag=pdl${flag:+_off}_$rep
          run "e2e_$tag" timeout 280 "$B/dhisparse" bench --ctx 8192,32768,131072 --batch 1,4 --prefill 0 $flag \
            --policies dense,trace:coverage-0.99@sketch4 --trace "$TRACE" --trace-len 7680 --no-gemm \
            --out "$OUT/decode_e2e.jsonl" --commit "$C"
          grep -E "^[0-9]" "$OUT/e2e_$tag.log" | sed "s/^/$tag  /"
        done
      done ;;
    gemvtc)
      # Decode GEMMs on the tensor-core GEMV (gemv.cu): the kernel's tests (both GEMV kernels) with
      # memcheck and racecheck, one layer's GEMMs per batch against cuBLASLt, then e2e TPOT
      # alternated twice against what ran before (CUDA-core GEMV at one row, cuBLASLt above), dense
      # and traced coverage budgets.
      TRACE=bench/results/budget_trace_smollm2_sketch4.json
      run test_gemv timeout 240 "$B/test_gemv"
      grep -E "gemv-tc .*(4096|14336)|FAILED|PASSED" "$OUT/test_gemv.log" | head -12
      if [ -z "${DHS_GEMV_NOSAN:-}" ]; then
        # (the default ring shape, or the one DHS_GEMV_SAN_RING names)
        san_env=(env DHS_TEST_QUICK=1 DHS_TEST_GEMV_RING=${DHS_GEMV_SAN_RING:-})
        run sanitizer_memcheck_test_gemv timeout 300 "${san_env[@]}" compute-sanitizer --tool memcheck --error-exitcode 9 "$B/test_gemv" --gtest_filter='*TensorCore*'
        run sanitizer_racecheck_test_gemv timeout 300 "${san_env[@]}" compute-sanitizer --tool racecheck --error-exitcode 9 "$B/test_gemv" --gtest_filter='*TensorCore*'
      fi
      run e2e_bench_gemm timeout 200 "$B/dhisparse" bench --ctx 8192 --batch 1 --prefill 0 --gemm-batch 1,2,4,8 \
        --gemv-tc-shapes ${DHS_GEMV_SHAPES:-0} \
        --out "$OUT/decode_e2e.jsonl" --gemm-out "$OUT/weight_gemm.jsonl" --commit "$C"
      grep -A24 "weight GEMMs" "$OUT/e2e_bench_gemm.log"
      if [ -n "${DHS_GEMV_NCU:-}" ]; then  # one launch of the kernel at 4 rows (gate/up: the 3rd of the layer)
        run ncu_gemv_tc timeout 200 ncu --kernel-name regex:gemv_tc --launch-skip 2 --launch-count 1 --section SpeedOfLight \
          --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
          "$B/dhisparse" bench --ctx 8192 --batch 1 --prefill 0 --gemm-batch 4 --out /tmp/dhs/n.jsonl --gemm-out /tmp/dhs/g.jsonl
        grep -E "Duration|Throughput|Registers|Achieved Occupancy|Theoretical Occupancy|Block Limit|Stall|Warp Cycles|Dynamic Shared|Grid Size" "$OUT/ncu_gemv_tc.log" | head -40
      fi
      [ -n "${DHS_GEMV_ONLY:-}" ] && continue
      reps="1 2"; cmp=("--gemv-max-tok 1 --no-gemv-tc" "")
      [ -n "${DHS_GEMV_NOW_ONLY:-}" ] && { reps=1; cmp=(""); }  # one run of the defaults only
      for rep in $reps; do
        for g in "${cmp[@]}"; do  # before (CUDA-core GEMV at 1 row, cuBLASLt above), now
          tag=gemv${g:+_before}_$rep
          run "e2e_$tag" timeout 280 "$B/dhisparse" bench --ctx 8192,32768,131072 --batch 1,4,8 --prefill 0 $g \
            --policies dense,trace:coverage-0.99@sketch4 --trace "$TRACE" --trace-len 7680 --no-gemm \
            --out "$OUT/decode_e2e.jsonl" --commit "$C"
          grep -E "^[0-9]" "$OUT/e2e_$tag.log" | sed "s/^/$tag  /"
        done
      done ;;
    timeline)
      # Nsight Systems over one decode step's graph (nodes traced): per-kernel busy time and the gaps
      # between kernels, dense and sparse, at DHS_TL_CTX x DHS_TL_BATCH (default 128k x 1).
      TRACE=bench/results/budget_trace_smollm2_sketch4.json
      # (The lent machine has no Nsight Systems importer: Nsight Compute times each graph node
      # serialized, L2 and clocks left as they are, so the busy times are real and the gaps are the
      # step's TPOT minus their sum.)
      for pol in dense trace:coverage-0.99@sketch4; do
        tag=${pol//[:@.]/_}
        run "ncu_nodes_$tag" timeout 400 ncu --graph-profiling node --metrics gpu__time_duration.sum --cache-control none \
          --clock-control none --launch-count ${DHS_TL_LAUNCHES:-3600} --csv \
          "$B/dhisparse" bench --ctx ${DHS_TL_CTX:-131072} --batch ${DHS_TL_BATCH:-1} --prefill 0 \
          --policies "$pol" --trace "$TRACE" --trace-len 7680 --no-gemm --out /tmp/dhs/tl.jsonl --commit "$C"
        run "timeline_$tag" python3 bench/timeline_summary.py "$OUT/ncu_nodes_$tag.log"
        cat "$OUT/timeline_$tag.log"
      done ;;
    profile)
      # Nsight Compute on the selection kernels alone (attention_bench --select-only: 128k x 1, then x 8).
      # DHS_NCU_BATCHES: the batch sizes profiled (default 1,8: the first launch is at 128k x 1).
      for k in select_pages score_sketch; do
        run "ncu_$k" timeout 240 ncu --kernel-name "regex:$k" --launch-skip ${DHS_NCU_SKIP:-0} --launch-count 1 \
          --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy \
          --section SourceCounters --section InstructionStats "$B/attention_bench" --quick --select-only --batches ${DHS_NCU_BATCHES:-1,8}
        grep -E "Duration|Cluster|Block Size|Registers|Achieved Occupancy|Warp Cycles Per Issued|Issued Warp|Stall|Memory Throughput|DRAM Throughput" "$OUT/ncu_$k.log" | head -40
      done
      # Per-instruction SASS with stall samples (source page), for the kernel named in DHS_NCU_SASS.
      if [ -n "${DHS_NCU_SASS:-}" ]; then
        ncu -o /tmp/dhs/sass_rep -f --kernel-name "regex:$DHS_NCU_SASS" --launch-count 1 --section SourceCounters \
          --section WarpStateStats "$B/attention_bench" --quick --select-only --batches ${DHS_NCU_BATCHES:-1,8} > "$OUT/ncu_sass_run.log" 2>&1
        ncu -i /tmp/dhs/sass_rep.ncu-rep --page source --csv --print-source sass > "$OUT/sass_$DHS_NCU_SASS.csv" 2>&1
        wc -l "$OUT/sass_$DHS_NCU_SASS.csv"
      fi
      run attention_bench_select timeout 150 "$B/attention_bench" --quick --select-only --commit "$C"
      grep -E "select" "$OUT/attention_bench_select.log" | tail -12 ;;
    reselect)
      TRACE=bench/results/budget_trace_smollm2_sketch4.json
      run test_reuse_lists timeout 60 "$B/test_reuse_lists"
      run sanitizer_memcheck_test_reuse_lists timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/test_reuse_lists"
      run sanitizer_racecheck_test_reuse_lists timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/test_reuse_lists"
      [ -f $SMOL ] && run test_llama_cuda timeout 300 "$B/test_llama_cuda"
      run attention_bench timeout 150 "$B/attention_bench" --quick --trace "$TRACE" --trace-len 7680 --out "$OUT/decode_attention.jsonl" --commit "$C"
      run sdpa_anchor timeout 90 python3 bench/anchors/sdpa_anchor.py --quick --out "$OUT/decode_attention.jsonl" --commit "$C"
      run e2e_bench timeout 300 "$B/dhisparse" bench --ctx 131072 --batch 1,4 --prefill 2048 \
        --policies dense,trace:coverage-0.99@sketch4,trace:coverage-0.99@sketch4/2,trace:coverage-0.99@sketch4/3,trace:coverage-0.99@sketch4/4,trace:coverage-0.99@sketch4/8,trace:coverage-0.95@sketch4/4 \
        --trace "$TRACE" --trace-len 7680 --out "$OUT/decode_e2e.jsonl" --no-gemm --commit "$C"
      grep -E "reuse kernel|select-coverage-sketch4 " "$OUT/attention_bench.log" | tail -8
      grep -E "cudnn|dhisparse-dense " "$OUT/sdpa_anchor.log" "$OUT/attention_bench.log" | head -8
      tail -16 "$OUT/e2e_bench.log" ;;
    gemm)
      # One layer's weight GEMMs (ours through cuBLASLt, PyTorch F.linear as the anchor), same method.
      run e2e_bench_gemm "$B/dhisparse" bench --ctx 8192 --batch 1 --prefill 2048 --out "$OUT/decode_e2e.jsonl" \
        --gemm-out "$OUT/weight_gemm.jsonl" --commit "$C"
      run linear_anchor python3 bench/anchors/linear_anchor.py --out "$OUT/weight_gemm.jsonl" --commit "$C"
      grep -A5 "weight GEMMs" "$OUT/e2e_bench_gemm.log"; cat "$OUT/linear_anchor.log" ;;
    prefill)
      # Prefill attention: the warpgroup-MMA kernel (prefill_attention_sm90.cu) and the mma.sync one
      # against the CPU reference, memcheck + racecheck on the small case of both, then one layer at
      # 32k / 128k (both kernels, one call) with the cuDNN / FA2 anchor, and TTFT at 32k.
      run test_prefill_attention timeout 200 "$B/test_prefill_attention"
      grep -E "^  " "$OUT/test_prefill_attention.log" | head -20
      if [ -z "${DHS_PREFILL_NOSAN:-}" ]; then
        run sanitizer_memcheck_test_prefill timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/test_prefill_attention" --gtest_filter='*Small*'
        run sanitizer_racecheck_test_prefill timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/test_prefill_attention" --gtest_filter='*Small*'
      fi
      run prefill_bench timeout 200 env DHS_COMMIT="$C" "$B/prefill_bench" --ctx ${DHS_PREFILL_CTX:-32768,131072} --out "$OUT/prefill_attention.jsonl"
      run sdpa_prefill_anchor timeout 200 python3 bench/anchors/sdpa_prefill_anchor.py --ctx ${DHS_PREFILL_CTX:-32768,131072} --out "$OUT/prefill_attention.jsonl"
      tail -12 "$OUT/prefill_bench.log"; grep -v "^#" "$OUT/sdpa_prefill_anchor.log" | tail -6
      [ -z "${DHS_PREFILL_NOTTFT:-}" ] && run e2e_ttft timeout 300 "$B/dhisparse" bench --ctx 32768 --batch 1 --prefill ${DHS_TTFT_LEN:-32768} \
        --policies dense --no-gemm --out "$OUT/decode_e2e.jsonl" --commit "$C" && grep -iE "ttft|prefill" "$OUT/e2e_ttft.log" | tail -6
      [ -n "${DHS_PREFILL_GEMV:-}" ] && run test_gemv timeout 90 "$B/test_gemv" ;;
    prefillprof)
      # Nsight Compute on the prefill kernel at 32k: the default form (ping-pong, 3 tiles) and v3
      # (warp-specialized, 2 tiles), by their mangled template arguments; and the default's SASS
      # with stall samples per instruction (source page, CSV).
      for form in ILi128ELb1ELb1ELi3E ILi128ELb1ELb0ELi2E; do
        run "ncu_prefill_$form" timeout 240 ncu --kernel-name-base mangled --kernel-name "regex:prefill_attention_sm90_kernel$form" \
          --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats \
          --section Occupancy --section InstructionStats --section ComputeWorkloadAnalysis "$B/prefill_bench" --ctx 32768 --out /dev/null
        grep -E "Duration|Registers|Achieved Occupancy|Warp Cycles Per Issued|Issued Warp|Stall|Compute \(SM\)|Memory Throughput|Issue Slots|Pipe" \
          "$OUT/ncu_prefill_$form.log" | head -40
      done
      ncu -o /tmp/dhs/prefill_rep -f --kernel-name-base mangled --kernel-name "regex:prefill_attention_sm90_kernelILi128ELb1ELb1ELi3E" \
        --launch-count 1 --section SourceCounters --section WarpStateStats "$B/prefill_bench" --ctx 32768 --out /dev/null \
        > "$OUT/ncu_prefill_sass_run.log" 2>&1
      ncu -i /tmp/dhs/prefill_rep.ncu-rep --page source --csv --print-source sass > "$OUT/sass_prefill_pp_s3.csv" 2>&1
      wc -l "$OUT/sass_prefill_pp_s3.csv" ;;
    probe)
      run attention_bench_probe timeout 240 "$B/attention_bench" --probe
      grep probe "$OUT/attention_bench_probe.log" ;;
    refresh)
      # The tables of docs/benchmarks.md in one shorter call: every decode attention shape (dense,
      # contiguous, sparse, traced budgets) with the SDPA/FA2 anchor, then e2e TPOT at 8k-128k x 1/4/8
      # (dense and traced coverage budgets) and TTFT at 32k.
      TRACE=bench/results/budget_trace_smollm2_sketch4.json
      run attention_bench timeout 300 "$B/attention_bench" --out "$OUT/decode_attention.jsonl" --commit "$C" --trace "$TRACE"
      run sdpa_anchor timeout 200 python3 bench/anchors/sdpa_anchor.py --out "$OUT/decode_attention.jsonl" --commit "$C"
      run e2e_bench timeout 300 "$B/dhisparse" bench --ctx 8192,32768,131072 --batch 1,4,8 --prefill 32768 \
        --policies dense,trace:coverage-0.99@sketch4,trace:coverage-0.95@sketch4 --trace "$TRACE" --trace-len 7680 \
        --no-gemm --out "$OUT/decode_e2e.jsonl" --commit "$C"
      grep -E "dhisparse-dense|cudnn|flash" "$OUT/attention_bench.log" "$OUT/sdpa_anchor.log" | tail -40
      grep -E "^[0-9]|prefill" "$OUT/e2e_bench.log" ;;
    bench)
      TRACE=$(ls "$OUT"/budget_trace_eval_smollm2.json bench/results/budget_trace_smollm2_sketch4.json 2>/dev/null | head -1)
      echo "budget trace: ${TRACE:-none}"
      run attention_bench "$B/attention_bench" --out "$OUT/decode_attention.jsonl" --commit "$C" ${TRACE:+--trace "$TRACE"}
      run sdpa_anchor python3 bench/anchors/sdpa_anchor.py --out "$OUT/decode_attention.jsonl" --commit "$C"
      POL=dense,quest:4096
      [ -n "$TRACE" ] && POL="dense,trace:coverage-0.95@sketch4,trace:coverage-0.98@sketch4,trace:coverage-0.99@sketch4,trace:coverage-0.99,quest:4096"
      run e2e_bench "$B/dhisparse" bench --ctx 32768,131072 --batch 1,4,8 --prefill 32768,131072 --policies "$POL" \
        ${TRACE:+--trace "$TRACE"} --out "$OUT/decode_e2e.jsonl" --gemm-out "$OUT/weight_gemm.jsonl" --commit "$C"
      run linear_anchor python3 bench/anchors/linear_anchor.py --out "$OUT/weight_gemm.jsonl" --commit "$C"
      run prefill_bench "$B/prefill_bench" --ctx 32768,131072 --out "$OUT/prefill_attention.jsonl"
      run sdpa_prefill_anchor python3 bench/anchors/sdpa_prefill_anchor.py --out "$OUT/prefill_attention.jsonl"
      grep -E "dhisparse-|select-" "$OUT/attention_bench.log" | tail -60
      tail -30 "$OUT/e2e_bench.log" ;;
    serve)
      # `dhisparse serve --device cuda` on the default model: the openai-client checks and 64
      # concurrent requests equal to `generate --device cuda` alone (tests/serve, DHS_DEVICE=cuda).
      [ -f $SMOL ] || { echo "serve: default model missing"; continue; }
      pyserve || continue
      (cd tests/serve && DHS_BIN=$B/dhisparse DHS_MODEL=$PWD/../../$SMOL DHS_DEVICE=cuda PYTHONPATH=$PY \
        timeout 500 python3 -m pytest -q -p no:cacheprovider test_openai_client.py test_concurrency.py) > "$OUT/serve_cuda.log" 2>&1
      echo "serve_cuda rc=$?"; tail -12 "$OUT/serve_cuda.log"
      summary+=("$(printf '%-34s %s' serve_cuda "$(grep -E 'passed|failed' "$OUT/serve_cuda.log" | tail -1 | cut -c1-80)")") ;;
    servetiers)
      # The KV hierarchy under the serving load generator (issue 23): the default model behind
      # `dhisparse serve --device cuda`, 16 requests of 7,000 + 128 tokens (KV ~2.6 GB in all) on a
      # KV pool capped at 2,000 blocks (32k tokens: ~4.4 of them), coverage 0.99: without a host
      # tier (requests wait for pages), with one (landing and recall-ahead, auto budgets), and
      # uncapped (every request's pages in HBM: the ceiling); all at once, then Poisson arrivals.
      # Rows: serve.jsonl (host_kv_gib, kv_blocks, kv_recall, tier_hit_rate, ...). DHS_SERVE_EXTRA:
      # server arguments added to every configuration (e.g. --kv-io-admit load), DHS_SERVE_NOTE: the
      # rows' note after "servetiers NAME".
      [ -f $SMOL ] || { echo "servetiers: default model missing"; continue; }
      pyserve || continue
      pol=coverage:0.99
      for cfg in "cap:--num-gpu-blocks-override 2000" "land:--num-gpu-blocks-override 2000 --cpu-kv-gb 4 --kv-recall land --kv-device-budget auto" \
                 "ahead:--num-gpu-blocks-override 2000 --cpu-kv-gb 4 --kv-recall ahead --kv-device-budget auto" "uncapped:"; do
        name=${cfg%%:*}; extra=${cfg#*:}
        [[ " ${DHS_SERVE_CFGS:-cap land ahead uncapped} " == *" $name "* ]] || continue
        for load in "sat:--concurrency 16 --num-prompts 16" "rate2:--rate 2 --num-prompts 32"; do
          lname=${load%%:*}
          [[ " ${DHS_SERVE_LOADS:-sat rate2} " == *" $lname "* ]] || continue
          run "serve_tiers_${name}_$lname" timeout 300 env PYTHONPATH=$PY DHS_BIN=$B/dhisparse DHS_MODEL=$PWD/$SMOL DHS_DEVICE=cuda \
            python3 bench/serve_load.py --launch --server-args "--sparse-policy $pol --max-num-seqs 16 $extra ${DHS_SERVE_EXTRA:-}" --dataset synthetic \
            --prompt-len 7000 --output-len 128 ${load#*:} --ctx 7k --policy "$pol" --device "$GPU" --note "servetiers $name${DHS_SERVE_NOTE:+ $DHS_SERVE_NOTE}" \
            --results "$OUT/serve.jsonl" --no-tqdm
          tail -10 "$OUT/serve_tiers_${name}_$lname.log"
        done
      done ;;
    servespec)
      # Speculative decoding under the serving load generator (issue 24: with `--speculative-k
      # auto` throughput never below 97% of speculation off at any offered load): off and auto
      # alternated at each load, greedy, dense verification. DHS_SPEC_MODELS: "smol" (the default
      # model, 7,000 + 128 tokens: real acceptance) and / or "dummy8b" (the 8B shape with random
      # weights, 32,000 + 256 tokens: its acceptance means nothing — what auto costs where drafting
      # does not pay; DHS_SPEC_8B_CTX=128k: two requests of 130,000 + 256). Rows: serve.jsonl, note "servespec MODEL LOAD k=K" (spec_* counters from
      # /metrics).
      pyserve || continue
      for m in ${DHS_SPEC_MODELS:-smol dummy8b}; do
        case $m in
          smol) [ -f $SMOL ] || { echo "servespec: default model missing"; continue; }
            MP=$PWD/$SMOL MARGS="" plen=7000 out=128 ctxl=7k n=16
            loads=${DHS_SPEC_LOADS_SMOL:-"sat:--concurrency 16 --num-prompts 16|c1:--concurrency 1 --num-prompts 4|rate4:--rate 4 --num-prompts 32"} ;;
          dummy8b) MP=/tmp/dhs/dummy8b; mkdir -p $MP
            cp tests/data/tiny_models/llama31_rope_scaled/{config.json,model.safetensors} tests/data/tokenizer/smollm2/tokenizer*.json $MP/
            if [ "${DHS_SPEC_8B_CTX:-32k}" = 128k ]; then  # (two 128k requests: 32 GiB of KV beside the weights)
              MARGS="--load-format dummy --dummy-shape llama3-8b --served-model-name llama3-8b-dummy --max-model-len 131072" plen=130000 out=256 ctxl=128k n=2
              loads=${DHS_SPEC_LOADS_8B:-"c1:--concurrency 1 --num-prompts 2|sat:--concurrency 2 --num-prompts 2"}
            else
              MARGS="--load-format dummy --dummy-shape llama3-8b --served-model-name llama3-8b-dummy --max-model-len 32768" plen=32000 out=256 ctxl=32k n=8
              loads=${DHS_SPEC_LOADS_8B:-"sat:--concurrency 8 --num-prompts 8|c1:--concurrency 1 --num-prompts 2|rate0.3:--rate 0.3 --num-prompts 8"}
            fi ;;
          *) echo "servespec: no model $m"; continue ;;
        esac
        IFS='|' read -ra LOADS <<< "$loads"
        for load in "${LOADS[@]}"; do
          lname=${load%%:*}
          for k in ${DHS_SPEC_ORDER:-0 auto}; do
            run "serve_spec_${m}_${lname}_k$k" timeout 240 env PYTHONPATH=$PY DHS_BIN=$B/dhisparse DHS_MODEL=$MP DHS_DEVICE=cuda \
              python3 bench/serve_load.py --launch --server-args "$MARGS --max-num-seqs $n --speculative-k $k" --dataset synthetic \
              --prompt-len $plen --output-len $out ${load#*:} --ctx $ctxl --policy dense --device "$GPU" \
              --note "servespec $m $lname k=$k" --results "$OUT/serve.jsonl" --no-tqdm
            grep -hE "tok/s|req/s|TPOT|spec|rror" "$OUT/serve_spec_${m}_${lname}_k$k.log" | head -6
          done
        done
      done ;;
    serveload)
      # The 8B shape with random weights (--load-format dummy --dummy-shape llama3-8b; tokenizer
      # SmolLM2's, from the test data) behind `dhisparse serve`, loaded by bench/serve_load.py. Per
      # context (DHS_SERVE_CTX, default "8k 32k 128k"): N requests at once, dense and coverage 0.99
      # (the saturation rows: every request decoding together, against `dhisparse bench` for batch
      # N at the window's mean context, same call), then Poisson rates, dense. Rows: serve.jsonl.
      pyserve || continue
      D=/tmp/dhs/dummy8b; mkdir -p $D
      cp tests/data/tiny_models/llama31_rope_scaled/{config.json,model.safetensors} tests/data/tokenizer/smollm2/tokenizer*.json $D/
      for ctx in ${DHS_SERVE_CTX:-8k 32k 128k}; do
        case $ctx in
          8k) n=32 out=384 tok=8192 rates=${DHS_SERVE_RATES_8K-"0.5 1 2"} ;;
          32k) n=8 out=512 tok=32768 rates=${DHS_SERVE_RATES_32K-"0.2"} ;;
          128k) n=4 out=512 tok=131072 rates=${DHS_SERVE_RATES_128K-""} ;;
          *) echo "serveload: no setting for $ctx"; continue ;;
        esac
        plen=$((tok - out)); mid=$((plen + out / 2))
        [ -n "${DHS_SERVE_SAT_POLICIES-x}" ] && run "serve_bench_$ctx" timeout 300 "$B/dhisparse" bench --ctx $mid --batch $n --prefill 0 --no-gemm \
          --policies dense,coverage:0.99@sketch4 --out "$OUT/serve_bench.jsonl" --commit "$C"
        for pol in ${DHS_SERVE_SAT_POLICIES-dense coverage:0.99}; do
          bt=$(python3 -c "import json,sys
rows=[json.loads(l) for l in open('$OUT/serve_bench.jsonl')]
want='dense' if '$pol'=='dense' else 'coverage'
r=[x for x in rows if x.get('ctx')==$mid and x.get('batch')==$n and x['policy'].startswith(want)][-1]
print(round($n*1000/r['tpot_ms'],1))" 2>/dev/null)
          SARGS="--load-format dummy --dummy-shape llama3-8b --served-model-name llama3-8b-dummy --max-num-seqs $n --max-model-len $tok --sparse-policy $pol"
          run "serve_load_${ctx}_${pol%%:*}_sat" timeout 400 env PYTHONPATH=$PY DHS_BIN=$B/dhisparse DHS_MODEL=$D DHS_DEVICE=cuda \
            python3 bench/serve_load.py --launch --server-args "$SARGS" --dataset synthetic --prompt-len $plen --output-len $out \
            --concurrency $n --num-prompts $n --ctx $ctx --policy "$pol" --device "$GPU" ${bt:+--bench-tok-s $bt} \
            --note "saturation: $n at once; bench at ctx $mid" --results "$OUT/serve.jsonl" --no-tqdm
          tail -9 "$OUT/serve_load_${ctx}_${pol%%:*}_sat.log"
        done
        for pol in ${DHS_SERVE_RATE_POLICIES-dense}; do
          for r in $rates; do
            SARGS="--load-format dummy --dummy-shape llama3-8b --served-model-name llama3-8b-dummy --max-num-seqs $n --max-model-len $tok --sparse-policy $pol"
            run "serve_load_${ctx}_${pol%%:*}_rate$r" timeout 400 env PYTHONPATH=$PY DHS_BIN=$B/dhisparse DHS_MODEL=$D DHS_DEVICE=cuda \
              python3 bench/serve_load.py --launch --server-args "$SARGS" --dataset synthetic --prompt-len $plen --output-len 128 \
              --rate $r --num-prompts ${DHS_SERVE_RATE_N:-$((n < 16 ? 16 : n))} --ctx $ctx --policy "$pol" --device "$GPU" --results "$OUT/serve.jsonl" --no-tqdm
            tail -8 "$OUT/serve_load_${ctx}_${pol%%:*}_rate$r.log"
          done
        done
      done ;;
    *) echo "unknown stage $stage" ;;
  esac
done
echo; echo "== summary"; printf '%s\n' "${summary[@]}"
