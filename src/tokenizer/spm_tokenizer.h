// SentencePiece-style BPE (Llama-2, Mistral): spaces become "▁", a "▁" is prefixed to
// the text, and the characters merge by rank: the merges list of a tokenizer.json,
// or for GGUF (which has no merges) the score of the merged piece. Characters missing
// from the vocabulary fall back to their UTF-8 bytes as <0xNN> tokens.
#pragma once
#include <array>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/bpe_merges.h"
#include "tokenizer/tokenizer_base.h"

namespace dhs {

// Which text fragments (the text between added tokens) get the "▁" prefix.
enum class SpacePrefix {
  Never,
  First,   // only a fragment at the very start of the text (HF Metaspace "first")
  Always,  // every fragment (legacy Llama/Mistral tokenizer.json, llama.cpp)
};

struct SentencePieceSpec {
  Vocab vocab;
  // Either merges (tokenizer.json, best first) or scores (GGUF: one per token).
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<float> scores;
  std::vector<AddedToken> added;
  SpacePrefix prefix = SpacePrefix::Always;
  // Legacy normalizer Prepend("▁") also prefixes text that starts with a space
  // (" a" -> "▁▁a"); Metaspace does not (" a" -> "▁a").
  bool prefix_before_space = true;
  bool split_words = false;  // Metaspace split: every "▁" starts a new word
  bool byte_fallback = true;
  int32_t unk_id = -1;
  bool fuse_unk = true;  // consecutive unknowns become one <unk>
};

class SentencePieceTokenizer final : public TokenizerBase {
 public:
  explicit SentencePieceTokenizer(SentencePieceSpec spec);

  TokenizerKind kind() const override { return TokenizerKind::SentencePieceBpe; }
  std::string kind_name() const override { return "SentencePiece BPE"; }

 private:
  void encode_text(std::string_view text, size_t offset, std::vector<int32_t>& out) const override;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  BpeMerges merges_;
  SpacePrefix prefix_;
  bool prefix_before_space_;
  bool split_words_;
  bool byte_fallback_;
  int32_t unk_id_;
  bool fuse_unk_;
  std::array<int32_t, 256> byte_ids_{};  // <0xNN> token ids, -1 where missing
};

}  // namespace dhs
