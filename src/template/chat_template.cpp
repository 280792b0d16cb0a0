// Chat templates (see chat_template.h): the public face of the Jinja
// interpreter in jinja_*.{h,cpp}. Builds the render context the way
// transformers' apply_chat_template does and runs the parsed template.
#include "template/chat_template.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "template/jinja_interpreter.h"
#include "template/jinja_parser.h"

namespace dhs {

namespace {

std::tm local_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

// The variables transformers passes for plain messages, built as values directly
// (going through JSON costs more than rendering a long conversation).
jinja::Value base_context(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          const std::string& bos_token, const std::string& eos_token) {
  using jinja::Value;
  std::vector<Value> msgs;
  msgs.reserve(messages.size());
  for (const auto& m : messages) {
    Value d = Value::dict();
    d.object().items.emplace_back(Value::string("role"), Value::string(m.role));
    d.object().items.emplace_back(Value::string("content"), Value::string(m.content));
    msgs.push_back(std::move(d));
  }
  Value ctx = Value::dict();
  auto& o = ctx.object();
  o.set(Value::string("messages"), Value::list(std::move(msgs)));
  o.set(Value::string("tools"), Value::none());
  o.set(Value::string("documents"), Value::none());
  o.set(Value::string("add_generation_prompt"), Value::boolean(add_generation_prompt));
  o.set(Value::string("bos_token"), Value::string(bos_token));
  o.set(Value::string("eos_token"), Value::string(eos_token));
  return ctx;
}

jinja::Value to_value(const nlohmann::ordered_json& j) {
  try {
    return jinja::from_json(j);
  } catch (const jinja::JinjaError& e) {
    throw Error(std::string("chat template variables: ") + e.what());
  }
}

}  // namespace

struct ChatTemplate::Impl {
  std::unique_ptr<jinja::TemplateAst> ast;
  std::function<std::tm()> clock = local_now;

  std::string render(const jinja::Value& context) const {
    jinja::Interpreter interp(clock);
    try {
      return interp.render(*ast, context);
    } catch (const jinja::JinjaError& e) {  // raised outside any statement
      throw Error(std::string("chat template error: ") + e.what());
    }
  }
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
  return impl_->render(base_context(messages, add_generation_prompt, bos_token, eos_token));
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const std::string& bos_token, const std::string& eos_token,
                                 const nlohmann::ordered_json& extra) const {
  DHS_CHECK(extra.is_object() || extra.is_null(), "chat template variables must be a JSON object");
  jinja::Value ctx = base_context(messages, add_generation_prompt, bos_token, eos_token);
  if (extra.is_object()) {
    const jinja::Value more = to_value(extra);
    for (const auto& [k, v] : more.object().items) ctx.object().set(k, v);
  }
  return impl_->render(ctx);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  DHS_CHECK(context.is_object(), "chat template context must be a JSON object");
  return impl_->render(to_value(context));
}

}  // namespace dhs
