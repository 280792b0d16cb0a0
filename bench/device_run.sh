#!/usr/bin/env bash
# Decode attention on the lent GPU, in ONE device call: build, cuda tests, compute-sanitizer
# (memcheck + racecheck) on the test, our benchmark and the PyTorch SDPA anchor (same call,
# same method), JSON lines appended to bench/results/decode_attention.jsonl, short table last.
#
#   DHS_COMMIT=$(git rev-parse --short HEAD) bash bench/device_run.sh     # on the device
# Env: OUT (logs; the device tool sets it), DHS_COMMIT, DHS_BENCH_ARGS (extra attention_bench
# flags, e.g. "--stages 4 --min-pages 16"), DHS_SKIP_SANITIZER=1, DHS_QUICK=1 (fewer shapes),
# DHS_FMT_INCLUDE (fmt headers for the direct build when the machine has no libfmt-dev),
# DHS_DIRECT_BUILD=1 (skip the CMake attempt), DHS_DIRECT_DIR (its output folder),
# DHS_BUILD_ONLY=1 (stop after building), DHS_PREBUILT=dir (use binaries built elsewhere
# with the direct build when they load on this machine: saves the device's build time).
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/build-dev/out}
mkdir -p "$OUT" bench/results
COMMIT=${DHS_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
RUN_ID=$(date -u +%Y%m%dT%H%M%SZ)
RESULTS=$ROOT/bench/results/decode_attention.jsonl
JOBS=$(nproc)
STATUS=()
step() { echo "== $(date -u +%T) $*"; }
export PATH=$PATH:/usr/local/cuda/bin
QUICK=${DHS_QUICK:+--quick}

step "gpu"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used --format=csv \
  | tee "$OUT/gpu.txt"

# ---- 1. build ------------------------------------------------------------------------
# The project's CMake when its dependencies are installed; else a direct nvcc/g++ build of
# exactly what these programs need (fmt header-only from DHS_FMT_INCLUDE).
step "build"
TEST= BENCH= TEST_RC=
PRE=${DHS_PREBUILT:-}
if [ -n "$PRE" ] && [ -x "$PRE/attention_bench" ] && [ -x "$PRE/test_decode_attention" ]; then
  # Built on the developer machine (static libstdc++ and cudart); used only if it loads here.
  "$PRE/attention_bench" --usage >/dev/null 2>&1; rc=$?
  if [ $rc = 2 ]; then TEST=$PRE/test_decode_attention; BENCH=$PRE/attention_bench; echo "using prebuilt $PRE"
  else echo "prebuilt binaries do not run here (rc=$rc); building"; fi
fi
if [ -z "$TEST" ] && [ -z "${DHS_DIRECT_BUILD:-}" ] &&
   cmake -S . -B build-dev -DCMAKE_CUDA_ARCHITECTURES=90a -DDHS_TESTS=ON >"$OUT/cmake.log" 2>&1 &&
   cmake --build build-dev -j"$JOBS" --target test_decode_attention attention_bench >"$OUT/build.log" 2>&1; then
  TEST=build-dev/tests/test_decode_attention
  BENCH=build-dev/bench/attention_bench
  echo "built with CMake"
elif [ -z "$TEST" ]; then
  echo "CMake build unavailable ($(grep -m1 -iE 'error|could not' "$OUT/cmake.log" "$OUT/build.log" 2>/dev/null | cut -c1-160)); direct build"
  FMT_INC=${DHS_FMT_INCLUDE:-$ROOT/build-cuda/devdeps/include}
  D=${DHS_DIRECT_DIR:-build-dev/direct}
  mkdir -p "$D"
  CXXF="-O2 -std=c++20 -march=x86-64-v3 -Isrc -Iinclude -I$FMT_INC -DFMT_HEADER_ONLY -I/usr/local/cuda/include"
  NVF="-O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude -I$FMT_INC -DFMT_HEADER_ONLY -Xptxas=-v"
  pids=()
  for f in src/core/error.cpp src/core/thread_pool.cpp src/kv/page_pool.cpp src/kv/page_table.cpp \
           src/kv/page_lists.cpp src/backend/cpu/attention.cpp src/backend/cuda/cuda_check.cpp \
           tests/cuda/test_decode_attention.cpp; do
    g++ $CXXF -c "$f" -o "$D/$(basename "${f%.*}").o" >"$D/$(basename "$f").log" 2>&1 & pids+=($!)
  done
  for f in src/backend/cuda/device_page_pool.cu src/backend/cuda/decode_attention.cu bench/attention_bench.cu; do
    nvcc $NVF -c "$f" -o "$D/$(basename "${f%.*}").o" >"$D/$(basename "$f").log" 2>&1 & pids+=($!)
  done
  ok=1
  for p in "${pids[@]}"; do wait "$p" || ok=0; done
  cat "$D"/*.log >"$OUT/build.log"
  if [ $ok = 1 ]; then
    CORE="$D/device_page_pool.o $D/decode_attention.o $D/cuda_check.o $D/error.o $D/page_pool.o $D/page_table.o $D/page_lists.o"
    LIBS="-static-libstdc++ -static-libgcc -L/usr/local/cuda/lib64 -lcudart_static -ldl -lrt -lpthread"
    g++ -o "$D/test_decode_attention" "$D/test_decode_attention.o" "$D/attention.o" "$D/thread_pool.o" $CORE \
      $LIBS >>"$OUT/build.log" 2>&1 &&
      g++ -o "$D/attention_bench" "$D/attention_bench.o" $CORE $LIBS >>"$OUT/build.log" 2>&1 || ok=0
  fi
  if [ $ok = 1 ]; then
    TEST=$D/test_decode_attention
    BENCH=$D/attention_bench
    echo "built directly"
  else
    echo "BUILD FAILED"; grep -m20 -E "error" "$OUT/build.log"; STATUS+=("build FAILED")
  fi
fi
[ -n "${DHS_BUILD_ONLY:-}" ] && exit 0
grep -E "[1-9][0-9]* bytes (stack frame|spill stores)" "$OUT/build.log" | head -5  # expect none

# ---- 2. tests ------------------------------------------------------------------------
if [ -n "$TEST" ]; then
  step "test_decode_attention"
  timeout 150 "$TEST" >"$OUT/test.log" 2>&1; rc=$?
  TEST_RC=$rc
  case $rc in
    0) STATUS+=("tests: PASS ($(tail -1 "$OUT/test.log"))") ;;
    77) STATUS+=("tests: SKIPPED ($(tail -1 "$OUT/test.log"))") ;;
    *) STATUS+=("tests: FAIL rc=$rc ($(tail -1 "$OUT/test.log"))") ;;
  esac
  grep -E "^(PASS|FAIL)|bad [1-9]|exception|first bad" "$OUT/test.log" | head -40
  if [ -f build-dev/CTestTestfile.cmake ] && [ "$TEST" = build-dev/tests/test_decode_attention ]; then
    (cd build-dev && timeout 240 ctest -L cuda -R test_decode_attention --output-on-failure >"$OUT/ctest.log" 2>&1)
    tail -3 "$OUT/ctest.log"
  fi

  # ---- 3. compute-sanitizer --------------------------------------------------------------
  if [ "$TEST_RC" = 124 ]; then
    STATUS+=("test timed out (hang?): sanitizers skipped, bench in quick mode"); QUICK=--quick
  elif [ -z "${DHS_SKIP_SANITIZER:-}" ]; then
    for tool in memcheck racecheck; do
      step "compute-sanitizer $tool (DHS_TEST_QUICK=1)"
      DHS_TEST_QUICK=1 timeout 180 compute-sanitizer --tool $tool --error-exitcode 9 "$TEST" >"$OUT/sanitizer_$tool.log" 2>&1
      rc=$?
      STATUS+=("compute-sanitizer $tool: rc=$rc, $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log")")
      grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed," "$OUT/sanitizer_$tool.log" | head -3
    done
  fi
fi

# ---- 4. benchmarks: ours, then the anchor ----------------------------------------------
if [ -n "$BENCH" ]; then
  step "attention_bench ${DHS_BENCH_ARGS:-}"
  timeout 200 "$BENCH" --out "$RESULTS" --commit "$COMMIT" --run-id "$RUN_ID" --tune \
    --tune-out "$OUT/decode_attention_tuning.jsonl" $QUICK ${DHS_BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -40
  [ $? = 0 ] || STATUS+=("bench FAILED")
fi
step "sdpa_anchor.py"
PYTHONUNBUFFERED=1 timeout 240 python3 bench/anchors/sdpa_anchor.py --out "$RESULTS" --commit "$COMMIT" \
  --run-id "$RUN_ID" $QUICK >"$OUT/anchor.log" 2>&1 || STATUS+=("anchor FAILED: $(tail -1 "$OUT/anchor.log")")
touch "$RESULTS"
cp "$RESULTS" "$OUT/decode_attention.jsonl"

# ---- 5. table ------------------------------------------------------------------------
step "summary (run $RUN_ID, commit $COMMIT)"
python3 - "$RESULTS" "$RUN_ID" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r.get("run_id") == sys.argv[2]]
by = {(r["impl"], r.get("ctx"), r.get("batch")): r for r in rows if "us" in r}
cp = [r for r in rows if r["impl"] == "d2d-copy"]
if cp: print(f"d2d copy ceiling {cp[0]['GBps']:.0f} GB/s")
print(f"{'ctx':>6} {'b':>3} | {'ours us':>8} {'GB/s':>5} {'contig':>7} | {'cudnn us':>8} {'fa2 us':>8} | {'cudnn/ours':>10} {'cudnn/contig':>12} {'fa2/ours':>8} | {'sparse30':>8} {'frac':>4} {'dense/sp':>8}")
for ctx in (8192, 32768, 131072):
    for b in (1, 4, 8, 32):
        o = by.get(("dhisparse-dense", ctx, b))
        if not o: continue
        c = by.get(("cudnn-sdpa", ctx, b)); f = by.get(("fa2", ctx, b)); s = by.get(("dhisparse-sparse30", ctx, b))
        k = by.get(("dhisparse-dense-contig", ctx, b))
        ku = f"{k['us']:7.1f}" if k else "      -"
        cu = f"{c['us']:8.1f}" if c else "       -"; fu = f"{f['us']:8.1f}" if f else "       -"
        rc = f"{c['us']/o['us']:10.2f}" if c else "         -"; rf = f"{f['us']/o['us']:8.2f}" if f else "       -"
        rk = f"{c['us']/k['us']:12.2f}" if (c and k) else "           -"
        sp = f"{s['us']:8.1f} {s['pages_read_frac']:4.2f} {o['us']/s['us']:8.2f}" if s else ""
        print(f"{ctx//1024:>5}k {b:>3} | {o['us']:8.1f} {o['GBps']:5.0f} {ku} | {cu} {fu} | {rc} {rk} {rf} | {sp}")
EOF
step "status"
for s in "${STATUS[@]}"; do echo "  $s"; done
