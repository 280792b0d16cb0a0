#!/usr/bin/env bash
# CLI behaviour on good and bad input: clear message, non-zero exit, no crash; and the
# edges users of llama.cpp's and vLLM's CLIs expect (escapes, prompt files, stdin, --version,
# the context limit, full disks and closed pipes).
#   test_cli.sh DHISPARSE_BINARY MODEL_PATH
set -u
bin="$1"; model="$2"
if [ ! -f "$model" ]; then echo "SKIP: default model missing (run scripts/fetch_model.sh)"; exit 77; fi
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL ($1): ${*:2}"; fails=$((fails+1)); }

# expect EXIT_CODE_CLASS(zero|nonzero) REGEX -- ARGS...: on stdout and stderr together.
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

# streams EXIT_CODE_CLASS STDOUT_CHECK STDERR_CHECK -- ARGS...: stdout and stderr apart, stdin
# from $stdin_file (default /dev/null). A check is a regex, "!REGEX" (must not match),
# "EMPTY" or "-" (none).
stdin_file=/dev/null
check_stream() {  # NAME TEXT CHECK ARGS...
  local name="$1" text="$2" c="$3"; shift 3
  case "$c" in
    -) return 0 ;;
    EMPTY) [ -z "$text" ] && return 0; fail "$name not empty" "$@"; echo "$text" | head -3; return 1 ;;
    !*) if grep -qE -- "${c:1}" <<<"$text"; then fail "$name matches /${c:1}/" "$@"; echo "$text" | tail -3; return 1; fi ;;
    *) if ! grep -qE -- "$c" <<<"$text"; then fail "$name lacks /$c/" "$@"; echo "$text" | tail -3; return 1; fi ;;
  esac
}
streams() {
  local want="$1" oc="$2" ec="$3"; shift 4
  "$bin" "$@" <"$stdin_file" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  local out err; out="$(cat "$tmp/out")"; err="$(cat "$tmp/err")"
  if [ "$rc" -ge 128 ]; then fail "crash, rc $rc" "$@"; return; fi
  if { [ "$want" = zero ] && [ "$rc" -ne 0 ]; } || { [ "$want" = nonzero ] && [ "$rc" -eq 0 ]; }; then
    fail "rc $rc, wanted $want" "$@"; echo "$err" | tail -3; return; fi
  check_stream stdout "$out" "$oc" "$@" || return
  check_stream stderr "$err" "$ec" "$@" || return
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
# The KV hierarchy's device budget: a page count or auto; auto and counts need the host tier.
for bad in -3 abc 12x 1099511627777; do
  expect nonzero "kv-device-budget.*(page count|auto)" -- generate -m "$model" -p hi -n 1 --cpu-kv-gb 0.1 --kv-device-budget "$bad"
done
expect nonzero "needs the host tier" -- generate -m "$model" -p hi -n 1 --kv-device-budget auto
expect zero "." -- generate -m "$model" -p hi -n 2 -c 256 --cpu-kv-gb 0.05 --kv-device-budget auto
expect nonzero "temperature" -- generate -m "$model" -p hi --temperature -1
expect nonzero "top-p" -- generate -m "$model" -p hi --top-p 2
expect nonzero "bogus" -- generate -m "$model" -p hi --bogus
expect nonzero "prompt.*required|--prompt" -- generate -m "$model"
expect nonzero "weights" -- generate -m "$model" -p hi --weights int3
expect nonzero "sparse-min-tokens" -- generate -m "$model" -p hi --sparse-min-tokens -5
# A 382-token prompt: coverage 0.5 reads ~11% of the pages, but every step below --sparse-min-tokens
# is dense (every page read).
long="$(printf 'The quick brown fox jumps over the lazy dog %s. ' $(seq 1 30))"
expect zero "KV pages read: [0-9]\\.|KV pages read: [1-8][0-9]\\." -- generate -m "$model" -p "$long" -n 8 --sparse-policy coverage --gamma 0.5
expect zero "KV pages read: 100(\\.0)?%" -- generate -m "$model" -p "$long" -n 8 --sparse-policy coverage --gamma 0.5 --sparse-min-tokens 100000
# The policy grammar (dhisparse/policy.h) in --sparse-policy: topfrac keeps ceil(0.25 x pages) of each
# list's 24-25 pages (25-28%); a rule with its value, reselect count and estimator in one word; bad values named.
expect zero "KV pages read: 2[5-8]\\." -- generate -m "$model" -p "$long" -n 8 --sparse-policy topfrac:0.25
expect zero "KV pages read: [0-9]+\\.[0-9]%" -- generate -m "$model" -p "$long" -n 4 --sparse-policy coverage:0.5/2@minmax
expect nonzero "'2' is not a mass" -- generate -m "$model" -p hi --sparse-policy coverage:2
expect nonzero "unknown policy 'quest:4'" -- generate -m "$model" -p hi --sparse-policy quest:4
expect zero "usage|generate" -- --help
expect zero "architecture +llama" -- info "$model"
expect zero "Paris" -- generate -m "$model" --chat -p "What is the capital of France?" -n 16
expect zero "decode: .* tokens/s" -- generate -m "$model" -p "The sky is" -n 8

# 1. The context limit ends generation as max_tokens does: a 27-token prompt in -c 40 leaves 13.
fox="The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat and the bird sings in the old oak tree"
streams zero "oak tree" "decode: 13 tokens.*finish: length" -- generate -m "$model" -p "$fox" -c 40 -n 100 --ignore-eos
# ... while a prompt that does not fit stays an error, with no echo of the prompt on stdout.
streams nonzero EMPTY "prompt has [0-9]+ tokens; the context holds 64" -- generate -m "$model" -p "$(printf 'word %.0s' $(seq 1 300))" -c 64

# 2. C-style escapes in -p, --stop (and --system); --no-escape keeps them as typed.
streams zero "^Line one$" - -- generate -m "$model" -p 'Line one\nLine two' -n 1
streams zero '^Line one\\nLine two' - -- generate -m "$model" -p 'Line one\nLine two' -n 1 --no-escape
streams zero "$(printf '^a\tb')" - -- generate -m "$model" -p 'a\tb\x21' -n 1
# Greedy, this prompt goes on with ".\n\nThe cat ...": the README's --stop "\n\n" must stop there.
streams zero "!^$" "finish: stop" -- generate -m "$model" -p "$fox" -n 30 --stop '\n\n'

# 3. -c past the model's context: a clear error naming both numbers, before any allocation.
streams nonzero EMPTY "1000000.*8192" -- generate -m "$model" -p hi -c 1000000
expect nonzero "!bad_alloc|1000000" -- generate -m "$model" -p hi -c 1000000
# Out of memory for the KV cache says so, never a raw std::bad_alloc. The address space is what a
# 64-token run needs (found by bisection: a CUDA build maps its libraries, a CPU one does not) plus
# 100 MB, so the weights fit and 8192 tokens of fp32 KV (377 MB) do not. Skipped under ASan, which
# needs terabytes of address space.
runs_in() { (ulimit -v "$1"; "$bin" generate -m "$model" -p hi -n 1 -c 64 -t 1 -q > /dev/null 2>&1); }
if ! grep -q __asan_init "$bin" 2>/dev/null && runs_in 16000000; then
  lo=100000; hi=16000000
  while [ $((hi - lo)) -gt 20000 ]; do mid=$(((lo + hi) / 2)); if runs_in $mid; then hi=$mid; else lo=$mid; fi; done
  out="$( (ulimit -v $((hi + 100000)); "$bin" generate -m "$model" -p hi -n 2 -c 8192 -t 1) 2>&1)"; rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && grep -qE "out of memory.*8192 tokens; lower --ctx-size" <<<"$out" &&
     ! grep -q "std::bad_alloc" <<<"$out"; then echo "ok: out of memory for the KV cache"
  else fail "rc $rc" "out of memory for the KV cache"; echo "$out" | tail -2; fi
fi

# 4. eval, piped: the plan, an estimate after the first sample, a line per task x length with an ETA.
streams zero "niah_single +128 +dense" "1 task x 1 length \\(128\\) x 2 samples = 2 samples.*coverage-0.9" -- eval -m "$model" --tasks niah_single --lengths 128 --samples 2 --policies coverage:0.9
check_stream stderr "$(cat "$tmp/err")" "first sample took .*; estimated total" eval && echo "ok: eval estimate"
check_stream stderr "$(cat "$tmp/err")" "niah_single at 128 tokens done \\(2/2 samples\\), .* elapsed, ETA" eval && echo "ok: eval progress line"
# The CPU defaults are minutes, not hours: the plan line says what will run (stopped after it).
timeout 5 "$bin" eval -m "$model" --tasks niah_single > /dev/null 2> "$tmp/err"
check_stream stderr "$(cat "$tmp/err")" "x 1 length \\(1024\\) x 5 samples" eval defaults && echo "ok: eval CPU defaults"

# 5. Ranges checked with the flags, before the model loads: nothing on stdout, no loading bar.
streams nonzero EMPTY "top-p: 0 is out of range.*\\(0, 1\\]" -- generate -m "$model" -p hi --top-p 0
streams nonzero EMPTY "!loading" -- generate -m "$model" -p hi --top-p 0
streams nonzero EMPTY "gamma: 0 is out of range.*\\(0, 1\\]" -- generate -m "$model" -p hi --sparse-policy coverage --gamma 0
streams nonzero EMPTY "repeat-penalty: 0 is out of range" -- generate -m "$model" -p hi --repeat-penalty 0
streams nonzero EMPTY "topk needs --budget" -- generate -m "$model" -p hi --sparse-policy topk
streams nonzero EMPTY "reselect-every: 65 is out of range.*\\[1, 64\\]" -- generate -m "$model" -p hi --reselect-every 65

# 6. -q prints only the generated text.
streams zero "!The sky is" EMPTY -- generate -m "$model" -p "The sky is" -n 4 -q

# 7. Sharing one pipe, the stats line starts a line of its own.
out="$("$bin" generate -m "$model" -p "The sky is" -n 8 2>&1 | cat)"
if grep -qE "^prompt: [0-9]+ tokens" <<<"$out"; then echo "ok: stats line on its own line"; else fail "stats glued" "2>&1 | cat"; echo "$out" | tail -2; fi

# 8. The prompt from a file (-p @FILE, -f FILE) or stdin (-p -); @@ escapes a leading @.
printf 'Roses are red,\nviolets are\n' > "$tmp/prompt.txt"
streams zero "^Roses are red,$" - -- generate -m "$model" -p "@$tmp/prompt.txt" -n 2
streams zero "^Roses are red,$" - -- generate -m "$model" -f "$tmp/prompt.txt" -n 2
streams zero "^@home" - -- generate -m "$model" -p "@@home" -n 1
stdin_file="$tmp/prompt.txt"
streams zero "^Roses are red,$" - -- generate -m "$model" -p - -n 2
stdin_file=/dev/null
streams nonzero EMPTY "prompt file .*nope.txt' does not exist" -- generate -m "$model" -p "@$tmp/nope.txt"
expect nonzero "excludes" -- generate -m "$model" -p hi -f "$tmp/prompt.txt"

# 9. Flags of a mode not chosen: --gamma and --budget are errors; --system turns --chat on.
streams nonzero EMPTY "gamma: applies to --sparse-policy coverage or solohead" -- generate -m "$model" -p hi --gamma 0.5
streams nonzero EMPTY "budget: applies to --sparse-policy topk, sinkwindow or solohead" -- generate -m "$model" -p hi --budget 4
streams zero "!^hi" "prompt: [1-9][0-9]+ tokens" -- generate -m "$model" -p hi --system "Answer briefly." -n 1

# 10. Unknown commands and --version.
expect nonzero "unknown command 'foo'; commands: generate, info, eval, bench" -- foo
streams zero "^dhisparse 0\\.1\\.0" EMPTY -- --version

# 11. Numeric errors name the option and the range in plain numbers.
expect nonzero "max-tokens: 'abc' is not an integer" -- generate -m "$model" -p hi -n abc
streams nonzero EMPTY "top-k: -1 is out of range \\(expected an integer in \\[0, 16777216\\]\\)" -- generate -m "$model" -p hi --top-k -1
streams nonzero EMPTY "sparse-min-tokens: -5 is out of range \\(expected an integer >= 0\\)" -- generate -m "$model" -p hi --sparse-min-tokens -5
streams nonzero EMPTY "!179769313486|e\\+[0-9]" -- generate -m "$model" -p hi --repeat-last-n -5

# 12. --seed -1 draws a random seed and prints it; other negatives are errors.
streams zero - "seed: [0-9]+$" -- generate -m "$model" -p hi -n 2 --temperature 0.8 --seed -1
check_stream stderr "$(cat "$tmp/err")" "!seed: 18446744073709551615" && echo "ok: seed -1 is not UINT64_MAX"
streams nonzero EMPTY "seed: '-2' is not a seed.*-1 for a random seed" -- generate -m "$model" -p hi --seed -2

# 13. An explicitly empty -m is an error, not the default model.
streams nonzero EMPTY "empty path" -- generate -m "" -p hi
streams nonzero EMPTY "empty path" -- info ""

# 14. A FIFO or a device as the model: refused at once, never opened (which would block).
mkfifo "$tmp/fifo"
out="$(timeout 20 "$bin" generate -m "$tmp/fifo" -p hi 2>&1)"; rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "neither a regular file nor a directory" <<<"$out"; then echo "ok: FIFO model"
else fail "rc $rc" "FIFO model"; echo "$out" | tail -2; fi
out="$(timeout 20 "$bin" info "$tmp/fifo" 2>&1)"; rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "neither a regular file nor a directory" <<<"$out"; then echo "ok: FIFO info"
else fail "rc $rc" "FIFO info"; echo "$out" | tail -2; fi
streams nonzero EMPTY "neither a regular file nor a directory" -- generate -m /dev/zero -p hi

# 15. A full disk is an error; a reader that goes away (| head) ends generation quietly (status
# 141, as a death by SIGPIPE), also where SIGPIPE is ignored.
out="$("$bin" generate -m "$model" -p "The sky is" -n 4 2>&1 >/dev/full)"; rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && grep -q "error: writing output: No space left on device" <<<"$out"; then echo "ok: /dev/full"
else fail "rc $rc" "> /dev/full"; echo "$out" | tail -2; fi
out="$("$bin" info "$model" 2>&1 >/dev/full)"; rc=$?
if [ "$rc" -ne 0 ] && grep -q "No space left on device" <<<"$out"; then echo "ok: info > /dev/full"; else fail "rc $rc" "info > /dev/full"; fi
for sigpipe in default ignored; do
  rc="$( (if [ "$sigpipe" = ignored ]; then trap '' PIPE; fi
          "$bin" generate -m "$model" -p "Once upon a time" -n 64 --ignore-eos 2>"$tmp/err" | head -c 1 >/dev/null
          echo "${PIPESTATUS[0]}") )"
  if [ "$rc" = 141 ] && ! grep -qE "error|decode: 64 tokens" "$tmp/err"; then echo "ok: | head, SIGPIPE $sigpipe"
  else fail "rc $rc" "| head, SIGPIPE $sigpipe"; tail -2 "$tmp/err"; fi
done

# 16. Partial rotary embedding: this model with rope.dimension_count 32 of head_dim 64.
perl -0777 -pe 's/(llama\.rope\.dimension_count\x04\x00\x00\x00)\x40\x00\x00\x00/$1\x20\x00\x00\x00/' "$model" > "$tmp/rope32.gguf"
expect nonzero "partial rotary embedding \\(rope.dimension_count 32 < head_dim 64\\) is not supported" -- generate -m "$tmp/rope32.gguf" -p hi
expect nonzero "partial rotary embedding" -- info "$tmp/rope32.gguf"
rm -f "$tmp/rope32.gguf"

# 17. info fails where loading fails, with the same message: a tensor renamed away.
perl -0777 -pe 's/blk\.0\.ffn_up\.weight/blk.0.ffn_uq.weight/' "$model" > "$tmp/noffn.gguf"
expect nonzero "missing tensor 'blk.0.ffn_up.weight'" -- info "$tmp/noffn.gguf"
expect nonzero "missing tensor 'blk.0.ffn_up.weight'" -- generate -m "$tmp/noffn.gguf" -p hi
rm -f "$tmp/noffn.gguf"

# 18. Threads: absurd counts rejected with the flags; more than the hardware's capped, with a note.
streams nonzero EMPTY "threads: 100000 is out of range.*\\[0, 4096\\]" -- generate -m "$model" -p hi -t 100000
streams zero - "note: -t 4096 is more than the [0-9]+ hardware threads; using [0-9]+" -- generate -m "$model" -p hi -n 1 -t 4096

if [ "$fails" -ne 0 ]; then echo "$fails CLI checks failed"; exit 1; fi
echo "all CLI checks passed"
