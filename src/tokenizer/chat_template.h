// Chat templates: renders a model's own Jinja chat template with an interpreter
// for the Jinja subset that real templates use (no maintained C++ Jinja library
// is packaged in Debian, so this one is written by hand; checked against
// Python's jinja2 in tests).
#pragma once
#include <memory>
#include <string>
#include <vector>

namespace dhs {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", "tool"
  std::string content;
};

class ChatTemplate {
 public:
  // Parses the template; throws dhs::Error with line/column on a syntax error.
  explicit ChatTemplate(const std::string& source);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Renders with variables messages, add_generation_prompt, bos_token, eos_token.
  // Throws dhs::Error on runtime errors (including the template's raise_exception()).
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const std::string& bos_token, const std::string& eos_token) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dhs
