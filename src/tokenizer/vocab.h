// Token strings, their types and the string -> id index, shared by both BPE
// tokenizers. Types follow GGUF's tokenizer.ggml.token_type numbering.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dhs {

enum class TokenType : uint8_t {
  Normal = 1,
  Unknown = 2,
  Control = 3,      // special tokens: <|im_start|>, <s>, ...
  UserDefined = 4,  // added tokens that are not special: matched in text, never merged
  Unused = 5,
  Byte = 6,  // SentencePiece byte fallback <0xNN>
};

// Lets string-keyed unordered maps be searched with a string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

class Vocab {
 public:
  Vocab() = default;
  // Throws dhs::Error on size mismatch.
  Vocab(std::vector<std::string> tokens, std::vector<TokenType> types);

  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }
  bool valid(int32_t id) const { return id >= 0 && id < size(); }
  const std::string& text(int32_t id) const { return tokens_[id]; }
  TokenType type(int32_t id) const { return types_[id]; }
  void set_type(int32_t id, TokenType t) { types_[id] = t; }
  // Id of an exact vocabulary entry, -1 if absent. Duplicated strings map to the first id.
  int32_t find(std::string_view text) const;

 private:
  std::vector<std::string> tokens_;
  std::vector<TokenType> types_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> index_;
};

}  // namespace dhs
