#!/usr/bin/env bash
# The `dhisparse serve` end-to-end suite (tests/serve/, pytest + the official openai client):
#   bash scripts/test_serve.sh [BINARY] [pytest args...]     e.g. -m "not slow", -k hostile
# BINARY defaults to $DHS_BIN or build/dhisparse; the model to $DHS_MODEL or the default one.
# Exits 77 (ctest: skipped) when the binary has no serve command or the model is missing.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${DHS_BIN:-$root/build/dhisparse}"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then bin="$1"; shift; fi
model="${DHS_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}"

if [ ! -x "$bin" ] || ! "$bin" serve --help >/dev/null 2>&1; then
  echo "SKIP: $bin has no serve command"
  exit 77
fi
if [ ! -f "$model" ]; then
  echo "SKIP: no model at $model (scripts/fetch_model.sh fetches the default one)"
  exit 77
fi
py="$(bash "$root/scripts/serve_test_env.sh" | tail -1)"
export DHS_BIN="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")" DHS_MODEL="$model"
cd "$root/tests/serve"
set +e
"$py" -m pytest -q "$@"
rc=$?
set -e
[ $rc -eq 5 ] && { echo "no serve test ran"; exit 1; }  # pytest: nothing collected
exit $rc
