#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_page_table.h"
#include "backend/cuda/pdl_launch.h"
#include "backend/cuda/ptx.cuh"

#include <algorithm>

namespace dhs::cuda {

DevicePageTable::DevicePageTable(int max_requests, int n_layers, int n_heads_kv, int64_t max_pages)
    : max_requests_(max_requests),
      n_layers_(n_layers),
      n_heads_kv_(n_heads_kv),
      n_lists_(n_layers * n_heads_kv),
      max_pages_(max_pages),
      synced_(static_cast<size_t>(max_requests), 0),
      table_id_(static_cast<size_t>(max_requests), 0) {
  const size_t n = static_cast<size_t>(max_requests) * n_lists_ * max_pages;
  DHS_CUDA_CHECK(cudaMalloc(&table_d_, n * sizeof(int32_t)));
  DHS_CUDA_CHECK(cudaMemset(table_d_, 0xff, n * sizeof(int32_t)));
  // A decode step adds at most one page per list and request; a whole request's table fits too.
  staging_cap_ = static_cast<int64_t>(n_lists_) * std::max<int64_t>(max_pages, 2 * int64_t{max_requests});
  DHS_CUDA_CHECK(cudaMallocHost(&staging_h_, static_cast<size_t>(staging_cap_) * sizeof(int32_t)));
}

DevicePageTable::~DevicePageTable() {
  cudaFree(table_d_);
  cudaFree(winner_d_);
  cudaFreeHost(staging_h_);
  cudaFree(patch_d_);
  cudaFreeHost(patch_h_);
}

int32_t DevicePageTable::key_of(const PageTable& t, int layer, int head, int64_t idx) const {
  const PageRef p = t.page(layer, head, idx);
  return p.tier == Tier::Device || n_device_ == 0 ? p.slot : static_cast<int32_t>(n_device_ + p.slot);
}

void DevicePageTable::patch(const PageTable& t, int layer, int head, int64_t idx) {
  // The request slots that hold t (a step patches many pages of few tables: the last table's
  // slots are kept until sync changes a slot's table).
  if (patch_reqs_id_ != t.id()) {
    patch_reqs_.clear();
    for (int req = 0; req < max_requests_; ++req)
      if (table_id_[static_cast<size_t>(req)] == t.id()) patch_reqs_.push_back(req);
    patch_reqs_id_ = t.id();
  }
  for (const int req : patch_reqs_) {
    if (idx >= synced_[static_cast<size_t>(req)]) continue;
    const int64_t off = (static_cast<int64_t>(req) * n_lists_ + static_cast<int64_t>(layer) * n_heads_kv_ + head) * max_pages_ + idx;
    patches_.push_back({off, key_of(t, layer, head, idx), 0});
    ++n_patches_;
  }
}

namespace {

// A page patched twice between flushes: the later record wins. Three passes over the records
// (pairs: [n] Patch records (offset, key, pad) read as int64 words), with `winner` a -1-filled
// array the table's size: each record claims its entry with its index (the largest wins), the
// winners write their keys, the claims are reset to -1. The host sorted the records to keep each
// entry's last before (session 28: 20-45 ms a step at 128k x 4 with 5.5% churn, ~430k records).
__global__ void claim_patches_kernel(int32_t* winner, const int64_t* pairs, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) atomicMax(winner + pairs[2 * i], static_cast<int32_t>(i));
}
__global__ void apply_patches_kernel(int32_t* table, const int32_t* winner, const int64_t* pairs, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t off = pairs[2 * i];
  if (winner[off] == static_cast<int32_t>(i)) table[off] = static_cast<int32_t>(pairs[2 * i + 1] & 0xffffffffll);
}
__global__ void reset_patches_kernel(int32_t* winner, const int64_t* pairs, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) winner[pairs[2 * i]] = -1;
}

}  // namespace

void DevicePageTable::flush_patches(cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(patches_.size());
  if (n == 0) return;
  if (!winner_d_) {  // (first flush: the claims' array, the table's size, all -1)
    const size_t cells = static_cast<size_t>(max_requests_) * n_lists_ * max_pages_;
    DHS_CUDA_CHECK(cudaMalloc(&winner_d_, cells * sizeof(int32_t)));
    DHS_CUDA_CHECK(cudaMemsetAsync(winner_d_, 0xff, cells * sizeof(int32_t), stream));
  }
  const int64_t m = static_cast<int64_t>(patches_.size());
  if (patches_used_ + m > patch_cap_) {
    // Grow (rare: the first large recall): wait for the copies in flight, then reallocate.
    DHS_CUDA_CHECK(cudaStreamSynchronize(stream));
    patches_used_ = 0;
    if (m > patch_cap_) {  // (the new buffers first: a failed allocation leaves the old ones in place)
      const int64_t cap = std::max<int64_t>(m, 2 * patch_cap_ + 1024);
      Patch *h = nullptr, *d = nullptr;
      DHS_CUDA_CHECK(cudaMallocHost(&h, static_cast<size_t>(cap) * sizeof(Patch)));
      if (cudaMalloc(&d, static_cast<size_t>(cap) * sizeof(Patch)) != cudaSuccess) {
        cudaFreeHost(h);
        check(cudaErrorMemoryAllocation, "DevicePageTable::flush_patches: no device memory for the patches", __FILE__, __LINE__);
      }
      cudaFree(patch_d_);
      cudaFreeHost(patch_h_);
      patch_h_ = h;
      patch_d_ = d;
      patch_cap_ = cap;
    }
  }
  Patch* h = patch_h_ + patches_used_;
  Patch* d = patch_d_ + patches_used_;
  std::copy(patches_.begin(), patches_.end(), h);
  patches_used_ += m;
  DHS_CUDA_CHECK(cudaMemcpyAsync(d, h, static_cast<size_t>(m) * sizeof(Patch), cudaMemcpyHostToDevice, stream));
  const auto* pairs = reinterpret_cast<const int64_t*>(d);
  const unsigned blocks = static_cast<unsigned>((m + 255) / 256);
  claim_patches_kernel<<<blocks, 256, 0, stream>>>(winner_d_, pairs, m);
  apply_patches_kernel<<<blocks, 256, 0, stream>>>(table_d_, winner_d_, pairs, m);
  reset_patches_kernel<<<blocks, 256, 0, stream>>>(winner_d_, pairs, m);
  DHS_CUDA_CHECK(cudaGetLastError());
  patches_.clear();
  n_patches_ = 0;
}

void DevicePageTable::sync(int req, const PageTable& t, cudaStream_t stream) {
  if (req < 0 || req >= max_requests_) check(cudaErrorInvalidValue, "DevicePageTable::sync: bad request slot", __FILE__, __LINE__);
  if (table_id_[static_cast<size_t>(req)] != t.id()) {  // another request now uses this slot
    table_id_[static_cast<size_t>(req)] = t.id();
    patch_reqs_id_ = kNoTable;  // (patch's cache of a table's slots)
    synced_[static_cast<size_t>(req)] = 0;
  }
  // Pages past the table's low-water mark may have been freed and reallocated since the last copy.
  const int64_t have = std::min(synced_[static_cast<size_t>(req)], t.take_low_water_pages());
  const int64_t want = t.n_pages_per_list();
  if (want > max_pages_) check(cudaErrorInvalidValue, "DevicePageTable::sync: request longer than max_pages", __FILE__, __LINE__);
  if (want <= have) {
    synced_[static_cast<size_t>(req)] = want;  // truncated: stale tail entries are never read
    return;
  }
  const int64_t n_new = want - have;
  if (staging_used_ + n_new * n_lists_ > staging_cap_) {
    // Full (many requests' first pages in one step): wait for the copies in flight to read it.
    DHS_CUDA_CHECK(cudaStreamSynchronize(stream));
    staging_used_ = 0;
  }
  int32_t* stage = staging_h_ + staging_used_;
  staging_used_ += n_new * n_lists_;
  // Staging laid out [n_lists, n_new]; one 2-D copy into the request's rows.
  for (int l = 0; l < n_layers_; ++l)
    for (int h = 0; h < n_heads_kv_; ++h)
      for (int64_t i = 0; i < n_new; ++i)
        stage[(static_cast<int64_t>(l) * n_heads_kv_ + h) * n_new + i] = key_of(t, l, h, have + i);
  int32_t* dst = table_d_ + (static_cast<int64_t>(req) * n_lists_) * max_pages_ + have;
  DHS_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(max_pages_) * 4, stage, static_cast<size_t>(n_new) * 4,
                                   static_cast<size_t>(n_new) * 4, static_cast<size_t>(n_lists_),
                                   cudaMemcpyHostToDevice, stream));
  synced_[static_cast<size_t>(req)] = want;
}

namespace {

constexpr int kDenseListThreads = 256;
constexpr int kDenseListPerThread = 4;
constexpr int kDenseListChunk = kDenseListThreads * kDenseListPerThread;  // pages per block

// grid (n_requests * n_heads_kv, ceil(max_pages / kDenseListChunk)): block (row, c) copies pages
// [c * chunk, (c + 1) * chunk) of its row. (v1 had one block per row: a row of 8,192 pages took
// 13.8 us on the H200, one load-store round trip per 256 pages; docs/kernels/ops_NOTES.md.)
__global__ void __launch_bounds__(kDenseListThreads) dense_lists_kernel(const __grid_constant__ DenseListsParams p) {
  // The lists are read by earlier kernels of the step (the previous layer's attention), so the
  // writes wait (pdl_launch.h).
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  const int row = blockIdx.x;  // req * n_heads_kv + head
  const int req = row / p.n_heads_kv, head = row % p.n_heads_kv;
  const int n = (__ldg(p.seq_len + req) + p.page_size - 1) / p.page_size;
  const int first = static_cast<int>(blockIdx.y) * kDenseListChunk;
  if (blockIdx.y > 0 && first >= n) return;
  __shared__ int s_start;
  if (threadIdx.x == 0) {
    // Offset of this row = pages of all earlier requests (every head) + earlier heads of this one.
    int start = 0;
    for (int r = 0; r < req; ++r) start += p.n_heads_kv * ((__ldg(p.seq_len + r) + p.page_size - 1) / p.page_size);
    start += head * n;
    s_start = start;
    if (blockIdx.y == 0) {
      p.indptr[row] = start;
      if (row == p.n_requests * p.n_heads_kv - 1) p.indptr[row + 1] = start + n;
    }
  }
  __syncthreads();
  const int32_t* __restrict__ src =
      p.table + ((static_cast<int64_t>(__ldg(p.req_slot + req)) * p.n_layers + p.layer) * p.n_heads_kv + head) * p.max_pages;
  int32_t* __restrict__ slots = p.slots + s_start;
  int32_t* __restrict__ page_pos = p.page_pos + s_start;
  const int i0 = first + static_cast<int>(threadIdx.x) * kDenseListPerThread;
  // All of a thread's loads before its stores.
  int32_t v[kDenseListPerThread];
#pragma unroll
  for (int k = 0; k < kDenseListPerThread; ++k) v[k] = i0 + k < n ? __ldg(src + i0 + k) : 0;
#pragma unroll
  for (int k = 0; k < kDenseListPerThread; ++k)
    if (i0 + k < n) {
      slots[i0 + k] = v[k];
      page_pos[i0 + k] = i0 + k;
    }
}

}  // namespace

void launch_dense_lists(const DenseListsParams& p, cudaStream_t stream) {
  if (p.n_requests == 0) return;
  const dim3 grid(static_cast<unsigned>(p.n_requests * p.n_heads_kv),
                  static_cast<unsigned>(std::max<int64_t>(1, (p.max_pages + kDenseListChunk - 1) / kDenseListChunk)));
  launch_pdl(dense_lists_kernel, grid, dim3(kDenseListThreads), 0, stream, p);
}

}  // namespace dhs::cuda
