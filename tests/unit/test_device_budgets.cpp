// The cache manager's budgets (kv/device_budgets.h) against its stated rules, with hand-computed
// expectations: the averages, the buffer's adaptation and its bounds, and the sharing of the device
// tier between requests (room for all, the wanted budgets, working sets plus a proportional share,
// scaled working sets, requests still warming up).
#include "kv/device_budgets.h"

#include <gtest/gtest.h>

#include <cmath>

namespace dhs {
namespace {

BudgetParams params() {
  BudgetParams p;
  p.buffer = 0.5;
  p.min_buffer = 0.1;
  p.max_buffer = 4.0;
  p.grow = 1.5;
  p.shrink = 0.9;
  p.target_miss = 0.02;
  p.avg = 0.5;
  p.warmup = 2;
  return p;
}

TEST(DeviceBudgets, AveragesAndBufferAdaptation) {
  DeviceBudgets b(params());
  b.observe(1, 100, 10);  // first step: taken as is; miss 0.1 > 0.02: the buffer grows
  DeviceBudgets::State s = b.state(1);
  EXPECT_DOUBLE_EQ(s.working_set, 100.0);
  EXPECT_DOUBLE_EQ(s.miss, 0.1);
  EXPECT_DOUBLE_EQ(s.buffer, 0.75);
  EXPECT_EQ(s.steps, 1);
  b.observe(1, 200, 0);  // averages: 150 pages, miss 0.05 (still above the target): grows again
  s = b.state(1);
  EXPECT_DOUBLE_EQ(s.working_set, 150.0);
  EXPECT_DOUBLE_EQ(s.miss, 0.05);
  EXPECT_DOUBLE_EQ(s.buffer, 1.125);
  b.observe(1, 150, 0);  // miss 0.025: above 0.02, grows
  EXPECT_DOUBLE_EQ(b.state(1).buffer, 1.6875);
  b.observe(1, 150, 0);  // miss 0.0125: between a quarter of the target and it: unchanged
  EXPECT_DOUBLE_EQ(b.state(1).buffer, 1.6875);
  b.observe(1, 150, 0);  // 0.00625: unchanged (not below 0.005)
  b.observe(1, 150, 0);  // 0.003125 < 0.005: shrinks
  EXPECT_DOUBLE_EQ(b.state(1).buffer, 1.6875 * 0.9);
  for (int i = 0; i < 200; ++i) b.observe(1, 150, 0);
  EXPECT_DOUBLE_EQ(b.state(1).buffer, 0.1);  // the lower bound
  for (int i = 0; i < 200; ++i) b.observe(1, 150, 150);
  EXPECT_DOUBLE_EQ(b.state(1).buffer, 4.0);  // the upper bound
  b.observe(1, 0, 0);  // a step that read nothing changes nothing
  EXPECT_EQ(b.state(1).steps, 406);
  b.forget(1);
  EXPECT_EQ(b.state(1).steps, 0);
}

// The miss target the runner's link rule sets (set_target_miss): kept within [min_target_miss,
// max_target_miss], and from the next step on it decides the buffer's adaptation: a request
// missing 5% a step keeps its buffer under a target of 0.1 (0.05 is neither above it nor below a
// quarter of it), grows it under 0.01, and shrinks it once its average falls below 0.025.
TEST(DeviceBudgets, TheMissTargetInForceDecidesTheBuffersAdaptation) {
  BudgetParams p = params();
  p.min_target_miss = 0.001;
  p.max_target_miss = 0.1;
  DeviceBudgets b(p);
  EXPECT_DOUBLE_EQ(b.target_miss(), 0.02);
  b.set_target_miss(0.3);
  EXPECT_DOUBLE_EQ(b.target_miss(), 0.1);
  b.set_target_miss(1e-9);
  EXPECT_DOUBLE_EQ(b.target_miss(), 0.001);
  b.set_target_miss(std::nan(""));  // (no price measured: the loosest target, not a NaN comparison)
  EXPECT_DOUBLE_EQ(b.target_miss(), 0.1);
  b.observe(1, 100, 5);  // miss 0.05 < 0.1 and >= 0.025: unchanged
  EXPECT_DOUBLE_EQ(b.state(1).buffer, 0.5);
  b.set_target_miss(0.01);
  b.observe(1, 100, 5);  // 0.05 > 0.01: grows
  EXPECT_DOUBLE_EQ(b.state(1).buffer, 0.75);
  b.set_target_miss(0.3);  // (clamped to 0.1)
  b.observe(1, 100, 5);
  EXPECT_DOUBLE_EQ(b.state(1).buffer, 0.75);
  b.set_target_miss(0.1);
  b.observe(1, 100, 0);  // miss average 0.025: not below 0.025, unchanged
  EXPECT_DOUBLE_EQ(b.state(1).buffer, 0.75);
  b.observe(1, 100, 0);  // 0.0125 < 0.025: shrinks
  EXPECT_DOUBLE_EQ(b.state(1).buffer, 0.75 * 0.9);
}

// Two observed requests at working sets 100 and 300, two steps each without a miss (buffer
// 0.5 -> 0.45 -> 0.405: a miss rate of 0 is below a quarter of the target).
DeviceBudgets two_requests() {
  DeviceBudgets b(params());
  for (int i = 0; i < 2; ++i) {
    b.observe(1, 100, 0);
    b.observe(2, 300, 0);
  }
  return b;
}

TEST(DeviceBudgets, RoomForEverythingOffloadsNothing) {
  const DeviceBudgets b = two_requests();
  const DeviceBudgets::Request r[] = {{1, 500}, {2, 700}};
  bool bound = true;
  const std::vector<int64_t> got = b.budgets(r, 1200, &bound);
  EXPECT_EQ(got[0], DeviceBudgets::kUnlimited);
  EXPECT_EQ(got[1], DeviceBudgets::kUnlimited);
  EXPECT_FALSE(bound);
}

TEST(DeviceBudgets, SharesByTheRules) {
  const DeviceBudgets b = two_requests();
  const double buf = 0.5 * 0.9 * 0.9;  // 0.405
  ASSERT_DOUBLE_EQ(b.state(1).buffer, buf);
  const int64_t want1 = static_cast<int64_t>(std::ceil(100 * (1 + buf)));  // 141
  const int64_t want2 = static_cast<int64_t>(std::ceil(300 * (1 + buf)));  // 422
  const DeviceBudgets::Request r[] = {{1, 500}, {2, 700}};
  // The wanted budgets fit: the pool did not bind them.
  bool bound = true;
  std::vector<int64_t> got = b.budgets(r, 1000, &bound);
  EXPECT_EQ(got[0], want1);
  EXPECT_EQ(got[1], want2);
  EXPECT_FALSE(bound);
  // Working sets fit (400), the wanted ones (563) not: 100 + 300, then 100 pages left shared in
  // proportion to the buffers wanted (41 : 122).
  got = b.budgets(r, 500, &bound);
  EXPECT_TRUE(bound);
  EXPECT_EQ(got[0], 100 + static_cast<int64_t>(std::floor(100.0 * (want1 - 100) / (want1 + want2 - 400))));
  EXPECT_EQ(got[1], 300 + static_cast<int64_t>(std::floor(100.0 * (want2 - 300) / (want1 + want2 - 400))));
  EXPECT_LE(got[0] + got[1], 500);
  // Not even the working sets: scaled alike, 200 pages as 1 : 3.
  bound = false;
  got = b.budgets(r, 200, &bound);
  EXPECT_TRUE(bound);
  EXPECT_EQ(got[0], 50);
  EXPECT_EQ(got[1], 150);
  // A budget never exceeds the pages a request holds.
  const DeviceBudgets::Request small[] = {{1, 120}, {2, 700}};
  got = b.budgets(small, 600);
  EXPECT_EQ(got[0], 120);
  EXPECT_EQ(got[1], want2);
}

TEST(DeviceBudgets, WarmingUpRequestsKeepWhatTheyHold) {
  DeviceBudgets b = two_requests();
  b.observe(3, 50, 0);  // one step: below warmup 2
  const DeviceBudgets::Request r[] = {{1, 500}, {2, 700}, {3, 300}};
  // 1,000 pages: request 3 keeps its 300, the others share 700 (their wanted 563 fit).
  std::vector<int64_t> got = b.budgets(r, 1000);
  EXPECT_EQ(got[2], DeviceBudgets::kUnlimited);
  EXPECT_EQ(got[0], 141);
  EXPECT_EQ(got[1], 422);
  // Request 3 holding more than the device tier: the others' share is 0.
  const DeviceBudgets::Request big[] = {{1, 500}, {2, 700}, {3, 2000}};
  got = b.budgets(big, 1000);
  EXPECT_EQ(got[0], 0);
  EXPECT_EQ(got[1], 0);
  EXPECT_EQ(got[2], DeviceBudgets::kUnlimited);
}

}  // namespace
}  // namespace dhs
