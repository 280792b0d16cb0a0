// Shared tokenizer parts (see tokenizer_base.h).
#include "tokenizer/tokenizer_base.h"

#include <algorithm>

#include "core/error.h"

namespace dhs {

std::vector<int32_t> TokenizerBase::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  for (const Fragment& f : added_.split(text, parse_special)) {
    if (f.id >= 0) {
      out.push_back(f.id);
    } else {
      encode_text(f.text, f.offset, out);
    }
  }
  return out;
}

std::vector<int32_t> TokenizerBase::encode_guarded(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  // Guards break every special spelling that came from user text, so the split finds only
  // the template's own; the text between loses its guards before BPE.
  for (const Fragment& f : added_.split(text, /*parse_special=*/true)) {
    if (f.id >= 0) {
      out.push_back(f.id);
    } else {
      encode_text(AddedTokenMatcher::unguard(f.text), f.offset, out);
    }
  }
  return out;
}

std::string TokenizerBase::decode_token(int32_t id, bool skip_special, bool at_start) const {
  DHS_CHECK(vocab_.valid(id), "tokenizer: token id {} outside the vocabulary (size {})", id,
            vocab_.size());
  if (skip_special && is_special(id)) return {};
  const std::string& b = bytes_[id];
  if (at_start && strip_leading_space_ && !b.empty() && b[0] == ' ') return b.substr(1);
  return b;
}

std::string TokenizerBase::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  bool at_start = true;
  for (int32_t id : ids) {
    out += decode_token(id, skip_special, at_start);
    if (!(skip_special && is_special(id))) at_start = false;
  }
  return out;
}

std::string TokenizerBase::token_text(int32_t id) const {
  DHS_CHECK(vocab_.valid(id), "tokenizer: token id {} outside the vocabulary (size {})", id,
            vocab_.size());
  return vocab_.text(id);
}

bool TokenizerBase::is_special(int32_t id) const {
  if (!vocab_.valid(id)) return false;
  const TokenType t = vocab_.type(id);
  return t == TokenType::Control || t == TokenType::Unknown;
}

void TokenizerBase::set_meta(const TokenizerMeta& meta) {
  auto check = [&](int32_t id, const char* what) {
    DHS_CHECK(id == -1 || vocab_.valid(id), "tokenizer: {} id {} outside the vocabulary (size {})",
              what, id, vocab_.size());
  };
  check(meta.bos_id, "bos");
  check(meta.eos_id, "eos");
  bos_id_ = meta.bos_id;
  eos_id_ = meta.eos_id;
  add_bos_ = meta.add_bos && bos_id_ >= 0;
  chat_template_ = meta.chat_template;

  stop_ids_.clear();
  auto add_stop = [&](int32_t id) {
    if (id >= 0 && std::find(stop_ids_.begin(), stop_ids_.end(), id) == stop_ids_.end())
      stop_ids_.push_back(id);
  };
  add_stop(eos_id_);
  for (int32_t id : meta.extra_stop_ids) {
    check(id, "stop token");
    add_stop(id);
  }
  // End-of-turn / end-of-text markers of the common chat formats. Only special
  // tokens count: a plain vocabulary entry spelled "</s>" ends nothing.
  static const char* const kEndMarkers[] = {
      "<|im_end|>",    "<|eot_id|>", "<|eom_id|>",    "<|end_of_text|>",
      "<end_of_turn>", "</s>",       "<|endoftext|>", "<|end|>",
  };
  for (const char* name : kEndMarkers) {
    const int32_t id = vocab_.find(name);
    if (id >= 0 && id != bos_id_ && is_special(id)) add_stop(id);
  }
}

}  // namespace dhs
