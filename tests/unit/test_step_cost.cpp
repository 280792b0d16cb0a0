// StepCost (kv/step_cost.h): a whole step's seconds fitted against its decode rows, prefill tokens
// and the pages the KV hierarchy moved, by decayed least squares. Checked against steps made from
// known coefficients, exactly without noise and within stated bounds with it; a covariate that
// does not vary is left out and the fixed part is then reported unknown.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "kv/step_cost.h"

namespace dhs {
namespace {

// 3 ms fixed, 0.25 ms a decode row, 40 µs a prefill token, 0.8 µs a page.
double truth(double rows, double tokens, double pages) { return 3e-3 + 2.5e-4 * rows + 4e-5 * tokens + 8e-7 * pages; }

TEST(StepCost, RecoversEveryCoefficientWhenEachVaries) {
  StepCost c;
  const double rows[] = {1, 4, 16, 9, 2, 12, 7};
  const double tokens[] = {0, 512, 0, 128, 0, 0, 2048};
  const double pages[] = {0, 5000, 20000, 300, 12000, 0, 7000};
  for (int rep = 0; rep < 20; ++rep)
    for (int i = 0; i < 7; ++i) c.observe(rows[i], tokens[(i + rep) % 7], pages[(i + 2 * rep) % 7], truth(rows[i], tokens[(i + rep) % 7], pages[(i + 2 * rep) % 7]));
  const StepCost::Fit f = c.fit();
  ASSERT_TRUE(f.ok);
  EXPECT_TRUE(f.rows_vary && f.tokens_vary && f.pages_vary && f.fixed_known);
  // (exact data: only the elimination's rounding; relative 1e-6 of each coefficient)
  EXPECT_NEAR(f.fixed, 3e-3, 3e-9);
  EXPECT_NEAR(f.per_row, 2.5e-4, 2.5e-10);
  EXPECT_NEAR(f.per_token, 4e-5, 4e-11);
  EXPECT_NEAR(f.per_page, 8e-7, 8e-13);
}

TEST(StepCost, WithinBoundsUnderNoise) {
  // ±0.5 ms of uniform noise a step (a sixth of the fixed part), 400 steps with decay 0.99
  // (~100 steps' weight): the fit's standard error is ~0.03 ms on the fixed part and ~0.02 µs a
  // page at these spreads; the bounds are about five of them.
  StepCost c(0.99);
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int> row(1, 16), tok(0, 3);
  std::uniform_int_distribution<int> page(0, 20000);
  std::uniform_real_distribution<double> noise(-5e-4, 5e-4);
  for (int i = 0; i < 400; ++i) {
    const double r = row(rng), t = 256.0 * tok(rng), p = page(rng);
    c.observe(r, t, p, truth(r, t, p) + noise(rng));
  }
  const StepCost::Fit f = c.fit();
  ASSERT_TRUE(f.ok && f.fixed_known);
  EXPECT_NEAR(f.fixed, 3e-3, 2e-4);
  EXPECT_NEAR(f.per_row, 2.5e-4, 2e-5);
  EXPECT_NEAR(f.per_token, 4e-5, 1e-6);
  EXPECT_NEAR(f.per_page, 8e-7, 1e-7);
}

TEST(StepCost, ACovariateThatDoesNotVaryIsLeftOutAndTheFixedPartIsUnknown) {
  // 16 rows every step (a saturated batch): the rows' cost cannot be told from the fixed part.
  StepCost c;
  for (int i = 0; i < 60; ++i) {
    const double p = (i % 3) * 6000.0;
    c.observe(16, 0, p, truth(16, 0, p));
  }
  StepCost::Fit f = c.fit();
  ASSERT_TRUE(f.ok);
  EXPECT_FALSE(f.rows_vary);
  EXPECT_TRUE(f.pages_vary);
  EXPECT_FALSE(f.fixed_known);
  EXPECT_NEAR(f.per_page, 8e-7, 1e-12);  // the pages still fitted
  EXPECT_NEAR(f.fixed, 3e-3 + 16 * 2.5e-4, 1e-9);  // what the intercept holds: fixed + the rows' mean cost
  // Pages that never move (0 every step) do not make the fixed part unknown; prefill tokens that
  // are always the same non-zero count do.
  StepCost d;
  for (int i = 0; i < 60; ++i) d.observe(1 + i % 8, 0, 0, truth(1 + i % 8, 0, 0));
  f = d.fit();
  ASSERT_TRUE(f.ok);
  EXPECT_TRUE(f.fixed_known && f.rows_vary && !f.pages_vary && !f.tokens_vary);
  EXPECT_NEAR(f.fixed, 3e-3, 1e-9);
  StepCost e;
  for (int i = 0; i < 60; ++i) e.observe(1 + i % 8, 64, 0, truth(1 + i % 8, 64, 0));
  f = e.fit();
  ASSERT_TRUE(f.ok);
  EXPECT_FALSE(f.fixed_known);
}

TEST(StepCost, CovariatesThatMoveTogetherGiveNoFit) {
  // Pages always 1,000 x rows: their costs cannot be told apart.
  StepCost c;
  for (int i = 0; i < 40; ++i) {
    const double r = 1 + i % 5;
    c.observe(r, 0, 1000 * r, truth(r, 0, 1000 * r));
  }
  EXPECT_FALSE(c.fit().ok);
  // Too few steps: no fit; bad observations are ignored; a bad decay is refused.
  StepCost d;
  d.observe(1, 0, 0, 1e-3);
  d.observe(2, 0, 0, 2e-3);
  EXPECT_FALSE(d.fit().ok);
  d.observe(-1, 0, 0, 1e-3);
  d.observe(1, 0, 0, -1.0);
  EXPECT_EQ(d.steps(), 0.98 + 1.0);
  EXPECT_THROW(StepCost(1.0), Error);
  EXPECT_THROW(StepCost(0.0), Error);
}

TEST(StepCost, OldStepsFade) {
  // 0.8 µs a page for a long while, then 3 µs: the fit follows.
  StepCost c(0.9);
  for (int i = 0; i < 200; ++i) c.observe(1 + i % 4, 0, (i % 3) * 5000.0, truth(1 + i % 4, 0, (i % 3) * 5000.0));
  EXPECT_NEAR(c.fit().per_page, 8e-7, 1e-12);
  for (int i = 0; i < 300; ++i) {
    const double r = 1 + i % 4, p = (i % 3) * 5000.0;
    c.observe(r, 0, p, truth(r, 0, p) + 2.2e-6 * p);
  }
  EXPECT_NEAR(c.fit().per_page, 3e-6, 1e-9);
}

}  // namespace
}  // namespace dhs
