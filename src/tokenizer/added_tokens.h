// Added tokens (special tokens like <|im_start|> and user-defined ones) are cut out
// of the text before pre-tokenization: leftmost, and longest among those starting at
// the same byte. The text between them goes on to the BPE model.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dhs {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = true;  // special tokens are matched only when parse_special
  bool lstrip = false;  // swallow whitespace on the left
  bool rstrip = false;  // swallow whitespace on the right
};

// A piece of the input: either plain text (id == -1) or one added token.
struct Fragment {
  std::string_view text;
  int32_t id = -1;
  size_t offset = 0;  // byte offset in the input
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  // Splits `text` into fragments; empty text fragments are dropped. Non-special
  // added tokens are always matched (as HF does); special ones only with parse_special.
  std::vector<Fragment> split(std::string_view text, bool parse_special) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

  // User text made safe to render into a template: a guard (kGuard) goes after the first
  // character of every occurrence of a special token, so split() cannot match it; a literal
  // kGuard is doubled. unguard() undoes both on any piece of the rendered text.
  // Left open: a special token that only a template's literal text completes around user
  // text (no real template writes a special token's tail right after a message).
  std::string guard(std::string_view user_text) const;
  static std::string unguard(std::string_view text);
  static constexpr std::string_view kGuard = "\xEE\x80\x80";  // U+E000, a private-use character

 private:
  std::vector<AddedToken> tokens_;                        // longest first
  std::array<std::vector<uint32_t>, 256> by_first_byte_;  // indices into tokens_
};

}  // namespace dhs
