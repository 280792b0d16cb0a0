// Chat-template interpreter against Python's jinja2 (tests/data/chat_templates/, made by
// scripts/make_chat_template_reference.py with transformers' environment settings):
// real model templates rendered for many conversations, and small snippets covering
// expressions, filters, tests, methods, loops, macros and whitespace control, all
// byte-identical. Plus syntax-error positions, raise_exception(), and the limits that
// stop runaway templates.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "template/chat_template.h"
#include "template/jinja_interpreter.h"
#include "template/jinja_parser.h"
#include "test_paths.h"

namespace {

using dhs::ChatMessage;
using dhs::ChatTemplate;
using json = nlohmann::ordered_json;

std::string data_path(const std::string& name) { return dhs::test::data_dir() + "/chat_templates/" + name; }

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json load_json(const std::string& name) { return json::parse(read_file(data_path(name))); }

// "2024-09-05T14:30:00" -> broken-down time, the clock both sides format.
std::tm parse_now(const std::string& iso) {
  std::tm tm{};
  EXPECT_EQ(std::sscanf(iso.c_str(), "%d-%d-%dT%d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                        &tm.tm_min, &tm.tm_sec),
            6);
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return tm;
}

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

// Messages with only role and content, and no extra variables: the simple overload applies.
bool plain_case(const json& ctx) {
  for (const auto& [k, v] : ctx.items()) {
    if (k == "messages") {
      for (const auto& m : v) {
        if (m.size() != 2 || !m.contains("role") || !m.contains("content") || !m["content"].is_string()) return false;
      }
    } else if (k == "tools" || k == "documents") {
      if (!v.is_null()) return false;
    } else if (k != "add_generation_prompt" && k != "bos_token" && k != "eos_token") {
      return false;
    }
  }
  return ctx["bos_token"].is_string() && ctx["eos_token"].is_string();
}

TEST(ChatTemplate, RealTemplatesMatchJinja2) {
  const json ref = load_json("reference.json");
  const std::tm now = parse_now(ref["now"].get<std::string>());
  size_t n_checked = 0, n_plain = 0;
  std::set<std::string> templates;
  for (const auto& c : ref["cases"]) {
    const std::string tname = c["template"].get<std::string>();
    const std::string label = tname + " / " + c["name"].get<std::string>();
    SCOPED_TRACE(label);
    templates.insert(tname);
    ChatTemplate t(read_file(data_path(tname)));
    t.set_clock([now] { return now; });
    const json& ctx = c["context"];
    if (c.contains("expected")) {
      const std::string expected = c["expected"].get<std::string>();
      EXPECT_EQ(t.render(ctx), expected);
      if (plain_case(ctx)) {
        std::vector<ChatMessage> msgs;
        for (const auto& m : ctx["messages"]) msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
        EXPECT_EQ(t.render(msgs, ctx["add_generation_prompt"].get<bool>(), ctx["bos_token"].get<std::string>(),
                           ctx["eos_token"].get<std::string>()),
                  expected);
        ++n_plain;
      }
    } else {
      try {
        t.render(ctx);
        ADD_FAILURE() << "expected an error: " << c["error"];
      } catch (const dhs::Error& e) {
        if (c["error_kind"] == "raise") {
          EXPECT_TRUE(contains(e.what(), c["error"].get<std::string>())) << e.what();
        }
      }
    }
    ++n_checked;
  }
  EXPECT_GE(templates.size(), 10u);
  EXPECT_GE(n_checked, 100u);
  EXPECT_GE(n_plain, 40u);
  std::printf("checked %zu renders of %zu templates (%zu also through the ChatMessage overload)\n", n_checked,
              templates.size(), n_plain);
}

TEST(ChatTemplate, SnippetsMatchJinja2) {
  const json ref = load_json("snippets.json");
  const std::tm now = parse_now(ref["now"].get<std::string>());
  const json& ctx = ref["context"];
  size_t n_ok = 0, n_err = 0;
  for (const auto& s : ref["snippets"]) {
    const std::string src = s["template"].get<std::string>();
    SCOPED_TRACE(src);
    std::unique_ptr<ChatTemplate> t;
    try {
      t = std::make_unique<ChatTemplate>(src);
    } catch (const dhs::Error& e) {
      EXPECT_TRUE(s.contains("error")) << "unexpected syntax error: " << e.what();
      if (s.contains("error_line")) {
        EXPECT_TRUE(contains(e.what(), "line " + std::to_string(s["error_line"].get<int>()) + ",")) << e.what();
      }
      ++n_err;
      continue;
    }
    t->set_clock([now] { return now; });
    if (s.contains("expected")) {
      try {
        EXPECT_EQ(t->render(ctx), s["expected"].get<std::string>());
      } catch (const dhs::Error& e) {
        ADD_FAILURE() << "unexpected error: " << e.what();
      }
      ++n_ok;
    } else {
      try {
        const std::string out = t->render(ctx);
        ADD_FAILURE() << "expected an error (" << s["error"] << "), got: " << out;
      } catch (const dhs::Error& e) {
        if (s["error_kind"] == "raise") {
          EXPECT_TRUE(contains(e.what(), s["error"].get<std::string>())) << e.what();
        }
      }
      ++n_err;
    }
  }
  EXPECT_GE(n_ok + n_err, 150u);
  std::printf("checked %zu snippets against jinja2 (%zu outputs, %zu errors)\n", n_ok + n_err, n_ok, n_err);
}

TEST(ChatTemplate, SmolLM2TemplateFromModel) {
  ChatTemplate t(read_file(data_path("smollm2.jinja")));
  EXPECT_EQ(t.render({{"user", "Hi"}}, true, "<|im_start|>", "<|im_end|>"),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, ExtraVariablesOverride) {
  ChatTemplate t("{{ bos_token }}{{ flag }}|{{ tools }}|{{ messages|length }}");
  json extra = {{"flag", "on"}, {"bos_token", "<B>"}};
  EXPECT_EQ(t.render({{"user", "x"}}, false, "<s>", "</s>", extra), "<B>on|None|1");
  EXPECT_EQ(t.render({{"user", "x"}}, false, "<s>", "</s>"), "<s>|None|1");
  EXPECT_THROW(t.render(json::array()), dhs::Error);
}

TEST(ChatTemplate, ClockFeedsStrftimeNow) {
  ChatTemplate t("{{ strftime_now('%d %b %Y, %A') }}");
  std::tm tm{};
  tm.tm_year = 2025 - 1900;
  tm.tm_mon = 0;
  tm.tm_mday = 31;
  t.set_clock([tm] { return tm; });
  EXPECT_EQ(t.render({}, false, "", ""), "31 Jan 2025, Friday");
}

TEST(ChatTemplate, MoveKeepsTemplate) {
  ChatTemplate a("{{ messages[0].content }}");
  ChatTemplate b = std::move(a);
  EXPECT_EQ(b.render({{"user", "moved"}}, false, "", ""), "moved");
}

// --- errors --------------------------------------------------------------------------

std::string syntax_error_of(const std::string& src) {
  try {
    ChatTemplate t(src);
  } catch (const dhs::Error& e) {
    return e.what();
  }
  return "";
}

TEST(ChatTemplate, SyntaxErrorsHaveLineAndColumn) {
  EXPECT_TRUE(contains(syntax_error_of("line1\n{{ 1 + }}"), "line 2, column 8")) << syntax_error_of("line1\n{{ 1 + }}");
  EXPECT_TRUE(contains(syntax_error_of("ab\n  {% unknowntag %}"), "line 2, column 6"));
  EXPECT_TRUE(contains(syntax_error_of("{% if x %}\n\n"), "expected 'elif' or 'else' or 'endif'"));
  EXPECT_TRUE(contains(syntax_error_of("x\n{# open"), "line 2, column 1"));
  EXPECT_TRUE(contains(syntax_error_of("{{ 'é' + 'unterminated }}"), "line 1, column 10"));
  EXPECT_TRUE(contains(syntax_error_of("{{ (1, 2 }}"), "unexpected '}', expected ')'"));
  EXPECT_TRUE(contains(syntax_error_of("{% for x in y %}{% break %}{% endfor %}{% continue %}"), "outside of a loop"));
  EXPECT_TRUE(contains(syntax_error_of("{% for x in y recursive %}{% endfor %}"), "not supported"));
  EXPECT_TRUE(contains(syntax_error_of("{% include 'x' %}"), "not supported"));
  for (const char* bad : {"{{", "{%", "{{ }}", "{% set %}", "{{ x | }}", "{{ a b }}", "{% endfor %}", "{{ x.1a }}",
                          "{% macro m( %}{% endmacro %}", "{{ f(a=1, 2) }}", "{{ [1, 2 }}"}) {
    const std::string msg = syntax_error_of(bad);
    EXPECT_TRUE(contains(msg, "chat template syntax error at line 1, column ")) << bad << " -> " << msg;
  }
}

TEST(ChatTemplate, RuntimeErrorsHaveLocation) {
  ChatTemplate t("ok\n{{ messages[0].content.nope.deeper }}");
  try {
    t.render({{"user", "x"}}, false, "", "");
    FAIL() << "expected an error";
  } catch (const dhs::Error& e) {
    EXPECT_TRUE(contains(e.what(), "line 2, column")) << e.what();
    EXPECT_TRUE(contains(e.what(), "has no attribute 'nope'")) << e.what();
  }
}

TEST(ChatTemplate, RaiseExceptionCarriesTheMessage) {
  ChatTemplate t("{% if messages[0].role != 'user' %}{{ raise_exception('Roles must start with user, got ' + messages[0].role) }}{% endif %}ok");
  EXPECT_EQ(t.render({{"user", "x"}}, false, "", ""), "ok");
  try {
    t.render({{"system", "x"}}, false, "", "");
    FAIL() << "expected an error";
  } catch (const dhs::Error& e) {
    EXPECT_TRUE(contains(e.what(), "Roles must start with user, got system")) << e.what();
  }
}

// --- limits --------------------------------------------------------------------------

std::string render_with(const std::string& src, dhs::jinja::RenderLimits limits) {
  auto ast = dhs::jinja::parse_template(src);
  dhs::jinja::Interpreter in([] { return std::tm{}; }, limits);
  return in.render(*ast, dhs::jinja::Value::dict());
}

TEST(ChatTemplate, RunawayRecursionStops) {
  ChatTemplate t("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  try {
    t.render({}, false, "", "");
    FAIL() << "expected an error";
  } catch (const dhs::Error& e) {
    EXPECT_TRUE(contains(e.what(), "macro 'f' nested more than")) << e.what();
  }
}

TEST(ChatTemplate, RunawayLoopsStop) {
  dhs::jinja::RenderLimits limits;
  limits.max_loop_iterations = 5000;
  EXPECT_EQ(render_with("{% for i in range(50) %}{% for j in range(50) %}{% endfor %}{% endfor %}done", limits), "done");
  try {
    render_with("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", limits);
    FAIL() << "expected an error";
  } catch (const dhs::Error& e) {
    EXPECT_TRUE(contains(e.what(), "more than 5000 loop iterations")) << e.what();
  }
  // jinja2's sandbox refuses ranges over 100000 items, and so do we.
  EXPECT_THROW(ChatTemplate("{{ range(10000000)|length }}").render({}, false, "", ""), dhs::Error);
}

TEST(ChatTemplate, RunawayOutputStops) {
  dhs::jinja::RenderLimits limits;
  limits.max_output_bytes = 1 << 16;
  EXPECT_THROW(render_with("{% for i in range(1000) %}{{ 'x' * 1000 }}{% endfor %}", limits), dhs::Error);
  EXPECT_THROW(render_with("{{ 'x' * 100000000000 }}", limits), dhs::Error);
  EXPECT_THROW(render_with("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", limits),
               dhs::Error);
}

TEST(ChatTemplate, DeepNestingIsRejected) {
  std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_TRUE(contains(syntax_error_of(deep), "nested too deeply"));
  std::string deep_list = "{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}";
  EXPECT_TRUE(contains(syntax_error_of(deep_list), "nested too deeply"));
  json nested = json::array();
  for (int i = 0; i < 600; ++i) nested = json::array({nested});
  ChatTemplate t("{{ deep|length }}");
  EXPECT_THROW(t.render(json{{"deep", nested}}), dhs::Error);
  ChatTemplate grow("{% set ns = namespace(v=[]) %}{% for i in range(3000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v }}");
  EXPECT_THROW(grow.render({}, false, "", ""), dhs::Error);
}

TEST(ChatTemplate, ToolsThroughJsonContext) {
  // Tool schemas keep their key order (|tojson output depends on it).
  ChatTemplate t("{% for t in tools %}{{ t|tojson }}{% endfor %}|{{ messages[0].tool_calls[0].function.arguments|tojson }}");
  json ctx = json::parse(R"({"messages": [{"role": "assistant", "content": null,
      "tool_calls": [{"function": {"name": "f", "arguments": {"z": 1, "a": [true, null, 2.5]}}}]}],
      "tools": [{"name": "f", "b": 1, "a": "é"}]})");
  EXPECT_EQ(t.render(ctx), R"({"name": "f", "b": 1, "a": "é"}|{"z": 1, "a": [true, null, 2.5]})");
}

}  // namespace
