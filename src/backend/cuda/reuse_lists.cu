#include "backend/cuda/reuse_lists.h"

#include "backend/cuda/block_sum.cuh"
#include "backend/cuda/cuda_check.h"

namespace dhs::cuda {

namespace {

constexpr int kThreads = 256, kSplit = 4;  // blocks per list: entries copied in parallel

struct RowCounts {
  int kept;   // stored entries kept (those before first_new)
  int first;  // first page written since the selection
  int n_now;  // pages in the list now
};

// The stored pages are those of a list of ceil(sel_seq_len / page_size) pages, so only the last
// one can be at or past first_new = sel_seq_len / page_size (the page being filled then).
__device__ __forceinline__ RowCounts row_counts(const ReuseListsParams& p, int row) {
  const int req = row / p.n_heads_kv;
  const int first = p.sel_seq_len[req] / p.page_size;
  const int b = p.sel_indptr[row], e = p.sel_indptr[row + 1];
  const int kept = (e > b && p.sel_page_pos[e - 1] >= first) ? e - b - 1 : e - b;
  const int n_now = p.dense_indptr[row + 1] - p.dense_indptr[row];
  return {kept, first, max(n_now, first)};  // n_now < first only if the request shrank (the host forbids)
}

__global__ void __launch_bounds__(kThreads) reuse_lists_kernel(const __grid_constant__ ReuseListsParams p) {
  __shared__ int s_red[kThreads / 32];
  const int row = blockIdx.x;
  int s = 0;
  for (int r = threadIdx.x; r < row; r += blockDim.x) {
    const RowCounts c = row_counts(p, r);
    s += c.kept + c.n_now - c.first;
  }
  const int off = block_sum<kThreads>(s, s_red);  // entries of the lists before this one
  const RowCounts c = row_counts(p, row);
  const int count = c.kept + c.n_now - c.first;
  if (threadIdx.x == 0 && blockIdx.y == 0) {
    p.indptr[row + 1] = off + count;
    if (row == 0) p.indptr[0] = 0;
    if (p.stats) {
      const int h = row % p.n_heads_kv;
      atomicAdd(&p.stats[2 * h], static_cast<unsigned long long>(count));
      atomicAdd(&p.stats[2 * h + 1], static_cast<unsigned long long>(c.n_now));
    }
  }
  const int sel_base = p.sel_indptr[row], dense_base = p.dense_indptr[row];
  for (int i = blockIdx.y * kThreads + threadIdx.x; i < count; i += kSplit * kThreads) {
    int slot, pos;
    if (i < c.kept) {
      slot = p.sel_slots[sel_base + i];
      pos = p.sel_page_pos[sel_base + i];
    } else {
      pos = c.first + (i - c.kept);
      slot = p.dense_slots[dense_base + pos];
    }
    p.slots[off + i] = slot;
    p.page_pos[off + i] = pos;
  }
}

}  // namespace

void launch_reuse_lists(const ReuseListsParams& p, cudaStream_t stream) {
  const int n_lists = p.n_requests * p.n_heads_kv;
  if (n_lists <= 0) return;
  reuse_lists_kernel<<<dim3(static_cast<unsigned>(n_lists), kSplit), kThreads, 0, stream>>>(p);
  DHS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dhs::cuda
