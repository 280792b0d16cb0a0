#!/usr/bin/env bash
# CLI behaviour on good and bad input: clear message, non-zero exit, no crash.
#   test_cli.sh DHISPARSE_BINARY MODEL_PATH
set -u
bin="$1"; model="$2"
if [ ! -f "$model" ]; then echo "SKIP: default model missing (run scripts/fetch_model.sh)"; exit 77; fi
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
fails=0
# expect EXIT_CODE_CLASS(zero|nonzero) REGEX -- ARGS...
expect() {
  local want="$1" re="$2"; shift 3
  local out rc
  out="$("$bin" "$@" 2>&1)"; rc=$?
  if [ "$rc" -ge 128 ]; then echo "FAIL (crash, rc $rc): $*"; fails=$((fails+1)); return; fi
  if { [ "$want" = zero ] && [ "$rc" -ne 0 ]; } || { [ "$want" = nonzero ] && [ "$rc" -eq 0 ]; }; then
    echo "FAIL (rc $rc, wanted $want): $*"; echo "$out" | tail -3; fails=$((fails+1)); return; fi
  if ! grep -qiE -- "$re" <<<"$out"; then
    echo "FAIL (output lacks /$re/): $*"; echo "$out" | tail -3; fails=$((fails+1)); return; fi
  echo "ok: $*"
}

# A GGUF v3 header with one metadata key general.architecture = "gpt2" and no tensors.
printf 'GGUF\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00' > "$tmp/gpt2.gguf"
printf '\x14\x00\x00\x00\x00\x00\x00\x00general.architecture\x08\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00gpt2' >> "$tmp/gpt2.gguf"
head -c 100000 "$model" > "$tmp/truncated.gguf"
echo "not a model" > "$tmp/text.gguf"
mkdir -p "$tmp/emptydir"

expect nonzero "does not exist" -- generate -m "$tmp/nope.gguf" -p hi
expect nonzero "not a GGUF" -- generate -m "$tmp/text.gguf" -p hi
expect nonzero "unsupported architecture 'gpt2'" -- generate -m "$tmp/gpt2.gguf" -p hi
expect nonzero "truncated|past the end|out of range|beyond" -- generate -m "$tmp/truncated.gguf" -p hi
expect nonzero "config.json" -- generate -m "$tmp/emptydir" -p hi
expect nonzero "temperature" -- generate -m "$model" -p hi --temperature -1
expect nonzero "top-p" -- generate -m "$model" -p hi --top-p 2
expect nonzero "bogus" -- generate -m "$model" -p hi --bogus
expect nonzero "prompt.*required|--prompt" -- generate -m "$model"
expect nonzero "weights" -- generate -m "$model" -p hi --weights int3
expect nonzero "context" -- generate -m "$model" -p "$(printf 'word %.0s' $(seq 1 300))" -c 64
expect nonzero "sparse-min-tokens" -- generate -m "$model" -p hi --sparse-min-tokens -5
# A 382-token prompt: coverage 0.5 reads ~11% of the pages, but every step below --sparse-min-tokens
# is dense (every page read).
long="$(printf 'The quick brown fox jumps over the lazy dog %s. ' $(seq 1 30))"
expect zero "KV pages read: [0-9]\\.|KV pages read: [1-8][0-9]\\." -- generate -m "$model" -p "$long" -n 8 --sparse-policy coverage --gamma 0.5
expect zero "KV pages read: 100(\\.0)?%" -- generate -m "$model" -p "$long" -n 8 --sparse-policy coverage --gamma 0.5 --sparse-min-tokens 100000
expect zero "usage|generate" -- --help
expect zero "architecture +llama" -- info "$model"
expect zero "Paris" -- generate -m "$model" --chat -p "What is the capital of France?" -n 16
expect zero "decode: .* tokens/s" -- generate -m "$model" -p "The sky is" -n 8

if [ "$fails" -ne 0 ]; then echo "$fails CLI checks failed"; exit 1; fi
echo "all CLI checks passed"
