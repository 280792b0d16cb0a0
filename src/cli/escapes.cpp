// Hand-written because no maintained Debian package does this: CLI11 unescapes only
// inside its config files, fmt and nlohmann-json only format or parse JSON strings.
#include "cli/escapes.h"

#include <cstdint>
#include <optional>

#include "core/utf8.h"

namespace dhs::cli {

namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Exactly n hex digits at in[pos...], or nothing.
std::optional<uint32_t> hex_digits(std::string_view in, size_t pos, size_t n) {
  if (pos + n > in.size()) return std::nullopt;
  uint32_t v = 0;
  for (size_t i = 0; i < n; ++i) {
    const int d = hex_value(in[pos + i]);
    if (d < 0) return std::nullopt;
    v = v * 16 + static_cast<uint32_t>(d);
  }
  return v;
}

bool is_high_surrogate(uint32_t cp) { return cp >= 0xD800 && cp <= 0xDBFF; }
bool is_low_surrogate(uint32_t cp) { return cp >= 0xDC00 && cp <= 0xDFFF; }

// The escape starting at in[i] == '\\': appends its meaning to out and returns the
// number of input characters it used, or 0 when it is not one we know (kept verbatim).
size_t one_escape(std::string_view in, size_t i, std::string& out) {
  if (i + 1 >= in.size()) return 0;
  switch (in[i + 1]) {
    case 'n': out += '\n'; return 2;
    case 't': out += '\t'; return 2;
    case 'r': out += '\r'; return 2;
    case 'a': out += '\a'; return 2;
    case 'b': out += '\b'; return 2;
    case 'f': out += '\f'; return 2;
    case 'v': out += '\v'; return 2;
    case '\\': out += '\\'; return 2;
    case '"': out += '"'; return 2;
    case '\'': out += '\''; return 2;
    case '?': out += '?'; return 2;
    case 'x': {
      // One or two digits, as llama.cpp (C would take any number, which makes "\x41BC" surprising).
      if (const auto two = hex_digits(in, i + 2, 2)) {
        out += static_cast<char>(*two);
        return 4;
      }
      if (const auto one = hex_digits(in, i + 2, 1)) {
        out += static_cast<char>(*one);
        return 3;
      }
      return 0;
    }
    case 'u': {
      const auto cp = hex_digits(in, i + 2, 4);
      if (!cp || is_low_surrogate(*cp)) return 0;
      if (!is_high_surrogate(*cp)) {
        utf8::append(out, *cp);
        return 6;
      }
      // A surrogate pair, as JSON and JavaScript write astral characters.
      if (i + 7 < in.size() && in[i + 6] == '\\' && in[i + 7] == 'u') {
        const auto lo = hex_digits(in, i + 8, 4);
        if (lo && is_low_surrogate(*lo)) {
          utf8::append(out, 0x10000 + ((*cp - 0xD800) << 10) + (*lo - 0xDC00));
          return 12;
        }
      }
      return 0;
    }
    case 'U': {
      const auto cp = hex_digits(in, i + 2, 8);
      if (!cp || *cp > 0x10FFFF || is_high_surrogate(*cp) || is_low_surrogate(*cp)) return 0;
      utf8::append(out, *cp);
      return 10;
    }
    default: return 0;
  }
}

}  // namespace

std::string process_escapes(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size();) {
    if (in[i] == '\\') {
      if (const size_t used = one_escape(in, i, out)) {
        i += used;
        continue;
      }
    }
    out += in[i++];
  }
  return out;
}

}  // namespace dhs::cli
