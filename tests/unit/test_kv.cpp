// Page pool and page table: allocation, growth, truncation, release, and the
// accounting invariant (free + used == total, no page owned twice) after each.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "core/error.h"
#include "kv/page_lists.h"
#include "kv/page_pool.h"
#include "kv/page_table.h"

namespace dhs {
namespace {

// Every page owned by exactly one table, and the pool agrees.
void expect_consistent(const PagePool& pool, const std::vector<const PageTable*>& tables) {
  EXPECT_EQ(pool.check_invariants(), "");
  std::set<int32_t> owned;
  for (const PageTable* t : tables)
    for (PageRef p : t->all_pages()) {
      EXPECT_TRUE(pool.is_used(p)) << "slot " << p.slot << " owned but free in the pool";
      EXPECT_TRUE(owned.insert(p.slot).second) << "slot " << p.slot << " owned twice";
    }
  EXPECT_EQ(static_cast<int64_t>(owned.size()), pool.n_used());
  EXPECT_EQ(pool.n_free() + pool.n_used(), pool.n_pages());
}

TEST(PagePool, AllocateFreeAndDoubleFree) {
  PagePool pool(Tier::Host, 10, 16, 8);
  std::vector<PageRef> got;
  ASSERT_TRUE(pool.allocate(4, &got));
  EXPECT_EQ(pool.n_used(), 4);
  EXPECT_FALSE(pool.allocate(7, &got)) << "must be all-or-nothing";
  EXPECT_EQ(got.size(), 4u);
  EXPECT_EQ(pool.n_used(), 4);
  pool.free(got[1]);
  EXPECT_THROW(pool.free(got[1]), Error);
  EXPECT_THROW(pool.free(PageRef{Tier::Device, 0}), Error);
  EXPECT_THROW(pool.free(PageRef{Tier::Host, 99}), Error);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PageTable, GrowsByPagesAndCountsPerHead) {
  PagePool pool(Tier::Host, 1000, 16, 8);
  PageTable t(3, 2, 16);  // 3 layers x 2 KV heads
  EXPECT_EQ(t.pages_needed(1), 6);
  EXPECT_EQ(t.pages_needed(16), 6);
  EXPECT_EQ(t.pages_needed(17), 12);
  ASSERT_TRUE(t.reserve(pool, 17));
  t.commit(17);
  EXPECT_EQ(t.n_pages_per_list(), 2);
  EXPECT_EQ(t.pages_needed(15), 0);  // 17 + 15 = 32 fits in 2 pages
  EXPECT_EQ(t.pages_needed(16), 6);
  EXPECT_THROW(t.commit(16), Error) << "commit beyond reservation";
  // Token positions map to (page, row).
  int row;
  const PageRef p = t.page_of_token(2, 1, 16, &row);
  EXPECT_EQ(row, 0);
  EXPECT_EQ(p, t.page(2, 1, 1));
  expect_consistent(pool, {&t});
  t.release(pool);
  EXPECT_EQ(pool.n_used(), 0);
  expect_consistent(pool, {&t});
}

TEST(PageTable, ReserveFailsCleanlyWhenPoolIsShort) {
  PagePool pool(Tier::Host, 10, 4, 8);
  PageTable t(2, 2, 4);
  ASSERT_TRUE(t.reserve(pool, 8));  // 2 pages per list x 4 lists
  t.commit(8);
  EXPECT_FALSE(t.reserve(pool, 5));  // needs 8 more pages, 2 free
  EXPECT_EQ(t.n_pages_per_list(), 2);
  EXPECT_EQ(pool.n_used(), 8);
  expect_consistent(pool, {&t});
}

TEST(PageTable, SpansManyDirectoryChunks) {
  PagePool pool(Tier::Host, 4 * 300, 2, 4);
  PageTable t(2, 2, 2);
  ASSERT_TRUE(t.reserve(pool, 2 * 300));  // 300 pages per list: 5 directory chunks
  t.commit(600);
  std::set<int32_t> slots;
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 300; ++i) slots.insert(t.page(l, h, i).slot);
  EXPECT_EQ(slots.size(), 1200u);
  t.truncate(pool, 129);  // keeps 65 pages per list
  EXPECT_EQ(t.n_pages_per_list(), 65);
  EXPECT_EQ(pool.n_used(), 4 * 65);
  expect_consistent(pool, {&t});
}

// Random interleaving of several requests growing, truncating and finishing.
TEST(PageTable, RandomScenarioKeepsAccounting) {
  std::mt19937 rng(1234);
  PagePool pool(Tier::Host, 500, 16, 8);
  std::vector<std::unique_ptr<PageTable>> live;
  for (int step = 0; step < 2000; ++step) {
    const int op = static_cast<int>(rng() % 4);
    if (op == 0 || live.empty()) {
      live.push_back(std::make_unique<PageTable>(2, 2, 16));
    } else {
      auto& t = live[rng() % live.size()];
      if (op == 1) {
        const int64_t n = 1 + rng() % 40;
        if (t->reserve(pool, n)) t->commit(n);
      } else if (op == 2) {
        t->truncate(pool, static_cast<int64_t>(rng() % (t->n_tokens() + 1)));
      } else {
        t->release(pool);
        std::swap(t, live.back());
        live.pop_back();
      }
    }
    if (step % 50 == 0) {
      std::vector<const PageTable*> ts;
      for (auto& t : live) ts.push_back(t.get());
      expect_consistent(pool, ts);
    }
  }
  for (auto& t : live) t->release(pool);
  EXPECT_EQ(pool.n_used(), 0);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PageLists, DenseListsCoverEveryPageInOrder) {
  PagePool pool(Tier::Host, 100, 4, 8);
  PageTable a(1, 2, 4), b(1, 2, 4);
  ASSERT_TRUE(a.reserve(pool, 9));
  a.commit(9);
  ASSERT_TRUE(b.reserve(pool, 4));
  b.commit(4);
  const PageLists pl = dense_page_lists({&a, &b}, 0, {9, 4});
  ASSERT_EQ(pl.indptr, (std::vector<int32_t>{0, 3, 6, 7, 8}));
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(pl.slots[static_cast<size_t>(pl.row_begin(0, h) + i)], a.page(0, h, i).slot);
      EXPECT_EQ(pl.page_pos[static_cast<size_t>(pl.row_begin(0, h) + i)], i);
    }
  EXPECT_EQ(pl.slots[static_cast<size_t>(pl.row_begin(1, 1))], b.page(0, 1, 0).slot);
  a.release(pool);
  b.release(pool);
  EXPECT_EQ(pool.n_used(), 0);
}

// pick_requests against hand-made lists: requests taken from two inputs in another order (one
// twice), their entries, seq_len and offsets; a row mask from one input makes the other's
// entries read by every row; a request out of range and a head-count mismatch throw.
TEST(PageLists, PickRequestsTakesWholeRequests) {
  PageLists a;  // 2 requests x 2 heads: pages (10, 11 | 12) and (13 | -)
  a.n_requests = 2;
  a.n_heads_kv = 2;
  a.indptr = {0, 2, 3, 4, 4};
  a.slots = {10, 11, 12, 13};
  a.page_pos = {0, 1, 0, 5};
  a.seq_len = {20, 90};
  PageLists b;  // 1 request x 2 heads: (20 | 21, 22), with row masks
  b.n_requests = 1;
  b.n_heads_kv = 2;
  b.indptr = {0, 1, 3};
  b.slots = {20, 21, 22};
  b.page_pos = {3, 1, 2};
  b.seq_len = {64};
  b.row_mask = {1u, 2u, 3u};
  const PageLists p = pick_requests({{&a, 1}, {&b, 0}, {&a, 0}, {&a, 1}});
  EXPECT_EQ(p.n_requests, 4);
  EXPECT_EQ(p.n_heads_kv, 2);
  EXPECT_EQ(p.indptr, (std::vector<int32_t>{0, 1, 1, 2, 4, 6, 7, 8, 8}));
  EXPECT_EQ(p.slots, (std::vector<int32_t>{13, 20, 21, 22, 10, 11, 12, 13}));
  EXPECT_EQ(p.page_pos, (std::vector<int32_t>{5, 3, 1, 2, 0, 1, 0, 5}));
  EXPECT_EQ(p.seq_len, (std::vector<int32_t>{90, 64, 20, 90}));
  EXPECT_EQ(p.row_mask, (std::vector<uint32_t>{~0u, 1u, 2u, 3u, ~0u, ~0u, ~0u, ~0u}));
  const PageLists q = pick_requests({{&a, 0}});
  EXPECT_EQ(q.indptr, (std::vector<int32_t>{0, 2, 3}));
  EXPECT_TRUE(q.row_mask.empty());
  EXPECT_THROW(pick_requests({{&a, 2}}), Error);
  EXPECT_THROW(pick_requests({{&a, -1}}), Error);
  PageLists c = b;
  c.n_heads_kv = 3;
  c.indptr = {0, 1, 2, 3};
  EXPECT_THROW(pick_requests({{&a, 0}, {&c, 0}}), Error);
}

}  // namespace
}  // namespace dhs
