// The bucketed LRU (kv/bucketed_lru.h) against a brute-force statement of its definition: every
// candidate (resident, of the owner, not pinned) sorted by (key1, key2, slot), the first n taken,
// the keys as the header writes them for the plain and the cyclic order. The clock is injected (a
// counter the test advances), and random inserts, touches, pins and erases run between selections.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "kv/bucketed_lru.h"

namespace dhs {
namespace {

std::vector<int32_t> brute_force(const BucketedLru& lru, int32_t owner, int64_t n, int64_t now) {
  const LruParams& p = lru.params();
  const int64_t P = p.bucket_steps, B = p.n_buckets;
  std::vector<std::tuple<int64_t, int64_t, int32_t>> c;
  for (int32_t s = 0; s < lru.n_slots(); ++s) {
    if (!lru.resident(s) || lru.pinned(s) || (owner >= 0 && lru.owner(s) != owner)) continue;
    const int64_t u = lru.last_use(s);
    if (!p.cyclic) {
      c.emplace_back(std::max(u / P, now / P - (B - 1)), 0, s);
    } else {
      const int64_t age = std::min((now - u) / P, B - 1);
      c.emplace_back(-age, std::min(now - age * P - u, P - 1), s);
    }
  }
  std::sort(c.begin(), c.end());
  std::vector<int32_t> out;
  for (int64_t i = 0; i < std::min<int64_t>(n, static_cast<int64_t>(c.size())); ++i)
    out.push_back(std::get<2>(c[static_cast<size_t>(i)]));
  return out;
}

// A clock of 3 ticks per step (3 layers); at tick 7 (step 2, layer 1): a page used at step 0 goes
// first, then the pages of layers this step has passed without using them (layer 1 and 0 of step
// 1), then this step's, and last the page of layer 2 of step 1 — the next layer may read it now.
TEST(BucketedLru, CyclicOrderEvictsWhatTheCycleNeedsLast) {
  BucketedLru lru(5, {.bucket_steps = 3, .n_buckets = 3, .cyclic = true});
  lru.insert(0, 0, 6);  // A: step 2, layer 0
  lru.insert(1, 0, 5);  // B: step 1, layer 2
  lru.insert(2, 0, 4);  // C: step 1, layer 1
  lru.insert(3, 0, 3);  // D: step 1, layer 0
  lru.insert(4, 0, 0);  // E: step 0, layer 0
  EXPECT_EQ(lru.select(0, 5, 7), (std::vector<int32_t>{4, 2, 3, 0, 1}));
}

TEST(BucketedLru, OldestBucketsFirstLowestSlotsInTheCut) {
  BucketedLru lru(8, {.bucket_steps = 2, .n_buckets = 3});
  // Steps 0..5: buckets 0, 0, 1, 1, 2, 2.
  for (int32_t s = 0; s < 6; ++s) lru.insert(s, 0, s);
  EXPECT_EQ(lru.select(0, 3, 5), (std::vector<int32_t>{0, 1, 2}));
  lru.touch(0, 5);  // slot 0 is now the newest
  EXPECT_EQ(lru.select(0, 3, 5), (std::vector<int32_t>{1, 2, 3}));
  lru.set_pinned(1, true);
  EXPECT_EQ(lru.select(0, 2, 5), (std::vector<int32_t>{2, 3}));
  // At step 9 the oldest kept bucket is 9 / 2 - (3 - 1) = 2: every page counts as that old,
  // so the order is the slot order.
  EXPECT_EQ(lru.select(0, 10, 9), (std::vector<int32_t>{0, 2, 3, 4, 5}));
  EXPECT_EQ(lru.select(1, 10, 9), std::vector<int32_t>{});
  EXPECT_EQ(lru.check_invariants(9), "");
}

TEST(BucketedLru, RefusesMisuse) {
  BucketedLru lru(4, {});
  lru.insert(1, 3, 0);
  EXPECT_THROW(lru.insert(1, 2, 0), Error);  // occupied
  EXPECT_THROW(lru.touch(0, 1), Error);      // free
  EXPECT_THROW(lru.erase(2), Error);
  EXPECT_THROW(lru.set_pinned(0, true), Error);
  EXPECT_THROW(lru.insert(4, 0, 0), Error);  // out of range
  EXPECT_THROW(BucketedLru(4, {.bucket_steps = 0, .n_buckets = 4}), Error);
  const std::vector<std::pair<int32_t, int64_t>> twice = {{3, 1}, {3, 2}}, negative = {{-1, 1}};
  EXPECT_THROW(lru.select_many(twice, 0), Error);
  EXPECT_THROW(lru.select_many(negative, 0), Error);
}

TEST(BucketedLru, MatchesTheBruteForceDefinition) {
  std::mt19937 rng(2024);
  for (const LruParams p : {LruParams{1, 1}, LruParams{1, 8}, LruParams{4, 16}, LruParams{3, 5}, LruParams{5, 4, true},
                            LruParams{1, 3, true}, LruParams{30, 4, true}}) {
    BucketedLru lru(97, p);
    int64_t now = 0;
    int checks = 0;
    for (int it = 0; it < 20000; ++it) {
      const int32_t s = static_cast<int32_t>(rng() % 97);
      switch (rng() % 8) {
        case 0: case 1:
          if (!lru.resident(s)) lru.insert(s, static_cast<int32_t>(rng() % 4), now);
          break;
        case 2: case 3:
          if (lru.resident(s)) lru.touch(s, now);
          break;
        case 4:
          if (lru.resident(s)) lru.erase(s);
          break;
        case 5:
          if (lru.resident(s)) lru.set_pinned(s, rng() % 2 == 0);
          break;
        case 6:
          now += static_cast<int64_t>(rng() % 3);  // the clock: 0-2 steps
          if (rng() % 50 == 0) lru.unpin_all();
          break;
        default: {
          const int32_t owner = static_cast<int32_t>(rng() % 5) - 1;  // -1: any owner
          const int64_t n = static_cast<int64_t>(rng() % 40);
          ASSERT_EQ(lru.select(owner, n, now), brute_force(lru, owner, n, now))
              << "params " << p.bucket_steps << "/" << p.n_buckets << (p.cyclic ? " cyclic" : "") << " step " << now
              << " owner " << owner << " n " << n;
          ++checks;
          // select_many: every owner at once (some asking for none), each as the definition says.
          std::vector<std::pair<int32_t, int64_t>> wants;
          for (int32_t o = 0; o < 4; ++o)
            if (rng() % 4 != 0) wants.emplace_back(o, static_cast<int64_t>(rng() % 30));
          std::shuffle(wants.begin(), wants.end(), rng);
          const auto many = lru.select_many(wants, now);
          ASSERT_EQ(many.size(), wants.size());
          for (size_t i = 0; i < wants.size(); ++i)
            ASSERT_EQ(many[i], brute_force(lru, wants[i].first, wants[i].second, now)) << "select_many, owner " << wants[i].first;
        }
      }
      ASSERT_EQ(lru.check_invariants(now), "");
    }
    EXPECT_GT(checks, 2000);
  }
}

}  // namespace
// select_many over an LRU past BucketedLru::kParallelSlots: its passes run over chunks of the
// slots on the thread pool, and the result must still be the definition's, slot order included
// (candidates of one bin spread over every chunk; the cut bin's take spanning chunks).
TEST(BucketedLru, SelectManyOnThreadsEqualsTheDefinition) {
  std::mt19937_64 rng(5);
  const int64_t n_slots = BucketedLru::kParallelSlots + 12345;
  for (const LruParams p : {LruParams{4, 16, false}, LruParams{30, 4, true}}) {
    BucketedLru lru(n_slots, p);
    int64_t now = 0;
    for (int round = 0; round < 6; ++round) {
      for (int i = 0; i < 40000; ++i) {
        const int32_t s = static_cast<int32_t>(rng() % static_cast<uint64_t>(n_slots));
        if (!lru.resident(s)) lru.insert(s, static_cast<int32_t>(rng() % 5), now);
        else if (rng() % 4 == 0) lru.erase(s);
        else if (rng() % 4 == 0) lru.set_pinned(s, rng() % 2 == 0);
        else lru.touch(s, now);
        if (rng() % 3000 == 0) ++now;
      }
      now += static_cast<int64_t>(rng() % 40);
      std::vector<std::pair<int32_t, int64_t>> wants;
      for (int32_t o = 0; o < 5; ++o)
        if (rng() % 5 != 0) wants.emplace_back(o, static_cast<int64_t>(rng() % 30000));
      const auto many = lru.select_many(wants, now);
      ASSERT_EQ(many.size(), wants.size());
      for (size_t i = 0; i < wants.size(); ++i)
        ASSERT_EQ(many[i], brute_force(lru, wants[i].first, wants[i].second, now))
            << "owner " << wants[i].first << " n " << wants[i].second << " round " << round;
    }
  }
}

}  // namespace dhs
