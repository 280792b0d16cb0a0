// Chat templates (see chat_template.h): the public face of the Jinja
// interpreter in jinja_*.{h,cpp}. Builds the render context the way
// transformers' apply_chat_template does and runs the parsed template.
#include "tokenizer/chat_template.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/jinja_interpreter.h"
#include "tokenizer/jinja_parser.h"

namespace dhs {

namespace {

std::tm local_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

nlohmann::ordered_json base_context(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                    const std::string& bos_token, const std::string& eos_token) {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  auto& msgs = ctx["messages"] = nlohmann::ordered_json::array();
  for (const auto& m : messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
  ctx["tools"] = nullptr;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = add_generation_prompt;
  ctx["bos_token"] = bos_token;
  ctx["eos_token"] = eos_token;
  return ctx;
}

}  // namespace

struct ChatTemplate::Impl {
  std::unique_ptr<jinja::TemplateAst> ast;
  std::function<std::tm()> clock = local_now;
};

ChatTemplate::ChatTemplate(const std::string& source) : impl_(std::make_unique<Impl>()) {
  impl_->ast = jinja::parse_template(source);
}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

void ChatTemplate::set_clock(std::function<std::tm()> now) { impl_->clock = std::move(now); }

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const std::string& bos_token, const std::string& eos_token) const {
  return render(base_context(messages, add_generation_prompt, bos_token, eos_token));
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const std::string& bos_token, const std::string& eos_token,
                                 const nlohmann::ordered_json& extra) const {
  DHS_CHECK(extra.is_object() || extra.is_null(), "chat template variables must be a JSON object");
  auto ctx = base_context(messages, add_generation_prompt, bos_token, eos_token);
  if (extra.is_object())
    for (const auto& [k, v] : extra.items()) ctx[k] = v;
  return render(ctx);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  DHS_CHECK(context.is_object(), "chat template context must be a JSON object");
  jinja::Value ctx;
  try {
    ctx = jinja::from_json(context);
  } catch (const jinja::JinjaError& e) {
    throw Error(std::string("chat template context: ") + e.what());
  }
  jinja::Interpreter interp(impl_->clock);
  try {
    return interp.render(*impl_->ast, ctx);
  } catch (const jinja::JinjaError& e) {  // raised outside any statement
    throw Error(std::string("chat template error: ") + e.what());
  }
}

}  // namespace dhs
