// Byte-level BPE (GPT-2 family: SmolLM, Llama-3, Qwen2): added tokens are cut out,
// the rest is split into words by the pre-tokenizer, each word's bytes become their
// GPT-2 characters and merge by rank. Words are cached: text repeats words a lot.
#pragma once
#include <array>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/bpe_merges.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer_base.h"

namespace dhs {

struct ByteLevelBpeSpec {
  Vocab vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // vocabulary spellings, best first
  std::vector<AddedToken> added;
  PreTokenizer pre;
  std::string pre_name;        // for kind_name(): "smollm", "llama-bpe", "tokenizer.json"
  bool ignore_merges = false;  // HF: a word that is a vocabulary entry is taken whole (Llama-3)
};

class ByteLevelBpeTokenizer final : public TokenizerBase {
 public:
  explicit ByteLevelBpeTokenizer(ByteLevelBpeSpec spec);

  TokenizerKind kind() const override { return TokenizerKind::ByteLevelBpe; }
  std::string kind_name() const override { return "byte-level BPE (" + pre_name_ + ")"; }

 private:
  void encode_text(std::string_view text, size_t offset, std::vector<int32_t>& out) const override;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  BpeMerges merges_;
  PreTokenizer pre_;
  std::string pre_name_;
  bool ignore_merges_;
  std::array<int32_t, 256> byte_ids_{};  // id of each byte's one-character token, -1 if none

  static constexpr size_t kMaxCacheEntries = 1 << 16;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>>
      cache_;  // word bytes -> ids
};

}  // namespace dhs
