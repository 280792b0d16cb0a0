// Added-token matching (see added_tokens.h).
#include "tokenizer/added_tokens.h"

#include <algorithm>

namespace dhs {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  std::erase_if(tokens_, [](const AddedToken& t) { return t.content.empty(); });
  std::stable_sort(tokens_.begin(), tokens_.end(), [](const AddedToken& a, const AddedToken& b) {
    return a.content.size() > b.content.size();
  });
  for (uint32_t i = 0; i < tokens_.size(); ++i)
    by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(i);
}

std::vector<Fragment> AddedTokenMatcher::split(std::string_view text, bool parse_special) const {
  std::vector<Fragment> out;
  size_t text_begin = 0;  // start of the pending plain-text fragment
  auto emit_text = [&](size_t end) {
    if (end > text_begin)
      out.push_back({text.substr(text_begin, end - text_begin), -1, text_begin});
  };
  for (size_t pos = 0; pos < text.size();) {
    const AddedToken* hit = nullptr;
    for (uint32_t idx : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      const AddedToken& t = tokens_[idx];
      if ((parse_special || !t.special) && text.substr(pos).starts_with(t.content)) {
        hit = &t;  // candidates are longest first
        break;
      }
    }
    if (!hit) {
      ++pos;
      continue;
    }
    size_t begin = pos, end = pos + hit->content.size();
    if (hit->lstrip)
      while (begin > text_begin && is_space(text[begin - 1])) --begin;
    if (hit->rstrip)
      while (end < text.size() && is_space(text[end])) ++end;
    emit_text(begin);
    out.push_back({text.substr(begin, end - begin), hit->id, begin});
    pos = text_begin = end;
  }
  emit_text(text.size());
  return out;
}

std::string AddedTokenMatcher::guard(std::string_view text) const {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    if (text.substr(pos).starts_with(kGuard)) {
      out += kGuard;
      out += kGuard;
      pos += kGuard.size();
      continue;
    }
    bool special_here = false;
    for (uint32_t idx : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      const AddedToken& t = tokens_[idx];
      if (t.special && text.substr(pos).starts_with(t.content)) {
        special_here = true;
        break;
      }
    }
    // One whole UTF-8 character (a guard inside one would corrupt it), then the guard.
    size_t n = 1;
    while (pos + n < text.size() && (static_cast<unsigned char>(text[pos + n]) & 0xC0) == 0x80) ++n;
    out.append(text.substr(pos, n));
    if (special_here) out += kGuard;
    pos += n;
  }
  return out;
}

std::string AddedTokenMatcher::unguard(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    if (!text.substr(pos).starts_with(kGuard)) {
      out += text[pos++];
      continue;
    }
    pos += kGuard.size();
    if (text.substr(pos).starts_with(kGuard)) {  // a doubled guard: the user's own U+E000
      out += kGuard;
      pos += kGuard.size();
    }
  }
  return out;
}

}  // namespace dhs
