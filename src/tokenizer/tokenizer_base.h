// What the two BPE tokenizers share: the vocabulary, added-token matching, the
// per-token decoded bytes, and bos/eos/stop-id setup from model metadata.
#pragma once
#include <string>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace dhs {

// Model-file facts about special tokens, gathered by the factories.
struct TokenizerMeta {
  int32_t bos_id = -1, eos_id = -1;
  bool add_bos = false;
  std::vector<int32_t> extra_stop_ids;  // e.g. GGUF tokenizer.ggml.eot_token_id
  std::string chat_template;
};

class TokenizerBase : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const final;
  std::string guard_text(std::string_view user_text) const final { return added_.guard(user_text); }
  std::vector<int32_t> encode_guarded(std::string_view text) const final;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const override;
  std::string decode_token(int32_t id, bool skip_special, bool at_start) const override;
  int32_t vocab_size() const override { return vocab_.size(); }
  std::string token_text(int32_t id) const override;
  int32_t token_id(std::string_view text) const override { return vocab_.find(text); }
  bool is_special(int32_t id) const override;

  // Sets bos/eos/add_bos/chat template; stop ids are eos, the extra ids, and the
  // special tokens named like an end of turn or text. Ids outside the vocabulary throw.
  void set_meta(const TokenizerMeta& meta);

 protected:
  // Encodes text that holds no added token; `offset`: where it starts in the whole input
  // (SentencePiece prefixes a space to the first piece only).
  virtual void encode_text(std::string_view text, size_t offset, std::vector<int32_t>& out) const = 0;

  // `bytes` holds what each token decodes to (set by the derived constructor);
  // `strip_leading_space_`: the first token not skipped loses one leading space.
  TokenizerBase(Vocab vocab, std::vector<AddedToken> added)
      : vocab_(std::move(vocab)), added_(std::move(added)) {}

  Vocab vocab_;
  AddedTokenMatcher added_;
  std::vector<std::string> bytes_;  // [vocab_size] decoded bytes per token
  bool strip_leading_space_ = false;
};

}  // namespace dhs
