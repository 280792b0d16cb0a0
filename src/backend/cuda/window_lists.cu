// window_lists.h: one block per (request, KV head) list.
#include "backend/cuda/pdl_launch.h"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/window_lists.h"

namespace dhs::cuda {

namespace {

constexpr int kThreads = 128;

struct Window {
  int n = 0;       // pages in the list
  int sink = 0;    // pages [0, sink) ...
  int recent = 0;  // ... and [recent, n) are read
  __device__ int count() const { return sink + (n - recent); }
};

__device__ Window window_of(const WindowListsParams& p, int req) {
  Window w;
  const int seq = __ldg(p.seq_len + req);
  w.n = (seq + p.page_size - 1) / p.page_size;
  int n_sink = p.n_sink, n_recent = p.n_recent;
  bool all = seq < p.dense_below;
  if (p.row_rules != nullptr) {
    const RowRule& r = p.row_rules[req];
    n_sink = r.n_sink;
    n_recent = r.n_recent;
    all = all || r.all_pages;
  }
  if (all) {
    w.sink = w.n;
    w.recent = w.n;
  } else {
    w.sink = min(n_sink, w.n);
    w.recent = max(w.sink, w.n - n_recent);
  }
  return w;
}

__global__ void __launch_bounds__(kThreads) window_lists_kernel(const __grid_constant__ WindowListsParams p) {
  // The lists are read by earlier kernels of the step (the previous layer's attention).
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  const int row = blockIdx.x;  // req * n_heads_kv + head
  const int req = row / p.n_heads_kv, head = row % p.n_heads_kv;
  const Window w = window_of(p, req);
  __shared__ int s_start;
  if (threadIdx.x == 0) {
    int start = 0;  // pages of every earlier request's lists, then this request's earlier heads
    for (int r = 0; r < req; ++r) start += p.n_heads_kv * window_of(p, r).count();
    start += head * w.count();
    s_start = start;
    p.indptr[row] = start;
    if (row == p.n_requests * p.n_heads_kv - 1) p.indptr[row + 1] = start + w.count();
    if (p.stats) {
      atomicAdd(&p.stats[2 * head], static_cast<unsigned long long>(w.count()));
      atomicAdd(&p.stats[2 * head + 1], static_cast<unsigned long long>(w.n));
    }
  }
  __syncthreads();
  const int32_t* __restrict__ src =
      p.table + ((static_cast<int64_t>(__ldg(p.req_slot + req)) * p.n_layers + p.layer) * p.n_heads_kv + head) * p.max_pages;
  for (int j = threadIdx.x; j < w.count(); j += kThreads) {
    const int i = j < w.sink ? j : w.recent + (j - w.sink);
    p.slots[s_start + j] = __ldg(src + i);
    p.page_pos[s_start + j] = i;
  }
}

}  // namespace

void launch_window_lists(const WindowListsParams& p, cudaStream_t stream) {
  if (p.n_requests == 0) return;
  launch_pdl(window_lists_kernel, dim3(static_cast<unsigned>(p.n_requests * p.n_heads_kv)), dim3(kThreads), 0, stream, p);
}

}  // namespace dhs::cuda
