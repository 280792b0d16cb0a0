set -u
mkdir -p /tmp/dhs/base && tar -C /tmp/dhs -xJf .devcarry/bin.tar.xz && tar -C /tmp/dhs/base -xJf .devcarry/bin_base.tar.xz
TR=bench/results/budget_trace_smollm2_sketch4.json; SOLO=bench/results/budget_trace_smollm2_solohead_cpu.json
python3 bench/anchors/sdpa_anchor.py --quick --out $OUT/decode_attention.jsonl --commit d9225a8 > $OUT/sdpa.log 2>&1; tail -3 $OUT/sdpa.log
hb() { local bin=$1 c=$2 tag=$3; shift 3; timeout 200 env LD_LIBRARY_PATH=$bin $bin/dhisparse bench --hierarchy --ctx 131072 --trace-len 7680 --hierarchy-out $OUT/hierarchy.jsonl --commit $c --steps 12 --hbm-kv-gib 32 --host-kv-gib 72 --land "$@" > $OUT/$tag.log 2>&1; echo "== $tag"; grep -hE "^ctx|^  forward|^  tiers|error" $OUT/$tag.log; }
for w in base new base new; do
  if [ $w = base ]; then B=/tmp/dhs/base/bin; C=6c03f62; else B=/tmp/dhs/bin; C=d9225a8; fi
  hb $B $C g95_b4_$w --trace $TR --policies trace:coverage-0.95@sketch4 --batch 4 --buffer 0.5 --churn 0.10
done
for w in base new; do
  if [ $w = base ]; then B=/tmp/dhs/base/bin; C=6c03f62; else B=/tmp/dhs/bin; C=d9225a8; fi
  hb $B $C g99_b4_$w --trace $TR --policies trace:coverage-0.99@sketch4 --batch 4 --buffer 0.5 --churn 0.055
done
hb /tmp/dhs/bin d9225a8 solo_b3 --trace $SOLO --policies trace:solohead-0.99@sketch4 --batch 3 --buffer 1.0 --churn 0.01
hb /tmp/dhs/bin d9225a8 solo_b4 --trace $SOLO --policies trace:solohead-0.99@sketch4 --batch 4 --buffer 0.5 --churn 0.045
