// The hierarchy's device I/O engine (backend/cuda/page_recall.h) against its CPU statement
// (kv/tier_copy.h copy_pages): random move lists (none, one at the pools' last slots, thousands
// scattered or in runs of consecutive slots) between a pinned host tier and the HBM pool of
// awkward sizes, page 16 x head_dim 64 and 128, both directions, the kernel at 1 .. 132 blocks
// and both copy-engine forms. Bits are moved, never values: both whole pools (the destination,
// the pages no move names and the source) must equal the statement's bit for bit. Then a captured
// graph replayed after its count and pairs were rewritten, and the kernel between guard pages
// with moves naming slots outside the pools. DHS_TEST_QUICK=1 (the sanitizer runs): smaller
// pools and lists.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_page_pool.h"
#include "backend/cuda/host_gather.h"
#include "backend/cuda/page_recall.h"
#include "device_vectors.h"
#include "dhisparse/error.h"
#include "gtest_shim.h"
#include "kv/page_pool.h"
#include "kv/tier_copy.h"

namespace {

namespace dc = dhs::cuda;
using dhs::PageMove;
using dhs::PageRef;
using dhs::Tier;
using dc::PageMoveDirection;

bool quick() {
  const char* e = std::getenv("DHS_TEST_QUICK");
  return e != nullptr && e[0] != '\0' && e[0] != '0';
}

// Random f16 bit patterns, every value NaNs included (the engine copies bits).
void fill_bits(std::vector<uint16_t>& x, uint64_t& state) {
  for (size_t i = 0; i < x.size(); i += 4) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);  // splitmix64
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    for (size_t j = 0; j < 4 && i + j < x.size(); ++j) x[i + j] = static_cast<uint16_t>(z >> (16 * j));
  }
}

// The CPU statement runs on fp32 pools: each f16 bit pattern is held as the float of its integer
// value (exact: every uint16 is a float), so copy_pages moves exactly the bits the engine moves.
struct Mirror {
  dhs::PagePool pool;
  Mirror(Tier tier, int64_t n_pages, int page_size, int head_dim) : pool(tier, n_pages, page_size, head_dim) {
    std::vector<PageRef> refs;
    pool.allocate(n_pages, &refs);  // every slot used: copy_pages names only used slots
  }
  size_t n() const { return static_cast<size_t>(pool.n_pages()) * pool.page_size() * pool.head_dim(); }
  void set(const std::vector<uint16_t>& k, const std::vector<uint16_t>& v) {
    float* kf = pool.k_page(PageRef{pool.tier(), 0});
    float* vf = pool.v_page(PageRef{pool.tier(), 0});
    for (size_t i = 0; i < n(); ++i) {
      kf[i] = static_cast<float>(k[i]);
      vf[i] = static_cast<float>(v[i]);
    }
  }
  // K (kv 0) or V (kv 1) as bit patterns.
  std::vector<uint16_t> bits(int kv) const {
    const float* f = kv == 0 ? pool.k_page(PageRef{pool.tier(), 0}) : pool.v_page(PageRef{pool.tier(), 0});
    std::vector<uint16_t> out(n());
    for (size_t i = 0; i < n(); ++i) out[i] = static_cast<uint16_t>(f[i]);
    return out;
  }
};

// "" when every element is equal; else the first difference by slot, K/V and element, and the count.
std::string diff_pages(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, size_t page_elems,
                       const std::string& what, int kv) {
  if (got.size() != want.size()) return what + ": sizes differ";
  size_t n_diff = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && n_diff++ == 0) first = i;
  if (n_diff == 0) return "";
  char hex[64];
  std::snprintf(hex, sizeof hex, " (got 0x%04x, want 0x%04x)", got[first], want[first]);
  return what + (kv == 0 ? " K" : " V") + ": " + std::to_string(n_diff) + " elements differ, first at slot " +
         std::to_string(first / page_elems) + " element " + std::to_string(first % page_elems) + hex;
}

enum class Layout { Scattered, Runs };

// n moves src_tier -> dst_tier with distinct destinations. Scattered: destinations a random subset,
// sources drawn at random (repeats allowed: a page may be recalled into two slots). Runs: the
// destination slots cut into runs of 1 .. 48 consecutive slots in a shuffled order, each from a
// run of consecutive source slots at a random place.
std::vector<PageMove> make_moves(int n, Tier src_tier, int64_t n_src, Tier dst_tier, int64_t n_dst, Layout layout,
                                 std::mt19937& rng) {
  std::vector<PageMove> moves;
  if (layout == Layout::Scattered) {
    std::vector<int32_t> dst(static_cast<size_t>(n_dst));
    std::iota(dst.begin(), dst.end(), 0);
    std::shuffle(dst.begin(), dst.end(), rng);
    for (int i = 0; i < n; ++i)
      moves.push_back({PageRef{src_tier, static_cast<int32_t>(rng() % n_src)}, PageRef{dst_tier, dst[static_cast<size_t>(i)]}});
    return moves;
  }
  std::vector<std::pair<int32_t, int32_t>> runs;  // (first dst slot, length)
  for (int32_t d = 0; d < n_dst;) {
    const int32_t len = std::min<int32_t>(1 + static_cast<int32_t>(rng() % 48), static_cast<int32_t>(n_dst - d));
    runs.push_back({d, len});
    d += len;
  }
  std::shuffle(runs.begin(), runs.end(), rng);
  for (const auto& [d, len] : runs) {
    const int32_t s = static_cast<int32_t>(rng() % (n_src - len + 1));
    for (int32_t i = 0; i < len && static_cast<int>(moves.size()) < n; ++i)
      moves.push_back({PageRef{src_tier, s + i}, PageRef{dst_tier, d + i}});
  }
  return moves;
}

enum class Form { Kernel, PerRun, Batch };
const char* form_name(Form f) { return f == Form::Kernel ? "kernel" : f == Form::PerRun ? "memcpy" : "memcpy_batch"; }

// One page shape's pools, refilled with random bits before each case.
struct Pools {
  int page_size, head_dim;
  dc::HostPagePool host;
  dc::DevicePagePool dev;
  Mirror host_m, dev_m;
  uint64_t state;
  cudaStream_t stream = nullptr;

  Pools(int ps, int hd, int64_t n_host, int64_t n_dev, uint64_t seed)
      : page_size(ps), head_dim(hd), host(n_host, ps, hd), dev(n_dev, ps, hd), host_m(Tier::Host, n_host, ps, hd),
        dev_m(Tier::Device, n_dev, ps, hd), state(seed) {
    DHS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~Pools() { cudaStreamDestroy(stream); }
  size_t page_elems() const { return static_cast<size_t>(page_size) * head_dim; }

  void randomize() {
    std::vector<uint16_t> k(host_m.n()), v(host_m.n());
    fill_bits(k, state);
    fill_bits(v, state);
    std::memcpy(host.k_h(), k.data(), k.size() * 2);
    std::memcpy(host.v_h(), v.data(), v.size() * 2);
    host_m.set(k, v);
    k.resize(dev_m.n());
    v.resize(dev_m.n());
    fill_bits(k, state);
    fill_bits(v, state);
    DHS_CUDA_CHECK(cudaMemcpy(dev.k_d(), k.data(), k.size() * 2, cudaMemcpyHostToDevice));
    DHS_CUDA_CHECK(cudaMemcpy(dev.v_d(), v.data(), v.size() * 2, cudaMemcpyHostToDevice));
    dev_m.set(k, v);
  }

  // Both pools, whole, against the statement (after a sync).
  void expect_equal(const std::string& what) {
    DHS_CUDA_CHECK(cudaDeviceSynchronize());
    const size_t nh = host_m.n(), nd = dev_m.n();
    for (int kv = 0; kv < 2; ++kv) {
      const __half* h = kv == 0 ? host.k_h() : host.v_h();
      std::vector<uint16_t> got(nh);
      std::memcpy(got.data(), h, nh * 2);
      std::string d = diff_pages(got, host_m.bits(kv), page_elems(), what + ", host tier", kv);
      EXPECT_TRUE(d.empty()) << d;
      got = dhs::test::to_host(reinterpret_cast<const uint16_t*>(kv == 0 ? dev.k_d() : dev.v_d()), nd);
      d = diff_pages(got, dev_m.bits(kv), page_elems(), what + ", device pool", kv);
      EXPECT_TRUE(d.empty()) << d;
    }
  }
};

// One case: the statement on the mirrors, the engine on the pools, both pools compared whole.
void run_case(Pools& P, PageMoveDirection dir, Form form, int n_blocks, const std::vector<PageMove>& moves,
              const std::string& what) {
  P.randomize();
  const bool recall = dir == PageMoveDirection::Recall;
  const int64_t want_runs =
      recall ? dhs::copy_pages(P.host_m.pool, P.dev_m.pool, moves) : dhs::copy_pages(P.dev_m.pool, P.host_m.pool, moves);
  if (form == Form::Kernel) {
    // Capacity past the count, its tail filled with valid moves: a kernel that read past the
    // count would copy them and differ from the statement.
    const int capacity = static_cast<int>(moves.size()) + 37;
    dc::DeviceMoveList list(capacity, dir);
    const int64_t n_src = recall ? P.host.n_pages() : P.dev.n_pages(), n_dst = recall ? P.dev.n_pages() : P.host.n_pages();
    std::vector<int32_t> junk(2 * static_cast<size_t>(capacity));
    for (size_t i = 0; i < junk.size(); i += 2) {
      junk[i] = static_cast<int32_t>((i * 7919) % n_src);
      junk[i + 1] = static_cast<int32_t>((i * 104729) % n_dst);
    }
    DHS_CUDA_CHECK(cudaMemcpy(list.moves_d(), junk.data(), junk.size() * 4, cudaMemcpyHostToDevice));
    list.upload(moves);
    if (recall)
      dc::recall_pages(list, P.host, P.dev, P.stream, n_blocks);
    else
      dc::evict_pages(list, P.dev, P.host, P.stream, n_blocks);
    DHS_CUDA_CHECK(cudaStreamSynchronize(P.stream));
  } else {
    const auto f = form == Form::PerRun ? dc::CopyEngineForm::PerRun : dc::CopyEngineForm::Batch;
    const int64_t runs = recall ? dc::recall_pages_copy_engine(moves, P.host, P.dev, f, P.stream)
                                : dc::evict_pages_copy_engine(moves, P.dev, P.host, f, P.stream);
    DHS_CUDA_CHECK(cudaStreamSynchronize(P.stream));
    EXPECT_EQ(runs, want_runs) << what << ": runs coalesced differently from tier_copy.cpp";
  }
  P.expect_equal(what);
}

TEST(PageRecall, EveryFormEqualsTheCpuStatement) {
  if (dc::device_count() == 0) GTEST_SKIP() << "no GPU";
  struct Shape {
    int page_size, head_dim;
  };
  const int64_t n_host = quick() ? 611 : 5003, n_dev = quick() ? 397 : 3001;  // awkward sizes
  const int n_many = quick() ? 389 : 2999;
  std::mt19937 rng(23);
  for (const Shape s : {Shape{16, 128}, Shape{16, 64}}) {
    Pools P(s.page_size, s.head_dim, n_host, n_dev, 1000 + static_cast<uint64_t>(s.head_dim));
    for (const PageMoveDirection dir : {PageMoveDirection::Recall, PageMoveDirection::Evict}) {
      const bool recall = dir == PageMoveDirection::Recall;
      const Tier src = recall ? Tier::Host : Tier::Device, dst = recall ? Tier::Device : Tier::Host;
      const int64_t n_src = recall ? n_host : n_dev, n_dst = recall ? n_dev : n_host;
      struct Case {
        std::string name;
        std::vector<PageMove> moves;
      };
      std::vector<Case> cases;
      cases.push_back({"0 moves", {}});
      cases.push_back({"1 move, last slots", {PageMove{PageRef{src, static_cast<int32_t>(n_src - 1)},
                                                       PageRef{dst, static_cast<int32_t>(n_dst - 1)}}}});
      cases.push_back({std::to_string(n_many) + " scattered", make_moves(n_many, src, n_src, dst, n_dst, Layout::Scattered, rng)});
      cases.push_back({std::to_string(n_many) + " in runs", make_moves(n_many, src, n_src, dst, n_dst, Layout::Runs, rng)});
      for (const Case& c : cases)
        for (const Form form : {Form::Kernel, Form::PerRun, Form::Batch}) {
          // The kernel at several grid sizes on the long lists (1 block: every step of one block;
          // 132: more blocks than steps), at the default on the short ones.
          std::vector<int> blocks = {dc::kPageMoveBlocks};
          if (form == Form::Kernel && c.moves.size() > 1) blocks = quick() ? std::vector<int>{1, 8} : std::vector<int>{1, 3, 8, 132};
          if (form != Form::Kernel) blocks = {0};
          for (const int nb : blocks) {
            const std::string what = std::string(recall ? "recall" : "evict") + ", page " + std::to_string(s.page_size) +
                                     " x " + std::to_string(s.head_dim) + ", " + c.name + ", " + form_name(form) +
                                     (form == Form::Kernel ? ", " + std::to_string(nb) + " blocks" : "");
            run_case(P, dir, form, nb, c.moves, what);
          }
        }
    }
  }
}

// One launch captured in a graph (a recall, then an evict), replayed after the pairs and the
// count were rewritten on the device: each replay equals the statement of the moves written then.
TEST(PageRecall, GraphReplayReadsTheCountAndPairsWrittenBeforeIt) {
  if (dc::device_count() == 0) GTEST_SKIP() << "no GPU";
  const int64_t n_host = 1201, n_dev = 777;
  Pools P(16, 128, n_host, n_dev, 77);
  P.randomize();
  std::mt19937 rng(5);
  dc::DeviceMoveList rl(600, PageMoveDirection::Recall), el(600, PageMoveDirection::Evict);
  auto apply = [&](const std::vector<PageMove>& r, const std::vector<PageMove>& e) {
    dhs::copy_pages(P.host_m.pool, P.dev_m.pool, r);
    dhs::copy_pages(P.dev_m.pool, P.host_m.pool, e);
  };
  std::vector<PageMove> r = make_moves(300, Tier::Host, n_host, Tier::Device, n_dev, Layout::Scattered, rng);
  std::vector<PageMove> e = make_moves(200, Tier::Device, n_dev, Tier::Host, n_host, Layout::Runs, rng);
  rl.upload(r);
  el.upload(e);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  DHS_CUDA_CHECK(cudaStreamBeginCapture(P.stream, cudaStreamCaptureModeThreadLocal));
  dc::recall_pages(rl, P.host, P.dev, P.stream, 8);
  dc::evict_pages(el, P.dev, P.host, P.stream, 4);
  DHS_CUDA_CHECK(cudaStreamEndCapture(P.stream, &graph));
  DHS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  DHS_CUDA_CHECK(cudaGraphLaunch(exec, P.stream));
  apply(r, e);
  P.expect_equal("graph replay 1 (300 recalls, 200 evictions)");

  // More moves than captured, in runs, and fewer evictions, scattered.
  r = make_moves(577, Tier::Host, n_host, Tier::Device, n_dev, Layout::Runs, rng);
  e = make_moves(31, Tier::Device, n_dev, Tier::Host, n_host, Layout::Scattered, rng);
  rl.upload(r);
  el.upload(e);
  DHS_CUDA_CHECK(cudaGraphLaunch(exec, P.stream));
  apply(r, e);
  P.expect_equal("graph replay 2 (577 recalls, 31 evictions)");

  // Counts written in stream order just before the replay (as a step's kernel would): the first
  // 123 recalls of new pairs, no evictions.
  r = make_moves(500, Tier::Host, n_host, Tier::Device, n_dev, Layout::Scattered, rng);
  rl.upload(r);
  const int32_t counts[2] = {123, 0};
  DHS_CUDA_CHECK(cudaMemcpyAsync(rl.count_d(), &counts[0], 4, cudaMemcpyHostToDevice, P.stream));
  DHS_CUDA_CHECK(cudaMemcpyAsync(el.count_d(), &counts[1], 4, cudaMemcpyHostToDevice, P.stream));
  DHS_CUDA_CHECK(cudaGraphLaunch(exec, P.stream));
  r.resize(123);
  apply(r, {});
  P.expect_equal("graph replay 3 (123 of 500 recalls, 0 evictions)");

  DHS_CUDA_CHECK(cudaGraphExecDestroy(exec));
  DHS_CUDA_CHECK(cudaGraphDestroy(graph));
}

// The kernel through its launcher between guard pages (each pool one page inside a larger
// buffer): moves naming slots outside the pools are skipped and counted, the count is clamped to
// the capacity (and a negative count moves nothing), the guard pages stay as they were.
TEST(PageRecall, KernelStaysInsideItsPoolsAndSkipsBadSlots) {
  if (dc::device_count() == 0) GTEST_SKIP() << "no GPU";
  const int ps = 16, hd = 128;
  const int64_t n_src = 203, n_dst = 151;
  const size_t pe = static_cast<size_t>(ps) * hd;
  dc::DevicePagePool src(n_src + 2, ps, hd), dst(n_dst + 2, ps, hd);  // pages 0 and n + 1: guards
  dhs::PagePool src_m(Tier::Host, n_src + 2, ps, hd), dst_m(Tier::Device, n_dst + 2, ps, hd);
  {
    std::vector<PageRef> refs;
    src_m.allocate(n_src + 2, &refs);
    dst_m.allocate(n_dst + 2, &refs);
  }
  uint64_t state = 99;
  auto fill = [&](dc::DevicePagePool& d, dhs::PagePool& m) {
    std::vector<uint16_t> k(static_cast<size_t>(d.n_pages()) * pe), v(k.size());
    fill_bits(k, state);
    fill_bits(v, state);
    DHS_CUDA_CHECK(cudaMemcpy(d.k_d(), k.data(), k.size() * 2, cudaMemcpyHostToDevice));
    DHS_CUDA_CHECK(cudaMemcpy(d.v_d(), v.data(), v.size() * 2, cudaMemcpyHostToDevice));
    float* kf = m.k_page(PageRef{m.tier(), 0});
    float* vf = m.v_page(PageRef{m.tier(), 0});
    for (size_t i = 0; i < k.size(); ++i) {
      kf[i] = k[i];
      vf[i] = v[i];
    }
  };
  fill(src, src_m);
  fill(dst, dst_m);
  // Pool slots are buffer pages + 1. Valid moves (the first and last slots of each pool among
  // them) and bad ones, interleaved.
  std::mt19937 rng(3);
  std::vector<int32_t> dst_slots(static_cast<size_t>(n_dst));
  std::iota(dst_slots.begin(), dst_slots.end(), 0);
  std::shuffle(dst_slots.begin(), dst_slots.end(), rng);
  std::vector<std::pair<int32_t, int32_t>> pairs = {{0, static_cast<int32_t>(n_dst - 1)},
                                                    {static_cast<int32_t>(n_src - 1), 0}};
  const std::pair<int32_t, int32_t> bad[] = {{-1, 5},   {5, -1}, {static_cast<int32_t>(n_src), 6}, {7, static_cast<int32_t>(n_dst)},
                                             {INT_MIN, 8}, {9, INT_MAX}};
  int n_bad_want = 0;
  for (size_t i = 0; i < 100; ++i) {
    const int32_t d = dst_slots[i];
    if (d == 0 || d == n_dst - 1) continue;
    pairs.push_back({static_cast<int32_t>(rng() % n_src), d});
    if (i % 15 == 0) {
      pairs.push_back(bad[(i / 15) % 6]);
      ++n_bad_want;
    }
  }
  const int n_listed = static_cast<int>(pairs.size());
  std::vector<int32_t> flat;
  for (const auto& [s, d] : pairs) {
    flat.push_back(s);
    flat.push_back(d);
  }
  int32_t* moves_d = dhs::test::to_device(flat);
  int32_t* count_d = dhs::test::to_device(std::vector<int32_t>{n_listed + 1000});  // past the capacity
  int32_t* n_bad_d = dhs::test::to_device(std::vector<int32_t>{0});
  dc::PageMoveParams p;
  p.moves = moves_d;
  p.n_moves = count_d;
  p.src_k = src.k_d() + pe;  // slot 0 = buffer page 1
  p.src_v = src.v_d() + pe;
  p.dst_k = dst.k_d() + pe;
  p.dst_v = dst.v_d() + pe;
  p.n_bad = n_bad_d;
  p.max_moves = n_listed;
  p.n_src_pages = n_src;
  p.n_dst_pages = n_dst;
  p.page_words = static_cast<int>(pe / 8);
  for (const int nb : {1, 5, 64}) {
    DHS_CUDA_CHECK(cudaMemset(n_bad_d, 0, 4));
    dc::launch_page_move(p, nb, nullptr);
    DHS_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(dhs::test::to_host(n_bad_d, 1)[0], n_bad_want) << nb << " blocks: bad moves counted";
  }
  // The statement: the valid moves, in buffer pages (slot + 1); repeating them changes nothing
  // more (sources and destinations are distinct pools).
  std::vector<PageMove> valid;
  for (const auto& [s, d] : pairs)
    if (s >= 0 && s < n_src && d >= 0 && d < n_dst) valid.push_back({PageRef{Tier::Host, s + 1}, PageRef{Tier::Device, d + 1}});
  dhs::copy_pages(src_m, dst_m, valid);
  // A negative count moves nothing.
  DHS_CUDA_CHECK(cudaMemcpy(count_d, std::vector<int32_t>{-5}.data(), 4, cudaMemcpyHostToDevice));
  DHS_CUDA_CHECK(cudaMemset(n_bad_d, 0, 4));
  DHS_CUDA_CHECK(cudaMemset(src.k_d() + pe, 0xff, pe * 2));  // a different source for slot 0
  dc::launch_page_move(p, 8, nullptr);
  DHS_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(dhs::test::to_host(n_bad_d, 1)[0], 0) << "negative count";
  {
    float* kf = src_m.k_page(PageRef{Tier::Host, 1});
    for (size_t i = 0; i < pe; ++i) kf[i] = 0xffff;
  }
  for (int kv = 0; kv < 2; ++kv) {
    const size_t n = static_cast<size_t>(n_dst + 2) * pe;
    const auto got = dhs::test::to_host(reinterpret_cast<const uint16_t*>(kv == 0 ? dst.k_d() : dst.v_d()), n);
    const float* f = kv == 0 ? dst_m.k_page(PageRef{Tier::Device, 0}) : dst_m.v_page(PageRef{Tier::Device, 0});
    std::vector<uint16_t> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = static_cast<uint16_t>(f[i]);
    std::string d = diff_pages(got, want, pe, "destination with guard pages", kv);
    EXPECT_TRUE(d.empty()) << d;
    const size_t ns = static_cast<size_t>(n_src + 2) * pe;
    const auto got_src = dhs::test::to_host(reinterpret_cast<const uint16_t*>(kv == 0 ? src.k_d() : src.v_d()), ns);
    const float* fs = kv == 0 ? src_m.k_page(PageRef{Tier::Host, 0}) : src_m.v_page(PageRef{Tier::Host, 0});
    std::vector<uint16_t> want_src(ns);
    for (size_t i = 0; i < ns; ++i) want_src[i] = static_cast<uint16_t>(fs[i]);
    d = diff_pages(got_src, want_src, pe, "source with guard pages", kv);
    EXPECT_TRUE(d.empty()) << d;
  }
  cudaFree(moves_d);
  cudaFree(count_d);
  cudaFree(n_bad_d);
}

// The ops refuse a list of the other direction, pools of different page shapes, a grid of no
// blocks and the batch form on the legacy null stream; and a capacity-0 list moves nothing.
TEST(PageRecall, OpsRefuseWhatTheyCannotDo) {
  if (dc::device_count() == 0) GTEST_SKIP() << "no GPU";
  dc::HostPagePool host(40, 16, 128), host64(40, 16, 64);
  dc::DevicePagePool dev(30, 16, 128);
  dc::DeviceMoveList rl(8, PageMoveDirection::Recall), el(8, PageMoveDirection::Evict), empty(0, PageMoveDirection::Recall);
  auto throws = [](auto&& f) {
    try {
      f();
    } catch (const dhs::Error&) {
      return true;
    }
    return false;
  };
  EXPECT_TRUE(throws([&] { dc::recall_pages(el, host, dev, nullptr); })) << "evict list given to recall";
  EXPECT_TRUE(throws([&] { dc::evict_pages(rl, dev, host, nullptr); })) << "recall list given to evict";
  EXPECT_TRUE(throws([&] { dc::recall_pages(rl, host64, dev, nullptr); })) << "page shapes differ";
  EXPECT_TRUE(throws([&] { dc::recall_pages(rl, host, dev, nullptr, 0); })) << "0 blocks";
  const std::vector<PageMove> one = {{PageRef{Tier::Host, 1}, PageRef{Tier::Device, 2}}};
  EXPECT_TRUE(throws([&] { dc::recall_pages_copy_engine(one, host, dev, dc::CopyEngineForm::Batch, nullptr); }))
      << "batch form on the legacy stream";
  const std::vector<PageMove> wrong_tier = {{PageRef{Tier::Device, 1}, PageRef{Tier::Device, 2}}};
  EXPECT_TRUE(throws([&] { rl.upload(wrong_tier); })) << "device -> device move in a recall list";
  const std::vector<PageMove> out_of_range = {{PageRef{Tier::Host, 40}, PageRef{Tier::Device, 2}}};
  EXPECT_TRUE(throws([&] { dc::recall_pages_copy_engine(out_of_range, host, dev, dc::CopyEngineForm::PerRun, nullptr); }))
      << "copy engine: slot outside the host tier";
  EXPECT_TRUE(throws([&] { rl.upload(std::vector<PageMove>(9, one[0])); })) << "more moves than the capacity";
  EXPECT_FALSE(throws([&] {
    dc::recall_pages(empty, host, dev, nullptr);
    DHS_CUDA_CHECK(cudaDeviceSynchronize());
  })) << "capacity 0";
}

// The host-side form (host_gather.h): scattered host pages (repeats included) into a run of
// device slots from dst_first, over several staging chunks (a partial last one), 1 and 3 threads:
// every device page equal bit for bit to what it should hold — the moved host page inside the
// run, its old bits outside — and slots outside the pools refused.
TEST(PageRecall, HostGatherEqualsTheCpuStatement) {
  if (dc::device_count() == 0) GTEST_SKIP() << "no GPU";
  uint64_t state = 77;
  for (const int head_dim : {128, 64}) {
    const int64_t n_host = 1013, n_dev = 701;
    dc::HostPagePool host(n_host, 16, head_dim);
    dc::DevicePagePool dev(n_dev, 16, head_dim);
    const size_t pe = host.page_elems();
    std::vector<uint16_t> hk(static_cast<size_t>(n_host) * pe), hv(hk.size()), dk(static_cast<size_t>(n_dev) * pe), dv(dk.size());
    fill_bits(hk, state);
    fill_bits(hv, state);
    std::memcpy(host.k_h(), hk.data(), hk.size() * 2);
    std::memcpy(host.v_h(), hv.data(), hv.size() * 2);
    for (const int threads : {1, 3}) {
      fill_bits(dk, state);
      fill_bits(dv, state);
      DHS_CUDA_CHECK(cudaMemcpy(dev.k_d(), dk.data(), dk.size() * 2, cudaMemcpyHostToDevice));
      DHS_CUDA_CHECK(cudaMemcpy(dev.v_d(), dv.data(), dv.size() * 2, cudaMemcpyHostToDevice));
      std::mt19937 rng(static_cast<uint32_t>(threads + head_dim));
      std::vector<int32_t> src(333);
      for (int32_t& x : src) x = static_cast<int32_t>(rng() % n_host);
      const int64_t first = 101;
      dc::HostGatherRecall g(16, head_dim, /*chunk_pages=*/50, threads);
      cudaStream_t s;
      DHS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      // A first recall into other slots, not waited for: the second reuses the staging buffers
      // only after its copies (and its pages are then overwritten where the runs overlap).
      const std::vector<int32_t> before(src.rbegin(), src.rbegin() + 120);
      g.recall(host, before, dev, first + 40, s);
      g.recall(host, src, dev, first, s);
      DHS_CUDA_CHECK(cudaStreamSynchronize(s));
      for (size_t i = 0; i < before.size(); ++i) {  // the first recall's pages past the second's run
        const size_t d = static_cast<size_t>(first + 40) + i;
        if (d < static_cast<size_t>(first) + src.size()) continue;
        std::copy_n(hk.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(before[i]) * pe), pe, dk.begin() + static_cast<std::ptrdiff_t>(d * pe));
        std::copy_n(hv.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(before[i]) * pe), pe, dv.begin() + static_cast<std::ptrdiff_t>(d * pe));
      }
      DHS_CUDA_CHECK(cudaStreamDestroy(s));
      for (size_t i = 0; i < src.size(); ++i) {
        const size_t d = static_cast<size_t>(first) + i;
        std::copy_n(hk.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(src[i]) * pe), pe, dk.begin() + static_cast<std::ptrdiff_t>(d * pe));
        std::copy_n(hv.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(src[i]) * pe), pe, dv.begin() + static_cast<std::ptrdiff_t>(d * pe));
      }
      std::vector<uint16_t> gk(dk.size()), gv(dv.size());
      DHS_CUDA_CHECK(cudaMemcpy(gk.data(), dev.k_d(), gk.size() * 2, cudaMemcpyDeviceToHost));
      DHS_CUDA_CHECK(cudaMemcpy(gv.data(), dev.v_d(), gv.size() * 2, cudaMemcpyDeviceToHost));
      ASSERT_TRUE(gk == dk) << "K, head_dim " << head_dim << ", " << threads << " threads";
      ASSERT_TRUE(gv == dv) << "V, head_dim " << head_dim << ", " << threads << " threads";
      auto throws = [&](std::vector<int32_t> bad, int64_t at) {
        try {
          g.recall(host, bad, dev, at, nullptr);
        } catch (const dhs::Error&) {
          return true;
        }
        return false;
      };
      EXPECT_TRUE(throws({static_cast<int32_t>(n_host)}, 0)) << "host slot past the tier";
      EXPECT_TRUE(throws({-1}, 0)) << "negative host slot";
      EXPECT_TRUE(throws({0, 1}, n_dev - 1)) << "device run past the pool";
    }
  }
}

}  // namespace
