// Text <-> token ids. Two algorithms behind one type:
//  - byte-level BPE (GPT-2 / Llama-3 / Qwen2 / SmolLM pre-tokenizers via PCRE2),
//  - SentencePiece-style BPE over scores (Llama-2-style GGUF vocabularies, byte fallback).
// Special / added tokens are matched before pre-tokenization.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dhs {
namespace gguf { class GgufFile; }

enum class TokenizerKind { ByteLevelBpe, SentencePieceBpe };

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // From GGUF metadata (tokenizer.ggml.*). Throws dhs::Error on missing/invalid data.
  static std::unique_ptr<Tokenizer> from_gguf(const gguf::GgufFile& f);
  // From a HF tokenizer.json (+ optional tokenizer_config.json, may be "").
  static std::unique_ptr<Tokenizer> from_hf_files(const std::string& tokenizer_json_path,
                                                  const std::string& tokenizer_config_path);

  // Encodes text. With parse_special, special/added tokens written in the text
  // ("<|im_start|>") become their ids; otherwise they are encoded as plain text.
  // Never adds BOS: callers add bos_id() when add_bos() says so.
  virtual std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const = 0;
  // User text that will be rendered into a template (chat message content, roles): every
  // spelling of a special token in it is broken by an invisible guard, so encode_guarded()
  // reads it as plain text. Text without such spellings comes back unchanged (a literal
  // U+E000, the guard's character, comes back doubled).
  virtual std::string guard_text(std::string_view user_text) const = 0;
  // Encodes a rendered template into which user strings went through guard_text():
  // special tokens are parsed only where the template itself wrote them; the guards vanish.
  // Without guards this equals encode(text, /*parse_special=*/true).
  virtual std::vector<int32_t> encode_guarded(std::string_view text) const = 0;
  // Concatenated bytes of the tokens (special tokens rendered as their text
  // unless skip_special). May end inside a UTF-8 character.
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;

  virtual TokenizerKind kind() const = 0;
  virtual std::string kind_name() const = 0;  // e.g. "byte-level BPE (smollm)"
  virtual int32_t vocab_size() const = 0;
  virtual std::string token_text(int32_t id) const = 0;  // raw vocabulary entry
  virtual int32_t token_id(std::string_view text) const = 0;  // exact vocabulary entry, -1 if absent
  // Bytes of one token as decode() renders them. `at_start`: this is the first token
  // not skipped (SentencePiece drops the space it prefixed to the text there). Empty for
  // a special token when skip_special. Throws dhs::Error for an id outside the vocabulary.
  virtual std::string decode_token(int32_t id, bool skip_special, bool at_start) const = 0;
  virtual bool is_special(int32_t id) const = 0;
  int32_t bos_id() const { return bos_id_; }  // -1 if none
  int32_t eos_id() const { return eos_id_; }  // -1 if none
  bool add_bos() const { return add_bos_; }
  // Ids that end generation: eos plus end-of-turn tokens (<|eot_id|>, <|im_end|>, ...).
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  // Chat template from the model files ("" if none).
  const std::string& chat_template() const { return chat_template_; }

 protected:
  int32_t bos_id_ = -1, eos_id_ = -1;
  bool add_bos_ = false;
  std::vector<int32_t> stop_ids_;
  std::string chat_template_;
};

// Incremental detokenizer for streaming: push ids, get text that is safe to
// print (never half a UTF-8 character); flush() returns what is left.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = true)
      : tok_(tok), skip_special_(skip_special) {}
  std::string push(int32_t id);
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;  // bytes of an incomplete UTF-8 sequence
  bool at_start_ = true;  // no token taken yet (see Tokenizer::decode_token)
};

}  // namespace dhs
