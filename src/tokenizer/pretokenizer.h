// Pre-tokenization for byte-level BPE: a sequence of regex splits (PCRE2 in UTF +
// UCP mode, JIT-compiled) that cuts text into words before BPE, in the semantics of
// HF tokenizers' Split / Digits / ByteLevel pre-tokenizers. The named presets map
// GGUF's tokenizer.ggml.pre values.
#pragma once
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dhs {

// What happens to the regex matches of one split step (HF's SplitDelimiterBehavior).
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// A compiled PCRE2 pattern; thread-safe to share (match data is per thread).
class Regex {
 public:
  // Throws dhs::Error with PCRE2's message and offset on a bad pattern.
  Regex(const std::string& pattern, bool literal);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Byte ranges [begin, end) of the non-empty, non-overlapping matches, left to right.
  // Invalid UTF-8 in `text` never matches (it falls between matches).
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8*
};

class PreTokenizer {
 public:
  // The regex of GPT-2's ByteLevel pre-tokenizer (also HF's ByteLevel use_regex).
  static const char* const kGpt2Pattern;
  static const char* const kLlama3Pattern;
  static const char* const kQwen2Pattern;

  // Preset for a GGUF tokenizer.ggml.pre value; throws dhs::Error naming the
  // supported values for an unknown one.
  static PreTokenizer from_gguf_pre(const std::string& pre);

  void add_split(const std::string& pattern, bool literal, SplitBehavior behavior, bool invert);
  // HF Digits: every digit its own word (individual) or runs of digits.
  void add_digits(bool individual);
  // HF ByteLevel: optional space before each word, then (use_regex) the GPT-2 split.
  void add_byte_level(bool add_prefix_space, bool use_regex);

  // Cuts `text` into words. Words are views into `text`, or into `arena` when a
  // step had to add a prefix space.
  void split(std::string_view text, std::vector<std::string_view>& words,
             std::deque<std::string>& arena) const;

 private:
  struct Step {
    std::shared_ptr<const Regex> regex;  // null: no split
    SplitBehavior behavior = SplitBehavior::Isolated;
    bool invert = false;
    bool prefix_space = false;
  };
  std::vector<Step> steps_;
};

}  // namespace dhs
