// OpenAI request checks and response shapes (openai_protocol.h).
#include "server/openai_protocol.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "dhisparse/scheduler.h"
#include "engine/sampler.h"

namespace dhs::server {

using nlohmann::json;

namespace {

// Bounds that keep one request's work small whatever it asks for.
constexpr size_t kMaxStops = 64;
constexpr size_t kMaxStopBytes = 4096;
constexpr size_t kMaxMessages = 4096;
constexpr int64_t kIntLimit = int64_t{1} << 53;  // integers a double holds exactly

ApiError bad(std::string message, std::string param) { return ApiError{400, std::move(message), std::move(param)}; }

// Readers of one optional field: absent and null leave `out` as it is; a wrong type or a value
// out of range is a 400 naming the field.
class Fields {
 public:
  explicit Fields(const json& obj) : obj_(obj) {}

  const json* find(const char* key) const {
    const auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }

  std::optional<ApiError> boolean(const char* key, bool& out) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) return bad(std::string("'") + key + "' must be a boolean", key);
    out = v->get<bool>();
    return std::nullopt;
  }

  std::optional<ApiError> string(const char* key, std::string& out) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) return bad(std::string("'") + key + "' must be a string", key);
    out = v->get<std::string>();
    return std::nullopt;
  }

  // A finite number in [lo, hi].
  std::optional<ApiError> number(const char* key, double lo, double hi, double& out) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) return bad(std::string("'") + key + "' must be a number", key);
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < lo || d > hi)
      return bad(std::string("'") + key + "' must be between " + fmt_num(lo) + " and " + fmt_num(hi) + ", got " +
                     v->dump(),
                 key);
    out = d;
    return std::nullopt;
  }

  // An integer in [lo, hi] (a float with no fraction counts, as pydantic reads it for vLLM).
  std::optional<ApiError> integer(const char* key, int64_t lo, int64_t hi, std::optional<int64_t>& out) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    int64_t i = 0;
    if (!as_int(*v, i)) return bad(std::string("'") + key + "' must be an integer", key);
    if (i < lo || i > hi)
      return bad(std::string("'") + key + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                     ", got " + std::to_string(i),
                 key);
    out = i;
    return std::nullopt;
  }

  static bool as_int(const json& v, int64_t& out) {
    if (v.is_number_integer()) {
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return false;
      out = v.get<int64_t>();
      return true;
    }
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > static_cast<double>(kIntLimit)) return false;
      out = static_cast<int64_t>(d);
      return true;
    }
    return false;
  }

 private:
  static std::string fmt_num(double d) {
    json j = d;
    if (d == std::floor(d) && std::fabs(d) < 1e15) j = static_cast<int64_t>(d);
    return j.dump();
  }
  const json& obj_;
};

std::optional<ApiError> parse_stop(const Fields& f, std::vector<std::string>& out) {
  const json* v = f.find("stop");
  if (!v) return std::nullopt;
  std::vector<const json*> items;
  if (v->is_string()) {
    items.push_back(v);
  } else if (v->is_array()) {
    if (v->size() > kMaxStops) return bad("'stop' may hold at most " + std::to_string(kMaxStops) + " strings", "stop");
    for (const json& s : *v) items.push_back(&s);
  } else {
    return bad("'stop' must be a string or a list of strings", "stop");
  }
  for (const json* s : items) {
    if (!s->is_string()) return bad("'stop' must be a string or a list of strings", "stop");
    const std::string& t = s->get_ref<const std::string&>();
    if (t.empty()) return bad("'stop' strings must not be empty", "stop");
    if (t.size() > kMaxStopBytes) return bad("a 'stop' string is longer than " + std::to_string(kMaxStopBytes) + " bytes", "stop");
    out.push_back(t);
  }
  return std::nullopt;
}

// A token-id list; false when an element is not an integer in int32 range.
bool parse_ids(const json& arr, std::vector<int32_t>& out) {
  out.reserve(arr.size());
  for (const json& x : arr) {
    int64_t i = 0;
    if (!Fields::as_int(x, i) || i < 0 || i > std::numeric_limits<int32_t>::max()) return false;
    out.push_back(static_cast<int32_t>(i));
  }
  return true;
}

std::optional<ApiError> parse_prompt(const Fields& f, CompletionRequest& out) {
  const json* v = f.find("prompt");
  if (!v) return bad("'prompt' is required", "prompt");
  const char* kShape = "'prompt' must be a string, a list of token ids, or a list holding one of those";
  if (v->is_string()) {
    out.prompt_text = v->get<std::string>();
    return std::nullopt;
  }
  if (!v->is_array()) return bad(kShape, "prompt");
  if (v->empty()) return bad("'prompt' is empty", "prompt");
  const json& first = v->front();
  if (first.is_string() || first.is_array()) {
    // A batch of prompts: one is what the engine serves per request.
    if (v->size() != 1) return bad("a list of several prompts is not supported; send one prompt per request", "prompt");
    if (first.is_string()) {
      out.prompt_text = first.get<std::string>();
      return std::nullopt;
    }
    if (first.empty()) return bad("'prompt' is empty", "prompt");
    if (!parse_ids(first, out.prompt_ids)) return bad(kShape, "prompt");
  } else if (!parse_ids(*v, out.prompt_ids)) {
    return bad(kShape, "prompt");
  }
  out.prompt_is_ids = true;
  return std::nullopt;
}

std::optional<ApiError> parse_messages(const Fields& f, std::vector<ChatMessage>& out) {
  const json* v = f.find("messages");
  if (!v) return bad("'messages' is required", "messages");
  if (!v->is_array()) return bad("'messages' must be a list of messages", "messages");
  if (v->empty()) return bad("'messages' is empty", "messages");
  if (v->size() > kMaxMessages) return bad("'messages' holds more than " + std::to_string(kMaxMessages) + " messages", "messages");
  for (const json& m : *v) {
    if (!m.is_object()) return bad("each message must be an object with 'role' and 'content'", "messages");
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string() || role->get_ref<const std::string&>().empty())
      return bad("each message needs a 'role' string", "messages");
    ChatMessage msg{role->get<std::string>(), ""};
    const auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      // An assistant turn with tool calls has no content; read as empty.
    } else if (content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content->is_array()) {
      // Content parts: text only (no images or audio in this engine).
      for (const json& part : *content) {
        if (!part.is_object()) return bad("message content parts must be objects", "messages");
        const auto type = part.find("type");
        const auto text = part.find("text");
        if (type == part.end() || !type->is_string() || type->get_ref<const std::string&>() != "text")
          return bad("only content parts of type 'text' are supported", "messages");
        if (text == part.end() || !text->is_string()) return bad("a 'text' content part needs a 'text' string", "messages");
        msg.content += text->get_ref<const std::string&>();
      }
    } else {
      return bad("message 'content' must be a string, a list of text parts, or null", "messages");
    }
    out.push_back(std::move(msg));
  }
  return std::nullopt;
}

// Fields the engine cannot honour get a 400 rather than being ignored (an ignored penalty
// would silently change the output the client asked for).
std::optional<ApiError> check_unsupported(Endpoint ep, const Fields& f) {
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    double d = 0.0;
    if (auto e = f.number(key, -2.0, 2.0, d)) return e;
    if (d != 0.0)
      return bad(std::string("'") + key + "' is not supported (the engine has only 'repetition_penalty'); leave it out or 0",
                 key);
  }
  std::optional<int64_t> n;
  if (auto e = f.integer("n", 1, std::numeric_limits<int32_t>::max(), n)) return e;
  if (n && *n != 1) return bad("'n' > 1 is not supported; send several requests", "n");
  std::optional<int64_t> best_of;
  if (auto e = f.integer("best_of", 1, std::numeric_limits<int32_t>::max(), best_of)) return e;
  if (best_of && *best_of != 1) return bad("'best_of' > 1 is not supported", "best_of");
  if (const json* lp = f.find("logprobs")) {
    const bool asked = lp->is_boolean() ? lp->get<bool>() : true;
    if (asked) return bad("'logprobs' is not supported", "logprobs");
  }
  if (const json* tl = f.find("top_logprobs")) {
    int64_t k = 0;
    if (!Fields::as_int(*tl, k) || k != 0) return bad("'top_logprobs' is not supported", "top_logprobs");
  }
  if (ep == Endpoint::Completions) {
    bool echo = false;
    if (auto e = f.boolean("echo", echo)) return e;
    if (echo) return bad("'echo' is not supported", "echo");
    std::string suffix;
    if (auto e = f.string("suffix", suffix)) return e;
    if (!suffix.empty()) return bad("'suffix' is not supported", "suffix");
  }
  if (const json* lb = f.find("logit_bias")) {
    if (!lb->is_object()) return bad("'logit_bias' must be an object", "logit_bias");
    if (!lb->empty()) return bad("'logit_bias' is not supported", "logit_bias");
  }
  return std::nullopt;
}

std::optional<ApiError> parse_sampling(const Fields& f, CompletionRequest& out) {
  SamplingParams& s = out.options.sampling;
  s.repetition_window = 0;  // the whole context, as vLLM's repetition_penalty reads it
  double d = 1.0;  // OpenAI's default temperature
  if (auto e = f.number("temperature", 0.0, 100.0, d)) return e;
  s.temperature = static_cast<float>(d);
  d = 1.0;
  if (auto e = f.number("top_p", 0.0, 1.0, d)) return e;
  if (d <= 0.0) return bad("'top_p' must be in (0, 1], got 0", "top_p");
  s.top_p = static_cast<float>(d);
  d = 0.0;
  if (auto e = f.number("min_p", 0.0, 1.0, d)) return e;
  s.min_p = static_cast<float>(d);
  d = 1.0;
  if (auto e = f.number("repetition_penalty", 0.0, 100.0, d)) return e;
  if (d <= 0.0) return bad("'repetition_penalty' must be > 0", "repetition_penalty");
  s.repetition_penalty = static_cast<float>(d);
  std::optional<int64_t> top_k;
  // vLLM reads -1 (and 0) as "off".
  if (auto e = f.integer("top_k", -1, std::numeric_limits<int32_t>::max(), top_k)) return e;
  s.top_k = top_k && *top_k > 0 ? static_cast<int>(*top_k) : 0;
  if (const json* seed = f.find("seed")) {
    int64_t i = 0;
    if (seed->is_number_unsigned()) {
      s.seed = seed->get<uint64_t>();
    } else if (Fields::as_int(*seed, i)) {
      s.seed = static_cast<uint64_t>(i);
    } else {
      return bad("'seed' must be an integer", "seed");
    }
    out.seed_given = true;
  }
  try {
    validate(s);
  } catch (const Error& e) {
    return bad(e.what(), "");
  }
  return std::nullopt;
}

json choice_base() { return json{{"index", 0}}; }

const char* object_name(const ResponseMeta& m, bool chunk) {
  if (m.endpoint == Endpoint::ChatCompletions) return chunk ? "chat.completion.chunk" : "chat.completion";
  return "text_completion";
}

json envelope(const ResponseMeta& m, bool chunk) {
  return json{{"id", m.id}, {"object", object_name(m, chunk)}, {"created", m.created}, {"model", m.model}};
}

json finish_value(const std::string& reason) { return reason.empty() ? json(nullptr) : json(reason); }

std::optional<ApiError> parse_object(std::string_view body, json& j) {
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    return bad(std::string("the body is not valid JSON: ") + e.what(), "");
  }
  if (!j.is_object()) return bad("the body must be a JSON object", "");
  return std::nullopt;
}
}  // namespace

std::string error_type(int status) {
  switch (status) {
    case 400: case 404: case 405: case 413: return "invalid_request_error";
    case 401: return "authentication_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

json error_json(const ApiError& e) {
  return json{{"error",
               {{"message", e.message},
                {"type", error_type(e.status)},
                {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                {"code", e.status}}}};
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::optional<ApiError> parse_completion_request(Endpoint endpoint, std::string_view body, CompletionRequest& out) {
  out = CompletionRequest{};
  out.endpoint = endpoint;
  json j;
  if (auto e = parse_object(body, j)) return e;
  const Fields f(j);
  if (auto e = f.string("model", out.model)) return e;
  if (auto e = f.boolean("stream", out.stream)) return e;
  if (const json* so = f.find("stream_options")) {
    if (!so->is_object()) return bad("'stream_options' must be an object", "stream_options");
    if (!out.stream) return bad("'stream_options' is only allowed with 'stream': true", "stream_options");
    if (auto e = Fields(*so).boolean("include_usage", out.include_usage)) return e;
  }
  if (endpoint == Endpoint::Completions) {
    if (auto e = parse_prompt(f, out)) return e;
  } else {
    if (auto e = parse_messages(f, out.messages)) return e;
  }
  if (auto e = check_unsupported(endpoint, f)) return e;
  if (auto e = parse_sampling(f, out)) return e;
  if (auto e = parse_stop(f, out.options.stop)) return e;
  if (auto e = f.boolean("ignore_eos", out.options.ignore_eos)) return e;
  // dhisparse's own field: the request's sparse policy (PolicySpec's grammar, "coverage:0.95");
  // what it may choose is checked against the server's at submit (a 400 saying why).
  if (auto e = f.string("sparse_policy", out.options.sparse_policy)) return e;
  if (out.options.sparse_policy.size() > 256) return bad("'sparse_policy' is longer than 256 characters", "sparse_policy");
  // dhisparse's own field too: drafts per speculative cycle (0 off, "auto": chosen per cycle from
  // measured acceptance and step costs), over the server's --speculative-k.
  if (const json* v = f.find("speculative_k"); v != nullptr && v->is_string()) {
    if (v->get<std::string>() != "auto")
      return bad("'speculative_k' must be an integer between 0 and 16 or \"auto\"", "speculative_k");
    out.options.speculative_k = kSpeculativeAuto;
  } else {
    std::optional<int64_t> spec_k;
    if (auto e = f.integer("speculative_k", 0, 16, spec_k)) return e;
    if (spec_k) out.options.speculative_k = static_cast<int>(*spec_k);
  }
  std::optional<int64_t> max_tokens, max_completion_tokens;
  if (auto e = f.integer("max_tokens", 1, kIntLimit, max_tokens)) return e;
  if (auto e = f.integer("max_completion_tokens", 1, kIntLimit, max_completion_tokens)) return e;
  out.max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;
  return std::nullopt;
}


std::optional<ApiError> parse_tokenize_request(std::string_view body, TokenizeRequest& out) {
  out = TokenizeRequest{};
  json j;
  if (auto e = parse_object(body, j)) return e;
  const Fields f(j);
  if (auto e = f.boolean("add_special_tokens", out.add_special)) return e;
  if (f.find("messages")) {
    out.chat = true;
    return parse_messages(f, out.messages);
  }
  if (!f.find("prompt")) return bad("'prompt' or 'messages' is required", "prompt");
  return f.string("prompt", out.prompt);
}

std::optional<ApiError> parse_detokenize_request(std::string_view body, std::vector<int32_t>& ids) {
  json j;
  if (auto e = parse_object(body, j)) return e;
  const json* t = Fields(j).find("tokens");
  if (!t) return bad("'tokens' is required", "tokens");
  if (!t->is_array() || !parse_ids(*t, ids)) return bad("'tokens' must be a list of token ids", "tokens");
  return std::nullopt;
}

std::optional<ApiError> fit_context(CompletionRequest& req, const std::vector<int32_t>& prompt, int32_t vocab_size,
                                    int64_t max_model_len) {
  const std::string param = req.endpoint == Endpoint::ChatCompletions ? "messages" : "prompt";
  if (prompt.empty()) return bad("the prompt is empty", param);
  for (const int32_t id : prompt)
    if (id < 0 || id >= vocab_size)
      return bad("token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")",
                 param);
  const auto n = static_cast<int64_t>(prompt.size());
  const std::string head = "This model's maximum context length is " + std::to_string(max_model_len) + " tokens. ";
  if (n >= max_model_len)
    return bad(head + "However, your request has " + std::to_string(n) +
                   " input tokens. Please reduce the length of the input.",
               param);
  if (req.max_tokens && n + *req.max_tokens > max_model_len)
    return bad(head + "However, you requested " + std::to_string(n + *req.max_tokens) + " tokens (" +
                   std::to_string(n) + " in the input, " + std::to_string(*req.max_tokens) +
                   " in the completion). Please reduce the length of the input or completion.",
               "max_tokens");
  req.options.max_tokens = req.max_tokens ? *req.max_tokens : max_model_len - n;
  return std::nullopt;
}

json usage_json(int64_t n_prompt, int64_t n_generated) {
  return json{{"prompt_tokens", n_prompt}, {"completion_tokens", n_generated}, {"total_tokens", n_prompt + n_generated}};
}

json response_json(const ResponseMeta& m, const std::string& text, const std::string& finish_reason, int64_t n_prompt,
                   int64_t n_generated) {
  json r = envelope(m, false);
  json c = choice_base();
  if (m.endpoint == Endpoint::ChatCompletions)
    c["message"] = {{"role", "assistant"}, {"content", text}};
  else
    c["text"] = text;
  c["logprobs"] = nullptr;
  c["finish_reason"] = finish_value(finish_reason);
  r["choices"] = json::array({c});
  r["usage"] = usage_json(n_prompt, n_generated);
  return r;
}

json chunk_json(const ResponseMeta& m, const std::string& text, const std::string& finish_reason, bool role,
                bool usage_null) {
  json r = envelope(m, true);
  json c = choice_base();
  if (m.endpoint == Endpoint::ChatCompletions) {
    json delta = json::object();
    if (role) delta["role"] = "assistant";
    if (role || !text.empty()) delta["content"] = text;
    c["delta"] = delta;
  } else {
    c["text"] = text;
  }
  c["logprobs"] = nullptr;
  c["finish_reason"] = finish_value(finish_reason);
  r["choices"] = json::array({c});
  if (usage_null) r["usage"] = nullptr;
  return r;
}

json usage_chunk_json(const ResponseMeta& m, int64_t n_prompt, int64_t n_generated) {
  json r = envelope(m, true);
  r["choices"] = json::array();
  r["usage"] = usage_json(n_prompt, n_generated);
  return r;
}

}  // namespace dhs::server
