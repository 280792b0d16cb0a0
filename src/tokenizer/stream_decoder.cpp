// Streaming detokenization (see StreamDecoder in tokenizer.h): bytes of an
// incomplete UTF-8 character wait for the next token; invalid bytes become U+FFFD,
// so every returned chunk is valid UTF-8 on its own.
#include "tokenizer/tokenizer.h"
#include "core/utf8.h"

namespace dhs {

std::string StreamDecoder::push(int32_t id) {
  const std::string bytes = tok_.decode_token(id, skip_special_, at_start_);
  if (!(skip_special_ && tok_.is_special(id))) at_start_ = false;
  if (bytes.empty()) return {};
  pending_ += bytes;
  std::string out;
  pending_.erase(0, utf8::append_sanitized(out, pending_, /*final=*/false));
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  utf8::append_sanitized(out, pending_, /*final=*/true);
  pending_.clear();
  return out;
}

}  // namespace dhs
