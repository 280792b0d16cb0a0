// Vocabulary index (see vocab.h).
#include "tokenizer/vocab.h"

#include "core/error.h"

namespace dhs {

Vocab::Vocab(std::vector<std::string> tokens, std::vector<TokenType> types)
    : tokens_(std::move(tokens)), types_(std::move(types)) {
  DHS_CHECK(types_.size() == tokens_.size(), "tokenizer: {} tokens but {} token types",
            tokens_.size(), types_.size());
  DHS_CHECK(!tokens_.empty(), "tokenizer: empty vocabulary");
  index_.reserve(tokens_.size());
  for (size_t i = 0; i < tokens_.size(); ++i) index_.emplace(tokens_[i], static_cast<int32_t>(i));
}

int32_t Vocab::find(std::string_view text) const {
  const auto it = index_.find(text);
  return it == index_.end() ? -1 : it->second;
}

}  // namespace dhs
