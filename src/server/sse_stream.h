// Server-sent events of one streaming response, in vLLM's order: chat's role chunk first, a
// chunk per update with the new text, the last with finish_reason, include_usage's usage chunk,
// then "data: [DONE]". A request that ends in an engine error gets an error object as its last
// data before [DONE] (as vLLM streams it). Formatting only: the HTTP layer writes the text.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "server/openai_protocol.h"
#include "server/request_stream.h"

namespace dhs::server {

class SseStream {
 public:
  SseStream(ResponseMeta meta, bool include_usage) : meta_(std::move(meta)), include_usage_(include_usage) {}
  // What precedes any text: chat's role chunk ("" for completions).
  std::string open();
  // The events for one update; after a finished update, ends with [DONE].
  std::string events(const StreamUpdate& u);

  static std::string data(const nlohmann::json& j) { return "data: " + dump_json(j) + "\n\n"; }
  // A comment line, which SSE readers skip: sent while a request waits with nothing to say, so
  // that a client that has gone is noticed (the write fails).
  static constexpr const char* kKeepAlive = ": keep-alive\n\n";
  static constexpr const char* kDone = "data: [DONE]\n\n";

 private:
  ResponseMeta meta_;
  bool include_usage_ = false;
};

}  // namespace dhs::server
