// Hostile chat templates: a model file carries its template and a server renders user
// text through it, so every template must end in a dhs::Error (or a correct render)
// quickly, without crashing, hanging or eating memory. A regression corpus of what a
// hostile-template review found, generated at full size: operator/filter/attribute
// chains and nesting of every construct (stack overflow), quadratic lexing and
// parsing, and values and loops that grow without bound (memory, time). Plus
// deep-but-legal templates and long conversations, so the limits are not too tight.
#include <gtest/gtest.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "template/chat_template.h"
#include "template/jinja_limits.h"
#include "template/jinja_text.h"
#include "test_paths.h"

namespace {

using dhs::ChatMessage;
using dhs::ChatTemplate;
using json = nlohmann::ordered_json;
namespace jinja = dhs::jinja;

// Every hostile case must be rejected within this much CPU time of the test's thread
// (CPU, not wall time, so a loaded CI machine does not make it flaky). Sanitized and
// unoptimized builds run several times slower, hence the generous bound there.
#if defined(__SANITIZE_ADDRESS__) || !defined(NDEBUG)
constexpr double kBoundSeconds = 10.0;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
constexpr double kBoundSeconds = 10.0;
#else
constexpr double kBoundSeconds = 1.0;
#endif
#else
constexpr double kBoundSeconds = 1.0;
#endif

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string repeat(const std::string& s, size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

const std::vector<ChatMessage>& small_chat() {
  static const std::vector<ChatMessage> msgs = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}};
  return msgs;
}

// Parses and renders `src`; returns the error message ("" when it rendered) and the
// CPU time taken, in `cpu`.
std::string error_of(const std::string& src, double& cpu, std::string* rendered = nullptr) {
  const double t0 = thread_cpu_seconds();
  std::string msg;
  try {
    ChatTemplate t(src);
    std::string out = t.render(small_chat(), true, "<s>", "</s>");
    if (rendered) *rendered = std::move(out);
  } catch (const dhs::Error& e) {
    msg = e.what();
    if (msg.empty()) msg = "(empty dhs::Error)";
  }
  cpu = thread_cpu_seconds() - t0;
  return msg;
}

// The template must fail with dhs::Error mentioning one of `fragments`, within the bound.
void expect_rejected(const std::string& name, const std::string& src, std::vector<std::string> fragments) {
  SCOPED_TRACE(name);
  const auto wall0 = std::chrono::steady_clock::now();
  double cpu = 0;
  const std::string msg = error_of(src, cpu);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  ASSERT_FALSE(msg.empty()) << name << ": rendered without error";
  bool found = false;
  for (const auto& f : fragments) found = found || contains(msg, f);
  EXPECT_TRUE(found) << name << ": unexpected message: " << msg;
  EXPECT_LE(cpu, kBoundSeconds) << name << ": took " << cpu << " s of CPU (" << wall << " s wall): " << msg;
  std::printf("  %-28s %6.3f s cpu  %s\n", name.c_str(), cpu, msg.substr(0, 110).c_str());
}

// The template must render `expected` (or satisfy `check`), within the bound.
void expect_renders(const std::string& name, const std::string& src, const std::string& expected) {
  SCOPED_TRACE(name);
  double cpu = 0;
  std::string out;
  const std::string msg = error_of(src, cpu, &out);
  EXPECT_EQ(msg, "") << name;
  if (expected.size() <= 200) EXPECT_EQ(out, expected) << name;
  else EXPECT_TRUE(out == expected) << name << ": " << out.size() << " bytes, not the expected " << expected.size();
  EXPECT_LE(cpu, kBoundSeconds) << name << ": took " << cpu << " s of CPU";
}

constexpr size_t kTerms = 20000;  // chain length / nesting of the hostile cases

// --- parse time: chains and nesting ---------------------------------------------------

TEST(JinjaLimits, OperatorChainsAreRejected) {
  const std::string deep = "nested too deeply";
  expect_rejected("+ chain", "{{ " + repeat("1+", kTerms) + "1 }}", {deep});
  expect_rejected("- chain", "{{ " + repeat("1-", kTerms) + "1 }}", {deep});
  expect_rejected("* chain", "{{ " + repeat("1*", kTerms) + "1 }}", {deep});
  expect_rejected("** chain", "{{ " + repeat("1**", kTerms) + "1 }}", {deep});
  expect_rejected("~ chain", "{{ " + repeat("'a'~", kTerms) + "'a' }}", {deep});
  expect_rejected("and chain", "{{ " + repeat("1 and ", kTerms) + "1 }}", {deep});
  expect_rejected("or chain", "{{ " + repeat("0 or ", kTerms) + "1 }}", {deep});
  expect_rejected("filter chain", "{{ 'a'" + repeat("|trim", kTerms) + " }}", {deep});
  expect_rejected("filter chain with args", "{{ 'a'" + repeat("|replace('a', 'b')", kTerms) + " }}", {deep});
  expect_rejected("attribute chain", "{{ messages" + repeat(".x", kTerms) + " }}", {deep});
  expect_rejected("subscript chain", "{{ messages" + repeat("[0]", kTerms) + " }}", {deep});
  expect_rejected("slice chain", "{{ messages" + repeat("[::1]", kTerms) + " }}", {deep});
  expect_rejected("call chain", "{{ range" + repeat("(1)", kTerms) + " }}", {deep});
  expect_rejected("test chain", "{{ x" + repeat(" is defined|string", kTerms) + " }}", {deep});
  expect_rejected("not chain", "{{ " + repeat("not ", kTerms) + "1 }}", {deep});
  expect_rejected("unary minus chain", "{{ " + repeat("-", kTerms) + "1 }}", {deep});
  expect_rejected("unary plus chain", "{{ " + repeat("+", kTerms) + "1 }}", {deep});
  expect_rejected("ternary else chain", "{{ " + repeat("1 if 0 else ", kTerms) + "2 }}", {deep});
  expect_rejected("ternary if chain", "{{ 1" + repeat(" if 1", kTerms) + " }}", {deep});
  expect_rejected("chain in set", "{% set x = " + repeat("1+", kTerms) + "1 %}{{ x }}", {deep});
  expect_rejected("chain in for", "{% for x in " + repeat("[1]+", kTerms) + "[1] %}{% endfor %}", {deep});
  expect_rejected("chain in if", "{% if " + repeat("1+", kTerms) + "1 %}{% endif %}", {deep});
  expect_rejected("chain in macro default", "{% macro m(a=" + repeat("1+", kTerms) + "1) %}{% endmacro %}", {deep});
  expect_rejected("chain in call args", "{{ range(" + repeat("1+", kTerms) + "1) }}", {deep});
  expect_rejected("chain in filter args", "{{ 'a'|center(" + repeat("1+", kTerms) + "1) }}", {deep});
  expect_rejected("chain in filter block", "{% filter replace('a', " + repeat("'b'~", kTerms) + "'b') %}a{% endfilter %}",
                  {deep});
}

TEST(JinjaLimits, BracketNestingIsRejected) {
  const std::string deep = "nested too deeply";
  expect_rejected("parentheses", "{{ " + repeat("(", kTerms) + "1" + repeat(")", kTerms) + " }}", {deep});
  expect_rejected("negated parentheses", "{{ " + repeat("-(", kTerms) + "1" + repeat(")", kTerms) + " }}", {deep});
  expect_rejected("list literal", "{{ " + repeat("[", kTerms) + repeat("]", kTerms) + " }}", {deep});
  expect_rejected("dict literal", "{{ " + repeat("{'a': ", kTerms) + "1" + repeat("}", kTerms) + " }}", {deep});
  expect_rejected("call arguments", "{{ " + repeat("range(", kTerms) + "1" + repeat(")", kTerms) + " }}", {deep});
  expect_rejected("subscripts", "{{ " + repeat("messages[", kTerms) + "0" + repeat("]", kTerms) + " }}", {deep});
  expect_rejected("ternary in parentheses", "{{ " + repeat("1 if 0 else (", kTerms) + "2" + repeat(")", kTerms) + " }}",
                  {deep});
  expect_rejected("test arguments", "{{ 1" + repeat(" is eq [1", kTerms) + repeat("]", kTerms) + " }}", {deep});
  // Unclosed: the lexer stops at the depth limit without reading the rest.
  expect_rejected("unclosed brackets", "{{ " + repeat("(", 400000) + " }}", {deep});
}

TEST(JinjaLimits, StatementNestingIsRejected) {
  const std::string deep = "statements nested too deeply";
  expect_rejected("for", repeat("{% for i in [1] %}", kTerms) + repeat("{% endfor %}", kTerms), {deep});
  expect_rejected("if", repeat("{% if 0 %}", kTerms) + repeat("{% endif %}", kTerms), {deep});
  // 60,000 nested ifs written tightly (just under the size limit).
  expect_rejected("60000 ifs", repeat("{%if 0%}", 60000) + repeat("{%endif%}", 60000), {deep});
  expect_rejected("filter blocks", repeat("{% filter upper %}", kTerms) + "x" + repeat("{% endfilter %}", kTerms), {deep});
  expect_rejected("set blocks", repeat("{% set x %}", kTerms) + repeat("{% endset %}", kTerms), {deep});
  expect_rejected("macros", repeat("{% macro m() %}", kTerms) + repeat("{% endmacro %}", kTerms), {deep});
  expect_rejected("call blocks", repeat("{% call range(1) %}", kTerms) + repeat("{% endcall %}", kTerms), {deep});
  expect_rejected("with blocks", repeat("{% with a = 1 %}", kTerms) + repeat("{% endwith %}", kTerms), {deep});
  expect_rejected("unclosed ifs", repeat("{% if 1 %}", 100000), {deep});
}

TEST(JinjaLimits, LexingIsLinear) {
  // 200 kB on one line: every token's column used to be recounted from the line start.
  std::string line = repeat("{{ x }}", 28000) + "{% endfor %}";
  ASSERT_GT(line.size(), 195000u);
  expect_rejected("200 kB one-line template", line, {"line 1, column 196004: Encountered unknown tag 'endfor'"});
  expect_rejected("one-line error at the end", repeat("{{ 'a' }}", 22000) + "{{ 1 + }}", {"line 1, column 198008"});
  expect_rejected("long text then error", std::string(900000, 'x') + "{{ }}", {"line 1, column 900004"});
  expect_rejected("many lines then error", repeat("{{ x }}\n", 100000) + "{{ ( }}", {"line 100001, column 6"});
  expect_rejected("oversized template", std::string(kTerms, ' ') + std::string(jinja::kMaxTemplateBytes, 'x'),
                  {"more than the limit of 1048576 bytes"});
  // A long but legal template renders quickly too.
  expect_renders("200 kB of prints", repeat("{{ 'a' }}", 22000), std::string(22000, 'a'));
  expect_renders("long raw block", "{% raw %}" + repeat("{{ {% x %} }}", 40000) + "{% endraw %}",
                 repeat("{{ {% x %} }}", 40000));
}

// --- render time: recursion -------------------------------------------------------------

TEST(JinjaLimits, RecursionIsBounded) {
  expect_rejected("macro recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
                  {"macro 'f' nested more than 64 calls deep"});
  expect_rejected("mutual recursion",
                  "{% macro a(n) %}{{ b(n) }}{% endmacro %}{% macro b(n) %}{{ a(n) }}{% endmacro %}{{ a(0) }}",
                  {"nested more than 64 calls deep"});
  expect_rejected("caller recursion",
                  "{% macro f() %}{% call f() %}{{ caller() }}{% endcall %}{% endmacro %}{{ f() }}",
                  {"nested more than 64 calls deep"});
  // Recursion within the call limit, but each level nested deep: the nesting limit stops it.
  expect_rejected("deep macro bodies",
                  "{% macro f(n) %}" + repeat("{% if 1 %}", 200) + "{{ f(n + 1) }}" + repeat("{% endif %}", 200) +
                      "{% endmacro %}{{ f(0) }}",
                  {"nested more than 1024 levels deep"});
  expect_rejected("deep macro expressions",
                  "{% macro f(n) %}{{ f(n + 1)" + repeat("|trim", 300) + " }}{% endmacro %}{{ f(0) }}",
                  {"nested more than 1024 levels deep"});
  expect_rejected("recursion through filter blocks",
                  "{% macro f() %}{% filter upper %}{{ f() }}{% endfilter %}{% endmacro %}{{ f() }}",
                  {"nested more than 64 calls deep"});
}

// --- render time: size of values, output and work -----------------------------------------

TEST(JinjaLimits, HugeValuesAreRefusedBeforeAllocation) {
  const std::string big = "exceeds the limit of";
  expect_rejected("center", "{{ 'a'|center(2000000000) }}", {big});
  expect_rejected("str.center", "{{ 'a'.center(2000000000, 'é') }}", {big});
  // An empty fill passes any size check and used to pad forever.
  expect_rejected("empty fill", "{{ 'a'.ljust(9223372036854775807, '') }}", {"exactly one character"});
  expect_rejected("ljust", "{{ 'a'.ljust(2000000000) }}", {big});
  expect_rejected("rjust", "{{ 'a'.rjust(9223372036854775807, 'x') }}", {big});
  expect_rejected("zfill", "{{ '1'.zfill(2000000000) }}", {big});
  expect_rejected("indent width", "{{ 'a'|indent(2000000000) }}", {big});
  expect_rejected("indent lines", "{{ ('a\\n' * 100000)|indent(1000, true) }}", {big});
  expect_rejected("format *width", "{{ '%*s'|format(2000000000, 'x') }}", {big});
  expect_rejected("format width", "{{ '%2000000000d'|format(1) }}", {big});
  expect_rejected("format precision", "{{ '%.2000000000f'|format(1.5) }}", {big});
  expect_rejected("percent operator", "{{ '%-*d' % (2000000000, 1) }}", {big});
  expect_rejected("string * int", "{{ 'ab' * 2000000000 }}", {big});
  expect_rejected("int * string", "{{ 9223372036854775807 * 'ab' }}", {big});
  expect_rejected("list * int", "{{ [1, 2] * 2000000000 }}", {big});
  expect_rejected("range", "{{ range(2000000000)|length }}", {"Range too big"});
  expect_rejected("join separator", "{{ range(100000)|join('x' * 1000000) }}", {big});
  expect_rejected("str.join", "{{ ('x' * 1000000).join(range(100000)|map('string')) }}", {big});
  expect_rejected("replace", "{{ ('a' * 10000)|replace('a', 'b' * 100000) }}", {big});
  expect_rejected("replace empty", "{{ ('a' * 10000).replace('', 'b' * 100000) }}", {big});
  expect_rejected("tojson indent", "{{ [[[[1]]]]|tojson(indent=1000000000) }}", {big});
  expect_rejected("tojson separators", "{{ range(100000)|list|tojson(separators=('x' * 1000, ':')) }}", {big});
  expect_rejected("concatenation", "{% set s = 'x' * 20000000 %}{{ s ~ s }}", {big});
  expect_rejected("list repr", "{% set s = 'x' * 10000000 %}{{ [s, s, s, s] }}", {big});
  expect_rejected("escape", "{{ ('<' * 10000000)|escape }}", {big});
  expect_rejected("batch fill", "{{ [1]|batch(2000000000, 0)|list }}", {big});
  expect_rejected("iterate string", "{% for c in 'x' * 30000000 %}{% endfor %}", {big});
  expect_rejected("split", "{{ ('a ' * 10000000).split()|length }}", {big});
  expect_rejected("output", "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", {"output exceeds"});
}

TEST(JinjaLimits, RunawayWorkIsBounded) {
  const std::string budget = "template exceeded its budget";
  expect_rejected("nested range loops",
                  "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                  {"loop iterations", budget});
  expect_rejected("nested loops with output",
                  "{% for i in range(100000) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}",
                  {"loop iterations", budget, "output exceeds"});
  expect_rejected("~ in a loop",
                  "{% set ns = namespace(s='') %}{% for i in range(100000) %}{% set ns.s = ns.s ~ 'xxxxxxxxxxxxxxxxxxxx' %}"
                  "{% endfor %}{{ ns.s|length }}",
                  {budget});
  expect_rejected("list append in a loop",
                  "{% set ns = namespace(v=[]) %}{% for i in range(100000) %}{% set ns.v = ns.v + [i] %}{% endfor %}",
                  {budget});
  expect_rejected("copying a big string",
                  "{% set big = 'x' * 30000000 %}{% for i in range(100000) %}{% set y = big %}{% endfor %}", {budget});
  expect_rejected("bound method calls",
                  "{% set f = ('x' * 30000000).count %}{% for i in range(100000) %}{% set y = f('y') %}{% endfor %}",
                  {budget});
  expect_rejected("case mapping in a loop",
                  "{% set big = 'x' * 3000000 %}{% for i in range(100000) %}{% set y = big|upper %}{% endfor %}", {budget});
  expect_rejected("unique (quadratic)", "{{ range(100000)|unique|length }}", {budget});
  expect_rejected("sort in a loop", "{% for i in range(1000) %}{% set y = range(100000)|sort %}{% endfor %}",
                  {budget});
  std::string dict = "{{ {";
  for (int i = 0; i < 60000; ++i) dict += std::to_string(i) + ":" + std::to_string(i) + ",";
  dict += "}|length }}";
  expect_rejected("dict literal with 60000 keys (quadratic)", dict, {budget});
  expect_rejected("long loop of cheap expressions", "{% for i in range(100000) %}{% for j in range(9) %}{{ '' if i + j + 1 > 0 }}{% endfor %}{% endfor %}",
                  {budget, "loop iterations"});
}

TEST(JinjaLimits, PathologicalButFiniteWorkIsFast) {
  // Substring search is linear (std::string::find is O(n*m) on these).
  expect_renders("worst-case in", "{% set h = 'a' * 10000000 %}{% set n = 'a' * 100000 ~ 'b' %}{{ n in h }}", "False");
  expect_renders("worst-case count", "{{ ('a' * 10000000).count('a' * 100000 ~ 'b') }}", "0");
  expect_renders("worst-case rsplit", "{% set s = ('a' * 20 ~ 'b') * 100000 %}{{ s.rsplit('a' * 20 ~ 'b')|length }}",
                 "100001");
  expect_renders("worst-case rfind", "{{ ('a' * 10000000).rfind('b' ~ 'a' * 100000) }}", "-1");
  expect_rejected("strip with long chars in a loop",
                  "{% set c = range(5000)|map('string')|join ~ 'é' * 5000 %}{% for i in range(100000) %}"
                  "{{ 'x'.strip(c) }}{% endfor %}",
                  {"template exceeded its budget"});
  expect_rejected("strftime_now with a huge format",
                  "{% for i in range(1000) %}{{ strftime_now('%c' * 1000000) }}{% endfor %}", {"longer than 1024 bytes"});
  expect_rejected("unique over long equal-length strings",
                  "{{ range(3000)|map('string')|map('center', 30000)|unique|length }}", {"template exceeded its budget"});
  expect_renders("strip with many chars", "{{ ('a' * 1000000).strip('bcdefghijklmnopqrstuvwxyz' * 40000 ~ 'a')|length }}",
                 "0");
  // Values nested far deeper than any walk may go: building, dropping and
  // (the namespace) a cycle must not recurse or leak.
  expect_renders("deep list", "{% set ns = namespace(v=[]) %}{% for i in range(100000) %}{% set ns.v = [ns.v] %}{% endfor %}x",
                 "x");
  expect_renders("deep namespaces",
                 "{% set ns = namespace(v=none) %}{% for i in range(100000) %}{% set ns.v = namespace(v=ns.v) %}{% endfor %}x",
                 "x");
  expect_renders("namespace cycle", "{% set ns = namespace() %}{% set ns.me = ns %}{% set ns.l = [ns, ns] %}x", "x");
  expect_rejected("printing a deep list",
                  "{% set ns = namespace(v=[]) %}{% for i in range(1000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v }}",
                  {"value nested more than 512 levels deep"});
}

// --- deep but legal templates still render -------------------------------------------------

TEST(JinjaLimits, RealisticDeepTemplatesRender) {
  expect_renders("40 nested ifs", repeat("{% if 1 %}", 40) + "deep" + repeat("{% endif %}", 40), "deep");
  expect_renders("100 nested fors", repeat("{% for i in [1] %}", 100) + "x" + repeat("{% endfor %}", 100), "x");
  std::string tilde = "{{ 'a'";
  for (int i = 1; i < 300; ++i) tilde += " ~ 'a'";
  expect_renders("300-term ~ chain", tilde + " }}", std::string(300, 'a'));
  expect_renders("500-term + chain", "{{ " + repeat("1 + ", 499) + "1 }}", "500");
  expect_renders("80 nested parentheses", "{{ " + repeat("(", 80) + "7" + repeat(")", 80) + " }}", "7");
  expect_renders("50 nested lists", "{{ " + repeat("[", 50) + repeat("]", 50) + "|length }}", "1");
  expect_renders("100-filter chain", "{{ ' a '" + repeat("|trim", 100) + " }}", "a");
  expect_renders("macro recursion depth 20",
                 "{% macro f(n) %}{% if n < 20 %}{{ n }},{{ f(n + 1) }}{% endif %}{% endmacro %}{{ f(0) }}",
                 "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,");
  expect_renders("macro recursion depth 60",
                 "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% else %}bottom{% endif %}{% endmacro %}{{ f(60) }}",
                 "bottom");
  expect_renders("loop of 100000", "{% set ns = namespace(n=0) %}{% for i in range(100000) %}{% set ns.n = ns.n + i %}"
                                   "{% endfor %}{{ ns.n }}",
                 "4999950000");
  expect_renders("string of 1 MB", "{{ ('ab' * 500000)|length }}", "1000000");
}

// Every bundled model template renders a 10,000-message, 4 MB conversation, well
// inside the budgets (they take under 1M steps and 50 MiB of copies; see jinja_limits.h).
TEST(JinjaLimits, LongConversationsRender) {
  const std::string dir = dhs::test::data_dir() + "/chat_templates/";
  std::vector<ChatMessage> msgs;
  for (int i = 0; i < 10000; ++i) msgs.push_back({i % 2 ? "assistant" : "user", std::string(400, static_cast<char>('a' + i % 26))});
  for (const char* name : {"chatml.jinja", "gemma2.jinja", "gemma3.jinja", "llama2.jinja", "llama3.1.jinja",
                           "llama3.2.jinja", "mistral_v0.3.jinja", "qwen2.5.jinja", "qwen3.jinja", "smollm2.jinja"}) {
    SCOPED_TRACE(name);
    std::ifstream f(dir + name, std::ios::binary);
    ASSERT_TRUE(f.good()) << dir + name;
    std::ostringstream ss;
    ss << f.rdbuf();
    const double t0 = thread_cpu_seconds();
    ChatTemplate t(ss.str());
    std::string out;
    ASSERT_NO_THROW(out = t.render(msgs, true, "<s>", "</s>"));
    EXPECT_GT(out.size(), 4000000u);
    EXPECT_TRUE(contains(out, std::string(400, static_cast<char>('a' + 9999 % 26)))) << "last message missing";
    EXPECT_LE(thread_cpu_seconds() - t0, kBoundSeconds);
  }
}

// --- the text helpers the limits rely on -----------------------------------------------------

// Rewritten to walk code points (no per-code-point offset tables): checked against
// Python's jinja2 outputs (recorded from jinja2 3.1).
TEST(JinjaLimits, StringWalkingMatchesPython) {
  const json ctx = {{"s", "héllo wörld ΣΑΣ ß"}};
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{{ s[::-1] }}", "ß ΣΑΣ dlröw olléh"},
      {"{{ s[::2] }}", "hlowrdΣΣß"},
      {"{{ s[-3:] }}", "Σ ß"},
      {"{{ s[1:8:3] }}", "éoö"},
      {"{{ s[-1] }}", "ß"},
      {"{{ s[0] }}", "h"},
      {"{{ s[4] }}", "o"},
      {"{{ s[-17] }}", "h"},
      {"{{ s[-18] is defined }}", "False"},
      {"{{ s[17] is defined }}", "False"},
      {"{{ s[-9223372036854775807 - 1] is defined }}", "False"},
      {"{{ s[10:2:-2] }}", "drwo"},
      {"{{ s[-100:100] }}", "héllo wörld ΣΑΣ ß"},
      {"{{ s[5:-5] }}", " wörld "},
      {"{{ s[::-3] }}", "ßΑdöoé"},
      {"{{ s[100:] }}|", "|"},
      {"{{ s[:-100] }}|", "|"},
      {"{{ s[::9223372036854775807] }}", "h"},
      {"{{ s[::-9223372036854775807 - 1] }}", "ß"},
      {"{{ s|reverse }}", "ß ΣΑΣ dlröw olléh"},
      {"{{ s.upper() }}", "HÉLLO WÖRLD ΣΑΣ SS"},
      {"{{ s.lower() }}", "héllo wörld σας ß"},
      {"{{ s.title() }}", "Héllo Wörld Σας Ss"},
      {"{{ s|title }}", "Héllo Wörld Σας SS"},
      {"{{ s.capitalize() }}", "Héllo wörld σας ß"},
      {"{{ 'ßa'.capitalize() }}", "Ssa"},
      {"{{ ('  ' ~ s ~ '\\t ').strip() }}|", "héllo wörld ΣΑΣ ß|"},
      {"{{ s.strip('hé ß') }}|", "llo wörld ΣΑΣ|"},
      {"{{ s.lstrip('éh') }}|", "llo wörld ΣΑΣ ß|"},
      {"{{ s.rstrip('ß ') }}|", "héllo wörld ΣΑΣ|"},
      {"{{ (' a  b\\u3000c ' ~ s).split() }}", "['a', 'b', 'c', 'héllo', 'wörld', 'ΣΑΣ', 'ß']"},
      {"{{ (' a  b\\u3000c ' ~ s).rsplit(none, 1) }}", "[' a  b\\u3000c héllo wörld ΣΑΣ', 'ß']"},
      {"{{ (' a  b  c ').rsplit() }}", "['a', 'b', 'c']"},
      {"{{ s.startswith('wö', 6) }}", "True"},
      {"{{ s.endswith('wör', 0, -7) }}", "False"},
      {"{{ s.find('ö') }}", "7"},
      {"{{ s.rfind('Σ') }}", "14"},
      {"{{ s.find('l', -5) }}", "-1"},
      {"{{ s.replace('', '-') }}", "-h-é-l-l-o- -w-ö-r-l-d- -Σ-Α-Σ- -ß-"},
      {"{{ s.replace('l', 'LL', 2) }}", "héLLLLo wörld ΣΑΣ ß"},
      {"{{ s|center(30) }}|", "      héllo wörld ΣΑΣ ß       |"},
      {"{{ s.ljust(22, '*') }}", "héllo wörld ΣΑΣ ß*****"},
      {"{{ s.rjust(22, '*') }}", "*****héllo wörld ΣΑΣ ß"},
      {"{{ '%5.2s|%-6s|%*d'|format('héllo', 'ab', 4, 7) }}", "   hé|ab    |   7"},
      {"{{ s.count('l') }}", "3"},
      {"{{ ('xaxbxaxbxaxb').rsplit('xaxbxaxbxaxbxaxbxa') }}", "['xaxbxaxbxaxb']"},
      {"{{ ('aaa').rsplit('aa') }}", "['a', '']"},
      {"{{ ('a' * 40 ~ 'b' ~ 'a' * 40).rsplit('a' * 17) }}", "['aaaaaa', '', 'baaaaaa', '', '']"},
      {"{{ s.split('l') }}", "['hé', '', 'o wör', 'd ΣΑΣ ß']"},
      {"{{ s.index('w') }}", "6"},
      {"{{ [1,2,3,4,5][::-2] }}", "[5, 3, 1]"},
      {"{{ [1,2,3,4,5][1:4:2] }}", "[2, 4]"},
      {"{{ [1,2,3][-9223372036854775807:] }}", "[1, 2, 3]"},
      // dictsort computes each key once now (it lowered both keys per comparison).
      {"{{ {'b': 2, 'a': 3, 'C': 1}|dictsort }}|{{ {'b': 2, 'a': 3, 'C': 1}|dictsort(by='value', reverse=true) }}|"
       "{{ {'b': 2, 'a': 3, 'C': 1}|dictsort(true) }}",
       "[('a', 3), ('b', 2), ('C', 1)]|[('a', 3), ('b', 2), ('C', 1)]|[('C', 1), ('a', 3), ('b', 2)]"},
  };
  for (const auto& [src, expected] : cases) {
    SCOPED_TRACE(src);
    try {
      EXPECT_EQ(ChatTemplate(src).render(ctx), expected);
    } catch (const dhs::Error& e) {
      ADD_FAILURE() << e.what();
    }
  }
}

// utf8_prev must find exactly the boundaries utf8_next walks, on any bytes.
TEST(JinjaLimits, Utf8PrevAgreesWithUtf8Next) {
  std::mt19937 rng(7);
  const unsigned char pool[] = {'a', ' ', 0x80, 0xBF, 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x98, 0x80, 0xF8, 0xFF, 0xC0};
  for (int round = 0; round < 3000; ++round) {
    std::string s(rng() % 24, '\0');
    for (auto& c : s) c = static_cast<char>(pool[rng() % sizeof(pool)]);
    const std::vector<size_t> fwd = jinja::utf8_offsets(s);
    std::vector<size_t> back{s.size()};
    for (size_t e = s.size(); e > 0;) back.push_back(e = jinja::utf8_prev(s, e));
    std::reverse(back.begin(), back.end());
    ASSERT_EQ(fwd, back) << "round " << round;
    for (int64_t k = -30; k <= 30; ++k) {
      const int64_t n = static_cast<int64_t>(fwd.size()) - 1;
      const int64_t idx = k < 0 ? std::max<int64_t>(0, k + n) : std::min(k, n);
      ASSERT_EQ(jinja::utf8_byte_at(s, k), fwd[static_cast<size_t>(idx)]) << "round " << round << " k " << k;
    }
  }
}

}  // namespace
