// RunnerTiers (engine/runner_tiers.h), the KV hierarchy as both runners keep it: the options it
// refuses, and the I/O load IO-aware admission reads — pages moved or read in place per step, at
// the page's bytes, over what the link moves in the step's seconds, averaged with the newest step
// at 0.3 — against hand-computed values.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/runner_tiers.h"

namespace dhs {
namespace {

constexpr int kPage = 4, kDim = 2, kLayers = 2, kHeads = 1;

TEST(RunnerTiers, RefusesWhatNeedsAHostTierWithoutOne) {
  EngineOptions o;
  EXPECT_EQ(RunnerTiers::host_pages(o, 1024), 0);
  o.cpu_kv_gb = 1.0;
  EXPECT_EQ(RunnerTiers::host_pages(o, 1024), 1 << 20);
  o.cpu_kv_gb = 0.0;
  o.kv_device_budget = 10;
  EXPECT_THROW(RunnerTiers::host_pages(o, 1024), Error);
  o.kv_device_budget = 0;
  o.kv_recall = "ahead";
  EXPECT_THROW(RunnerTiers::host_pages(o, 1024), Error);
  o.cpu_kv_gb = 1.0;
  o.kv_recall = "later";
  EXPECT_THROW(RunnerTiers::host_pages(o, 1024), Error);
  o.kv_recall = "land";
  EXPECT_EQ(RunnerTiers::host_pages(o, 1024), 1 << 20);
  o.cpu_kv_gb = 0.0;
  EXPECT_THROW(RunnerTiers::host_pages(o, 1024), Error);  // (land needs the host tier too)
}

TEST(RunnerTiers, IoLoadIsPagesMovedOverTheLinksCapacity) {
  PagePool dev(Tier::Device, 16, kPage, kDim);
  EngineOptions o;
  o.cpu_kv_gb = 1.0;
  o.kv_device_budget = 4;
  int64_t clock = 0;
  RunnerTiers tiers(dev, std::make_unique<PagePool>(Tier::Host, 64, kPage, kDim), o, kLayers, [&] { return clock; });
  EXPECT_THROW(tiers.set_io_rate(0.0, 1000), Error);
  // 1e-6 GB/s (1,000 B/s) and pages of 1,000 B: one page moved in a 1 s step fills the link.
  tiers.set_io_rate(1e-6, 1000);
  EXPECT_EQ(tiers.io_load(), 0.0);
  PageTable t(kLayers, kHeads, kPage);
  ASSERT_TRUE(t.reserve(dev, 32));  // 8 pages per list, 16 in all: the pool full
  t.commit(32);
  tiers.kv().add(t, 0, 16);
  tiers.kv().set_budget(t, 4, 0);  // 12 offloaded
  tiers.end_step_io(2.0);          // 12 pages in 2 s at 1 page/s: a load of 6, averaged: 1.8
  EXPECT_NEAR(tiers.io_load(), 0.3 * 6.0, 1e-12);
  tiers.end_step_io(1.0);          // nothing moved since: 0.7 x 1.8
  EXPECT_NEAR(tiers.io_load(), 0.7 * 1.8, 1e-12);
  // Two offloaded pages read in place (late) and one of them recalled in a 0.5 s step: 3 pages
  // in 0.5 s, a load of 6.
  std::vector<PageId> late;
  for (int l = 0; l < kLayers && late.size() < 2; ++l)
    for (int64_t i = 0; i < 8 && late.size() < 2; ++i)
      if (t.page(l, 0, i).tier == Tier::Host) late.push_back({l, 0, i});
  ASSERT_EQ(late.size(), 2u);
  EXPECT_EQ(tiers.kv().note_reads(t, late, 1).late, 2);
  tiers.kv().set_budget(t, 5, 1);
  EXPECT_EQ(tiers.kv().recall_ahead(t, std::vector<PageId>{late[0]}, 1).recalled, 1);
  tiers.end_step_io(0.5);
  EXPECT_NEAR(tiers.io_load(), 0.7 * (0.7 * 1.8) + 0.3 * 6.0, 1e-12);
  EXPECT_EQ(tiers.check(), "");
  EXPECT_TRUE(tiers.release(t));
  EXPECT_FALSE(tiers.release(t));
}

// What admitting a request would add (io_load_admitting): the working sets beyond the device pool
// cross the link every step. Pool 16 pages; t holds 8 full pages and its decode step read 3 of
// them (working set 3, read fraction 3/8); u holds 8 and has not decoded (counted at 3/8 of
// them: 3). At 1,000 B/s, 1,000-B pages and 1 s steps, a page over the pool a step is a load of 1.
// On the recall-ahead schedule (landing too) a page over the pool is counted twice a step, as
// end_step_io counts it: a late read and a recall.
class AdmittingPrices : public ::testing::TestWithParam<const char*> {};

// The scene of the AdmittingPrices tests: pool 16 pages, a 64-page host tier, 1,000-B pages at
// 1,000 B/s (a page: 1 s); t and u hold 8 full pages each; the batch is t's decode row beside u's
// 4 prompt rows. reads(): the step's part after before_step — t reads 3 of its pages.
struct AdmitScene {
  explicit AdmitScene(const std::string& recall, bool manager = false)
      : tiers(dev, std::make_unique<PagePool>(Tier::Host, 64, kPage, kDim), options(recall, manager), kLayers, [this] { return clock; }) {
    tiers.set_io_rate(1e-6, 1000);
    for (PageTable* x : {&t, &u}) {
      EXPECT_TRUE(x->reserve(dev, 16));  // 4 pages per list, 8 in all
      x->commit(16);
    }
  }
  static EngineOptions options(const std::string& recall, bool manager) {
    EngineOptions o;
    o.cpu_kv_gb = 1.0;
    o.kv_recall = recall;
    o.kv_budget_auto = manager;
    return o;
  }
  void reads() {
    const std::vector<TierStats> before = tiers.stats_of(batch);
    EXPECT_EQ(tiers.kv().note_reads(t, std::vector<PageId>{{0, 0, 0}, {0, 0, 1}, {1, 0, 3}}, clock).hits, 3);
    tiers.after_step(batch, before);
  }
  void end() {
    EXPECT_EQ(tiers.check(), "");
    EXPECT_TRUE(tiers.release(t));
    EXPECT_TRUE(tiers.release(u));
  }
  PagePool dev{Tier::Device, 16, kPage, kDim};
  int64_t clock = 0;
  RunnerTiers tiers;
  PageTable t{kLayers, kHeads, kPage}, u{kLayers, kHeads, kPage};
  const int32_t tok[4] = {1, 2, 3, 4};
  const std::vector<StepRequest> batch = {StepRequest{.table = &t, .slot = 0, .tokens = tok, .n_new = 1},
                                          StepRequest{.table = &u, .slot = 1, .tokens = tok, .n_new = 4}};
};

TEST_P(AdmittingPrices, TheWorkingSetsPushedOutOfThePool) {
  const std::string recall = GetParam();
  const double per_page = recall == "layer" ? 1.0 : 2.0;
  AdmitScene sc(recall);
  RunnerTiers& tiers = sc.tiers;
  tiers.before_step(sc.batch);
  EXPECT_EQ(tiers.io_load_admitting(16), 0.0);  // nothing registered reads yet: 16 pages fit
  EXPECT_EQ(tiers.io_load_admitting(17), 1.0) << "no step measured yet: counted as a full link";
  sc.reads();
  tiers.end_step_io(1.0);  // nothing moved: load 0
  EXPECT_EQ(tiers.io_load(), 0.0);
  EXPECT_EQ(tiers.io_load_admitting(0), 0.0);
  EXPECT_EQ(tiers.io_load_admitting(26), 0.0);             // 3 + 3 + 3/8 x 26 = 15.75 <= 16: cold pages only
  EXPECT_NEAR(tiers.io_load_admitting(32), 2.0 * per_page, 1e-12);  // 6 + 12 = 18: 2 pages a step
  EXPECT_NEAR(tiers.io_load_admitting(48), 8.0 * per_page, 1e-12);  // 6 + 18 = 24: 8
  // u swapped out reads nothing: only t's 3 and the new request's.
  ASSERT_TRUE(tiers.swap_out(sc.u));
  EXPECT_EQ(tiers.io_load_admitting(32), 0.0);                       // 3 + 12 = 15
  EXPECT_NEAR(tiers.io_load_admitting(40), 2.0 * per_page, 1e-12);  // 3 + 15 = 18
  sc.end();
}

// The throughput rule (admitting_pays): one more running request pays while the step's fixed part
// and the I/O the steps carry cover `running` times what it adds to the link. The same pool and
// requests as above (admitting 32 pages puts 2 pages a step over the pool, 48 puts 8; each counted
// twice on the recall-ahead schedule), a page at the link's 1 s; the steps cost 10 s plus 1 s a
// decode row and move nothing.
TEST_P(AdmittingPrices, TheThroughputRuleWeighsTheAddedIoAgainstTheSharedPartOfTheStep) {
  const std::string recall = GetParam();
  const double crossings = recall == "layer" ? 1.0 : 2.0;
  AdmitScene sc(recall);
  RunnerTiers& tiers = sc.tiers;
  EXPECT_FALSE(tiers.admitting_pays(32, 2)) << "no step measured yet: nothing known to share";
  tiers.before_step(sc.batch);
  sc.reads();
  tiers.end_step_io(10.0, 0.0, 0, 0);
  // One step: no fit, the fixed part counts as 0, so any added I/O loses; none added always pays.
  EXPECT_TRUE(tiers.admitting_pays(26, 2));
  EXPECT_FALSE(tiers.admitting_pays(32, 2));
  EXPECT_FALSE(tiers.step_fit().ok);
  // Steps of 1-4 decode rows at 10 s + 1 s a row: the fixed part, 10 s, is known (the fit is
  // over pairs of steps: its intercept is two steps' fixed parts).
  EXPECT_LT(tiers.step_fixed_seconds(), 0.0);
  for (int rep = 0; rep < 5; ++rep)
    for (int r = 1; r <= 4; ++r) tiers.end_step_io(10.0 + r, 0.0, r, 0);
  const StepCost::Fit f = tiers.step_fit();
  ASSERT_TRUE(f.ok && f.fixed_known);
  EXPECT_NEAR(f.fixed, 20.0, 1e-9);
  EXPECT_NEAR(tiers.step_fixed_seconds(), 10.0, 1e-9);
  EXPECT_NEAR(f.per_row, 1.0, 1e-9);
  EXPECT_EQ(tiers.step_page_seconds(), 1.0);  // (the pages never varied: the link's price)
  EXPECT_TRUE(tiers.admitting_pays(26, 2));   // adds nothing
  // 32 pages: 2 x crossings a step, x 2 running = 4 or 8 s <= 10 s.
  EXPECT_TRUE(tiers.admitting_pays(32, 2));
  // x 3 running: 6 s pays; 12 s (twice the crossings) does not.
  EXPECT_EQ(tiers.admitting_pays(32, 3), 3 * 2 * crossings <= 10.0);
  // 48 pages: 8 x crossings x 2 = 16 or 32 s > 10 s.
  EXPECT_FALSE(tiers.admitting_pays(48, 2));
  // A step with a prompt chunk says nothing of decode steps: a 100 s one changes neither the fit
  // nor a decision (had it entered the average step, 6 s of added I/O x 3 rows would pay).
  tiers.end_step_io(100.0, 0.0, 2, 512);
  EXPECT_NEAR(tiers.step_fixed_seconds(), 10.0, 1e-9);
  EXPECT_EQ(tiers.admitting_pays(32, 3), 3 * 2 * crossings <= 10.0);
  EXPECT_FALSE(tiers.admitting_pays(48, 2));
  sc.end();
}

// With the cache manager's budgets (--kv-device-budget auto) each request must keep its working set
// and the manager's buffer resident, W (1 + b): the same scene as TheWorkingSetsPushedOutOfThePool,
// where t's one decode step (3 pages read, none missed) left its buffer at 0.5 x 0.9 = 0.45. t
// needs 3 x 1.45 = 4.35, u (not observed) 3/8 x 1.45 x 8 = 4.35, a request of 16 pages 8.7: 17.4
// against the pool's 16, 1.4 pages a step over it, where the working sets alone (12) fit.
TEST_P(AdmittingPrices, TheCacheManagersBuffersCountWhereItSetsTheBudgets) {
  const std::string recall = GetParam();
  const double per_page = recall == "layer" ? 1.0 : 2.0;
  for (const bool manager : {false, true}) {
    AdmitScene sc(recall, manager);
    RunnerTiers& tiers = sc.tiers;
    tiers.before_step(sc.batch);
    sc.reads();
    tiers.end_step_io(1.0);
    EXPECT_EQ(tiers.kv().totals().offloaded, 0) << "every page fits: the manager sets no budget";
    if (manager) {
      EXPECT_NEAR(tiers.io_load_admitting(16), 1.4 * per_page, 1e-9);
      EXPECT_FALSE(tiers.admitting_pays(16, 2));
      EXPECT_EQ(tiers.io_load_admitting(8), 0.0);  // 8.7 + 4.35 = 13.05: fits
    } else {
      EXPECT_EQ(tiers.io_load_admitting(16), 0.0);  // 3 + 3 + 6 = 12
      EXPECT_TRUE(tiers.admitting_pays(16, 2));
    }
    sc.end();
  }
}

// A decode row whose step counted no read of its own (the CUDA runner's decode rows in a step
// with a prefill chunk) leaves the request unobserved: with t and u both unobserved every page they
// hold counts (read fraction 1: 16 pages, the pool), so one page more is one over the pool. Had
// t's 0 reads counted as its working set, the read fraction would be 0 and nothing would ever
// overflow (the serving run of session 34 admitted all 16 requests so).
TEST(RunnerTiers, AStepThatCountedNoReadsObservesNothing) {
  PagePool dev(Tier::Device, 16, kPage, kDim);
  EngineOptions o;
  o.cpu_kv_gb = 1.0;
  int64_t clock = 0;
  RunnerTiers tiers(dev, std::make_unique<PagePool>(Tier::Host, 64, kPage, kDim), o, kLayers, [&] { return clock; });
  tiers.set_io_rate(1e-6, 1000);
  PageTable t(kLayers, kHeads, kPage), u(kLayers, kHeads, kPage);
  for (PageTable* x : {&t, &u}) {
    ASSERT_TRUE(x->reserve(dev, 16));
    x->commit(16);
  }
  const int32_t tok[4] = {1, 2, 3, 4};
  const std::vector<StepRequest> batch = {StepRequest{.table = &t, .slot = 0, .tokens = tok, .n_new = 1},
                                          StepRequest{.table = &u, .slot = 1, .tokens = tok, .n_new = 4}};
  tiers.before_step(batch);
  const std::vector<TierStats> before = tiers.stats_of(batch);
  tiers.after_step(batch, before);  // (t decoded; no read of it noted)
  tiers.end_step_io(1.0);
  EXPECT_NEAR(tiers.io_load_admitting(1), 1.0, 1e-12);
  EXPECT_NEAR(tiers.io_load_admitting(4), 4.0, 1e-12);
  EXPECT_TRUE(tiers.release(t));
  EXPECT_TRUE(tiers.release(u));
}

// A decode step's reads of t: its first 2 pages in the host tier and its first device page of
// layer 1 (fewer where t has fewer).
std::vector<PageId> two_host_one_device(const PageTable& t) {
  std::vector<PageId> read;
  for (int l = 0; l < kLayers && read.size() < 2; ++l)
    for (int64_t i = 0; i < 8 && read.size() < 2; ++i)
      if (t.page(l, 0, i).tier == Tier::Host) read.push_back({l, 0, i});
  for (int64_t i = 0; i < 8 && read.size() < 3; ++i)
    if (t.page(1, 0, i).tier == Tier::Device) read.push_back({1, 0, i});
  return read;
}

// The scene of the two tests below: t holds 16 pages (8 a list), 12 of them offloaded under a
// budget of 4; u takes u_pages (u_pages / 2 a list); then t's decode step reads 2 pages from the
// host tier (late reads on the recall-ahead schedule) and 1 in the pool, and the step is measured
// at 1 s (misses: 0.3 x 2 = 0.6 a step).
void step_with_misses(RunnerTiers& tiers, PagePool& dev, PageTable& t, PageTable& u, int64_t u_pages, int64_t& clock) {
  ASSERT_TRUE(t.reserve(dev, 32));
  t.commit(32);
  static const int32_t tok[4] = {1, 2, 3, 4};
  tiers.before_step({StepRequest{.table = &t, .slot = 0, .tokens = tok, .n_new = 1}});
  tiers.kv().set_budget(t, 4, clock);  // 12 offloaded
  ASSERT_TRUE(u.reserve(dev, 2 * u_pages));
  u.commit(2 * u_pages);
  ++clock;
  const std::vector<StepRequest> batch = {StepRequest{.table = &t, .slot = 0, .tokens = tok, .n_new = 1},
                                          StepRequest{.table = &u, .slot = 1, .tokens = tok, .n_new = 4}};
  tiers.before_step(batch);
  const std::vector<TierStats> before = tiers.stats_of(batch);
  const std::vector<PageId> read = two_host_one_device(t);
  ASSERT_EQ(read.size(), 3u);
  EXPECT_EQ(tiers.kv().note_reads(t, read, clock).late, 2);
  tiers.after_step(batch, before);
  tiers.end_step_io(1.0);
}

// Where the steps already miss and the pool is full, the working sets' one-step sizes understate
// what the pool must hold (a working set moves from step to step: in the serving run of session 34
// they added up to ~1.1 pools and the hit rate was 0.87), so the new request's whole working set
// adds to the misses. Pool 16 pages: t holds 16 with 12 offloaded under a budget of 4, u takes
// `u_pages` of the 12 freed; t's decode step reads 2 pages from the host tier and 1 in the pool
// (working set 3 of 16: read fraction 3/16). Recall-ahead schedule: the 2 are late reads.
TEST(RunnerTiers, AStepsMissesWithThePoolFullCountAsOverflow) {
  for (const int64_t u_pages : {12, 8}) {
    PagePool dev(Tier::Device, 16, kPage, kDim);
    EngineOptions o;
    o.cpu_kv_gb = 1.0;
    o.kv_recall = "ahead";
    int64_t clock = 0;
    RunnerTiers tiers(dev, std::make_unique<PagePool>(Tier::Host, 64, kPage, kDim), o, kLayers, [&] { return clock; });
    tiers.set_io_rate(1e-6, 1000);  // a page: 1 s
    PageTable t(kLayers, kHeads, kPage), u(kLayers, kHeads, kPage);
    step_with_misses(tiers, dev, t, u, u_pages, clock);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_EQ(dev.n_free(), 12 - u_pages);
    // Working sets 3 + 3/16 x u_pages: far below the pool. Admitting 16 pages more (3 more read a step):
    // with the pool full, the pool already misses 0.6 a step: 16.6 + 3 = 19.6, 3 more pages a step,
    // each a late read and a recall: 6 s a step at 1 s a page, which two running requests do not
    // share (no fixed part known, 1 s of I/O now at most). With free pages the misses are the
    // budget's: the working sets fit and it pays.
    const bool full = u_pages == 12;
    EXPECT_EQ(tiers.admitting_pays(16, 2), !full) << u_pages;
    if (full)
      EXPECT_GT(tiers.io_load_admitting(16), tiers.io_load() + 5.9) << "6 page-seconds a step more over 1 s steps";
    else
      EXPECT_EQ(tiers.io_load_admitting(16), tiers.io_load());
    EXPECT_EQ(tiers.check(), "");
    EXPECT_TRUE(tiers.release(t));
    EXPECT_TRUE(tiers.release(u));
  }
}

// The same misses under the cache manager's budgets (--kv-device-budget auto) that leave pages
// free: they are those budgets' churn, not a full pool, and the working sets fit — admitting pays.
// (Until session 35 any budgets set by the manager counted as a full pool: the serving run held 5
// requests with ~100k of 180k pages free and 0.8% of the reads missing.) Pool 32 pages: t holds 16,
// 12 of them offloaded under a budget of 4, u holds 8, 20 free; t's step reads 2 pages in place and
// 1 in the pool. Working sets with the manager's initial buffer: 3 x 1.5 + 3/16 x 1.5 x 8 = 6.75,
// and 4.5 for the new request's 16: far below 32.
TEST(RunnerTiers, ChurnMissesUnderBudgetsThatLeaveRoomAreNotAFullPool) {
  PagePool dev(Tier::Device, 32, kPage, kDim);
  EngineOptions o;
  o.cpu_kv_gb = 1.0;
  o.kv_recall = "ahead";
  o.kv_budget_auto = true;
  int64_t clock = 0;
  RunnerTiers tiers(dev, std::make_unique<PagePool>(Tier::Host, 64, kPage, kDim), o, kLayers, [&] { return clock; });
  tiers.set_io_rate(1e-6, 1000);  // a page: 1 s
  PageTable t(kLayers, kHeads, kPage), u(kLayers, kHeads, kPage);
  step_with_misses(tiers, dev, t, u, 8, clock);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  EXPECT_GT(dev.n_free(), 0);
  EXPECT_TRUE(tiers.admitting_pays(16, 2));
  EXPECT_EQ(tiers.io_load_admitting(16), tiers.io_load());
  EXPECT_EQ(tiers.check(), "");
  EXPECT_TRUE(tiers.release(t));
  EXPECT_TRUE(tiers.release(u));
}

// The link rule (--kv-budget-io-share s): the cache manager's miss target is the misses whose
// crossings take s of the measured decode step at a page's price, over the pages the step's decode
// rows read: s T / (2 p R) on the recall-ahead schedule. Pages of 1,000 B; t's decode steps read 3
// pages (2 in place from the host tier), measured at 1 s. At 1,000 B/s (a page: 1 s) with s = 0.01:
// 0.01 / 6; at 10,000 B/s (0.1 s) ten times that — a faster link allows more misses. Before a
// decode step is measured, and with s = 0, the fixed target (2.5%) stays; s needs the manager.
TEST(RunnerTiers, TheLinkRuleSetsTheMissTargetFromThePriceOfAPage) {
  EngineOptions bad;
  bad.cpu_kv_gb = 1.0;
  bad.kv_budget_io_share = 0.1;
  EXPECT_THROW(RunnerTiers::host_pages(bad, 1024), Error);  // (without --kv-device-budget auto)
  bad.kv_budget_auto = true;
  EXPECT_EQ(RunnerTiers::host_pages(bad, 1024), 1 << 20);
  bad.kv_budget_io_share = 1.5;
  EXPECT_THROW(RunnerTiers::host_pages(bad, 1024), Error);
  for (const double gbps : {1e-6, 1e-5, 0.0}) {  // (0: the rule off, share 0)
    PagePool dev(Tier::Device, 32, kPage, kDim);
    EngineOptions o;
    o.cpu_kv_gb = 1.0;
    o.kv_recall = "ahead";
    o.kv_budget_auto = true;
    o.kv_budget_io_share = gbps > 0.0 ? 0.01 : 0.0;
    int64_t clock = 0;
    RunnerTiers tiers(dev, std::make_unique<PagePool>(Tier::Host, 64, kPage, kDim), o, kLayers, [&] { return clock; });
    tiers.set_io_rate(gbps > 0.0 ? gbps : 1e-6, 1000);
    PageTable t(kLayers, kHeads, kPage), u(kLayers, kHeads, kPage);
    step_with_misses(tiers, dev, t, u, 8, clock);  // (a step measured as a prefill one: no decode rows)
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    EXPECT_DOUBLE_EQ(tiers.budget_target_miss(), 0.025) << "no decode step measured yet";
    tiers.end_step_io(1.0, 0.0, /*decode_rows=*/1, 0);
    const double price = tiers.step_page_seconds();
    EXPECT_NEAR(price, gbps > 0.0 ? 1e-6 / gbps : 1.0, 1e-9);
    // The next decode step: t reads the same 3 pages, 2 of them in place.
    ++clock;
    static const int32_t tok[1] = {1};
    const std::vector<StepRequest> batch = {StepRequest{.table = &t, .slot = 0, .tokens = tok, .n_new = 1}};
    tiers.before_step(batch);
    const std::vector<TierStats> before = tiers.stats_of(batch);
    const std::vector<PageId> read = two_host_one_device(t);
    ASSERT_EQ(read.size(), 3u);
    EXPECT_EQ(tiers.kv().note_reads(t, read, clock).late, 2);
    tiers.after_step(batch, before);
    EXPECT_NEAR(tiers.budget_target_miss(), gbps > 0.0 ? 0.01 * 1.0 / (2.0 * price * 3.0) : 0.025, 1e-12) << gbps;
    EXPECT_EQ(tiers.check(), "");
    EXPECT_TRUE(tiers.release(t));
    EXPECT_TRUE(tiers.release(u));
  }
}

INSTANTIATE_TEST_SUITE_P(RunnerTiers, AdmittingPrices, ::testing::Values("layer", "ahead", "land"));

}  // namespace
// The cache manager's budgets after a step whose landings the host adopts while the next step runs
// (the CUDA runner's overlap): the landed slots are the batch's pages already, so the budgets must
// be those of the order that adopts first. Pool of 12 pages; t holds 8 full pages (2 lists x 4) and
// appends into 2: 4 full pages kept on the device, 4 in the host tier. Two decode steps read the 4
// resident ones (the budgets' warm-up); the third reads all 8, landing the 4 offloaded ones in 4 of
// the 6 free slots. Adopted first, the batch holds 8 full pages with 2 free: everything fits (10 of
// 8), no budget, nothing moves. Adopted after, the same must hold; counting only free slots and
// resident pages (2 + 4 < 8) gave t a budget of 6 and its adoption offloaded 2 pages.
class LandingsInFlight : public ::testing::TestWithParam<bool> {};

TEST_P(LandingsInFlight, LeaveTheBudgetsAsAdoptingFirstDoes) {
  const bool adopt_first = GetParam();
  PagePool dev(Tier::Device, 12, kPage, kDim);
  EngineOptions o;
  o.cpu_kv_gb = 1.0;
  o.kv_recall = "land";
  o.kv_budget_auto = true;
  int64_t clock = 1;
  RunnerTiers tiers(dev, std::make_unique<PagePool>(Tier::Host, 64, kPage, kDim), o, kLayers, [&] { return clock; });
  TieredKv& kv = tiers.kv();
  PageTable t(kLayers, kHeads, kPage);
  ASSERT_TRUE(t.reserve(dev, 17));  // 5 pages per list: 4 full, 1 to append into
  t.commit(16);
  kv.add(t, 0, TieredKv::kUnlimited);
  kv.set_budget(t, 4, 0);
  ASSERT_EQ(kv.resident_pages(t), 6);
  const int32_t tok = 1;
  const std::vector<StepRequest> batch = {StepRequest{.table = &t, .slot = 0, .tokens = &tok, .n_new = 1}};
  std::vector<PageTable*> tables{&t};
  std::vector<int32_t> stamps(12, 0);
  for (int step = 1; step <= 3; ++step) {
    tiers.before_step(batch);
    const std::vector<TierStats> before = tiers.stats_of(batch);
    std::vector<TieredKv::Landed> landed;
    const std::vector<int32_t> stack = step == 3 ? kv.reserve_landing(4, clock) : std::vector<int32_t>{};
    for (int l = 0; l < kLayers; ++l)
      for (int64_t i = 0; i < 5; ++i) {
        const PageRef p = t.page(l, 0, i);
        if (p.tier == Tier::Device) {
          stamps[static_cast<size_t>(p.slot)] = step;
        } else if (step == 3) {
          const int32_t slot = stack[landed.size()];
          stamps[static_cast<size_t>(slot)] = step;  // (the split stamps a landed slot too)
          landed.push_back({0, PageId{l, 0, i}, slot, p.slot});
        }
      }
    ASSERT_EQ(landed.size(), step == 3 ? 4u : 0u);
    ++clock;  // (the runner's clock counts the step before anything after it runs)
    const int64_t now = clock - 1;
    kv.after_step_reads(stamps, step, tables, now, landed);
    if (adopt_first) kv.after_step_recalls({}, now, false);
    tiers.after_step(batch, before);
    if (!adopt_first) kv.after_step_recalls({}, clock, true);
    ASSERT_EQ(kv.check_invariants(), "") << "step " << step;
  }
  EXPECT_EQ(kv.resident_pages(t), 10) << "the 8 full pages and the 2 appended into, all on the device";
  EXPECT_EQ(kv.totals().offloaded, 4) << "only the 4 of the initial budget";
  EXPECT_EQ(kv.budget(t), TieredKv::kUnlimited);
  EXPECT_EQ(tiers.check(), "");
  EXPECT_TRUE(tiers.release(t));
}

INSTANTIATE_TEST_SUITE_P(RunnerTiers, LandingsInFlight, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "AdoptedFirst" : "AdoptedInFlight"; });

}  // namespace dhs
