// Sessions, runtime policy switching and `dhisparse eval` on the default model (CPU):
//  * truncating a session and decoding again gives bitwise the same logits (the CPU
//    backend is deterministic; summaries of the cut page are rebuilt);
//  * coverage gamma = 1 is dense: in the eval it must show top-1 agreement 100%, KL 0
//    exactly and every page read — which fails if teacher forcing is misaligned by a step;
//  * a real sparse policy reads fewer pages and reports agreement in [0, 100];
//  * no page leaks across sessions.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dhisparse/engine.h"
#include "dhisparse/eval.h"
#include "test_paths.h"

namespace dhs {
namespace {

// A rule by name with the fields the tests vary; the rest as EngineOptions::policy's defaults.
PolicySpec spec(const std::string& rule, double gamma, int budget, int64_t dense_below = 0, int every = 1) {
  PolicySpec p;
  for (const RuleInfo& r : rule_table())
    if (rule == r.name) p.rule = r.rule;
  EXPECT_EQ(p.rule_name(), rule);
  p.gamma = gamma;
  p.budget = budget;
  p.dense_below = dense_below;
  p.reselect_every = every;
  return p;
}

std::unique_ptr<Engine> load_sparse_engine() {
  EngineOptions o;
  o.model_path = test::default_model_path();
  o.policy.rule = SelectRule::Coverage;  // keeps page summaries
  o.max_context = 2048;
  return Engine::load(o);
}

TEST(Session, TruncateAndRedecodeIsBitwiseIdentical) {
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing";
  auto e = load_sparse_engine();
  const PoolStats before = e->kv_stats();
  for (const char* policy : {"dense", "coverage"}) {
    e->set_policy(spec(policy, 0.9, 0));
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
  o.policies = {PolicySpec::parse("coverage:1.0"), PolicySpec::parse("coverage:0.5")};
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
  // The budget trace (the bench replays it): per (layer, KV head), the pages each policy read on its
  // selecting steps — every page at γ 1, fewer at 0.5 (the CPU counts them as the CUDA backend).
  std::ifstream tf(trace);
  const nlohmann::json tj = nlohmann::json::parse(tf);
  const size_t n_lists = static_cast<size_t>(tj["n_layers"].get<int>() * tj["n_heads_kv"].get<int>());
  for (const char* label : {"coverage-1", "coverage-0.5"}) {
    SCOPED_TRACE(label);
    ASSERT_TRUE(tj["policies"].contains(label));
    const auto& at = tj["policies"][label]["400"];
    ASSERT_EQ(at["read"].size(), n_lists);
    ASSERT_EQ(at["total"].size(), n_lists);
    uint64_t read = 0, total = 0;
    for (size_t i = 0; i < n_lists; ++i) {
      EXPECT_GT(at["total"][i].get<uint64_t>(), 0u);
      EXPECT_LE(at["read"][i].get<uint64_t>(), at["total"][i].get<uint64_t>());
      read += at["read"][i].get<uint64_t>();
      total += at["total"][i].get<uint64_t>();
    }
    if (std::string(label) == "coverage-1") EXPECT_EQ(read, total);
    else EXPECT_LT(read, total);
  }
  EXPECT_EQ(e->kv_check(), "");
  // The policy grammar itself: tests/unit/test_policy_spec.cpp.
}

// Speculative acceptance (EvalOptions::speculative_k): a draft whose window holds every page is the
// verifier itself, so every draft is kept, for the dense verifier and for coverage 1; a window of 2
// pages keeps at most what it drafts and at most k per verification. Fails if the cycles mix up
// the draft's and the verifier's positions (a kept draft compared with the wrong output token).
TEST(Eval, SpeculativeAcceptanceCountsCycles) {
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing";
  auto e = load_sparse_engine();
  for (const char* draft : {"sinkwindow:1000", "sinkwindow:2"}) {
    SCOPED_TRACE(draft);
    const std::string out = testing::TempDir() + "dhs_eval_spec_rows.jsonl";
    std::filesystem::remove(out);
    EvalOptions o;
    o.tasks = {"qa"};
    o.lengths = {400};
    o.samples = 2;
    o.policies = {PolicySpec::parse("coverage:1.0")};
    o.out = out;
    o.speculative_k = 3;
    o.draft = PolicySpec::parse(draft);
    ASSERT_EQ(run_eval(*e, o), 0);
    std::ifstream f(out);
    int rows = 0;
    for (std::string line; std::getline(f, line); ++rows) {
      const auto j = nlohmann::json::parse(line);
      const int64_t v = j["spec_verifies"], d = j["spec_drafted"], a = j["spec_accepted"];
      EXPECT_GT(v, 0) << j["label"];
      EXPECT_LE(d, 3 * v);
      EXPECT_LE(a, d);
      if (std::string(draft) == "sinkwindow:1000") {
        EXPECT_EQ(a, d) << j["label"] << ": the draft is the verifier";
      }
    }
    EXPECT_EQ(rows, 2);
  }
  EXPECT_EQ(e->kv_check(), "");
}

// --reselect-every (sparse/reselect_schedule.h) end to end on the CPU engine, 40 decode steps
// over page boundaries.
//  * coverage gamma = 1 with R = 4: every selection is all pages, so a reused list must be all
//    pages too: logits bitwise dense at every step. Fails if the pages written since the
//    selection are missing (the current token's page) or listed twice.
//  * sink + window with R = 3: the pages read equal a count written from the definition (each
//    layer's last selection step by the schedule, its sink + window pages then, the pages
//    written since) — fails if the schedule or the reuse differs from the definition.
TEST(Reselect, GammaOneStaysDenseAndSinkWindowReadsWhatTheDefinitionCounts) {
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing";
  auto e = load_sparse_engine();
  const int L = static_cast<int>(e->config().n_layers), hkv = static_cast<int>(e->config().n_heads_kv), ps = 16;
  std::string text;
  for (int i = 0; i < 10; ++i) text += "The quick brown fox jumps over the lazy dog " + std::to_string(i) + ". ";
  const std::vector<int32_t> prompt = e->tokenize(text);  // ~120 tokens: 8 pages, then 40 steps
  auto decode = [&](const std::string& policy, double gamma, int budget, int every, std::vector<std::vector<float>>* steps,
                    int64_t dense_below = 0) {
    e->set_policy(spec(policy, gamma, budget, dense_below, every));
    auto s = e->open_session();
    std::vector<float> lg;
    s->append(prompt, &lg);
    (void)e->take_page_counts();
    for (int i = 0; i < 40; ++i) {
      s->append({static_cast<int32_t>(100 + 7 * i)}, &lg);
      steps->push_back(lg);
    }
    return e->take_page_counts();
  };
  std::vector<std::vector<float>> dense, g1;
  decode("dense", 0.99, 0, 1, &dense);
  decode("coverage", 1.0, 0, 4, &g1);
  ASSERT_EQ(g1.size(), dense.size());
  for (size_t i = 0; i < dense.size(); ++i) EXPECT_EQ(g1[i], dense[i]) << "step " << i;

  const int n_sink = 1, budget = 4, window = budget - n_sink, every = 3;
  std::vector<std::vector<float>> sw;
  const PageCounts got = decode("sinkwindow", 0.99, budget, every, &sw);
  uint64_t want_read = 0, want_total = 0;
  const int64_t n0 = static_cast<int64_t>(prompt.size());
  for (int k = 0; k < 40; ++k) {
    const int64_t seq = n0 + k + 1, n_pages = (seq + ps - 1) / ps;
    for (int l = 0; l < L; ++l) {
      int s = k;  // the layer's last selection step: step 0 (full) or (l + s) % every == 0
      while (s > 0 && (l + s) % every != 0) --s;
      const int64_t seq_s = n0 + s + 1, pages_s = (seq_s + ps - 1) / ps, first_new = seq_s / ps;
      std::set<int64_t> pages;
      for (int64_t p = 0; p < pages_s; ++p)
        if ((p < n_sink || p >= pages_s - window) && p < first_new) pages.insert(p);
      for (int64_t p = first_new; p < n_pages; ++p) pages.insert(p);
      want_read += static_cast<uint64_t>(hkv) * pages.size();
      want_total += static_cast<uint64_t>(hkv * n_pages);
    }
  }
  EXPECT_EQ(got.total, want_total);
  EXPECT_EQ(got.read, want_read);
  EXPECT_LT(got.read, got.total);

  // With --dense-below: the steps below it read every page and the schedule starts over at the
  // first step past it (every layer selects there), as on the CUDA backend.
  const int64_t dense_below = n0 + 7;
  std::vector<std::vector<float>> swd;
  const PageCounts got_d = decode("sinkwindow", 0.99, budget, every, &swd, dense_below);
  uint64_t want_read_d = 0, want_total_d = 0;
  int k0 = -1;  // the first selecting step
  for (int k = 0; k < 40; ++k) {
    const int64_t seq = n0 + k + 1, n_pages = (seq + ps - 1) / ps;
    want_total_d += static_cast<uint64_t>(L * hkv * n_pages);
    if (seq < dense_below) {
      want_read_d += static_cast<uint64_t>(L * hkv * n_pages);
      continue;
    }
    if (k0 < 0) k0 = k;
    for (int l = 0; l < L; ++l) {
      int s = k - k0;  // steps since the schedule's full step
      while (s > 0 && (l + s) % every != 0) --s;
      const int64_t seq_s = n0 + k0 + s + 1, pages_s = (seq_s + ps - 1) / ps, first_new = seq_s / ps;
      std::set<int64_t> pages;
      for (int64_t p = 0; p < pages_s; ++p)
        if ((p < n_sink || p >= pages_s - window) && p < first_new) pages.insert(p);
      for (int64_t p = first_new; p < n_pages; ++p) pages.insert(p);
      want_read_d += static_cast<uint64_t>(hkv) * pages.size();
    }
  }
  EXPECT_EQ(got_d.total, want_total_d);
  EXPECT_EQ(got_d.read, want_read_d) << "dense-below " << dense_below << " with reselect every " << every;
  EXPECT_EQ(e->kv_check(), "");
}

// EngineOptions::sparse_min_tokens: decode steps below the threshold are the dense step (bitwise the
// dense policy's logits, every page counted as read); from the threshold on, the policy selects.
// Fails if the threshold is ignored, off by one token, or if a dense step still ran the policy.
TEST(Eval, SparseMinTokensRunsDenseStepsBelowTheThreshold) {
  if (!std::filesystem::exists(test::default_model_path())) GTEST_SKIP() << "default model missing";
  EngineOptions o;
  o.model_path = test::default_model_path();
  o.policy.rule = SelectRule::Coverage;
  o.max_context = 2048;
  constexpr int64_t kMin = 140;  // tokens of context in the step, this step's included
  o.policy.min_step_tokens = kMin;
  auto e = Engine::load(o);
  std::string text;
  for (int i = 0; i < 10; ++i) text += "The quick brown fox jumps over the lazy dog " + std::to_string(i) + ". ";
  const std::vector<int32_t> prompt = e->tokenize(text);
  const int64_t n0 = static_cast<int64_t>(prompt.size());
  const int n_dense = static_cast<int>(kMin - 1 - n0);  // steps k with n0 + k + 1 < kMin
  ASSERT_GE(n_dense, 4) << "prompt of " << n0 << " tokens: too long for the test";
  const int n_steps = n_dense + 12;
  auto decode = [&](const std::string& policy, std::vector<std::vector<float>>* steps, PageCounts* below,
                    PageCounts* above) {
    PolicySpec p = spec(policy, 0.5, 0);
    p.min_step_tokens = kMin;
    e->set_policy(p);
    auto s = e->open_session();
    std::vector<float> lg;
    s->append(prompt, &lg);
    (void)e->take_page_counts();
    for (int k = 0; k < n_steps; ++k) {
      s->append({static_cast<int32_t>(100 + 7 * k)}, &lg);
      steps->push_back(lg);
      if (k + 1 == n_dense) *below = e->take_page_counts();
    }
    *above = e->take_page_counts();
  };
  std::vector<std::vector<float>> dense, cov;
  PageCounts d_below, d_above, below, above;
  decode("dense", &dense, &d_below, &d_above);
  decode("coverage", &cov, &below, &above);
  for (int k = 0; k < n_dense; ++k) EXPECT_EQ(cov[static_cast<size_t>(k)], dense[static_cast<size_t>(k)]) << "step " << k;
  uint64_t want = 0;
  const auto& c = e->config();
  for (int k = 0; k < n_dense; ++k) want += static_cast<uint64_t>(c.n_layers * c.n_heads_kv * ((n0 + k + 1 + 15) / 16));
  EXPECT_EQ(below.total, want);
  EXPECT_EQ(below.read, want);
  EXPECT_GT(above.total, 0u);
  EXPECT_LT(above.read, above.total) << "coverage 0.5 past the threshold read every page";
  EXPECT_NE(cov[static_cast<size_t>(n_dense)], dense[static_cast<size_t>(n_dense)]) << "the first step at the threshold did not select";
  EXPECT_EQ(e->kv_check(), "");
}

}  // namespace
}  // namespace dhs
