#!/usr/bin/env bash
# The HTTP library measurement of docs/serving.md: N concurrent SSE streams against the real
# server over a fixed-rate fake scheduler; prints one JSON row (append it to
# bench/results/http_probe.jsonl). Server CPU time and threads are read from /proc.
#   bench/http_probe/run_probe.sh BUILD_DIR [N_STREAMS=512] [RATE_HZ=10] [TOKENS=200] [HTTP_THREADS=N+64]
set -euo pipefail
build="$1"; n="${2:-512}"; rate="${3:-10}"; tokens="${4:-200}"; threads="${5:-$((n + 64))}"
here="$(cd "$(dirname "$0")" && pwd)"
port=$((20000 + RANDOM % 20000))
out="$(mktemp)"
"$build/bench/http_probe/http_probe_server" "$port" "$rate" "$threads" > "$out" &
pid=$!
sleep 0.5
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
cpu0=$(ticks); t0=$(date +%s.%N)
python3 "$here/probe_client.py" "$port" "$n" "$tokens" > "$out.client" &
cpid=$!
sleep $(( tokens / rate / 2 ))
threads_mid=$(awk '/^Threads:/ {print $2}' "/proc/$pid/status")
rss_mid=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")
wait "$cpid"
cpu1=$(ticks); t1=$(date +%s.%N)
kill -TERM "$pid"; wait "$pid" || true
hz=$(getconf CLK_TCK)
python3 - "$out" "$out.client" "$cpu0" "$cpu1" "$t0" "$t1" "$hz" "$threads_mid" "$rss_mid" "$n" "$rate" "$tokens" "$threads" <<'PY'
import json, subprocess, sys, platform, os
srv = json.load(open(sys.argv[1])); cli = json.load(open(sys.argv[2]))
cpu0, cpu1, t0, t1, hz = float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7])
commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
row = {"commit": commit, "library": "cpp-httplib 0.11.4 (Debian)", "host_cpus": os.cpu_count(),
       "streams": int(sys.argv[10]), "rate_hz_per_stream": float(sys.argv[11]), "tokens_per_stream": int(sys.argv[12]),
       "http_threads": int(sys.argv[13]), "server_threads_mid": int(sys.argv[8]), "server_rss_mb_mid": int(sys.argv[9]) / 1024,
       "server_cpu_s": (cpu1 - cpu0) / hz, "wall_s": t1 - t0, "server_cpu_frac_of_one_core": (cpu1 - cpu0) / hz / (t1 - t0)}
row.update(cli); row.update(srv)
print(json.dumps(row))
PY
rm -f "$out" "$out.client"
