// The batched step (engine/step_runner.h) on the CPU runner, with a tiny random Qwen2 checkpoint
// (tests/data/tiny_models/qwen2_bias, 300-token vocabulary): requests in one step -- prefill
// chunks and decode tokens mixed, each its own table and slot -- give the logits each gives
// alone, and sampling in the step returns what the host sampler returns on those logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "../test_paths.h"
#include "engine/sampler.h"
#include "engine/step_runner.h"
#include "kv/page_table.h"
#include "model/model_loader.h"

namespace dhs {
namespace {

// Rows of one batch are computed by the same per-row kernels as alone, but attention over a
// batch and the threaded GEMMs may split work differently: logits here span about +-7 and
// agree to ~1e-6; 1e-4 still catches a row read from the wrong request (differences ~0.1-5).
constexpr float kTol = 1e-4f;

class StepBatch : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = open_weights(test::data_dir() + "/tiny_models/qwen2_bias");
    EngineOptions o;
    o.weight_type = "f32";
    runner_ = make_cpu_runner(*src_, o, 256);
  }
  PageTable table() const {
    const ModelConfig& c = runner_->config();
    return PageTable(static_cast<int>(c.n_layers), static_cast<int>(c.n_heads_kv), 16);
  }
  void reserve(PageTable& t, int64_t n) { ASSERT_TRUE(t.reserve(runner_->pages(), n)); }
  // One request alone: logits of the last token after feeding `ids`.
  std::vector<float> alone(PageTable& t, const std::vector<int32_t>& ids) {
    reserve(t, static_cast<int64_t>(ids.size()));
    StepOutput out;
    runner_->step({StepRequest{&t, 0, ids.data(), static_cast<int64_t>(ids.size())}}, &out, true);
    return out.logits;
  }
  void expect_near(const float* got, const std::vector<float>& want) {
    float worst = 0.0f;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
    EXPECT_LT(worst, kTol);
  }
  void release(std::vector<PageTable*> ts) {
    for (PageTable* t : ts) t->release(runner_->pages());
    EXPECT_EQ(runner_->pages().check_invariants(), "");
    EXPECT_EQ(runner_->pages().stats().n_used, 0);
  }

  std::unique_ptr<WeightSource> src_;
  std::unique_ptr<StepRunner> runner_;
};

TEST_F(StepBatch, MixedPrefillAndDecodeRowsEqualEachAlone) {
  const int64_t V = runner_->config().vocab_size;
  const std::vector<int32_t> a = {5, 17, 99, 3, 250, 41, 7}, b = {11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29};
  const std::vector<int32_t> b2 = {31, 32, 33};
  const int32_t a_next = 64;
  // Alone: a's prompt then one decode token; b's prompt in two chunks (17 tokens cross a page).
  PageTable ta = table(), tb = table();
  (void)alone(ta, a);
  const std::vector<float> want_a = alone(ta, {a_next});
  (void)alone(tb, b);
  const std::vector<float> want_b = alone(tb, b2);
  release({&ta, &tb});

  // Batched: step 1 prefills both prompts; step 2 mixes a's decode token with b's second chunk.
  PageTable ba = table(), bb = table();
  reserve(ba, static_cast<int64_t>(a.size()));
  reserve(bb, static_cast<int64_t>(b.size()));
  StepOutput out;
  runner_->step({StepRequest{&ba, 0, a.data(), static_cast<int64_t>(a.size())},
                 StepRequest{&bb, 1, b.data(), static_cast<int64_t>(b.size())}},
                &out, true);
  ASSERT_EQ(out.logits.size(), static_cast<size_t>(2 * V));
  reserve(ba, 1);
  reserve(bb, static_cast<int64_t>(b2.size()));
  runner_->step({StepRequest{&bb, 1, b2.data(), static_cast<int64_t>(b2.size())},
                 StepRequest{&ba, 0, &a_next, 1}},
                &out, true);
  ASSERT_EQ(out.logits.size(), static_cast<size_t>(2 * V));
  expect_near(out.logits.data(), want_b);
  expect_near(out.logits.data() + V, want_a);
  EXPECT_EQ(ba.n_tokens(), static_cast<int64_t>(a.size()) + 1);
  EXPECT_EQ(bb.n_tokens(), static_cast<int64_t>(b.size() + b2.size()));
  release({&ba, &bb});
}

TEST_F(StepBatch, SamplingInTheStepMatchesTheHostSampler) {
  const int64_t V = runner_->config().vocab_size;
  const std::vector<int32_t> a = {5, 17, 99, 3}, b = {200, 201, 202, 203, 204};
  SamplingParams greedy, hot;
  hot.temperature = 1.3f;
  hot.top_p = 0.9f;
  hot.repetition_penalty = 1.2f;
  hot.seed = 42;
  runner_->begin_request(0, greedy);
  runner_->begin_request(1, hot);
  // Logits alone first, then what a fresh host Sampler with the same parameters draws from them.
  PageTable ta = table(), tb = table();
  std::vector<float> la = alone(ta, a), lb = alone(tb, b);
  release({&ta, &tb});
  const int32_t want_a = static_cast<int32_t>(std::max_element(la.begin(), la.end()) - la.begin());
  Sampler host_b(hot);
  const int32_t want_b = host_b.sample(lb.data(), V, b);

  PageTable ba = table(), bb = table();
  reserve(ba, static_cast<int64_t>(a.size()));
  reserve(bb, static_cast<int64_t>(b.size()));
  StepOutput out;
  runner_->step({StepRequest{&ba, 0, a.data(), static_cast<int64_t>(a.size()), true, &a},
                 StepRequest{&bb, 1, b.data(), static_cast<int64_t>(b.size()), true, &b}},
                &out, false);
  EXPECT_TRUE(out.logits.empty()) << "logits copied back though not asked for";
  ASSERT_EQ(out.sampled.size(), 2u);
  EXPECT_EQ(out.sampled[0], want_a);
  EXPECT_EQ(out.sampled[1], want_b);
  release({&ba, &bb});
}

TEST_F(StepBatch, PaddingIdsAreMaskedAndBadSlotsRefused) {
  // Only ids [0, 10) may come out: greedy picks the best of those.
  runner_->set_sampled_vocab(10);
  runner_->begin_request(0, SamplingParams{});
  const std::vector<int32_t> a = {1, 2, 3};
  PageTable ta = table();
  const std::vector<float> la = alone(ta, a);
  release({&ta});
  ASSERT_GE(std::max_element(la.begin(), la.end()) - la.begin(), 10) << "pick a prompt whose argmax is past 10";
  const int32_t want = static_cast<int32_t>(std::max_element(la.begin(), la.begin() + 10) - la.begin());
  PageTable tb = table();
  reserve(tb, 3);
  StepOutput out;
  runner_->step({StepRequest{&tb, 0, a.data(), 3, true, &a}}, &out, false);
  EXPECT_EQ(out.sampled.at(0), want);
  release({&tb});
  EXPECT_THROW(runner_->set_sampled_vocab(0), Error);
  EXPECT_THROW(runner_->set_sampled_vocab(runner_->config().vocab_size + 1), Error);
  EXPECT_THROW(runner_->begin_request(-1, SamplingParams{}), Error);
  SamplingParams bad;
  bad.top_p = 0.0f;
  EXPECT_THROW(runner_->begin_request(0, bad), Error);
  // A slot that never began a request cannot sample.
  PageTable tc = table();
  reserve(tc, 3);
  EXPECT_THROW(runner_->step({StepRequest{&tc, 7, a.data(), 3, true, &a}}, &out, false), Error);
  release({&tc});
}

}  // namespace
}  // namespace dhs
