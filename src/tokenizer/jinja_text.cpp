// UTF-8 string helpers for the chat-template interpreter (see jinja_text.h).
// Case mapping is a table of the scripts chat content mostly uses; code points
// outside it keep their case (Python would map a few more, e.g. Armenian).
#include "tokenizer/jinja_text.h"

#include "tokenizer/utf8.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/jinja_value.h"

namespace dhs::jinja {

char32_t utf8_next(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  auto cont = [&](size_t k) -> int {
    if (i + k >= s.size()) return -1;
    const auto b = static_cast<unsigned char>(s[i + k]);
    return (b & 0xC0) == 0x80 ? (b & 0x3F) : -1;
  };
  if (b0 < 0x80) {
    i += 1;
    return b0;
  }
  int n = 0;
  char32_t cp = 0;
  if ((b0 & 0xE0) == 0xC0) n = 1, cp = b0 & 0x1F;
  else if ((b0 & 0xF0) == 0xE0) n = 2, cp = b0 & 0x0F;
  else if ((b0 & 0xF8) == 0xF0) n = 3, cp = b0 & 0x07;
  for (int k = 1; k <= n; ++k) {
    const int c = cont(k);
    if (c < 0) {  // invalid sequence: pass the lead byte through on its own
      i += 1;
      return b0;
    }
    cp = (cp << 6) | static_cast<char32_t>(c);
  }
  if (n == 0) {
    i += 1;
    return b0;
  }
  i += n + 1;
  return cp;
}

void utf8_append(std::string& out, char32_t cp) { utf8::append(out, cp); }

std::vector<size_t> utf8_offsets(std::string_view s) {
  std::vector<size_t> offs;
  offs.reserve(s.size() + 1);
  size_t i = 0;
  while (i < s.size()) {
    offs.push_back(i);
    utf8_next(s, i);
  }
  offs.push_back(s.size());
  return offs;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0, i = 0;
  while (i < s.size()) {
    utf8_next(s, i);
    ++n;
  }
  return n;
}

bool is_py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace {

std::vector<char32_t> decode_all(std::string_view s) {
  std::vector<char32_t> out;
  size_t i = 0;
  while (i < s.size()) out.push_back(utf8_next(s, i));
  return out;
}

// Pairs laid out as (upper, lower) alternating from `first` to `last`.
bool in_alternating(char32_t c, char32_t first, char32_t last) { return c >= first && c <= last; }

// Single code point case maps; multi-code-point results are handled by the callers.
char32_t lower_cp(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 0x20;
  if (in_alternating(c, 0x100, 0x12F) || in_alternating(c, 0x132, 0x137) ||
      in_alternating(c, 0x14A, 0x177))
    return (c % 2 == 0) ? c + 1 : c;
  if (in_alternating(c, 0x139, 0x148) || in_alternating(c, 0x179, 0x17E))
    return (c % 2 == 1) ? c + 1 : c;
  if (c == 0x178) return 0xFF;
  if ((c >= 0x391 && c <= 0x3A9 && c != 0x3A2)) return c + 0x20;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 0x25;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 0x3F;
  if (c >= 0x410 && c <= 0x42F) return c + 0x20;
  if (c >= 0x400 && c <= 0x40F) return c + 0x50;
  if (in_alternating(c, 0x460, 0x481) || in_alternating(c, 0x48A, 0x4BF) ||
      in_alternating(c, 0x4D0, 0x4FF))
    return (c % 2 == 0) ? c + 1 : c;
  return c;
}

char32_t upper_cp(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 0x20;
  if (c == 0xFF) return 0x178;
  if (c == 0xB5) return 0x39C;
  if (in_alternating(c, 0x100, 0x12F) || in_alternating(c, 0x132, 0x137) ||
      in_alternating(c, 0x14A, 0x177))
    return (c % 2 == 1) ? c - 1 : c;
  if (in_alternating(c, 0x139, 0x148) || in_alternating(c, 0x179, 0x17E))
    return (c % 2 == 0) ? c - 1 : c;
  if (c == 0x131) return 'I';
  if (c == 0x17F) return 'S';
  if ((c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2)) return c - 0x20;
  if (c == 0x3C2) return 0x3A3;
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 0x25;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 0x3F;
  if (c >= 0x430 && c <= 0x44F) return c - 0x20;
  if (c >= 0x450 && c <= 0x45F) return c - 0x50;
  if (in_alternating(c, 0x460, 0x481) || in_alternating(c, 0x48A, 0x4BF) ||
      in_alternating(c, 0x4D0, 0x4FF))
    return (c % 2 == 1) ? c - 1 : c;
  return c;
}

void append_upper(std::string& out, char32_t c) {
  if (c == 0xDF) {  // ß -> SS
    out += "SS";
    return;
  }
  if (c == 0x149) {  // ŉ -> ʼN
    utf8_append(out, 0x2BC);
    out += 'N';
    return;
  }
  utf8_append(out, upper_cp(c));
}

bool is_cased(char32_t c) { return lower_cp(c) != c || upper_cp(c) != c || c == 0xDF || c == 0x138 || c == 0x149; }

// Greek capital sigma lowers to final sigma at the end of a word (CPython's rule,
// simplified: preceded by a cased letter and not followed by one).
void append_lower_at(std::string& out, const std::vector<char32_t>& cps, size_t k) {
  const char32_t c = cps[k];
  if (c == 0x3A3) {
    const bool before = k > 0 && is_cased(cps[k - 1]);
    const bool after = k + 1 < cps.size() && is_cased(cps[k + 1]);
    utf8_append(out, before && !after ? 0x3C2 : 0x3C3);
    return;
  }
  utf8_append(out, lower_cp(c));
}

bool in_chars(char32_t c, const std::vector<char32_t>& set) {
  return std::find(set.begin(), set.end(), c) != set.end();
}

}  // namespace

bool py_is_cased_upper(char32_t c) { return lower_cp(c) != c; }
bool py_is_cased_lower(char32_t c) { return upper_cp(c) != c || c == 0xDF || c == 0x138 || c == 0x149; }

bool py_is_alpha(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  if (is_cased(c)) return true;
  // Common uncased scripts: CJK, kana, Hangul, Arabic, Hebrew, Devanagari, Thai.
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3040 && c <= 0x30FF) ||
         (c >= 0xAC00 && c <= 0xD7A3) || (c >= 0x0620 && c <= 0x064A) ||
         (c >= 0x05D0 && c <= 0x05EA) || (c >= 0x0904 && c <= 0x0939) ||
         (c >= 0x0E01 && c <= 0x0E30) || c == 0xAA || c == 0xBA;
}

std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  const auto offs = utf8_offsets(s);
  const size_t n = offs.size() - 1;
  std::vector<char32_t> set;
  if (chars) set = decode_all(*chars);
  auto strip_at = [&](size_t k) {
    size_t i = offs[k];
    const char32_t c = utf8_next(s, i);
    return chars ? in_chars(c, set) : is_py_space(c);
  };
  size_t b = 0, e = n;
  if (left)
    while (b < e && strip_at(b)) ++b;
  if (right)
    while (e > b && strip_at(e - 1)) --e;
  return std::string(s.substr(offs[b], offs[e] - offs[b]));
}

std::vector<std::string> py_split(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw JinjaError("empty separator");
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t p = s.find(*sep, start);
      if (p == std::string_view::npos) break;
      out.emplace_back(s.substr(start, p - start));
      start = p + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  const auto offs = utf8_offsets(s);
  const size_t n = offs.size() - 1;
  auto space_at = [&](size_t k) {
    size_t i = offs[k];
    return is_py_space(utf8_next(s, i));
  };
  size_t k = 0;
  while (true) {
    while (k < n && space_at(k)) ++k;
    if (k == n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.emplace_back(s.substr(offs[k]));
      break;
    }
    size_t e = k;
    while (e < n && !space_at(e)) ++e;
    out.emplace_back(s.substr(offs[k], offs[e] - offs[k]));
    k = e;
  }
  return out;
}

std::vector<std::string> py_rsplit(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw JinjaError("empty separator");
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t p = s.rfind(*sep, end - sep->size());
      if (p == std::string_view::npos) break;
      out.emplace_back(s.substr(p + sep->size(), end - p - sep->size()));
      end = p;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  const auto offs = utf8_offsets(s);
  size_t k = offs.size() - 1;  // one past the last code point
  auto space_at = [&](size_t idx) {
    size_t i = offs[idx];
    return is_py_space(utf8_next(s, i));
  };
  while (true) {
    while (k > 0 && space_at(k - 1)) --k;
    if (k == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.emplace_back(s.substr(0, offs[k]));
      break;
    }
    size_t b = k;
    while (b > 0 && !space_at(b - 1)) --b;
    out.emplace_back(s.substr(offs[b], offs[k] - offs[b]));
    k = b;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> py_splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  size_t i = 0, line_start = 0;
  while (i < s.size()) {
    const size_t at = i;
    const char32_t c = utf8_next(s, i);
    const bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) ||
                     c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    if (c == '\r' && i < s.size() && s[i] == '\n') ++i;
    out.emplace_back(s.substr(line_start, (keepends ? i : at) - line_start));
    line_start = i;
  }
  if (line_start < s.size()) out.emplace_back(s.substr(line_start));
  return out;
}

std::string py_replace(std::string_view s, std::string_view old_s, std::string_view new_s,
                       int64_t count) {
  std::string out;
  if (old_s.empty()) {  // inserts `new` at every code point boundary, ends included
    const auto offs = utf8_offsets(s);
    int64_t done = 0;
    for (size_t k = 0; k < offs.size(); ++k) {
      if (count < 0 || done < count) {
        out += new_s;
        ++done;
      }
      if (k + 1 < offs.size()) out += s.substr(offs[k], offs[k + 1] - offs[k]);
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t p = s.find(old_s, start);
    if (p == std::string_view::npos) break;
    out += s.substr(start, p - start);
    out += new_s;
    start = p + old_s.size();
    ++done;
  }
  out += s.substr(start);
  return out;
}

int64_t py_count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(utf8_length(s)) + 1;
  int64_t n = 0;
  size_t p = 0;
  while ((p = s.find(sub, p)) != std::string_view::npos) {
    ++n;
    p += sub.size();
  }
  return n;
}

std::string py_upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) append_upper(out, utf8_next(s, i));
  return out;
}

std::string py_lower(std::string_view s) {
  const auto cps = decode_all(s);
  std::string out;
  out.reserve(s.size());
  for (size_t k = 0; k < cps.size(); ++k) append_lower_at(out, cps, k);
  return out;
}

std::string py_capitalize(std::string_view s) {
  const auto cps = decode_all(s);
  std::string out;
  for (size_t k = 0; k < cps.size(); ++k) {
    if (k == 0) append_upper(out, cps[k]);
    else append_lower_at(out, cps, k);
  }
  return out;
}

std::string py_title(std::string_view s) {
  const auto cps = decode_all(s);
  std::string out;
  bool prev_cased = false;
  for (size_t k = 0; k < cps.size(); ++k) {
    if (prev_cased) append_lower_at(out, cps, k);
    else append_upper(out, cps[k]);
    prev_cased = is_cased(cps[k]);
  }
  return out;
}

std::string py_center(std::string_view s, int64_t width, std::string_view fill) {
  const int64_t len = static_cast<int64_t>(utf8_length(s));
  if (len >= width) return std::string(s);
  const int64_t marg = width - len;
  const int64_t left = marg / 2 + (marg & width & 1);  // CPython's split of the padding
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < marg - left; ++i) out += fill;
  return out;
}

std::string jinja_title(std::string_view s) {
  // jinja2 splits on runs of [-\s({\[<] (kept as items) and title-cases each item:
  // first code point upper, the rest lower.
  const auto cps = decode_all(s);
  auto is_sep = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_py_space(c);
  };
  std::string out;
  size_t k = 0;
  while (k < cps.size()) {
    const bool sep = is_sep(cps[k]);
    size_t e = k;
    while (e < cps.size() && is_sep(cps[e]) == sep) ++e;
    for (size_t j = k; j < e; ++j) {
      if (j == k) append_upper(out, cps[j]);
      else append_lower_at(out, cps, j);
    }
    k = e;
  }
  return out;
}

std::string py_str_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  size_t i = 0;
  while (i < s.size()) {
    const char32_t c = utf8_next(s, i);
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<char32_t>(quote)) (out += '\\') += quote;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) out += fmt::format("\\x{:02x}", static_cast<uint32_t>(c));
    else if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
             (c >= 0x205F && c <= 0x2064) || c == 0x3000 || c == 0xFEFF || (c >= 0xD800 && c <= 0xDFFF))
      out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
    else utf8_append(out, c);
  }
  out += quote;
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

void json_quote(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    const size_t at = i;
    const char32_t c = utf8_next(s, i);
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
    } else if (c >= 0x80 && ensure_ascii) {
      if (c >= 0x10000) {
        const uint32_t v = static_cast<uint32_t>(c) - 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
      }
    } else {
      out += s.substr(at, i - at);
    }
  }
  out += '"';
}

}  // namespace dhs::jinja
