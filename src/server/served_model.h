// What the HTTP front end needs from a loaded model: tokenization, the context limit and the
// continuous-batching scheduler. An Engine gives it through serve_engine(); tests and the HTTP
// probe (bench/http_probe) give a fake one, so the transport is measured without a model.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dhisparse/engine.h"
#include "dhisparse/scheduler.h"

namespace dhs::server {

class ServedModel {
 public:
  virtual ~ServedModel() = default;
  // Text -> ids as a completion prompt is read: special-token spellings parsed, BOS where the
  // model wants it (add_special false: neither).
  virtual std::vector<int32_t> tokenize(const std::string& text, bool add_special) const = 0;
  // Chat messages rendered by the chat template, message text read as plain text.
  virtual std::vector<int32_t> tokenize_chat(const std::vector<ChatMessage>& messages) const = 0;
  // Ids -> text. Precondition: every id in [0, vocab_size()).
  virtual std::string detokenize(const std::vector<int32_t>& ids) const = 0;
  virtual int32_t vocab_size() const = 0;
  // Prompt + generated tokens a request may hold.
  virtual int64_t max_model_len() const = 0;
  virtual Scheduler& scheduler() = 0;
};

// The engine must outlive the result.
std::unique_ptr<ServedModel> serve_engine(Engine& engine);

}  // namespace dhs::server
