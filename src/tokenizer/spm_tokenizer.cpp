// SentencePiece-style BPE tokenizer (see spm_tokenizer.h).
#include "tokenizer/spm_tokenizer.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/utf8.h"

namespace dhs {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581 "▁"

bool mergeable(TokenType t) { return t == TokenType::Normal || t == TokenType::UserDefined; }

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(SentencePieceSpec spec)
    : TokenizerBase(std::move(spec.vocab), std::move(spec.added)),
      prefix_(spec.prefix),
      prefix_before_space_(spec.prefix_before_space),
      split_words_(spec.split_words),
      byte_fallback_(spec.byte_fallback),
      unk_id_(spec.unk_id),
      fuse_unk_(spec.fuse_unk) {
  DHS_CHECK(unk_id_ == -1 || vocab_.valid(unk_id_), "tokenizer: unknown-token id {} out of range",
            unk_id_);
  for (int b = 0; b < 256; ++b) byte_ids_[b] = vocab_.find(fmt::format("<0x{:02X}>", b));

  if (!spec.merges.empty()) {
    merges_.reserve(spec.merges.size());
    int32_t rank = 0;
    for (const auto& [a, b] : spec.merges) {
      const int32_t ia = vocab_.find(a), ib = vocab_.find(b), im = vocab_.find(a + b);
      if (ia >= 0 && ib >= 0 && im >= 0) merges_.add(ia, ib, im, rank);
      ++rank;
    }
  } else {
    // No merges list (GGUF): any split of a piece into two pieces is a merge, ranked by
    // the merged piece's score, higher first; equal scores go by id, the order the
    // tokenizer.json converters write merges in.
    DHS_CHECK(spec.scores.size() == static_cast<size_t>(vocab_.size()),
              "tokenizer: {} scores for {} tokens", spec.scores.size(), vocab_.size());
    std::vector<int32_t> order(vocab_.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return spec.scores[a] > spec.scores[b]; });
    std::vector<int32_t> rank(vocab_.size());
    for (int32_t r = 0; r < vocab_.size(); ++r) rank[order[r]] = r;
    for (int32_t id = 0; id < vocab_.size(); ++id) {
      if (!mergeable(vocab_.type(id))) continue;
      const std::string& t = vocab_.text(id);
      for (size_t k = utf8::decode(t, 0).len; k < t.size(); k += utf8::decode(t, k).len) {
        const int32_t ia = vocab_.find(std::string_view(t).substr(0, k));
        const int32_t ib = vocab_.find(std::string_view(t).substr(k));
        if (ia >= 0 && ib >= 0 && mergeable(vocab_.type(ia)) && mergeable(vocab_.type(ib)))
          merges_.add(ia, ib, id, rank[id]);
      }
    }
  }

  bytes_.resize(vocab_.size());
  for (int32_t id = 0; id < vocab_.size(); ++id) {
    const std::string& t = vocab_.text(id);
    std::string& out = bytes_[id];
    for (size_t i = 0; i < t.size();) {
      if (t.compare(i, kSpace.size(), kSpace) == 0) {
        out += ' ';
        i += kSpace.size();
      } else {
        out += t[i++];
      }
    }
  }
  if (byte_fallback_) {
    for (int b = 0; b < 256; ++b)
      if (byte_ids_[b] >= 0) bytes_[byte_ids_[b]] = std::string(1, static_cast<char>(b));
  }
  strip_leading_space_ = prefix_ != SpacePrefix::Never;
}

void SentencePieceTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  std::vector<int32_t> syms;
  syms.reserve(word.size());
  bool prev_unk = false;
  for (size_t i = 0; i < word.size();) {
    const utf8::Decoded d = utf8::decode(word, i);
    const size_t len = d.status == utf8::Status::Ok ? d.len : 1;  // bad bytes go one by one
    const std::string_view ch = word.substr(i, len);
    i += len;
    if (const int32_t id = vocab_.find(ch); id >= 0) {
      syms.push_back(id);
      prev_unk = false;
      continue;
    }
    if (byte_fallback_ && std::all_of(ch.begin(), ch.end(), [&](char c) {
          return byte_ids_[static_cast<unsigned char>(c)] >= 0;
        })) {
      for (char c : ch) syms.push_back(byte_ids_[static_cast<unsigned char>(c)]);
      prev_unk = false;
      continue;
    }
    if (unk_id_ >= 0 && !(fuse_unk_ && prev_unk)) syms.push_back(unk_id_);
    prev_unk = unk_id_ >= 0;
  }
  merges_.apply(syms);
  out.insert(out.end(), syms.begin(), syms.end());
}

void SentencePieceTokenizer::encode_text(std::string_view text, size_t offset,
                                         std::vector<int32_t>& out) const {
  bool prefix = prefix_ == SpacePrefix::Always || (prefix_ == SpacePrefix::First && offset == 0);
  if (!prefix_before_space_ && text.starts_with(' ')) prefix = false;
  std::string norm;
  norm.reserve(text.size() + 8);
  if (prefix) norm += kSpace;
  for (char c : text) {
    if (c == ' ') {
      norm += kSpace;
    } else {
      norm += c;
    }
  }
  if (!split_words_) {
    encode_word(norm, out);
    return;
  }
  // Metaspace split: words begin at each "▁" (the "▁" stays with the word after it).
  const std::string_view s = norm;
  size_t begin = 0;
  for (size_t pos = s.find(kSpace, 1); pos != std::string_view::npos; pos = s.find(kSpace, pos + 1)) {
    if (pos > begin) encode_word(s.substr(begin, pos - begin), out);
    begin = pos;
  }
  encode_word(s.substr(begin), out);
}

}  // namespace dhs
