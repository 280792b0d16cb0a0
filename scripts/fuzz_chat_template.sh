#!/usr/bin/env bash
# Builds the chat-template fuzzer (tests/fuzz/fuzz_chat_template.cpp, clang + libFuzzer
# + ASan + UBSan) into build-fuzz/ and runs it for N seconds (default 60) on one core.
# Exits non-zero on any finding (crash, sanitizer report, leak, timeout, OOM); the
# input that caused it is saved under build-fuzz/chat_template_artifacts/.
#   scripts/fuzz_chat_template.sh [seconds] [extra libFuzzer flags, e.g. -jobs=2]
# Installs clang and its runtime (Debian: clang-14, libclang-rt-14-dev) when missing.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
secs="${1:-60}"
shift || true
out="${DHS_FUZZ_DIR:-$root/build-fuzz}"
cxx="${DHS_FUZZ_CXX:-clang++}"

have_fuzzer_rt() {
  command -v "$cxx" > /dev/null 2>&1 || return 1
  local probe
  probe="$(mktemp -d)"
  echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' > "$probe/p.cpp"
  "$cxx" -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" > /dev/null 2>&1
  local ok=$?
  rm -rf "$probe"
  return $ok
}
if ! have_fuzzer_rt; then
  echo "installing: clang-14 libclang-rt-14-dev"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -q
  $sudo_cmd apt-get install -y -q --no-install-recommends clang-14 libclang-rt-14-dev
  command -v "$cxx" > /dev/null 2>&1 || cxx=clang++-14
  have_fuzzer_rt || { echo "clang cannot link -fsanitize=fuzzer" >&2; exit 1; }
fi

mkdir -p "$out"
bin="$out/fuzz_chat_template"
srcs=("$root"/tests/fuzz/fuzz_chat_template.cpp "$root"/src/template/jinja_*.cpp "$root"/src/core/utf8.cpp)
hdrs=("$root"/src/template/jinja_*.h "$root"/src/core/utf8.h "$root"/src/core/error.h)
stale=1
if [ -x "$bin" ]; then
  stale=0
  for f in "${srcs[@]}" "${hdrs[@]}"; do [ "$f" -nt "$bin" ] && stale=1; done
fi
if [ "$stale" = 1 ]; then
  echo "building $bin"
  "$cxx" -std=c++20 -O1 -g -march=x86-64-v3 -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=undefined -I"$root/src" -I"$root/include" "${srcs[@]}" -lfmt -o "$bin"
fi

# The first corpus directory collects what the fuzzer finds; the seeds stay read-only:
# hostile and snippet seeds, and the bundled model templates.
corpus="$out/chat_template_corpus"
artifacts="$out/chat_template_artifacts"
mkdir -p "$corpus" "$artifacts"
before=$(ls "$artifacts" | wc -l)
status=0
"$bin" "$corpus" "$root/tests/fuzz/chat_template_corpus" "$root/tests/data/chat_templates" \
  -dict="$root/tests/fuzz/jinja.dict" -max_len=4096 -timeout=2 -rss_limit_mb=2048 \
  -max_total_time="$secs" -print_final_stats=1 -artifact_prefix="$artifacts/" "$@" || status=$?
after=$(ls "$artifacts" | wc -l)
if [ "$status" -ne 0 ] || [ "$after" -ne "$before" ]; then
  echo "fuzz_chat_template: FINDING (exit $status); inputs in $artifacts:" >&2
  ls -t "$artifacts" | head -5 >&2
  echo "replay: $bin <file>" >&2
  exit 1
fi
echo "fuzz_chat_template: no findings in ${secs}s"
