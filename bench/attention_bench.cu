// Per-layer decode attention benchmark on Llama-3.1-8B shapes (32 q heads, 8 KV heads,
// d 128, page 16, q_len 1): dense lists and sparse lists (a random ~30% of each head's
// pages, different per head) over a pool whose pages are shuffled, and dense lists over
// contiguous pages (SDPA's layout), ctx 8k/32k/128k x batch 1/4/8/32. Each sample is one CUDA
// graph replay of the op (split-KV kernel + merge kernel), timed with events, with L2
// flushed before it (a kernel reads a 256 MiB buffer; L2 is 60 MB). GB/s = KV bytes read / time.
// Appends JSON lines to --out; the PyTorch anchor (anchors/sdpa_anchor.py) appends its
// rows to the same file in the same device call (bench/device_run.sh).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/decode_attention.h"
#include "backend/cuda/device_key_sketch.h"
#include "backend/cuda/device_page_pool.h"
#include "backend/cuda/device_page_summary.h"
#include "backend/cuda/page_select.h"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/reuse_lists.h"
#include "eval/budget_trace.h"
#include "core/fp16.h"
#include "kv/page_lists.h"

namespace {

constexpr int kHq = 32, kHkv = 8, kD = 128, kPage = 16;
constexpr size_t kFlushBytes = size_t{256} << 20;

// The timing method's floor: a graph of empty kernels.
__global__ void empty_kernel() {}

// HBM read rate by chunk size and order (--probe): every warp reads whole chunks of chunk_int4
// 16-byte words at chunk indices idx[c] (in order or shuffled), two chunks in flight, and folds
// them into a register (stored only if it hits an impossible value, so nothing is elided).
// side != null: each chunk also reads side_int4 words at the same index of a second array (the
// sketch's layout: a page's 1 KiB of codes and, apart, its 64 bytes of steps; the KV pool's: a
// page's 4 KiB of K and, apart, its 4 KiB of V, against one 8 KiB chunk were they interleaved).
__global__ void chunk_read_kernel(const int4* __restrict__ base, const int32_t* __restrict__ idx, int64_t n_chunks,
                                  int chunk_int4, int* sink, const int4* __restrict__ side = nullptr, int side_int4 = 0) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t n_warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  int acc = 0;
  for (int64_t c = warp; c < n_chunks; c += 2 * n_warps) {
    const int64_t c2 = c + n_warps;
    const int64_t ia = __ldg(idx + c), ib = c2 < n_chunks ? __ldg(idx + c2) : ia;
    const int4* a = base + ia * chunk_int4;
    const int4* b = base + ib * chunk_int4;
    for (int i = lane; i < chunk_int4; i += 32) {
      const int4 x = __ldg(a + i), y = __ldg(b + i);
      acc ^= x.x ^ x.y ^ x.z ^ x.w ^ y.x ^ y.y ^ y.z ^ y.w;
    }
    if (side != nullptr)
      for (int i = lane; i < side_int4; i += 32) {
        const int4 x = __ldg(side + ia * side_int4 + i), y = __ldg(side + ib * side_int4 + i);
        acc ^= x.x ^ x.y ^ x.z ^ x.w ^ y.x ^ y.y ^ y.z ^ y.w;
      }
  }
  if (acc == 0x7e57ab1e) sink[0] = acc;
}

// The same reads through the bulk-copy (TMA) unit (--probe): one thread per block issues
// cp.async.bulk of whole chunks into a ring of kStages shared-memory buffers, each completed on
// its own mbarrier, and re-arms a buffer as soon as its copy landed. Chunks are taken
// block-strided, as the __ldg probe takes them warp-strided. Is the HBM read rate through the
// copy engine above the per-thread loads' (4.3-4.4 TB/s for 4 KiB chunks, cuDNN's decode ~4.5)?
template <int kStages>
__global__ void bulk_read_kernel(const char* __restrict__ base, const int32_t* __restrict__ idx, int64_t n_chunks,
                                 int chunk_bytes, int* sink) {
  extern __shared__ __align__(128) char ring[];  // [kStages][chunk_bytes]
  __shared__ __align__(8) uint64_t bar[kStages];
  if (threadIdx.x != 0) return;
  for (int s = 0; s < kStages; ++s)
    dhs::cuda::ptx::mbar_init(dhs::cuda::ptx::smem_u32(&bar[s]), 1);
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  const int64_t grid = gridDim.x;
  auto issue = [&](int s, int64_t c) {
    const uint32_t b = dhs::cuda::ptx::smem_u32(&bar[s]), dst = dhs::cuda::ptx::smem_u32(ring + static_cast<size_t>(s) * chunk_bytes);
    const char* src = base + static_cast<int64_t>(__ldg(idx + c)) * chunk_bytes;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(b), "r"(chunk_bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(chunk_bytes), "r"(b) : "memory");
  };
  for (int s = 0; s < kStages; ++s)
    if (blockIdx.x + s * grid < n_chunks) issue(s, blockIdx.x + s * grid);
  int acc = 0;
  int64_t k = 0;
  for (int64_t c = blockIdx.x; c < n_chunks; c += grid, ++k) {
    const int s = static_cast<int>(k % kStages);
    const uint32_t b = dhs::cuda::ptx::smem_u32(&bar[s]), parity = static_cast<uint32_t>((k / kStages) & 1);
    dhs::cuda::ptx::mbar_wait(b, parity);
    acc ^= *reinterpret_cast<const int*>(ring + static_cast<size_t>(s) * chunk_bytes);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    if (c + kStages * grid < n_chunks) issue(s, c + kStages * grid);
  }
  if (acc == 0x7e57ab1e) sink[0] = acc;
}

// Reads the flush buffer: fills L2 with clean lines of other data (a memset would leave
// dirty lines whose write-back would be charged to the next timed kernel).
__global__ void l2_flush_kernel(const int4* __restrict__ buf, size_t n, int* sink) {
  int acc = 0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int4 v = __ldcg(buf + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x7f3a5c11) *sink = acc;  // keeps the loads
}

struct Options {
  std::string out, tune_out, commit = "unknown", run_id = "";
  int reps = 50;
  int stages = 3;
  int min_pages = 8;
  bool tune = false;
  bool quick = false;
  bool select_only = false;  // only the sparse section's selection rows (profiling)
  std::vector<int> batches;  // --batches: these batch sizes only (profiling)
  bool probe = false;        // only the dense kernel's fixed-cost and bandwidth probes
  std::string trace;             // budget trace (dhisparse eval --trace-out): per-head budgets replayed
  int64_t trace_len = 0;         // prompt length of the trace to use (0: its longest)
  std::vector<int> quest_tokens = {2048, 4096};  // fixed top-k budgets (Quest), tokens per list
  int trace_layers = 8;          // layers of the 8B shape sampled per traced policy (evenly spaced)
};

struct Timing {
  double median_us = 0;
  std::vector<double> samples_us;
};

// Pool slots in runs of `run` consecutive slots, the runs in a shuffled order: run 1 is a pool
// after churn (every page anywhere), run 128 what the engine's allocator gives after 2,048-token
// prefill chunks on a fresh pool (each chunk takes a run of 128 slots per list), run n contiguous.
std::vector<int32_t> slot_runs(int64_t n, int64_t run, std::mt19937& rng) {
  std::vector<int32_t> order(static_cast<size_t>((n + run - 1) / run)), slots;
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  slots.reserve(static_cast<size_t>(n));
  for (const int32_t r : order)
    for (int64_t j = 0; j < run && r * run + j < n; ++j) slots.push_back(static_cast<int32_t>(r * run + j));
  return slots;
}

// Lists for batch x kHkv rows of n_pg pages each; keep_frac < 1 keeps the first and last page
// plus each other page with that probability (sorted, as a policy emits them).
dhs::PageLists make_lists(int batch, int ctx, double keep_frac, const std::vector<int32_t>& perm, std::mt19937& rng) {
  dhs::PageLists L;
  L.n_requests = batch;
  L.n_heads_kv = kHkv;
  L.seq_len.assign(static_cast<size_t>(batch), ctx);
  const int n_pg = ctx / kPage;
  L.indptr.reserve(static_cast<size_t>(batch) * kHkv + 1);
  L.indptr.push_back(0);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int r = 0; r < batch; ++r)
    for (int h = 0; h < kHkv; ++h) {
      const size_t base = static_cast<size_t>(r * kHkv + h) * n_pg;
      for (int i = 0; i < n_pg; ++i) {
        if (keep_frac < 1.0 && i != 0 && i != n_pg - 1 && u(rng) >= keep_frac) continue;
        L.slots.push_back(perm[base + static_cast<size_t>(i)]);
        L.page_pos.push_back(i);
      }
      L.indptr.push_back(static_cast<int32_t>(L.slots.size()));
    }
  return L;
}

// Lists whose head h keeps max(2, ceil(frac[h] * n_pg)) pages: the first, the last and
// random others (a policy's output shape; which pages does not change the read cost).
dhs::PageLists make_budget_lists(int batch, int ctx, const float* frac, const std::vector<int32_t>& perm,
                                 std::mt19937& rng) {
  dhs::PageLists L;
  L.n_requests = batch;
  L.n_heads_kv = kHkv;
  L.seq_len.assign(static_cast<size_t>(batch), ctx);
  const int n_pg = ctx / kPage;
  L.indptr.push_back(0);
  std::vector<int32_t> mid(static_cast<size_t>(n_pg - 2));
  for (int r = 0; r < batch; ++r)
    for (int h = 0; h < kHkv; ++h) {
      const int k = std::clamp(static_cast<int>(std::ceil(frac[h] * n_pg)), 2, n_pg);
      std::iota(mid.begin(), mid.end(), 1);
      for (int i = 0; i < k - 2; ++i) std::swap(mid[static_cast<size_t>(i)], mid[static_cast<size_t>(i + rng() % (mid.size() - i))]);
      std::vector<int32_t> pages(mid.begin(), mid.begin() + (k - 2));
      pages.push_back(0);
      pages.push_back(n_pg - 1);
      std::sort(pages.begin(), pages.end());
      const size_t base = static_cast<size_t>(r * kHkv + h) * n_pg;
      for (int32_t i : pages) {
        L.slots.push_back(perm[base + static_cast<size_t>(i)]);
        L.page_pos.push_back(i);
      }
      L.indptr.push_back(static_cast<int32_t>(L.slots.size()));
    }
  return L;
}

struct Bench {
  Options opt;
  std::string gpu;
  int n_sm = 0;
  dhs::cuda::DevicePagePool* pool = nullptr;
  dhs::cuda::DevicePageLists* lists = nullptr;
  __half* q_d = nullptr;
  __half* out_d = nullptr;
  int32_t* q_indptr_d = nullptr;
  uint8_t* flush_d = nullptr;
  cudaStream_t stream = nullptr;
  FILE* out = nullptr;
  FILE* tune_out = nullptr;

  void flush_l2() {
    l2_flush_kernel<<<1024, 256, 0, stream>>>(reinterpret_cast<const int4*>(flush_d), kFlushBytes / 16,
                                               reinterpret_cast<int*>(flush_d));
  }

  // Median over reps graph replays of what `launch` enqueues, L2 flushed before each.
  template <typename Launch>
  Timing time_graph(const Launch& launch, int reps) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    DHS_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    launch();
    DHS_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    DHS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; ++i) DHS_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    std::vector<cudaEvent_t> ev(static_cast<size_t>(2 * reps));
    for (auto& e : ev) DHS_CUDA_CHECK(cudaEventCreate(&e));
    for (int i = 0; i < reps; ++i) {
      flush_l2();
      DHS_CUDA_CHECK(cudaEventRecord(ev[static_cast<size_t>(2 * i)], stream));
      DHS_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      DHS_CUDA_CHECK(cudaEventRecord(ev[static_cast<size_t>(2 * i + 1)], stream));
    }
    DHS_CUDA_CHECK(cudaStreamSynchronize(stream));
    Timing t;
    for (int i = 0; i < reps; ++i) {
      float ms = 0;
      DHS_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[static_cast<size_t>(2 * i)], ev[static_cast<size_t>(2 * i + 1)]));
      t.samples_us.push_back(ms * 1e3);
    }
    for (auto& e : ev) DHS_CUDA_CHECK(cudaEventDestroy(e));
    DHS_CUDA_CHECK(cudaGraphExecDestroy(exec));
    DHS_CUDA_CHECK(cudaGraphDestroy(graph));
    std::vector<double> s = t.samples_us;
    std::sort(s.begin(), s.end());
    t.median_us = s[s.size() / 2];
    return t;
  }

  // The decode attention op (split-KV kernel + merge kernel) over the current lists.
  Timing time_op(dhs::cuda::DecodeAttentionWorkspace& ws, int batch, int min_pages, int reps, bool split_only = false,
                 bool evict_first = true) {
    dhs::cuda::DecodeAttentionArgs a;
    a.l2_evict_first = evict_first;
    a.q_d = q_d;
    a.q_indptr_d = q_indptr_d;
    a.max_q_len = 1;
    a.scale = 1.0f / std::sqrt(static_cast<float>(kD));
    a.out_d = out_d;
    a.min_pages_per_worker = min_pages;
    (void)batch;
    dhs::cuda::DecodeAttentionProbe probe;
    probe.split_only = split_only;
    return time_graph([&] { dhs::cuda::decode_attention(a, *lists, *pool, ws, stream, probe); }, reps);
  }

  bool output_finite(int batch) {
    std::vector<uint16_t> h(static_cast<size_t>(batch) * kHq * kD);
    DHS_CUDA_CHECK(cudaMemcpy(h.data(), out_d, h.size() * 2, cudaMemcpyDeviceToHost));
    for (uint16_t x : h)
      if (!std::isfinite(dhs::fp16_to_f32(x))) return false;
    return true;
  }

  void emit(FILE* f, const char* impl, int ctx, int batch, const Timing& t, double bytes, double frac,
            const dhs::cuda::DecodeAttentionWorkspace& ws, int min_pages) {
    if (f == nullptr) return;
    std::fprintf(f,
                 "{\"commit\":\"%s\",\"run_id\":\"%s\",\"gpu\":\"%s\",\"impl\":\"%s\",\"dtype\":\"f16\",\"ctx\":%d,\"batch\":%d,"
                 "\"q_len\":1,\"n_heads_q\":%d,\"n_heads_kv\":%d,\"head_dim\":%d,\"page_size\":%d,"
                 "\"us\":%.2f,\"GBps\":%.1f,\"kv_bytes\":%.0f,\"pages_read_frac\":%.4f,\"n_workers\":%d,"
                 "\"stages\":%d,\"min_pages_per_worker\":%d,\"page_layout\":\"%s\",\"timing\":\"cuda graph replay, events, L2 flushed "
                 "by reading 256 MiB before each sample, median\",\"samples\":[",
                 opt.commit.c_str(), opt.run_id.c_str(), gpu.c_str(), impl, ctx, batch, kHq, kHkv, kD, kPage,
                 t.median_us, bytes / t.median_us / 1e3, bytes, frac, ws.n_workers(), ws.stages(), min_pages,
                 std::strstr(impl, "contig")    ? "each head's pages contiguous in the pool"
                 : std::strstr(impl, "runs128") ? "runs of 128 slots per list, the runs shuffled over the pool"
                                                : "pages shuffled over the pool");
    for (size_t i = 0; i < t.samples_us.size(); ++i)
      std::fprintf(f, "%s%.2f", i ? "," : "", t.samples_us[i]);
    std::fprintf(f, "]}\n");
    std::fflush(f);
  }
};

}  // namespace

// "1,4,8" -> {1, 4, 8}.
std::vector<int> int_list(const std::string& v) {
  std::vector<int> out;
  for (size_t p = 0; p <= v.size();) {
    const size_t c = std::min(v.find(',', p), v.size());
    if (c > p) out.push_back(std::stoi(v.substr(p, c - p)));
    p = c + 1;
  }
  return out;
}

int main(int argc, char** argv) {
  Options opt;
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
    else if (a == "--tune-out") opt.tune_out = next();
    else if (a == "--commit") opt.commit = next();
    else if (a == "--run-id") opt.run_id = next();
    else if (a == "--reps") opt.reps = std::stoi(next());
    else if (a == "--stages") opt.stages = std::stoi(next());
    else if (a == "--min-pages") opt.min_pages = std::stoi(next());
    else if (a == "--tune") opt.tune = true;
    else if (a == "--quick") opt.quick = true;
    else if (a == "--select-only") opt.select_only = true;
    else if (a == "--probe") opt.probe = true;
    else if (a == "--batches") opt.batches = int_list(next());
    else if (a == "--trace") opt.trace = next();
    else if (a == "--trace-len") opt.trace_len = std::stoll(next());
    else if (a == "--trace-layers") opt.trace_layers = std::stoi(next());
    else if (a == "--quest-tokens") opt.quest_tokens = int_list(next());
    else {
      std::fprintf(stderr,
                   "usage: attention_bench [--out F.jsonl] [--commit SHA] [--run-id ID] [--reps N] [--stages 2|3|4]\n"
                   "                       [--min-pages N] [--tune [--tune-out F.jsonl]] [--quick] [--select-only] [--probe] [--batches B1,B2]\n"
                   "                       [--trace TRACE.json [--trace-len N] [--trace-layers N]] [--quest-tokens T1,T2]\n");
      return 2;
    }
  }
  if (dhs::cuda::device_count() == 0) {
    std::printf("SKIP: no GPU\n");
    return 0;
  }
  Bench b;
  b.opt = opt;
  cudaDeviceProp prop;
  DHS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  b.gpu = prop.name;
  b.n_sm = prop.multiProcessorCount;
  if (!opt.out.empty()) b.out = std::fopen(opt.out.c_str(), "a");
  if (!opt.tune_out.empty()) b.tune_out = std::fopen(opt.tune_out.c_str(), "a");

  const std::vector<int> ctxs = opt.quick ? std::vector<int>{8192, 131072} : std::vector<int>{8192, 32768, 131072};
  const std::vector<int> batches = !opt.batches.empty() ? opt.batches : opt.quick ? std::vector<int>{1, 8} : std::vector<int>{1, 4, 8, 32};
  int64_t max_pages = 0;
  for (int c : ctxs)
    for (int bt : batches) max_pages = std::max<int64_t>(max_pages, int64_t{bt} * kHkv * (c / kPage));
  size_t free_b = 0, total_b = 0;
  DHS_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t page_bytes = size_t{2} * kPage * kD * 2;  // K + V
  const size_t budget = free_b - (size_t{4} << 30);       // leave 4 GiB for everything else
  max_pages = std::min<int64_t>(max_pages, static_cast<int64_t>(budget / page_bytes));
  std::printf("gpu %s, %d SMs, pool %lld head-pages (%.1f GB K+V), free %.1f GB\n", b.gpu.c_str(), b.n_sm,
              static_cast<long long>(max_pages), max_pages * page_bytes / 1e9, free_b / 1e9);

  dhs::cuda::DevicePagePool pool(max_pages, kPage, kD);
  pool.fill_random(1, -1.0f, 1.0f, nullptr);
  dhs::cuda::DevicePageLists lists(32, kHkv, max_pages);
  b.pool = &pool;
  b.lists = &lists;
  DHS_CUDA_CHECK(cudaMalloc(&b.q_d, size_t{32} * kHq * kD * 2));
  DHS_CUDA_CHECK(cudaMalloc(&b.out_d, size_t{32} * kHq * kD * 2));
  DHS_CUDA_CHECK(cudaMalloc(&b.q_indptr_d, 33 * 4));
  DHS_CUDA_CHECK(cudaMalloc(&b.flush_d, kFlushBytes));
  DHS_CUDA_CHECK(cudaMemset(b.flush_d, 0x11, kFlushBytes));
  dhs::cuda::fill_random_f16(b.q_d, size_t{32} * kHq * kD, 7, -3.0f, 3.0f, nullptr);
  std::vector<int32_t> qi(33);
  std::iota(qi.begin(), qi.end(), 0);
  DHS_CUDA_CHECK(cudaMemcpy(b.q_indptr_d, qi.data(), 33 * 4, cudaMemcpyHostToDevice));
  DHS_CUDA_CHECK(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking));
  DHS_CUDA_CHECK(cudaDeviceSynchronize());

  dhs::cuda::DecodeAttentionWorkspace ws(32, kHq, kHkv, kD, 1, opt.stages);
  std::printf("workspace: %d workers (warps), %.1f MB partials, stages %d, min pages/worker %d\n", ws.n_workers(),
              ws.bytes() / 1e6, ws.stages(), opt.min_pages);

  std::mt19937 rng(42);
  if (opt.probe) {
    // Where the dense kernel's time goes (docs/kernels/decode_attention_NOTES.md, the v2 probes):
    // the timing method's floor, and the split-KV grid without its merge.
    const Timing e1 = b.time_graph([&] { empty_kernel<<<1, 32, 0, b.stream>>>(); }, opt.reps);
    const Timing e2 = b.time_graph([&] {
      empty_kernel<<<1, 32, 0, b.stream>>>();
      empty_kernel<<<1, 32, 0, b.stream>>>();
    }, opt.reps);
    const Timing e3 = b.time_graph([&] { empty_kernel<<<b.n_sm * 2, 128, 0, b.stream>>>(); }, opt.reps);
    std::printf("probe floor: graph of 1 empty kernel %.2f us, of 2 %.2f us, 1 kernel of %d empty blocks %.2f us\n",
                e1.median_us, e2.median_us, b.n_sm * 2, e3.median_us);
    {  // HBM read rate by chunk size: the sketch score reads 1 KiB per page, attention 4 KiB twice
      const size_t buf_bytes = size_t{1} << 30;
      int4* buf = nullptr;
      int32_t* idx_d = nullptr;
      DHS_CUDA_CHECK(cudaMalloc(&buf, buf_bytes));
      DHS_CUDA_CHECK(cudaMemset(buf, 0x5a, buf_bytes));
      DHS_CUDA_CHECK(cudaMalloc(&idx_d, (buf_bytes / 256) * sizeof(int32_t)));
      for (int chunk : {256, 512, 1024, 1088, 4096, 8192, 16384, 32768})
        for (int shuffled = 0; shuffled < 2; ++shuffled) {
          const int64_t n_chunks = static_cast<int64_t>(buf_bytes / chunk);
          std::vector<int32_t> idx(static_cast<size_t>(n_chunks));
          std::iota(idx.begin(), idx.end(), 0);
          if (shuffled) std::shuffle(idx.begin(), idx.end(), rng);
          DHS_CUDA_CHECK(cudaMemcpy(idx_d, idx.data(), idx.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
          const Timing t = b.time_graph([&] {
            chunk_read_kernel<<<b.n_sm * 4, 512, 0, b.stream>>>(buf, idx_d, n_chunks, chunk / 16, reinterpret_cast<int*>(buf));
          }, opt.reps);
          std::printf("probe read %4d-byte chunks %-9s %8.1f us  %6.0f GB/s\n", chunk, shuffled ? "shuffled" : "in order",
                      t.median_us, static_cast<double>(n_chunks * chunk) / t.median_us / 1e3);
          if (chunk >= 1024) {  // the same chunks through the bulk-copy unit, by ring depth and blocks per SM
            struct Cfg { int stages, per_sm; };
            // (the last six only fit chunks of 8 KiB and more: are larger copies read faster in order?)
            for (const Cfg cfg : {Cfg{2, 16}, Cfg{4, 8}, Cfg{4, 12}, Cfg{8, 4}, Cfg{8, 6}, Cfg{2, 6}, Cfg{3, 4}, Cfg{4, 3},
                                  Cfg{2, 3}, Cfg{3, 2}, Cfg{4, 6}}) {
              const int smem = cfg.stages * chunk;
              if (static_cast<int64_t>(smem) * cfg.per_sm > 200 * 1024) continue;
              if (chunk < 8192 && (cfg.per_sm < 4 || (cfg.stages == 2 && cfg.per_sm == 6) || (cfg.stages == 4 && cfg.per_sm == 6)))
                continue;
              auto kfn = cfg.stages == 2   ? bulk_read_kernel<2>
                         : cfg.stages == 3 ? bulk_read_kernel<3>
                         : cfg.stages == 4 ? bulk_read_kernel<4>
                                           : bulk_read_kernel<8>;
              DHS_CUDA_CHECK(cudaFuncSetAttribute(kfn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
              const Timing tb = b.time_graph([&] {
                kfn<<<b.n_sm * cfg.per_sm, 32, smem, b.stream>>>(reinterpret_cast<const char*>(buf), idx_d, n_chunks, chunk,
                                                                  reinterpret_cast<int*>(buf));
              }, opt.reps);
              std::printf("probe bulk %5d-byte chunks %-9s %d stages x %2d blocks/SM %8.1f us  %6.0f GB/s\n", chunk,
                          shuffled ? "shuffled" : "in order", cfg.stages, cfg.per_sm, tb.median_us,
                          static_cast<double>(n_chunks * chunk) / tb.median_us / 1e3);
            }
          }
          if (chunk == 1024) {  // the sketch's layout: 1 KiB chunks, and 64 bytes at the same index elsewhere
            const Timing ts = b.time_graph([&] {
              chunk_read_kernel<<<b.n_sm * 4, 512, 0, b.stream>>>(buf, idx_d, n_chunks * 15 / 16, chunk / 16, reinterpret_cast<int*>(buf),
                                                                  buf + (buf_bytes / 16) * 15 / 16, 4);
            }, opt.reps);
            const double bytes = static_cast<double>(n_chunks * 15 / 16) * (1024 + 64);
            std::printf("probe read 1024 + 64 apart  %-9s %8.1f us  %6.0f GB/s\n", shuffled ? "shuffled" : "in order", ts.median_us,
                        bytes / ts.median_us / 1e3);
          }
          if (chunk == 4096 && !shuffled) {
            // Does the number of concurrent sequential streams matter? The decode kernel's grid (2 blocks
            // of 4 warps per SM, two chunks in flight per warp), each warp reading its own contiguous
            // region (as the split-KV kernel on a contiguous pool), 4 or 8 warps per region taking
            // its chunks in turn (fewer, wider streams), and the whole buffer in global order.
            const int64_t nw = static_cast<int64_t>(b.n_sm) * 2 * 4, per = n_chunks / nw, used = per * nw;
            for (const int share : {0, 1, 4, 8}) {  // 0: global order
              std::vector<int32_t> order(static_cast<size_t>(used));
              for (int64_t w = 0; w < nw; ++w)
                for (int64_t k = 0; k < per; ++k)
                  order[static_cast<size_t>(w + k * nw)] =
                      static_cast<int32_t>(share == 0 ? w + k * nw : (w / share) * share * per + k * share + w % share);
              DHS_CUDA_CHECK(cudaMemcpy(idx_d, order.data(), order.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
              const Timing ts = b.time_graph([&] {
                chunk_read_kernel<<<b.n_sm * 2, 128, 0, b.stream>>>(buf, idx_d, used, chunk / 16, reinterpret_cast<int*>(buf));
              }, opt.reps);
              std::printf("probe read 4096-byte chunks, %lld warps, %-26s %8.1f us  %6.0f GB/s\n", static_cast<long long>(nw),
                          share == 0 ? "global order" : (std::to_string(share) + " warp(s) per stream").c_str(), ts.median_us,
                          static_cast<double>(used) * chunk / ts.median_us / 1e3);
            }
            DHS_CUDA_CHECK(cudaMemcpy(idx_d, idx.data(), idx.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
          }
          if (chunk == 4096) {  // the KV pool's layout: K's 4 KiB and V's 4 KiB at one slot of two arrays
            std::vector<int32_t> half(static_cast<size_t>(n_chunks / 2));  // slots of the first half only
            std::iota(half.begin(), half.end(), 0);
            if (shuffled) std::shuffle(half.begin(), half.end(), rng);
            DHS_CUDA_CHECK(cudaMemcpy(idx_d, half.data(), half.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
            const Timing ts = b.time_graph([&] {
              chunk_read_kernel<<<b.n_sm * 4, 512, 0, b.stream>>>(buf, idx_d, n_chunks / 2, chunk / 16, reinterpret_cast<int*>(buf),
                                                                  buf + (buf_bytes / 16) / 2, chunk / 16);
            }, opt.reps);
            const double bytes = static_cast<double>(n_chunks / 2) * 2.0 * chunk;
            std::printf("probe read 4096 + 4096 apart %-9s %8.1f us  %6.0f GB/s\n", shuffled ? "shuffled" : "in order", ts.median_us,
                        bytes / ts.median_us / 1e3);
          }
        }
      cudaFree(buf);
      cudaFree(idx_d);
    }
    for (int ctx : {8192, 32768, 131072})
      for (int batch : {1, 8}) {
        const int64_t n_pages = int64_t{batch} * kHkv * (ctx / kPage);
        if (n_pages > max_pages) continue;
        std::vector<int32_t> perm(static_cast<size_t>(n_pages)), identity(static_cast<size_t>(n_pages));
        std::iota(perm.begin(), perm.end(), 0);
        std::iota(identity.begin(), identity.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        const double bytes = static_cast<double>(n_pages) * page_bytes;
        for (int layout = 0; layout < 2; ++layout) {
          lists.upload(make_lists(batch, ctx, 1.0, layout == 0 ? perm : identity, rng));
          const Timing full = b.time_op(ws, batch, opt.min_pages, opt.reps);
          const Timing split = b.time_op(ws, batch, opt.min_pages, opt.reps, true);
          const Timing ef = b.time_op(ws, batch, opt.min_pages, opt.reps, false, false);
          std::printf("probe %-7d %-3d %-9s full %8.1f us (%6.0f GB/s)  split-KV alone %8.1f us (merge %+.1f)  "
                      "K/V evict_normal %8.1f us (%6.0f GB/s)\n", ctx, batch, layout == 0 ? "shuffled" : "contig",
                      full.median_us, bytes / full.median_us / 1e3, split.median_us, full.median_us - split.median_us,
                      ef.median_us, bytes / ef.median_us / 1e3);
        }
      }
    return 0;
  }
  std::printf("%-7s %-6s %-11s %10s %9s %8s\n", "ctx", "batch", "impl", "us", "GB/s", "frac");
  for (int ctx : ctxs)
    for (int batch : batches) {
      if (opt.select_only) break;
      const int64_t n_pages = int64_t{batch} * kHkv * (ctx / kPage);
      if (n_pages > max_pages) {
        std::printf("%-7d %-6d skipped: %lld pages do not fit\n", ctx, batch, static_cast<long long>(n_pages));
        continue;
      }
      // Each head's pages are scattered over the pool, as after many allocations.
      std::vector<int32_t> perm(static_cast<size_t>(n_pages));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::vector<int32_t> identity(static_cast<size_t>(n_pages));
      std::iota(identity.begin(), identity.end(), 0);
      const std::vector<int32_t> runs = slot_runs(n_pages, 128, rng);
      // 0: dense, pages scattered over the pool (a pool after churn); 1: sparse30, scattered;
      // 2: dense, each head's pages contiguous in the pool (SDPA's layout: like for like);
      // 3: dense, runs of 128 slots (the engine's allocator after chunked prefill, slot_runs).
      for (int variant = 0; variant < 4; ++variant) {
        const bool sparse = variant == 1;
        const dhs::PageLists L =
            make_lists(batch, ctx, sparse ? 0.3 : 1.0, variant == 2 ? identity : variant == 3 ? runs : perm, rng);
        lists.upload(L);
        const double frac = static_cast<double>(L.nnz()) / static_cast<double>(n_pages);
        const double bytes = static_cast<double>(L.nnz()) * page_bytes;
        const Timing t = b.time_op(ws, batch, opt.min_pages, opt.reps);
        const char* impl = variant == 0   ? "dhisparse-dense"
                           : variant == 1 ? "dhisparse-sparse30"
                           : variant == 2 ? "dhisparse-dense-contig"
                                          : "dhisparse-dense-runs128";
        std::printf("%-7d %-6d %-18s %10.1f %9.1f %8.3f%s\n", ctx, batch, impl, t.median_us,
                    bytes / t.median_us / 1e3, frac, b.output_finite(batch) ? "" : "  NON-FINITE OUTPUT");
        b.emit(b.out, impl, ctx, batch, t, bytes, frac, ws, opt.min_pages);
      }
    }

  // ---- Sparse: per-head budgets replayed from a real model's trace, fixed Quest budgets, and
  // the cost of scoring + selection on the device, at 32k and 128k.
  {
    struct Pol {
      std::string impl;
      std::vector<float> frac;  // [32 layers * 8 heads]
      int quest_pages = 0;
    };
    std::vector<Pol> pols;
    if (!opt.trace.empty())
      for (const std::string& label : dhs::budget_trace_labels(opt.trace)) {
        if (label.rfind("coverage", 0) != 0) continue;
        const dhs::BudgetTrace tr = dhs::load_budget_trace(opt.trace, label, opt.trace_len);
        std::printf("trace %s: %s at %lld tokens, %d x %d, mean pages read %.3f\n", tr.model.c_str(), label.c_str(),
                    static_cast<long long>(tr.length), tr.n_layers, tr.n_heads_kv, tr.mean());
        pols.push_back({"dhisparse-" + label, tr.mapped(32, kHkv), 0});
      }
    for (int tok : opt.quest_tokens) pols.push_back({"dhisparse-quest-" + std::to_string(tok), {}, tok / kPage});
    const std::vector<int> sctx = opt.quick ? std::vector<int>{131072} : std::vector<int>{32768, 131072};
    dhs::cuda::DevicePageSummaries sums(max_pages, kD, dhs::cuda::SummaryKind::MinMax);
    dhs::cuda::fill_random_f16(sums.data_d(), static_cast<size_t>(max_pages) * 2 * kD, 5, -1.0f, 1.0f, nullptr);
    // The 4-bit key sketch (random codes; steps 0.1: q.k^ of order 1): what sketch4 scoring reads.
    dhs::cuda::DeviceKeySketch sketch(max_pages, kPage, kD);
    dhs::cuda::fill_random_f16(reinterpret_cast<__half*>(sketch.codes_d()), sketch.code_bytes() / 2, 6, -1.0f, 1.0f,
                                nullptr);
    {
      const std::vector<float> steps(static_cast<size_t>(max_pages) * kPage, 0.1f);
      DHS_CUDA_CHECK(cudaMemcpy(sketch.steps_d(), steps.data(), steps.size() * 4, cudaMemcpyHostToDevice));
    }
    // The projected sketch at rank 32 (psketch4:32): random codes and a random basis (the cost
    // does not depend on their values); its q projection runs inside the timed selection.
    constexpr int kRank = 32;
    dhs::cuda::DeviceKeySketch psketch(max_pages, kPage, kRank);
    dhs::cuda::fill_random_f16(reinterpret_cast<__half*>(psketch.codes_d()), psketch.code_bytes() / 2, 7, -1.0f, 1.0f,
                                nullptr);
    {
      const std::vector<float> steps(static_cast<size_t>(max_pages) * kPage, 0.1f);
      DHS_CUDA_CHECK(cudaMemcpy(psketch.steps_d(), steps.data(), steps.size() * 4, cudaMemcpyHostToDevice));
    }
    std::vector<float> pb(static_cast<size_t>(kHkv) * kRank * kD), pm(static_cast<size_t>(kHkv) * kD, 0.0f);
    {
      std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(static_cast<float>(kD)));
      for (float& x : pb) x = nd(rng);
    }
    dhs::cuda::DeviceKeyBasis pbasis(1, kHkv, kD, kRank, pb.data(), pm.data());
    __half* qp_d = nullptr;
    DHS_CUDA_CHECK(cudaMalloc(&qp_d, static_cast<size_t>(32) * kHq * kRank * 2));
    dhs::cuda::DevicePageLists dense_lists(32, kHkv, max_pages);
    int32_t *sel_indptr, *sel_slots, *sel_pos;
    DHS_CUDA_CHECK(cudaMalloc(&sel_indptr, (32 * kHkv + 1) * 4));
    DHS_CUDA_CHECK(cudaMalloc(&sel_slots, static_cast<size_t>(max_pages) * 4));
    DHS_CUDA_CHECK(cudaMalloc(&sel_pos, static_cast<size_t>(max_pages) * 4));
    dhs::cuda::PageSelectWorkspace sws(32 * kHkv, max_pages, kHq / kHkv);
    std::printf("\n%-7s %-6s %-30s %10s %8s %9s\n", "ctx", "batch", "impl", "us/layer", "frac", "dense/it");
    for (int ctx : sctx)
      for (int batch : batches) {
        const int64_t n_pages = int64_t{batch} * kHkv * (ctx / kPage);
        if (n_pages > max_pages) continue;
        std::vector<int32_t> perm(static_cast<size_t>(n_pages));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        const dhs::PageLists dense = make_lists(batch, ctx, 1.0, perm, rng);
        lists.upload(dense);
        const Timing td = b.time_op(ws, batch, opt.min_pages, opt.reps);
        const double dense_bytes = static_cast<double>(dense.nnz()) * page_bytes;
        b.emit(b.out, "dhisparse-dense", ctx, batch, td, dense_bytes, 1.0, ws, opt.min_pages);
        std::printf("%-7d %-6d %-30s %10.1f %8.3f %9s\n", ctx, batch, "dhisparse-dense", td.median_us, 1.0, "1.00");
        for (const Pol& pol : pols) {
          if (opt.select_only) break;
          // Mean over evenly spaced layers of the traced budgets (Quest: one budget for all).
          const int n_l = pol.frac.empty() ? 1 : std::max(1, std::min(opt.trace_layers, 32));
          Timing agg;
          double frac_sum = 0, us_sum = 0;
          for (int li = 0; li < n_l; ++li) {
            const int layer = li * 32 / n_l;
            std::vector<float> f(kHkv);
            for (int h = 0; h < kHkv; ++h)
              f[static_cast<size_t>(h)] = pol.frac.empty() ? static_cast<float>(pol.quest_pages) / (ctx / kPage)
                                                           : pol.frac[static_cast<size_t>(layer * kHkv + h)];
            const dhs::PageLists L = make_budget_lists(batch, ctx, f.data(), perm, rng);
            lists.upload(L);
            const Timing t = b.time_op(ws, batch, opt.min_pages, std::max(10, opt.reps / 2));
            us_sum += t.median_us;
            frac_sum += static_cast<double>(L.nnz()) / static_cast<double>(n_pages);
            agg.samples_us.insert(agg.samples_us.end(), t.samples_us.begin(), t.samples_us.end());
          }
          agg.median_us = us_sum / n_l;  // mean over layers of each layer's median
          const double frac = frac_sum / n_l;
          b.emit(b.out, pol.impl.c_str(), ctx, batch, agg, frac * n_pages * page_bytes, frac, ws, opt.min_pages);
          std::printf("%-7d %-6d %-30s %10.1f %8.3f %9.2f\n", ctx, batch, pol.impl.c_str(), agg.median_us, frac,
                      td.median_us / agg.median_us);
        }
        // Scoring + selection + compaction on the device, timed alone (graph replay, L2 flushed).
        dense_lists.upload(dense);
        for (int rule = 0; rule < 4; ++rule) {  // coverage (MinMax), top-k (MinMax), coverage (sketch4, psketch4:32)
          dhs::cuda::PageSelectParams p;
          dhs::cuda::PageSelectProbe probe;  // the probe runs below: timestamps, phase prefixes, no PDL
          p.dense_indptr = dense_lists.indptr_d();
          p.dense_slots = dense_lists.slots_d();
          p.dense_page_pos = dense_lists.page_pos_d();
          p.seq_len = dense_lists.seq_len_d();
          p.q = b.q_d;
          p.q_indptr = b.q_indptr_d;
          p.summaries = sums.data_d();
          p.rule = rule == 1 ? dhs::cuda::SelectRule::TopK : dhs::cuda::SelectRule::Coverage;
          if (rule == 2) {
            p.sketch_codes = sketch.codes_d();
            p.sketch_steps = sketch.steps_d();
          }
          dhs::cuda::ProjectQueriesParams pq;
          if (rule == 3) {
            p.sketch_codes = psketch.codes_d();
            p.sketch_steps = psketch.steps_d();
            pq.q = b.q_d;
            pq.qp = qp_d;
            pq.basis = pbasis.query_basis_d(0);
            pq.n_rows = batch;
            pq.n_heads_q = kHq;
            pq.n_heads_kv = kHkv;
            pq.head_dim = kD;
            pq.rank = kRank;
            p.q = qp_d;
          }
          p.gamma = 0.99f;
          p.budget = 4096 / kPage;
          p.indptr = sel_indptr;
          p.slots = sel_slots;
          p.page_pos = sel_pos;
          p.n_requests = batch;
          p.n_heads_q = kHq;
          p.n_heads_kv = kHkv;
          p.head_dim = rule == 3 ? kRank : kD;
          p.page_size = kPage;
          p.scale = 1.0f / std::sqrt(static_cast<float>(kD));
          sws.bind(&p);
          const Timing t = b.time_graph([&] {
            if (rule == 3) dhs::cuda::launch_project_queries(pq, b.stream);
            dhs::cuda::launch_page_select(p, b.stream);
          }, opt.reps);
          const char* impl = rule == 0 ? "select-coverage" : rule == 1 ? "select-topk" : rule == 2 ? "select-coverage-sketch4"
                                                                                                   : "select-coverage-psketch4-32";
          const double sum_bytes = rule >= 2 ? static_cast<double>(n_pages) * kPage * (p.head_dim / 2 + 4)  // sketch read
                                             : static_cast<double>(n_pages) * 2 * kD * 2;    // summaries read
          // Breakdown, each stage alone (rows impl/score, /select, /compact), and the select kernel
          // on one block per list (/select-1block) beside the cluster size chosen for this shape.
          Timing part[4];
          for (int st = 0; st < 3; ++st)
            part[st] = b.time_graph([&] { dhs::cuda::launch_page_select_stage(p, st, b.stream); }, opt.reps);
          p.select_cluster = 1;
          part[3] = b.time_graph([&] { dhs::cuda::launch_page_select_stage(p, 1, b.stream); }, opt.reps);
          p.select_cluster = 0;
          if (rule == 2) {  // the same score stage on two other layouts of the lists' pages in the pool
            // Runs of 128 consecutive slots in a shuffled order (the engine's allocator after 2,048-token
            // prefill chunks: each chunk takes a run per list), and every list contiguous.
            const std::vector<int32_t> runs = slot_runs(n_pages, 128, rng), identity = slot_runs(n_pages, n_pages, rng);
            double us[2];
            for (int lay = 0; lay < 2; ++lay) {
              dense_lists.upload(make_lists(batch, ctx, 1.0, lay == 0 ? runs : identity, rng));
              us[lay] = b.time_graph([&] { dhs::cuda::launch_page_select_stage(p, 0, b.stream); }, opt.reps).median_us;
            }
            dense_lists.upload(dense);
            std::printf("%-7d %-6d %-30s score by pool layout: shuffled pages %.1f us, runs of 128 pages %.1f, contiguous %.1f\n",
                        ctx, batch, impl, part[0].median_us, us[0], us[1]);
          }
          if (rule >= 2) {  // the pipeline with select launched after the score kernel ends
            probe.select_pdl = false;
            const Timing tn = b.time_graph([&] { dhs::cuda::launch_page_select(p, probe, b.stream); }, opt.reps);
            probe.select_pdl = true;
            std::printf("%-7d %-6d %-30s pipeline %.1f us; select not a programmatic dependent of the score kernel: %.1f us\n",
                        ctx, batch, impl, t.median_us, tn.median_us);
          }
          const char* part_name[4] = {"score", "select", "compact", "select-1block"};
          for (int st = 0; st < 4; ++st)
            b.emit(b.out, (std::string(impl) + "/" + part_name[st]).c_str(), ctx, batch, part[st], st == 0 ? sum_bytes : 0.0, 1.0, ws,
                   opt.min_pages);
          if (rule == 2) {
            // --reselect-every R: a layer's step that reuses its last selection runs only the reuse
            // kernel (reuse_lists.h) on the lists just selected (same tokens: the page being filled
            // is the one appended), so a step's selection cost per layer is (pipeline + (R-1) reuse) / R.
            int32_t *r_indptr = nullptr, *r_slots = nullptr, *r_pos = nullptr;
            DHS_CUDA_CHECK(cudaMalloc(&r_indptr, (static_cast<size_t>(batch) * kHkv + 1) * 4));
            DHS_CUDA_CHECK(cudaMalloc(&r_slots, static_cast<size_t>(n_pages) * 4));
            DHS_CUDA_CHECK(cudaMalloc(&r_pos, static_cast<size_t>(n_pages) * 4));
            dhs::cuda::ReuseListsParams rp;
            rp.dense_indptr = dense_lists.indptr_d();
            rp.dense_slots = dense_lists.slots_d();
            rp.seq_len = dense_lists.seq_len_d();
            rp.sel_indptr = sel_indptr;
            rp.sel_slots = sel_slots;
            rp.sel_page_pos = sel_pos;
            rp.sel_seq_len = dense_lists.seq_len_d();
            rp.indptr = r_indptr;
            rp.slots = r_slots;
            rp.page_pos = r_pos;
            rp.n_requests = batch;
            rp.n_heads_kv = kHkv;
            rp.page_size = kPage;
            const Timing tr = b.time_graph([&] { dhs::cuda::launch_reuse_lists(rp, b.stream); }, opt.reps);
            b.emit(b.out, (std::string(impl) + "/reuse").c_str(), ctx, batch, tr, 0.0, 1.0, ws, opt.min_pages);
            std::printf("%-7d %-6d %-30s reuse kernel %.1f us; per step and layer with --reselect-every R, %% of dense:", ctx, batch,
                        impl, tr.median_us);
            for (int r : {1, 2, 3, 4, 8})
              std::printf("  R%d %.1f us %.1f%%", r, (t.median_us + (r - 1) * tr.median_us) / r,
                          100.0 * (t.median_us + (r - 1) * tr.median_us) / r / td.median_us);
            std::printf("\n");
            cudaFree(r_indptr);
            cudaFree(r_slots);
            cudaFree(r_pos);
          }
          std::printf("%-7d %-6d %-30s score %.1f us, select %.1f us (cluster %d; one block per list: %.1f), compact %.1f us\n",
                      ctx, batch, impl, part[0].median_us, part[1].median_us, dhs::cuda::page_select_cluster(batch * kHkv),
                      part[3].median_us, part[2].median_us);
          if (rule == 3) {
            const Timing tp = b.time_graph([&] { dhs::cuda::launch_project_queries(pq, b.stream); }, opt.reps);
            b.emit(b.out, (std::string(impl) + "/project").c_str(), ctx, batch, tp, 0.0, 1.0, ws, opt.min_pages);
            std::printf("%-7d %-6d %-30s q projection %.1f us\n", ctx, batch, impl, tp.median_us);
          }
          if (rule >= 2) {  // the select kernel at every cluster size
            std::printf("%-7d %-6d %-30s select by cluster size:", ctx, batch, impl);
            for (int c = 1; c <= 16; c *= 2) {
              p.select_cluster = c;
              std::printf("  C%d %.1f", c, b.time_graph([&] { dhs::cuda::launch_page_select_stage(p, 1, b.stream); }, opt.reps).median_us);
            }
            p.select_cluster = 0;
            std::printf(" us\n");
            // Each phase's cost: the kernel ended after phase k (1 masses, 2 sums, 3-5 histogram
            // levels, 6 = whole: the emission scan).
            std::printf("%-7d %-6d %-30s select ended after phase:", ctx, batch, impl);
            for (int k = 1; k <= 6; ++k) {
              probe.stop_after = k % 6;
              std::printf("  %d %.1f", k, b.time_graph([&] { dhs::cuda::launch_page_select_stage(p, probe, 1, b.stream); }, opt.reps).median_us);
            }
            probe.stop_after = 0;
            std::printf(" us\n");
            // Block 0's timeline inside one run (clock64 at the phase ends; at the reported clock).
            long long* cyc_d = nullptr;
            long long* blk_d = nullptr;
            const int n_blocks = batch * kHkv * dhs::cuda::page_select_cluster(batch * kHkv);
            DHS_CUDA_CHECK(cudaMalloc(&cyc_d, 14 * sizeof(long long)));
            DHS_CUDA_CHECK(cudaMemset(cyc_d, 0, 14 * sizeof(long long)));
            DHS_CUDA_CHECK(cudaMalloc(&blk_d, 2 * n_blocks * sizeof(long long)));
            DHS_CUDA_CHECK(cudaMemset(blk_d, 0, 2 * n_blocks * sizeof(long long)));
            probe.phase_cycles = cyc_d;
            probe.block_ns = blk_d;
            b.flush_l2();  // (the select kernel alone on a cold L2; the pipeline below has the score kernel's L2)
            dhs::cuda::launch_page_select_stage(p, probe, 1, b.stream);
            DHS_CUDA_CHECK(cudaStreamSynchronize(b.stream));
            probe.phase_cycles = nullptr;
            probe.block_ns = nullptr;
            // Every block's entry and exit (%globaltimer), relative to the first entry (or to t0).
            auto print_blocks = [&](const char* what, long long t0) {
              std::vector<long long> blk(2 * static_cast<size_t>(n_blocks));
              DHS_CUDA_CHECK(cudaMemcpy(blk.data(), blk_d, blk.size() * sizeof(long long), cudaMemcpyDeviceToHost));
              long long e0 = LLONG_MAX, e1 = 0, x0 = LLONG_MAX, x1 = 0;
              for (int k = 0; k < n_blocks; ++k) {
                e0 = std::min(e0, blk[2 * k]);
                e1 = std::max(e1, blk[2 * k]);
                x0 = std::min(x0, blk[2 * k + 1]);
                x1 = std::max(x1, blk[2 * k + 1]);
              }
              if (t0 == 0) t0 = e0;
              std::printf("%-7d %-6d %-30s select blocks%s (%d): entries %.1f-%.1f us, exits %.1f-%.1f us, block 0 enters at %.1f us\n",
                          ctx, batch, impl, what, n_blocks, (e0 - t0) * 1e-3, (e1 - t0) * 1e-3, (x0 - t0) * 1e-3,
                          (x1 - t0) * 1e-3, (blk[0] - t0) * 1e-3);
            };
            print_blocks("", 0);
            auto print_timeline = [&](const char* what) {
              long long cyc[14];
              DHS_CUDA_CHECK(cudaMemcpy(cyc, cyc_d, sizeof cyc, cudaMemcpyDeviceToHost));
              // The clock the cycles ran at: block 0's cycles over its %globaltimer span.
              const double khz = cyc[13] > cyc[12] ? static_cast<double>(cyc[11] - cyc[0]) / (static_cast<double>(cyc[13] - cyc[12]) * 1e-6) : 1.98e6;
              const char* mark_name[12] = {"entry", "zero", "pass", "softmax-red", "masses", "f2-red", "level0", "level1",
                                           "level2", "emit-scan", "emit", "exit"};
              std::printf("%-7d %-6d %-30s select timeline%s, block 0 (us at its measured %.0f MHz; %.1f us in block 0):", ctx, batch, impl, what,
                          khz / 1000, static_cast<double>(cyc[13] - cyc[12]) * 1e-3);
              for (int k = 1; k < 12; ++k)
                if (cyc[k] != 0 && cyc[k - 1] != 0)
                  std::printf(" %s %.2f", mark_name[k], static_cast<double>(cyc[k] - cyc[k - 1]) / (khz * 1e-3));
              std::printf("\n");
            };
            print_timeline("");
            {  // the three kernels of one selection, launched as in a decode step (not a graph here)
              const unsigned long long init[10] = {~0ull, 0, ~0ull, 0, ~0ull, 0, ~0ull, 0, ~0ull, 0};
              unsigned long long* span_d = nullptr;
              DHS_CUDA_CHECK(cudaMalloc(&span_d, sizeof init));
              DHS_CUDA_CHECK(cudaMemcpy(span_d, init, sizeof init, cudaMemcpyHostToDevice));
              probe.span_ns = span_d;
              probe.block_ns = blk_d;
              probe.phase_cycles = cyc_d;
              DHS_CUDA_CHECK(cudaMemset(blk_d, 0, 2 * n_blocks * sizeof(long long)));
              DHS_CUDA_CHECK(cudaMemset(cyc_d, 0, 14 * sizeof(long long)));
              b.flush_l2();
              dhs::cuda::launch_page_select(p, probe, b.stream);
              DHS_CUDA_CHECK(cudaStreamSynchronize(b.stream));
              probe.span_ns = nullptr;
              probe.block_ns = nullptr;
              probe.phase_cycles = nullptr;
              unsigned long long sp[10];
              DHS_CUDA_CHECK(cudaMemcpy(sp, span_d, sizeof sp, cudaMemcpyDeviceToHost));
              cudaFree(span_d);
              auto at = [&](int k) { return static_cast<double>(sp[k] - sp[0]) * 1e-3; };
              std::printf("%-7d %-6d %-30s pipeline spans (us from the score kernel's first entry): score 0-%.1f, "
                          "select %.1f-%.1f (last entry %.1f, released from its wait %.1f-%.1f), compact %.1f-%.1f\n", ctx, batch,
                          impl, at(1), at(2), at(3), at(9), at(6), at(7), at(4), at(5));
              print_blocks(" in the pipeline (us from the score kernel's first entry)", static_cast<long long>(sp[0]));
              print_timeline(" in the pipeline");
            }
            {  // Why select is slower in the pipeline than alone: the score kernel run first and
               // finished (no programmatic overlap), then select alone; and select right after
               // itself (its code and data warm).
              probe.phase_cycles = cyc_d;
              auto select_timeline = [&](const char* what) {
                DHS_CUDA_CHECK(cudaMemset(cyc_d, 0, 14 * sizeof(long long)));
                dhs::cuda::launch_page_select_stage(p, probe, 1, b.stream);
                DHS_CUDA_CHECK(cudaStreamSynchronize(b.stream));
                print_timeline(what);
              };
              b.flush_l2();
              dhs::cuda::launch_page_select_stage(p, 0, b.stream);
              DHS_CUDA_CHECK(cudaStreamSynchronize(b.stream));
              select_timeline(" after the score kernel ended");
              select_timeline(" right after itself");
              probe.phase_cycles = nullptr;
            }
            cudaFree(blk_d);
            cudaFree(cyc_d);
          }
          b.emit(b.out, impl, ctx, batch, t, sum_bytes, 1.0, ws, opt.min_pages);
          std::printf("%-7d %-6d %-30s %10.1f %8s %8.1f%% of dense\n", ctx, batch, impl, t.median_us, "-",
                      100.0 * t.median_us / td.median_us);
        }
      }
    cudaFree(sel_indptr);
    cudaFree(sel_slots);
    cudaFree(sel_pos);
    cudaFree(qp_d);
  }

  if (opt.tune) {
    // Variant sweep (stages x min pages per worker) on the shapes of the goals.
    std::printf("\ntuning (dense, median us): stages / min_pages\n");
    const int shapes[][2] = {{8192, 1}, {32768, 1}, {32768, 8}, {131072, 8}};
    for (int stages : {2, 3}) {
      dhs::cuda::DecodeAttentionWorkspace wt(32, kHq, kHkv, kD, 1, stages);
      for (const auto& sh : shapes) {
        const int ctx = sh[0], batch = sh[1];
        const int64_t n_pages = int64_t{batch} * kHkv * (ctx / kPage);
        if (n_pages > max_pages) continue;
        std::vector<int32_t> perm(static_cast<size_t>(n_pages));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        lists.upload(make_lists(batch, ctx, 1.0, perm, rng));
        std::printf("  stages %d workers %4d ctx %6d batch %2d:", stages, wt.n_workers(), ctx, batch);
        for (int mp : {2, 4, 8, 16}) {
          const Timing t = b.time_op(wt, batch, mp, 20);
          std::printf("  mp%-2d %7.1f", mp, t.median_us);
          b.emit(b.tune_out, "dhisparse-dense", ctx, batch, t, static_cast<double>(n_pages) * page_bytes, 1.0, wt,
                 mp);
        }
        std::printf("\n");
      }
    }
  }
  if (b.out) std::fclose(b.out);
  if (b.tune_out) std::fclose(b.tune_out);
  cudaFree(b.q_d);
  cudaFree(b.out_d);
  cudaFree(b.q_indptr_d);
  cudaFree(b.flush_d);
  return 0;
}
