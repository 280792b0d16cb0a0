// The hierarchy's device I/O engine: host tier in pinned mapped DRAM, the zero-copy page move
// kernel and the copy-engine forms; see page_recall.h and docs/kernels/page_recall_NOTES.md.
#include "backend/cuda/page_recall.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "dhisparse/error.h"

namespace dhs::cuda {

namespace {

// dhs::Error with a clear message, without pulling fmt into a .cu file (nvcc 13 rejects it).
void require(bool cond, const std::string& what) {
  if (!cond) throw Error(what);
}

constexpr int kThreads = kPageMoveThreads;
// 16-byte loads each thread issues before its first store: a block keeps 256 x 8 x 16 B = 32 KiB
// of reads in flight, the depth at which 8 blocks covered PCIe's latency in the anchor probe (one
// warp per 4 KiB page there). Bandwidth over PCIe is bytes in flight / latency, not SM count.
constexpr int kWordsPerThread = 8;
constexpr int kStepWords = kThreads * kWordsPerThread;  // 16-byte words per block and step

// Moves as one flat space of words: move m's K page is words [m * 2W, m * 2W + W), its V page the
// next W (W = page_words). Each block takes steps of kStepWords consecutive words (grid-strided):
// a warp's 32 loads are 512 contiguous bytes (of one page when W is a multiple of 32, as for every
// shape the engine uses), and a step spans several moves when pages are small. Every load of a
// step is issued before its stores.
__global__ void __launch_bounds__(kThreads) page_move_kernel(const __grid_constant__ PageMoveParams p) {
  // The count is read here, not passed by value: a graph replay takes the count written before it.
  const int n = min(max(*p.n_moves, 0), p.max_moves);
  const int move_words = 2 * p.page_words;
  // NOTE: int64: a million moves of 4 KiB K + V pages is 2^29 words, the slot offsets 2^31+.
  const int64_t total = static_cast<int64_t>(n) * move_words;
  const int2* moves = reinterpret_cast<const int2*>(p.moves);
  const uint4* src_k = reinterpret_cast<const uint4*>(p.src_k);
  const uint4* src_v = reinterpret_cast<const uint4*>(p.src_v);
  uint4* dst_k = reinterpret_cast<uint4*>(p.dst_k);
  uint4* dst_v = reinterpret_cast<uint4*>(p.dst_v);
  for (int64_t step = static_cast<int64_t>(blockIdx.x) * kStepWords; step < total;
       step += static_cast<int64_t>(gridDim.x) * kStepWords) {
    const int64_t m0 = step / move_words;                        // the first move the step touches
    const int first = static_cast<int>(step - m0 * move_words);  // its first word there, < move_words
    // Three passes so that each pass's loads are in flight together: the move pairs (L1/L2 hits:
    // a step touches a few moves), then the page words (PCIe or HBM), then the stores.
    int64_t m[kWordsPerThread];
    int w[kWordsPerThread];
    int2 mv[kWordsPerThread];
#pragma unroll
    for (int j = 0; j < kWordsPerThread; ++j) {
      const unsigned lw = static_cast<unsigned>(first + j * kThreads + static_cast<int>(threadIdx.x));
      m[j] = m0 + lw / static_cast<unsigned>(move_words);
      w[j] = static_cast<int>(lw % static_cast<unsigned>(move_words));
      mv[j] = m[j] < n ? __ldg(moves + m[j]) : make_int2(-1, -1);
    }
    uint4 r[kWordsPerThread];
    uint4* to[kWordsPerThread];  // null: nothing to store (past the last move, or a skipped move)
#pragma unroll
    for (int j = 0; j < kWordsPerThread; ++j) {
      to[j] = nullptr;
      if (m[j] >= n) continue;
      if (mv[j].x < 0 || mv[j].x >= p.n_src_pages || mv[j].y < 0 || mv[j].y >= p.n_dst_pages) {
        if (w[j] == 0 && p.n_bad != nullptr) atomicAdd(p.n_bad, 1);  // once per move: its word 0
        continue;
      }
      const bool is_v = w[j] >= p.page_words;
      const int off = is_v ? w[j] - p.page_words : w[j];
      // Streaming hints both ways: each byte crosses once, and the L2 lines attention reads beside
      // this copy should not make room for it.
      r[j] = __ldcs((is_v ? src_v : src_k) + static_cast<int64_t>(mv[j].x) * p.page_words + off);
      to[j] = (is_v ? dst_v : dst_k) + static_cast<int64_t>(mv[j].y) * p.page_words + off;
    }
#pragma unroll
    for (int j = 0; j < kWordsPerThread; ++j)
      if (to[j] != nullptr) __stcs(to[j], r[j]);
  }
}

void check_shapes(const char* op, int page_size_a, int head_dim_a, int page_size_b, int head_dim_b) {
  require(page_size_a == page_size_b && head_dim_a == head_dim_b,
          std::string(op) + ": the host tier and the device pool have different page shapes (" +
              std::to_string(page_size_a) + " x " + std::to_string(head_dim_a) + " against " +
              std::to_string(page_size_b) + " x " + std::to_string(head_dim_b) + ")");
}

void move_pages(const char* op, const DeviceMoveList& moves, PageMoveDirection want, const __half* src_k,
                const __half* src_v, int64_t n_src, __half* dst_k, __half* dst_v, int64_t n_dst, int page_elems,
                int n_blocks, cudaStream_t stream) {
  require(moves.direction() == want, std::string(op) + ": the move list is for the other direction");
  require(n_blocks >= 1 && n_blocks <= 65535, std::string(op) + ": n_blocks " + std::to_string(n_blocks) +
                                                  " outside 1..65535");
  PageMoveParams p;
  p.moves = moves.moves_d();
  p.n_moves = moves.count_d();
  p.src_k = src_k;
  p.src_v = src_v;
  p.dst_k = dst_k;
  p.dst_v = dst_v;
  p.max_moves = moves.capacity();
  p.n_src_pages = n_src;
  p.n_dst_pages = n_dst;
  p.page_words = page_elems / 8;  // head_dim % 8 == 0 (both pools require it)
  launch_page_move(p, n_blocks, stream);
}

// One copy-engine form over raw pools: K and V of each run, host-built.
int64_t copy_runs(const std::vector<PageRun>& runs, const __half* src_k, const __half* src_v, __half* dst_k,
                  __half* dst_v, size_t page_elems, cudaMemcpyKind kind, CopyEngineForm form, cudaStream_t stream) {
  const size_t page_bytes = page_elems * sizeof(__half);
  if (form == CopyEngineForm::PerRun) {
    for (const PageRun& r : runs) {
      const size_t s = static_cast<size_t>(r.src) * page_elems, d = static_cast<size_t>(r.dst) * page_elems;
      const size_t bytes = static_cast<size_t>(r.n) * page_bytes;
      DHS_CUDA_CHECK(cudaMemcpyAsync(dst_k + d, src_k + s, bytes, kind, stream));
      DHS_CUDA_CHECK(cudaMemcpyAsync(dst_v + d, src_v + s, bytes, kind, stream));
    }
    return static_cast<int64_t>(runs.size());
  }
  // Batches of at most kBatch copies per call (no documented limit; the arrays stay small).
  constexpr size_t kBatch = 16384;
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  dsts.reserve(std::min(2 * runs.size(), kBatch));
  srcs.reserve(dsts.capacity());
  sizes.reserve(dsts.capacity());
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;  // sources read in stream order, like cudaMemcpyAsync
  size_t attr_idx = 0;
  auto flush = [&] {
    if (dsts.empty()) return;
    DHS_CUDA_CHECK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr, &attr_idx, 1, stream));
    dsts.clear();
    srcs.clear();
    sizes.clear();
  };
  for (const PageRun& r : runs) {
    const size_t s = static_cast<size_t>(r.src) * page_elems, d = static_cast<size_t>(r.dst) * page_elems;
    const size_t bytes = static_cast<size_t>(r.n) * page_bytes;
    dsts.push_back(dst_k + d);
    srcs.push_back(src_k + s);
    sizes.push_back(bytes);
    dsts.push_back(dst_v + d);
    srcs.push_back(src_v + s);
    sizes.push_back(bytes);
    if (dsts.size() + 2 > kBatch) flush();
  }
  flush();
  return static_cast<int64_t>(runs.size());
}

}  // namespace

// ---- HostPagePool

HostPagePool::HostPagePool(int64_t n_pages, int page_size, int head_dim)
    : n_pages_(n_pages), page_size_(page_size), head_dim_(head_dim) {
  require(n_pages > 0 && n_pages < (int64_t{1} << 31), "HostPagePool: bad page count " + std::to_string(n_pages));
  require(page_size > 0 && head_dim > 0 && head_dim % 8 == 0,
          "HostPagePool: bad page shape " + std::to_string(page_size) + " x " + std::to_string(head_dim) +
              " (head_dim must be a multiple of 8: the move kernel copies 16-byte words)");
  const size_t half_bytes = static_cast<size_t>(n_pages) * page_elems() * sizeof(__half);  // K (or V)
  void* k = nullptr;
  void* v = nullptr;
  cudaError_t e = cudaHostAlloc(&k, half_bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  if (e == cudaSuccess) {
    e = cudaHostAlloc(&v, half_bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    if (e != cudaSuccess) cudaFreeHost(k);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();  // (not sticky, but leave no error behind for the next check)
    char msg[320];
    std::snprintf(msg, sizeof msg,
                  "HostPagePool: cannot allocate %.2f GiB of pinned, mapped host memory for the host tier "
                  "(%lld pages of %d x %d f16, K and V): %s (%s)",
                  2.0 * static_cast<double>(half_bytes) / static_cast<double>(size_t{1} << 30),
                  static_cast<long long>(n_pages), page_size, head_dim, cudaGetErrorName(e), cudaGetErrorString(e));
    throw Error(msg);
  }
  k_h_ = static_cast<__half*>(k);
  v_h_ = static_cast<__half*>(v);
  void* kd = nullptr;
  void* vd = nullptr;
  e = cudaHostGetDevicePointer(&kd, k, 0);
  if (e == cudaSuccess) e = cudaHostGetDevicePointer(&vd, v, 0);
  if (e != cudaSuccess) {
    cudaFreeHost(k);
    cudaFreeHost(v);
    check(e, "HostPagePool: cudaHostGetDevicePointer", __FILE__, __LINE__);
  }
  k_d_ = static_cast<__half*>(kd);
  v_d_ = static_cast<__half*>(vd);
}

HostPagePool::~HostPagePool() {
  cudaFreeHost(k_h_);
  cudaFreeHost(v_h_);
}

// ---- DeviceMoveList

DeviceMoveList::DeviceMoveList(int capacity, PageMoveDirection direction) : capacity_(capacity), direction_(direction) {
  require(capacity >= 0 && capacity < (1 << 30), "DeviceMoveList: bad capacity " + std::to_string(capacity));
  DHS_CUDA_CHECK(cudaMalloc(&moves_d_, static_cast<size_t>(std::max(capacity, 1)) * 2 * sizeof(int32_t)));
  DHS_CUDA_CHECK(cudaMalloc(&count_d_, sizeof(int32_t)));
  DHS_CUDA_CHECK(cudaMemset(count_d_, 0, sizeof(int32_t)));
}

DeviceMoveList::~DeviceMoveList() {
  cudaFree(moves_d_);
  cudaFree(count_d_);
}

void DeviceMoveList::upload(std::span<const PageMove> moves) {
  require(moves.size() <= static_cast<size_t>(capacity_), "DeviceMoveList::upload: " + std::to_string(moves.size()) +
                                                              " moves, capacity " + std::to_string(capacity_));
  const Tier src = direction_ == PageMoveDirection::Recall ? Tier::Host : Tier::Device;
  const Tier dst = direction_ == PageMoveDirection::Recall ? Tier::Device : Tier::Host;
  std::vector<int32_t> pairs(2 * moves.size());
  for (size_t i = 0; i < moves.size(); ++i) {
    require(moves[i].src.tier == src && moves[i].dst.tier == dst,
            "DeviceMoveList::upload: move " + std::to_string(i) + " is not " + tier_name(src) + " -> " + tier_name(dst));
    pairs[2 * i] = moves[i].src.slot;
    pairs[2 * i + 1] = moves[i].dst.slot;
  }
  const int32_t count = static_cast<int32_t>(moves.size());
  if (!pairs.empty())
    DHS_CUDA_CHECK(cudaMemcpy(moves_d_, pairs.data(), pairs.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  DHS_CUDA_CHECK(cudaMemcpy(count_d_, &count, sizeof count, cudaMemcpyHostToDevice));
}

// ---- The kernel's launcher and ops

namespace {

// One thread per 16-byte word of the moved rows.
__global__ void move_rows_kernel(uint4* base, int64_t row_words, const int2* pairs, int n) {
  const int64_t total = static_cast<int64_t>(n) * row_words;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / row_words, w = i - m * row_words;
    const int2 pr = pairs[m];
    base[static_cast<int64_t>(pr.y) * row_words + w] = base[static_cast<int64_t>(pr.x) * row_words + w];
  }
}

}  // namespace

void launch_move_rows(void* base, int64_t row_bytes, const int32_t* pairs, int n, cudaStream_t stream) {
  if (n <= 0) return;
  require(row_bytes > 0 && row_bytes % 16 == 0, "launch_move_rows: row bytes must be a positive multiple of 16");
  const int64_t words = static_cast<int64_t>(n) * (row_bytes / 16);
  const int blocks = static_cast<int>(std::min<int64_t>((words + 255) / 256, 1024));
  move_rows_kernel<<<blocks, 256, 0, stream>>>(static_cast<uint4*>(base), row_bytes / 16, reinterpret_cast<const int2*>(pairs), n);
  DHS_CUDA_CHECK(cudaGetLastError());
}

void launch_page_move(const PageMoveParams& p, int n_blocks, cudaStream_t stream) {
  if (n_blocks <= 0 || p.max_moves <= 0) return;
  // The SM's shared memory / L1 split that decode attention needs (2 blocks of 112 KiB per SM):
  // blocks of kernels asking for different splits may not share an SM, and this kernel uses no
  // shared memory, so it asks for the largest and can sit beside attention's blocks (its 70
  // registers fit their leftover; docs/kernels/page_recall_NOTES.md).
  constexpr int kMaxDevices = 64;
  static bool configured[kMaxDevices] = {};
  int dev = 0;
  DHS_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < kMaxDevices && !configured[dev]) {
    DHS_CUDA_CHECK(cudaFuncSetAttribute(page_move_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
    configured[dev] = true;
  }
  page_move_kernel<<<static_cast<unsigned>(n_blocks), kThreads, 0, stream>>>(p);
  DHS_CUDA_CHECK(cudaGetLastError());
}

void recall_pages(const DeviceMoveList& moves, const HostPagePool& host, DevicePagePool& dev, cudaStream_t stream,
                  int n_blocks) {
  check_shapes("recall_pages", host.page_size(), host.head_dim(), dev.page_size(), dev.head_dim());
  move_pages("recall_pages", moves, PageMoveDirection::Recall, host.k_d(), host.v_d(), host.n_pages(), dev.k_d(),
             dev.v_d(), dev.n_pages(), static_cast<int>(dev.page_elems()), n_blocks, stream);
}

void evict_pages(const DeviceMoveList& moves, const DevicePagePool& dev, HostPagePool& host, cudaStream_t stream,
                 int n_blocks) {
  check_shapes("evict_pages", host.page_size(), host.head_dim(), dev.page_size(), dev.head_dim());
  move_pages("evict_pages", moves, PageMoveDirection::Evict, dev.k_d(), dev.v_d(), dev.n_pages(), host.k_d(),
             host.v_d(), host.n_pages(), static_cast<int>(dev.page_elems()), n_blocks, stream);
}

// ---- Copy-engine forms

std::vector<PageRun> coalesce_page_moves(std::span<const PageMove> moves, Tier src_tier, int64_t n_src, Tier dst_tier,
                                         int64_t n_dst) {
  std::vector<PageRun> runs;
  for (size_t i = 0; i < moves.size(); ++i) {
    const PageMove& m = moves[i];
    require(m.src.tier == src_tier && m.dst.tier == dst_tier, "page move " + std::to_string(i) + " is not " +
                                                                  tier_name(src_tier) + " -> " + tier_name(dst_tier));
    require(m.src.slot >= 0 && m.src.slot < n_src && m.dst.slot >= 0 && m.dst.slot < n_dst,
            "page move " + std::to_string(i) + " names a slot outside its pool (" + std::to_string(m.src.slot) +
                " -> " + std::to_string(m.dst.slot) + ")");
    if (!runs.empty() && runs.back().src + runs.back().n == m.src.slot && runs.back().dst + runs.back().n == m.dst.slot)
      ++runs.back().n;
    else
      runs.push_back({m.src.slot, m.dst.slot, 1});
  }
  return runs;
}

int64_t recall_pages_copy_engine(std::span<const PageMove> moves, const HostPagePool& host, DevicePagePool& dev,
                                 CopyEngineForm form, cudaStream_t stream) {
  check_shapes("recall_pages_copy_engine", host.page_size(), host.head_dim(), dev.page_size(), dev.head_dim());
  require(form != CopyEngineForm::Batch || (stream != nullptr && stream != cudaStreamLegacy),
          "recall_pages_copy_engine: cudaMemcpyBatchAsync needs a stream other than the legacy null stream");
  const auto runs = coalesce_page_moves(moves, Tier::Host, host.n_pages(), Tier::Device, dev.n_pages());
  return copy_runs(runs, host.k_h(), host.v_h(), dev.k_d(), dev.v_d(), dev.page_elems(), cudaMemcpyHostToDevice, form,
                   stream);
}

int64_t evict_pages_copy_engine(std::span<const PageMove> moves, const DevicePagePool& dev, HostPagePool& host,
                                CopyEngineForm form, cudaStream_t stream) {
  check_shapes("evict_pages_copy_engine", host.page_size(), host.head_dim(), dev.page_size(), dev.head_dim());
  require(form != CopyEngineForm::Batch || (stream != nullptr && stream != cudaStreamLegacy),
          "evict_pages_copy_engine: cudaMemcpyBatchAsync needs a stream other than the legacy null stream");
  const auto runs = coalesce_page_moves(moves, Tier::Device, dev.n_pages(), Tier::Host, host.n_pages());
  return copy_runs(runs, dev.k_d(), dev.v_d(), host.k_h(), host.v_h(), dev.page_elems(), cudaMemcpyDeviceToHost, form,
                   stream);
}

}  // namespace dhs::cuda
