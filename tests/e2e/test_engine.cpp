// The engine through its public API on the default model: our tokenizer and
// chat template reproduce the reference prompts' ids, a factual question gets
// the right answer, streaming and stop strings behave, and no page leaks.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dhisparse/engine.h"
#include "test_paths.h"

namespace dhs {
namespace {

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (int k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(test::default_model_path())) return;
    EngineOptions o;
    o.model_path = test::default_model_path();
    engine_ = Engine::load(o).release();
  }
  static void TearDownTestSuite() { delete engine_; }
  void SetUp() override {
    if (!engine_) GTEST_SKIP() << "default model missing: run scripts/fetch_model.sh";
  }
  void TearDown() override {
    if (!engine_) return;
    // Page accounting after every scenario: nothing held, pool consistent.
    EXPECT_EQ(engine_->kv_stats().n_used, 0);
    EXPECT_EQ(engine_->kv_stats().n_free, engine_->kv_stats().n_total);
    EXPECT_EQ(engine_->kv_check(), "");
  }
  static Engine* engine_;
};
Engine* EngineTest::engine_ = nullptr;

TEST_F(EngineTest, TokenizerAndChatTemplateReproduceReferencePromptIds) {
  std::ifstream in(test::data_dir() + "/reference/smollm2_135m.json");
  const auto ref = nlohmann::json::parse(in);
  for (const auto& p : ref["prompts"]) {
    SCOPED_TRACE(p["name"].get<std::string>());
    const auto want = p["prompt_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(engine_->tokenize(p["text"].get<std::string>()), want);
    if (p.contains("user_message") && p["user_message"].is_string()) {
      const std::string rendered = engine_->render_chat({{"user", p["user_message"].get<std::string>()}}, true);
      EXPECT_EQ(rendered, p["text"].get<std::string>());
    }
  }
}

TEST_F(EngineTest, AnswersAFactualQuestion) {
  const auto ids = engine_->tokenize(engine_->render_chat({{"user", "What is the capital of France?"}}, true));
  std::string streamed;
  bool chunks_valid = true;
  GenerateOptions go;
  go.max_tokens = 32;
  const auto res = engine_->generate(ids, go, [&](const std::string& piece) {
    chunks_valid = chunks_valid && valid_utf8(piece);
    streamed += piece;
    return true;
  });
  EXPECT_NE(res.text.find("Paris"), std::string::npos) << res.text;
  EXPECT_EQ(res.finish_reason, "stop");  // ends at <|im_end|>
  EXPECT_EQ(streamed, res.text);
  EXPECT_TRUE(chunks_valid);
}

TEST_F(EngineTest, StreamsWholeUtf8CharactersAndHonoursStopStrings) {
  GenerateOptions go;
  go.max_tokens = 40;
  go.sampling.temperature = 0.8f;
  go.sampling.seed = 7;
  const auto ids = engine_->tokenize(engine_->render_chat({{"user", "Écris une phrase en français avec des accents, puis 日本語 😀."}}, true));
  std::string streamed;
  bool ok = true;
  auto res = engine_->generate(ids, go, [&](const std::string& piece) {
    ok = ok && valid_utf8(piece);
    streamed += piece;
    return true;
  });
  EXPECT_TRUE(ok);
  EXPECT_EQ(streamed, res.text);
  // Same seed, same tokens.
  auto again = engine_->generate(ids, go);
  EXPECT_EQ(again.tokens, res.tokens);

  GenerateOptions stop;
  stop.max_tokens = 32;
  stop.stop = {" Paris"};
  const auto q = engine_->tokenize(engine_->render_chat({{"user", "What is the capital of France?"}}, true));
  auto r = engine_->generate(q, stop);
  EXPECT_EQ(r.finish_reason, "stop");
  EXPECT_EQ(r.text.find("Paris"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("capital of France is"), std::string::npos) << r.text;
}

TEST_F(EngineTest, MaxTokensAndAbortEndGeneration) {
  GenerateOptions go;
  go.max_tokens = 5;
  go.ignore_eos = true;
  auto r = engine_->generate(engine_->tokenize("Once upon a time"), go);
  EXPECT_EQ(r.tokens.size(), 5u);
  EXPECT_EQ(r.finish_reason, "length");
  go.max_tokens = 50;
  int calls = 0;
  r = engine_->generate(engine_->tokenize("Once upon a time"), go, [&](const std::string&) { return ++calls < 3; });
  EXPECT_EQ(r.finish_reason, "abort");
}

TEST_F(EngineTest, BadRequestsFailCleanlyWithoutLeakingPages) {
  GenerateOptions go;
  go.sampling.temperature = -1.0f;
  EXPECT_THROW(engine_->generate(engine_->tokenize("hi"), go), Error);
  go = {};
  std::vector<int32_t> too_long(static_cast<size_t>(engine_->max_context()) + 5, 42);
  try {
    engine_->generate(too_long, go);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context"), std::string::npos) << e.what();
  }
  EXPECT_THROW(engine_->generate({}, go), Error);
  EXPECT_THROW(engine_->generate({1, 2, 999999}, go), Error);  // token id out of range
}

}  // namespace
}  // namespace dhs

namespace dhs {
namespace {

// Sparse decode through the engine: coverage with gamma = 1 keeps every page, so its
// greedy tokens equal dense ones exactly; gamma = 0.99 still answers the question.
TEST(EngineSparse, CoverageGammaOneEqualsDenseAndGamma099Answers) {
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing";
  EngineOptions o;
  o.model_path = test::default_model_path();
  auto dense = Engine::load(o);
  o.sparse_policy = "coverage";
  o.gamma = 1.0;
  auto full = Engine::load(o);
  o.gamma = 0.99;
  auto cov = Engine::load(o);
  GenerateOptions go;
  go.max_tokens = 24;
  go.ignore_eos = true;
  const auto ids = dense->tokenize(
      "Item 1: apples. Item 2: pears. Item 3: plums. Item 4: figs. Item 5: dates. Item 6: limes. The list");
  EXPECT_EQ(full->generate(ids, go).tokens, dense->generate(ids, go).tokens);
  const auto q = cov->tokenize(cov->render_chat({{"user", "What is the capital of France?"}}, true));
  GenerateOptions g2;
  g2.max_tokens = 16;
  const auto r = cov->generate(q, g2);
  EXPECT_NE(r.text.find("Paris"), std::string::npos) << r.text;
  for (Engine* e : {dense.get(), full.get(), cov.get()}) {
    EXPECT_EQ(e->kv_stats().n_used, 0);
    EXPECT_EQ(e->kv_check(), "");
  }
  o.sparse_policy = "nonsense";
  EXPECT_THROW(Engine::load(o), Error);
}

}  // namespace
}  // namespace dhs
