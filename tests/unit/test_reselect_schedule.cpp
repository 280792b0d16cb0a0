// ReselectSchedule and reuse_selection (sparse/reselect_schedule.h) against brute-force
// statements of their definitions: which layers select at which step, when a step must
// select everywhere, and what a reused list holds (the stored pages before the first page
// written since the selection, then every page from there on).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "core/error.h"
#include "sparse/reselect_schedule.h"
#include "test_sparse_fixture.h"

namespace dhs {
namespace {

TEST(ReselectSchedule, EachLayerSelectsOncePerPeriodAndStaysAtMostRMinusOneStale) {
  for (int every : {1, 2, 3, 4, 7}) {
    const int n_layers = 11;
    ReselectSchedule s(every);
    int tag = 0;
    std::vector<const void*> ids = {&tag};
    std::vector<int> last_sel(n_layers, -1);
    for (int step = 0; step < 40; ++step) {
      const int phase = s.begin_step(ids, {100 + step});
      if (step == 0 || every == 1) EXPECT_EQ(phase, ReselectSchedule::kFull) << "every " << every << " step " << step;
      else EXPECT_EQ(phase, step % every) << "every " << every << " step " << step;
      int n_sel = 0;
      for (int l = 0; l < n_layers; ++l)
        if (s.selects(l, phase)) {
          last_sel[l] = step;
          ++n_sel;
        }
      for (int l = 0; l < n_layers; ++l) {
        ASSERT_GE(last_sel[l], 0);
        EXPECT_LE(step - last_sel[l], every - 1) << "layer " << l << " reads a selection too old";
      }
      // Staggered: a non-full step selects about n_layers / every layers, never all (every > 1).
      if (phase != ReselectSchedule::kFull) {
        EXPECT_GE(n_sel, n_layers / every);
        EXPECT_LE(n_sel, (n_layers + every - 1) / every);
      }
    }
  }
}

TEST(ReselectSchedule, AnythingButTheLastStepsContinuationSelectsEverywhere) {
  ReselectSchedule s(4);
  int a = 0, b = 0;
  EXPECT_EQ(s.begin_step({&a, &b}, {10, 20}), ReselectSchedule::kFull);
  EXPECT_EQ(s.begin_step({&a, &b}, {11, 21}), 1);
  EXPECT_EQ(s.begin_step({&a, &b}, {12, 22}), 2);
  // A sequence truncated (or grown by a prefill) since the last step.
  EXPECT_EQ(s.begin_step({&a, &b}, {12, 23}), ReselectSchedule::kFull);
  EXPECT_EQ(s.begin_step({&a, &b}, {13, 24}), 1);
  // Another batch: a request left, or the order changed.
  EXPECT_EQ(s.begin_step({&a}, {14}), ReselectSchedule::kFull);
  EXPECT_EQ(s.begin_step({&b, &a}, {25, 15}), ReselectSchedule::kFull);
  EXPECT_EQ(s.begin_step({&b, &a}, {26, 16}), 1);
  s.invalidate();
  EXPECT_EQ(s.begin_step({&b, &a}, {27, 17}), ReselectSchedule::kFull);
  EXPECT_THROW(ReselectSchedule(0), Error);
}

// Random stored selections of random requests, the requests grown by 0..40 tokens (page
// boundaries crossed or not, partial pages at both ends), then the reused lists against
// the definition written as sets.
TEST(ReuseSelection, EqualsTheStoredPagesBeforeTheFirstNewPageThenEveryPageSince) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 30; ++trial) {
    const int n_layers = 2, hkv = 3, ps = 16;
    test::SparseWorld w(n_layers, hkv, ps, 8, 4000);
    const int n_req = 1 + static_cast<int>(rng() % 5);
    std::vector<int32_t> seq_then, seq_now;
    for (int r = 0; r < n_req; ++r) {
      PageTable& t = w.add_request();
      const int64_t n = (trial == 0 && r == 0) ? 0 : static_cast<int64_t>(rng() % 200);
      if (n > 0) w.append_random(t, n, rng);
      seq_then.push_back(static_cast<int32_t>(n));
    }
    const int layer = static_cast<int>(rng() % n_layers);
    // The stored selection: a random ascending subset of each list's pages then.
    PageLists stored;
    stored.n_requests = n_req;
    stored.n_heads_kv = hkv;
    stored.seq_len = seq_then;
    stored.indptr.push_back(0);
    std::vector<std::vector<std::set<int32_t>>> chosen(static_cast<size_t>(n_req), std::vector<std::set<int32_t>>(hkv));
    for (int r = 0; r < n_req; ++r) {
      const int64_t n_pages = (seq_then[static_cast<size_t>(r)] + ps - 1) / ps;
      for (int h = 0; h < hkv; ++h) {
        const int mode = static_cast<int>(rng() % 4);  // 0: empty, 1: all, else random
        for (int64_t p = 0; p < n_pages; ++p)
          if (mode == 1 || (mode >= 2 && rng() % 2)) {
            chosen[static_cast<size_t>(r)][static_cast<size_t>(h)].insert(static_cast<int32_t>(p));
            stored.slots.push_back(w.tables[static_cast<size_t>(r)]->page(layer, h, p).slot);
            stored.page_pos.push_back(static_cast<int32_t>(p));
          }
        stored.indptr.push_back(static_cast<int32_t>(stored.slots.size()));
      }
    }
    for (int r = 0; r < n_req; ++r) {
      const int64_t grow = static_cast<int64_t>(rng() % 41);
      if (grow > 0) w.append_random(*w.tables[static_cast<size_t>(r)], grow, rng);
      seq_now.push_back(static_cast<int32_t>(w.tables[static_cast<size_t>(r)]->n_tokens()));
    }
    const PageLists got = reuse_selection(stored, w.table_ptrs(), layer, seq_now);
    ASSERT_EQ(got.indptr.size(), static_cast<size_t>(n_req * hkv + 1));
    EXPECT_EQ(got.seq_len, seq_now);
    for (int r = 0; r < n_req; ++r)
      for (int h = 0; h < hkv; ++h) {
        std::set<int32_t> want;
        const int32_t first_new = seq_then[static_cast<size_t>(r)] / ps;
        for (int32_t p : chosen[static_cast<size_t>(r)][static_cast<size_t>(h)])
          if (p < first_new) want.insert(p);
        for (int32_t p = first_new; p < (seq_now[static_cast<size_t>(r)] + ps - 1) / ps; ++p) want.insert(p);
        std::vector<int32_t> got_pos(got.page_pos.begin() + got.row_begin(r, h), got.page_pos.begin() + got.row_end(r, h));
        EXPECT_EQ(got_pos, std::vector<int32_t>(want.begin(), want.end())) << "trial " << trial << " req " << r << " head " << h;
        for (int32_t i = got.row_begin(r, h); i < got.row_end(r, h); ++i)
          EXPECT_EQ(got.slots[static_cast<size_t>(i)],
                    w.tables[static_cast<size_t>(r)]->page(layer, h, got.page_pos[static_cast<size_t>(i)]).slot);
      }
    // A request that shrank since its selection cannot reuse it.
    if (seq_then[0] > 0) {
      std::vector<int32_t> shrunk = seq_now;
      shrunk[0] = seq_then[0] - 1;
      EXPECT_THROW(reuse_selection(stored, w.table_ptrs(), layer, shrunk), Error);
    }
  }
}

}  // namespace
}  // namespace dhs
