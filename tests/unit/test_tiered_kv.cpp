// The KV hierarchy's bookkeeping (kv/tiered_kv.h) with both tiers as host pools: the page-move
// engine's coalescing, then random scenarios — requests appending tokens, steps reading random
// page subsets under small device budgets, rollbacks, budget changes, requests finishing — with
// the hierarchy's invariants checked after every operation (each pool's accounting, every page
// named once, in the tier its table says, the LRU tracking exactly the device pages, budgets
// kept) and every token's K and V rows bit-equal to what was written, read from wherever the
// page now lives (after every operation in the first rounds, every 25th later: the cost). At
// least 10^6 page moves in all.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "kv/lru_mirror.h"
#include "kv/page_pool.h"
#include "kv/page_table.h"
#include "kv/tier_copy.h"
#include "kv/tier_land.h"
#include "kv/tier_split.h"
#include "kv/tiered_kv.h"

namespace dhs {
namespace {

constexpr int kPage = 4, kDim = 3, kLayers = 2, kHeads = 2;

TEST(TierCopy, CoalescesConsecutiveSlotsAndCopiesKAndV) {
  PagePool dev(Tier::Device, 8, kPage, kDim), host(Tier::Host, 8, kPage, kDim);
  std::vector<PageRef> d, h;
  ASSERT_TRUE(dev.allocate(8, &d));
  ASSERT_TRUE(host.allocate(8, &h));
  for (int32_t s = 0; s < 8; ++s)
    for (int i = 0; i < kPage * kDim; ++i) {
      dev.k_page({Tier::Device, s})[i] = static_cast<float>(100 * s + i);
      dev.v_page({Tier::Device, s})[i] = static_cast<float>(-100 * s - i);
    }
  // Slots 2,3,4 -> 5,6,7 (one run), 0 -> 1, 6 -> 0 (two more).
  const std::vector<PageMove> moves = {{{Tier::Device, 2}, {Tier::Host, 5}}, {{Tier::Device, 3}, {Tier::Host, 6}},
                                       {{Tier::Device, 4}, {Tier::Host, 7}}, {{Tier::Device, 0}, {Tier::Host, 1}},
                                       {{Tier::Device, 6}, {Tier::Host, 0}}};
  EXPECT_EQ(copy_pages(dev, host, moves), 3);
  for (const PageMove& m : moves)
    for (int i = 0; i < kPage * kDim; ++i) {
      ASSERT_EQ(host.k_page(m.dst)[i], static_cast<float>(100 * m.src.slot + i));
      ASSERT_EQ(host.v_page(m.dst)[i], static_cast<float>(-100 * m.src.slot - i));
    }
  EXPECT_THROW(copy_pages(host, dev, moves), Error);  // tiers reversed
  host.free({Tier::Host, 5});
  EXPECT_THROW(copy_pages(dev, host, moves), Error);  // a free destination
}

// The value of row `pos` of (layer, head) of request `req`, element e (K: sign +, V: sign -):
// distinct for every token, so a page read from the wrong slot shows.
float value(uint64_t req, int layer, int head, int64_t pos, int e) {
  return static_cast<float>(((req * 131 + static_cast<uint64_t>(layer) * 17 + static_cast<uint64_t>(head)) * 100003 +
                             static_cast<uint64_t>(pos) * 7 + static_cast<uint64_t>(e)) %
                            1000003);
}

struct Req {
  std::unique_ptr<PageTable> t;
  uint64_t key;          // for the values (PageTable ids differ across runs of the test)
  bool swapped = false;  // swap_out'ed: neither appended to nor read until swap_in
};

class Scenario {
 public:
  Scenario(int64_t dev_pages, int64_t host_pages, LruParams lru)
      : dev_(Tier::Device, dev_pages, kPage, kDim), host_(Tier::Host, host_pages, kPage, kDim), kv_(dev_, host_, lru) {}

  PagePool dev_, host_;
  TieredKv kv_;
  std::vector<Req> reqs_;
  int64_t now_ = 0;
  uint64_t next_key_ = 1;

  const PagePool& pool(Tier t) const { return t == Tier::Device ? dev_ : host_; }

  // Appends n tokens to r: reserve on the device (offloading anyone's full pages for room first),
  // write their rows, commit, adopt. False when the device tier cannot make room.
  bool append(Req& r, int64_t n) {
    try {
      kv_.prepare_append(*r.t, now_);  // (a rollback may have left its appending page in the host tier)
    } catch (const Error&) {
      return false;  // no room for it now
    }
    if (!kv_.make_room(r.t->pages_needed(n), now_)) return false;  // others' cold pages to the host
    if (!r.t->reserve(dev_, n)) return false;
    const int64_t p0 = r.t->n_tokens();
    for (int l = 0; l < kLayers; ++l)
      for (int h = 0; h < kHeads; ++h)
        for (int64_t pos = p0; pos < p0 + n; ++pos) {
          int row = 0;
          const PageRef p = r.t->page_of_token(l, h, pos, &row);
          EXPECT_EQ(p.tier, Tier::Device) << "appending into an offloaded page";
          for (int e = 0; e < kDim; ++e) {
            dev_.k_page(p)[row * kDim + e] = value(r.key, l, h, pos, e);
            dev_.v_page(p)[row * kDim + e] = -value(r.key, l, h, pos, e);
          }
        }
    r.t->commit(n);
    kv_.adopt_new_pages(*r.t, now_);
    return true;
  }

  void check(bool bytes = true) {
    ASSERT_EQ(kv_.check_invariants(), "");
    if (!bytes) return;
    for (const Req& r : reqs_)
      for (int l = 0; l < kLayers; ++l)
        for (int h = 0; h < kHeads; ++h)
          for (int64_t pos = 0; pos < r.t->n_tokens(); ++pos) {
            int row = 0;
            const PageRef p = r.t->page_of_token(l, h, pos, &row);
            const PagePool& pl = pool(p.tier);
            for (int e = 0; e < kDim; ++e) {
              ASSERT_EQ(pl.k_page(p)[row * kDim + e], value(r.key, l, h, pos, e))
                  << "K of token " << pos << " of (" << l << ", " << h << ") in " << tier_name(p.tier) << " slot " << p.slot;
              ASSERT_EQ(pl.v_page(p)[row * kDim + e], -value(r.key, l, h, pos, e));
            }
          }
  }
};

TEST(TieredKv, EvictsWithinTheBudgetAndRecallsBitExact) {
  Scenario s(64, 256, {.bucket_steps = 1, .n_buckets = 8});
  s.reqs_.push_back({std::make_unique<PageTable>(kLayers, kHeads, kPage), s.next_key_++});
  Req& r = s.reqs_.back();
  s.kv_.add(*r.t, 0, /*budget=*/12);  // (every page full after the append: all count)
  ASSERT_TRUE(s.append(r, 32));  // 8 pages per list, 32 in all; 4 tail-free lists: all full
  s.check();
  EXPECT_EQ(s.kv_.resident_pages(*r.t), 12);
  // A step reads pages 0-2 of every list (12 pages): the ones offloaded come back, others leave.
  std::vector<PageId> want;
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < kHeads; ++h)
      for (int64_t i = 0; i < 3; ++i) want.push_back({l, h, i});
  s.now_ = 1;
  const TierStats st = s.kv_.ensure_resident(*r.t, want, s.now_);
  EXPECT_EQ(st.hits + st.recalled, 12);
  for (const PageId& id : want) EXPECT_EQ(r.t->page(id.layer, id.head, id.idx).tier, Tier::Device);
  EXPECT_EQ(s.kv_.resident_pages(*r.t), 12);
  s.check();
  // 13 pages at once with a budget of 12: held past it while the layer reads them, back to 12
  // when the layer ends.
  want.push_back({0, 0, 5});
  s.kv_.ensure_resident(*r.t, want, s.now_);
  EXPECT_EQ(s.kv_.resident_pages(*r.t), 13);
  s.kv_.end_step(s.now_);
  EXPECT_EQ(s.kv_.resident_pages(*r.t), 12);
  s.check();
  // A page offloaded, recalled, offloaded again: the second eviction needs no copy.
  s.now_ = 2;
  const TierStats back = s.kv_.ensure_resident(*r.t, std::vector<PageId>{{1, 1, 7}}, s.now_);
  EXPECT_EQ(back.recalled, 1);
  s.kv_.end_step(s.now_);
  s.now_ = 20;
  const std::vector<PageId> others = {{0, 0, 4}, {0, 1, 4}, {1, 0, 4}, {1, 1, 4}, {0, 0, 5}, {0, 1, 5},
                                      {1, 0, 5}, {1, 1, 5}, {0, 0, 6}, {0, 1, 6}, {1, 0, 6}, {1, 1, 6}};
  const TierStats away = s.kv_.ensure_resident(*r.t, others, s.now_);
  EXPECT_GE(away.dropped, 1);
  EXPECT_EQ(r.t->page(1, 1, 7).tier, Tier::Host);
  s.check();
  s.kv_.end_step(s.now_);
  s.kv_.release(*r.t);
  EXPECT_EQ(s.dev_.n_used(), 0);
  EXPECT_EQ(s.host_.n_used(), 0);
}

TEST(TieredKv, RefusesWhatTheTiersCannotHoldChangingNothing) {
  Scenario s(40, 36, {});
  for (int i = 0; i < 2; ++i) {
    s.reqs_.push_back({std::make_unique<PageTable>(kLayers, kHeads, kPage), s.next_key_++});
    s.kv_.add(*s.reqs_.back().t, 0);
  }
  Req& a = s.reqs_[0];
  Req& b = s.reqs_[1];
  ASSERT_TRUE(s.append(a, 40));  // 40 pages: the device tier is full
  ASSERT_TRUE(s.append(b, 8));   // 8 more: 8 of a's go to the host tier
  s.check();
  EXPECT_EQ(s.kv_.resident_pages(*a.t), 32);
  const auto pages_of = [](int64_t n) {
    std::vector<PageId> v;
    for (int l = 0; l < kLayers; ++l)
      for (int h = 0; h < kHeads; ++h)
        for (int64_t i = 0; i < n; ++i) v.push_back({l, h, i});
    return v;
  };
  // A layer pins all of b's pages; then a wants all 40 of its own at once: 32 resident, 8 to
  // recall, no free slot and nothing unpinned to evict. Refused; a's pins undone, nothing moved.
  s.kv_.ensure_resident(*b.t, pages_of(2), 1);
  EXPECT_THROW(s.kv_.ensure_resident(*a.t, pages_of(10), 1), Error);
  s.check();
  EXPECT_EQ(s.kv_.resident_pages(*a.t), 32);
  int pinned = 0;
  for (int32_t slot = 0; slot < 40; ++slot) pinned += s.kv_.lru().resident(slot) && s.kv_.lru().pinned(slot);
  EXPECT_EQ(pinned, 8) << "the refused call left pins behind";
  s.kv_.end_step(1);
  // The host tier (36 slots, 8 in use): a budget of 0 for a would offload its 32 resident pages;
  // 28 fit, and a keeps the other 4 past its budget while the host tier is full.
  s.kv_.set_budget(*a.t, 0, 2);
  EXPECT_EQ(s.host_.n_free(), 0);
  EXPECT_EQ(s.kv_.resident_pages(*a.t), 4);
  s.check();
  // a rollback into an offloaded page with both tiers full: the page stays in the host tier until
  // there is room (prepare_append refuses, changing nothing), then comes back without its copy.
  s.kv_.truncate(*a.t, 37, 3);
  s.check();
  EXPECT_EQ(a.t->page(0, 0, 9).tier, Tier::Device) << "page 9 appends again: back (room was made by the truncate)";
  s.kv_.set_budget(*a.t, TieredKv::kUnlimited, 3);
  s.check();
  for (Req& r : s.reqs_) s.kv_.release(*r.t);
  EXPECT_EQ(s.dev_.n_used() + s.host_.n_used(), 0);
}

TEST(TieredKv, RollbackBringsTheAppendingPageBack) {
  Scenario s(64, 256, {.bucket_steps = 1, .n_buckets = 4});
  s.reqs_.push_back({std::make_unique<PageTable>(kLayers, kHeads, kPage), s.next_key_++});
  Req& r = s.reqs_.back();
  s.kv_.add(*r.t, 0, /*budget=*/8);
  ASSERT_TRUE(s.append(r, 24));  // 6 pages per list, 24 in all, 16 offloaded
  s.check();
  // Truncate into the middle of page 1: page 1 of each list appends again, so it is resident
  // without a host copy; everything past it is freed in both tiers.
  s.now_ = 1;
  s.kv_.truncate(*r.t, 6, s.now_);
  s.check();
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < kHeads; ++h) EXPECT_EQ(r.t->page(l, h, 1).tier, Tier::Device);
  ASSERT_TRUE(s.append(r, 5));  // overwrite rows 2-3 of page 1 and go on into page 2
  s.check();
  s.kv_.release(*r.t);
  EXPECT_EQ(s.dev_.n_used() + s.host_.n_used(), 0);
}

// The recall-ahead schedule (the GPU's): a step's reads change no tier, hits and late reads are
// counted apart, and after the step the pages it read come back in the order given, as far as
// the budget goes beside the pages already resident; with no room, nothing moves.
TEST(TieredKv, RecallAheadKeepsTheBudgetAndTheOrder) {
  Scenario s(64, 256, {.bucket_steps = 1, .n_buckets = 8});
  s.reqs_.push_back({std::make_unique<PageTable>(kLayers, kHeads, kPage), s.next_key_++});
  Req& r = s.reqs_.back();
  s.kv_.add(*r.t, 0, /*budget=*/12);
  ASSERT_TRUE(s.append(r, 32));  // 8 full pages per list, 32 in all, 12 resident
  const auto first_pages = [](int64_t n) {
    std::vector<PageId> v;
    for (int l = 0; l < kLayers; ++l)
      for (int h = 0; h < kHeads; ++h)
        for (int64_t i = 0; i < n; ++i) v.push_back({l, h, i});
    return v;
  };
  const auto tiers_of = [&](const std::vector<PageId>& ids) {
    std::vector<Tier> v;
    for (const PageId& id : ids) v.push_back(r.t->page(id.layer, id.head, id.idx).tier);
    return v;
  };
  s.now_ = 1;
  const std::vector<PageId> want = first_pages(3);  // 12 pages: the budget exactly
  int64_t resident_before = 0;
  for (Tier t : tiers_of(want)) resident_before += t == Tier::Device;
  ASSERT_LT(resident_before, 12) << "the scenario should start with some of them offloaded";
  const std::vector<Tier> tiers_before = tiers_of(want);
  const TierStats read = s.kv_.note_reads(*r.t, want, s.now_);
  EXPECT_EQ(read.hits, resident_before);
  EXPECT_EQ(read.late, 12 - resident_before);
  EXPECT_EQ(tiers_of(want), tiers_before) << "a step's reads moved pages";
  const TierStats back = s.kv_.recall_ahead(*r.t, want, s.now_);
  EXPECT_EQ(back.recalled, 12 - resident_before);
  EXPECT_EQ(back.hits, 0) << "hits are counted when read, not when recalled";
  for (Tier t : tiers_of(want)) EXPECT_EQ(t, Tier::Device);
  EXPECT_EQ(s.kv_.resident_pages(*r.t), 12);
  for (int32_t slot = 0; slot < 64; ++slot) EXPECT_FALSE(s.kv_.lru().resident(slot) && s.kv_.lru().pinned(slot));
  s.check();
  // 16 pages read with a budget of 12, 12 of them resident: those stay (no page read is evicted
  // for another), the 4 others stay in the host tier.
  s.now_ = 2;
  std::vector<PageId> more = first_pages(4);
  std::rotate(more.begin(), more.end() - 1, more.end());  // the last list's page 3 first
  s.kv_.note_reads(*r.t, more, s.now_);
  EXPECT_EQ(s.kv_.recall_ahead(*r.t, more, s.now_).recalled, 0);
  for (const PageId& id : more) EXPECT_EQ(r.t->page(id.layer, id.head, id.idx).tier, id.idx < 3 ? Tier::Device : Tier::Host);
  s.check();
  // Room for two more: the first two missing in the given order come back — (1, 1, 3), then
  // (0, 0, 3) — and the budget holds.
  s.kv_.set_budget(*r.t, 14, s.now_);
  s.now_ = 3;
  EXPECT_EQ(s.kv_.recall_ahead(*r.t, more, s.now_).recalled, 2);
  EXPECT_EQ(s.kv_.resident_pages(*r.t), 14);
  for (const PageId& id : more) {
    const bool back = id.idx < 3 || (id.layer == 1 && id.head == 1) || (id.layer == 0 && id.head == 0);
    EXPECT_EQ(r.t->page(id.layer, id.head, id.idx).tier, back ? Tier::Device : Tier::Host)
        << "(" << id.layer << ", " << id.head << ", " << id.idx << ")";
  }
  s.check();
  // Hits known by device slot (the GPU's record): counted for the request, free slots skipped.
  std::vector<int32_t> slots;
  for (const PageId& id : want) slots.push_back(r.t->page(id.layer, id.head, id.idx).slot);
  const int32_t free_slot = [&] {
    for (int32_t slot = 0; slot < 64; ++slot)
      if (!s.kv_.lru().resident(slot)) return slot;
    return -1;
  }();
  ASSERT_GE(free_slot, 0);
  slots.push_back(free_slot);
  const int64_t hits_before = s.kv_.request_stats(*r.t).hits;
  EXPECT_EQ(s.kv_.touch_slots(slots, 4).hits, 12);
  EXPECT_EQ(s.kv_.request_stats(*r.t).hits, hits_before + 12);
  for (const PageId& id : want) EXPECT_EQ(s.kv_.lru().last_use(r.t->page(id.layer, id.head, id.idx).slot), 4);
  s.now_ = 4;
  s.check();
  // A budget of 0: no room, nothing comes back (and nothing left pinned).
  s.kv_.set_budget(*r.t, 0, s.now_);
  const TierStats none = s.kv_.recall_ahead(*r.t, want, s.now_);
  EXPECT_EQ(none.recalled, 0);
  EXPECT_EQ(s.kv_.resident_pages(*r.t), 0);
  s.check();
  s.kv_.release(*r.t);
  EXPECT_EQ(s.dev_.n_used() + s.host_.n_used(), 0);
}

// A decode step's reads for each request of s: per list, a random third of its pages and the page
// it appends into.
std::vector<std::vector<PageId>> random_reads(const Scenario& s, std::mt19937& rng) {
  std::vector<std::vector<PageId>> reads(s.reqs_.size());
  for (size_t r = 0; r < s.reqs_.size(); ++r) {
    const PageTable& t = *s.reqs_[r].t;
    for (int l = 0; l < kLayers; ++l)
      for (int h = 0; h < kHeads; ++h)
        for (int64_t i = 0; i < t.n_pages_per_list(); ++i)
          if (i == t.n_pages_per_list() - 1 || rng() % 3 == 0) reads[r].push_back({l, h, i});
  }
  return reads;
}

// after_decode_step (the GPU's record: a stamp per device slot read, late reads by sequence) does
// what the list form does — note_reads of every read, then recall_ahead of each request's reads —
// on twin hierarchies over several steps of random reads under tight budgets: the same pages in
// the same tiers, the same hits, late reads, recalls and evictions, every byte where its table says.
// (kDev: the device pool; from BucketedLru::kParallelSlots slots on, the stamps' scan runs over
// chunks on the thread pool)
void expect_stamps_equal_list_form(int64_t kDev) {
  constexpr int64_t kHost = 256;
  const LruParams lru{kLayers, 4, true};
  Scenario a(kDev, kHost, lru), b(kDev, kHost, lru);
  for (Scenario* s : {&a, &b})
    for (int r = 0; r < 2; ++r) {
      s->reqs_.push_back({std::make_unique<PageTable>(kLayers, kHeads, kPage), s->next_key_++});
      s->kv_.add(*s->reqs_.back().t, 0, /*budget=*/14);
      ASSERT_TRUE(s->append(s->reqs_.back(), 30 + 6 * r));
    }
  std::mt19937 rng(5);
  std::vector<int32_t> stamps(kDev, 0);
  for (int step = 1; step <= 40; ++step) {
    const int64_t now = int64_t{step} * kLayers + kLayers - 1;
    a.now_ = b.now_ = now;
    const std::vector<std::vector<PageId>> reads = random_reads(a, rng);
    // a: the list form.
    for (int r = 0; r < 2; ++r) a.kv_.note_reads(*a.reqs_[static_cast<size_t>(r)].t, reads[static_cast<size_t>(r)], now);
    for (int r = 0; r < 2; ++r) a.kv_.recall_ahead(*a.reqs_[static_cast<size_t>(r)].t, reads[static_cast<size_t>(r)], now);
    // b: the stamps of the resident reads, the late ones by sequence in the order read.
    std::vector<TieredKv::LateRead> late;
    for (int r = 0; r < 2; ++r)
      for (const PageId& id : reads[static_cast<size_t>(r)]) {
        const PageRef p = b.reqs_[static_cast<size_t>(r)].t->page(id.layer, id.head, id.idx);
        if (p.tier == Tier::Device) stamps[static_cast<size_t>(p.slot)] = step;
        else late.push_back({r, id});
      }
    std::vector<PageTable*> tables = {b.reqs_[0].t.get(), b.reqs_[1].t.get()};
    b.kv_.after_decode_step(stamps, step, late, tables, now);
    for (int r = 0; r < 2; ++r) {
      const PageTable &ta = *a.reqs_[static_cast<size_t>(r)].t, &tb = *b.reqs_[static_cast<size_t>(r)].t;
      for (int l = 0; l < kLayers; ++l)
        for (int h = 0; h < kHeads; ++h)
          for (int64_t i = 0; i < ta.n_pages_per_list(); ++i)
            ASSERT_EQ(ta.page(l, h, i).tier, tb.page(l, h, i).tier) << "step " << step << " request " << r << " page " << i;
      const TierStats sa = a.kv_.request_stats(ta), sb = b.kv_.request_stats(tb);
      EXPECT_EQ(sa.hits, sb.hits);
      EXPECT_EQ(sa.late, sb.late);
      EXPECT_EQ(sa.recalled, sb.recalled);
    }
    const TierStats &ta = a.kv_.totals(), &tb = b.kv_.totals();
    EXPECT_EQ(ta.offloaded + ta.dropped, tb.offloaded + tb.dropped) << "step " << step;
    a.check();
    b.check();
    // Every few steps both append a token (a new page per list now and then).
    if (step % 3 == 0) {
      for (Scenario* s : {&a, &b})
        for (Req& r : s->reqs_) ASSERT_TRUE(s->append(r, 1));
    }
  }
  EXPECT_GT(a.kv_.totals().recalled, 20) << "the scenario should move pages";
  EXPECT_GT(a.kv_.totals().offloaded + a.kv_.totals().dropped, 20);
}

TEST(TieredKv, AfterDecodeStepByStampsEqualsTheListForm) {
  expect_stamps_equal_list_form(48);
  expect_stamps_equal_list_form(BucketedLru::kParallelSlots + 100);
}

// The LRU keeps last uses as 32-bit offsets from a base that moves once the clock is 2^30 past it
// (kv/bucketed_lru.h): twin hierarchies run the same 40 steps of random reads under tight budgets,
// one on a clock from 0, the other on the same clock shifted to just below 2^30 (the base moves
// during the run) or to past 2^32 — every page in the same tier and slot after every step, the
// same counts, every byte where its table says.
void expect_shifted_clock_equal(int64_t kDev, int64_t shift) {
  constexpr int64_t kHost = 256;
  const LruParams lru{kLayers, 4, true};
  Scenario a(kDev, kHost, lru), b(kDev, kHost, lru);
  for (Scenario* s : {&a, &b}) {
    s->now_ = s == &b ? shift : 0;
    for (int r = 0; r < 2; ++r) {
      s->reqs_.push_back({std::make_unique<PageTable>(kLayers, kHeads, kPage), s->next_key_++});
      s->kv_.add(*s->reqs_.back().t, s->now_, /*budget=*/14);
      ASSERT_TRUE(s->append(s->reqs_.back(), 30 + 6 * r));
    }
  }
  std::mt19937 rng(9);
  std::vector<int32_t> stamps(static_cast<size_t>(kDev), 0);
  for (int step = 1; step <= 40; ++step) {
    const int64_t now = int64_t{step} * kLayers + kLayers - 1;
    a.now_ = now;
    b.now_ = now + shift;
    const std::vector<std::vector<PageId>> reads = random_reads(a, rng);
    for (Scenario* s : {&a, &b}) {
      std::vector<TieredKv::LateRead> late;
      for (int r = 0; r < 2; ++r)
        for (const PageId& id : reads[static_cast<size_t>(r)]) {
          const PageRef p = s->reqs_[static_cast<size_t>(r)].t->page(id.layer, id.head, id.idx);
          if (p.tier == Tier::Device) stamps[static_cast<size_t>(p.slot)] = step;
          else late.push_back({r, id});
        }
      std::vector<PageTable*> tables = {s->reqs_[0].t.get(), s->reqs_[1].t.get()};
      s->kv_.after_decode_step(stamps, step, late, tables, s->now_);
      std::fill(stamps.begin(), stamps.end(), 0);
    }
    for (int r = 0; r < 2; ++r) {
      const PageTable &ta = *a.reqs_[static_cast<size_t>(r)].t, &tb = *b.reqs_[static_cast<size_t>(r)].t;
      for (int l = 0; l < kLayers; ++l)
        for (int h = 0; h < kHeads; ++h)
          for (int64_t i = 0; i < ta.n_pages_per_list(); ++i)
            ASSERT_EQ(ta.page(l, h, i), tb.page(l, h, i)) << "step " << step << " request " << r << " page " << i;
      const TierStats sa = a.kv_.request_stats(ta), sb = b.kv_.request_stats(tb);
      EXPECT_EQ(sa.hits, sb.hits);
      EXPECT_EQ(sa.late, sb.late);
      EXPECT_EQ(sa.recalled, sb.recalled);
    }
    EXPECT_EQ(a.kv_.totals().offloaded + a.kv_.totals().dropped, b.kv_.totals().offloaded + b.kv_.totals().dropped);
    a.check();
    b.check();
    if (step % 3 == 0) {
      for (Scenario* s : {&a, &b})
        for (Req& r : s->reqs_) {
          ASSERT_TRUE(s->append(r, 1));
        }
    }
  }
  EXPECT_GT(a.kv_.totals().recalled, 20) << "the scenario should move pages";
  if (shift < (int64_t{1} << 30)) {
    EXPECT_EQ(b.kv_.lru().rebases(), 1);  // (the base moved during the run)
  }
  EXPECT_EQ(a.kv_.lru().rebases(), 0);
}

TEST(TieredKv, ClockPast32BitsKeepsEveryPageWhereItWas) {
  const int64_t below = (int64_t{1} << 30) - 20 * kLayers, past = (int64_t{1} << 32) + 12345;
  expect_shifted_clock_equal(48, below);
  expect_shifted_clock_equal(48, past);
  expect_shifted_clock_equal(BucketedLru::kParallelSlots + 100, below);
}

// The overlapped order of the CUDA runner (after_step_reads once a step is done; its
// after_step_recalls while the next step runs, whose lists were taken from the tables before
// those moves): over 40 steps of random reads under tight budgets, every page stays where its
// table says with every byte; the next step's hits leave out exactly the slots whose page the
// in-flight recalls changed (the step read what the slot held before, or the slot was free), and
// count every other stamped resident slot; late reads are those of the tables at launch.
TEST(TieredKv, RecallsInFlightLeaveChangedSlotsOutOfTheNextHits) {
  constexpr int64_t kDev = 64, kHost = 300;
  Scenario s(kDev, kHost, LruParams{kLayers, 4, true});
  for (int r = 0; r < 2; ++r) {
    s.reqs_.push_back({std::make_unique<PageTable>(kLayers, kHeads, kPage), s.next_key_++});
    s.kv_.add(*s.reqs_.back().t, 0, /*budget=*/14);
    ASSERT_TRUE(s.append(s.reqs_.back(), 30 + 6 * r));
  }
  std::vector<PageTable*> tables = {s.reqs_[0].t.get(), s.reqs_[1].t.get()};
  std::mt19937 rng(23);
  std::vector<int32_t> stamps(kDev, 0);
  std::vector<TieredKv::LateRead> pending_late;  // the last step's late reads (its recalls pending)
  int64_t skipped_total = 0, recalled_in_flight = 0;
  for (int step = 1; step <= 40; ++step) {
    const int64_t now = int64_t{step} * kLayers + kLayers - 1;
    s.now_ = now;
    // Launch: the step's lists from the tables as they are now.
    std::vector<TieredKv::LateRead> late;
    std::vector<std::pair<int32_t, std::tuple<int, int, int, int64_t>>> read_slots;  // slot -> (seq, page) it held
    for (int r = 0; r < 2; ++r) {
      const PageTable& t = *tables[static_cast<size_t>(r)];
      for (int l = 0; l < kLayers; ++l)
        for (int h = 0; h < kHeads; ++h)
          for (int64_t i = 0; i < t.n_pages_per_list(); ++i) {
            if (!(i == t.n_pages_per_list() - 1 || rng() % 3 == 0)) continue;
            const PageRef p = t.page(l, h, i);
            if (p.tier == Tier::Device) {
              stamps[static_cast<size_t>(p.slot)] = step;
              read_slots.push_back({p.slot, {r, l, h, i}});
            } else {
              late.push_back({r, PageId{l, h, i}});
            }
          }
    }
    // While it runs: the last step's recalls, in flight; which slots' pages they change.
    std::vector<std::optional<std::tuple<const PageTable*, int, int, int64_t>>> held(kDev);
    auto snapshot = [&] {
      std::vector<std::optional<std::tuple<const PageTable*, int, int, int64_t>>> h(kDev);
      for (int32_t slot = 0; slot < kDev; ++slot) {
        const PageTable* t = nullptr;
        PageId id;
        if (s.kv_.page_at(slot, &t, &id)) h[static_cast<size_t>(slot)] = std::tuple{t, id.layer, id.head, id.idx};
      }
      return h;
    };
    held = snapshot();
    std::vector<uint8_t> moved(kDev, 0);  // device slots a copy went through (a page out and back in is one)
    s.kv_.set_move_hook([&](PageRef from, PageRef to) {
      for (const PageRef p : {from, to})
        if (p.tier == Tier::Device) moved[static_cast<size_t>(p.slot)] = 1;
    });
    if (step > 1) {
      const TierStats rc = s.kv_.after_step_recalls(pending_late, now - kLayers, /*in_flight=*/true);
      recalled_in_flight += rc.recalled;
    }
    const auto after = snapshot();
    s.kv_.set_move_hook({});
    // Done: its hits are the stamped slots still holding the page they held at launch, untouched.
    int64_t want_hits = 0;
    for (const auto& [slot, page] : read_slots) {
      const auto& [r, l, h, i] = page;
      const bool same = held[static_cast<size_t>(slot)] == after[static_cast<size_t>(slot)] && after[static_cast<size_t>(slot)] &&
                        std::get<0>(*after[static_cast<size_t>(slot)]) == tables[static_cast<size_t>(r)] &&
                        !moved[static_cast<size_t>(slot)];
      want_hits += same;
      skipped_total += !same;
    }
    const TierStats before = s.kv_.totals();
    const TierStats rd = s.kv_.after_step_reads(stamps, step, tables, now);
    ASSERT_TRUE(s.kv_.recalls_pending());
    EXPECT_EQ(rd.hits, want_hits) << "step " << step << ": hits other than the stamped slots the in-flight recalls left alone";
    EXPECT_EQ(s.kv_.totals().hits - before.hits, rd.hits);
    pending_late = late;
    s.check();
    if (step % 3 == 0) {
      // Appending between steps goes through the tiers: the pending recalls run first.
      s.kv_.after_step_recalls(pending_late, now);
      pending_late.clear();
      ASSERT_FALSE(s.kv_.recalls_pending());
      for (Req& r : s.reqs_) ASSERT_TRUE(s.append(r, 1));
      // (a step whose recalls ran is read again from scratch: reads then recalls, back to back)
      const TierStats again = s.kv_.after_step_reads(stamps, -1, tables, now);
      EXPECT_EQ(again.hits, 0);
    }
    // An operation on a table with recalls pending is refused, changing nothing.
    if (step == 7) {
      EXPECT_THROW(s.kv_.release(*tables[0]), Error);
    }
  }
  s.kv_.after_step_recalls(pending_late, 41 * kLayers);
  s.check();
  EXPECT_GT(recalled_in_flight, 20) << "the scenario should recall while steps run";
  EXPECT_GT(skipped_total, 5) << "and change slots the next step read";
}

// The LRU mirrored on the device (TieredKv::mirror_lru; kv/lru_mirror.h the device's side in CPU
// form): twin hierarchies run the CUDA runner's overlapped order over 40 steps of random reads
// under tight budgets — a by the read stamps' scan, b by the mirror (the patch before the launch,
// the step's tick written for each resident read, the reads counted per owner, the last uses
// copied back) — with the last step's recalls in flight while each step runs. After every step:
// every page in the same tier and slot, the same hits, late reads and recalls, every resident
// slot's last use equal, every byte where its table says. (kDev: the device pool, the stamps'
// scan on the thread pool from BucketedLru::kParallelSlots; shift: the clock's start, just below
// 2^30 so that the LRU's base moves during the run.) Fails when a slot changed in flight keeps the
// mirror's tick or counts its read, or a touch in flight is lost.
void expect_mirror_equal_stamps(int64_t kDev, int64_t shift) {
  constexpr int64_t kHost = 300;
  const LruParams lru{kLayers, 4, true};
  Scenario a(kDev, kHost, lru), b(kDev, kHost, lru);
  for (Scenario* s : {&a, &b}) {
    s->now_ = shift;
    for (int r = 0; r < 2; ++r) {
      s->reqs_.push_back({std::make_unique<PageTable>(kLayers, kHeads, kPage), s->next_key_++});
      s->kv_.add(*s->reqs_.back().t, shift, /*budget=*/14);
      ASSERT_TRUE(s->append(s->reqs_.back(), 30 + 6 * r));
    }
  }
  std::vector<int32_t> store(static_cast<size_t>(kDev)), copy_buf(static_cast<size_t>(kDev));
  b.kv_.mirror_lru(store);
  std::span<int32_t> copy_to(copy_buf);  // where the next copy of the mirror lands
  LruMirror mirror(kDev);
  std::mt19937 rng(31);
  std::vector<int32_t> stamps(static_cast<size_t>(kDev), 0);
  std::vector<TieredKv::LateRead> pending_late;
  int64_t replaced_reads = 0, full_patches = 0;
  for (int step = 1; step <= 40; ++step) {
    const int64_t now = shift + int64_t{step} * kLayers + kLayers - 1;
    a.now_ = b.now_ = now;
    // Launch: b's patch reaches the mirror first; the step's lists from the tables as they are now.
    const TieredKv::LruPatch patch = b.kv_.take_lru_patch(now);
    full_patches += patch.patch.full;
    mirror.apply(patch.patch);
    const std::vector<std::vector<PageId>> reads = random_reads(a, rng);
    std::vector<TieredKv::LateRead> late;
    std::vector<int32_t> read_b;
    // (the page a slot holds: the in-flight recalls may replace it)
    const auto held = [&](int32_t slot) {
      const PageTable* t = nullptr;
      PageId id{-1, -1, -1};
      const bool in = b.kv_.page_at(slot, &t, &id);
      return std::tuple{in, t, id.layer, id.head, id.idx};
    };
    std::vector<decltype(held(0))> held_at_launch;
    for (int r = 0; r < 2; ++r)
      for (const PageId& id : reads[static_cast<size_t>(r)]) {
        const PageRef pa = a.reqs_[static_cast<size_t>(r)].t->page(id.layer, id.head, id.idx);
        const PageRef pb = b.reqs_[static_cast<size_t>(r)].t->page(id.layer, id.head, id.idx);
        ASSERT_EQ(pa, pb);
        if (pa.tier == Tier::Device) {
          stamps[static_cast<size_t>(pa.slot)] = step;
          mirror.read(pb.slot);
          read_b.push_back(pb.slot);
          held_at_launch.push_back(held(pb.slot));
        } else {
          late.push_back({r, id});
        }
      }
    // While it runs: the last step's recalls in flight (at the step's first layer, as the runner).
    if (a.kv_.recalls_pending())
      for (Scenario* s : {&a, &b}) s->kv_.after_step_recalls(pending_late, now - kLayers + 1, /*in_flight=*/true);
    // Done: a scans the stamps, b takes the mirror's copy and counts.
    std::vector<PageTable*> ta = {a.reqs_[0].t.get(), a.reqs_[1].t.get()}, tb = {b.reqs_[0].t.get(), b.reqs_[1].t.get()};
    const TierStats ra = a.kv_.after_step_reads(stamps, step, ta, now);
    std::copy(mirror.use().begin(), mirror.use().end(), copy_to.begin());
    const std::vector<int64_t> counts = mirror.counts(patch.n_owners);
    for (size_t i = 0; i < read_b.size(); ++i) replaced_reads += held(read_b[i]) != held_at_launch[i];
    const TierStats rb = b.kv_.after_step_reads(copy_to, counts, tb, now, {}, &copy_to);
    ASSERT_EQ(ra.hits, rb.hits) << "step " << step;
    ASSERT_EQ(copy_to.data(), step % 2 == 1 ? store.data() : copy_buf.data()) << "the LRU gives up the other buffer";
    pending_late = late;
    const auto same = [&](const char* when) {
      for (int r = 0; r < 2; ++r) {
        const PageTable &xa = *ta[static_cast<size_t>(r)], &xb = *tb[static_cast<size_t>(r)];
        for (int l = 0; l < kLayers; ++l)
          for (int h = 0; h < kHeads; ++h)
            for (int64_t i = 0; i < xa.n_pages_per_list(); ++i)
              ASSERT_EQ(xa.page(l, h, i), xb.page(l, h, i)) << when << " step " << step << " request " << r << " page " << i;
        const TierStats sa = a.kv_.request_stats(xa), sb = b.kv_.request_stats(xb);
        ASSERT_EQ(sa.hits, sb.hits) << when << " step " << step;
        ASSERT_EQ(sa.late, sb.late);
        ASSERT_EQ(sa.recalled, sb.recalled);
      }
      for (int32_t slot = 0; slot < kDev; ++slot) {
        ASSERT_EQ(a.kv_.lru().resident(slot), b.kv_.lru().resident(slot));
        if (a.kv_.lru().resident(slot))
          ASSERT_EQ(a.kv_.lru().last_use(slot), b.kv_.lru().last_use(slot)) << when << " step " << step << " slot " << slot;
      }
      a.check();
      b.check();
    };
    same("after the reads:");
    if (step % 3 == 0) {
      for (Scenario* s : {&a, &b}) {
        s->kv_.after_step_recalls(pending_late, now);
        for (Req& r : s->reqs_) ASSERT_TRUE(s->append(r, 1));
      }
      pending_late.clear();
      same("after the appends:");
    }
  }
  for (Scenario* s : {&a, &b})
    if (s->kv_.recalls_pending()) s->kv_.after_step_recalls(pending_late, shift + 41 * kLayers);
  EXPECT_GT(a.kv_.totals().recalled, 20) << "the scenario should move pages";
  EXPECT_GT(replaced_reads, 5) << "and change slots while the step that read them ran";
  EXPECT_EQ(full_patches, 1 + b.kv_.lru().rebases()) << "the first patch and one after each move of the base";
  if (shift > 0) EXPECT_EQ(b.kv_.lru().rebases(), 1);
}

TEST(TieredKv, MirroredLruEqualsTheStampsScan) {
  expect_mirror_equal_stamps(64, 0);
  expect_mirror_equal_stamps(64, (int64_t{1} << 30) - 20 * kLayers);
  expect_mirror_equal_stamps(BucketedLru::kParallelSlots + 100, 0);
}

// A patch not followed by the mirror's copy (a step that failed before it) is followed by a full
// one; take_mirror without a patch, a mirror of the LRU's own storage, reads of another step than
// the patch's, and a patch with a page used at its own tick are refused.
TEST(TieredKv, MirroredLruRefusesWhatItCannotTrust) {
  Scenario s(32, 64, LruParams{kLayers, 4, true});
  s.reqs_.push_back({std::make_unique<PageTable>(kLayers, kHeads, kPage), s.next_key_++});
  s.kv_.add(*s.reqs_.back().t, 0, TieredKv::kUnlimited);
  ASSERT_TRUE(s.append(s.reqs_.back(), 20));
  std::vector<int32_t> store(32), other(32);
  std::vector<PageTable*> tables = {s.reqs_[0].t.get()};
  std::span<int32_t> spare(other);
  const std::vector<int64_t> counts(2, 0);
  EXPECT_THROW(s.kv_.after_step_reads(spare, counts, tables, 5, {}, &spare), Error);  // (not mirrored)
  s.kv_.mirror_lru(store);
  EXPECT_TRUE(s.kv_.take_lru_patch(5).patch.full);
  EXPECT_TRUE(s.kv_.take_lru_patch(6).patch.full) << "the last patch may not have reached the mirror";
  EXPECT_THROW(s.kv_.after_step_reads(spare, counts, tables, 5, {}, &spare), Error);  // (the patch was step 6's)
  std::span<int32_t> own(store);
  EXPECT_THROW(s.kv_.after_step_reads(own, counts, tables, 6, {}, &own), Error);
  LruMirror m(32);
  const TieredKv::LruPatch p = s.kv_.take_lru_patch(6);
  m.apply(p.patch);
  std::copy(m.use().begin(), m.use().end(), spare.begin());
  s.kv_.after_step_reads(spare, m.counts(p.n_owners), tables, 6, {}, &spare);
  s.kv_.after_step_recalls({}, 6);
  EXPECT_FALSE(s.kv_.take_lru_patch(7).patch.full);
  // A page used at the step's own tick before the step (a clock that did not move) would read as
  // the step's: the patch is refused.
  s.now_ = 9;
  ASSERT_TRUE(s.append(s.reqs_.back(), 16));  // (new pages inserted at 9)
  EXPECT_THROW(s.kv_.take_lru_patch(9), Error);
  EXPECT_TRUE(s.kv_.take_lru_patch(10).patch.full) << "the refused patch may not have reached the mirror";
  s.check();
}

// Owner ids of released requests are taken again, so what is sized by them (the per-step hit
// counts, the device mirror's) follows the requests held at once: 100 requests one after another,
// two at a time, leave the mirror's count of owners at 2; each request's hits stay its own.
TEST(TieredKv, OwnerIdsOfReleasedRequestsAreTakenAgain) {
  Scenario s(64, 64, LruParams{kLayers, 4, true});
  std::vector<int32_t> store(64);
  s.kv_.mirror_lru(store);
  Req keep{std::make_unique<PageTable>(kLayers, kHeads, kPage), s.next_key_++};
  s.kv_.add(*keep.t, 0, TieredKv::kUnlimited);
  ASSERT_TRUE(s.append(keep, 9));
  for (int i = 0; i < 100; ++i) {
    Req r{std::make_unique<PageTable>(kLayers, kHeads, kPage), s.next_key_++};
    s.kv_.add(*r.t, i, TieredKv::kUnlimited);
    ASSERT_TRUE(s.append(r, 5 + i % 7));
    EXPECT_EQ(s.kv_.request_stats(*r.t).hits, 0);
    s.kv_.touch_slots(std::vector<int32_t>{r.t->page(0, 0, 0).slot}, i);
    EXPECT_EQ(s.kv_.request_stats(*r.t).hits, 1);
    s.kv_.release(*r.t);
    s.check(false);
  }
  EXPECT_EQ(s.kv_.take_lru_patch(200).n_owners, 2);
  EXPECT_EQ(s.kv_.request_stats(*keep.t).hits, 0);
}

// after_decode_step's recalls for all requests at once (recall_batch: the free lists in the serial
// order, evictions then recalls per request on the thread pool, the copies evictions first)
// against one request at a time: twin hierarchies, three requests under tight budgets, 60 random
// steps; every page's tier and slot, every count and every byte equal after each step.
// a: batched (the default), b: one request at a time with the victims of any owner from one
// shared prefix of the LRU's order (TieredKv::AnyVictims), c: one at a time with a fresh
// selection each (the definition). All three end every step with the same tables and counts.
// Budgets from `budget0` on: small ones keep every request within its own pages (the batched path),
// large ones fill the pool, so recalls take other requests' pages (the shared prefix). all_resident:
// each step also reads every resident page, so every victim is as new as the recalls themselves
// (they take turns by slot with the slots the recalls before them inserted).
void recall_forms_scenario(int64_t budget0, int64_t* batched, int64_t* shared, bool all_resident = false) {
  constexpr int64_t kDev = 80, kHost = 400;
  const LruParams lru{kLayers, 4, true};
  Scenario a(kDev, kHost, lru), b(kDev, kHost, lru), c(kDev, kHost, lru);
  b.kv_.set_batch_recalls(false);
  c.kv_.set_batch_recalls(false);
  c.kv_.set_shared_victims(false);
  for (Scenario* s : {&a, &b, &c})
    for (int r = 0; r < 3; ++r) {
      s->reqs_.push_back({std::make_unique<PageTable>(kLayers, kHeads, kPage), s->next_key_++});
      s->kv_.add(*s->reqs_.back().t, 0, /*budget=*/budget0 + 2 * r);
      ASSERT_TRUE(s->append(s->reqs_.back(), 30 + 5 * r));
    }
  std::mt19937 rng(17);
  std::vector<int32_t> stamps_a(kDev, 0), stamps_b(kDev, 0), stamps_c(kDev, 0);
  for (int step = 1; step <= 60; ++step) {
    const int64_t now = int64_t{step} * kLayers + kLayers - 1;
    a.now_ = b.now_ = c.now_ = now;
    std::vector<std::vector<PageId>> reads(3);
    for (int r = 0; r < 3; ++r) {
      const PageTable& t = *a.reqs_[static_cast<size_t>(r)].t;
      for (int l = 0; l < kLayers; ++l)
        for (int h = 0; h < kHeads; ++h)
          for (int64_t i = 0; i < t.n_pages_per_list(); ++i)
            if (i == t.n_pages_per_list() - 1 || rng() % 3 == 0 || (all_resident && t.page(l, h, i).tier == Tier::Device))
              reads[static_cast<size_t>(r)].push_back({l, h, i});
    }
    for (auto [s, stamps] : {std::pair{&a, &stamps_a}, std::pair{&b, &stamps_b}, std::pair{&c, &stamps_c}}) {
      std::vector<TieredKv::LateRead> late;
      for (int r = 0; r < 3; ++r)
        for (const PageId& id : reads[static_cast<size_t>(r)]) {
          const PageRef p = s->reqs_[static_cast<size_t>(r)].t->page(id.layer, id.head, id.idx);
          if (p.tier == Tier::Device) (*stamps)[static_cast<size_t>(p.slot)] = step;
          else late.push_back({r, id});
        }
      std::vector<PageTable*> tables;
      for (Req& r : s->reqs_) tables.push_back(r.t.get());
      s->kv_.after_decode_step(*stamps, step, late, tables, now);
    }
    for (Scenario* x : {&a, &b}) {
      SCOPED_TRACE(x == &a ? "batched" : "one at a time, shared victims");
      for (int r = 0; r < 3; ++r) {
        const PageTable &tx = *x->reqs_[static_cast<size_t>(r)].t, &tc = *c.reqs_[static_cast<size_t>(r)].t;
        for (int l = 0; l < kLayers; ++l)
          for (int h = 0; h < kHeads; ++h)
            for (int64_t i = 0; i < tx.n_pages_per_list(); ++i) {
              const PageRef px = tx.page(l, h, i), pc = tc.page(l, h, i);
              ASSERT_TRUE(px.tier == pc.tier && px.slot == pc.slot) << "step " << step << " request " << r << " page " << i;
            }
        const TierStats sx = x->kv_.request_stats(tx), sc = c.kv_.request_stats(tc);
        ASSERT_EQ(sx.hits, sc.hits);
        ASSERT_EQ(sx.late, sc.late);
        ASSERT_EQ(sx.recalled, sc.recalled);
      }
      const TierStats &tx = x->kv_.totals(), &tc = c.kv_.totals();
      ASSERT_EQ(tx.offloaded, tc.offloaded) << "step " << step;
      ASSERT_EQ(tx.dropped, tc.dropped) << "step " << step;
      ASSERT_EQ(x->dev_.n_free(), c.dev_.n_free());
      ASSERT_EQ(x->host_.n_free(), c.host_.n_free());
      x->check();
    }
    c.check();
    if (step % 4 == 0) {
      for (Scenario* s : {&a, &b, &c})
        for (Req& r : s->reqs_) ASSERT_TRUE(s->append(r, 1));
    }
  }
  EXPECT_EQ(b.kv_.batched_steps(), 0);
  EXPECT_EQ(c.kv_.batched_steps(), 0);
  EXPECT_EQ(c.kv_.shared_victim_picks(), 0);
  EXPECT_GT(a.kv_.totals().recalled, 50);
  EXPECT_GT(a.kv_.totals().offloaded + a.kv_.totals().dropped, 50);
  *batched = a.kv_.batched_steps();
  *shared = b.kv_.shared_victim_picks();
}

TEST(TieredKv, BatchedRecallsEqualOneAtATime) {
  int64_t batched = 0, shared = 0;
  recall_forms_scenario(10, &batched, &shared);
  EXPECT_GT(batched, 30) << "the batched path should carry most steps";
  recall_forms_scenario(26, &batched, &shared);
  EXPECT_GT(shared, 20) << "with the pool full, the shared prefix should answer the selections";
  recall_forms_scenario(26, &batched, &shared, /*all_resident=*/true);
  EXPECT_GT(shared, 20) << "with every victim as new as the recalls, the merge with the inserted slots should answer";
}

// Landing (kv/tier_land.h): before each step slots are reserved, the step's late pages land in
// them in list order (land_late_pages, the CPU statement of the device op, on each layer's lists
// of keys; a page listed twice by one request lands twice), and after_decode_step adopts them.
// Checked every step: each landed page resident in the slot its first landing took, with its host
// copy kept (clean) and every byte in place; its second landing's slot and the unused reserved
// slots free again; the counts (recalled, late, hits); budgets and both tiers' accounting. Stacks
// both shorter and longer than the late pages.
// (batched: every request's budget evictions after the adoption in one selection and one copy,
// set_batch_recalls; the final tables are returned for the twin run's comparison)
void landing_scenario(bool batched, std::vector<PageRef>* final_pages) {
  constexpr int64_t kDev = 70, kHost = 400;
  Scenario s(kDev, kHost, LruParams{kLayers, 4, true});
  s.kv_.set_batch_recalls(batched);
  for (int r = 0; r < 3; ++r) {
    s.reqs_.push_back({std::make_unique<PageTable>(kLayers, kHeads, kPage), s.next_key_++});
    s.kv_.add(*s.reqs_.back().t, 0, /*budget=*/8 + 3 * r);
    ASSERT_TRUE(s.append(s.reqs_.back(), 30 + 6 * r));
  }
  std::mt19937 rng(41);
  std::vector<int32_t> stamps(kDev, 0);
  int64_t landed_total = 0, adopted_total = 0, twice = 0;
  for (int step = 1; step <= 50; ++step) {
    const int64_t now = int64_t{step} * kLayers + kLayers - 1;
    s.now_ = now;
    const int64_t want = step % 5 == 0 ? 0 : static_cast<int64_t>(rng() % 12);
    const std::vector<int32_t> stack = s.kv_.reserve_landing(want, now - kLayers + 1);
    ASSERT_LE(static_cast<int64_t>(stack.size()), want);
    ASSERT_EQ(s.kv_.check_invariants(), "") << "after the reservation, step " << step;
    std::vector<PageTable*> tables;
    for (Req& r : s.reqs_) tables.push_back(r.t.get());
    // The step: per layer, lists of keys over every request (rows request x head); reads at random
    // (and the page each list appends into), request 1 listing one of its host pages twice.
    std::vector<TieredKv::Landed> landed;
    std::vector<TieredKv::LateRead> late;
    std::vector<std::tuple<int, int, int, int64_t, int32_t>> first_landing;  // (seq, layer, head, idx) -> slot
    size_t used = 0;
    for (int l = 0; l < kLayers; ++l) {
      PageLists L;
      L.n_requests = 3;
      L.n_heads_kv = kHeads;
      L.indptr = {0};
      L.seq_len.assign(3, 1);
      for (int r = 0; r < 3; ++r)
        for (int h = 0; h < kHeads; ++h) {
          const PageTable& t = *tables[static_cast<size_t>(r)];
          bool doubled = false;
          for (int64_t i = 0; i < t.n_pages_per_list(); ++i) {
            if (!(i == t.n_pages_per_list() - 1 || rng() % 3 == 0)) continue;
            const PageRef p = t.page(l, h, i);
            const int copies = r == 1 && !doubled && p.tier == Tier::Host ? 2 : 1;
            doubled = doubled || copies == 2;
            twice += copies == 2;
            for (int c = 0; c < copies; ++c) {
              L.slots.push_back(dhs::tier_key(p, kDev));
              L.page_pos.push_back(static_cast<int32_t>(i));
            }
          }
          L.indptr.push_back(static_cast<int32_t>(L.slots.size()));
        }
      const PageLists before = L;
      std::vector<dhs::LandEntry> log;
      dhs::land_late_pages(L, kDev, std::span<const int32_t>(stack).subspan(used), &s.dev_, &s.host_, &log);
      used += log.size();
      for (const dhs::LandEntry& e : log)
        landed.push_back({e.row / kHeads, PageId{l, e.row % kHeads, e.page_pos}, e.dev_slot, e.host_slot});
      for (int row = 0; row < 3 * kHeads; ++row)
        for (int32_t k = L.indptr[static_cast<size_t>(row)]; k < L.indptr[static_cast<size_t>(row) + 1]; ++k) {
          const PageRef p = dhs::tier_of_key(L.slots[static_cast<size_t>(k)], kDev);
          const PageId id{l, row % kHeads, L.page_pos[static_cast<size_t>(k)]};
          if (p.tier == Tier::Device) stamps[static_cast<size_t>(p.slot)] = step;  // (landed ones too: the split stamps them)
          else late.push_back({row / kHeads, id});
          if (before.slots[static_cast<size_t>(k)] >= kDev && p.tier == Tier::Device) {
            bool first = true;
            for (const auto& f : first_landing)
              first = first && !(std::get<0>(f) == row / kHeads && std::get<1>(f) == l && std::get<2>(f) == id.head &&
                                 std::get<3>(f) == id.idx);
            if (first) first_landing.emplace_back(row / kHeads, l, id.head, id.idx, p.slot);
          }
        }
    }
    landed_total += static_cast<int64_t>(landed.size());
    const int64_t free_before = s.dev_.n_free();
    const TierStats before = s.kv_.totals();
    const TierStats st = s.kv_.after_decode_step(stamps, step, late, tables, now, landed);
    EXPECT_EQ(s.kv_.landing_reserved(), 0);
    const int64_t adopted = static_cast<int64_t>(first_landing.size());
    adopted_total += adopted;
    // (a late entry of a page that also landed — listed twice, the stack out between — reads a
    // resident page by the time it is noted: a hit)
    int64_t late_of_landed = 0;
    for (const TieredKv::LateRead& r : late)
      for (const auto& f : first_landing)
        late_of_landed += std::get<0>(f) == r.seq && std::get<1>(f) == r.page.layer && std::get<2>(f) == r.page.head &&
                          std::get<3>(f) == r.page.idx;
    EXPECT_EQ(s.kv_.totals().late - before.late, static_cast<int64_t>(late.size()) - late_of_landed + adopted) << "step " << step;
    EXPECT_GE(st.recalled, adopted);
    (void)free_before;
    // Each landed page: resident in its first landing's slot (unless its budget sent it back
    // already: then in the host slot it came from, which is kept), bytes checked by check().
    for (const auto& [seq, l, h, idx, slot] : first_landing) {
      const PageRef p = tables[static_cast<size_t>(seq)]->page(l, h, idx);
      if (p.tier == Tier::Device) {
        EXPECT_EQ(p.slot, slot) << "step " << step;
      }
    }
    s.check();
    if (step % 4 == 0) {
      for (Req& r : s.reqs_) ASSERT_TRUE(s.append(r, 1));
    }
  }
  EXPECT_GT(adopted_total, 40) << "the scenario should land pages";
  EXPECT_GT(landed_total, adopted_total) << "and land some page twice";
  EXPECT_GT(twice, 0);
  EXPECT_GT(s.kv_.totals().offloaded + s.kv_.totals().dropped, 40) << "and enforce budgets after adopting";
  for (const Req& r : s.reqs_)
    for (int l = 0; l < kLayers; ++l)
      for (int h = 0; h < kHeads; ++h)
        for (int64_t i = 0; i < r.t->n_pages_per_list(); ++i) final_pages->push_back(r.t->page(l, h, i));
}

TEST(TieredKv, LandingsAreAdoptedAsRecallsWithEveryByteKept) {
  std::vector<PageRef> batched, one_by_one;
  landing_scenario(true, &batched);
  landing_scenario(false, &one_by_one);
  ASSERT_EQ(batched.size(), one_by_one.size());
  for (size_t i = 0; i < batched.size(); ++i)
    ASSERT_TRUE(batched[i].tier == one_by_one[i].tier && batched[i].slot == one_by_one[i].slot)
        << "page " << i << ": batched budget evictions differ from one request at a time";
}

// Landed pages adopted on the device first and by the host after the next step (docs/hierarchy.md
// "Landed pages adopted in the step"), as the CUDA runner runs them: a mirror of the tables (the
// device page table: keys, rewritten by the relocate hook's patches, which are applied before each
// step) is what each step's lists come from; the landing rewrites the mirror's entry and moves the
// page's key rows itself (land_late_pages with LandAdopt); after_step_reads claims the slots, and
// after_step_recalls adopts them while the next step "runs" — after that step's lists were taken
// and its reads made, as its copies queue behind the step on the device. Checked every step: every
// page a step lists has its own key row under the mirror's key and is read with its own bytes where
// the landing leaves its key
// (pages landed the step before included, read from their slots before the host adopted them), the
// accounting after each half, and whenever nothing is pending the mirror equals the tables.
// The scenario of LandingsAdoptedOnTheDeviceRunAheadOfTheHost, by the read stamps' scan or with the
// LRU mirrored (an LruMirror as the device's: patched before each step, the step's resident and
// landed reads written into it, counted, copied back); *trace: per step, its hits, late reads,
// recalls and evictions and where every page lives.
void landings_ahead_of_the_host(bool mirrored, std::vector<std::string>* trace) {
  constexpr int64_t kDev = 70, kHost = 400, kMaxPages = 40;
  constexpr int kLists = kLayers * kHeads;
  Scenario s(kDev, kHost, LruParams{kLayers, 4, true});
  constexpr int kReqs = 3;
  for (int r = 0; r < kReqs; ++r) {
    s.reqs_.push_back({std::make_unique<PageTable>(kLayers, kHeads, kPage), s.next_key_++});
    s.kv_.add(*s.reqs_.back().t, 0, /*budget=*/8 + 3 * r);
    ASSERT_TRUE(s.append(s.reqs_.back(), 30 + 6 * r));
  }
  std::vector<PageTable*> tables;
  for (Req& r : s.reqs_) tables.push_back(r.t.get());
  const auto req_of = [&](const PageTable& t) {
    for (int r = 0; r < kReqs; ++r)
      if (tables[static_cast<size_t>(r)] == &t) return r;
    ADD_FAILURE() << "a table the scenario does not hold";
    return 0;
  };
  const auto offset = [](int r, int l, int h, int64_t i) { return ((int64_t{r} * kLists + l * kHeads + h) * kMaxPages) + i; };
  // The mirror and its staged patches (offset, key at the hook's call), applied in order.
  std::vector<int32_t> mirror(static_cast<size_t>(kReqs * kLists * kMaxPages), -1);
  std::vector<std::pair<int64_t, int32_t>> patches;
  s.kv_.set_relocate_hook([&](const PageTable& t, int l, int h, int64_t i) {
    patches.emplace_back(offset(req_of(t), l, h, i), dhs::tier_key(t.page(l, h, i), kDev));
  });
  const auto flush_patches = [&] {
    for (const auto& [off, key] : patches) mirror[static_cast<size_t>(off)] = key;
    patches.clear();
  };
  // Key rows (the sketch's, on the GPU): 4 ints naming the page, kept by key and moved with it.
  constexpr int64_t kRowBytes = 16;
  std::vector<uint8_t> rows(static_cast<size_t>((kDev + kHost) * kRowBytes), 0);
  const auto row_at = [&](int32_t key) { return reinterpret_cast<int32_t*>(rows.data() + int64_t{key} * kRowBytes); };
  s.kv_.set_move_hook([&](PageRef from, PageRef to) {
    std::copy_n(row_at(dhs::tier_key(from, kDev)), 4, row_at(dhs::tier_key(to, kDev)));
  });
  std::vector<int64_t> synced(kReqs, 0);
  const auto sync_new_pages = [&] {  // (DevicePageTable::sync: the pages past those copied)
    for (int r = 0; r < kReqs; ++r) {
      const PageTable& t = *tables[static_cast<size_t>(r)];
      ASSERT_LE(t.n_pages_per_list(), kMaxPages);
      for (int64_t i = synced[static_cast<size_t>(r)]; i < t.n_pages_per_list(); ++i)
        for (int l = 0; l < kLayers; ++l)
          for (int h = 0; h < kHeads; ++h) {
            const int32_t key = dhs::tier_key(t.page(l, h, i), kDev);
            mirror[static_cast<size_t>(offset(r, l, h, i))] = key;
            const int32_t id[4] = {r, l, h, static_cast<int32_t>(i)};
            std::copy_n(id, 4, row_at(key));
          }
      synced[static_cast<size_t>(r)] = t.n_pages_per_list();
    }
  };
  const auto mirror_equals_tables = [&](int step) {
    for (int r = 0; r < kReqs; ++r) {
      const PageTable& t = *tables[static_cast<size_t>(r)];
      for (int l = 0; l < kLayers; ++l)
        for (int h = 0; h < kHeads; ++h)
          for (int64_t i = 0; i < t.n_pages_per_list(); ++i)
            ASSERT_EQ(mirror[static_cast<size_t>(offset(r, l, h, i))], dhs::tier_key(t.page(l, h, i), kDev))
                << "request " << r << " page (" << l << ", " << h << ", " << i << ") at step " << step;
    }
  };
  sync_new_pages();
  std::mt19937 rng(43);
  std::vector<int32_t> stamps(kDev, 0);
  std::vector<int32_t> store(kDev), copy_buf(kDev);
  std::span<int32_t> copy_to(copy_buf);
  LruMirror lru_mirror(kDev);
  if (mirrored) s.kv_.mirror_lru(store);
  std::optional<std::pair<std::vector<TieredKv::LateRead>, int64_t>> kept;  // the last step's late reads, its clock
  int64_t adopted_total = 0, lost = 0, ahead_of_host = 0;
  for (int step = 1; step <= 60; ++step) {
    const int64_t start = int64_t{step} * kLayers, now = start + kLayers - 1;
    s.now_ = now;
    const int64_t want = step % 7 == 0 ? 0 : static_cast<int64_t>(rng() % 14);
    const std::vector<int32_t> stack = s.kv_.reserve_landing(want, start);
    ASSERT_EQ(s.kv_.check_invariants(), "") << "after the reservation, step " << step;
    flush_patches();  // (the launch's upload)
    TieredKv::LruPatch lru_patch;
    if (mirrored) {
      lru_patch = s.kv_.take_lru_patch(now);
      lru_mirror.apply(lru_patch.patch);
    }
    // The step, from the mirror: per layer, each (request, head) lists random pages and the page it
    // appends into; request 1 lists one of its host pages twice.
    std::vector<TieredKv::Landed> landed;
    std::vector<TieredKv::LateRead> late;
    size_t used = 0;
    for (int l = 0; l < kLayers; ++l) {
      PageLists L;
      L.n_requests = kReqs;
      L.n_heads_kv = kHeads;
      L.indptr = {0};
      L.seq_len.assign(kReqs, 1);
      for (int r = 0; r < kReqs; ++r)
        for (int h = 0; h < kHeads; ++h) {
          const PageTable& t = *tables[static_cast<size_t>(r)];
          bool doubled = false;
          for (int64_t i = 0; i < t.n_pages_per_list(); ++i) {
            if (!(i == t.n_pages_per_list() - 1 || rng() % 3 == 0)) continue;
            const int32_t key = mirror[static_cast<size_t>(offset(r, l, h, i))];
            ahead_of_host += key < kDev && t.page(l, h, i).tier == Tier::Host;
            // (the key row where the selection reads it: under the key the mirror gives)
            const int32_t id[4] = {r, l, h, static_cast<int32_t>(i)};
            ASSERT_TRUE(std::equal(id, id + 4, row_at(key))) << "key row of page " << i << " at step " << step;
            const int copies = r == 1 && !doubled && key >= kDev ? 2 : 1;
            doubled = doubled || copies == 2;
            for (int c = 0; c < copies; ++c) {
              L.slots.push_back(key);
              L.page_pos.push_back(static_cast<int32_t>(i));
            }
          }
          L.indptr.push_back(static_cast<int32_t>(L.slots.size()));
        }
      dhs::LandAdopt adopt;
      adopt.table = mirror;
      const std::vector<int32_t> req_slot = {0, 1, 2};
      adopt.req_slot = req_slot;
      adopt.n_lists = kLists;
      adopt.max_pages = kMaxPages;
      adopt.n_heads_kv = kHeads;
      adopt.layer = l;
      adopt.rows = {{rows.data(), kRowBytes}};
      std::vector<dhs::LandEntry> log;
      dhs::land_late_pages(L, kDev, std::span<const int32_t>(stack).subspan(used), &s.dev_, &s.host_, &log, &adopt);
      used += log.size();
      for (const dhs::LandEntry& e : log) {
        landed.push_back({e.row / kHeads, PageId{l, e.row % kHeads, e.page_pos}, e.dev_slot, e.host_slot, e.adopted});
        lost += !e.adopted;
      }
      // The reads: each entry's bytes (its tokens) and key row where its key says.
      for (int row = 0; row < kReqs * kHeads; ++row) {
        const int r = row / kHeads, h = row % kHeads;
        const Req& q = s.reqs_[static_cast<size_t>(r)];
        for (int32_t k = L.indptr[static_cast<size_t>(row)]; k < L.indptr[static_cast<size_t>(row) + 1]; ++k) {
          const int32_t key = L.slots[static_cast<size_t>(k)];
          const int64_t i = L.page_pos[static_cast<size_t>(k)];
          const PageRef p = dhs::tier_of_key(key, kDev);
          for (int64_t pos = i * kPage; pos < std::min<int64_t>((i + 1) * kPage, q.t->n_tokens()); ++pos)
            for (int e = 0; e < kDim; ++e)
              ASSERT_EQ(s.pool(p.tier).k_page(p)[(pos - i * kPage) * kDim + e], value(q.key, l, h, pos, e))
                  << "request " << r << " page (" << l << ", " << h << ", " << i << ") in " << dhs::tier_name(p.tier)
                  << " slot " << p.slot << " at step " << step;
          if (p.tier == Tier::Device) {
            stamps[static_cast<size_t>(p.slot)] = step;
            lru_mirror.read(p.slot);
          } else {
            late.push_back({r, PageId{l, h, i}});
          }
        }
      }
    }
    // The last step's recalls while this one runs (its copies behind this step's reads), on the
    // running step's clock; then this step's reads.
    if (kept) s.kv_.after_step_recalls(kept->first, std::max(kept->second, start), /*in_flight=*/true);
    ASSERT_EQ(s.kv_.check_invariants(), "") << "after the recalls in flight, step " << step;
    const TierStats reads = [&] {
      if (!mirrored) return s.kv_.after_step_reads(stamps, step, tables, now, landed);
      std::copy(lru_mirror.use().begin(), lru_mirror.use().end(), copy_to.begin());
      return s.kv_.after_step_reads(copy_to, lru_mirror.counts(lru_patch.n_owners), tables, now, landed, &copy_to);
    }();
    if (trace) {
      std::string t = "step " + std::to_string(step) + ": hits " + std::to_string(reads.hits);
      const TierStats& to = s.kv_.totals();
      t += ", totals " + std::to_string(to.hits) + " " + std::to_string(to.late) + " " + std::to_string(to.recalled) + " " +
           std::to_string(to.offloaded) + " " + std::to_string(to.dropped) + ";";
      for (const PageTable* tb : tables)
        for (int l = 0; l < kLayers; ++l)
          for (int h = 0; h < kHeads; ++h)
            for (int64_t i = 0; i < tb->n_pages_per_list(); ++i) t += " " + std::to_string(dhs::tier_key(tb->page(l, h, i), kDev));
      trace->push_back(std::move(t));
    }
    ASSERT_EQ(s.kv_.check_invariants(), "") << "after the reads, step " << step;
    EXPECT_EQ(s.kv_.landing_claimed(), static_cast<int64_t>(landed.size()));
    for (const TieredKv::Landed& l : landed) adopted_total += l.adopted;
    kept.emplace(std::move(late), now);
    if (step % 4 == 0) {  // the scheduler's turn: what is pending first (flush), then appends
      s.kv_.after_step_recalls(kept->first, kept->second);
      kept.reset();
      flush_patches();
      mirror_equals_tables(step);
      s.check();
      for (Req& r : s.reqs_) ASSERT_TRUE(s.append(r, 1));
      flush_patches();
      sync_new_pages();
    }
  }
  if (kept) s.kv_.after_step_recalls(kept->first, kept->second);
  flush_patches();
  mirror_equals_tables(61);
  s.check();
  EXPECT_GT(adopted_total, 40) << "the scenario should land pages";
  EXPECT_GT(lost, 0) << "and land a page twice (one landing takes it)";
  EXPECT_GT(ahead_of_host, 0) << "and read landed pages from the mirror before the host adopted them";
  EXPECT_GT(s.kv_.totals().offloaded + s.kv_.totals().dropped, 40) << "and move pages out for budgets";
}

TEST(TieredKv, LandingsAdoptedOnTheDeviceRunAheadOfTheHost) { landings_ahead_of_the_host(false, nullptr); }

// The same with the LRU mirrored: every step's hits, counts and every page's place equal the scan's.
TEST(TieredKv, MirroredLruEqualsTheStampsScanWithLandings) {
  std::vector<std::string> scan, mirror;
  landings_ahead_of_the_host(false, &scan);
  landings_ahead_of_the_host(true, &mirror);
  ASSERT_EQ(scan.size(), mirror.size());
  for (size_t i = 0; i < scan.size(); ++i) ASSERT_EQ(scan[i], mirror[i]);
}

// evict_slots (the hierarchy bench's churn replay): the listed slots holding full, unpinned pages
// leave — copied when they have no host copy, dropped when they do — and the rest (a pinned
// page, an appending page, a free slot, a repeat) are skipped.
// Landing slots under a full pool: reserve_landing frees least recently used pages for them, but
// none the last cycle of the clock read (the next step would find it late, land it and ask for
// more); the slots it returns are the free ones and the cold pages' only.
TEST(TieredKv, LandingReservationsSpareThePagesTheLastStepRead) {
  constexpr int64_t kDev = 36;
  Scenario s(kDev, 256, LruParams{kLayers, 4, true});
  s.reqs_.push_back({std::make_unique<PageTable>(kLayers, kHeads, kPage), s.next_key_++});
  Req& r = s.reqs_.back();
  s.kv_.add(*r.t, 0);
  ASSERT_TRUE(s.append(r, 30));  // 8 pages per list, 32 resident; 4 free
  ASSERT_EQ(s.kv_.resident_pages(*r.t), 32);
  // Step 10 (clock 20..21) reads every page but pages 1 and 4 of each list, which nothing read
  // since the appends at clock 0.
  std::vector<PageId> hot;
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < kHeads; ++h)
      for (int64_t i = 0; i < 8; ++i)
        if (i != 1 && i != 4) hot.push_back({l, h, i});
  s.now_ = 21;
  s.kv_.note_reads(*r.t, hot, s.now_);
  // The next step asks for 20 slots at clock 22: 4 free and the 8 cold pages' slots.
  const std::vector<int32_t> got = s.kv_.reserve_landing(20, 22);
  EXPECT_EQ(got.size(), 4u + 8u);
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < kHeads; ++h)
      for (int64_t i = 0; i < 8; ++i)
        EXPECT_EQ(r.t->page(l, h, i).tier, i == 1 || i == 4 ? Tier::Host : Tier::Device)
            << "page " << i << " of (" << l << ", " << h << ")";
  // A cycle later (no step read anything since clock 21) every full page may make room.
  const std::vector<int32_t> later = s.kv_.reserve_landing(40, 24);
  EXPECT_EQ(later.size(), 4u + 8u + 20u);  // (the page each list appends into stays: 5 of its 6 hot pages go)
  s.kv_.reserve_landing(0, 24);            // (the reservations given back)
  s.check();
}

TEST(TieredKv, EvictSlotsTakesOnlyFullUnpinnedPages) {
  Scenario s(64, 256, {.bucket_steps = 1, .n_buckets = 8});
  s.reqs_.push_back({std::make_unique<PageTable>(kLayers, kHeads, kPage), s.next_key_++});
  Req& r = s.reqs_.back();
  s.kv_.add(*r.t, 0);
  ASSERT_TRUE(s.append(r, 30));  // 7 full pages and one of 2 tokens per list, all resident
  ASSERT_EQ(s.kv_.resident_pages(*r.t), 32);
  const auto slot = [&](int l, int h, int64_t i) { return r.t->page(l, h, i).slot; };
  // B: to the host tier and back, so it keeps a clean host copy.
  const int32_t b_before = slot(1, 0, 2);
  EXPECT_EQ(s.kv_.evict_slots(std::vector<int32_t>{b_before}).offloaded, 1);
  ASSERT_EQ(r.t->page(1, 0, 2).tier, Tier::Host);
  const PageId b_id{1, 0, 2};
  s.now_ = 1;
  ASSERT_EQ(s.kv_.recall_ahead(*r.t, std::span<const PageId>(&b_id, 1), s.now_).recalled, 1);
  const int32_t a = slot(0, 0, 1), b = slot(1, 0, 2), appending = slot(0, 1, 7);
  // C: pinned by a step that reads it.
  const PageId c_id{1, 1, 4};
  s.kv_.ensure_resident(*r.t, std::span<const PageId>(&c_id, 1), s.now_);
  const int32_t c = slot(1, 1, 4);
  int32_t free_slot = -1;
  for (int32_t x = 0; x < 64 && free_slot < 0; ++x)
    if (!s.kv_.lru().resident(x)) free_slot = x;
  ASSERT_GE(free_slot, 0);
  const TierStats st = s.kv_.evict_slots(std::vector<int32_t>{a, a, c, appending, free_slot, b, -3, 64});
  EXPECT_EQ(st.offloaded, 1) << "A had no host copy";
  EXPECT_EQ(st.dropped, 1) << "B kept its clean copy";
  EXPECT_EQ(r.t->page(0, 0, 1).tier, Tier::Host);
  EXPECT_EQ(r.t->page(1, 0, 2).tier, Tier::Host);
  EXPECT_EQ(r.t->page(1, 1, 4).tier, Tier::Device) << "a pinned page left";
  EXPECT_EQ(r.t->page(0, 1, 7).tier, Tier::Device) << "an appending page left";
  EXPECT_EQ(s.kv_.resident_pages(*r.t), 30);
  s.kv_.end_step(s.now_);
  s.check();
  s.kv_.release(*r.t);
  EXPECT_EQ(s.dev_.n_used() + s.host_.n_used(), 0);
}

// The cache manager's budgets for a batch at once (TieredKv::set_budgets: one selection, one
// eviction) against set_budget on each request in turn: the same tables, pools and counts after
// every round, with budgets going down and up at random, the LRU's order shuffled by reads between
// rounds, and a host tier small enough that its room sometimes binds (then one at a time).
TEST(TieredKv, SetBudgetsEqualsEachInTurn) {
  constexpr int64_t kDev = 120, kHost = 150;
  const LruParams lru{kLayers, 4, true};
  Scenario a(kDev, kHost, lru), b(kDev, kHost, lru);
  for (Scenario* s : {&a, &b})
    for (int r = 0; r < 3; ++r) {
      s->reqs_.push_back({std::make_unique<PageTable>(kLayers, kHeads, kPage), s->next_key_++});
      s->kv_.add(*s->reqs_.back().t, 0);
      ASSERT_TRUE(s->append(s->reqs_.back(), 36 + 4 * r));
    }
  std::mt19937 rng(23);
  int64_t evicted = 0;
  for (int round = 1; round <= 40; ++round) {
    const int64_t now = int64_t{round} * kLayers;
    a.now_ = b.now_ = now;
    std::vector<int64_t> budgets;
    for (int r = 0; r < 3; ++r) budgets.push_back(4 + static_cast<int64_t>(rng() % 36));
    std::vector<std::vector<PageId>> reads(3);
    for (int r = 0; r < 3; ++r)
      for (int l = 0; l < kLayers; ++l)
        for (int h = 0; h < kHeads; ++h)
          for (int64_t i = 0; i < a.reqs_[static_cast<size_t>(r)].t->n_pages_per_list(); ++i)
            if (rng() % 4 == 0) reads[static_cast<size_t>(r)].push_back({l, h, i});
    for (Scenario* s : {&a, &b}) {
      for (int r = 0; r < 3; ++r) s->kv_.note_reads(*s->reqs_[static_cast<size_t>(r)].t, reads[static_cast<size_t>(r)], now);
      std::vector<PageTable*> tables;
      for (Req& r : s->reqs_) tables.push_back(r.t.get());
      if (s == &a) {
        a.kv_.set_budgets(tables, budgets, now + 1);
      } else {
        for (size_t r = 0; r < 3; ++r) b.kv_.set_budget(*tables[r], budgets[r], now + 1);
      }
    }
    for (int r = 0; r < 3; ++r) {
      const PageTable &ta = *a.reqs_[static_cast<size_t>(r)].t, &tb = *b.reqs_[static_cast<size_t>(r)].t;
      for (int l = 0; l < kLayers; ++l)
        for (int h = 0; h < kHeads; ++h)
          for (int64_t i = 0; i < ta.n_pages_per_list(); ++i) {
            const PageRef pa = ta.page(l, h, i), pb = tb.page(l, h, i);
            ASSERT_TRUE(pa.tier == pb.tier && pa.slot == pb.slot) << "round " << round << " request " << r << " page " << i;
          }
      ASSERT_EQ(a.kv_.resident_pages(ta), b.kv_.resident_pages(tb));
      ASSERT_LE(a.kv_.movable_resident_pages(ta), budgets[static_cast<size_t>(r)]);
    }
    ASSERT_EQ(a.kv_.totals().offloaded, b.kv_.totals().offloaded);
    ASSERT_EQ(a.kv_.totals().dropped, b.kv_.totals().dropped);
    ASSERT_EQ(a.host_.n_free(), b.host_.n_free());
    a.check();
    b.check();
    evicted = a.kv_.totals().offloaded + a.kv_.totals().dropped;
    // (recalls between rounds: pages come back, so budgets have something to evict again)
    for (Scenario* s : {&a, &b})
      for (int r = 0; r < 3; ++r) {
        s->kv_.set_budget(*s->reqs_[static_cast<size_t>(r)].t, TieredKv::kUnlimited, now + 2);
        s->kv_.recall_ahead(*s->reqs_[static_cast<size_t>(r)].t, reads[static_cast<size_t>(r)], now + 2);
      }
  }
  EXPECT_GT(evicted, 200);
}

// A large eviction releases its slots on the thread pool (TieredKv::evict from
// kParallelEvict slots): the same tables, pools, LRU, host copies, hook calls and moves as the
// serial loop, here with three requests' pages interleaved in the LRU's order and half of them
// holding clean host copies (dropped, not copied). Storage-less pools: ~49k pages.
TEST(TieredKv, ParallelEvictionEqualsTheSerialOne) {
  constexpr int L = 2, H = 2, P = 16;
  constexpr int64_t kTokens = 4096 * P;  // 4,096 pages per list: 16,384 per request
  struct Twin {
    PagePool dev{Tier::Device, 3 * 4 * 4097 + 64, P, 8, false};
    PagePool host{Tier::Host, 3 * 4 * 4097 + 64, P, 8, false};
    TieredKv kv{dev, host, LruParams{.bucket_steps = 4, .n_buckets = 16}};
    std::vector<std::unique_ptr<PageTable>> ts;
    std::vector<std::tuple<uint64_t, int, int, int64_t, int>> hooked;  // (request, layer, head, page, tier)
    std::vector<PageMove> moved;
  };
  const auto run = [&](Twin& w, int64_t parallel_from) {
    w.kv.set_parallel_evict_from(parallel_from);
    w.kv.set_mover([&w](const PagePool&, PagePool&, std::span<const PageMove> m) {
      w.moved.insert(w.moved.end(), m.begin(), m.end());
      return static_cast<int64_t>(m.size());
    });
    for (int r = 0; r < 3; ++r) {
      w.ts.push_back(std::make_unique<PageTable>(L, H, P));
      PageTable& t = *w.ts.back();
      EXPECT_TRUE(t.reserve(w.dev, kTokens));
      t.commit(kTokens);
      w.kv.add(t, 0);
      w.kv.track_new_pages(t, 0);
    }
    // Every other page of each request to the host and back (a clean copy), then reads that give
    // the pages last uses interleaved across requests (page i of every list read at step i % 40).
    for (int r = 0; r < 3; ++r) {
      std::vector<int32_t> half;
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h)
          for (int64_t i = 0; i < 4096; i += 2) half.push_back(w.ts[static_cast<size_t>(r)]->page(l, h, i).slot);
      w.kv.evict_slots(half);
      std::vector<PageId> back;
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h)
          for (int64_t i = 0; i < 4096; i += 2) back.push_back({l, h, i});
      w.kv.recall_ahead(*w.ts[static_cast<size_t>(r)], back, 1);
    }
    for (int64_t step = 2; step < 42; ++step)
      for (int r = 0; r < 3; ++r) {
        std::vector<PageId> read;
        for (int l = 0; l < L; ++l)
          for (int h = 0; h < H; ++h)
            for (int64_t i = (step + r) % 40; i < 4096; i += 40) read.push_back({l, h, i});
        w.kv.note_reads(*w.ts[static_cast<size_t>(r)], read, step);
      }
    w.moved.clear();
    w.kv.set_relocate_hook([&w](const PageTable& t, int l, int h, int64_t i) {
      uint64_t r = 0;
      while (w.ts[r]->id() != t.id()) ++r;  // (the request's index: table ids differ between the twins)
      w.hooked.emplace_back(r, l, h, i, static_cast<int>(t.page(l, h, i).tier));
    });
    // Budgets of 9,000 pages: ~7,380 evicted per request (one at a time: offload), then all three
    // down to 2,000 at once (the batched form: one eviction of 21,000 slots).
    for (int r = 0; r < 3; ++r) w.kv.set_budget(*w.ts[static_cast<size_t>(r)], 9000, 43);
    std::vector<PageTable*> all;
    for (auto& t : w.ts) {
      w.kv.set_budget(*t, 2000, 44);
      all.push_back(t.get());
    }
    EXPECT_EQ(w.kv.check_invariants(), "");
  };
  Twin serial, parallel;
  run(serial, INT64_MAX);
  run(parallel, 1);
  ASSERT_GT(serial.hooked.size(), 40000u);
  EXPECT_EQ(serial.hooked, parallel.hooked);
  ASSERT_EQ(serial.moved.size(), parallel.moved.size());
  for (size_t k = 0; k < serial.moved.size(); ++k) {
    EXPECT_EQ(serial.moved[k].src.slot, parallel.moved[k].src.slot);
    EXPECT_EQ(serial.moved[k].dst.slot, parallel.moved[k].dst.slot);
  }
  for (int r = 0; r < 3; ++r) {
    const PageTable &a = *serial.ts[static_cast<size_t>(r)], &b = *parallel.ts[static_cast<size_t>(r)];
    EXPECT_EQ(serial.kv.resident_pages(a), 2000) << "request " << r;
    EXPECT_EQ(parallel.kv.resident_pages(b), serial.kv.resident_pages(a));
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h)
        for (int64_t i = 0; i < a.n_pages_per_list(); ++i) {
          const PageRef pa = a.page(l, h, i), pb = b.page(l, h, i);
          ASSERT_TRUE(pa.tier == pb.tier && pa.slot == pb.slot) << "request " << r << " page (" << l << ", " << h << ", " << i << ")";
        }
  }
  // The pools' free lists in the same order: the next allocations take the same slots.
  std::vector<PageRef> na, nb;
  ASSERT_TRUE(serial.dev.allocate(serial.dev.n_free(), &na));
  ASSERT_TRUE(parallel.dev.allocate(parallel.dev.n_free(), &nb));
  ASSERT_EQ(na.size(), nb.size());
  for (size_t k = 0; k < na.size(); ++k) ASSERT_EQ(na[k].slot, nb[k].slot);
  for (const PageRef& p : na) serial.dev.free(p);
  for (const PageRef& p : nb) parallel.dev.free(p);
}

// The bytes move through the mover the backend gives (the CUDA backend's copies): every
// recall and offload goes through it, in the direction its pools say, and nothing else copies;
// every tier change is reported to the relocation hook (the CUDA backend's table mirror).
TEST(TieredKv, PagesMoveThroughTheGivenMover) {
  Scenario s(64, 256, {.bucket_steps = 1, .n_buckets = 8});
  int64_t to_host = 0, to_device = 0;
  s.kv_.set_mover([&](const PagePool& src, PagePool& dst, std::span<const PageMove> moves) {
    for (const PageMove& m : moves) {
      EXPECT_EQ(m.src.tier, src.tier());
      EXPECT_EQ(m.dst.tier, dst.tier());
    }
    (src.tier() == Tier::Device ? to_host : to_device) += static_cast<int64_t>(moves.size());
    return copy_pages(src, dst, moves);
  });
  int64_t relocated = 0;
  s.kv_.set_relocate_hook([&](const PageTable& t, int layer, int head, int64_t idx) {
    ++relocated;
    const PageRef p = t.page(layer, head, idx);
    EXPECT_TRUE(p.tier == Tier::Device ? s.dev_.is_used(p) : s.host_.is_used(p)) << "the table names its new place";
  });
  s.reqs_.push_back({std::make_unique<PageTable>(kLayers, kHeads, kPage), s.next_key_++});
  Req& r = s.reqs_.back();
  s.kv_.add(*r.t, 0, /*budget=*/8);
  ASSERT_TRUE(s.append(r, 32));
  std::vector<PageId> want;
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < kHeads; ++h) want.push_back({l, h, 7});
  s.kv_.ensure_resident(*r.t, want, 1);
  s.kv_.end_step(1);
  s.check();
  const TierStats& t = s.kv_.totals();
  EXPECT_EQ(to_host, t.offloaded);
  EXPECT_EQ(to_device, t.recalled);
  EXPECT_EQ(relocated, t.recalled + t.offloaded + t.dropped) << "every tier change reported once";
  EXPECT_GT(to_host, 0);
  EXPECT_GT(to_device, 0);
  s.kv_.release(*r.t);
}

TEST(TieredKv, RandomScenariosKeepEveryPageAndEveryByte) {
  std::mt19937 rng(23);
  int64_t moves = 0, swaps = 0;
  for (int round = 0; moves < 1'000'000; ++round) {
    ASSERT_LT(round, 2000) << "too few page moves per round (" << moves << " so far)";
    // (one round in four with a small host tier: refusals, partial offloads, deferred recalls)
    Scenario s(48 + 16 * (round % 3), round % 4 == 0 ? 70 : 600, {.bucket_steps = 1 + round % 3, .n_buckets = 2 + round % 7});
    for (int it = 0; it < 3000; ++it) {
      const int op = static_cast<int>(rng() % 10);
      if (op == 0 && s.reqs_.size() < 4) {  // a new request
        s.reqs_.push_back({std::make_unique<PageTable>(kLayers, kHeads, kPage), s.next_key_++});
        s.kv_.add(*s.reqs_.back().t, s.now_, 6 + static_cast<int64_t>(rng() % 10));
      } else if (s.reqs_.empty()) {
        continue;
      } else {
        Req& r = s.reqs_[rng() % s.reqs_.size()];
        if (r.swapped) {  // back in first (or, now and then, finished while swapped)
          if (rng() % 8 == 0) {
            s.kv_.release(*r.t);
            std::swap(r, s.reqs_.back());
            s.reqs_.pop_back();
          } else if (s.kv_.swap_in(*r.t, s.now_)) {
            r.swapped = false;
            for (int l = 0; l < kLayers; ++l)
              for (int h = 0; h < kHeads; ++h)
                if (r.t->n_tokens() % kPage != 0) {
                  ASSERT_EQ(r.t->page(l, h, r.t->n_tokens() / kPage).tier, Tier::Device) << "appending page not back";
                }
          }
        } else if (op == 5 && rng() % 4 == 0) {  // preempted by swap
          r.swapped = s.kv_.swap_out(*r.t, s.now_);
          if (r.swapped) {
            ASSERT_EQ(s.kv_.resident_pages(*r.t), 0);
            ++swaps;
          }
        } else if (op == 6 && rng() % 4 == 0) {  // room for an admission
          s.kv_.make_room(static_cast<int64_t>(rng() % 12), s.now_);
        } else if (op <= 3) {  // append 1-6 tokens, within the host tier's room
          if (r.t->n_tokens() < 120) s.append(r, 1 + static_cast<int64_t>(rng() % 6));
        } else if (op <= 6 && r.t->n_pages_per_list() > 0) {  // a step reads 1-6 random pages
          std::vector<PageId> want;
          const int n = 1 + static_cast<int>(rng() % 6);
          for (int k = 0; k < n; ++k)
            want.push_back({static_cast<int>(rng() % kLayers), static_cast<int>(rng() % kHeads),
                            static_cast<int64_t>(rng() % static_cast<uint64_t>(r.t->n_pages_per_list()))});
          if (rng() % 2 == 0) {  // the recall-ahead schedule: read in place, then recall for the next step
            const TierStats st = s.kv_.note_reads(*r.t, want, s.now_);
            ASSERT_EQ(st.hits + st.late, static_cast<int64_t>(want.size()));
            s.kv_.recall_ahead(*r.t, want, s.now_);
          } else {
            try {
              s.kv_.ensure_resident(*r.t, want, s.now_);
            } catch (const Error&) {  // more than the budget or the pool at once: refused whole
            }
          }
          s.kv_.end_step(s.now_);
          s.now_ += static_cast<int64_t>(rng() % 3);
        } else if (op == 7) {
          s.kv_.set_budget(*r.t, 4 + static_cast<int64_t>(rng() % 12), s.now_);
        } else if (op == 8 && r.t->n_tokens() > 0) {  // rollback of 1-5 tokens
          s.kv_.truncate(*r.t, std::max<int64_t>(0, r.t->n_tokens() - 1 - static_cast<int64_t>(rng() % 5)), s.now_);
          s.kv_.end_step(s.now_);
        } else if (op == 9) {  // finished
          s.kv_.release(*r.t);
          std::swap(r, s.reqs_.back());
          s.reqs_.pop_back();
        }
      }
      // The engine ends every layer with end_step (unpins; budgets kept as far as the host tier
      // has room, which a release or rollback elsewhere may have just made).
      s.kv_.end_step(s.now_);
      s.check(round < 5 || it % 25 == 0);  // every byte after every operation in the first rounds
      if (::testing::Test::HasFatalFailure()) return;
    }
    for (Req& r : s.reqs_) s.kv_.release(*r.t);
    s.reqs_.clear();
    ASSERT_EQ(s.dev_.n_used(), 0);
    ASSERT_EQ(s.host_.n_used(), 0);
    const TierStats& t = s.kv_.totals();
    moves += t.recalled + t.offloaded + t.dropped;
  }
  std::printf("%lld page moves (recalls, offloads, drops), %lld swaps; invariants after every operation, bytes after every one of the first 5 rounds, then every 25th\n",
              static_cast<long long>(moves), static_cast<long long>(swaps));
  EXPECT_GT(swaps, 100);
}

}  // namespace
}  // namespace dhs
