// Regex pre-tokenization (see pretokenizer.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <algorithm>

#include "core/error.h"

namespace dhs {
namespace {

pcre2_code* as_code(void* p) { return static_cast<pcre2_code*>(p); }

// Match data and a JIT stack per thread: compiled patterns are shared by all threads,
// these are not. The default 32 KiB JIT stack is too small for `\s+(?!\S)` on long
// runs of whitespace.
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  MatchScratch() { pcre2_jit_stack_assign(context, nullptr, jit_stack); }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

}  // namespace

Regex::Regex(const std::string& pattern, bool literal) {
  // UCP: \s, \p{L}, \d... use Unicode properties, as Oniguruma does in HF tokenizers.
  // MATCH_INVALID_UTF: text with invalid UTF-8 is matched around the bad bytes
  // instead of failing (byte-level BPE encodes any bytes).
  uint32_t options = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF;
  options |= literal ? PCRE2_LITERAL : PCRE2_UCP;
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &err, &err_offset, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    throw Error(fmt::format("tokenizer: bad pre-tokenizer regex at offset {}: {} (pattern: {})",
                            err_offset, reinterpret_cast<const char*>(msg), pattern));
  }
  pcre2_jit_compile(code,
                    PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(as_code(code_)); }

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  MatchScratch& s = scratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start < text.size()) {
    const int rc = pcre2_match(as_code(code_), subject, text.size(), start, 0, s.data, s.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      throw Error(
          fmt::format("tokenizer: regex match failed: {}", reinterpret_cast<const char*>(msg)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      start = e;
    } else {
      // Empty match: step over one character (never into the middle of one).
      start = b + 1;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80)
        ++start;
    }
  }
}

const char* const PreTokenizer::kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const PreTokenizer::kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const PreTokenizer::kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

PreTokenizer PreTokenizer::from_gguf_pre(const std::string& pre) {
  // Each preset is what the model's own tokenizer.json does: Llama-3 and Qwen2 split
  // with their regex and then apply ByteLevel without a regex; GPT-2-style models use
  // ByteLevel's own regex; StarCoder-family vocabularies (SmolLM) isolate every digit first.
  PreTokenizer p;
  if (pre == "default" || pre == "gpt2" || pre == "gpt-2" || pre == "olmo" || pre == "phi-2") {
    p.add_byte_level(false, true);
  } else if (pre == "llama-bpe" || pre == "llama3" || pre == "dbrx" || pre == "smaug-bpe") {
    p.add_split(kLlama3Pattern, false, SplitBehavior::Isolated, false);
  } else if (pre == "qwen2" || pre == "deepseek-r1-qwen") {
    p.add_split(kQwen2Pattern, false, SplitBehavior::Isolated, false);
  } else if (pre == "smollm" || pre == "starcoder" || pre == "refact") {
    p.add_digits(true);
    p.add_byte_level(false, true);
  } else {
    throw Error(fmt::format(
        "tokenizer: unsupported tokenizer.ggml.pre '{}' (supported: default, gpt2, gpt-2, olmo, "
        "phi-2, llama-bpe, llama3, dbrx, smaug-bpe, qwen2, deepseek-r1-qwen, smollm, starcoder, "
        "refact)",
        pre));
  }
  return p;
}

void PreTokenizer::add_split(const std::string& pattern, bool literal, SplitBehavior behavior,
                             bool invert) {
  steps_.push_back({std::make_shared<Regex>(pattern, literal), behavior, invert, false});
}

void PreTokenizer::add_digits(bool individual) {
  // \p{N} is Rust's char::is_numeric (Nd, Nl, No), which HF's Digits uses.
  steps_.push_back({std::make_shared<Regex>(R"(\p{N})", false),
                    individual ? SplitBehavior::Isolated : SplitBehavior::Contiguous, false,
                    false});
}

void PreTokenizer::add_byte_level(bool add_prefix_space, bool use_regex) {
  if (!add_prefix_space && !use_regex) return;  // only maps bytes, which the BPE model does
  Step s;
  if (use_regex) s.regex = std::make_shared<Regex>(kGpt2Pattern, false);
  s.prefix_space = add_prefix_space;
  steps_.push_back(std::move(s));
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& words,
                         std::deque<std::string>& arena) const {
  words.clear();
  if (text.empty()) return;
  words.push_back(text);
  std::vector<std::string_view> next;
  std::vector<std::pair<size_t, size_t>> matches;
  struct Segment {
    size_t begin, end;
    bool match;
  };
  std::vector<Segment> segs;

  for (const Step& step : steps_) {
    next.clear();
    for (std::string_view w : words) {
      // HF ByteLevel adds the space to every word it is given, not just the first.
      if (step.prefix_space && !w.starts_with(' ')) {
        std::string& spaced = arena.emplace_back(1, ' ');
        spaced += w;
        w = spaced;
      }
      if (!step.regex) {
        next.push_back(w);
        continue;
      }
      matches.clear();
      step.regex->find_all(w, matches);
      segs.clear();
      size_t pos = 0;
      for (auto [b, e] : matches) {
        if (b > pos) segs.push_back({pos, b, step.invert});
        segs.push_back({b, e, !step.invert});
        pos = e;
      }
      if (pos < w.size()) segs.push_back({pos, w.size(), step.invert});

      // Combine segments into words by the step's behavior; `out` holds [begin, end).
      std::vector<std::pair<size_t, size_t>> out;
      bool prev_match = false;
      switch (step.behavior) {
        case SplitBehavior::Removed:
          for (const Segment& s : segs)
            if (!s.match) out.emplace_back(s.begin, s.end);
          break;
        case SplitBehavior::Isolated:
          for (const Segment& s : segs) out.emplace_back(s.begin, s.end);
          break;
        case SplitBehavior::MergedWithPrevious:
          for (const Segment& s : segs) {
            if (s.match && !prev_match && !out.empty()) {
              out.back().second = s.end;
            } else {
              out.emplace_back(s.begin, s.end);
            }
            prev_match = s.match;
          }
          break;
        case SplitBehavior::MergedWithNext:
          for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
            if (it->match && !prev_match && !out.empty()) {
              out.back().first = it->begin;
            } else {
              out.emplace_back(it->begin, it->end);
            }
            prev_match = it->match;
          }
          std::reverse(out.begin(), out.end());
          break;
        case SplitBehavior::Contiguous:
          for (const Segment& s : segs) {
            if (s.match && prev_match) {
              out.back().second = s.end;
            } else {
              out.emplace_back(s.begin, s.end);
            }
            prev_match = s.match;
          }
          break;
      }
      for (auto [b, e] : out) next.push_back(w.substr(b, e - b));
    }
    words.swap(next);
  }
}

}  // namespace dhs
