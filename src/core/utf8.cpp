// UTF-8 decoding and sanitizing (see utf8.h).
#include "core/utf8.h"

namespace dhs::utf8 {

Decoded decode(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {b0, 1, Status::Ok};
  // Allowed range of the second byte and total length, by lead byte (Unicode Table 3-7).
  int n = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
  } else {
    return {0, 1, Status::Invalid};
  }
  char32_t cp = b0 & (0xFF >> (n + 1));
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) return {0, k, Status::Truncated};
    const auto b = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return {0, k, Status::Invalid};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, n, Status::Ok};
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

size_t append_sanitized(std::string& out, std::string_view s, bool final) {
  constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  size_t i = 0;
  while (i < s.size()) {
    const Decoded d = decode(s, i);
    if (d.status == Status::Ok) {
      out.append(s.substr(i, d.len));
    } else if (d.status == Status::Truncated && !final) {
      return i;
    } else {
      out += kReplacement;
    }
    i += d.len;
  }
  return s.size();
}

bool is_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const Decoded d = decode(s, i);
    if (d.status != Status::Ok) return false;
    i += d.len;
  }
  return true;
}

}  // namespace dhs::utf8
