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
// A list's page positions are cut into chunks of kChunk (kItems a thread), each written by its own
// block, so a verify at batch 1 (8 lists of ~8k positions at 128k) fills the GPU instead of 8 SMs.
constexpr int kItems = 4;
constexpr int kChunk = kThreads * kItems;
// Blocks that share one list's entries in the scatter.
constexpr int kScatterSlices = 8;

__device__ __forceinline__ int list_pages(const RowUnionParams& p, int s) {
  return min((max(p.seq_len[s], 0) + p.page_size - 1) / p.page_size, p.max_pages);
}

// Output list (s, h) = blockIdx.x, slice blockIdx.y of its rows' entries: each entry ORs its row's
// bit into the scratch at its page position (and leaves the page's slot beside it); the entry that
// finds the position empty counts a distinct page for its chunk (counts zeroed before the launch).
__global__ void __launch_bounds__(kThreads) row_union_scatter_kernel(const __grid_constant__ RowUnionParams p,
                                                                     int chunks) {
  const int list = static_cast<int>(blockIdx.x);
  const int s = list / p.n_heads_kv, h = list - s * p.n_heads_kv;
  const int r0 = p.row_indptr[s], r1 = p.row_indptr[s + 1];
  uint32_t* mask = p.scratch_mask + static_cast<int64_t>(list) * p.max_pages;
  int32_t* slot = p.scratch_slot + static_cast<int64_t>(list) * p.max_pages;
  int32_t* counts = p.counts + static_cast<int64_t>(list) * chunks;
  // Page positions the request holds: the write kernel reads (and clears) no further.
  const int n_pages = list_pages(p, s);
  const int stride = kThreads * static_cast<int>(gridDim.y);
  for (int r = r0; r < r1 && r - r0 < 32; ++r) {
    const int in = r * p.n_heads_kv + h;
    const int b = p.in_indptr[in], e = p.in_indptr[in + 1];
    const uint32_t bit = 1u << (r - r0);
    for (int k = b + static_cast<int>(blockIdx.y) * kThreads + static_cast<int>(threadIdx.x); k < e; k += stride) {
      const int32_t pos = p.in_page_pos[k];
      if (pos < 0 || pos >= n_pages) {
        if (p.n_bad) atomicAdd(p.n_bad, 1);  // (past the request's pages: never read, never left behind)
        continue;
      }
      if (atomicOr(mask + pos, bit) == 0u) atomicAdd(counts + pos / kChunk, 1);
      slot[pos] = p.in_slots[k];  // (every row that holds the page names the same slot)
    }
  }
}

// Chunk blockIdx.x of output list blockIdx.y: its offset (the counts of every chunk before it, all
// lists in order), its entries in page order, its scratch cleared; the list's last chunk writes the
// list's end into the indptr.
__global__ void __launch_bounds__(kThreads) row_union_write_kernel(const __grid_constant__ RowUnionParams p, int chunks) {
  const int c = static_cast<int>(blockIdx.x), list = static_cast<int>(blockIdx.y);
  const int s = list / p.n_heads_kv;
  const int at_chunk = list * chunks + c;
  __shared__ int s_red[kThreads / 32];
  int before = 0;
  for (int i = static_cast<int>(threadIdx.x); i < at_chunk; i += kThreads) before += p.counts[i];
  const int off = block_sum<kThreads>(before, s_red);
  if (threadIdx.x == 0) {
    if (c == chunks - 1) p.out_indptr[list + 1] = off + p.counts[at_chunk];
    if (list == 0 && c == 0) p.out_indptr[0] = 0;
  }
  const int n_pages = list_pages(p, s);
  const int first = c * kChunk;
  if (first >= n_pages) return;  // (the whole block: its count is 0)
  uint32_t* mask = p.scratch_mask + static_cast<int64_t>(list) * p.max_pages;
  const int32_t* slot = p.scratch_slot + static_cast<int64_t>(list) * p.max_pages;
  // Thread t holds kItems consecutive positions, so the scan's order is page order.
  uint32_t m[kItems];
  int flag[kItems], idx[kItems];
  const int i0 = first + static_cast<int>(threadIdx.x) * kItems;
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    m[j] = i0 + j < n_pages ? mask[i0 + j] : 0u;
    flag[j] = m[j] != 0u ? 1 : 0;
  }
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan;
  Scan(scan).ExclusiveSum(flag, idx);
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    if (m[j] == 0u) continue;
    const int at = off + idx[j];
    p.out_slots[at] = slot[i0 + j];
    p.out_page_pos[at] = i0 + j;
    p.out_row_mask[at] = m[j];
    mask[i0 + j] = 0u;
  }
}

int chunks_of(int max_pages) { return (max_pages + kChunk - 1) / kChunk; }

void require(bool cond, const std::string& what) {
  if (!cond) throw Error(what);
}

}  // namespace

void launch_row_union(const RowUnionParams& p, cudaStream_t stream) {
  const int n_lists = p.n_out * p.n_heads_kv;
  if (n_lists <= 0) return;
  const int chunks = chunks_of(p.max_pages);
  DHS_CUDA_CHECK(cudaMemsetAsync(p.counts, 0, static_cast<size_t>(n_lists) * chunks * sizeof(int32_t), stream));
  row_union_scatter_kernel<<<dim3(static_cast<unsigned>(n_lists), kScatterSlices), kThreads, 0, stream>>>(p, chunks);
  DHS_CUDA_CHECK(cudaGetLastError());
  row_union_write_kernel<<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(n_lists)), kThreads, 0, stream>>>(p, chunks);
  DHS_CUDA_CHECK(cudaGetLastError());
}

RowUnionScratch::RowUnionScratch(int max_out_lists, int max_pages) : max_out_lists_(max_out_lists), max_pages_(max_pages) {
  require(max_out_lists >= 1 && max_pages >= 1, "RowUnionScratch: sizes must be positive");
  const size_t n = static_cast<size_t>(max_out_lists) * static_cast<size_t>(max_pages);
  DHS_CUDA_CHECK(cudaMalloc(&mask_d_, n * 4));
  DHS_CUDA_CHECK(cudaMalloc(&slot_d_, n * 4));
  DHS_CUDA_CHECK(cudaMalloc(&counts_d_, static_cast<size_t>(max_out_lists) * chunks_of(max_pages) * 4));
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
