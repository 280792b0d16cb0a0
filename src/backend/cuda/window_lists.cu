// window_lists.h: one block per (request, KV head) list.
#include "backend/cuda/block_sum.cuh"
#include "backend/cuda/draft_seeds.h"
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
  int n_seeds = 0; // ... and up to this many seeds outside them
  __device__ int count() const { return sink + (n - recent); }
  __device__ bool outside(int32_t i) const { return i >= sink && i < recent; }  // (i < n)
  // Window pages below page x (x in [0, n]).
  __device__ int below(int x) const { return min(x, sink) + max(0, x - recent); }
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
    if (p.row_rules != nullptr && p.seeds != nullptr) w.n_seeds = min(p.row_rules[req].n_seeds, p.seed_cap);
  }
  return w;
}

// The request's seeds for (layer, head): seed_cap entries, heaviest first, -1 padded.
__device__ const int32_t* seeds_of(const WindowListsParams& p, int req, int head) {
  return p.seeds + ((static_cast<int64_t>(__ldg(p.req_slot + req)) * p.n_layers + p.layer) * p.n_heads_kv + head) * p.seed_cap;
}

// Seeds of the list that add a page: valid, inside the list, outside the window.
__device__ bool adds(const Window& w, int32_t s) { return s >= 0 && s < w.n && w.outside(s); }

// Pages of one list: the window's and its added seeds (seeds are distinct pages).
__device__ int list_count(const WindowListsParams& p, const Window& w, int req, int head) {
  int c = w.count();
  if (w.n_seeds > 0) {
    const int32_t* sd = seeds_of(p, req, head);
    for (int i = 0; i < w.n_seeds; ++i) c += adds(w, __ldg(sd + i)) ? 1 : 0;
  }
  return c;
}

__global__ void __launch_bounds__(kThreads) window_lists_kernel(const __grid_constant__ WindowListsParams p) {
  // The lists are read by earlier kernels of the step (the previous layer's attention).
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  const int row = blockIdx.x;  // req * n_heads_kv + head
  const int req = row / p.n_heads_kv, head = row % p.n_heads_kv;
  const Window w = window_of(p, req);
  __shared__ int s_start;
  __shared__ int s_red[kThreads / 32];
  __shared__ int32_t s_seed[kMaxSeedPages];  // this list's added seeds
  __shared__ int s_n_seed;
  int count = 0;
  if (p.seeds == nullptr) {
    if (threadIdx.x == 0) {
      int start = 0;  // pages of every earlier request's lists, then this request's earlier heads
      for (int r = 0; r < req; ++r) start += p.n_heads_kv * window_of(p, r).count();
      s_start = start + head * w.count();
    }
    count = w.count();
  } else {
    // With seeds a list's length depends on its seeds: the block sums every earlier list's.
    int part = 0;
    for (int j = threadIdx.x; j < row; j += kThreads) {
      const int rq = j / p.n_heads_kv;
      part += list_count(p, window_of(p, rq), rq, j % p.n_heads_kv);
    }
    const int start = block_sum<kThreads>(part, s_red);
    if (threadIdx.x == 0) {
      s_start = start;
      int k = 0;
      if (w.n_seeds > 0) {
        const int32_t* sd = seeds_of(p, req, head);
        for (int i = 0; i < w.n_seeds; ++i) {
          const int32_t sp = __ldg(sd + i);
          if (adds(w, sp)) s_seed[k++] = sp;
        }
      }
      s_n_seed = k;
    }
    __syncthreads();
    count = w.count() + s_n_seed;
  }
  if (threadIdx.x == 0) {
    p.indptr[row] = s_start;
    if (row == p.n_requests * p.n_heads_kv - 1) p.indptr[row + 1] = s_start + count;
    if (p.stats) {
      atomicAdd(&p.stats[2 * head], static_cast<unsigned long long>(count));
      atomicAdd(&p.stats[2 * head + 1], static_cast<unsigned long long>(w.n));
    }
  }
  __syncthreads();
  const int32_t* __restrict__ src =
      p.table + ((static_cast<int64_t>(__ldg(p.req_slot + req)) * p.n_layers + p.layer) * p.n_heads_kv + head) * p.max_pages;
  const int n_seed = p.seeds == nullptr ? 0 : s_n_seed;
  // Ascending: a page's place is the window pages and added seeds below it.
  auto seeds_below = [&](int32_t x) {
    int b = 0;
    for (int i = 0; i < n_seed; ++i) b += s_seed[i] < x ? 1 : 0;
    return b;
  };
  for (int j = threadIdx.x; j < w.count(); j += kThreads) {
    const int i = j < w.sink ? j : w.recent + (j - w.sink);
    const int at = n_seed > 0 ? j + seeds_below(i) : j;
    p.slots[s_start + at] = __ldg(src + i);
    p.page_pos[s_start + at] = i;
  }
  for (int k = threadIdx.x; k < n_seed; k += kThreads) {
    const int32_t i = s_seed[k];
    const int at = w.below(i) + seeds_below(i);
    p.slots[s_start + at] = __ldg(src + i);
    p.page_pos[s_start + at] = i;
  }
}

}  // namespace

void launch_window_lists(const WindowListsParams& p, cudaStream_t stream) {
  if (p.n_requests == 0) return;
  launch_pdl(window_lists_kernel, dim3(static_cast<unsigned>(p.n_requests * p.n_heads_kv)), dim3(kThreads), 0, stream, p);
}

}  // namespace dhs::cuda
