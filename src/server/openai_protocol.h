// The OpenAI API's request and response shapes (as vLLM serves them): a /v1/completions or
// /v1/chat/completions body checked field by field into a CompletionRequest, the context check
// after tokenization, the response and stream-chunk JSON, and OpenAI's error object. No I/O here:
// http_server.cpp reads and writes, this file decides.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "dhisparse/engine.h"

namespace dhs::server {

enum class Endpoint { Completions, ChatCompletions };

// An error the client gets as {"error": {"message", "type", "param", "code"}} with `status`.
struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // the field at fault; "" gives null
};
nlohmann::json error_json(const ApiError& e);
// OpenAI's error type for a status ("invalid_request_error", "authentication_error", ...).
std::string error_type(int status);

// JSON text for the wire: invalid UTF-8 (text detokenized from arbitrary ids) is replaced, never
// thrown about.
std::string dump_json(const nlohmann::json& j);

// A parsed request body, before tokenization.
struct CompletionRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::string model;                 // "" when the body names none
  bool stream = false;
  bool include_usage = false;        // stream_options.include_usage
  // Completions: the prompt as text, or as token ids (prompt_is_ids).
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  bool prompt_is_ids = false;
  std::vector<ChatMessage> messages;  // chat
  GenerateOptions options;            // sampling, stop, ignore_eos; max_tokens set by fit_context
  std::optional<int64_t> max_tokens;  // max_completion_tokens or max_tokens; absent: what the context leaves
  bool seed_given = false;            // no seed: the server draws one (an unseeded request samples afresh)
};

// Checks every field the engine reads (types, ranges, what it does not support) and fills `out`.
// Unknown fields are ignored, as OpenAI's API does; null reads as absent.
std::optional<ApiError> parse_completion_request(Endpoint endpoint, std::string_view body, CompletionRequest& out);

// After tokenization: ids within the vocabulary, a prompt shorter than max_model_len, prompt +
// max_tokens within it (vLLM's message). Sets req.options.max_tokens (absent: max_model_len - prompt).
std::optional<ApiError> fit_context(CompletionRequest& req, const std::vector<int32_t>& prompt, int32_t vocab_size,
                                    int64_t max_model_len);

// /tokenize (vLLM's): a prompt, or chat messages rendered with the generation prompt.
struct TokenizeRequest {
  bool chat = false;
  std::string prompt;
  std::vector<ChatMessage> messages;
  bool add_special = true;  // add_special_tokens: BOS where the model wants it (prompt only)
};
std::optional<ApiError> parse_tokenize_request(std::string_view body, TokenizeRequest& out);
// /detokenize: {"tokens": [ids]} (range against the vocabulary is the caller's check).
std::optional<ApiError> parse_detokenize_request(std::string_view body, std::vector<int32_t>& ids);

// What every response and chunk of one request carries.
struct ResponseMeta {
  Endpoint endpoint = Endpoint::Completions;
  std::string id;       // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
};

nlohmann::json usage_json(int64_t n_prompt, int64_t n_generated);
// A non-streaming response.
nlohmann::json response_json(const ResponseMeta& m, const std::string& text, const std::string& finish_reason,
                             int64_t n_prompt, int64_t n_generated);
// A stream chunk with text (chat: delta.content) and, on the last, finish_reason. role: chat's
// first chunk, {"role": "assistant", "content": ""}. usage_null: "usage": null (include_usage).
nlohmann::json chunk_json(const ResponseMeta& m, const std::string& text, const std::string& finish_reason,
                          bool role, bool usage_null);
// include_usage's last chunk: no choices, the usage.
nlohmann::json usage_chunk_json(const ResponseMeta& m, int64_t n_prompt, int64_t n_generated);

}  // namespace dhs::server
