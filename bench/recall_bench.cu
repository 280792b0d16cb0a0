// The KV hierarchy's I/O engine (backend/cuda/page_recall.h) on the 8B shape's head-pages (page 16
// x head_dim 128 f16: 4 KiB of K and 4 KiB of V), host tier of --host-gib GiB in pinned mapped
// DRAM, HBM pool beside it. In one process, each with warm-up and cudaEvent timing, median of reps:
//   a. the bulk PCIe anchor: one cudaMemcpyAsync of --bulk-gib GiB, host -> device and back;
//   b. recall of --moves random scattered pages (and the same in runs of 64 consecutive slots) by
//      the move kernel at each --blocks, and by the copy-engine forms (cudaMemcpyAsync per run,
//      cudaMemcpyBatchAsync);
//   c. interference: decode attention (8B shape, --attn-batch x --attn-ctx, dense lists over a
//      shuffled pool) in a loop of ~--attn-ms alone, then with recalls repeated on a second stream
//      over the whole loop: attention's bandwidth alone and beside, the recall's GB/s meanwhile;
//   d. evict (device -> host) of as many scattered pages, kernel and copy-engine forms;
//   e. the recall-ahead schedule's in-step read (tier_split.h): decode attention (--attn-batch
//      requests, 8 KV heads, GQA 32/8) over lists of --late-lists scattered pages each, read in
//      place from the host tier's mapped pages, and the same lists over the HBM pool.
// One JSON object per measurement on stdout and appended to --out (JSON lines). GB/s = 1e9 B/s.
//
//   recall_bench [--out F.jsonl] [--host-gib 8] [--moves 65536] [--reps 5] [--blocks 2,4,..]
//                [--beside-blocks 4,8,16,32] [--attn-batch 4] [--attn-ctx 131072] [--attn-ms 40]
//   (commit from $DHS_COMMIT or --commit)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/decode_attention.h"
#include "backend/cuda/device_page_pool.h"
#include "backend/cuda/host_gather.h"
#include "backend/cuda/page_recall.h"
#include "dhisparse/error.h"
#include "kv/page_lists.h"
#include "kv/tier_copy.h"

namespace {

namespace dc = dhs::cuda;
using dhs::PageMove;
using dhs::PageRef;
using dhs::Tier;

constexpr int kPage = 16, kD = 128, kHq = 32, kHkv = 8;
constexpr size_t kHalfPageBytes = size_t{kPage} * kD * 2;  // 4 KiB: K (or V) of one head-page
constexpr size_t kPageBytes = 2 * kHalfPageBytes;          // K + V

// Fills n 16-byte words with a counter hash (the host tier through its mapped pointer: 8 GiB
// cross PCIe in a fraction of a second, where a host memset takes seconds).
__global__ void fill_words_kernel(uint4* x, size_t n, uint64_t seed) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint64_t z = seed + i * 0x9e3779b97f4a7c15ull;  // splitmix64
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    x[i] = make_uint4(static_cast<uint32_t>(z), static_cast<uint32_t>(z >> 32), static_cast<uint32_t>(i),
                      static_cast<uint32_t>(seed));
  }
}

struct Options {
  std::string out, commit;
  double host_gib = 8.0, bulk_gib = 1.0;
  int moves = 65536;
  int beside_moves = 16384;  // per recall launch beside attention (128 MiB): several per attention loop
  int reps = 5, ce_reps = 3;  // copy-engine forms: ~0.4 s a rep at 1.4 GB/s
  std::vector<int> blocks = {2, 4, 8, 16, 32, 64, 132};
  std::vector<int> beside_blocks = {4, 8, 16, 32};
  std::vector<int> gather_threads = {4, 8, 16};  // host_gather.h: CPU gather threads
  int gather_chunk = 2048;                       // pages per staging buffer (16 MiB of K + V)
  bool only_gather = false;                      // the bulk anchor and the host form only
  bool only_late = false;                        // the bulk anchor and e. only
  int attn_batch = 4, attn_ctx = 131072;
  double attn_ms = 40.0;
  std::vector<int> late_lists = {16, 64, 256, 1024};  // e. late pages per (request, KV head) list
};

std::vector<int> int_list(const std::string& v) {
  std::vector<int> out;
  for (size_t p = 0; p <= v.size();) {
    const size_t c = std::min(v.find(',', p), v.size());
    if (c > p) out.push_back(std::stoi(v.substr(p, c - p)));
    p = c + 1;
  }
  return out;
}

struct Timing {
  double median_us = 0;
  std::vector<double> samples_us;
};

double ms_between(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  DHS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

// Median over reps of what `launch` enqueues on `s`, events around each, after `warmup` untimed runs.
Timing time_events(const std::function<void()>& launch, cudaStream_t s, int reps, int warmup = 1) {
  for (int i = 0; i < warmup; ++i) launch();
  std::vector<cudaEvent_t> ev(static_cast<size_t>(2 * reps));
  for (auto& e : ev) DHS_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    DHS_CUDA_CHECK(cudaEventRecord(ev[static_cast<size_t>(2 * i)], s));
    launch();
    DHS_CUDA_CHECK(cudaEventRecord(ev[static_cast<size_t>(2 * i + 1)], s));
  }
  DHS_CUDA_CHECK(cudaStreamSynchronize(s));
  Timing t;
  for (int i = 0; i < reps; ++i)
    t.samples_us.push_back(1e3 * ms_between(ev[static_cast<size_t>(2 * i)], ev[static_cast<size_t>(2 * i + 1)]));
  for (auto& e : ev) DHS_CUDA_CHECK(cudaEventDestroy(e));
  std::vector<double> sorted = t.samples_us;
  std::sort(sorted.begin(), sorted.end());
  t.median_us = sorted[sorted.size() / 2];
  return t;
}

// k distinct values of [0, n) in random order.
std::vector<int32_t> distinct(int64_t n, int64_t k, std::mt19937_64& rng) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  for (int64_t i = 0; i < k; ++i) std::swap(v[static_cast<size_t>(i)], v[static_cast<size_t>(i + rng() % (n - i))]);
  v.resize(static_cast<size_t>(k));
  return v;
}

// n moves src -> dst: scattered (run 1: distinct random slots both sides) or in runs of `run`
// consecutive slots on both sides (runs at distinct random run-aligned places).
std::vector<PageMove> make_moves(int n, Tier src_tier, int64_t n_src, Tier dst_tier, int64_t n_dst, int run,
                                 std::mt19937_64& rng) {
  const int64_t n_runs = (n + run - 1) / run;
  const std::vector<int32_t> s = distinct(n_src / run, n_runs, rng), d = distinct(n_dst / run, n_runs, rng);
  std::vector<PageMove> moves;
  moves.reserve(static_cast<size_t>(n));
  for (int64_t r = 0; r < n_runs; ++r)
    for (int i = 0; i < run && static_cast<int>(moves.size()) < n; ++i)
      moves.push_back({PageRef{src_tier, s[static_cast<size_t>(r)] * run + i}, PageRef{dst_tier, d[static_cast<size_t>(r)] * run + i}});
  return moves;
}

// A decode attention step of the 8B shape (batch x ctx, dense lists over a shuffled pool), the
// HBM-bound kernel the recall must run beside.
struct Attention {
  int batch, ctx;
  int64_t n_pages;
  dc::DevicePagePool pool;
  dc::DevicePageLists lists;
  dc::DecodeAttentionWorkspace ws;
  __half* q_d = nullptr;    // [batch, kHq, kD]
  __half* out_d = nullptr;  // [batch, kHq, kD]
  int32_t* q_indptr_d = nullptr;  // [batch + 1]
  dc::DecodeAttentionArgs args;

  Attention(int batch_, int ctx_, std::mt19937_64& rng, cudaStream_t s)
      : batch(batch_), ctx(ctx_), n_pages(int64_t{batch_} * kHkv * (ctx_ / kPage)), pool(n_pages, kPage, kD),
        lists(batch_, kHkv, n_pages), ws(batch_, kHq, kHkv, kD, 1) {
    pool.fill_random(5, -1.0f, 1.0f, s);
    std::vector<int32_t> perm(static_cast<size_t>(n_pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    dhs::PageLists L;
    L.n_requests = batch;
    L.n_heads_kv = kHkv;
    L.seq_len.assign(static_cast<size_t>(batch), ctx);
    L.indptr.push_back(0);
    const int n_pg = ctx / kPage;
    for (int r = 0; r < batch; ++r)
      for (int h = 0; h < kHkv; ++h) {
        for (int i = 0; i < n_pg; ++i) {
          L.slots.push_back(perm[static_cast<size_t>(r * kHkv + h) * n_pg + static_cast<size_t>(i)]);
          L.page_pos.push_back(i);
        }
        L.indptr.push_back(static_cast<int32_t>(L.slots.size()));
      }
    lists.upload(L);
    DHS_CUDA_CHECK(cudaMalloc(&q_d, static_cast<size_t>(batch) * kHq * kD * 2));
    DHS_CUDA_CHECK(cudaMalloc(&out_d, static_cast<size_t>(batch) * kHq * kD * 2));
    DHS_CUDA_CHECK(cudaMalloc(&q_indptr_d, static_cast<size_t>(batch + 1) * 4));
    dc::fill_random_f16(q_d, static_cast<size_t>(batch) * kHq * kD, 7, -3.0f, 3.0f, s);
    std::vector<int32_t> qi(static_cast<size_t>(batch + 1));
    std::iota(qi.begin(), qi.end(), 0);
    DHS_CUDA_CHECK(cudaMemcpy(q_indptr_d, qi.data(), qi.size() * 4, cudaMemcpyHostToDevice));
    args.q_d = q_d;
    args.q_indptr_d = q_indptr_d;
    args.out_d = out_d;
    args.scale = 1.0f / std::sqrt(static_cast<float>(kD));
    DHS_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~Attention() {
    cudaFree(q_d);
    cudaFree(out_d);
    cudaFree(q_indptr_d);
  }
  double bytes() const { return static_cast<double>(n_pages) * kPageBytes; }  // a call reads every page's K and V
  void run(int n_calls, cudaStream_t s) {
    for (int i = 0; i < n_calls; ++i) dc::decode_attention(args, lists, pool, ws, s);
  }
};

struct Bench {
  Options opt;
  std::string device;
  int n_sm = 0;
  FILE* out = nullptr;
  cudaStream_t s = nullptr;
  std::unique_ptr<dc::HostPagePool> host;  // the host tier: K + V of n_host pages
  std::unique_ptr<dc::DevicePagePool> dev;  // the HBM pool the moves land in / leave from
  int64_t n_host = 0, n_dev = 0;
  double bulk_h2d_gb_s = 0, bulk_d2h_gb_s = 0;
  std::vector<double> recall_gb_s_by_blocks = std::vector<double>(1025, 0.0);  // kernel, scattered, alone
  std::mt19937_64 rng{42};

  // One JSON line to stdout and --out: the common fields, then `fields` (",\"k\":v,...").
  void emit(const char* form, const char* direction, int blocks, int64_t pages, double bytes, const Timing& t,
            const std::string& fields) {
    std::string samples;
    for (size_t i = 0; i < t.samples_us.size(); ++i) {
      char v[32];
      std::snprintf(v, sizeof v, "%s%.1f", i ? "," : "", t.samples_us[i]);
      samples += v;
    }
    char head[640];
    std::snprintf(head, sizeof head,
                  "{\"bench\":\"page_recall\",\"commit\":\"%s\",\"device\":\"%s\",\"form\":\"%s\",\"direction\":\"%s\","
                  "\"blocks\":%d,\"pages\":%lld,\"bytes\":%.0f,\"gb_s\":%.2f,\"us\":%.1f,\"page_size\":%d,\"head_dim\":%d,"
                  "\"host_gib\":%.2f",
                  opt.commit.c_str(), device.c_str(), form, direction, blocks, static_cast<long long>(pages), bytes,
                  t.median_us > 0 ? bytes / t.median_us / 1e3 : 0.0, t.median_us, kPage, kD,
                  static_cast<double>(host->bytes()) / static_cast<double>(size_t{1} << 30));
    const std::string line = std::string(head) + fields + ",\"samples_us\":[" + samples + "]}\n";
    std::fputs(line.c_str(), stdout);
    std::fflush(stdout);
    if (out != nullptr) {
      std::fputs(line.c_str(), out);
      std::fflush(out);
    }
  }

  // The 64 moves `check` looks at (the same each time).
  static std::vector<PageMove> sample(const std::vector<PageMove>& moves) {
    std::mt19937 pick(17);
    std::vector<PageMove> out;
    for (int c = 0; c < 64 && !moves.empty(); ++c) out.push_back(moves[pick() % moves.size()]);
    return out;
  }
  // The sample's destination pages zeroed (in stream order on s): the check after a form then sees
  // that form's copies, not an earlier form's.
  void clear_sample(const std::vector<PageMove>& moves, bool recall) {
    DHS_CUDA_CHECK(cudaStreamSynchronize(s));
    const size_t pe = kHalfPageBytes / 2;
    for (const PageMove& m : sample(moves))
      for (int kv = 0; kv < 2; ++kv) {
        if (recall) {
          __half* d = (kv == 0 ? dev->k_d() : dev->v_d()) + static_cast<size_t>(m.dst.slot) * pe;
          DHS_CUDA_CHECK(cudaMemsetAsync(d, 0, kHalfPageBytes, s));
        } else {
          std::memset((kv == 0 ? host->k_h() : host->v_h()) + static_cast<size_t>(m.dst.slot) * pe, 0, kHalfPageBytes);
        }
      }
  }
  // K and V of the sample's moves equal in their two pools (after a sync): the rows measure
  // copies that happened. Exits on a difference.
  void check(const std::vector<PageMove>& moves, bool recall, const std::string& what) {
    DHS_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint8_t> page(kHalfPageBytes);
    const size_t pe = kHalfPageBytes / 2;
    for (const PageMove& m : sample(moves)) {
      const int32_t dev_slot = recall ? m.dst.slot : m.src.slot, host_slot = recall ? m.src.slot : m.dst.slot;
      for (int kv = 0; kv < 2; ++kv) {
        const __half* d = (kv == 0 ? dev->k_d() : dev->v_d()) + static_cast<size_t>(dev_slot) * pe;
        const __half* h = (kv == 0 ? host->k_h() : host->v_h()) + static_cast<size_t>(host_slot) * pe;
        DHS_CUDA_CHECK(cudaMemcpy(page.data(), d, kHalfPageBytes, cudaMemcpyDeviceToHost));
        if (std::memcmp(page.data(), h, kHalfPageBytes) != 0) {
          std::fprintf(stderr, "CHECK FAILED: %s, move %d -> %d, %s page differs\n", what.c_str(), m.src.slot,
                       m.dst.slot, kv == 0 ? "K" : "V");
          std::exit(1);
        }
      }
    }
  }

  // The host tier (--host-gib, halved until the pinned allocation succeeds; filled from the
  // device through its mapped pointers) and the device pool.
  bool setup() {
    for (double gib = opt.host_gib;; gib /= 2) {
      try {
        host = std::make_unique<dc::HostPagePool>(
            static_cast<int64_t>(gib * static_cast<double>(size_t{1} << 30) / kPageBytes), kPage, kD);
        break;
      } catch (const dhs::Error& e) {
        std::printf("# %s\n", e.what());
        if (gib / 2 < 1.0) return false;
      }
    }
    n_host = host->n_pages();
    const size_t words = static_cast<size_t>(n_host) * kHalfPageBytes / 16;
    fill_words_kernel<<<n_sm * 4, 256, 0, s>>>(reinterpret_cast<uint4*>(host->k_d()), words, 1);
    fill_words_kernel<<<n_sm * 4, 256, 0, s>>>(reinterpret_cast<uint4*>(host->v_d()), words, 2);
    DHS_CUDA_CHECK(cudaGetLastError());
    // Room for every move's destination (twice: scattered over a larger pool) and the bulk copy's K.
    n_dev = std::max<int64_t>(2 * static_cast<int64_t>(opt.moves),
                              static_cast<int64_t>(std::ceil(opt.bulk_gib * static_cast<double>(size_t{1} << 30) /
                                                             kHalfPageBytes)));
    dev = std::make_unique<dc::DevicePagePool>(n_dev, kPage, kD);
    dev->fill_random(3, -1.0f, 1.0f, s);
    DHS_CUDA_CHECK(cudaStreamSynchronize(s));
    return true;
  }

  // a. One cudaMemcpyAsync of --bulk-gib, host -> device, then the same bytes back.
  void bulk() {
    const size_t bytes = std::min({static_cast<size_t>(opt.bulk_gib * static_cast<double>(size_t{1} << 30)),
                                   static_cast<size_t>(n_dev) * kHalfPageBytes, static_cast<size_t>(n_host) * kHalfPageBytes});
    const Timing h2d = time_events([&] {
      DHS_CUDA_CHECK(cudaMemcpyAsync(dev->k_d(), host->k_h(), bytes, cudaMemcpyHostToDevice, s));
    }, s, opt.reps);
    const Timing d2h = time_events([&] {  // the bytes just copied, back: the host tier is unchanged
      DHS_CUDA_CHECK(cudaMemcpyAsync(host->k_h(), dev->k_d(), bytes, cudaMemcpyDeviceToHost, s));
    }, s, opt.reps);
    bulk_h2d_gb_s = static_cast<double>(bytes) / h2d.median_us / 1e3;
    bulk_d2h_gb_s = static_cast<double>(bytes) / d2h.median_us / 1e3;
    const int64_t pages = static_cast<int64_t>(bytes / kPageBytes);
    emit("bulk", "recall", 0, pages, static_cast<double>(bytes), h2d, ",\"layout\":\"contiguous\",\"of_bulk\":1.000");
    emit("bulk", "evict", 0, pages, static_cast<double>(bytes), d2h, ",\"layout\":\"contiguous\",\"of_bulk\":1.000");
  }

  // b and d. The moves by the kernel at each grid size, then by both copy-engine forms; each
  // checked on a sample. `layout` names the moves' shape in the rows.
  void moves_by_form(const std::vector<PageMove>& moves, bool recall, const char* layout, const std::vector<int>& blocks) {
    const char* direction = recall ? "recall" : "evict";
    const double bytes = static_cast<double>(moves.size()) * kPageBytes;
    const double bulk_gb_s = recall ? bulk_h2d_gb_s : bulk_d2h_gb_s;
    const int64_t n_runs = static_cast<int64_t>(
        (recall ? dc::coalesce_page_moves(moves, Tier::Host, n_host, Tier::Device, n_dev)
                : dc::coalesce_page_moves(moves, Tier::Device, n_dev, Tier::Host, n_host)).size());
    auto fields = [&](double gb_s) {
      char f[160];
      std::snprintf(f, sizeof f, ",\"layout\":\"%s\",\"runs\":%lld,\"of_bulk\":%.3f", layout, static_cast<long long>(n_runs),
                    gb_s / bulk_gb_s);
      return std::string(f);
    };
    dc::DeviceMoveList list(static_cast<int>(moves.size()),
                            recall ? dc::PageMoveDirection::Recall : dc::PageMoveDirection::Evict);
    list.upload(moves);
    for (size_t i = 0; i < blocks.size(); ++i) {
      const int nb = blocks[i];
      if (i == 0) clear_sample(moves, recall);
      const Timing t = time_events([&] {
        if (recall)
          dc::recall_pages(list, *host, *dev, s, nb);
        else
          dc::evict_pages(list, *dev, *host, s, nb);
      }, s, opt.reps);
      if (i == 0) check(moves, recall, recall ? "recall kernel" : "evict kernel");
      const double gb_s = bytes / t.median_us / 1e3;
      if (recall && std::strcmp(layout, "scattered") == 0 && nb <= 1024) recall_gb_s_by_blocks[static_cast<size_t>(nb)] = gb_s;
      emit("kernel", direction, nb, static_cast<int64_t>(moves.size()), bytes, t, fields(gb_s));
    }
    for (const auto form : {dc::CopyEngineForm::PerRun, dc::CopyEngineForm::Batch}) {
      const char* name = form == dc::CopyEngineForm::PerRun ? "memcpy" : "memcpy_batch";
      clear_sample(moves, recall);
      try {  // (a runtime without the batch form, or refusing it, costs its row only)
        const Timing t = time_events([&] {
          if (recall)
            dc::recall_pages_copy_engine(moves, *host, *dev, form, s);
          else
            dc::evict_pages_copy_engine(moves, *dev, *host, form, s);
        }, s, opt.ce_reps);
        check(moves, recall, std::string(direction) + " " + name);
        emit(name, direction, 0, static_cast<int64_t>(moves.size()), bytes, t, fields(bytes / t.median_us / 1e3));
      } catch (const dhs::Error& e) {
        std::printf("# %s %s failed: %s\n", direction, name, e.what());
        DHS_CUDA_CHECK(cudaStreamSynchronize(s));
      }
    }
  }

  // e. The host-side form (host_gather.h): CPU threads gather scattered host pages into pinned
  // staging, bulk copies into consecutive device slots. Alone (wall clock of recall() until the
  // stream drains) at each thread count; then beside attention: the attention loop enqueued, the
  // host recalls repeated (events on their stream around each) until the loop's end event.
  void host_gather() {
    const std::vector<PageMove> mv = make_moves(opt.moves, Tier::Host, n_host, Tier::Device, n_dev, 1, rng);
    std::vector<int32_t> src;
    for (const PageMove& m : mv) src.push_back(m.src.slot);
    const int64_t n = static_cast<int64_t>(src.size());
    const double bytes = static_cast<double>(n) * kPageBytes;
    auto check = [&](const char* what) {
      std::vector<char> a(kHalfPageBytes);
      for (int64_t i = 0; i < n; i += std::max<int64_t>(1, n / 64))
        for (int kv = 0; kv < 2; ++kv) {
          const char* d = reinterpret_cast<const char*>(kv ? dev->v_d() : dev->k_d()) + static_cast<size_t>(i) * kHalfPageBytes;
          const char* h = reinterpret_cast<const char*>(kv ? host->v_h() : host->k_h()) +
                          static_cast<size_t>(src[static_cast<size_t>(i)]) * kHalfPageBytes;
          DHS_CUDA_CHECK(cudaMemcpy(a.data(), d, kHalfPageBytes, cudaMemcpyDeviceToHost));
          if (std::memcmp(a.data(), h, kHalfPageBytes) != 0) {
            std::fprintf(stderr, "host gather (%s): move %lld differs\n", what, static_cast<long long>(i));
            std::exit(1);
          }
        }
    };
    for (const int t : opt.gather_threads) {
      dc::HostGatherRecall g(kPage, kD, opt.gather_chunk, t);
      Timing tm;
      for (int r = 0; r < opt.reps + 1; ++r) {
        DHS_CUDA_CHECK(cudaMemsetAsync(dev->k_d(), 0, static_cast<size_t>(n) * kHalfPageBytes, s));
        DHS_CUDA_CHECK(cudaMemsetAsync(dev->v_d(), 0, static_cast<size_t>(n) * kHalfPageBytes, s));
        DHS_CUDA_CHECK(cudaStreamSynchronize(s));
        const auto t0 = std::chrono::steady_clock::now();
        g.recall(*host, src, *dev, 0, s);
        DHS_CUDA_CHECK(cudaStreamSynchronize(s));
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        if (r > 0) tm.samples_us.push_back(us);  // (the first warms the pages and threads)
      }
      check("alone");
      std::vector<double> v = tm.samples_us;
      std::sort(v.begin(), v.end());
      tm.median_us = v[v.size() / 2];
      char f[160];
      std::snprintf(f, sizeof f, ",\"layout\":\"scattered\",\"threads\":%d,\"chunk_pages\":%d,\"of_bulk\":%.3f", t,
                    opt.gather_chunk, bytes / tm.median_us / 1e3 / bulk_h2d_gb_s);
      emit("host_gather", "recall", 0, n, bytes, tm, f);
    }
    // Beside attention.
    const int64_t n_attn = int64_t{opt.attn_batch} * kHkv * (opt.attn_ctx / kPage);
    size_t free_b = 0, total_b = 0;
    DHS_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (static_cast<double>(n_attn) * kPageBytes > static_cast<double>(free_b) - 4e9) return;
    Attention attn(opt.attn_batch, opt.attn_ctx, rng, s);
    cudaStream_t s_attn = nullptr, s_rec = nullptr;
    DHS_CUDA_CHECK(cudaStreamCreateWithFlags(&s_attn, cudaStreamNonBlocking));
    DHS_CUDA_CHECK(cudaStreamCreateWithFlags(&s_rec, cudaStreamNonBlocking));
    const Timing five = time_events([&] { attn.run(5, s_attn); }, s_attn, 3);
    const int n_calls = std::max(5, static_cast<int>(std::ceil(opt.attn_ms * 1e3 / (five.median_us / 5))));
    const std::vector<int32_t> src_rep(src.begin(), src.begin() + std::min<int64_t>(n, opt.beside_moves));
    const double rep_bytes = static_cast<double>(src_rep.size()) * kPageBytes;
    for (const int t : opt.gather_threads) {
      dc::HostGatherRecall g(kPage, kD, opt.gather_chunk, t);
      g.recall(*host, src_rep, *dev, 0, s_rec);  // (warm)
      DHS_CUDA_CHECK(cudaStreamSynchronize(s_rec));
      const Timing alone = time_events([&] { attn.run(n_calls, s_attn); }, s_attn, 1, 0);
      cudaEvent_t a0, a1;
      DHS_CUDA_CHECK(cudaEventCreate(&a0));
      DHS_CUDA_CHECK(cudaEventCreate(&a1));
      std::vector<cudaEvent_t> re;
      auto mark = [&] {
        cudaEvent_t e;
        DHS_CUDA_CHECK(cudaEventCreate(&e));
        DHS_CUDA_CHECK(cudaEventRecord(e, s_rec));
        re.push_back(e);
      };
      mark();
      DHS_CUDA_CHECK(cudaEventRecord(a0, s_attn));
      attn.run(n_calls, s_attn);
      DHS_CUDA_CHECK(cudaEventRecord(a1, s_attn));
      int extra = 2;  // reps past the loop's end: the last one inside is whole
      while (extra > 0) {
        g.recall(*host, src_rep, *dev, 0, s_rec);
        mark();
        if (cudaEventQuery(a1) == cudaSuccess) --extra;
      }
      DHS_CUDA_CHECK(cudaDeviceSynchronize());
      const double beside_ms = ms_between(a0, a1);
      int first = -1, last = -1;
      for (size_t i = 0; i + 1 < re.size(); ++i)
        if (ms_between(a0, re[i]) >= 0 && ms_between(re[i + 1], a1) >= 0) {
          if (first < 0) first = static_cast<int>(i);
          last = static_cast<int>(i);
        }
      const int inside = first < 0 ? 0 : last - first + 1;
      Timing rt;
      if (inside > 0) {
        rt.median_us = 1e3 * ms_between(re[static_cast<size_t>(first)], re[static_cast<size_t>(last + 1)]);
        rt.samples_us.push_back(rt.median_us);
      }
      const double attn_alone = attn.bytes() * n_calls / alone.median_us / 1e3;
      const double attn_beside = attn.bytes() * n_calls / (beside_ms * 1e3) / 1e3;
      char fields[512];
      std::snprintf(fields, sizeof fields,
                    ",\"layout\":\"scattered\",\"threads\":%d,\"chunk_pages\":%d,\"beside\":\"decode_attention\","
                    "\"attn_batch\":%d,\"attn_ctx\":%d,\"attn_calls\":%d,\"attn_gb_s_alone\":%.1f,"
                    "\"attn_gb_s_beside\":%.1f,\"attn_ratio\":%.4f,\"recall_reps\":%d,\"recall_reps_inside\":%d,"
                    "\"covered\":false,\"note\":\"the recalls start just after the loop is enqueued (the first gather)\"",
                    t, opt.gather_chunk, attn.batch, attn.ctx, n_calls, attn_alone, attn_beside, attn_beside / attn_alone,
                    static_cast<int>(re.size()) - 1, inside);
      emit("host_gather", "recall", 0, static_cast<int64_t>(src_rep.size()) * inside, rep_bytes * inside, rt, fields);
      for (auto& e : re) DHS_CUDA_CHECK(cudaEventDestroy(e));
      DHS_CUDA_CHECK(cudaEventDestroy(a0));
      DHS_CUDA_CHECK(cudaEventDestroy(a1));
    }
    DHS_CUDA_CHECK(cudaStreamDestroy(s_attn));
    DHS_CUDA_CHECK(cudaStreamDestroy(s_rec));
  }

  // c. Attention alone for ~--attn-ms, then with recalls on a second stream started before it and
  // repeated past its end; the recalls wholly inside the loop give the recall's rate beside it.
  // nb > 0: the move kernel on nb blocks; nb == 0: one contiguous cudaMemcpyAsync of the same bytes
  // per launch (the copy engine's best case, for reference).
  // e. Decode attention over late pages: lists of n scattered host-tier pages per (request, KV
  // head), read in place through the mapped pointers, against the same lists in HBM.
  void late_attention() {
    const int batch = opt.attn_batch;
    dc::DecodeAttentionWorkspace ws(batch, kHq, kHkv, kD, 1);
    __half *q_d = nullptr, *out_d = nullptr;
    int32_t *q_indptr_d = nullptr, *seq_d = nullptr;
    DHS_CUDA_CHECK(cudaMalloc(&q_d, static_cast<size_t>(batch) * kHq * kD * 2));
    DHS_CUDA_CHECK(cudaMalloc(&out_d, static_cast<size_t>(batch) * kHq * kD * 2));
    DHS_CUDA_CHECK(cudaMalloc(&q_indptr_d, static_cast<size_t>(batch + 1) * 4));
    DHS_CUDA_CHECK(cudaMalloc(&seq_d, static_cast<size_t>(batch) * 4));
    dc::fill_random_f16(q_d, static_cast<size_t>(batch) * kHq * kD, 7, -3.0f, 3.0f, s);
    std::vector<int32_t> qi(static_cast<size_t>(batch + 1));
    std::iota(qi.begin(), qi.end(), 0);
    DHS_CUDA_CHECK(cudaMemcpy(q_indptr_d, qi.data(), qi.size() * 4, cudaMemcpyHostToDevice));
    for (const int n : opt.late_lists) {
      const int64_t total = int64_t{batch} * kHkv * n;
      if (total > std::min(n_host, n_dev)) {
        std::printf("# late attention: %lld pages do not fit the pools\n", static_cast<long long>(total));
        continue;
      }
      // Scattered slots, positions 0..n-1 of a context of n pages (every key visible).
      const std::vector<int32_t> host_slots = distinct(n_host, total, rng), dev_slots = distinct(n_dev, total, rng);
      std::vector<int32_t> indptr(static_cast<size_t>(batch) * kHkv + 1), pos(static_cast<size_t>(total));
      for (size_t r = 0; r <= static_cast<size_t>(batch) * kHkv; ++r) indptr[r] = static_cast<int32_t>(r * static_cast<size_t>(n));
      for (int64_t k = 0; k < total; ++k) pos[static_cast<size_t>(k)] = static_cast<int32_t>(k % n);
      const std::vector<int32_t> seq(static_cast<size_t>(batch), n * kPage);
      DHS_CUDA_CHECK(cudaMemcpy(seq_d, seq.data(), seq.size() * 4, cudaMemcpyHostToDevice));
      int32_t *indptr_d = nullptr, *pos_d = nullptr, *hs_d = nullptr, *ds_d = nullptr;
      DHS_CUDA_CHECK(cudaMalloc(&indptr_d, indptr.size() * 4));
      DHS_CUDA_CHECK(cudaMalloc(&pos_d, pos.size() * 4));
      DHS_CUDA_CHECK(cudaMalloc(&hs_d, host_slots.size() * 4));
      DHS_CUDA_CHECK(cudaMalloc(&ds_d, dev_slots.size() * 4));
      DHS_CUDA_CHECK(cudaMemcpy(indptr_d, indptr.data(), indptr.size() * 4, cudaMemcpyHostToDevice));
      DHS_CUDA_CHECK(cudaMemcpy(pos_d, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
      DHS_CUDA_CHECK(cudaMemcpy(hs_d, host_slots.data(), host_slots.size() * 4, cudaMemcpyHostToDevice));
      DHS_CUDA_CHECK(cudaMemcpy(ds_d, dev_slots.data(), dev_slots.size() * 4, cudaMemcpyHostToDevice));
      dc::DecodeAttentionArgs args;
      args.q_d = q_d;
      args.q_indptr_d = q_indptr_d;
      args.out_d = out_d;
      args.scale = 1.0f / std::sqrt(static_cast<float>(kD));
      const double bytes = static_cast<double>(total) * kPageBytes;
      for (const bool in_host : {true, false}) {
        const dc::DecodeListsView lv{indptr_d, in_host ? hs_d : ds_d, pos_d, seq_d, batch, kHkv};
        const dc::PagePoolView pv = in_host ? host->view() : dev->view();
        const Timing t = time_events([&] { dc::decode_attention(args, lv, pv, ws, s); }, s, opt.reps);
        char fields[256];
        std::snprintf(fields, sizeof fields, ",\"layout\":\"scattered\",\"pool\":\"%s\",\"attn_batch\":%d,\"pages_per_list\":%d",
                      in_host ? "host_mapped" : "hbm", batch, n);
        emit("late_attention", "read", 0, total, bytes, t, fields);
      }
      for (int32_t* p : {indptr_d, pos_d, hs_d, ds_d}) cudaFree(p);
    }
    for (void* p : std::initializer_list<void*>{q_d, out_d, q_indptr_d, seq_d}) cudaFree(p);
  }

  void beside_attention() {
    const int64_t n_attn = int64_t{opt.attn_batch} * kHkv * (opt.attn_ctx / kPage);
    size_t free_b = 0, total_b = 0;
    DHS_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (static_cast<double>(n_attn) * kPageBytes > static_cast<double>(free_b) - 4e9) {
      std::printf("# interference skipped: %lld attention pages do not fit beside the pools\n", static_cast<long long>(n_attn));
      return;
    }
    Attention attn(opt.attn_batch, opt.attn_ctx, rng, s);
    cudaStream_t s_attn = nullptr, s_rec = nullptr;
    DHS_CUDA_CHECK(cudaStreamCreateWithFlags(&s_attn, cudaStreamNonBlocking));
    DHS_CUDA_CHECK(cudaStreamCreateWithFlags(&s_rec, cudaStreamNonBlocking));
    const Timing five = time_events([&] { attn.run(5, s_attn); }, s_attn, 3);
    const int n_calls = std::max(5, static_cast<int>(std::ceil(opt.attn_ms * 1e3 / (five.median_us / 5))));
    std::printf("# attention %d x %d: %.1f us a call alone, %d calls a loop\n", attn.batch, attn.ctx, five.median_us / 5,
                n_calls);

    const std::vector<PageMove> moves = make_moves(opt.beside_moves, Tier::Host, n_host, Tier::Device, n_dev, 1, rng);
    dc::DeviceMoveList list(opt.beside_moves, dc::PageMoveDirection::Recall);
    list.upload(moves);
    const size_t bulk_rep = std::min({static_cast<size_t>(opt.beside_moves) * kPageBytes,
                                      static_cast<size_t>(n_dev) * kHalfPageBytes, static_cast<size_t>(n_host) * kHalfPageBytes});
    std::vector<int> grids = opt.beside_blocks;
    grids.push_back(0);
    for (const int nb : grids) {
      const double rep_bytes = nb > 0 ? static_cast<double>(opt.beside_moves) * kPageBytes : static_cast<double>(bulk_rep);
      auto recall_once = [&] {
        if (nb > 0)
          dc::recall_pages(list, *host, *dev, s_rec, nb);
        else
          DHS_CUDA_CHECK(cudaMemcpyAsync(dev->k_d(), host->k_h(), bulk_rep, cudaMemcpyHostToDevice, s_rec));
      };
      // Alone just before (clocks drift over a run).
      const Timing alone = time_events([&] { attn.run(n_calls, s_attn); }, s_attn, 1, 0);
      // Enough launches to outlast the loop even when slowed to 40% (estimate: this grid's rate
      // alone, or 10 GB/s when unmeasured).
      const double est_gb_s = nb == 0 ? bulk_h2d_gb_s
                              : nb <= 1024 && recall_gb_s_by_blocks[static_cast<size_t>(nb)] > 0
                                  ? recall_gb_s_by_blocks[static_cast<size_t>(nb)]
                                  : 10.0;
      const int n_reps = 2 + static_cast<int>(std::ceil(alone.median_us / (0.4 * rep_bytes / est_gb_s / 1e3)));
      std::vector<cudaEvent_t> re(static_cast<size_t>(n_reps + 1));  // re[i]: before launch i
      cudaEvent_t a0, a1;
      for (auto& e : re) DHS_CUDA_CHECK(cudaEventCreate(&e));
      DHS_CUDA_CHECK(cudaEventCreate(&a0));
      DHS_CUDA_CHECK(cudaEventCreate(&a1));
      DHS_CUDA_CHECK(cudaEventRecord(re[0], s_rec));
      for (int i = 0; i < n_reps; ++i) {
        recall_once();
        DHS_CUDA_CHECK(cudaEventRecord(re[static_cast<size_t>(i + 1)], s_rec));
      }
      DHS_CUDA_CHECK(cudaEventRecord(a0, s_attn));
      attn.run(n_calls, s_attn);
      DHS_CUDA_CHECK(cudaEventRecord(a1, s_attn));
      DHS_CUDA_CHECK(cudaDeviceSynchronize());
      const double beside_ms = ms_between(a0, a1);
      int first = -1, last = -1;
      for (int i = 0; i < n_reps; ++i)
        if (ms_between(a0, re[static_cast<size_t>(i)]) >= 0 && ms_between(re[static_cast<size_t>(i + 1)], a1) >= 0) {
          if (first < 0) first = i;
          last = i;
        }
      const bool covered = ms_between(re[0], a0) >= 0 && ms_between(a1, re[static_cast<size_t>(n_reps)]) >= 0;
      const int inside = first < 0 ? 0 : last - first + 1;
      Timing rt;  // the launches inside, as one sample
      if (inside > 0) {
        rt.median_us = 1e3 * ms_between(re[static_cast<size_t>(first)], re[static_cast<size_t>(last + 1)]);
        rt.samples_us.push_back(rt.median_us);
      }
      const double attn_alone = attn.bytes() * n_calls / alone.median_us / 1e3;
      const double attn_beside = attn.bytes() * n_calls / (beside_ms * 1e3) / 1e3;
      char fields[512];
      std::snprintf(fields, sizeof fields,
                    ",\"layout\":\"%s\",\"beside\":\"decode_attention\",\"attn_batch\":%d,\"attn_ctx\":%d,"
                    "\"attn_calls\":%d,\"attn_gb_s_alone\":%.1f,\"attn_gb_s_beside\":%.1f,\"attn_ratio\":%.4f,"
                    "\"recall_reps\":%d,\"recall_reps_inside\":%d,\"covered\":%s",
                    nb > 0 ? "scattered" : "contiguous", attn.batch, attn.ctx, n_calls, attn_alone, attn_beside,
                    attn_beside / attn_alone, n_reps, inside, covered ? "true" : "false");
      const int64_t pages_per_rep = nb > 0 ? opt.beside_moves : static_cast<int64_t>(rep_bytes / kPageBytes);
      emit(nb > 0 ? "kernel" : "bulk", "recall", nb, pages_per_rep * inside, rep_bytes * inside, rt, fields);
      for (auto& e : re) DHS_CUDA_CHECK(cudaEventDestroy(e));
      DHS_CUDA_CHECK(cudaEventDestroy(a0));
      DHS_CUDA_CHECK(cudaEventDestroy(a1));
    }
    DHS_CUDA_CHECK(cudaStreamDestroy(s_attn));
    DHS_CUDA_CHECK(cudaStreamDestroy(s_rec));
  }
};

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (const char* c = std::getenv("DHS_COMMIT")) opt.commit = c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value for %s\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--out") opt.out = next();
    else if (a == "--commit") opt.commit = next();
    else if (a == "--host-gib") opt.host_gib = std::stod(next());
    else if (a == "--bulk-gib") opt.bulk_gib = std::stod(next());
    else if (a == "--moves") opt.moves = std::stoi(next());
    else if (a == "--beside-moves") opt.beside_moves = std::stoi(next());
    else if (a == "--reps") opt.reps = std::stoi(next());
    else if (a == "--ce-reps") opt.ce_reps = std::stoi(next());
    else if (a == "--blocks") opt.blocks = int_list(next());
    else if (a == "--beside-blocks") opt.beside_blocks = int_list(next());
    else if (a == "--attn-batch") opt.attn_batch = std::stoi(next());
    else if (a == "--attn-ctx") opt.attn_ctx = std::stoi(next());
    else if (a == "--attn-ms") opt.attn_ms = std::stod(next());
    else if (a == "--gather-threads") opt.gather_threads = int_list(next());
    else if (a == "--gather-chunk") opt.gather_chunk = std::stoi(next());
    else if (a == "--only-gather") opt.only_gather = true;
    else if (a == "--late-lists") opt.late_lists = int_list(next());
    else if (a == "--only-late") opt.only_late = true;
    else {
      std::fprintf(stderr,
                   "usage: recall_bench [--out F.jsonl] [--commit SHA] [--host-gib 8] [--bulk-gib 1] [--moves 65536]\n"
                   "                    [--beside-moves 16384] [--reps 5] [--ce-reps 3] [--blocks 2,4,8,16,32,64,132]\n"
                   "                    [--beside-blocks 4,8,16,32] [--attn-batch 4] [--attn-ctx 131072] [--attn-ms 40]\n"
                   "                    [--gather-threads 4,8,16] [--gather-chunk 2048] [--only-gather]\n"
                   "                    [--late-lists 16,64,256,1024] [--only-late]\n");
      return 2;
    }
  }
  if (opt.commit.empty()) opt.commit = "unknown";
  if (opt.moves < 64 || opt.beside_moves < 1 || opt.reps < 1 || opt.ce_reps < 1 || opt.blocks.empty()) {
    std::fprintf(stderr, "recall_bench: --moves >= 64, --beside-moves, --reps, --ce-reps >= 1 and --blocks needed\n");
    return 2;
  }
  if (dc::device_count() == 0) {
    std::printf("SKIP: no GPU\n");
    return 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  Bench b;
  b.opt = opt;
  cudaDeviceProp prop;
  DHS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  b.device = prop.name;
  b.n_sm = prop.multiProcessorCount;
  if (!opt.out.empty() && (b.out = std::fopen(opt.out.c_str(), "a")) == nullptr) {
    std::fprintf(stderr, "cannot open %s\n", opt.out.c_str());
    return 1;
  }
  DHS_CUDA_CHECK(cudaStreamCreateWithFlags(&b.s, cudaStreamNonBlocking));
  if (!b.setup()) return 1;
  std::printf("# %s, %d SMs; host tier %lld pages (%.2f GiB pinned, mapped), device pool %lld pages; setup %.1f s\n",
              b.device.c_str(), b.n_sm, static_cast<long long>(b.n_host),
              static_cast<double>(b.host->bytes()) / static_cast<double>(size_t{1} << 30), static_cast<long long>(b.n_dev),
              seconds());
  b.bulk();
  if (opt.only_late) {
    b.late_attention();
    if (b.out != nullptr) std::fclose(b.out);
    return 0;
  }
  b.host_gather();
  std::printf("# host gather done at %.1f s\n", seconds());
  b.late_attention();
  std::printf("# late attention done at %.1f s\n", seconds());
  if (opt.only_gather) {
    if (b.out != nullptr) std::fclose(b.out);
    return 0;
  }
  // Scattered pages (a pool after churn: ~1 page a run) and runs of 64 slots on both sides.
  b.moves_by_form(make_moves(opt.moves, Tier::Host, b.n_host, Tier::Device, b.n_dev, 1, b.rng), true, "scattered",
                  opt.blocks);
  b.moves_by_form(make_moves(opt.moves, Tier::Host, b.n_host, Tier::Device, b.n_dev, 64, b.rng), true, "runs64",
                  {dc::kPageMoveBlocks, 16});
  std::printf("# recall done at %.1f s\n", seconds());
  b.beside_attention();
  std::printf("# beside attention done at %.1f s\n", seconds());
  b.moves_by_form(make_moves(opt.moves, Tier::Device, b.n_dev, Tier::Host, b.n_host, 1, b.rng), false, "scattered",
                  opt.blocks);
  std::printf("# done in %.1f s\n", seconds());
  if (b.out != nullptr) std::fclose(b.out);
  DHS_CUDA_CHECK(cudaStreamDestroy(b.s));
  return 0;
}
