# session 33: the serving run with landing, base (d9225a8) and new (24ac46f) alternated, phases log on
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dhs_out}
for f in .devcarry/smol.part.*; do [ -f "$f" ] && cp "$f" ~/dhs/; done
SMOL=models/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p models && cat ~/dhs/smol.part.* > $SMOL
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $SMOL" | sha256sum -c || exit 1
PY=/tmp/dhs/py
python3 -m pip install -q --no-index --find-links .devcarry/wheels --target $PY -r tests/serve/requirements.txt > $OUT/pip.log 2>&1 || { echo pip failed; exit 1; }
pol=coverage:0.99
for w in ${DHS_ORDER:-new base new base}; do
  if [ $w = base ]; then B=/tmp/dhs/base/bin; C=20bfc6c; else B=/tmp/dhs/bin; C=$(cat .devcommit 2>/dev/null || echo new); fi
  echo "== land $w"
  env PYTHONPATH=$PY LD_LIBRARY_PATH=$B DHS_STEP_PHASES=1 DHS_BIN=$B/dhisparse DHS_MODEL=$PWD/$SMOL DHS_DEVICE=cuda timeout 200 \
    python3 bench/serve_load.py --launch --server-args "--sparse-policy $pol --max-num-seqs 16 --num-gpu-blocks-override 2000 --cpu-kv-gb 4 --kv-recall land --kv-device-budget auto" \
    --dataset synthetic --prompt-len 7000 --output-len 128 --concurrency 16 --num-prompts 16 --ctx 7k --policy "$pol" --device "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" \
    --note "servetiers land $w (session 33 A/B, DHS_STEP_PHASES=1)" --results $OUT/serve.jsonl --no-tqdm > $OUT/land_$w.log 2>&1
  grep -E "requests/s|tpot |KV tiers" $OUT/land_$w.log
  d=$(ls -td /tmp/dhs-load-* | head -1); cp $d/stderr.log $OUT/land_${w}_server_$(date +%s).log 2>/dev/null
done
