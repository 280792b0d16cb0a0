// Landing on the device (backend/cuda/tier_land.h) against its CPU statement (kv/tier_land.h):
// lists whose keys name either tier (rows of 0 to 900 entries, 1 to 300 rows, pages named twice
// among them), a host tier of random f16 pages in mapped pinned DRAM, a landing stack of free
// device slots. Exact checks (a copy rounds nothing):
//  - a stack that holds every late entry: every late key rewritten to a slot of the stack, each
//    slot taken once, the slot's K and V bit-equal to the host page's, the log naming exactly the
//    CPU statement's landings as a multiset of (row, layer, page_pos, host slot) — the slots differ
//    only by the claims' order — and every resident key, every other device slot untouched;
//  - a short stack (and none): exactly its size lands, the counter still counts every late entry,
//    the rest keep their host keys;
//  - two layers on one counter: the second layer's claims follow the first's;
//  - keys past the host tier: skipped and counted, nothing written;
//  - adoption where the page lands (a page table and key rows): the entries and rows the CPU
//    statement writes, except which landing of a page listed twice takes it (the first to swap).
// Page shapes 16 x 128 and 16 x 64 (the engine's), and 3 x 40 (15 words a page: a lane's last
// words partly past the page).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_page_pool.h"
#include "backend/cuda/page_recall.h"
#include "backend/cuda/tier_land.h"
#include "device_vectors.h"
#include "gtest_shim.h"
#include "kv/page_lists.h"
#include "kv/tier_land.h"
#include "kv/tier_split.h"

namespace {

namespace dc = dhs::cuda;
using dhs::LandEntry;
using dhs::PageLists;
using dhs::PageRef;
using dhs::Tier;
using dhs::test::to_device;
using dhs::test::to_host;

bool have_gpu() { return dc::device_count() > 0; }

constexpr int64_t kDev = 3000, kHost = 4000;

PageLists random_lists(int n_rows, int max_len, std::mt19937& rng) {
  PageLists L;
  L.n_requests = n_rows;
  L.n_heads_kv = 1;
  L.seq_len.assign(static_cast<size_t>(n_rows), 1);
  L.indptr = {0};
  for (int r = 0; r < n_rows; ++r) {
    const int kind = static_cast<int>(rng() % 6);
    const int len = kind == 0 ? 0 : static_cast<int>(rng() % static_cast<unsigned>(max_len + 1));
    const double p_late = kind == 1 ? 0.0 : kind == 2 ? 1.0 : (rng() % 1000) / 1000.0;
    for (int i = 0; i < len; ++i) {
      const bool late = (rng() % 1000) / 1000.0 < p_late;
      // Device keys below 1000: the stack's slots (1000 and up) are free.
      const int32_t slot = late ? static_cast<int32_t>(rng() % kHost) : static_cast<int32_t>(rng() % 1000);
      L.slots.push_back(dhs::tier_key({late ? Tier::Host : Tier::Device, slot}, kDev));
      L.page_pos.push_back(static_cast<int32_t>(rng() % 100000));
    }
    L.indptr.push_back(static_cast<int32_t>(L.slots.size()));
  }
  return L;
}

int64_t late_entries(const PageLists& L) {
  return std::count_if(L.slots.begin(), L.slots.end(), [](int32_t k) { return k >= kDev; });
}

struct Pools {
  dc::HostPagePool host;
  dc::DevicePagePool dev;
  int page_words;
  Pools(int page_size, int head_dim, std::mt19937& rng)
      : host(kHost, page_size, head_dim), dev(kDev, page_size, head_dim), page_words(page_size * head_dim / 8) {
    const size_t n = static_cast<size_t>(kHost) * host.page_elems();
    auto* hk = reinterpret_cast<uint16_t*>(host.k_h());
    auto* hv = reinterpret_cast<uint16_t*>(host.v_h());
    for (size_t i = 0; i < n; ++i) {
      hk[i] = static_cast<uint16_t>(rng());
      hv[i] = static_cast<uint16_t>(rng());
    }
    // A sentinel in every device page (0xBEEF): a slot no landing names keeps it.
    const size_t nd = static_cast<size_t>(kDev) * dev.page_elems();
    std::vector<uint16_t> s(nd, 0xBEEF);
    DHS_CUDA_CHECK(cudaMemcpy(dev.k_d(), s.data(), nd * 2, cudaMemcpyHostToDevice));
    DHS_CUDA_CHECK(cudaMemcpy(dev.v_d(), s.data(), nd * 2, cudaMemcpyHostToDevice));
  }
};

// One call's parameters over the pools: lists in (keys) and out, the stack, the counters
// ([claims, bad, available]) and the log.
dc::LandLateParams params(Pools& P, const int32_t* indptr_d, const int32_t* slots_d, int32_t* out_d, const int32_t* pos_d,
                          int n_rows, const int32_t* stack_d, int cap, int32_t* counter_d, int32_t* log_d, int layer) {
  dc::LandLateParams p;
  p.indptr = indptr_d;
  p.slots = slots_d;
  p.slots_out = out_d;
  p.page_pos = pos_d;
  p.n_rows = n_rows;
  p.n_device = static_cast<int32_t>(kDev);
  p.n_host = kHost;
  p.land_slots = stack_d;
  p.land_n = counter_d;
  p.n_bad = counter_d + 1;
  p.land_cap = cap;
  p.log = log_d;
  p.layer = layer;
  p.host_k = P.host.k_d();
  p.host_v = P.host.v_d();
  p.dev_k = P.dev.k_d();
  p.dev_v = P.dev.v_d();
  p.page_words = P.page_words;
  return p;
}

struct Landed {
  std::vector<int32_t> slots;  // the keys after
  int32_t claims = 0;
  int32_t bad = 0;
  std::vector<LandEntry> log;  // as logged, the layer apart
  std::vector<int32_t> log_layer;
};

// Lands `in` (one layer) on the device with `stack`, the counter starting at `n0`.
Landed land_on_device(const PageLists& in, Pools& P, const std::vector<int32_t>& stack, int layer, int32_t n0 = 0,
                   int32_t* counter_d = nullptr, int32_t* log_d = nullptr, int log_cap = -1) {
  int32_t* indptr_d = to_device(in.indptr);
  int32_t* slots_d = to_device(in.slots);
  int32_t* pos_d = to_device(in.page_pos);
  int32_t* stack_d = to_device(stack);
  const int cap = log_cap >= 0 ? log_cap : static_cast<int>(stack.size());
  const bool own_counter = counter_d == nullptr, own_log = log_d == nullptr;
  if (own_counter) {
    DHS_CUDA_CHECK(cudaMalloc(&counter_d, 8));
    const int32_t init[2] = {n0, 0};
    DHS_CUDA_CHECK(cudaMemcpy(counter_d, init, 8, cudaMemcpyHostToDevice));
  }
  if (own_log) DHS_CUDA_CHECK(cudaMalloc(&log_d, static_cast<size_t>(std::max(1, 6 * cap)) * 4));
  const dc::LandLateParams p = params(P, indptr_d, slots_d, slots_d /* (in place) */, pos_d, in.n_requests * in.n_heads_kv,
                                     stack_d, cap, counter_d, log_d, layer);
  dc::land_late_pages(p, nullptr);
  DHS_CUDA_CHECK(cudaDeviceSynchronize());
  Landed r;
  r.slots = to_host(slots_d, in.slots.size());
  const auto c = to_host(counter_d, 2);
  r.claims = c[0];
  r.bad = c[1];
  const int logged = std::min(r.claims, cap);
  const auto lg = to_host(log_d, static_cast<size_t>(6 * std::max(logged, 0)));
  for (int i = n0; i < logged; ++i) {
    r.log.push_back({lg[6 * i], lg[6 * i + 2], lg[6 * i + 3], lg[6 * i + 4], lg[6 * i + 5] != 0});
    r.log_layer.push_back(lg[6 * i + 1]);
  }
  for (void* q : {static_cast<void*>(indptr_d), static_cast<void*>(slots_d), static_cast<void*>(pos_d), static_cast<void*>(stack_d)})
    cudaFree(q);
  if (own_counter) cudaFree(counter_d);
  if (own_log) cudaFree(log_d);
  return r;
}

std::vector<uint16_t> dev_page(const dc::DevicePagePool& dev, bool v, int32_t slot) {
  return to_host(reinterpret_cast<const uint16_t*>(v ? dev.v_d() : dev.k_d()) + static_cast<size_t>(slot) * dev.page_elems(),
                 dev.page_elems());
}
bool host_page_equals(const dc::HostPagePool& host, bool v, int32_t slot, const std::vector<uint16_t>& got) {
  const auto* h = reinterpret_cast<const uint16_t*>(v ? host.v_h() : host.k_h()) + static_cast<size_t>(slot) * host.page_elems();
  return std::memcmp(h, got.data(), got.size() * 2) == 0;
}

auto key_of(const LandEntry& e) { return std::make_tuple(e.row, e.page_pos, e.host_slot); }

// The free stack: slots 1000.. (no list names them), shuffled.
std::vector<int32_t> free_stack(int64_t n, std::mt19937& rng) {
  std::vector<int32_t> s(static_cast<size_t>(kDev - 1000));
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<int32_t>(1000 + i);
  std::shuffle(s.begin(), s.end(), rng);
  s.resize(static_cast<size_t>(std::min<int64_t>(n, static_cast<int64_t>(s.size()))));
  return s;
}

TEST(TierLand, AStackForEveryLatePageEqualsTheCpuStatement) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(17);
  for (const auto& [ps, d] : std::vector<std::pair<int, int>>{{16, 128}, {16, 64}, {3, 40}}) {
    Pools P(ps, d, rng);
    for (const auto& [n_rows, max_len] : std::vector<std::pair<int, int>>{{1, 0}, {1, 900}, {37, 40}, {300, 6}}) {
      const PageLists in = random_lists(n_rows, max_len, rng);
      const int64_t late = late_entries(in);
      if (late > kDev - 1000) continue;
      const std::vector<int32_t> stack = free_stack(late + 5, rng);  // (5 to spare)
      PageLists cpu = in;
      std::vector<LandEntry> cpu_log;
      ASSERT_EQ(dhs::land_late_pages(cpu, kDev, stack, nullptr, nullptr, &cpu_log), late);
      // The spare slots' bytes before (an earlier case on these pools may have landed pages there).
      std::vector<std::vector<uint16_t>> spare_before;
      for (size_t i = static_cast<size_t>(late); i < stack.size(); ++i) spare_before.push_back(dev_page(P.dev, true, stack[i]));
      const Landed g = land_on_device(in, P, stack, 3);
      EXPECT_EQ(g.claims, late);
      EXPECT_EQ(g.bad, 0);
      ASSERT_EQ(static_cast<int64_t>(g.log.size()), late);
      // The same landings as a multiset; the slots: the stack's first `late`, each once.
      std::vector<std::tuple<int32_t, int32_t, int32_t>> a, b;
      for (const LandEntry& e : g.log) a.push_back(key_of(e));
      for (const LandEntry& e : cpu_log) b.push_back(key_of(e));
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      EXPECT_EQ(a, b) << ps << "x" << d << ", " << n_rows << " rows";
      std::vector<int32_t> used, want(stack.begin(), stack.begin() + late);
      for (const LandEntry& e : g.log) used.push_back(e.dev_slot);
      std::sort(used.begin(), used.end());
      std::sort(want.begin(), want.end());
      EXPECT_EQ(used, want);
      for (int32_t l : g.log_layer) EXPECT_EQ(l, 3);
      // Keys: resident ones unchanged, late ones rewritten to their landing's slot.
      for (size_t k = 0; k < in.slots.size(); ++k) {
        if (in.slots[k] < kDev) {
          EXPECT_EQ(g.slots[k], in.slots[k]);
        } else {
          EXPECT_LT(g.slots[k], kDev) << "entry " << k << " did not land";
        }
      }
      // Bytes: each landing's slot holds its host page, K and V.
      for (const LandEntry& e : g.log)
        for (bool v : {false, true})
          ASSERT_TRUE(host_page_equals(P.host, v, e.host_slot, dev_page(P.dev, v, e.dev_slot)))
              << (v ? "V" : "K") << " of host page " << e.host_slot << " in slot " << e.dev_slot;
      // Each rewritten entry names a slot that holds its own page (the log's row and host slot).
      for (size_t r = 0; r + 1 < in.indptr.size(); ++r)
        for (int32_t k = in.indptr[r]; k < in.indptr[r + 1]; ++k) {
          if (in.slots[static_cast<size_t>(k)] < kDev) continue;
          const int32_t h = static_cast<int32_t>(in.slots[static_cast<size_t>(k)] - kDev);
          ASSERT_TRUE(host_page_equals(P.host, false, h, dev_page(P.dev, false, g.slots[static_cast<size_t>(k)])));
        }
      // Untouched: the spare slots keep their bytes.
      for (size_t i = static_cast<size_t>(late); i < stack.size(); ++i)
        EXPECT_EQ(dev_page(P.dev, true, stack[i]), spare_before[i - static_cast<size_t>(late)]) << "spare slot " << stack[i];
    }
  }
}

TEST(TierLand, AShortStackLandsItsSizeAndCountsTheRest) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(23);
  Pools P(16, 128, rng);
  const PageLists in = random_lists(64, 120, rng);
  const int64_t late = late_entries(in);
  ASSERT_GT(late, 40);
  for (const int64_t n : {int64_t{0}, int64_t{1}, late / 3, late - 1}) {
    const std::vector<int32_t> stack = free_stack(n, rng);
    const Landed g = land_on_device(in, P, stack, 0);
    EXPECT_EQ(g.claims, late) << "stack of " << n;
    ASSERT_EQ(static_cast<int64_t>(g.log.size()), n);
    int64_t still_late = 0, rewritten = 0;
    for (size_t k = 0; k < in.slots.size(); ++k) {
      if (in.slots[k] < kDev) {
        EXPECT_EQ(g.slots[k], in.slots[k]);
      } else {
        still_late += g.slots[k] == in.slots[k];
        rewritten += g.slots[k] < kDev;
      }
    }
    EXPECT_EQ(rewritten, n);
    EXPECT_EQ(still_late, late - n);
    for (const LandEntry& e : g.log)
      ASSERT_TRUE(host_page_equals(P.host, true, e.host_slot, dev_page(P.dev, true, e.dev_slot)));
  }
}

TEST(TierLand, TwoLayersShareTheCounter) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(29);
  Pools P(16, 64, rng);
  const PageLists a = random_lists(16, 50, rng), b = random_lists(16, 50, rng);
  const int64_t la = late_entries(a), lb = late_entries(b);
  const std::vector<int32_t> stack = free_stack(la + lb, rng);
  int32_t *counter_d = nullptr, *log_d = nullptr;
  DHS_CUDA_CHECK(cudaMalloc(&counter_d, 8));
  DHS_CUDA_CHECK(cudaMemset(counter_d, 0, 8));
  DHS_CUDA_CHECK(cudaMalloc(&log_d, static_cast<size_t>(6 * stack.size() + 6) * 4));
  const Landed ga = land_on_device(a, P, stack, 0, 0, counter_d, log_d);
  const Landed gb = land_on_device(b, P, stack, 1, static_cast<int32_t>(la), counter_d, log_d);
  EXPECT_EQ(ga.claims, la);
  EXPECT_EQ(gb.claims, la + lb);
  ASSERT_EQ(static_cast<int64_t>(gb.log.size()), lb);  // (entries la.. of the log: the second layer's)
  for (int32_t l : gb.log_layer) EXPECT_EQ(l, 1);
  std::vector<int32_t> used;
  for (const Landed* g : {&ga, &gb})
    for (const LandEntry& e : g->log) used.push_back(e.dev_slot);
  std::sort(used.begin(), used.end());
  EXPECT_TRUE(std::adjacent_find(used.begin(), used.end()) == used.end()) << "a slot taken twice";
  EXPECT_EQ(static_cast<int64_t>(used.size()), la + lb);
  cudaFree(counter_d);
  cudaFree(log_d);
}

// As a captured step runs it: the stack's length read on the device (land_avail, below the
// buffer's capacity) and the keys written to a second buffer, the input left as it was.
TEST(TierLand, TheAvailableCountBoundsTheClaimsAndTheInputStays) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(37);
  Pools P(16, 128, rng);
  const PageLists in = random_lists(20, 60, rng);
  const int64_t late = late_entries(in);
  ASSERT_GT(late, 10);
  const std::vector<int32_t> stack = free_stack(late, rng);
  int32_t* indptr_d = to_device(in.indptr);
  int32_t* slots_d = to_device(in.slots);
  int32_t* out_d = to_device(std::vector<int32_t>(in.slots.size(), -7));
  int32_t* pos_d = to_device(in.page_pos);
  int32_t* stack_d = to_device(stack);
  int32_t* counter_d = to_device(std::vector<int32_t>{0, 0, 7});  // claims, bad, available
  int32_t* log_d = to_device(std::vector<int32_t>(6 * stack.size(), 0));
  dc::LandLateParams p = params(P, indptr_d, slots_d, out_d, pos_d, 20, stack_d, static_cast<int>(stack.size()), counter_d,
                                log_d, 0);
  p.land_avail = counter_d + 2;
  dc::land_late_pages(p, nullptr);
  DHS_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(to_host(slots_d, in.slots.size()), in.slots) << "the input keys changed";
  const auto out = to_host(out_d, in.slots.size());
  int64_t rewritten = 0;
  for (size_t k = 0; k < in.slots.size(); ++k) {
    if (in.slots[k] < kDev) {
      EXPECT_EQ(out[k], in.slots[k]);
    } else {
      EXPECT_TRUE(out[k] == in.slots[k] || out[k] < kDev);
      rewritten += out[k] < kDev;
    }
  }
  EXPECT_EQ(rewritten, 7);
  EXPECT_EQ(to_host(counter_d, 1)[0], late);
  for (int32_t* q : {indptr_d, slots_d, out_d, pos_d, stack_d, counter_d, log_d}) cudaFree(q);
}

TEST(TierLand, KeysPastTheHostTierAreSkippedAndCounted) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(31);
  Pools P(16, 128, rng);
  PageLists in;
  in.n_requests = 1;
  in.n_heads_kv = 1;
  in.seq_len = {1};
  in.slots = {5, static_cast<int32_t>(kDev + kHost), static_cast<int32_t>(kDev + 7), static_cast<int32_t>(kDev + kHost + 100)};
  in.page_pos = {0, 1, 2, 3};
  in.indptr = {0, 4};
  const Landed g = land_on_device(in, P, free_stack(4, rng), 0);
  EXPECT_EQ(g.bad, 2);
  EXPECT_EQ(g.claims, 1);
  EXPECT_EQ(g.slots[1], in.slots[1]);
  EXPECT_EQ(g.slots[3], in.slots[3]);
  EXPECT_LT(g.slots[2], kDev);
}

// Adoption where the page lands: a page table ([40 request slots, 2 layers x 4 KV heads, 64 pages])
// and two arrays of key rows (16 and 48 bytes); layer 1's lists over 30 requests name random pages
// of their table, some of them twice (the same row and page: one landing may take the entry), some
// with a key their entry no longer holds (no landing takes it). Against the CPU statement: the
// same landings, the same pages taken (per row and page, as many taken: 0 or 1), every table entry
// and row as the device's own taken landings say (the entry names the slot, the slot's rows are
// the host key's), nothing else written.
TEST(TierLand, AdoptionWritesTheTableAndTheRowsAsTheCpuStatement) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(47);
  Pools P(16, 128, rng);
  constexpr int kSlots = 40, kReqs = 30, kHkv = 4, kLists = 2 * kHkv, kPages = 64, kLayer = 1;
  std::vector<int32_t> req_slot(kSlots);
  for (int i = 0; i < kSlots; ++i) req_slot[static_cast<size_t>(i)] = i;
  std::shuffle(req_slot.begin(), req_slot.end(), rng);
  req_slot.resize(kReqs);
  const auto at = [](int slot, int list, int page) { return static_cast<size_t>((int64_t{slot} * kLists + list) * kPages + page); };
  std::vector<int32_t> table(static_cast<size_t>(kSlots) * kLists * kPages);
  for (int32_t& e : table)
    e = rng() % 2 ? static_cast<int32_t>(rng() % 1000) : static_cast<int32_t>(kDev + rng() % kHost);
  PageLists in;
  in.n_requests = kReqs;
  in.n_heads_kv = kHkv;
  in.seq_len.assign(kReqs, 1);
  in.indptr = {0};
  int twice = 0, stale = 0;
  for (int r = 0; r < kReqs; ++r)
    for (int h = 0; h < kHkv; ++h) {
      std::vector<int32_t> again;  // pages listed a second time at the row's end
      for (int i = 0; i < kPages; ++i) {
        if (rng() % 10 >= 3) continue;
        int32_t key = table[at(req_slot[static_cast<size_t>(r)], kLayer * kHkv + h, i)];
        if (key >= kDev && rng() % 20 == 0) {
          key = static_cast<int32_t>(kDev + (key - kDev + 1) % kHost);  // (the entry moved on)
          ++stale;
        } else if (key >= kDev && rng() % 8 == 0) {
          again.push_back(i);
          ++twice;
        }
        in.slots.push_back(key);
        in.page_pos.push_back(i);
      }
      for (const int32_t i : again) {
        in.slots.push_back(table[at(req_slot[static_cast<size_t>(r)], kLayer * kHkv + h, i)]);
        in.page_pos.push_back(i);
      }
      in.indptr.push_back(static_cast<int32_t>(in.slots.size()));
    }
  ASSERT_GT(twice, 10);
  ASSERT_GT(stale, 3);
  const int64_t late = late_entries(in);
  const std::vector<int32_t> stack = free_stack(late, rng);
  // Rows by key (device slots, then host keys), random bytes.
  const std::vector<int64_t> row_bytes = {16, 48};
  std::vector<std::vector<uint8_t>> rows(2);
  for (size_t a = 0; a < 2; ++a) {
    rows[a].resize(static_cast<size_t>((kDev + kHost) * row_bytes[a]));
    for (uint8_t& b : rows[a]) b = static_cast<uint8_t>(rng());
  }
  // The CPU statement.
  PageLists cpu = in;
  std::vector<int32_t> cpu_table = table;
  std::vector<std::vector<uint8_t>> cpu_rows = rows;
  dhs::LandAdopt adopt;
  adopt.table = cpu_table;
  adopt.req_slot = req_slot;
  adopt.n_lists = kLists;
  adopt.max_pages = kPages;
  adopt.n_heads_kv = kHkv;
  adopt.layer = kLayer;
  for (size_t a = 0; a < 2; ++a) adopt.rows.push_back({cpu_rows[a].data(), row_bytes[a]});
  std::vector<LandEntry> cpu_log;
  ASSERT_EQ(dhs::land_late_pages(cpu, kDev, stack, nullptr, nullptr, &cpu_log, &adopt), late);
  // The device.
  int32_t* indptr_d = to_device(in.indptr);
  int32_t* slots_d = to_device(in.slots);
  int32_t* pos_d = to_device(in.page_pos);
  int32_t* stack_d = to_device(stack);
  int32_t* counter_d = to_device(std::vector<int32_t>{0, 0});
  int32_t* log_d = to_device(std::vector<int32_t>(6 * stack.size() + 6, 0));
  int32_t* table_d = to_device(table);
  int32_t* req_slot_d = to_device(req_slot);
  std::vector<uint8_t*> rows_d(2);
  for (size_t a = 0; a < 2; ++a) {
    DHS_CUDA_CHECK(cudaMalloc(&rows_d[a], rows[a].size()));
    DHS_CUDA_CHECK(cudaMemcpy(rows_d[a], rows[a].data(), rows[a].size(), cudaMemcpyHostToDevice));
  }
  dc::LandLateParams p = params(P, indptr_d, slots_d, slots_d, pos_d, kReqs * kHkv, stack_d, static_cast<int>(stack.size()),
                                counter_d, log_d, kLayer);
  p.table = table_d;
  p.req_slot = req_slot_d;
  p.n_lists = kLists;
  p.max_pages = kPages;
  p.n_heads_kv = kHkv;
  for (size_t a = 0; a < 2; ++a) p.follow[p.n_follow++] = {rows_d[a], row_bytes[a]};
  dc::land_late_pages(p, nullptr);
  DHS_CUDA_CHECK(cudaDeviceSynchronize());
  const auto lg = to_host(log_d, static_cast<size_t>(6 * late));
  std::vector<LandEntry> log;
  for (int64_t i = 0; i < late; ++i) log.push_back({lg[6 * i], lg[6 * i + 2], lg[6 * i + 3], lg[6 * i + 4], lg[6 * i + 5] != 0});
  EXPECT_EQ(to_host(counter_d, 2)[1], 0);
  // The same landings, and per (row, page) as many taken.
  std::map<std::pair<int32_t, int32_t>, std::pair<int, int>> taken;  // -> (CPU's, device's)
  std::vector<std::tuple<int32_t, int32_t, int32_t>> a_keys, b_keys;
  for (const LandEntry& e : cpu_log) {
    b_keys.push_back(key_of(e));
    taken[{e.row, e.page_pos}].first += e.adopted;
  }
  for (const LandEntry& e : log) {
    a_keys.push_back(key_of(e));
    taken[{e.row, e.page_pos}].second += e.adopted;
  }
  std::sort(a_keys.begin(), a_keys.end());
  std::sort(b_keys.begin(), b_keys.end());
  ASSERT_EQ(a_keys, b_keys);
  int64_t n_taken = 0;
  for (const auto& [page, n] : taken) {
    EXPECT_EQ(n.first, n.second) << "row " << page.first << " page " << page.second;
    EXPECT_LE(n.second, 1);
    n_taken += n.second;
  }
  EXPECT_LT(n_taken, late) << "some landings should not take their page";
  // The table and rows as the device's taken landings say; the CPU's wrote the same entries.
  std::vector<int32_t> want_table = table;
  std::vector<std::vector<uint8_t>> want_rows = rows;
  for (const LandEntry& e : log) {
    if (!e.adopted) continue;
    want_table[at(req_slot[static_cast<size_t>(e.row / kHkv)], kLayer * kHkv + e.row % kHkv, e.page_pos)] = e.dev_slot;
    for (size_t a = 0; a < 2; ++a)
      std::memcpy(want_rows[a].data() + e.dev_slot * row_bytes[a], rows[a].data() + (kDev + e.host_slot) * row_bytes[a],
                  static_cast<size_t>(row_bytes[a]));
  }
  EXPECT_EQ(to_host(table_d, table.size()), want_table);
  for (size_t k = 0; k < table.size(); ++k) EXPECT_EQ(cpu_table[k] != table[k], want_table[k] != table[k]) << "entry " << k;
  for (size_t a = 0; a < 2; ++a) {
    std::vector<uint8_t> got(rows[a].size());
    DHS_CUDA_CHECK(cudaMemcpy(got.data(), rows_d[a], got.size(), cudaMemcpyDeviceToHost));
    EXPECT_TRUE(got == want_rows[a]) << "row array " << a;
    cudaFree(rows_d[a]);
  }
  // Bytes: every landing's slot holds its host page.
  for (const LandEntry& e : log)
    for (bool v : {false, true}) ASSERT_TRUE(host_page_equals(P.host, v, e.host_slot, dev_page(P.dev, v, e.dev_slot)));
  for (int32_t* q : {indptr_d, slots_d, pos_d, stack_d, counter_d, log_d, table_d, req_slot_d}) cudaFree(q);
}

}  // namespace
