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
// Deterministic block reductions with ONE barrier each: per-warp shuffles, lane 0 (or 31) writes
// the warp's partials to one of two alternating shared buffers, a barrier, then every thread
// combines the partials in warp order (the same value in every thread). Alternating makes the
// usual barrier before the write unnecessary: a buffer is written again only after the next
// reduction's barrier, which every thread reaches after its reads of this one. N values reduce
// together (one barrier for all): the select kernel is bound by the latency of its ~50 block
// reductions, not by its few thousand flops (docs/kernels/page_select_NOTES.md, v4 -> v5).
constexpr int kMaxRed = 16;
struct BlockReduce {
  uint32_t (*buf)[kMaxRed * kSelectWarps];  // [2][kMaxRed * kSelectWarps]
  int par = 0;

  template <int N>
  __device__ __forceinline__ void sum(float (&v)[N]) {
    static_assert(N <= kMaxRed);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = warp_sum(v[k]);
    uint32_t* b = buf[par];
    par ^= 1;
    if ((threadIdx.x & 31) == 0)
#pragma unroll
      for (int k = 0; k < N; ++k) b[k * kSelectWarps + (threadIdx.x >> 5)] = __float_as_uint(v[k]);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < N; ++k) {
      float t = 0.0f;
#pragma unroll
      for (int w = 0; w < kSelectWarps; ++w) t += __uint_as_float(b[k * kSelectWarps + w]);
      v[k] = t;
    }
  }
  __device__ __forceinline__ float sum(float v) {
    float a[1] = {v};
    sum(a);
    return a[0];
  }
  template <int N>
  __device__ __forceinline__ void sum_int(int (&v)[N]) {
    static_assert(N <= kMaxRed);
#pragma unroll
    for (int k = 0; k < N; ++k)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v[k] += __shfl_xor_sync(0xffffffffu, v[k], o);
    uint32_t* b = buf[par];
    par ^= 1;
    if ((threadIdx.x & 31) == 0)
#pragma unroll
      for (int k = 0; k < N; ++k) b[k * kSelectWarps + (threadIdx.x >> 5)] = static_cast<uint32_t>(v[k]);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < N; ++k) {
      int t = 0;
#pragma unroll
      for (int w = 0; w < kSelectWarps; ++w) t += static_cast<int>(b[k * kSelectWarps + w]);
      v[k] = t;
    }
  }
  __device__ __forceinline__ float max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    uint32_t* b = buf[par];
    par ^= 1;
    if ((threadIdx.x & 31) == 0) b[threadIdx.x >> 5] = __float_as_uint(v);
    __syncthreads();
    float t = -INFINITY;
#pragma unroll
    for (int w = 0; w < kSelectWarps; ++w) t = fmaxf(t, __uint_as_float(b[w]));
    return t;
  }
  // Exclusive prefixes over threads (in thread order) of N values at once; total[k] gets the sums.
  template <int N>
  __device__ __forceinline__ void exclusive_scan(int (&v)[N], int (&total)[N]) {
    static_assert(N <= kMaxRed);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x[N];
#pragma unroll
    for (int k = 0; k < N; ++k) x[k] = v[k];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1)
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const int y = __shfl_up_sync(0xffffffffu, x[k], o);
        if (lane >= o) x[k] += y;
      }
    uint32_t* b = buf[par];
    par ^= 1;
    if (lane == 31)
#pragma unroll
      for (int k = 0; k < N; ++k) b[k * kSelectWarps + warp] = static_cast<uint32_t>(x[k]);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < N; ++k) {
      int before = 0, all = 0;
#pragma unroll
      for (int w = 0; w < kSelectWarps; ++w) {
        const int t = static_cast<int>(b[k * kSelectWarps + w]);
        if (w < warp) before += t;
        all += t;
      }
      total[k] = all;
      v[k] = before + x[k] - v[k];
    }
  }
};

// One step of the cut search: bits lo+1 and lo of thr (bit 0 alone when lo = -1). cand[d - 1] =
// thr with digit d there, or ~0u where that digit does not exist (no mass has those bits).
__device__ __forceinline__ void cut_candidates(uint32_t thr, int lo, uint32_t (&cand)[3]) {
#pragma unroll
  for (int d = 1; d <= 3; ++d) cand[d - 1] = d <= (lo >= 0 ? 3 : 1) ? thr | (static_cast<uint32_t>(d) << max(lo, 0)) : 0xFFFFFFFFu;
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
  __shared__ uint32_t s_buf[2][kMaxRed * kSelectWarps];
  BlockReduce red{s_buf};
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
        const float M = red.max(mx);
        if (M == -INFINITY) continue;  // this row sees no key (uniform across the block)
        float z = 0.0f;
        for_owned([&](int, int i, float&) {
          const int nv = n_vis(i);
          if (nv > 0) z += static_cast<float>(nv) * exp2f(sc[i] - M);
        });
        const float Z = red.sum(z);
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
    tot = red.sum(tot);
    if (tot > 0.0f) {
      const float inv = 1.0f / tot;
      for_owned([&](int, int, float& m) { m *= inv; });
    }
    if (p.mass_out) for_owned([&](int, int i, float& m) { p.mass_out[base + i] = m; });

    if (p.rule == SelectRule::Coverage) {
      float fm = 0.0f, fr = 0.0f;
      for_owned([&](int, int i, float& m) { (forced(i) ? fm : fr) += m; });
      float f2[2] = {fm, fr};
      red.sum(f2);
      fm = f2[0];
      fr = f2[1];
      const float need = p.gamma - fm;
      if (need <= 0.0f) mode = kForced;
      else if (fr < need) mode = kAll;  // rounding shortfall: every page
      else {
        // Largest thr with S(>= thr) >= need, S = summed free mass of bits >= thr: bits 30..0 two
        // at a time (the largest of the 3 candidates that still reaches need; S falls as thr rises).
        for (int lo = 29; lo >= -1; lo -= 2) {
          uint32_t cand[3];
          cut_candidates(thr, lo, cand);
          float s[3] = {0.0f, 0.0f, 0.0f};
          for_owned([&](int, int i, float& m) {
            if (forced(i)) return;
            const uint32_t b = __float_as_uint(m);
#pragma unroll
            for (int d = 0; d < 3; ++d)
              if (b >= cand[d]) s[d] += m;
          });
          red.sum(s);
          for (int d = 2; d >= 0; --d)
            if (cand[d] != 0xFFFFFFFFu && s[d] >= need) {
              thr = cand[d];
              break;
            }
        }
        float gt = 0.0f;
        for_owned([&](int, int i, float& m) {
          if (!forced(i) && __float_as_uint(m) > thr) gt += m;
        });
        gt = red.sum(gt);
        const float tv = __uint_as_float(thr);
        // tv > 0: S(>= 0) >= need > S(> thr), so some page of mass tv > 0 sits at the cut.
        k_eq = tv > 0.0f ? max(1, static_cast<int>(ceilf((need - gt) / tv))) : n;
      }
    } else {  // TopK
      const int n_forced = sink + (n - recent_from);
      if (k_top <= n_forced) topk_forced_only = true;
      else {
        const int want = k_top - n_forced;  // free pages to add
        for (int lo = 29; lo >= -1; lo -= 2) {  // as for coverage, on counts
          uint32_t cand[3];
          cut_candidates(thr, lo, cand);
          int c[3] = {0, 0, 0};
          for_owned([&](int, int i, float& m) {
            if (forced(i)) return;
            const uint32_t b = __float_as_uint(m);
#pragma unroll
            for (int d = 0; d < 3; ++d) c[d] += b >= cand[d];
          });
          red.sum_int(c);
          for (int d = 2; d >= 0; --d)
            if (cand[d] != 0xFFFFFFFFu && c[d] >= want) {
              thr = cand[d];
              break;
            }
        }
        int gt[1] = {0};
        for_owned([&](int, int i, float& m) { gt[0] += !forced(i) && __float_as_uint(m) > thr; });
        red.sum_int(gt);
        k_eq = want - gt[0];
      }
    }
  }

  // Emit in index order, one round of threads at a time. Within a round one scan counts, for
  // each page, the chosen non-tied pages and the tied pages (free pages of mass bits == thr)
  // before it: the first k_eq tied pages of the list (by index) are in.
  const int k_sink = min(k_top, sink), k_recent = k_top - k_sink;  // top-k within the forced pages
  const bool cut = mode == kCut && !topk_forced_only;
  // flag: 1 for a page surely in, 1 << 16 for a tied page (a round has <= 512 of each).
  auto flag = [&](int i, float m) -> int {
    if (i >= n) return 0;
    if (mode == kAll) return 1;
    if (mode == kForced) return forced(i);
    if (topk_forced_only) return i < k_sink || (i >= recent_from && n - 1 - i < k_recent);
    if (forced(i)) return 1;
    const uint32_t b = __float_as_uint(m);
    return b > thr ? 1 : b == thr ? 1 << 16 : 0;
  };
  int out_before = 0, ties_before = 0;
  // Page i of a round with exclusive prefix ex and round total all: write it if chosen.
  auto emit = [&](int i, int f, int ex, int all) {
    const int quota = cut ? max(0, k_eq - ties_before) : 0;
    const int ex_sure = ex & 0xFFFF, ex_tie = ex >> 16;
    if ((f & 1) || ((f >> 16) && ex_tie < quota)) {
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
  {  // the register rounds: one scan for all of them
    int f[kRegPer], ex[kRegPer], all[kRegPer];
#pragma unroll
    for (int k = 0; k < kRegPer; ++k) ex[k] = f[k] = flag(k * kSelectThreads + tid, mr[k]);
    red.exclusive_scan(ex, all);
#pragma unroll
    for (int k = 0; k < kRegPer; ++k)
      if (k < per) emit(k * kSelectThreads + tid, f[k], ex[k], all[k]);
  }
  for (int k = kRegPer; k < per; ++k) {  // overflow rounds, one scan each
    const int i = k * kSelectThreads + tid;
    int f[1] = {flag(i, i < n ? ovf(k) : 0.0f)}, ex[1] = {f[0]}, all[1];
    red.exclusive_scan(ex, all);
    emit(i, f[0], ex[0], all[0]);
  }

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
