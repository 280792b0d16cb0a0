// Sampler and stop strings: each filter against its definition, seeded draws
// against empirical frequencies.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/error.h"
#include "engine/sampler.h"
#include "engine/stop_matcher.h"

namespace dhs {
namespace {

std::map<int32_t, int> histogram(const SamplingParams& p, std::vector<float> logits, int n) {
  Sampler s(p);
  std::map<int32_t, int> h;
  for (int i = 0; i < n; ++i) {
    auto l = logits;
    h[s.sample(l.data(), static_cast<int64_t>(l.size()), {})]++;
  }
  return h;
}

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler s(SamplingParams{});
  std::vector<float> l = {0.1f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(s.sample(l.data(), 4, {}), 1);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  std::vector<float> l = {4.0f, 3.0f, -1.0f};
  // Token 0 seen: 4 -> 2, so token 1 (3.0) wins greedy.
  EXPECT_EQ(s.sample(l.data(), 3, {0, 2}), 1);
  EXPECT_FLOAT_EQ(l[0], 2.0f);
  EXPECT_FLOAT_EQ(l[2], -2.0f);
}

TEST(Sampler, TemperatureMatchesSoftmaxFrequencies) {
  SamplingParams p;
  p.temperature = 0.5f;
  p.seed = 1;
  const std::vector<float> l = {0.0f, 0.5f, 1.0f};
  const int n = 40000;
  auto h = histogram(p, l, n);
  double z = 0;
  for (float x : l) z += std::exp(x / 0.5);
  for (int i = 0; i < 3; ++i) {
    const double pi = std::exp(l[i] / 0.5) / z;
    const double sd = std::sqrt(pi * (1 - pi) / n);
    EXPECT_NEAR(h[i] / static_cast<double>(n), pi, 5 * sd) << i;  // 5 sigma: flaky never, wrong always
  }
}

TEST(Sampler, TopKTopPMinPRestrictSupport) {
  const std::vector<float> l = {2.0f, 1.9f, 1.0f, 0.0f, -5.0f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  for (auto& [id, c] : histogram(p, l, 2000)) EXPECT_LT(id, 2);
  p.top_k = 0;
  p.top_p = 0.5f;  // p(0) ~ 0.43, p(1) ~ 0.39: nucleus {0, 1}
  auto h = histogram(p, l, 2000);
  for (auto& [id, c] : h) EXPECT_LT(id, 2);
  EXPECT_GT(h[1], 0);
  p.top_p = 1.0f;
  p.min_p = 0.3f;  // keeps tokens with p >= 0.3 p_max: ids 0, 1 (p(2)/p(0) = e^-1 = 0.37 also kept)
  h = histogram(p, l, 4000);
  for (auto& [id, c] : h) EXPECT_LT(id, 3);
  EXPECT_GT(h[2], 0);
}

TEST(Sampler, SameSeedSameDraws) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 99;
  std::vector<float> l(50);
  for (int i = 0; i < 50; ++i) l[i] = std::sin(i * 1.3f);
  Sampler a(p), b(p);
  for (int i = 0; i < 100; ++i) {
    auto la = l, lb = l;
    ASSERT_EQ(a.sample(la.data(), 50, {}), b.sample(lb.data(), 50, {}));
  }
}

TEST(Sampler, RejectsBadParameters) {
  SamplingParams p;
  p.temperature = -1.0f;
  EXPECT_THROW(validate(p), Error);
  p = {};
  p.top_p = 0.0f;
  EXPECT_THROW(validate(p), Error);
  p = {};
  p.min_p = 1.5f;
  EXPECT_THROW(validate(p), Error);
  p = {};
  p.repetition_penalty = 0.0f;
  EXPECT_THROW(validate(p), Error);
}

TEST(StopMatcher, HoldsBackPossiblePrefixAndCutsAtStop) {
  StopMatcher m({"###", "\nUser:"});
  std::string out;
  out += m.push("Hello #");
  EXPECT_EQ(out, "Hello ");  // "#" could start "###"
  out += m.push("# no");
  EXPECT_EQ(out, "Hello ## no");
  out += m.push(" end\nUs");
  EXPECT_EQ(out, "Hello ## no end");
  out += m.push("er: hi");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(out, "Hello ## no end");
  EXPECT_EQ(m.push("more"), "");
}

TEST(StopMatcher, FlushReleasesHeldTextWhenNoStop) {
  StopMatcher m({"STOP"});
  std::string out = m.push("abc ST");
  EXPECT_EQ(out, "abc ");
  out += m.finish();
  EXPECT_EQ(out, "abc ST");
  StopMatcher none({});
  EXPECT_EQ(none.push("x"), "x");
}

}  // namespace
}  // namespace dhs
