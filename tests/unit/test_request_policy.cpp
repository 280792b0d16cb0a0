// A request's own sparse policy (StepRequest::policy, PolicySpec::as_request_policy) on the CPU
// runner: in one decode batch, requests under different policies each get the logits they get
// alone on a runner whose policy is theirs. Tiny random Qwen2 checkpoint (tests/data/tiny_models/
// qwen2_bias), prompts of 150-200 tokens (10-13 pages of 16 per KV head), teacher-forced decode.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../test_paths.h"
#include "core/error.h"
#include "engine/step_runner.h"
#include "kv/page_table.h"
#include "model/model_loader.h"
#include "dhisparse/policy.h"

namespace dhs {
namespace {

TEST(RequestPolicy, WhatARequestMayChoose) {
  const PolicySpec engine = PolicySpec::parse("coverage:0.99@sketch4");
  auto own = [&](const char* text) { return PolicySpec::parse(text, engine).as_request_policy(engine); };
  EXPECT_EQ(own("coverage:0.95").gamma, 0.95);
  EXPECT_EQ(own("topk:8").budget, 8);
  EXPECT_TRUE(own("dense").dense());
  EXPECT_EQ(own("sinkwindow:4").rule, SelectRule::SinkWindow);
  EXPECT_EQ(own("coverage:0.99"), engine) << "the engine's own policy spelled out is the engine's";
  EXPECT_THROW(own("coverage:0.9@minmax"), Error) << "the estimator is the engine's (its page data)";
  EXPECT_THROW(own("coverage:0.9/4"), Error) << "the reselect schedule is the engine's";
  EXPECT_THROW(own("solohead:0.9"), Error);
  // A dense engine keeps no page data: a request may not select; one without scoring neither.
  const PolicySpec dense;
  EXPECT_THROW(PolicySpec::parse("coverage:0.9").as_request_policy(dense), Error);
  EXPECT_TRUE(PolicySpec::parse("dense").as_request_policy(dense).dense());
  const PolicySpec window = PolicySpec::parse("sinkwindow:8");
  EXPECT_THROW(PolicySpec::parse("coverage:0.9").as_request_policy(window), Error) << "no scoring kernels run";
  EXPECT_EQ(PolicySpec::parse("sinkwindow:3", window).as_request_policy(window).budget, 3);
  // The fields a request cannot spell come from the engine.
  PolicySpec e2 = engine;
  e2.n_sink = 2;
  e2.min_step_tokens = 1000;
  const PolicySpec r = PolicySpec::parse("topk:5", e2).as_request_policy(e2);
  EXPECT_EQ(r.n_sink, 2);
  EXPECT_EQ(r.min_step_tokens, 1000);
  EXPECT_EQ(r.estimator, "sketch4");
}

// The CPU forward gives a request's rows the same values in any batch (test_batch_invariance);
// attention over a batch may split work differently, so logits agree to ~1e-6 (test_step_batch).
// 1e-4 still catches a request read with another's pages: the policies below move logits by
// more than 1e-2 (checked first, so the test cannot pass with every request read densely).
constexpr float kTol = 1e-4f;

class RequestPolicyBatch : public ::testing::Test {
 protected:
  void SetUp() override { src_ = open_weights(test::data_dir() + "/tiny_models/qwen2_bias"); }
  std::unique_ptr<StepRunner> runner(const char* policy, int reselect_every = 1) {
    EngineOptions o;
    o.weight_type = "f32";
    o.policy = PolicySpec::parse(policy);
    o.policy.reselect_every = reselect_every;
    o.kv_blocks = 64;  // four requests of up to 210 tokens (14 blocks of 16)
    return make_cpu_runner(*src_, o, 512);
  }
  PageTable table(const StepRunner& r) const {
    const ModelConfig& c = r.config();
    return PageTable(static_cast<int>(c.n_layers), static_cast<int>(c.n_heads_kv), 16);
  }
  // Prefill of each prompt (dense), then `decode` teacher-forced steps of all requests together,
  // request i under policies[i] (null: the runner's). Returns each step's logits [n_req, vocab].
  std::vector<std::vector<float>> run(StepRunner& r, const std::vector<std::vector<int32_t>>& prompts,
                                      const std::vector<const PolicySpec*>& policies,
                                      const std::vector<std::vector<int32_t>>& decode) {
    std::vector<PageTable> tables;
    for (size_t i = 0; i < prompts.size(); ++i) tables.push_back(table(r));
    StepOutput out;
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_TRUE(tables[i].reserve(r.pages(), static_cast<int64_t>(prompts[i].size())));
      r.step({StepRequest{&tables[i], static_cast<int>(i), prompts[i].data(), static_cast<int64_t>(prompts[i].size())}}, &out,
             false);
    }
    std::vector<std::vector<float>> steps;
    for (size_t k = 0; k < decode[0].size(); ++k) {
      std::vector<StepRequest> batch;
      for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_TRUE(tables[i].reserve(r.pages(), 1));
        StepRequest q{&tables[i], static_cast<int>(i), &decode[i][k], 1};
        q.policy = policies[i];
        batch.push_back(q);
      }
      r.step(batch, &out, true);
      steps.push_back(out.logits);
    }
    for (PageTable& t : tables) t.release(r.pages());
    EXPECT_EQ(r.pages().check_invariants(), "");
    EXPECT_EQ(r.pages().stats().n_used, 0);
    return steps;
  }
  std::unique_ptr<WeightSource> src_;
};

float max_diff(const float* a, const float* b, int64_t n) {
  float d = 0.0f;
  for (int64_t i = 0; i < n; ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

TEST_F(RequestPolicyBatch, EachRequestGetsWhatItsPolicyGivesAlone) {
  const char* engine_policy = "coverage:0.8@sketch4";
  const std::vector<std::string> own = {"dense", "", "sinkwindow:3", "topk:2"};  // "": the engine's
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> id(0, 299);
  std::vector<std::vector<int32_t>> prompts, decode;
  for (size_t i = 0; i < own.size(); ++i) {
    prompts.emplace_back(150 + 17 * i);
    for (int32_t& t : prompts.back()) t = id(rng);
    decode.emplace_back(6);
    for (int32_t& t : decode.back()) t = id(rng);
  }
  auto mixed_runner = runner(engine_policy);
  const int64_t V = mixed_runner->config().vocab_size;
  std::vector<PolicySpec> specs;
  for (const std::string& s : own)
    specs.push_back(s.empty() ? mixed_runner->policy()
                              : PolicySpec::parse(s, mixed_runner->policy()).as_request_policy(mixed_runner->policy()));
  std::vector<const PolicySpec*> ptrs;
  for (size_t i = 0; i < own.size(); ++i) ptrs.push_back(own[i].empty() ? nullptr : &specs[i]);
  const auto mixed = run(*mixed_runner, prompts, ptrs, decode);

  // Alone, each on a runner of its policy; and densely, to show the policies matter here.
  for (size_t i = 0; i < own.size(); ++i) {
    auto solo_runner = runner(own[i].empty() ? engine_policy : own[i].c_str());
    const auto solo = run(*solo_runner, {prompts[i]}, {nullptr}, {decode[i]});
    std::vector<std::vector<float>> dense;
    if (i != 0) dense = run(*runner("dense"), {prompts[i]}, {nullptr}, {decode[i]});
    float moved = 0.0f;
    for (size_t k = 0; k < decode[i].size(); ++k) {
      EXPECT_LT(max_diff(mixed[k].data() + static_cast<int64_t>(i) * V, solo[k].data(), V), kTol)
          << "request " << i << " (" << (own[i].empty() ? engine_policy : own[i]) << "), decode step " << k;
      if (i != 0) moved = std::max(moved, max_diff(solo[k].data(), dense[k].data(), V));
    }
    if (i != 0) {
      EXPECT_GT(moved, 1e-2f) << "policy " << own[i] << " reads every page here: the check is void";
    }
  }
}

// A decode row beside another request's prompt chunk (a mixed step) reads its policy's pages as
// in a decode step alone (the CUDA backend's rule since session 35; the CPU's since session 37:
// before, such a step read every page for every row). Request A decodes 5 teacher-forced tokens
// alone, then again with each step beside a 40-token chunk of B's prompt (B first or last); A's
// logits must equal the alone run's within kTol, and the alone run must differ from A read densely
// by more than 1e-2 (so a mixed step that read every page fails). B's chunks must give the logits
// of B prefilled alone in the same chunks (a chunk reads every page), and the pages counted as
// read must be A's alone (a chunk's are not counted). Under the engine's policy (coverage), under
// A's own (sinkwindow:3), whose steps select without scoring, and under coverage reselected every
// 2 steps (the reuse schedule runs over a mixed step's decode rows as over a decode step's: a
// mixed step that selected afresh would differ from A alone at the reusing layers).
TEST_F(RequestPolicyBatch, ADecodeRowBesideAPromptChunkReadsItsPolicy) {
  const char* engine_policy = "coverage:0.8@sketch4";
  std::mt19937 rng(9);
  std::uniform_int_distribution<int32_t> id(0, 299);
  std::vector<int32_t> a(170), b(200), a_dec(5);
  for (int32_t& t : a) t = id(rng);
  for (int32_t& t : b) t = id(rng);
  for (int32_t& t : a_dec) t = id(rng);
  for (const auto& [own, every] : std::vector<std::pair<const char*, int>>{{"", 1}, {"sinkwindow:3", 1}, {"", 2}}) {
    auto r = runner(engine_policy, every);
    const int64_t V = r->config().vocab_size;
    PolicySpec spec;
    const PolicySpec* pol = nullptr;
    if (*own) {
      spec = PolicySpec::parse(own, r->policy()).as_request_policy(r->policy());
      pol = &spec;
    }
    struct Run {
      std::vector<std::vector<float>> a, b;  // A's logits per decode step; B's last-row logits per chunk
      PageCounts pages;                      // counted as read over A's steps
    };
    // A's decode steps, each beside chunk k of B when `with_a` and `with_b` (B first on odd
    // steps); B's chunks alone when !with_a.
    const auto run = [&](StepRunner& rn, const PolicySpec* p, bool with_a, bool with_b) {
      PageTable ta = table(rn), tb = table(rn);
      StepOutput out;
      Run got;
      if (with_a) {
        EXPECT_TRUE(ta.reserve(rn.pages(), static_cast<int64_t>(a.size())));
        rn.step({StepRequest{&ta, 0, a.data(), static_cast<int64_t>(a.size())}}, &out, false);
      }
      rn.take_page_counts();
      for (size_t k = 0; k < a_dec.size(); ++k) {
        std::vector<StepRequest> batch;
        if (with_a) {
          EXPECT_TRUE(ta.reserve(rn.pages(), 1));
          StepRequest qa{&ta, 0, &a_dec[k], 1};
          qa.policy = p;
          batch.push_back(qa);
        }
        if (with_b) {
          EXPECT_TRUE(tb.reserve(rn.pages(), 40));
          const StepRequest qb{&tb, 1, b.data() + 40 * k, 40};
          if (k % 2) batch.insert(batch.begin(), qb);
          else batch.push_back(qb);
        }
        rn.step(batch, &out, true);
        const int64_t at_a = with_a && with_b && k % 2 ? 1 : 0, at_b = with_a && !(k % 2) ? 1 : 0;
        if (with_a) got.a.emplace_back(out.logits.begin() + at_a * V, out.logits.begin() + (at_a + 1) * V);
        if (with_b) got.b.emplace_back(out.logits.begin() + at_b * V, out.logits.begin() + (at_b + 1) * V);
      }
      got.pages = rn.take_page_counts();
      ta.release(rn.pages());
      tb.release(rn.pages());
      EXPECT_EQ(rn.pages().stats().n_used, 0);
      return got;
    };
    const std::string what = std::string(*own ? own : engine_policy) + " every " + std::to_string(every);
    const Run alone = run(*r, pol, true, false), mixed = run(*r, pol, true, true), b_alone = run(*r, pol, false, true);
    const Run dense = run(*runner("dense"), nullptr, true, false);
    float moved = 0.0f;
    for (size_t k = 0; k < a_dec.size(); ++k) {
      EXPECT_LT(max_diff(mixed.a[k].data(), alone.a[k].data(), V), kTol) << what << ", A at step " << k;
      EXPECT_LT(max_diff(mixed.b[k].data(), b_alone.b[k].data(), V), kTol) << what << ", B's chunk " << k;
      moved = std::max(moved, max_diff(alone.a[k].data(), dense.a[k].data(), V));
    }
    EXPECT_GT(moved, 1e-2f) << what << " reads every page here: the check is void";
    EXPECT_GT(alone.pages.total, alone.pages.read) << what;
    EXPECT_EQ(mixed.pages.read, alone.pages.read) << what;
    EXPECT_EQ(mixed.pages.total, alone.pages.total) << what;
    EXPECT_EQ(mixed.pages.layer_head_read, alone.pages.layer_head_read) << what;
  }
}

}  // namespace
}  // namespace dhs
