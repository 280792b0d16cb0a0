// The speculation controller (engine/spec_controller.h): the step-cost fit, the acceptance
// estimate, the expected tokens of a cycle, and the choice of k.
//  * StepCostModel recovers w, m, p of t = w + m rows + p kv from steps of varied shapes (exact
//    data: within 1e-6 relative; the fit is linear least squares), and follows a change of costs
//    (forgetting): predictions within 7% of the new costs after 200 steps (bound derived below).
//  * spec_expected_tokens against a Monte-Carlo simulation of cycles with independent acceptance
//    (200,000 cycles: the mean within 4 standard errors).
//  * choose_speculation: k = 0 before the fit is ready, where weights dominate the step, where
//    drafts are rarely kept, and where each verify row reads the pages itself; k > 0 with the gain
//    it predicts recomputed by hand where the KV read dominates, verify reads it once and drafts
//    are kept.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/spec_controller.h"

namespace dhs {
namespace {

StepCostModel fitted(double w, double m, double p, int n = 64) {
  StepCostModel c;
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> rows(1, 64), ctx(100, 100000);
  for (int i = 0; i < n; ++i) {
    const double r = rows(rng), kv = r * ctx(rng);
    c.observe(r, kv, w + m * r + p * kv);
  }
  return c;
}

TEST(StepCostModel, RecoversTheCostsOfVariedSteps) {
  const StepCostModel c = fitted(4e-3, 2e-5, 3e-8);
  ASSERT_TRUE(c.ready());
  EXPECT_NEAR(c.fixed(), 4e-3, 4e-9);
  EXPECT_NEAR(c.per_row(), 2e-5, 2e-11);
  EXPECT_NEAR(c.per_kv_token(), 3e-8, 3e-14);
  EXPECT_NEAR(c.predict(8, 8 * 5000), 4e-3 + 8 * 2e-5 + 8 * 5000 * 3e-8, 1e-9);
}

TEST(StepCostModel, NotReadyUntilShapesVary) {
  StepCostModel c;
  for (int i = 0; i < 50; ++i) c.observe(1, 1000 + i, 1e-3);  // one row always: w and m are one term
  EXPECT_FALSE(c.ready());
  c.observe(5, 5000, 2e-3);
  EXPECT_TRUE(c.ready());
}

TEST(StepCostModel, FollowsAChangeOfCosts) {
  StepCostModel c = fitted(4e-3, 2e-5, 3e-8);
  std::mt19937 rng(2);
  std::uniform_int_distribution<int> rows(1, 64), ctx(100, 100000);
  for (int i = 0; i < 200; ++i) {
    const double r = rows(rng), kv = r * ctx(rng);
    c.observe(r, kv, 1e-3 + 5e-5 * r + 1e-8 * kv);
  }
  // The old costs keep a weight of 0.98^200 = 1.8% in the fit, and differ from the new ones by
  // less than 3x on these shapes: predictions within 2 x 1.8% x 2 (about 7%) of the new costs.
  for (double r : {1.0, 8.0, 64.0})
    for (double ctx : {1000.0, 100000.0}) {
      const double want = 1e-3 + 5e-5 * r + 1e-8 * r * ctx;
      EXPECT_NEAR(c.predict(r, r * ctx), want, 0.07 * want) << "rows " << r << " ctx " << ctx;
    }
}

TEST(AcceptanceEstimate, StartsAtThePriorAndFollowsCycles) {
  AcceptanceEstimate a(0.6, 4.0, 0.9);
  EXPECT_DOUBLE_EQ(a.alpha(), 0.6);
  // Steady state: the cycles weigh S = 4 / (1 - 0.9) = 40 drafts against the prior's 4, so
  // alpha = (kept share x 40 + 0.6 x 4) / 44; after 60 cycles the older ones weigh 0.9^60 < 0.2%.
  for (int i = 0; i < 60; ++i) a.observe(4, 1);  // a quarter kept
  EXPECT_NEAR(a.alpha(), (0.25 * 40 + 2.4) / 44, 2e-3);
  for (int i = 0; i < 60; ++i) a.observe(4, 4);
  EXPECT_NEAR(a.alpha(), (1.0 * 40 + 2.4) / 44, 2e-3);
}

TEST(SpecExpectedTokens, MatchesSimulatedCycles) {
  EXPECT_DOUBLE_EQ(spec_expected_tokens(0.0, 4), 1.0);
  EXPECT_DOUBLE_EQ(spec_expected_tokens(1.0, 4), 5.0);
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (double a : {0.3, 0.7, 0.9})
    for (int k : {1, 3, 8}) {
      const int n = 200000;
      double sum = 0, sq = 0;
      for (int c = 0; c < n; ++c) {
        int kept = 0;
        while (kept < k && u(rng) < a) ++kept;
        const double t = kept + 1;  // the kept drafts and the verifier's token
        sum += t;
        sq += t * t;
      }
      const double mean = sum / n, se = std::sqrt((sq / n - mean * mean) / n);
      EXPECT_NEAR(spec_expected_tokens(a, k), mean, 4 * se) << "a " << a << " k " << k;
    }
}

TEST(ChooseSpeculation, OffWhereItWouldNotPay) {
  SpecCostInputs in{.context = 100000, .draft_context = 256, .batch = 1, .verify_reads_once = true};
  EXPECT_EQ(choose_speculation(StepCostModel{}, 0.9, in, 8).k, 0) << "no fit yet";
  // Weights dominate (w 10 ms, KV 1e-11 s a token): a draft step costs what a full one does.
  EXPECT_EQ(choose_speculation(fitted(1e-2, 1e-5, 1e-11), 0.9, in, 8).k, 0);
  // The KV dominates, but drafts are rarely kept.
  const StepCostModel kv_bound = fitted(1e-3, 1e-5, 1e-7);
  EXPECT_EQ(choose_speculation(kv_bound, 0.05, in, 8).k, 0);
  // Each verify row reads the pages itself: the cycle reads them k + 1 times for E < k + 1 tokens.
  in.verify_reads_once = false;
  EXPECT_EQ(choose_speculation(kv_bound, 0.9, in, 8).k, 0);
  EXPECT_EQ(choose_speculation(kv_bound, 0.9, {.context = 100000, .draft_context = 256}, 0).k, 0) << "k_max 0";
}

TEST(ChooseSpeculation, OnWhereTheKvReadDominates) {
  const double w = 1e-3, m = 1e-5, p = 1e-7;
  const StepCostModel c = fitted(w, m, p);
  const SpecCostInputs in{.context = 100000, .draft_context = 256, .batch = 1, .verify_reads_once = true};
  const SpecChoice got = choose_speculation(c, 0.9, in, 8);
  ASSERT_GT(got.k, 0);
  // The gain it reports, by hand: E tokens for k drafts and a verify, against E plain steps.
  const double plain = w + m + p * 100000;
  const double cycle = got.k * (w + m + p * 256) + w + (got.k + 1) * m + p * 100000;
  EXPECT_NEAR(got.gain, spec_expected_tokens(0.9, got.k) * plain / cycle, 1e-6 * got.gain);
  // and no other k does better.
  for (int k = 1; k <= 8; ++k) {
    const double ck = k * (w + m + p * 256) + w + (k + 1) * m + p * 100000;
    EXPECT_LE(spec_expected_tokens(0.9, k) * plain / ck, got.gain * (1 + 1e-9)) << "k " << k;
  }
  // Short context: the same costs, nothing to gain.
  EXPECT_EQ(choose_speculation(c, 0.9, {.context = 300, .draft_context = 256, .verify_reads_once = true}, 8).k, 0);
}

}  // namespace
}  // namespace dhs
