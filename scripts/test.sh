#!/usr/bin/env bash
# Quick start, command 2: build, fetch the default model, run every test that
# needs no GPU (ctest labels unit and e2e; `cuda` tests need the device).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup.sh"
bash "$root/scripts/fetch_model.sh"
ctest --test-dir "$root/build" -L 'unit|e2e' --output-on-failure -j"$(nproc)"
