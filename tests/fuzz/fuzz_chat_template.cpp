// libFuzzer harness for the chat-template interpreter: any input is parsed as a Jinja
// template and rendered against a small fixed chat (system, user, assistant with tool
// calls, tool result, tools); it must render or throw dhs::Error, never crash, read
// out of bounds, hit undefined behaviour, run past the per-input timeout or exhaust
// memory. Not built by default; scripts/fuzz_chat_template.sh builds and runs it.
//
// Build (clang with libFuzzer: Debian's libclang-rt-14-dev; from the repository root):
//   clang++ -std=c++20 -O1 -g -march=x86-64-v3 -fsanitize=fuzzer,address,undefined \
//     -fno-sanitize-recover=undefined -Isrc tests/fuzz/fuzz_chat_template.cpp \
//     src/template/jinja_*.cpp src/core/utf8.cpp -lfmt -o /tmp/fuzz_chat_template
//   /tmp/fuzz_chat_template /tmp/jinja_corpus tests/fuzz/chat_template_corpus tests/data/chat_templates \
//     -dict=tests/fuzz/jinja.dict -max_len=4096 -timeout=2 -rss_limit_mb=2048 -max_total_time=300
// Replay findings without libFuzzer (g++ works too): add -DDHS_FUZZ_STANDALONE, drop
// -fsanitize=fuzzer, and pass the files as arguments.
//
// Renders run with limits 1/50 of the production ones (jinja_limits.h): a template
// that exhausts a budget then takes at most ~0.2 s even under the sanitizers (at 1/10,
// a legal 100,000-iteration loop took 0.8 s and timed out on a loaded machine: the
// timeout is wall-clock), so a timeout or OOM left over is work the budgets do not
// count (superlinear or unbounded), which is what to find. Whether the budgets are
// calibrated to time at production scale is test_jinja_limits' job. (ChatTemplate
// adds only the context and the production limits to this.)
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "template/jinja_interpreter.h"
#include "template/jinja_parser.h"

namespace {

namespace jinja = dhs::jinja;

const jinja::Value& context() {
  static const jinja::Value ctx = jinja::from_json(nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are terse."},
      {"role": "user", "content": "Weather in Paris? é ß Σ 中文"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}}]},
      {"role": "tool", "content": "{\"temp\": 21.5}", "tool_call_id": "call_1"},
      {"role": "assistant", "content": "<think>ok</think>It is 21.5 C."},
      {"role": "user", "content": "  Thanks!\n"}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
    "enable_thinking": false, "documents": null, "n": 3, "x": 2.5
  })"));
  return ctx;
}

std::tm fixed_now() {
  std::tm tm{};
  tm.tm_year = 124;  // 2024-09-05 14:30:00
  tm.tm_mon = 8;
  tm.tm_mday = 5;
  tm.tm_hour = 14;
  tm.tm_min = 30;
  return tm;
}

jinja::RenderLimits fuzz_limits() {
  constexpr int kScale = 50;
  jinja::RenderLimits l;
  l.max_loop_iterations = jinja::kMaxLoopIterations / kScale;
  l.max_output_bytes = jinja::kMaxOutputBytes / kScale;
  l.max_list_items = jinja::kMaxListItems / kScale;
  l.max_steps = jinja::kMaxSteps / kScale;
  l.max_work_bytes = jinja::kMaxWorkBytes / kScale;
  return l;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // An exact-size copy, so ASan flags any read past the end of the input.
  const std::string src(reinterpret_cast<const char*>(data), size);
  try {
    const auto ast = jinja::parse_template(src);
    jinja::Interpreter in(fixed_now, fuzz_limits());
    (void)in.render(*ast, context());
  } catch (const dhs::Error&) {
    // Rejected cleanly: the expected outcome for most inputs.
  } catch (const jinja::JinjaError&) {
    // Raised outside any statement; ChatTemplate turns these into dhs::Error.
  }
  return 0;
}

#include "standalone_main.h"
