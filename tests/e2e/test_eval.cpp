// Sessions, runtime policy switching and `dhisparse eval` on the default model (CPU):
//  * truncating a session and decoding again gives bitwise the same logits (the CPU
//    backend is deterministic; summaries of the cut page are rebuilt);
//  * coverage gamma = 1 is dense: in the eval it must show top-1 agreement 100%, KL 0
//    exactly and every page read — which fails if teacher forcing is misaligned by a step;
//  * a real sparse policy reads fewer pages and reports agreement in [0, 100];
//  * no page leaks across sessions.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dhisparse/engine.h"
#include "dhisparse/eval.h"
#include "test_paths.h"

namespace dhs {
namespace {

std::unique_ptr<Engine> load_sparse_engine() {
  EngineOptions o;
  o.model_path = test::default_model_path();
  o.sparse_policy = "coverage";  // keeps page summaries
  o.max_context = 2048;
  return Engine::load(o);
}

TEST(Session, TruncateAndRedecodeIsBitwiseIdentical) {
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing";
  auto e = load_sparse_engine();
  const PoolStats before = e->kv_stats();
  for (const char* policy : {"dense", "coverage"}) {
    e->set_sparse_policy(policy, 0.9, 0, 0);
    auto s = e->open_session();
    std::vector<int32_t> prompt = e->tokenize("The quick brown fox jumps over the lazy dog. One two three four five");
    std::vector<float> lg;
    s->append(prompt, &lg);
    const int64_t n = s->n_tokens();
    std::vector<std::vector<float>> first;
    for (int32_t id : {11, 22, 33, 44, 55, 66, 77, 88, 99, 111, 122, 133, 144, 155, 166, 177, 188}) {
      s->append({id}, &lg);
      first.push_back(lg);
    }
    // Back to 5 tokens past the prompt (inside a page), then the same tokens again.
    s->truncate(n + 5);
    int k = 5;
    for (int32_t id : {66, 77, 88, 99, 111, 122, 133, 144, 155, 166, 177, 188}) {
      s->append({id}, &lg);
      EXPECT_EQ(lg, first[static_cast<size_t>(k)]) << policy << ": step " << k << " differs after truncation";
      ++k;
    }
    EXPECT_THROW(s->truncate(s->n_tokens() + 1), Error);
  }
  EXPECT_EQ(e->kv_stats().n_free, before.n_free) << "a session leaked pages";
  EXPECT_EQ(e->kv_check(), "");
}

TEST(Eval, GammaOneIsDenseAndSparseReadsLess) {
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing";
  auto e = load_sparse_engine();
  const std::string out = testing::TempDir() + "dhs_eval_rows.jsonl";
  const std::string trace = testing::TempDir() + "dhs_eval_trace.json";
  std::filesystem::remove(out);
  EvalOptions o;
  o.tasks = {"niah_single"};
  o.lengths = {400};
  o.samples = 2;
  o.policies = {parse_eval_policy("coverage:1.0"), parse_eval_policy("coverage:0.5")};
  o.out = out;
  o.trace_out = trace;
  ASSERT_EQ(run_eval(*e, o), 0);
  std::ifstream f(out);
  std::map<std::string, nlohmann::json> rows;
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    rows[j["label"].get<std::string>()] = j;
  }
  ASSERT_EQ(rows.size(), 3u);
  const auto& g1 = rows.at("coverage-1");
  EXPECT_GT(g1["decode_steps"].get<int>(), 0);
  EXPECT_EQ(g1["top1_agree"].get<double>(), 100.0);
  EXPECT_EQ(g1["kl_max"].get<double>(), 0.0);
  EXPECT_EQ(g1["pages_read_frac"].get<double>(), 1.0);
  EXPECT_EQ(g1["score"].get<double>(), rows.at("dense")["score"].get<double>());
  const auto& g5 = rows.at("coverage-0.5");
  EXPECT_LT(g5["pages_read_frac"].get<double>(), 1.0);
  EXPECT_GE(g5["top1_agree"].get<double>(), 0.0);
  EXPECT_LE(g5["top1_agree"].get<double>(), 100.0);
  EXPECT_TRUE(std::filesystem::exists(trace));
  EXPECT_EQ(e->kv_check(), "");
  EXPECT_THROW(parse_eval_policy("coverage:1.5"), Error);
  EXPECT_THROW(parse_eval_policy("topk"), Error);
  EXPECT_THROW(parse_eval_policy("bogus:3"), Error);
  EXPECT_EQ(parse_eval_policy("solohead:64").budget, 64);
}

}  // namespace
}  // namespace dhs
