// Tokenizer building blocks checked on their own: UTF-8 handling, the GPT-2 byte
// map, the merge loop (heap path against a plain rescanning loop), pre-tokenizer
// splits and added-token matching.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "core/utf8.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_merges.h"
#include "tokenizer/byte_unicode.h"
#include "tokenizer/pretokenizer.h"

namespace dhs {
namespace {

std::string sanitize(std::string_view s, bool final, size_t* held = nullptr) {
  std::string out;
  const size_t used = utf8::append_sanitized(out, s, final);
  if (held) *held = s.size() - used;
  return out;
}

TEST(TokenizerUtf8, DecodesAndClassifies) {
  EXPECT_EQ(utf8::decode("A", 0).cp, U'A');
  const utf8::Decoded robot = utf8::decode("\xF0\x9F\xA4\x96", 0);
  EXPECT_EQ(robot.status, utf8::Status::Ok);
  EXPECT_EQ(robot.cp, U'\U0001F916');
  EXPECT_EQ(robot.len, 4);
  EXPECT_EQ(utf8::decode("\xF0\x9F\xA4", 0).status, utf8::Status::Truncated);
  EXPECT_EQ(utf8::decode("\xC0\xAF", 0).status, utf8::Status::Invalid);      // overlong
  EXPECT_EQ(utf8::decode("\xED\xA0\x80", 0).status, utf8::Status::Invalid);  // surrogate
  EXPECT_EQ(utf8::decode("\xF4\x90\x80\x80", 0).status, utf8::Status::Invalid);
  EXPECT_EQ(utf8::decode("\xE2\x28\xA1", 0).len, 1);  // maximal subpart is the lead byte
}

TEST(TokenizerUtf8, SanitizeHoldsBackTruncatedTail) {
  size_t held = 0;
  EXPECT_EQ(sanitize("ab\xE4\xBD", false, &held), "ab");
  EXPECT_EQ(held, 2u);
  EXPECT_EQ(sanitize("ab\xE4\xBD", true), "ab\xEF\xBF\xBD");
  // Invalid bytes in the middle never wait: one U+FFFD per maximal subpart.
  EXPECT_EQ(sanitize("a\xFF"
                     "b\xE0\x80",
                     false),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_TRUE(utf8::is_valid("h\xC3\xA9llo \xE4\xBD\xA0"));
  EXPECT_FALSE(utf8::is_valid("\xC3"));
}

TEST(TokenizerByteMap, IsGpt2sAndReversible) {
  EXPECT_EQ(byte_to_unicode(' '), "\xC4\xA0");   // Ġ
  EXPECT_EQ(byte_to_unicode('\n'), "\xC4\x8A");  // Ċ
  EXPECT_EQ(byte_to_unicode('a'), "a");
  EXPECT_EQ(byte_to_unicode(0xAD), "\xC5\x83");  // soft hyphen is remapped, not kept
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  EXPECT_EQ(byte_level_decode(byte_level_encode(all)), all);
  EXPECT_EQ(unicode_to_byte(U'\u0120'), ' ');
  EXPECT_EQ(unicode_to_byte(U'\u4F60'), -1);
}

// The plain definition of BPE: merge the best-ranked adjacent pair, leftmost first.
std::vector<int32_t> naive_bpe(std::vector<int32_t> s,
                               const std::map<std::pair<int, int>, std::pair<int, int>>& m) {
  for (;;) {
    int best = -1, best_rank = 0;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const auto it = m.find({s[i], s[i + 1]});
      if (it != m.end() && (best < 0 || it->second.first < best_rank)) {
        best = static_cast<int>(i);
        best_rank = it->second.first;
      }
    }
    if (best < 0) return s;
    s[best] = m.at({s[best], s[best + 1]}).second;
    s.erase(s.begin() + best + 1);
  }
}

TEST(TokenizerBpeMerges, MatchesPlainLoopOnRandomWords) {
  // Alphabet 0..3; merges create ids 4.. with random ranks, some ranks shared so the
  // leftmost rule matters. Word lengths cross the short/heap threshold.
  std::mt19937 rng(17);
  std::map<std::pair<int, int>, std::pair<int, int>> table;
  BpeMerges merges;
  int next_id = 4;
  for (int i = 0; i < 40; ++i) {
    const int a = static_cast<int>(rng() % next_id), b = static_cast<int>(rng() % next_id);
    const int rank = static_cast<int>(rng() % 25);
    if (table.count({a, b})) continue;
    table[{a, b}] = {rank, next_id};
    merges.add(a, b, next_id, rank);
    ++next_id;
  }
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int32_t> word(1 + rng() % 97);
    for (auto& s : word) s = static_cast<int32_t>(rng() % 4);
    std::vector<int32_t> got = word;
    merges.apply(got);
    ASSERT_EQ(got, naive_bpe(word, table)) << "trial " << trial << " length " << word.size();
  }
}

std::vector<std::string> split(const PreTokenizer& p, std::string_view text) {
  std::vector<std::string_view> words;
  std::deque<std::string> arena;
  p.split(text, words, arena);
  return {words.begin(), words.end()};
}

using Words = std::vector<std::string>;

TEST(TokenizerPreTokenizer, Gpt2Regex) {
  const PreTokenizer p = PreTokenizer::from_gguf_pre("gpt2");
  EXPECT_EQ(split(p, "Hello world's  test 123!!\n"),
            (Words{"Hello", " world", "'s", " ", " test", " 123", "!!", "\n"}));
  EXPECT_EQ(split(p, "caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD"),
            (Words{"caf\xC3\xA9", " \xE4\xBD\xA0\xE5\xA5\xBD"}));
  EXPECT_EQ(split(p, ""), Words{});
}

TEST(TokenizerPreTokenizer, SmolLmIsolatesDigits) {
  const PreTokenizer p = PreTokenizer::from_gguf_pre("smollm");
  EXPECT_EQ(split(p, "year 2024 ok"), (Words{"year", " ", "2", "0", "2", "4", " ok"}));
}

TEST(TokenizerPreTokenizer, Llama3GroupsDigitsByThree) {
  const PreTokenizer p = PreTokenizer::from_gguf_pre("llama-bpe");
  EXPECT_EQ(split(p, "1234567 I'M ok\n\n"), (Words{"123", "456", "7", " I", "'M", " ok", "\n\n"}));
  const PreTokenizer q = PreTokenizer::from_gguf_pre("qwen2");
  EXPECT_EQ(split(q, "x=12"), (Words{"x", "=", "1", "2"}));
}

TEST(TokenizerPreTokenizer, InvalidUtf8FallsBetweenMatches) {
  const PreTokenizer p = PreTokenizer::from_gguf_pre("gpt2");
  EXPECT_EQ(split(p,
                  "ab\xFF"
                  "cd"),
            (Words{"ab", "\xFF", "cd"}));
}

TEST(TokenizerPreTokenizer, SplitBehaviors) {
  auto words = [](SplitBehavior b, std::string_view text) {
    PreTokenizer p;
    p.add_split("-", true, b, false);
    return split(p, text);
  };
  EXPECT_EQ(words(SplitBehavior::Removed, "a-b--c"), (Words{"a", "b", "c"}));
  EXPECT_EQ(words(SplitBehavior::Isolated, "a-b--c"), (Words{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(words(SplitBehavior::MergedWithPrevious, "a-b--c"), (Words{"a-", "b-", "-", "c"}));
  EXPECT_EQ(words(SplitBehavior::MergedWithNext, "a-b--c"), (Words{"a", "-b", "-", "-c"}));
  EXPECT_EQ(words(SplitBehavior::Contiguous, "a-b--c"), (Words{"a", "-", "b", "--", "c"}));
}

TEST(TokenizerPreTokenizer, UnknownGgufPreIsAClearError) {
  try {
    PreTokenizer::from_gguf_pre("no-such-pre");
    FAIL() << "expected dhs::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported tokenizer.ggml.pre 'no-such-pre'"),
              std::string::npos);
  }
}

TEST(TokenizerAddedTokens, LongestLeftmostAndSpecialOnlyWhenParsed) {
  const AddedTokenMatcher m({{1, "<|im", true},
                             {2, "<|im_start|>", true},
                             {3, "[X]", false},
                             {4, "<L>", true, /*lstrip=*/true, /*rstrip=*/true}});
  auto ids = [&](std::string_view text, bool parse_special) {
    std::vector<std::string> out;
    for (const Fragment& f : m.split(text, parse_special))
      out.push_back(f.id >= 0 ? "#" + std::to_string(f.id) : std::string(f.text));
    return out;
  };
  EXPECT_EQ(ids("a<|im_start|>b<|imx", true), (Words{"a", "#2", "b", "#1", "x"}));
  EXPECT_EQ(ids("a<|im_start|>b[X]", false), (Words{"a<|im_start|>b", "#3"}));
  EXPECT_EQ(ids("x  <L>  y", true), (Words{"x", "#4", "y"}));
  EXPECT_TRUE(m.split("", true).empty());
}

}  // namespace
}  // namespace dhs
