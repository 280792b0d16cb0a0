// Byte-level BPE tokenizer (see bpe_tokenizer.h).
#include "tokenizer/bpe_tokenizer.h"

#include "core/error.h"
#include "tokenizer/byte_unicode.h"

namespace dhs {

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer(ByteLevelBpeSpec spec)
    : TokenizerBase(std::move(spec.vocab), std::move(spec.added)),
      pre_(std::move(spec.pre)),
      pre_name_(std::move(spec.pre_name)),
      ignore_merges_(spec.ignore_merges) {
  // Some vocabularies lack a few control bytes (SmolLM2 has no 0x04): like HF without
  // an unknown token, such bytes are dropped from the input.
  for (int b = 0; b < 256; ++b)
    byte_ids_[b] = vocab_.find(byte_to_unicode(static_cast<unsigned char>(b)));
  merges_.reserve(spec.merges.size());
  int32_t rank = 0;
  for (const auto& [a, b] : spec.merges) {
    const int32_t ia = vocab_.find(a), ib = vocab_.find(b), im = vocab_.find(a + b);
    // A merge whose parts or result are not in the vocabulary can never apply.
    if (ia >= 0 && ib >= 0 && im >= 0) merges_.add(ia, ib, im, rank);
    ++rank;
  }
  bytes_.resize(vocab_.size());
  for (int32_t id = 0; id < vocab_.size(); ++id) {
    const TokenType t = vocab_.type(id);
    // Added tokens are stored as their text, not in GPT-2 characters.
    const bool plain =
        t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown;
    bytes_[id] = plain ? vocab_.text(id) : byte_level_decode(vocab_.text(id));
  }
}

void ByteLevelBpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  {
    std::lock_guard lock(cache_mu_);
    if (const auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  const int32_t whole = ignore_merges_ ? vocab_.find(byte_level_encode(word)) : -1;
  if (whole >= 0) {
    ids.push_back(whole);
  } else {
    ids.reserve(word.size());
    for (unsigned char c : word)
      if (byte_ids_[c] >= 0) ids.push_back(byte_ids_[c]);
    merges_.apply(ids);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard lock(cache_mu_);
  if (cache_.size() >= kMaxCacheEntries) cache_.clear();
  cache_.emplace(word, std::move(ids));
}

void ByteLevelBpeTokenizer::encode_text(std::string_view text, size_t /*offset*/,
                                        std::vector<int32_t>& out) const {
  std::vector<std::string_view> words;
  std::deque<std::string> arena;
  pre_.split(text, words, arena);
  for (std::string_view w : words) encode_word(w, out);
}

}  // namespace dhs
