// UTF-8 string helpers for the chat-template interpreter (see jinja_text.h).
// Case mapping is a table of the scripts chat content mostly uses; code points
// outside it keep their case (Python would map a few more, e.g. Armenian).
// Everything here runs in time linear in its input and allocates no more than its
// result (checked against the render's limits), since templates feed it user text.
#include "template/jinja_text.h"

#include <string.h>  // memmem

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "core/utf8.h"
#include "template/jinja_value.h"

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

namespace {
bool is_cont(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }
// Continuation bytes a lead byte announces (utf8_next's reading), 0 for none.
int lead_len(char c) {
  const auto b = static_cast<unsigned char>(c);
  if ((b & 0xE0) == 0xC0) return 1;
  if ((b & 0xF0) == 0xE0) return 2;
  if ((b & 0xF8) == 0xF0) return 3;
  return 0;
}
}  // namespace

size_t utf8_prev(std::string_view s, size_t e) {
  // The code point ending at e starts at the nearest non-continuation byte q within
  // three bytes back, if q's sequence is exactly that long; utf8_next would then have
  // read [q, e) as one code point (a lead byte is never inside another's sequence).
  // Otherwise the byte before e stands alone, as utf8_next reads invalid bytes.
  size_t q = e - 1;
  int k = 0;
  while (k < 3 && q > 0 && is_cont(s[q])) {
    --q;
    ++k;
  }
  if (k > 0 && !is_cont(s[q]) && lead_len(s[q]) == k) return q;
  return e - 1;
}

size_t utf8_byte_at(std::string_view s, int64_t idx) {
  size_t i = 0;
  if (idx >= 0) {
    for (int64_t k = 0; k < idx && i < s.size(); ++k) utf8_next(s, i);
    return i;
  }
  i = s.size();
  const uint64_t back = static_cast<uint64_t>(-(idx + 1)) + 1;  // -idx, even for INT64_MIN
  for (uint64_t k = 0; k < back && i > 0; ++k) i = utf8_prev(s, i);
  return i;
}

size_t find_sub(std::string_view hay, std::string_view needle, size_t from) {
  if (from > hay.size()) return std::string_view::npos;
  if (needle.empty()) return from;
  // glibc's memmem is linear time (two-way for long needles); std::string::find is
  // O(n*m) on inputs like needle "aaa...ab" in a haystack of "a"s.
  const void* p = memmem(hay.data() + from, hay.size() - from, needle.data(), needle.size());
  return p ? static_cast<size_t>(static_cast<const char*>(p) - hay.data()) : std::string_view::npos;
}

size_t rfind_sub(std::string_view hay, std::string_view needle) {
  // Short needles: the naive backward scan is at most 16 comparisons per byte.
  if (needle.size() <= 16) return hay.rfind(needle);
  const std::string rh(hay.rbegin(), hay.rend()), rn(needle.rbegin(), needle.rend());
  const size_t p = find_sub(rh, rn, 0);
  return p == std::string_view::npos ? p : hay.size() - p - needle.size();
}

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

// Calls f(k, prev, c, next, last) for each code point c of s (k its index), with its
// neighbours (0 at the ends): what case mapping needs, without decoding s into a
// vector four times its size.
template <class F>
void each_cp(std::string_view s, F&& f) {
  if (s.empty()) return;
  size_t i = 0;
  char32_t prev = 0, cur = utf8_next(s, i);
  for (size_t k = 0;; ++k) {
    const bool last = i >= s.size();
    const char32_t next = last ? 0 : utf8_next(s, i);
    f(k, prev, cur, next, last);
    if (last) return;
    prev = cur;
    cur = next;
  }
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

// Title case (str.title, str.capitalize): upper case except ß -> Ss.
void append_title(std::string& out, char32_t c) {
  if (c == 0xDF) {
    out += "Ss";
    return;
  }
  append_upper(out, c);
}

bool is_cased(char32_t c) { return lower_cp(c) != c || upper_cp(c) != c || c == 0xDF || c == 0x138 || c == 0x149; }

// Greek capital sigma lowers to final sigma at the end of a word (CPython's rule,
// simplified: preceded by a cased letter and not followed by one). k: index of c.
void append_lower_at(std::string& out, size_t k, char32_t prev, char32_t c, char32_t next, bool last) {
  if (c == 0x3A3) {
    const bool before = k > 0 && is_cased(prev);
    const bool after = !last && is_cased(next);
    utf8_append(out, before && !after ? 0x3C2 : 0x3C3);
    return;
  }
  utf8_append(out, lower_cp(c));
}

// The code points of strip(chars): a bitmap for ASCII, a sorted list for the rest.
// A linear search per stripped code point would make strip quadratic in a long
// `chars`, and building the set must stay about as cheap per byte as copying `chars`
// (what the render budget charges for it). The list is compacted as it grows, so it
// holds at most twice the distinct code points, not all of `chars`.
class CharSet {
 public:
  explicit CharSet(std::string_view chars) {
    size_t i = 0, compact_at = 4096;
    while (i < chars.size()) {
      const auto b = static_cast<unsigned char>(chars[i]);
      if (b < 0x80) {
        ascii_[b >> 6] |= uint64_t{1} << (b & 63);
        ++i;
        continue;
      }
      other_.push_back(utf8_next(chars, i));
      if (other_.size() >= compact_at) {
        compact();
        compact_at = std::max<size_t>(4096, 2 * other_.size());
      }
    }
    compact();
  }
  bool has(char32_t c) const {
    if (c < 0x80) return (ascii_[c >> 6] >> (c & 63)) & 1;
    return std::binary_search(other_.begin(), other_.end(), c);
  }

 private:
  void compact() {
    std::sort(other_.begin(), other_.end());
    other_.erase(std::unique(other_.begin(), other_.end()), other_.end());
  }
  uint64_t ascii_[2] = {0, 0};
  std::vector<char32_t> other_;
};

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
  std::optional<CharSet> set;
  if (chars) set.emplace(*chars);
  auto strip = [&](char32_t c) { return set ? set->has(c) : is_py_space(c); };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      size_t i = b;
      if (!strip(utf8_next(s, i))) break;
      b = i;
    }
  }
  if (right) {
    while (e > b) {
      const size_t p = utf8_prev(s, e);
      size_t i = p;
      if (!strip(utf8_next(s, i))) break;
      e = p;
    }
  }
  return std::string(s.substr(b, e - b));
}

std::vector<std::string> py_split(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw JinjaError("empty separator");
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t p = find_sub(s, *sep, start);
      if (p == std::string_view::npos) break;
      check_list_size(out.size() + 2, "split");
      out.emplace_back(s.substr(start, p - start));
      start = p + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  // Byte offset after the code point at i, and whether it is whitespace.
  auto space_at = [&](size_t i, size_t& next) {
    next = i;
    return is_py_space(utf8_next(s, next));
  };
  size_t k = 0, next = 0;
  while (true) {
    while (k < s.size() && space_at(k, next)) k = next;
    if (k == s.size()) break;
    check_list_size(out.size() + 1, "split");
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.emplace_back(s.substr(k));
      break;
    }
    size_t e = k;
    while (e < s.size() && !space_at(e, next)) e = next;
    out.emplace_back(s.substr(k, e - k));
    k = e;
  }
  return out;
}

std::vector<std::string> py_rsplit(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw JinjaError("empty separator");
    if (sep->size() > 16) {
      // Splitting from the right is splitting the reversed bytes from the left, in
      // linear time (a backward search per piece would be O(n*m) for long separators).
      const std::string rs(s.rbegin(), s.rend()), rsep(sep->rbegin(), sep->rend());
      out = py_split(rs, &rsep, maxsplit);
      for (auto& piece : out) std::reverse(piece.begin(), piece.end());
      std::reverse(out.begin(), out.end());
      return out;
    }
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t p = s.rfind(*sep, end - sep->size());
      if (p == std::string_view::npos) break;
      check_list_size(out.size() + 2, "rsplit");
      out.emplace_back(s.substr(p + sep->size(), end - p - sep->size()));
      end = p;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  // Byte offset of the code point ending at e, and whether it is whitespace.
  auto space_before = [&](size_t e, size_t& start) {
    start = utf8_prev(s, e);
    size_t i = start;
    return is_py_space(utf8_next(s, i));
  };
  size_t k = s.size(), start = 0;  // k: one past the last code point not yet split off
  while (true) {
    while (k > 0 && space_before(k, start)) k = start;
    if (k == 0) break;
    check_list_size(out.size() + 1, "rsplit");
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.emplace_back(s.substr(0, k));
      break;
    }
    size_t b = k;
    while (b > 0 && !space_before(b, start)) b = start;
    out.emplace_back(s.substr(b, k - b));
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
    check_list_size(out.size() + 2, "splitlines");
    out.emplace_back(s.substr(line_start, (keepends ? i : at) - line_start));
    line_start = i;
  }
  if (line_start < s.size()) out.emplace_back(s.substr(line_start));
  return out;
}

std::string py_replace(std::string_view s, std::string_view old_s, std::string_view new_s,
                       int64_t count) {
  // Count the replacements first, so the result's size is known before it is built.
  const uint64_t limit = count < 0 ? UINT64_MAX : static_cast<uint64_t>(count);
  uint64_t n = 0;
  if (old_s.empty()) {
    n = std::min<uint64_t>(limit, utf8_length(s) + 1);
  } else {
    for (size_t p = find_sub(s, old_s, 0); p != std::string_view::npos && n < limit;
         p = find_sub(s, old_s, p + old_s.size()))
      ++n;
  }
  if (new_s.size() > old_s.size())
    check_string_size(s.size() + checked_mul(n, new_s.size() - old_s.size(), "replace"), "replace");
  std::string out;
  out.reserve(s.size() + (new_s.size() > old_s.size() ? n * (new_s.size() - old_s.size()) : 0));
  if (old_s.empty()) {  // inserts `new` at every code point boundary, ends included
    uint64_t done = 0;
    size_t i = 0;
    while (true) {
      if (done < n) {
        out += new_s;
        ++done;
      }
      if (i >= s.size()) break;
      const size_t at = i;
      utf8_next(s, i);
      out += s.substr(at, i - at);
    }
    return out;
  }
  size_t start = 0;
  uint64_t done = 0;
  while (done < n) {
    const size_t p = find_sub(s, old_s, start);
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
  while ((p = find_sub(s, sub, p)) != std::string_view::npos) {
    ++n;
    p += sub.size();
  }
  return n;
}

// Case mapping at most doubles a string (an invalid byte is written back as a 2-byte
// code point; ß -> SS keeps the size): only inputs over half the limit need the
// growth checks.
std::string py_upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const bool may_overflow = s.size() > max_string_bytes() / 2;
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {  // ASCII, most text: no decoding
      const char c = s[i++];
      out += (c >= 'a' && c <= 'z') ? static_cast<char>(c - 32) : c;
      continue;
    }
    append_upper(out, utf8_next(s, i));
    if (may_overflow) check_growth(out, "upper");
  }
  return out;
}

std::string py_lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const bool may_overflow = s.size() > max_string_bytes() / 2;
  each_cp(s, [&](size_t k, char32_t prev, char32_t c, char32_t next, bool last) {
    if (c < 0x80) out += static_cast<char>((c >= 'A' && c <= 'Z') ? c + 32 : c);
    else append_lower_at(out, k, prev, c, next, last);
    if (may_overflow) check_growth(out, "lower");
  });
  return out;
}

std::string py_capitalize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const bool may_overflow = s.size() > max_string_bytes() / 2;
  each_cp(s, [&](size_t k, char32_t prev, char32_t c, char32_t next, bool last) {
    if (k == 0) append_title(out, c);
    else append_lower_at(out, k, prev, c, next, last);
    if (may_overflow) check_growth(out, "capitalize");
  });
  return out;
}

std::string py_title(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const bool may_overflow = s.size() > max_string_bytes() / 2;
  each_cp(s, [&](size_t k, char32_t prev, char32_t c, char32_t next, bool last) {
    if (k > 0 && is_cased(prev)) append_lower_at(out, k, prev, c, next, last);
    else append_title(out, c);
    if (may_overflow) check_growth(out, "title");
  });
  return out;
}

std::string py_center(std::string_view s, int64_t width, std::string_view fill) {
  const int64_t len = static_cast<int64_t>(utf8_length(s));
  if (len >= width) return std::string(s);
  const uint64_t marg = static_cast<uint64_t>(width - len);
  // The width comes from the template: size the result before building it.
  check_string_size(s.size() + checked_mul(marg, fill.size(), "center"), "center");
  const uint64_t left = marg / 2 + (marg & static_cast<uint64_t>(width) & 1);  // CPython's split of the padding
  std::string out;
  out.reserve(s.size() + marg * fill.size());
  for (uint64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (uint64_t i = 0; i < marg - left; ++i) out += fill;
  return out;
}

std::string jinja_title(std::string_view s) {
  // jinja2 splits on runs of [-\s({\[<] (kept as items) and title-cases each item:
  // first code point upper, the rest lower.
  auto is_sep = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_py_space(c);
  };
  std::string out;
  out.reserve(s.size());
  const bool may_overflow = s.size() > max_string_bytes() / 2;
  each_cp(s, [&](size_t k, char32_t prev, char32_t c, char32_t next, bool last) {
    if (k == 0 || is_sep(c) != is_sep(prev)) append_upper(out, c);  // first of a run
    else append_lower_at(out, k, prev, c, next, last);
    if (may_overflow) check_growth(out, "title");
  });
  return out;
}

std::string py_str_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  size_t i = 0;
  while (i < s.size()) {
    check_growth(out, "repr");  // escapes grow the text up to 6x
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
    check_growth(out, "escape");  // entities grow the text up to 5x
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
    check_growth(out, "tojson");  // escapes grow the text up to 12x
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
