// RULER-style task generation: determinism, length fitted to the budget (fake counter
// and the real SmolLM2 BPE) in few token_count calls, facts present exactly once and
// only where inserted, cwe counts by counting, scoring and task-name parsing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "eval/ruler_tasks.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace dhs::eval {
namespace {

// Whitespace words x 1.3, roughly what a BPE gives for English.
int64_t fake_count(const std::string& text) {
  std::istringstream in(text);
  int64_t words = 0;
  for (std::string w; in >> w;) ++words;
  return std::llround(static_cast<double>(words) * 1.3);
}

size_t count_of(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

bool is_niah(TaskKind t) {
  return t == TaskKind::NiahSingle || t == TaskKind::NiahMultiKey || t == TaskKind::NiahMultiValue ||
         t == TaskKind::NiahMultiQuery;
}

// The fact sentences of a haystack task and how many there must be.
std::pair<std::regex, size_t> fact_pattern(TaskKind t) {
  switch (t) {
    case TaskKind::NiahSingle: return {std::regex(R"(The special magic number for [a-z]+-[a-z]+ is \d{7}\.)"), 1};
    case TaskKind::VariableTracking: return {std::regex(R"(VAR [A-Z]{5} = (VAR [A-Z]{5}|\d{5})\.)"), 10};
    case TaskKind::Qa: return {std::regex(R"([A-Z][a-z]+ [A-Z][a-z]+ was born in the town of [A-Z][a-z]+\.)"), 11};
    default: return {std::regex(R"(The special magic number for [a-z]+-[a-z]+ is \d{7}\.)"), 4};
  }
}

void expect_same(const Sample& a, const Sample& b) {
  EXPECT_EQ(a.context, b.context);
  EXPECT_EQ(a.question, b.question);
  EXPECT_EQ(a.answer_prefix, b.answer_prefix);
  EXPECT_EQ(a.answers, b.answers);
  EXPECT_EQ(a.max_new_tokens, b.max_new_tokens);
}

TEST(RulerTasks, NamesRoundTripAndBadNameIsRejected) {
  const std::vector<std::string> expected = {"niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery",
                                             "vt", "cwe", "qa"};
  std::vector<std::string> names;
  for (TaskKind t : all_tasks()) {
    names.push_back(task_name(t));
    EXPECT_EQ(parse_task(task_name(t)), t);
  }
  EXPECT_EQ(names, expected);
  try {
    parse_task("niah_double");
    FAIL() << "parse_task accepted an unknown name";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("niah_double"), std::string::npos) << msg;
    for (const std::string& n : expected) EXPECT_NE(msg.find(n), std::string::npos) << msg;
  }
}

TEST(RulerTasks, SameSeedSameSampleOtherSeedOtherSample) {
  for (TaskKind t : all_tasks()) {
    SCOPED_TRACE(task_name(t));
    const Sample a = make_sample(t, 4000, 7, fake_count);
    expect_same(a, make_sample(t, 4000, 7, fake_count));
    const Sample b = make_sample(t, 4000, 8, fake_count);
    EXPECT_NE(a.context, b.context);
    EXPECT_NE(a.answers, b.answers);
    EXPECT_EQ(a.task, t);
    EXPECT_EQ(a.seed, 7u);
    EXPECT_EQ(a.target_tokens, 4000);
  }
}

TEST(RulerTasks, LengthLandsJustBelowTargetInFewCalls) {
  for (TaskKind t : all_tasks())
    for (int64_t target : {1000, 4000, 16000}) {
      double lo = 1, hi = 0;
      int max_calls = 0;
      for (uint64_t seed : {1, 2, 3, 4, 5}) {
        SCOPED_TRACE(task_name(t) + " target " + std::to_string(target) + " seed " + std::to_string(seed));
        int calls = 0;
        auto count = [&](const std::string& x) { ++calls; return fake_count(x); };
        const Sample s = make_sample(t, target, seed, count);
        const double r = static_cast<double>(fake_count(s.context + s.question)) / static_cast<double>(target);
        EXPECT_GE(r, 0.9);
        EXPECT_LE(r, 1.0);
        // O(log n): a probe, a couple of secant steps, one count for max_new_tokens.
        EXPECT_LE(calls, 12);
        EXPECT_GT(s.max_new_tokens, 0);
        lo = std::min(lo, r), hi = std::max(hi, r), max_calls = std::max(max_calls, calls);
      }
      std::printf("fake  %-16s target %6lld: length/target in [%.4f, %.4f], at most %d token_count calls\n",
                  task_name(t).c_str(), static_cast<long long>(target), lo, hi, max_calls);
    }
}

TEST(RulerTasks, TooSmallTargetIsAnError) {
  EXPECT_THROW(make_sample(TaskKind::Qa, 20, 1, fake_count), Error);
  EXPECT_THROW(make_sample(TaskKind::CommonWords, 20, 1, fake_count), Error);
}

// Facts appear as whole sentences between filler sentences; what is left once they are
// removed has no digits, none of the fact vocabulary, and none of this sample's keys.
TEST(RulerTasks, FactsOnlyWhereInsertedAndBetweenSentences) {
  for (TaskKind t : all_tasks()) {
    if (t == TaskKind::CommonWords) continue;
    for (uint64_t seed : {11, 12, 13})
      for (int64_t target : {1000, 16000}) {
        SCOPED_TRACE(task_name(t) + " seed " + std::to_string(seed) + " target " + std::to_string(target));
        const Sample s = make_sample(t, target, seed, fake_count);
        const size_t body = s.context.find("\n\n") + 2;  // after the header line
        const std::string doc = s.context.substr(body);
        const auto [re, n_facts] = fact_pattern(t);
        std::string filler;
        std::set<std::string> fact_words;
        size_t n = 0, last = 0;
        for (auto it = std::sregex_iterator(doc.begin(), doc.end(), re); it != std::sregex_iterator(); ++it, ++n) {
          const size_t p = static_cast<size_t>(it->position());
          const size_t e = p + static_cast<size_t>(it->length());
          // Between sentences: at the start, or after ". " / a paragraph break; then a gap.
          if (p > 0) {
            ASSERT_TRUE(doc[p - 1] == ' ' || doc[p - 1] == '\n') << it->str();
            ASSERT_TRUE(p < 2 || doc[p - 2] == '.' || doc[p - 2] == '\n') << it->str();
          }
          ASSERT_TRUE(e == doc.size() || doc[e] == ' ' || doc[e] == '\n') << it->str();
          filler += doc.substr(last, p - last) + " ";
          last = e;
          std::istringstream words(it->str());
          for (std::string w; words >> w;) {
            w.erase(std::remove(w.begin(), w.end(), '.'), w.end());
            // A key "glossy-rocket" contributes both of its words.
            for (size_t h; (h = w.find('-')) != std::string::npos; w.erase(0, h + 1))
              fact_words.insert(w.substr(0, h));
            fact_words.insert(w);
          }
        }
        filler += doc.substr(last);
        EXPECT_EQ(n, n_facts);
        EXPECT_EQ(std::count_if(filler.begin(), filler.end(), [](char c) { return c >= '0' && c <= '9'; }), 0);
        std::string low = filler;
        for (char& c : low) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        for (const char* bad : {"magic", "special", "number", "born", "town", "var ", "value"})
          EXPECT_EQ(low.find(bad), std::string::npos) << bad;
        // Words that name things in facts (keys, people, towns, variables) stay out of
        // the filler; the shared function words of the fact templates are allowed.
        static const std::set<std::string> kTemplateWords = {"The", "special", "magic", "number", "for", "is",
                                                             "was", "born", "in", "the", "town", "of", "VAR", "="};
        std::istringstream fw(filler);
        std::set<std::string> filler_words;
        for (std::string w; fw >> w;) {
          w.erase(std::remove_if(w.begin(), w.end(), [](char c) { return c == '.' || c == ','; }), w.end());
          filler_words.insert(w);
          std::transform(w.begin(), w.end(), w.begin(), [](unsigned char c) { return std::tolower(c); });
          filler_words.insert(w);
        }
        for (const std::string& w : fact_words) {
          if (!kTemplateWords.count(w) && !std::all_of(w.begin(), w.end(), ::isdigit)) {
            EXPECT_EQ(filler_words.count(w), 0u) << w;
          }
        }
      }
  }
}

TEST(RulerTasks, NeedleForAskedKeyIsInContextOnce) {
  for (TaskKind t : all_tasks()) {
    if (!is_niah(t)) continue;
    for (uint64_t seed : {21, 22, 23, 24}) {
      SCOPED_TRACE(task_name(t) + " seed " + std::to_string(seed));
      const Sample s = make_sample(t, 4000, seed, fake_count);
      // Asked keys from the answer prefix: "... for K is" / "... for K are" / "for A and B are".
      const std::string prefix = "The special magic number";
      ASSERT_EQ(s.answer_prefix.rfind(prefix, 0), 0u) << s.answer_prefix;
      std::string keys = s.answer_prefix.substr(s.answer_prefix.find(" for ") + 5);
      keys = keys.substr(0, keys.rfind(' '));
      std::vector<std::string> asked;
      if (const size_t a = keys.find(" and "); a != std::string::npos)
        asked = {keys.substr(0, a), keys.substr(a + 5)};
      else
        asked = {keys};
      EXPECT_EQ(count_of(s.context, "The special magic number for "), t == TaskKind::NiahSingle ? 1u : 4u);
      const size_t n_answers = t == TaskKind::NiahMultiValue ? 4 : t == TaskKind::NiahMultiQuery ? 2 : 1;
      ASSERT_EQ(s.answers.size(), n_answers);
      for (size_t i = 0; i < n_answers; ++i) {
        const std::string& key = asked[t == TaskKind::NiahMultiQuery ? i : 0];
        EXPECT_EQ(count_of(s.context, "The special magic number for " + key + " is " + s.answers[i] + "."), 1u);
        EXPECT_EQ(count_of(s.context, s.answers[i]), 1u);
        EXPECT_EQ(s.answers[i].size(), 7u);
        EXPECT_NE(s.question.find(key), std::string::npos);
      }
      // Distractor keys are really different keys (multikey, multiquery), one key for multivalue.
      const size_t n_key_mentions = count_of(s.context, "for " + asked[0] + " is");
      EXPECT_EQ(n_key_mentions, t == TaskKind::NiahMultiValue ? 4u : 1u);
    }
  }
}

TEST(RulerTasks, VariableChainInOrderWithDistractor) {
  for (uint64_t seed : {31, 32, 33}) {
    const Sample s = make_sample(TaskKind::VariableTracking, 4000, seed, fake_count);
    ASSERT_EQ(s.answers.size(), 5u);
    const std::string value = s.question.substr(s.question.find("the value ") + 10, 5);
    size_t prev = 0;
    for (size_t k = 0; k < s.answers.size(); ++k) {
      const std::string stmt = "VAR " + s.answers[k] + " = " + (k == 0 ? value : "VAR " + s.answers[k - 1]) + ".";
      ASSERT_EQ(count_of(s.context, stmt), 1u) << stmt;
      const size_t p = s.context.find(stmt);
      EXPECT_GE(p, prev) << "chain out of order at " << stmt;
      prev = p;
      EXPECT_EQ(count_of(s.context, "VAR " + s.answers[k] + " ="), 1u);
    }
    EXPECT_EQ(count_of(s.context, "VAR "), 18u);  // 2 chains x (5 assignments + 4 references)
  }
}

TEST(RulerTasks, CommonWordsCountedAreTheAnswers) {
  for (int64_t target : {1000, 4000, 16000})
    for (uint64_t seed : {41, 42}) {
      SCOPED_TRACE(std::to_string(target) + " seed " + std::to_string(seed));
      const Sample s = make_sample(TaskKind::CommonWords, target, seed, fake_count);
      const std::regex line(R"(^(\d+)\. ([a-z]+)$)");
      std::map<std::string, int> count;
      std::istringstream in(s.context);
      int expect_index = 1;
      for (std::string l; std::getline(in, l);) {
        std::smatch m;
        if (!std::regex_match(l, m, line)) continue;
        EXPECT_EQ(std::stoi(m[1]), expect_index++);
        ++count[m[2]];
      }
      ASSERT_EQ(s.answers.size(), 5u);
      const int f = count[s.answers[0]];
      EXPECT_GE(f, 6);
      for (const std::string& a : s.answers) EXPECT_EQ(count[a], f) << a;
      size_t n_uncommon = 0;
      for (const auto& [w, c] : count)
        if (std::find(s.answers.begin(), s.answers.end(), w) == s.answers.end()) {
          EXPECT_LE(c, 3) << w;
          ++n_uncommon;
        }
      EXPECT_GT(n_uncommon, 5u);
    }
}

TEST(RulerTasks, QaTownOnceWithItsPerson) {
  for (uint64_t seed : {51, 52, 53}) {
    const Sample s = make_sample(TaskKind::Qa, 4000, seed, fake_count);
    ASSERT_EQ(s.answers.size(), 1u);
    const std::string person = s.answer_prefix.substr(0, s.answer_prefix.find(" was born"));
    EXPECT_NE(s.question.find(person), std::string::npos);
    EXPECT_EQ(count_of(s.context, person + " was born in the town of " + s.answers[0] + "."), 1u);
    EXPECT_EQ(count_of(s.context, s.answers[0]), 1u);
    EXPECT_EQ(count_of(s.context, person), 1u);
    EXPECT_EQ(count_of(s.context, " was born in the town of "), 11u);
  }
}

TEST(RulerTasks, ScoreIsFractionOfAnswersFound) {
  const Sample mv = make_sample(TaskKind::NiahMultiValue, 1000, 5, fake_count);
  ASSERT_EQ(mv.answers.size(), 4u);
  const auto& a = mv.answers;
  EXPECT_DOUBLE_EQ(score_output(mv, " " + a[3] + ", " + a[1] + ", " + a[0] + " and " + a[2] + ".\n"), 1.0);
  EXPECT_DOUBLE_EQ(score_output(mv, a[2] + " and " + a[0]), 0.5);
  EXPECT_DOUBLE_EQ(score_output(mv, a[1]), 0.25);
  EXPECT_DOUBLE_EQ(score_output(mv, "I could not find any number."), 0.0);
  EXPECT_DOUBLE_EQ(score_output(mv, ""), 0.0);

  // Case-insensitive, and answers are trimmed before matching.
  Sample cw = make_sample(TaskKind::CommonWords, 1000, 5, fake_count);
  std::string shout;
  for (const std::string& w : cw.answers) {
    std::string up = w;
    for (char& c : up) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    shout += up + ", ";
  }
  EXPECT_DOUBLE_EQ(score_output(cw, shout), 1.0);
  cw.answers[0] = "  " + cw.answers[0] + "\n";
  EXPECT_DOUBLE_EQ(score_output(cw, shout), 1.0);
  EXPECT_DOUBLE_EQ(score_output(cw, cw.answers[1] + " " + cw.answers[2]), 0.4);
}

// Real byte-level BPE (SmolLM2): the fitted length holds for a real tokenizer too, and
// the search stays a handful of full-length encodes.
TEST(RulerTasks, LengthWithRealTokenizer) {
  const std::string path = test::data_dir() + "/tokenizer/smollm2/tokenizer.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no tokenizer at " << path;
  const auto tok = Tokenizer::from_hf_files(path, "");
  for (TaskKind t : all_tasks())
    for (int64_t target : {1000, 4000, 16000}) {
      SCOPED_TRACE(task_name(t) + " target " + std::to_string(target));
      int calls = 0;
      auto n_tokens = [&](const std::string& x) { return static_cast<int64_t>(tok->encode(x, false).size()); };
      auto count = [&](const std::string& x) { ++calls; return n_tokens(x); };
      const auto t0 = std::chrono::steady_clock::now();
      const Sample s = make_sample(t, target, 3, count);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      const double r = static_cast<double>(n_tokens(s.context + s.question)) / static_cast<double>(target);
      EXPECT_GE(r, 0.9);
      EXPECT_LE(r, 1.0);
      EXPECT_LE(calls, 12);
      std::printf("bpe   %-16s target %6lld: length/target %.4f, %d token_count calls, %.0f ms, "
                  "max_new_tokens %d\n",
                  task_name(t).c_str(), static_cast<long long>(target), r, calls, ms, s.max_new_tokens);
    }
}

}  // namespace
}  // namespace dhs::eval
