#!/usr/bin/env bash
# CPU decode/prefill speed of the default model through the CLI (greedy, fixed
# prompts, --ignore-eos so every run decodes the same count). Appends one JSON line
# per run to bench/results/cpu_generate.jsonl and prints a table.
#   bash scripts/bench_cpu.sh [repeats]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/dhisparse"
model="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
out="$root/bench/results/cpu_generate.jsonl"
reps="${1:-3}"
commit="$(git -C "$root" rev-parse --short HEAD)"
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
threads="$(nproc)"
short="What is the capital of France?"
long="$(python3 -c "print(' '.join(f'Item {i}: the quick brown fox jumps over the lazy dog.' for i in range(90)))")"
mkdir -p "$(dirname "$out")"
"$bin" generate -m "$model" -p "warm-up" -n 4 -q > /dev/null  # page cache
printf '%-8s %-6s %8s %12s %12s\n' weights prompt tokens "prefill t/s" "decode t/s"
for w in f16 f32; do
  for kind in short long; do
    p="$short"; [ "$kind" = long ] && p="$long"
    for r in $(seq 1 "$reps"); do
      line="$("$bin" generate -m "$model" -p "$p" -n 64 --ignore-eos --weights "$w" 2>&1 >/dev/null | grep '^prompt:')"
      n_prompt="$(sed -E 's/prompt: ([0-9]+) tokens.*/\1/' <<<"$line")"
      pp="$(sed -E 's/.*prompt: [0-9]+ tokens, ([0-9.]+) tokens\/s.*/\1/' <<<"$line")"
      tg="$(sed -E 's/.*decode: [0-9]+ tokens, ([0-9.]+) tokens\/s.*/\1/' <<<"$line")"
      printf '%-8s %-6s %8s %12s %12s\n' "$w" "$kind" "$n_prompt" "$pp" "$tg"
      printf '{"commit":"%s","machine":"%s","threads":%s,"model":"SmolLM2-135M-Instruct.Q4_1","weights":"%s","prompt_tokens":%s,"decode_tokens":64,"prefill_tok_s":%s,"decode_tok_s":%s,"date":"%s"}\n' \
        "$commit" "$cpu" "$threads" "$w" "$n_prompt" "$pp" "$tg" "$(date -u +%FT%TZ)" >> "$out"
    done
  done
done
