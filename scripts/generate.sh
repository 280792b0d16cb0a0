#!/usr/bin/env bash
# Quick start, command 1: build if needed, fetch the default model if needed,
# and answer a prompt with it (chat format). Any extra args go to `dhisparse generate`.
#   bash scripts/generate.sh "What is the capital of France?"
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
prompt="${1:-What is the capital of France?}"
shift || true
bash "$root/scripts/setup.sh" > /dev/null
bash "$root/scripts/fetch_model.sh" > /dev/null
exec "$root/build/dhisparse" generate --chat -p "$prompt" "$@"
