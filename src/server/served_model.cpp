// ServedModel over an Engine (served_model.h).
#include "server/served_model.h"

namespace dhs::server {
namespace {

class EngineModel final : public ServedModel {
 public:
  explicit EngineModel(Engine& e) : e_(e) {}
  std::vector<int32_t> tokenize(const std::string& text, bool add_special) const override {
    return add_special ? e_.tokenize(text) : e_.tokenize_no_bos(text);
  }
  std::vector<int32_t> tokenize_chat(const std::vector<ChatMessage>& messages) const override {
    return e_.tokenize_chat(messages, /*add_generation_prompt=*/true);
  }
  std::string detokenize(const std::vector<int32_t>& ids) const override { return e_.detokenize(ids); }
  int32_t vocab_size() const override { return static_cast<int32_t>(e_.vocab_size()); }
  int64_t max_model_len() const override {
    const int64_t m = e_.scheduler().options().max_model_len;
    return m > 0 ? m : e_.max_context();
  }
  Scheduler& scheduler() override { return e_.scheduler(); }

 private:
  Engine& e_;
};

}  // namespace

std::unique_ptr<ServedModel> serve_engine(Engine& engine) { return std::make_unique<EngineModel>(engine); }

}  // namespace dhs::server
