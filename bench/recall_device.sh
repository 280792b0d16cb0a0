#!/usr/bin/env bash
# The KV hierarchy's I/O engine on the GPU machine (issue 23, item 3), one device call:
#   1. test_page_recall (every form against kv/tier_copy.h, bit-exact; graph replay; guard pages)
#   2. compute-sanitizer memcheck on it, DHS_TEST_QUICK=1 (smaller pools and lists)
#   3. recall_bench -> $OUT/page_recall.jsonl (bulk anchor, recall by grid size and copy-engine
#      forms, beside decode attention, evict), then a summary table of its rows
# Binaries from bench/prebuild.sh: BIN (default /tmp/dhs/bin), unpacked from .devcarry/bin.tar.xz
# (a tarball of bin/) into BIN's parent when the test binary is not there yet. Extra arguments go
# to recall_bench (e.g. --host-gib 4 --attn-ctx 32768).
#   DHS_COMMIT=abc1234 OUT=/tmp/dhs_out bash bench/recall_device.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dhs_out}
BIN=${BIN:-/tmp/dhs/bin}
mkdir -p "$OUT"
if [ ! -x "$BIN/test_page_recall" ] && [ -f .devcarry/bin.tar.xz ]; then
  mkdir -p "$(dirname "$BIN")" && tar -C "$(dirname "$BIN")" -xJf .devcarry/bin.tar.xz
fi
for b in test_page_recall recall_bench; do
  [ -x "$BIN/$b" ] || { echo "no $BIN/$b: run bench/prebuild.sh here and carry .devcarry/bin.tar.xz (or set BIN)"; exit 1; }
done
export LD_LIBRARY_PATH=$BIN:${LD_LIBRARY_PATH:-}
export DHS_COMMIT=${DHS_COMMIT:-unknown}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv | tee "$OUT/gpu.txt"

status=0
summary=()
# step NAME CMD...: runs CMD with its output in $OUT/NAME.log; prints its tail and verdict.
step() {
  local name=$1; shift
  echo "== $name"
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -4 "$OUT/$name.log"
  [ "$rc" -ne 0 ] && status=1
  summary+=("$(printf '%-40s rc=%s  %s' "$name" "$rc" \
    "$( (grep -m1 -E 'ERROR SUMMARY' "$OUT/$name.log" || grep -m1 -E '^\[  (PASSED|FAILED)  \] [0-9]' "$OUT/$name.log" \
         || grep -m1 -E 'SKIP|done in' "$OUT/$name.log") | cut -c1-70)")")
}

step test_page_recall timeout 300 "$BIN/test_page_recall"
step sanitizer_memcheck_test_page_recall timeout 420 env DHS_TEST_QUICK=1 \
  compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/test_page_recall"
step recall_bench timeout 300 "$BIN/recall_bench" --out "$OUT/page_recall.jsonl" "$@"

if [ -f "$OUT/page_recall.jsonl" ]; then
  python3 - "$OUT/page_recall.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"{'form':<13} {'dir':<7} {'layout':<11} {'blocks':>6} {'GB/s':>8} {'of bulk':>8}  beside attention")
for r in rows:
    beside = ""
    if "attn_ratio" in r:
        beside = (f"attn {r['attn_gb_s_alone']:.0f} -> {r['attn_gb_s_beside']:.0f} GB/s "
                  f"({100 * r['attn_ratio']:.1f}%), {r['recall_reps_inside']} reps inside, covered {r['covered']}")
    of = f"{r['of_bulk']:.3f}" if "of_bulk" in r else "-"
    print(f"{r['form']:<13} {r['direction']:<7} {r.get('layout', ''):<11} {r['blocks']:>6} {r['gb_s']:>8.2f} {of:>8}  {beside}")
EOF
fi
echo; echo "== summary"; printf '%s\n' "${summary[@]}"
exit $status
