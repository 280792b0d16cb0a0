#include "backend/cuda/lru_select.h"

#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "backend/cuda/cuda_check.h"

namespace dhs::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kItems = 4;  // per thread in the placing kernel's tiles
constexpr int kTile = kThreads * kItems;
constexpr int kSmemHistInts = 12288;  // 48 KB: the histogram in shared memory up to this many (want, bin) counters

struct Order {
  int64_t now;
  int P, B;
  bool cyclic;
  // BucketedLru::order_bin_at (kv/bucketed_lru.cpp), the same integer arithmetic (u <= now).
  __device__ int bin(int64_t u) const {
    if (!cyclic) {
      const int64_t oldest = now / P - (B - 1);
      return static_cast<int>((max(u / P, oldest) - oldest) * P);
    }
    const int64_t age = min((now - u) / P, static_cast<int64_t>(B - 1));
    return static_cast<int>(((B - 1) - age) * P + min(now - age * P - u, static_cast<int64_t>(P - 1)));
  }
};

struct Candidates {
  const int32_t* last_use;  // offsets from base
  int64_t base;
  const int32_t* owner;
  const uint8_t* pinned;
  const int32_t* want_of_owner;
  int32_t n_owners;
  const int64_t* want_n;
  __device__ int64_t use(int32_t s) const { return base + last_use[s]; }
  // The want slot s is a candidate of (its owner's, if that wants any), or -1.
  __device__ int want(int32_t s) const {
    const int32_t o = owner[s];
    if (o < 0 || o >= n_owners || (pinned && pinned[s])) return -1;
    const int32_t w = want_of_owner[o];
    return w >= 0 && want_n[w] > 0 ? w : -1;
  }
};

// 1. Candidates per (want, bin); a candidate used after now is the error.
__global__ void lru_hist_kernel(Candidates c, Order ord, int32_t n_slots, int n_bins, int n_keys, bool smem,
                                int32_t* __restrict__ hist, int32_t* __restrict__ error_slot) {
  extern __shared__ int32_t sh[];
  if (smem) {
    for (int i = threadIdx.x; i < n_keys; i += blockDim.x) sh[i] = 0;
    __syncthreads();
  }
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_slots;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t s = static_cast<int32_t>(i);
    const int w = c.want(s);
    if (w < 0) continue;
    const int64_t u = c.use(s);
    if (u > ord.now) {
      atomicMin(error_slot, s);  // (the lowest such slot, whatever the schedule)
      continue;
    }
    const int k = w * n_bins + ord.bin(u);
    if (smem) atomicAdd(&sh[k], 1);
    else atomicAdd(&hist[k], 1);
  }
  if (smem) {
    __syncthreads();
    for (int i = threadIdx.x; i < n_keys; i += blockDim.x)
      if (sh[i]) atomicAdd(&hist[i], sh[i]);
  }
}

// 2. Per want (a block each): the cut — the first bin where the count so far reaches n — and
// what it gives (n less the bins before it); the histogram rewritten as each bin's first output
// position (candidates in earlier bins); the want's victim count. Taking every candidate: cut =
// n_bins. Wanting nothing: cut = -1.
__global__ void lru_cut_kernel(const int64_t* __restrict__ want_n, int n_bins, int32_t* __restrict__ hist,
                               int32_t* __restrict__ cut, int64_t* __restrict__ out_count) {
  using Scan = cub::BlockScan<int32_t, kThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int32_t found;
  const int w = blockIdx.x;
  const int64_t n = want_n[w];
  int32_t* h = hist + static_cast<int64_t>(w) * n_bins;
  if (n <= 0) {
    if (threadIdx.x == 0) {
      cut[2 * w] = -1;
      cut[2 * w + 1] = 0;
      out_count[w] = 0;
    }
    return;
  }
  int64_t before = 0;  // candidates in the tiles before
  int32_t cut_bin = n_bins;
  for (int t = 0; t < n_bins; t += kThreads) {
    const int i = t + static_cast<int>(threadIdx.x);
    const int32_t mine = i < n_bins ? h[i] : 0;
    int32_t excl, total;
    Scan(scan).ExclusiveSum(mine, excl, total);
    if (threadIdx.x == 0) found = n_bins;
    __syncthreads();
    const int64_t at = before + excl;  // candidates in the bins before bin i
    if (i < n_bins) h[i] = static_cast<int32_t>(at);
    if (cut_bin == n_bins && i < n_bins && at + mine >= n) atomicMin(&found, i);
    __syncthreads();
    if (cut_bin == n_bins && found < n_bins) cut_bin = found;
    before += total;
    __syncthreads();
  }
  // (give: n less the candidates before the cut bin; from the positions just written)
  if (threadIdx.x == 0) {
    const int32_t give = cut_bin < n_bins ? static_cast<int32_t>(n - h[cut_bin]) : 0;
    cut[2 * w] = cut_bin;
    cut[2 * w + 1] = give;
    out_count[w] = min(n, before);
  }
}

__global__ void lru_error_reset_kernel(int32_t* error_slot) { *error_slot = kNoError; }

// The wants' first output positions: an exclusive sum of their counts (few wants: one thread).
__global__ void lru_first_kernel(const int64_t* __restrict__ out_count, int n_wants, int64_t* __restrict__ out_first) {
  int64_t at = 0;
  for (int w = 0; w < n_wants; ++w) {
    out_first[w] = at;
    at += out_count[w];
  }
}

// 3. The slots at or before their want's cut (CUB's DeviceSelect::If over the slot indices).
struct AtOrBeforeCut {
  Candidates c;
  Order ord;
  const int32_t* cut;
  __device__ bool operator()(int32_t s) const {
    const int w = c.want(s);
    if (w < 0) return false;
    const int64_t u = c.use(s);
    return u <= ord.now && ord.bin(u) <= cut[2 * w];
  }
};

struct MaxOp {
  __device__ int32_t operator()(int32_t a, int32_t b) const { return a > b ? a : b; }
};
using SlotIndices = thrust::counting_iterator<int32_t>;

// 4. Per want (a block each): its items of the compacted list, in slot order, a tile at a time;
// within a tile sorted by bin (stable), each at its bin's first position plus the bin's count
// so far plus its rank in the tile's run of that bin; the cut bin's past `give` dropped.
__global__ void lru_place_kernel(Candidates c, Order ord, int n_bins, const int32_t* __restrict__ list,
                                 const int32_t* __restrict__ list_n, const int32_t* __restrict__ hist,
                                 const int32_t* __restrict__ cut, const int64_t* __restrict__ out_first,
                                 const int64_t* __restrict__ out_count, int32_t* __restrict__ out_slots) {
  using Sort = cub::BlockRadixSort<int32_t, kThreads, kItems, int32_t>;
  using Scan = cub::BlockScan<int32_t, kThreads>;
  __shared__ union {
    typename Sort::TempStorage sort;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ int32_t key_at[kTile];
  __shared__ int32_t tile_wrote;
  extern __shared__ int32_t so_far[];  // [n_bins] this want's items placed per bin
  const int w = blockIdx.x;
  const int32_t cut_bin = cut[2 * w], give = cut[2 * w + 1];
  const int64_t want_total = out_count[w];
  if (cut_bin < 0 || want_total == 0) return;
  const int32_t* pos = hist + static_cast<int64_t>(w) * n_bins;
  const int64_t first = out_first[w];
  for (int i = threadIdx.x; i < n_bins; i += blockDim.x) so_far[i] = 0;
  int end_bit = 1;
  while ((1 << end_bit) <= n_bins) ++end_bit;  // keys 0 .. n_bins (n_bins: not this want's)
  const int64_t n = *list_n;
  int64_t placed = 0;  // this want's victims written so far: all of them, and the block is done
  __syncthreads();
  for (int64_t t = 0; t < n && placed < want_total; t += kTile) {
    if (threadIdx.x == 0) tile_wrote = 0;  // (read before the last barrier of the round before)
    int32_t key[kItems], slot[kItems];
    for (int j = 0; j < kItems; ++j) {
      const int64_t i = t + static_cast<int64_t>(threadIdx.x) * kItems + j;  // blocked: list order
      key[j] = n_bins;
      slot[j] = -1;
      if (i < n) {
        const int32_t s = list[i];
        if (c.want(s) == w) {
          key[j] = ord.bin(c.use(s));
          slot[j] = s;
        }
      }
    }
    Sort(tmp.sort).Sort(key, slot, 0, end_bit);
    __syncthreads();
    for (int j = 0; j < kItems; ++j) key_at[threadIdx.x * kItems + j] = key[j];
    __syncthreads();
    // Each item's run start (the first position of its bin in the tile): a max-scan of starts.
    int32_t is_start[kItems], start[kItems];
    for (int j = 0; j < kItems; ++j) {
      const int p = static_cast<int>(threadIdx.x) * kItems + j;
      is_start[j] = p == 0 || key_at[p - 1] != key[j] ? p : 0;
    }
    Scan(tmp.scan).InclusiveScan(is_start, start, MaxOp{});
    int wrote = 0;
    for (int j = 0; j < kItems; ++j) {
      const int p = static_cast<int>(threadIdx.x) * kItems + j;
      const int32_t k = key[j];
      if (k >= n_bins) continue;
      const int32_t in_bin = so_far[k] + (p - start[j]);
      if (k < cut_bin || in_bin < give) {
        out_slots[first + pos[k] + in_bin] = slot[j];
        ++wrote;
      }
    }
    if (wrote) atomicAdd(&tile_wrote, wrote);
    __syncthreads();
    placed += tile_wrote;
    for (int j = 0; j < kItems; ++j) {
      const int p = static_cast<int>(threadIdx.x) * kItems + j;
      const int32_t k = key[j];
      if (k < n_bins && (p == kTile - 1 || key_at[p + 1] != k)) so_far[k] += p - start[j] + 1;  // a run's last item
    }
    __syncthreads();
  }
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("lru_select: " + what);
}

}  // namespace

LruSelectScratch::LruSelectScratch(int32_t max_slots, int max_wants, int n_bins)
    : max_slots_(max_slots), max_wants_(max_wants), n_bins_(n_bins) {
  require(max_slots >= 0 && max_wants >= 1 && n_bins >= 1 && n_bins <= kMaxBins &&
              static_cast<int64_t>(max_wants) * n_bins <= INT32_MAX,
          "scratch of " + std::to_string(max_slots) + " slots, " + std::to_string(max_wants) + " wants, " +
              std::to_string(n_bins) + " bins (1 .. " + std::to_string(kMaxBins) + ")");
  DHS_CUDA_CHECK(cudaMalloc(&hist_, static_cast<size_t>(max_wants) * n_bins * 4));
  DHS_CUDA_CHECK(cudaMalloc(&cut_, static_cast<size_t>(max_wants) * 2 * 4));
  DHS_CUDA_CHECK(cudaMalloc(&list_, std::max<size_t>(static_cast<size_t>(max_slots) * 4, 4)));
  DHS_CUDA_CHECK(cudaMalloc(&list_n_, 4));
  DHS_CUDA_CHECK(cub::DeviceSelect::If(nullptr, temp_bytes_, SlotIndices(0), list_, list_n_,
                                       std::max<int32_t>(max_slots, 1), AtOrBeforeCut{}));
  DHS_CUDA_CHECK(cudaMalloc(&temp_, std::max<size_t>(temp_bytes_, 16)));
}

LruSelectScratch::~LruSelectScratch() {
  cudaFree(hist_);
  cudaFree(cut_);
  cudaFree(list_);
  cudaFree(list_n_);
  cudaFree(temp_);
}

void launch_lru_select(const LruSelectParams& p, LruSelectScratch& sc, cudaStream_t stream) {
  if (p.n_wants <= 0) return;
  const int nb = p.lru.n_buckets * p.lru.bucket_steps, n_keys = p.n_wants * nb;  // (<= max_wants x n_bins: the scratch's)
  const Candidates c{p.last_use, p.use_base, p.owner, p.pinned, p.want_of_owner, p.n_owners, p.want_n};
  const Order ord{p.now, p.lru.bucket_steps, p.lru.n_buckets, p.lru.cyclic};
  DHS_CUDA_CHECK(cudaMemsetAsync(sc.hist_, 0, static_cast<size_t>(n_keys) * 4, stream));
  lru_error_reset_kernel<<<1, 1, 0, stream>>>(p.error_slot);
  DHS_CUDA_CHECK(cudaMemsetAsync(sc.list_n_, 0, 4, stream));
  const bool smem = n_keys <= kSmemHistInts;
  static const int max_blocks = [] {
    int dev = 0, sms = 0;
    DHS_CUDA_CHECK(cudaGetDevice(&dev));
    DHS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return 8 * std::max(sms, 1);
  }();
  const int blocks = static_cast<int>(std::clamp<int64_t>((static_cast<int64_t>(p.n_slots) + kThreads - 1) / kThreads, 1, max_blocks));
  if (p.n_slots > 0)
    lru_hist_kernel<<<blocks, kThreads, smem ? static_cast<size_t>(n_keys) * 4 : 0, stream>>>(c, ord, p.n_slots, nb, n_keys, smem,
                                                                                               sc.hist_, p.error_slot);
  lru_cut_kernel<<<p.n_wants, kThreads, 0, stream>>>(p.want_n, nb, sc.hist_, sc.cut_, p.out_count);
  lru_first_kernel<<<1, 1, 0, stream>>>(p.out_count, p.n_wants, p.out_first);
  if (p.n_slots == 0) return;
  // The slot indices, compacted where at or before their want's cut (slot order kept).
  size_t bytes = sc.temp_bytes_;
  DHS_CUDA_CHECK(cub::DeviceSelect::If(sc.temp_, bytes, SlotIndices(0), sc.list_, sc.list_n_, p.n_slots, AtOrBeforeCut{c, ord, sc.cut_},
                                       stream));
  lru_place_kernel<<<p.n_wants, kThreads, static_cast<size_t>(nb) * 4, stream>>>(c, ord, nb, sc.list_, sc.list_n_, sc.hist_,
                                                                                   sc.cut_, p.out_first, p.out_count, p.out_slots);
}

std::vector<std::vector<int32_t>> lru_select(const LruSelectParams& p, LruSelectScratch& sc, cudaStream_t stream) {
  const int nb = p.lru.n_buckets * p.lru.bucket_steps;
  require(p.lru.bucket_steps >= 1 && p.lru.n_buckets >= 1 && nb == sc.n_bins(),
          std::to_string(nb) + " bins for a scratch of " + std::to_string(sc.n_bins()));
  require(p.n_slots >= 0 && p.n_slots <= sc.max_slots(), std::to_string(p.n_slots) + " slots for a scratch of " +
                                                              std::to_string(sc.max_slots()));
  require(p.n_wants >= 1 && p.n_wants <= sc.max_wants(), std::to_string(p.n_wants) + " wants for a scratch of " +
                                                              std::to_string(sc.max_wants()));
  require(p.now >= 0 && p.n_owners >= 0, "now and the owner count must be >= 0");
  require(p.n_slots == 0 || (p.last_use && p.owner && p.want_of_owner && p.out_slots), "missing arrays");
  require(p.want_n && p.out_first && p.out_count && p.error_slot, "missing outputs");
  launch_lru_select(p, sc, stream);
  DHS_CUDA_CHECK(cudaGetLastError());
  int32_t err = kNoError;
  DHS_CUDA_CHECK(cudaMemcpyAsync(&err, p.error_slot, 4, cudaMemcpyDeviceToHost, stream));
  std::vector<int64_t> first(static_cast<size_t>(p.n_wants)), count(static_cast<size_t>(p.n_wants));
  DHS_CUDA_CHECK(cudaMemcpyAsync(first.data(), p.out_first, first.size() * 8, cudaMemcpyDeviceToHost, stream));
  DHS_CUDA_CHECK(cudaMemcpyAsync(count.data(), p.out_count, count.size() * 8, cudaMemcpyDeviceToHost, stream));
  DHS_CUDA_CHECK(cudaStreamSynchronize(stream));
  require(err == kNoError, "slot " + std::to_string(err) + " was used after step " + std::to_string(p.now));
  int64_t total = 0;
  for (int64_t n : count) total += n;
  std::vector<int32_t> all(static_cast<size_t>(total));
  if (total > 0) DHS_CUDA_CHECK(cudaMemcpy(all.data(), p.out_slots, all.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(p.n_wants));
  for (int w = 0; w < p.n_wants; ++w)
    out[static_cast<size_t>(w)].assign(all.begin() + first[static_cast<size_t>(w)],
                                       all.begin() + first[static_cast<size_t>(w)] + count[static_cast<size_t>(w)]);
  return out;
}

}  // namespace dhs::cuda
