// SseStream (sse_stream.h).
#include "server/sse_stream.h"

namespace dhs::server {

std::string SseStream::open() {
  if (meta_.endpoint != Endpoint::ChatCompletions) return "";
  return data(chunk_json(meta_, "", "", /*role=*/true, include_usage_));
}

std::string SseStream::events(const StreamUpdate& u) {
  std::string out;
  if (u.finished && u.finish_reason == "error") {
    if (!u.text.empty()) out += data(chunk_json(meta_, u.text, "", false, include_usage_));
    out += data(error_json(ApiError{500, u.error.empty() ? "the engine failed on this request" : u.error, ""}));
    return out + kDone;
  }
  if (!u.text.empty() || u.finished)
    out += data(chunk_json(meta_, u.text, u.finished ? u.finish_reason : "", false, include_usage_));
  if (u.finished) {
    if (include_usage_) out += data(usage_chunk_json(meta_, u.n_prompt, u.n_generated));
    out += kDone;
  }
  return out;
}

}  // namespace dhs::server
