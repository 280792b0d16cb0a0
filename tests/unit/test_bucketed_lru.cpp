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

// uses (optional): each slot's last use as the test knows it (else the LRU's own).
std::vector<int32_t> brute_force(const BucketedLru& lru, int32_t owner, int64_t n, int64_t now,
                                 const std::vector<int64_t>* uses = nullptr) {
  const LruParams& p = lru.params();
  const int64_t P = p.bucket_steps, B = p.n_buckets;
  std::vector<std::tuple<int64_t, int64_t, int32_t>> c;
  for (int32_t s = 0; s < lru.n_slots(); ++s) {
    if (!lru.resident(s) || lru.pinned(s) || (owner >= 0 && lru.owner(s) != owner)) continue;
    const int64_t u = uses ? (*uses)[static_cast<size_t>(s)] : lru.last_use(s);
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
// select_many, and select without a filter, over an LRU large enough for the thread pool.
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
      // select without a filter takes the same passes at this size: any owner's and one owner's.
      const int64_t k = static_cast<int64_t>(rng() % 60000);
      ASSERT_EQ(lru.select(-1, k, now), brute_force(lru, -1, k, now)) << "any owner, n " << k << " round " << round;
      ASSERT_EQ(lru.select(3, k / 4, now), brute_force(lru, 3, k / 4, now)) << "owner 3, n " << k / 4 << " round " << round;
      const auto many = lru.select_many(wants, now);
      ASSERT_EQ(many.size(), wants.size());
      for (size_t i = 0; i < wants.size(); ++i)
        ASSERT_EQ(many[i], brute_force(lru, wants[i].first, wants[i].second, now))
            << "owner " << wants[i].first << " n " << wants[i].second << " round " << round;
    }
  }
}

// touch_stamped (the after-step scan's branch-free pass) against touch() on each stamped resident
// slot not skipped, over the slots split into random ranges: the same last uses everywhere and the
// same hits per owner; free slots, other stamps, skipped slots and later last uses left alone.
TEST(BucketedLru, TouchStampedEqualsTouchingEachReadSlot) {
  std::mt19937_64 rng(17);
  const int64_t n_slots = 50021;
  for (const bool with_skip : {false, true}) {
    BucketedLru lru(n_slots, LruParams{4, 16, true});
    for (int32_t s = 0; s < n_slots; ++s) {
      if (rng() % 5 == 0) continue;  // free
      lru.insert(s, static_cast<int32_t>(rng() % 7), static_cast<int64_t>(rng() % 200));
      if (rng() % 9 == 0) lru.set_pinned(s, true);  // (pins do not matter to a touch)
    }
    const int64_t now = 150;  // (some last uses are later: a touch never moves them back)
    const int32_t stamp = 41;
    std::vector<int32_t> stamps(static_cast<size_t>(n_slots));
    std::vector<uint8_t> skip(static_cast<size_t>(n_slots), 0);
    for (int32_t s = 0; s < n_slots; ++s) {
      stamps[static_cast<size_t>(s)] = rng() % 3 == 0 ? stamp : static_cast<int32_t>(rng() % 41);
      skip[static_cast<size_t>(s)] = with_skip && rng() % 6 == 0;
    }
    BucketedLru want = lru;
    std::vector<int64_t> want_hits(8, 0);
    for (int32_t s = 0; s < n_slots; ++s)
      if (stamps[static_cast<size_t>(s)] == stamp && want.resident(s) && !skip[static_cast<size_t>(s)]) {
        ++want_hits[static_cast<size_t>(want.owner(s)) + 1];
        want.touch(s, now);
      }
    std::vector<int64_t> hits(8, 0);
    for (int64_t b = 0; b < n_slots;) {
      const int64_t e = std::min<int64_t>(n_slots, b + 1 + static_cast<int64_t>(rng() % 9000));
      lru.touch_stamped(stamps, stamp, now, with_skip ? skip.data() : nullptr, b, e, hits.data());
      b = e;
    }
    EXPECT_EQ(hits, want_hits);
    EXPECT_EQ(hits[0], 0);
    EXPECT_GT(want_hits[1], 1000);  // (the case reads many slots of each owner)
    for (int32_t s = 0; s < n_slots; ++s) {
      ASSERT_EQ(lru.resident(s), want.resident(s));
      ASSERT_EQ(lru.last_use(s), want.last_use(s)) << "slot " << s;
    }
  }
}

// The clock past 32 bits: last uses are kept as offsets from a base that advance() moves (every
// 2^30 ticks, to 2^29 ticks back, older uses clamped to it). Selections over a clock that jumps
// by up to 2^28 ticks a round, through several moves of the base, equal the definition computed
// from the true 64-bit last uses the test keeps beside the LRU.
TEST(BucketedLru, ClockPast32BitsKeepsTheOrder) {
  std::mt19937_64 rng(23);
  const int64_t n_slots = 3001;
  for (const LruParams p : {LruParams{4, 16, false}, LruParams{30, 4, true}}) {
    BucketedLru lru(n_slots, p);
    std::vector<int64_t> truth(static_cast<size_t>(n_slots), 0);
    int64_t now = 0;
    for (int round = 0; round < 40; ++round) {
      for (int i = 0; i < 800; ++i) {
        const int32_t s = static_cast<int32_t>(rng() % static_cast<uint64_t>(n_slots));
        if (!lru.resident(s)) {
          lru.insert(s, static_cast<int32_t>(rng() % 3), now);
          truth[static_cast<size_t>(s)] = now;
        } else if (rng() % 6 == 0) {
          lru.erase(s);
        } else {
          lru.touch(s, now);
          truth[static_cast<size_t>(s)] = std::max(truth[static_cast<size_t>(s)], now);
        }
        now += static_cast<int64_t>(rng() % 3);
      }
      // A jump: small (inside the order's bins), or up to 2^28 ticks.
      now += rng() % 2 == 0 ? static_cast<int64_t>(rng() % 50) : static_cast<int64_t>(rng() % (int64_t{1} << 28));
      // (a last use is the true one, or one clamped to a base at least 2^29 ticks back)
      for (int32_t s = 0; s < n_slots; ++s) {
        if (!lru.resident(s)) continue;
        const int64_t u = lru.last_use(s), t = truth[static_cast<size_t>(s)];
        ASSERT_TRUE(u == t || (u > t && now - u >= (int64_t{1} << 29))) << "slot " << s << ": " << u << " for " << t;
      }
      // The definition from the true last uses.
      const auto want = [&](int32_t owner, int64_t n) { return brute_force(lru, owner, n, now, &truth); };
      const int64_t n = static_cast<int64_t>(rng() % 2500);
      ASSERT_EQ(lru.select(-1, n, now), want(-1, n)) << "round " << round;
      const std::vector<std::pair<int32_t, int64_t>> wants{{0, n / 2}, {2, n}};
      const auto many = lru.select_many(wants, now);
      ASSERT_EQ(many[0], want(0, n / 2)) << "round " << round;
      ASSERT_EQ(many[1], want(2, n)) << "round " << round;
      EXPECT_EQ(lru.check_invariants(now), "");
    }
    EXPECT_GE(lru.rebases(), 3);  // (the clock passed 2^31 ticks: the base moved several times)
    EXPECT_GT(now, int64_t{1} << 31);
  }
}

}  // namespace dhs
