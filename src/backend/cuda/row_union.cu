// A verify's per-row lists merged into one list with row masks; see row_union.h.
#include "backend/cuda/row_union.h"

#include <cub/block/block_scan.cuh>
#include <string>

#include "backend/cuda/block_sum.cuh"
#include "backend/cuda/cuda_check.h"
#include "dhisparse/error.h"

namespace dhs::cuda {

namespace {

constexpr int kThreads = 256;

// Output list (s, h): its rows' entries OR their bits into the scratch at their page positions,
// then its distinct pages are counted.
__global__ void __launch_bounds__(kThreads) row_union_scatter_kernel(const __grid_constant__ RowUnionParams p) {
  const int list = static_cast<int>(blockIdx.x);
  const int s = list / p.n_heads_kv, h = list - s * p.n_heads_kv;
  const int r0 = p.row_indptr[s], r1 = p.row_indptr[s + 1];
  uint32_t* mask = p.scratch_mask + static_cast<int64_t>(list) * p.max_pages;
  int32_t* slot = p.scratch_slot + static_cast<int64_t>(list) * p.max_pages;
  // Page positions the request holds: the second kernel reads (and clears) no further.
  const int n_pages = min((max(p.seq_len[s], 0) + p.page_size - 1) / p.page_size, p.max_pages);
  for (int r = r0; r < r1 && r - r0 < 32; ++r) {
    const int in = r * p.n_heads_kv + h;
    const int b = p.in_indptr[in], e = p.in_indptr[in + 1];
    const uint32_t bit = 1u << (r - r0);
    for (int k = b + static_cast<int>(threadIdx.x); k < e; k += kThreads) {
      const int32_t pos = p.in_page_pos[k];
      if (pos < 0 || pos >= n_pages) {
        if (p.n_bad) atomicAdd(p.n_bad, 1);  // (past the request's pages: never read, never left behind)
        continue;
      }
      atomicOr(mask + pos, bit);
      slot[pos] = p.in_slots[k];  // (every row that holds the page names the same slot)
    }
  }
  __syncthreads();  // (the block's own atomics and stores are visible to it after the barrier)
  __shared__ int s_red[kThreads / 32];
  int n = 0;
  for (int i = static_cast<int>(threadIdx.x); i < n_pages; i += kThreads) n += mask[i] != 0u;
  n = block_sum<kThreads>(n, s_red);
  if (threadIdx.x == 0) p.counts[list] = n;
}

// Output list (s, h): its offset (the counts of every list before it), its entries in page order,
// its scratch cleared.
__global__ void __launch_bounds__(kThreads) row_union_write_kernel(const __grid_constant__ RowUnionParams p) {
  const int list = static_cast<int>(blockIdx.x);
  const int s = list / p.n_heads_kv;
  __shared__ int s_red[kThreads / 32];
  int before = 0;
  for (int i = static_cast<int>(threadIdx.x); i < list; i += kThreads) before += p.counts[i];
  const int off = block_sum<kThreads>(before, s_red);
  if (threadIdx.x == 0) {
    p.out_indptr[list + 1] = off + p.counts[list];
    if (list == 0) p.out_indptr[0] = 0;
  }
  uint32_t* mask = p.scratch_mask + static_cast<int64_t>(list) * p.max_pages;
  const int32_t* slot = p.scratch_slot + static_cast<int64_t>(list) * p.max_pages;
  const int n_pages = min((max(p.seq_len[s], 0) + p.page_size - 1) / p.page_size, p.max_pages);
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int s_base;
  if (threadIdx.x == 0) s_base = off;
  __syncthreads();
  for (int base = 0; base < n_pages; base += kThreads) {
    const int i = base + static_cast<int>(threadIdx.x);
    const uint32_t m = i < n_pages ? mask[i] : 0u;
    int idx = 0, total = 0;
    Scan(scan).ExclusiveSum(m != 0u ? 1 : 0, idx, total);
    const int at = s_base + idx;
    if (m != 0u) {
      p.out_slots[at] = slot[i];
      p.out_page_pos[at] = i;
      p.out_row_mask[at] = m;
      mask[i] = 0u;
    }
    __syncthreads();  // (s_base and the scan's storage are read before they change)
    if (threadIdx.x == 0) s_base += total;
    __syncthreads();
  }
}

void require(bool cond, const std::string& what) {
  if (!cond) throw Error(what);
}

}  // namespace

void launch_row_union(const RowUnionParams& p, cudaStream_t stream) {
  const int n_lists = p.n_out * p.n_heads_kv;
  if (n_lists <= 0) return;
  row_union_scatter_kernel<<<static_cast<unsigned>(n_lists), kThreads, 0, stream>>>(p);
  DHS_CUDA_CHECK(cudaGetLastError());
  row_union_write_kernel<<<static_cast<unsigned>(n_lists), kThreads, 0, stream>>>(p);
  DHS_CUDA_CHECK(cudaGetLastError());
}

RowUnionScratch::RowUnionScratch(int max_out_lists, int max_pages) : max_out_lists_(max_out_lists), max_pages_(max_pages) {
  require(max_out_lists >= 1 && max_pages >= 1, "RowUnionScratch: sizes must be positive");
  const size_t n = static_cast<size_t>(max_out_lists) * static_cast<size_t>(max_pages);
  DHS_CUDA_CHECK(cudaMalloc(&mask_d_, n * 4));
  DHS_CUDA_CHECK(cudaMalloc(&slot_d_, n * 4));
  DHS_CUDA_CHECK(cudaMalloc(&counts_d_, static_cast<size_t>(max_out_lists) * 4));
  DHS_CUDA_CHECK(cudaMemset(mask_d_, 0, n * 4));  // kept zero by every call after
}

RowUnionScratch::~RowUnionScratch() {
  cudaFree(mask_d_);
  cudaFree(slot_d_);
  cudaFree(counts_d_);
}

void RowUnionScratch::bind(RowUnionParams& p) const {
  p.max_pages = max_pages_;
  p.scratch_mask = mask_d_;
  p.scratch_slot = slot_d_;
  p.counts = counts_d_;
}

void row_union(const RowUnionParams& p, const RowUnionScratch& scratch, cudaStream_t stream) {
  require(p.n_out >= 0 && p.n_heads_kv >= 1 && p.page_size >= 1, "row_union: bad sizes");
  require(static_cast<int64_t>(p.n_out) * p.n_heads_kv <= scratch.max_out_lists(),
          "row_union: " + std::to_string(p.n_out) + " x " + std::to_string(p.n_heads_kv) + " lists, scratch holds " +
              std::to_string(scratch.max_out_lists()));
  require(p.max_pages == scratch.max_pages() && p.scratch_mask && p.scratch_slot && p.counts,
          "row_union: scratch not bound (RowUnionScratch::bind)");
  require(p.in_indptr && p.in_slots && p.in_page_pos && p.row_indptr && p.seq_len,
          "row_union: input lists, row ranges and lengths needed");
  require(p.out_indptr && p.out_slots && p.out_page_pos && p.out_row_mask, "row_union: output lists needed");
  launch_row_union(p, stream);
}

}  // namespace dhs::cuda
