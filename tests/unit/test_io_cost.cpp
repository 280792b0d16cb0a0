// IoCost (kv/io_cost.h): a moved page's cost to a step, fitted by decayed least squares of the
// hierarchy's seconds against the pages moved, never below the link's cost. Checked against
// steps made from a known fixed cost and per-page cost, with and without noise.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "kv/io_cost.h"

namespace dhs {
namespace {

constexpr double kLink = 75e-9;  // 4 KiB at 55 GB/s

TEST(IoCost, IsTheLinksCostUntilTheStepsDiffer) {
  IoCost c(kLink);
  EXPECT_EQ(c.per_page_seconds(), kLink);
  // The same pages every step: a slope cannot be told from the fixed cost.
  for (int i = 0; i < 50; ++i) c.observe(1000, 2e-3);
  EXPECT_EQ(c.per_page_seconds(), kLink);
  EXPECT_THROW(IoCost(-1.0), Error);
  EXPECT_THROW(IoCost(kLink, 1.0), Error);
}

TEST(IoCost, FitsThePerPageCostAndLeavesTheFixedCostOut) {
  // 2 ms a step whatever moves, 1 µs a page: the per-page cost is 1 µs, not (2 ms + ...) / pages.
  IoCost c(kLink);
  const int64_t pages[] = {0, 5000, 200, 12000, 800, 9000, 3000};
  for (int rep = 0; rep < 10; ++rep)
    for (const int64_t p : pages) c.observe(p, 2e-3 + 1e-6 * static_cast<double>(p));
  EXPECT_NEAR(c.per_page_seconds(), 1e-6, 1e-12);
  // Noise of ±0.2 ms a step: within 5% over 200 steps.
  IoCost n(kLink);
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int64_t> pick(0, 12000);
  std::uniform_real_distribution<double> noise(-2e-4, 2e-4);
  for (int i = 0; i < 200; ++i) {
    const int64_t p = pick(rng);
    n.observe(p, 2e-3 + 1e-6 * static_cast<double>(p) + noise(rng));
  }
  EXPECT_NEAR(n.per_page_seconds(), 1e-6, 5e-8);
}

TEST(IoCost, NeverBelowTheLinkAndFollowsAChange) {
  // Host time that falls as pages grow (another cost moving with them) gives no negative price.
  IoCost c(kLink);
  for (int i = 0; i < 40; ++i) c.observe(i % 2 ? 10000 : 0, i % 2 ? 1e-3 : 3e-3);
  EXPECT_EQ(c.per_page_seconds(), kLink);
  // Old steps fade: after 1 µs a page for a long while, 3 µs a page takes over.
  IoCost d(kLink, 0.9);
  for (int i = 0; i < 100; ++i) d.observe(i % 2 ? 10000 : 1000, (i % 2 ? 10000 : 1000) * 1e-6);
  EXPECT_NEAR(d.per_page_seconds(), 1e-6, 1e-12);
  for (int i = 0; i < 200; ++i) d.observe(i % 2 ? 10000 : 1000, (i % 2 ? 10000 : 1000) * 3e-6);
  EXPECT_NEAR(d.per_page_seconds(), 3e-6, 1e-9);
}

}  // namespace
}  // namespace dhs
