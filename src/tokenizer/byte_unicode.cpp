// GPT-2 byte <-> character map (see byte_unicode.h).
#include "tokenizer/byte_unicode.h"

#include <array>

#include "core/utf8.h"

namespace dhs {
namespace {

constexpr bool keeps_code_point(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct ByteMap {
  std::array<std::string, 256> to_text;
  std::array<char32_t, 256> to_cp{};
  std::array<int, 512> from_cp{};  // every mapped code point is < 0x144

  ByteMap() {
    from_cp.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = keeps_code_point(b) ? static_cast<char32_t>(b) : next++;
      to_cp[b] = cp;
      from_cp[cp] = b;
      utf8::append(to_text[b], cp);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

}  // namespace

const std::string& byte_to_unicode(unsigned char b) { return byte_map().to_text[b]; }

int unicode_to_byte(char32_t cp) {
  return cp < byte_map().from_cp.size() ? byte_map().from_cp[cp] : -1;
}

std::string byte_level_decode(std::string_view token_text) {
  std::string out;
  out.reserve(token_text.size());
  for (size_t i = 0; i < token_text.size();) {
    const utf8::Decoded d = utf8::decode(token_text, i);
    const int b = d.status == utf8::Status::Ok ? unicode_to_byte(d.cp) : -1;
    if (b >= 0) {
      out += static_cast<char>(b);
    } else {
      out.append(token_text.substr(i, d.len));
    }
    i += d.len;
  }
  return out;
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += byte_to_unicode(b);
  return out;
}

}  // namespace dhs
