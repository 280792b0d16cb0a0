// UTF-8 decoding with the replacement rules of Unicode §3.9 (maximal subparts
// become one U+FFFD each). Used by the SentencePiece tokenizer to split text into
// characters, by StreamDecoder to emit only whole characters, and by the chat-template
// interpreter and the CLI's escapes to encode code points (hence core/, below both).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace dhs::utf8 {

enum class Status { Ok, Invalid, Truncated };

struct Decoded {
  char32_t cp = 0;  // valid only for Status::Ok
  int len = 1;      // bytes consumed: the sequence, or the invalid maximal subpart (>= 1)
  Status status = Status::Ok;
};

// Decodes the sequence that starts at s[i] (precondition: i < s.size()).
// Truncated: s ends inside a sequence that is valid so far (len = bytes present).
Decoded decode(std::string_view s, size_t i);

void append(std::string& out, char32_t cp);

// Appends `s` to `out` as valid UTF-8, each invalid maximal subpart replaced by U+FFFD.
// A truncated sequence at the end is replaced too when `final`; otherwise it is left
// out and its offset returned (s.size() when nothing is held back).
size_t append_sanitized(std::string& out, std::string_view s, bool final);

bool is_valid(std::string_view s);

}  // namespace dhs::utf8
