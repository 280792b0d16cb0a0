// The bucketed LRU's selection on the device (backend/cuda/lru_select.h) against its CPU
// definition (kv/bucketed_lru.h BucketedLru::select_many, itself tested against a brute-force
// sort in test_bucketed_lru): each want's victims equal, order included, on random LRU states —
// plain and cyclic orders, 1 to 4,096 bins (the histogram in shared memory and in global
// atomics), 1 to 300,001 slots, owners that want nothing, more than they have, exactly what they
// have, a cut bin spread over many of the placing kernel's tiles, every slot in one bin; then a
// captured selection replayed over changed uses and counts; a candidate used after `now` refused.
// DHS_CUDA_BENCH=1: the selection at the 8B shape's slot count (4M slots: 32 GiB of 8 KiB
// head-pages) timed against select_many on this host's threads.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/lru_select.h"
#include "device_vectors.h"
#include "gtest_shim.h"
#include "kv/bucketed_lru.h"

namespace {

namespace dc = dhs::cuda;
using dhs::BucketedLru;
using dhs::LruParams;
using dhs::test::to_device;

bool have_gpu() { return dc::device_count() > 0; }

// The LRU's state and a selection's wants on the device.
struct DeviceState {
  int32_t* last_use = nullptr;  // (the LRU's stored offsets from base)
  int64_t base = 0;
  int32_t* owner = nullptr;
  uint8_t* pinned = nullptr;
  int32_t* want_of = nullptr;
  int64_t* want_n = nullptr;
  int32_t* out = nullptr;
  int64_t *first = nullptr, *count = nullptr;
  int32_t* error = nullptr;
  int32_t n_slots = 0, n_owners = 0;
  int n_wants = 0;

  DeviceState(const BucketedLru& lru, const std::vector<std::pair<int32_t, int64_t>>& wants) {
    n_slots = static_cast<int32_t>(lru.n_slots());
    const std::span<const int32_t> offsets = lru.use_offsets();
    std::vector<int32_t> u(offsets.begin(), offsets.end());
    base = lru.use_base();
    std::vector<int32_t> o(static_cast<size_t>(n_slots));
    std::vector<uint8_t> pin(static_cast<size_t>(n_slots));
    for (int32_t s = 0; s < n_slots; ++s) {
      o[static_cast<size_t>(s)] = lru.owner(s);
      pin[static_cast<size_t>(s)] = lru.pinned(s) ? 1 : 0;
    }
    last_use = to_device(u);
    owner = to_device(o);
    pinned = to_device(pin);
    set_wants(wants);
    DHS_CUDA_CHECK(cudaMalloc(&out, std::max<size_t>(static_cast<size_t>(n_slots), 1) * 4));
    DHS_CUDA_CHECK(cudaMalloc(&error, 4));
  }
  void set_wants(const std::vector<std::pair<int32_t, int64_t>>& wants) {
    int32_t max_owner = 0;
    for (const auto& [o, n] : wants) max_owner = std::max(max_owner, o);
    n_owners = max_owner + 1;
    std::vector<int32_t> of(static_cast<size_t>(n_owners), -1);
    std::vector<int64_t> n;
    for (size_t i = 0; i < wants.size(); ++i) {
      of[static_cast<size_t>(wants[i].first)] = static_cast<int32_t>(i);
      n.push_back(wants[i].second);
    }
    cudaFree(want_of);
    cudaFree(want_n);
    cudaFree(first);
    cudaFree(count);
    want_of = to_device(of);
    want_n = to_device(n);
    n_wants = static_cast<int>(wants.size());
    DHS_CUDA_CHECK(cudaMalloc(&first, static_cast<size_t>(n_wants) * 8));
    DHS_CUDA_CHECK(cudaMalloc(&count, static_cast<size_t>(n_wants) * 8));
  }
  ~DeviceState() {
    for (void* p : {static_cast<void*>(last_use), static_cast<void*>(owner), static_cast<void*>(pinned),
                    static_cast<void*>(want_of), static_cast<void*>(want_n), static_cast<void*>(out),
                    static_cast<void*>(first), static_cast<void*>(count), static_cast<void*>(error)})
      cudaFree(p);
  }
  dc::LruSelectParams params(const LruParams& lp, int64_t now) const {
    dc::LruSelectParams p;
    p.last_use = last_use;
    p.use_base = base;
    p.owner = owner;
    p.pinned = pinned;
    p.n_slots = n_slots;
    p.now = now;
    p.lru = lp;
    p.want_of_owner = want_of;
    p.n_owners = n_owners;
    p.want_n = want_n;
    p.n_wants = n_wants;
    p.out_slots = out;
    p.out_first = first;
    p.out_count = count;
    p.error_slot = error;
    return p;
  }
};

// A random LRU: owners 0 .. n_owners - 1 hold ~85% of the slots, last used within `span` ticks
// before `now` (or any time before it up to 2^28 ticks back, one in eight), ~5% pinned; then
// touches and erases.
BucketedLru random_lru(int32_t n_slots, LruParams lp, int n_owners, int64_t now, int64_t span, std::mt19937& rng) {
  BucketedLru lru(n_slots, lp);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  std::uniform_int_distribution<int> own(0, n_owners - 1);
  const auto when = [&] {
    const int64_t lo = std::max<int64_t>(0, now - (u01(rng) < 0.125 ? int64_t{1} << 28 : span));
    return std::uniform_int_distribution<int64_t>(lo, now)(rng);
  };
  for (int32_t s = 0; s < n_slots; ++s) {
    if (u01(rng) < 0.15) continue;
    lru.insert(s, own(rng), when());
    if (u01(rng) < 0.05) lru.set_pinned(s, true);
  }
  for (int32_t s = 0; s < n_slots; ++s) {
    if (!lru.resident(s)) continue;
    if (u01(rng) < 0.1) lru.touch(s, when());
    else if (u01(rng) < 0.02 && !lru.pinned(s)) lru.erase(s);
  }
  return lru;
}

// Each owner's candidate count (the wants are chosen around them).
std::vector<int64_t> candidates_of(const BucketedLru& lru, int n_owners) {
  std::vector<int64_t> c(static_cast<size_t>(n_owners), 0);
  for (int32_t s = 0; s < lru.n_slots(); ++s)
    if (lru.resident(s) && !lru.pinned(s) && lru.owner(s) < n_owners) ++c[static_cast<size_t>(lru.owner(s))];
  return c;
}

void expect_equal(const BucketedLru& lru, const std::vector<std::pair<int32_t, int64_t>>& wants, int64_t now,
                  dc::LruSelectScratch& sc, const char* what) {
  DeviceState d(lru, wants);
  const std::vector<std::vector<int32_t>> got = dc::lru_select(d.params(lru.params(), now), sc, nullptr);
  const std::vector<std::vector<int32_t>> want = lru.select_many(wants, now);
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t w = 0; w < want.size(); ++w) {
    EXPECT_EQ(got[w].size(), want[w].size()) << what << ": want " << w << " (owner " << wants[w].first << ", n "
                                             << wants[w].second << ")";
    EXPECT_TRUE(got[w] == want[w]) << what << ": want " << w << " (owner " << wants[w].first << ", n "
                                   << wants[w].second << ")";
  }
}

TEST(LruSelect, EqualsSelectManyOnRandomStates) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(20261207);
  struct Case {
    int32_t n_slots;
    LruParams lp;
    int owners;
    int64_t now, span;
  };
  const std::vector<Case> cases = {
      {1, {4, 16, false}, 1, 10, 10},
      {37, {4, 16, false}, 3, 100, 80},
      {1000, {1, 1, false}, 4, 50, 50},           // one bin: every candidate in the cut bin
      {4097, {30, 4, true}, 5, 3000, 400},       // the default model's cyclic clock (30 layers)
      {65537, {32, 4, true}, 9, 100000, 300},    // the 8B shape's
      {65537, {4, 16, false}, 2, 1000, 200},
      {300001, {3, 3, true}, 7, 77, 77},
      {20000, {64, 64, true}, 5, 100000, 9000},  // 4,096 bins (the most) x 4 wants: the histogram in global atomics
      {65537, {32, 4, true}, 9, (int64_t{3} << 30) + 12345, 300},  // the clock past 2^31: offsets from a base > 0
      {4097, {4, 16, false}, 3, (int64_t{3} << 30) + 7, 200},
  };
  for (const Case& c : cases) {
    const BucketedLru lru = random_lru(c.n_slots, c.lp, c.owners, c.now, c.span, rng);
    if (c.now > (int64_t{1} << 30)) EXPECT_GT(lru.use_base(), 0);
    const std::vector<int64_t> have = candidates_of(lru, c.owners);
    const int nb = c.lp.n_buckets * c.lp.bucket_steps;
    dc::LruSelectScratch sc(c.n_slots, c.owners + 1, nb);
    // Wants around each owner's count: nothing, one, a third, all but one, all, more; the last
    // owner wants nothing listed (absent from the wants), where there are several.
    for (int round = 0; round < 6; ++round) {
      std::vector<std::pair<int32_t, int64_t>> wants;
      for (int o = 0; o < c.owners - (c.owners > 1 ? 1 : 0); ++o) {
        const int64_t h = have[static_cast<size_t>(o)];
        const int64_t n = round == 0 ? 0 : round == 1 ? 1 : round == 2 ? h / 3 : round == 3 ? h - 1 : round == 4 ? h : h + 5;
        wants.emplace_back(o, n);
      }
      std::shuffle(wants.begin(), wants.end(), rng);
      char what[128];
      std::snprintf(what, sizeof what, "%d slots, %d x %d %s, round %d", c.n_slots, c.lp.bucket_steps, c.lp.n_buckets,
                    c.lp.cyclic ? "cyclic" : "plain", round);
      expect_equal(lru, wants, c.now, sc, what);
    }
  }
}

// Every slot of one owner in one bin, far more than a tile (1,024) of them before the count is
// reached: the placing kernel carries the bin's count across tiles; and two owners interleaved
// slot by slot.
TEST(LruSelect, ACutBinOverManyTiles) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const int32_t n = 50000;
  BucketedLru lru(n, {4, 16, false});
  for (int32_t s = 0; s < n; ++s) lru.insert(s, s % 2, 40);  // one bin for all
  dc::LruSelectScratch sc(n, 2, 64);
  for (const int64_t k : {int64_t{1}, int64_t{1023}, int64_t{1024}, int64_t{1025}, int64_t{12345}, int64_t{24999},
                          int64_t{25000}, int64_t{30000}})
    expect_equal(lru, {{0, k}, {1, k / 2}}, 41, sc, "one bin");
  // Two bins, the older one small (every 7th slot): owner 1 wants more than its part of it, so
  // all of it and then the lowest slots of the newer bin; owner 0 less.
  for (int32_t s = 0; s < n; ++s)
    if (s % 7 != 0) lru.touch(s, 60);
  expect_equal(lru, {{1, 20000}, {0, 3000}}, 61, sc, "two bins");
  // No pin array (nothing pinned) and no slots at all.
  const std::vector<std::pair<int32_t, int64_t>> wants = {{0, 100}, {1, 5000}};
  DeviceState d(lru, wants);
  dc::LruSelectParams p = d.params(lru.params(), 61);
  p.pinned = nullptr;
  const auto got = dc::lru_select(p, sc, nullptr);
  const auto want = lru.select_many(wants, 61);
  EXPECT_TRUE(got == want) << "no pin array";
  p.n_slots = 0;
  const auto none = dc::lru_select(p, sc, nullptr);
  ASSERT_EQ(none.size(), 2u);
  EXPECT_TRUE(none[0].empty() && none[1].empty());
}

TEST(LruSelect, CapturedAndReplayedOverNewUses) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(7);
  const LruParams lp{32, 4, true};
  BucketedLru a = random_lru(100000, lp, 4, 5000, 300, rng);
  const std::vector<std::pair<int32_t, int64_t>> wants = {{2, 700}, {0, 5000}, {1, 1}, {3, 0}};
  DeviceState d(a, wants);
  dc::LruSelectScratch sc(a.n_slots(), 4, 128);
  cudaStream_t st;
  DHS_CUDA_CHECK(cudaStreamCreate(&st));
  cudaGraph_t g;
  DHS_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  dc::launch_lru_select(d.params(lp, 5000), sc, st);
  DHS_CUDA_CHECK(cudaStreamEndCapture(st, &g));
  cudaGraphExec_t exec;
  DHS_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
  // The replay reads the arrays as they are now: another state and other counts at the same
  // addresses (the counts through want_n; `now` is baked into the graph).
  std::mt19937 rng2(8);
  const BucketedLru b = random_lru(100000, lp, 4, 5000, 900, rng2);
  const std::vector<std::pair<int32_t, int64_t>> wants2 = {{2, 100}, {0, 0}, {1, 40000}, {3, 17}};
  DeviceState fresh(b, wants2);
  ASSERT_EQ(fresh.base, d.base);  // (the base is baked into the graph with `now`)
  DHS_CUDA_CHECK(cudaMemcpy(d.last_use, fresh.last_use, static_cast<size_t>(b.n_slots()) * 4, cudaMemcpyDeviceToDevice));
  DHS_CUDA_CHECK(cudaMemcpy(d.owner, fresh.owner, static_cast<size_t>(b.n_slots()) * 4, cudaMemcpyDeviceToDevice));
  DHS_CUDA_CHECK(cudaMemcpy(d.pinned, fresh.pinned, static_cast<size_t>(b.n_slots()), cudaMemcpyDeviceToDevice));
  DHS_CUDA_CHECK(cudaMemcpy(d.want_n, fresh.want_n, 4 * 8, cudaMemcpyDeviceToDevice));
  for (int rep = 0; rep < 2; ++rep) {
    DHS_CUDA_CHECK(cudaGraphLaunch(exec, st));
    DHS_CUDA_CHECK(cudaStreamSynchronize(st));
    const std::vector<std::vector<int32_t>> want = b.select_many(wants2, 5000);
    const auto first = dhs::test::to_host(d.first, 4), count = dhs::test::to_host(d.count, 4);
    int32_t err = 0;
    DHS_CUDA_CHECK(cudaMemcpy(&err, d.error, 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(err, dc::kNoError);
    for (size_t w = 0; w < 4; ++w) {
      ASSERT_EQ(count[w], static_cast<int64_t>(want[w].size())) << "replay " << rep << ", want " << w;
      const auto got = dhs::test::to_host(d.out + first[w], static_cast<size_t>(count[w]));
      EXPECT_TRUE(got == want[w]) << "replay " << rep << ", want " << w;
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  cudaStreamDestroy(st);
}

TEST(LruSelect, RefusesACandidateUsedAfterNow) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  BucketedLru lru(100, {4, 16, false});
  for (int32_t s = 0; s < 100; ++s) lru.insert(s, s % 3, 20);
  DeviceState d(lru, {{0, 5}, {1, 5}});
  const int32_t later = static_cast<int32_t>(30 - d.base);
  DHS_CUDA_CHECK(cudaMemcpy(d.last_use + 7, &later, 4, cudaMemcpyHostToDevice));  // slot 7: owner 1
  dc::LruSelectScratch sc(100, 2, 64);
  bool threw = false;
  try {
    dc::lru_select(d.params({4, 16, false}, 25), sc, nullptr);
  } catch (const std::invalid_argument& e) {
    threw = std::string(e.what()).find("slot 7 was used after step 25") != std::string::npos;
  }
  EXPECT_TRUE(threw);
  // The same slot of an owner that wants nothing is no candidate: no error.
  d.set_wants({{0, 5}, {2, 5}});
  EXPECT_EQ(dc::lru_select(d.params({4, 16, false}, 25), sc, nullptr).size(), 2u);
  // Scratch sizes are checked.
  dc::LruSelectScratch small(50, 2, 64);
  threw = false;
  try {
    dc::lru_select(d.params({4, 16, false}, 25), small, nullptr);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  EXPECT_TRUE(threw);
}

// The 8B shape's HBM pool in 8 KiB head-pages at 32 GiB: 4,194,304 slots, 4 requests, the
// cyclic clock of 32 layers; each wants ~2% of its slots (the victims of a step at 5.5% churn
// are ~1%). Times the device op (launches only, events) and select_many on this host.
TEST(LruSelect, Bandwidth) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  if (!std::getenv("DHS_CUDA_BENCH")) GTEST_SKIP() << "set DHS_CUDA_BENCH=1";
  std::mt19937 rng(3);
  const LruParams lp{32, 4, true};
  const int32_t n = 4194304;
  const BucketedLru lru = random_lru(n, lp, 4, 320000, 32 * 40, rng);
  const std::vector<int64_t> have = candidates_of(lru, 4);
  std::vector<std::pair<int32_t, int64_t>> wants;
  for (int o = 0; o < 4; ++o) wants.emplace_back(o, have[static_cast<size_t>(o)] / 50);
  DeviceState d(lru, wants);
  dc::LruSelectScratch sc(n, 4, 128);
  expect_equal(lru, wants, 320000, sc, "4M slots");
  cudaEvent_t e0, e1;
  DHS_CUDA_CHECK(cudaEventCreate(&e0));
  DHS_CUDA_CHECK(cudaEventCreate(&e1));
  const dc::LruSelectParams p = d.params(lp, 320000);
  dc::launch_lru_select(p, sc, nullptr);
  DHS_CUDA_CHECK(cudaEventRecord(e0));
  const int iters = 20;
  for (int i = 0; i < iters; ++i) dc::launch_lru_select(p, sc, nullptr);
  DHS_CUDA_CHECK(cudaEventRecord(e1));
  DHS_CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  DHS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) (void)lru.select_many(wants, 320000);
  const double host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 5;
  std::printf("lru_select: %d slots, 4 wants of ~2%%: device %.3f ms, host select_many %.3f ms\n", n, ms / iters, host_ms);
}

}  // namespace
