// Chat templates: renders a model's own Jinja chat template with an interpreter
// for the Jinja subset that real templates use (no maintained C++ Jinja library
// is packaged in Debian, so this one is written by hand; checked against
// Python's jinja2 in tests).
#pragma once
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "dhisparse/chat.h"

namespace dhs {

// Parsed once, rendered many times; render() is const and may run concurrently.
class ChatTemplate {
 public:
  // Parses the template; throws dhs::Error with line/column on a syntax error.
  explicit ChatTemplate(const std::string& source);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Renders with variables messages, add_generation_prompt, bos_token, eos_token
  // (and tools = documents = none, as transformers passes them).
  // Throws dhs::Error on runtime errors (including the template's raise_exception()).
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const std::string& bos_token, const std::string& eos_token) const;

  // Same, plus template-specific variables (tools, enable_thinking, date_string, ...);
  // `extra` is a JSON object whose keys override the ones above.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const std::string& bos_token, const std::string& eos_token,
                     const nlohmann::ordered_json& extra) const;

  // Renders with exactly the variables of `context` (a JSON object), e.g.
  // {"messages": [... with tool_calls ...], "tools": [...], "add_generation_prompt": true,
  //  "bos_token": "<s>", ...}. Key order is kept: it shows in |tojson and dict loops.
  std::string render(const nlohmann::ordered_json& context) const;

  // What strftime_now() formats; local time by default. Tests pin it.
  void set_clock(std::function<std::tm()> now);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dhs
