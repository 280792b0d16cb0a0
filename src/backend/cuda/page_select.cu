// Score, select and compact kernels of sparse decode; see page_select.h.
#include "backend/cuda/page_select.h"

#include "backend/cuda/cuda_check.h"

namespace dhs::cuda {

namespace {

constexpr int kSelectThreads = 512;
constexpr int kSelectWarps = kSelectThreads / 32;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---- 2. select (1. score: page_score.cu) -----------------------------------------------------------------------
// Deterministic block reductions: per-warp shuffles, then every thread adds the warp
// partials in the same order (no third barrier, same value in every thread).
__device__ __forceinline__ float block_sum(float v, float* s_red) {
  v = warp_sum(v);
  __syncthreads();  // the previous reduction's reads of s_red are done
  if ((threadIdx.x & 31) == 0) s_red[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = 0.0f;
#pragma unroll
  for (int w = 0; w < kSelectWarps; ++w) t += s_red[w];
  return t;
}

__device__ __forceinline__ int block_sum_int(int v, int* s_red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s_red[threadIdx.x >> 5] = v;
  __syncthreads();
  int t = 0;
#pragma unroll
  for (int w = 0; w < kSelectWarps; ++w) t += s_red[w];
  return t;
}

// Exclusive prefix over threads (in thread order) of v; *total gets the sum.
__device__ __forceinline__ int block_exclusive_scan(int v, int* s_red, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (lane == 31) s_red[warp] = x;
  __syncthreads();
  int before = 0, all = 0;
#pragma unroll
  for (int w = 0; w < kSelectWarps; ++w) {
    if (w < warp) before += s_red[w];
    all += s_red[w];
  }
  *total = all;
  return before + x - v;
}

// Combined (max, sum) of the online softmax denominators of two partial ranges.
__device__ __forceinline__ void merge_mz(float& m, float& z, float m2, float z2) {
  const float mm = fmaxf(m, m2);
  if (mm == -INFINITY) return;
  z = z * exp2f(m - mm) + z2 * exp2f(m2 - mm);
  m = mm;
}

// One block per list (per request under SoloHead). Thread tid owns pages tid, tid + threads,
// tid + 2 threads, ... (every pass over the scores is coalesced); the masses of its first
// kRegPer pages live in registers (lists up to 8,192 pages: 128k tokens), the rest in shared
// memory (then the global workspace). Pages are emitted in index order by rounds: round k
// takes pages k * threads .. k * threads + threads - 1, and one block scan per round ranks
// them.
constexpr int kRegPer = 16;

__global__ void __launch_bounds__(kSelectThreads, 1) select_pages_kernel(const __grid_constant__ PageSelectParams p) {
  extern __shared__ float s_mass[];
  __shared__ float s_red[kSelectWarps], s_red_m[kSelectWarps];
  __shared__ int s_redi[kSelectWarps];
  const int row = blockIdx.x;
  const int req = row / p.n_heads_kv, h = row - req * p.n_heads_kv;
  if (p.share_heads && h != 0) return;  // SoloHead: the request's head-0 block decides for all
  const int base = p.dense_indptr[row], n = p.dense_indptr[row + 1] - base;
  const int seq = p.seq_len[req];
  const int q0 = p.q_indptr[req], q_len = p.q_indptr[req + 1] - q0;
  const int group = p.n_heads_q / p.n_heads_kv;
  const int tid = threadIdx.x;
  const int per = (n + kSelectThreads - 1) / kSelectThreads;  // pages per thread (rounds)
  const int sink = min(p.n_sink, n), recent_from = max(sink, n - p.n_recent);
  auto forced = [&](int i) { return i < sink || i >= recent_from; };

  enum Mode { kAll, kForced, kCut } mode = kCut;
  int k_top = 0;
  if (n == 0 || q_len == 0 || seq < p.dense_below) mode = kAll;
  else if (p.rule == SelectRule::SinkWindow) mode = kForced;
  else if (p.rule == SelectRule::Coverage && p.gamma >= 1.0f) mode = kAll;
  else if (p.rule == SelectRule::TopK) {
    k_top = p.budget_frac && !p.share_heads ? static_cast<int>(ceilf(p.budget_frac[h] * static_cast<float>(n))) : p.budget;
    if (k_top >= n) mode = kAll;
  }

  // The thread's masses: registers for rounds < kRegPer, then shared memory (m[(k - kRegPer) *
  // threads + tid]: consecutive threads, consecutive words) or the list's global workspace.
  float mr[kRegPer];
  const bool ovf_smem = (per - kRegPer) * kSelectThreads <= p.smem_pages;
  auto ovf = [&](int k) -> float& {
    return ovf_smem ? s_mass[(k - kRegPer) * kSelectThreads + tid] : p.mass[base + k * kSelectThreads + tid];
  };
  // f(round, page index, mass) over the thread's pages, in round order.
  auto for_owned = [&](auto&& f) {
#pragma unroll
    for (int k = 0; k < kRegPer; ++k)
      if (k * kSelectThreads + tid < n) f(k, k * kSelectThreads + tid, mr[k]);
    for (int k = kRegPer; k < per; ++k)
      if (k * kSelectThreads + tid < n) f(k, k * kSelectThreads + tid, ovf(k));
  };

  uint32_t thr = 0;  // the cut: pages of mass bits > thr are in, == thr by index up to k_eq
  int k_eq = 0;
  bool topk_forced_only = false;
  if (mode == kCut) {
    for_owned([&](int, int, float& m) { m = 0.0f; });
    const int h_first = p.share_heads ? 0 : h, h_last = p.share_heads ? p.n_heads_kv - 1 : h;
    for (int hh = h_first; hh <= h_last; ++hh) {
      const int bh = p.dense_indptr[req * p.n_heads_kv + hh];
      for (int j = 0; j < q_len * group; ++j) {
        const int qpos = seq - q_len + j / group;
        const float* sc = p.scores + j * p.score_stride + bh;
        auto n_vis = [&](int i) { return min(max(qpos + 1 - p.dense_page_pos[bh + i] * p.page_size, 0), p.page_size); };
        // Block-wide (max, sum) of n_i 2^s_i: max first, then the rescaled sums.
        float mx = -INFINITY;
        for_owned([&](int, int i, float&) {
          if (n_vis(i) > 0) mx = fmaxf(mx, sc[i]);
        });
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        __syncthreads();
        if ((tid & 31) == 0) s_red_m[tid >> 5] = mx;
        __syncthreads();
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < kSelectWarps; ++w) M = fmaxf(M, s_red_m[w]);
        if (M == -INFINITY) continue;  // this row sees no key (uniform across the block)
        float z = 0.0f;
        for_owned([&](int, int i, float&) {
          const int nv = n_vis(i);
          if (nv > 0) z += static_cast<float>(nv) * exp2f(sc[i] - M);
        });
        const float Z = block_sum(z, s_red);
        if (!(Z > 0.0f)) continue;
        const float inv_z = 1.0f / Z;
        for_owned([&](int, int i, float& m) {
          const int nv = n_vis(i);
          const float w = nv == 0 ? 0.0f : static_cast<float>(nv) * exp2f(sc[i] - M) * inv_z;
          m = p.combine_max ? fmaxf(m, w) : m + w;
        });
      }
    }
    float tot = 0.0f;
    for_owned([&](int, int, float& m) { tot += m; });
    tot = block_sum(tot, s_red);
    if (tot > 0.0f) {
      const float inv = 1.0f / tot;
      for_owned([&](int, int, float& m) { m *= inv; });
    }
    if (p.mass_out) for_owned([&](int, int i, float& m) { p.mass_out[base + i] = m; });

    if (p.rule == SelectRule::Coverage) {
      float fm = 0.0f, fr = 0.0f;
      for_owned([&](int, int i, float& m) { (forced(i) ? fm : fr) += m; });
      fm = block_sum(fm, s_red);
      fr = block_sum(fr, s_red);
      const float need = p.gamma - fm;
      if (need <= 0.0f) mode = kForced;
      else if (fr < need) mode = kAll;  // rounding shortfall: every page
      else {
        // Largest thr with S(>= thr) >= need, S = summed free mass of bits >= thr.
        for (int bit = 30; bit >= 0; --bit) {
          const uint32_t cand = thr | (1u << bit);
          float s = 0.0f;
          for_owned([&](int, int i, float& m) {
            if (!forced(i) && __float_as_uint(m) >= cand) s += m;
          });
          if (block_sum(s, s_red) >= need) thr = cand;
        }
        float gt = 0.0f;
        for_owned([&](int, int i, float& m) {
          if (!forced(i) && __float_as_uint(m) > thr) gt += m;
        });
        gt = block_sum(gt, s_red);
        const float tv = __uint_as_float(thr);
        // tv > 0: S(>= 0) >= need > S(> thr), so some page of mass tv > 0 sits at the cut.
        k_eq = tv > 0.0f ? max(1, static_cast<int>(ceilf((need - gt) / tv))) : n;
      }
    } else {  // TopK
      const int n_forced = sink + (n - recent_from);
      if (k_top <= n_forced) topk_forced_only = true;
      else {
        const int want = k_top - n_forced;  // free pages to add
        for (int bit = 30; bit >= 0; --bit) {
          const uint32_t cand = thr | (1u << bit);
          int c = 0;
          for_owned([&](int, int i, float& m) { c += !forced(i) && __float_as_uint(m) >= cand; });
          if (block_sum_int(c, s_redi) >= want) thr = cand;
        }
        int gt = 0;
        for_owned([&](int, int i, float& m) { gt += !forced(i) && __float_as_uint(m) > thr; });
        k_eq = want - block_sum_int(gt, s_redi);
      }
    }
  }

  // Emit in index order, one round of threads at a time. Within a round one scan counts, for
  // each page, the chosen non-tied pages and the tied pages (free pages of mass bits == thr)
  // before it: the first k_eq tied pages of the list (by index) are in.
  const int k_sink = min(k_top, sink), k_recent = k_top - k_sink;  // top-k within the forced pages
  const bool cut = mode == kCut && !topk_forced_only;
  int out_before = 0, ties_before = 0;
  auto round = [&](int i, float m) {
    const bool valid = i < n;
    bool sure = false, tie = false;
    if (valid) {
      if (mode == kAll) sure = true;
      else if (mode == kForced) sure = forced(i);
      else if (topk_forced_only) sure = i < k_sink || (i >= recent_from && n - 1 - i < k_recent);
      else if (forced(i)) sure = true;
      else {
        const uint32_t b = __float_as_uint(m);
        sure = b > thr;
        tie = b == thr;
      }
    }
    int all;
    const int ex = block_exclusive_scan(static_cast<int>(sure) | (static_cast<int>(tie) << 16), s_redi, &all);
    const int quota = cut ? max(0, k_eq - ties_before) : 0;
    const int ex_sure = ex & 0xFFFF, ex_tie = ex >> 16;
    if (sure || (tie && ex_tie < quota)) {
      const int o = out_before + ex_sure + min(ex_tie, quota);
      const int h_first = p.share_heads ? 0 : h, h_last = p.share_heads ? p.n_heads_kv - 1 : h;
      for (int hh = h_first; hh <= h_last; ++hh) {
        const int bh = p.dense_indptr[req * p.n_heads_kv + hh];
        p.stage_slots[bh + o] = p.dense_slots[bh + i];
        p.stage_pos[bh + o] = p.dense_page_pos[bh + i];
      }
    }
    out_before += (all & 0xFFFF) + min(all >> 16, quota);
    ties_before += all >> 16;
  };
#pragma unroll
  for (int k = 0; k < kRegPer; ++k)
    if (k < per) round(k * kSelectThreads + tid, mr[k]);
  for (int k = kRegPer; k < per; ++k) round(k * kSelectThreads + tid, k * kSelectThreads + tid < n ? ovf(k) : 0.0f);

  if (tid == 0) {
    const int h_first = p.share_heads ? 0 : h, h_last = p.share_heads ? p.n_heads_kv - 1 : h;
    for (int hh = h_first; hh <= h_last; ++hh) {
      const int lrow = req * p.n_heads_kv + hh;
      p.counts[lrow] = out_before;
      if (p.stats) {
        atomicAdd(&p.stats[2 * hh], static_cast<unsigned long long>(out_before));
        atomicAdd(&p.stats[2 * hh + 1], static_cast<unsigned long long>(n));
      }
    }
  }
}

// ---- 3. compact ----------------------------------------------------------------------
constexpr int kCompactThreads = 256, kCompactSplit = 8;  // blocks per list: copies in flight

__global__ void __launch_bounds__(kCompactThreads) compact_lists_kernel(const __grid_constant__ PageSelectParams p) {
  __shared__ int s_red[kCompactThreads / 32];
  const int row = blockIdx.x;
  int s = 0;
  for (int r = threadIdx.x; r < row; r += blockDim.x) s += p.counts[r];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) s_red[threadIdx.x >> 5] = s;
  __syncthreads();
  int off = 0;
#pragma unroll
  for (int w = 0; w < kCompactThreads / 32; ++w) off += s_red[w];
  const int c = p.counts[row];
  if (threadIdx.x == 0 && blockIdx.y == 0) {
    p.indptr[row + 1] = off + c;
    if (row == 0) p.indptr[0] = 0;
  }
  const int base = p.dense_indptr[row];
  for (int i = blockIdx.y * kCompactThreads + threadIdx.x; i < c; i += kCompactSplit * kCompactThreads) {
    p.slots[off + i] = p.stage_slots[base + i];
    p.page_pos[off + i] = p.stage_pos[base + i];
  }
}

}  // namespace

void launch_page_select_stage(const PageSelectParams& p, int stage, cudaStream_t stream) {
  const int n_lists = p.n_requests * p.n_heads_kv;
  if (n_lists <= 0) return;
  if (stage == 0) {
    if (p.rule != SelectRule::SinkWindow) launch_score_pages(p, stream);
    return;
  } else if (stage == 1) {
    select_pages_kernel<<<n_lists, kSelectThreads, static_cast<size_t>(p.smem_pages) * 4, stream>>>(p);
  } else {
    compact_lists_kernel<<<dim3(n_lists, kCompactSplit), kCompactThreads, 0, stream>>>(p);
  }
  DHS_CUDA_CHECK(cudaGetLastError());
}

void launch_page_select(const PageSelectParams& p, cudaStream_t stream) {
  for (int stage = 0; stage < 3; ++stage) launch_page_select_stage(p, stage, stream);
}

PageSelectWorkspace::PageSelectWorkspace(int max_lists, int64_t max_nnz, int q_stride)
    : max_lists_(max_lists), max_nnz_(max_nnz), q_stride_(q_stride) {
  if (max_lists <= 0 || max_nnz < 0 || max_nnz >= (int64_t{1} << 31) || q_stride <= 0)
    check(cudaErrorInvalidValue, "PageSelectWorkspace: bad capacity", __FILE__, __LINE__);
  int dev = 0, sms = 0;
  DHS_CUDA_CHECK(cudaGetDevice(&dev));
  DHS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  n_score_warps_ = sms * 4 * 8;  // 4 blocks of 8 warps per SM: enough loads in flight
  const size_t nnz = static_cast<size_t>(max_nnz > 0 ? max_nnz : 1);
  DHS_CUDA_CHECK(cudaMalloc(&scores_d_, nnz * q_stride * sizeof(float)));
  DHS_CUDA_CHECK(cudaMalloc(&mass_d_, nnz * sizeof(float)));
  DHS_CUDA_CHECK(cudaMalloc(&counts_d_, static_cast<size_t>(max_lists) * sizeof(int32_t)));
  DHS_CUDA_CHECK(cudaMalloc(&stage_slots_d_, nnz * sizeof(int32_t)));
  DHS_CUDA_CHECK(cudaMalloc(&stage_pos_d_, nnz * sizeof(int32_t)));
}

PageSelectWorkspace::~PageSelectWorkspace() {
  cudaFree(scores_d_);
  cudaFree(mass_d_);
  cudaFree(counts_d_);
  cudaFree(stage_slots_d_);
  cudaFree(stage_pos_d_);
}

void PageSelectWorkspace::bind(PageSelectParams* p) const {
  p->scores = scores_d_;
  p->mass = mass_d_;
  p->counts = counts_d_;
  p->stage_slots = stage_slots_d_;
  p->stage_pos = stage_pos_d_;
  p->q_stride = q_stride_;
  p->score_stride = max_nnz_ > 0 ? max_nnz_ : 1;
  p->n_score_warps = n_score_warps_;
  p->smem_pages = kSelectSmemPages;
}

}  // namespace dhs::cuda
