// Score, select and compact kernels of sparse decode; see page_select.h.
#include "backend/cuda/page_select.h"

#include <cooperative_groups.h>

#include "backend/cuda/block_sum.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/draft_seeds.h"
#include "backend/cuda/pdl_launch.h"
#include "backend/cuda/ptx.cuh"

namespace dhs::cuda {

namespace {

constexpr int kSelectThreads = 512;
constexpr int kSelectWarps = kSelectThreads / 32;

// ---- 2. select (1. score: page_score.cu) -----------------------------------------------------------------------
// A thread-block cluster of C blocks (1..4 chosen on the host from the number of lists, so that
// about one block runs per SM: 4 at batch 1, 2 at batch 8; up to 16 when forced) per list: the
// pages of a list are spread over C * 512 threads, so a list's passes no longer run on 8 of the
// GPU's 132 SMs (docs/kernels/page_select_NOTES.md).
//
// Deterministic reductions over the cluster: warp shuffles; lane 0 of each warp writes its
// partial to this block's shared buffer; a block barrier; warp 0 combines the 16 partials in
// a fixed tree and writes the block's total; a cluster barrier; then every warp reads the C
// block totals through distributed shared memory (lane r reads rank r) and combines them in a
// fixed tree. Every thread of every block gets the same bits.
// Buffers alternate between two halves: a half is rewritten two reductions later, after the
// next reduction's block and cluster barriers, which every reader of this one passes only after
// its reads. N values reduce together (one pair of barriers for all): the kernel is bound by the
// latency of its reductions (8 at decode: masses 2, totals 2, the cut's 3 histogram levels, the
// emission scan), not by its flops.
namespace cg = cooperative_groups;
constexpr int kMaxRed = 16;
constexpr int kMaxCluster = 16;
constexpr int kAutoCluster = 4;  // the largest size chosen: each block reads every rank's histogram

struct SumF {
  using T = float;
  static __device__ __forceinline__ T id() { return 0.0f; }
  static __device__ __forceinline__ T op(T a, T b) { return a + b; }
};
// (max, sum) pairs of an online softmax: (m, z) stands for z * 2^m. One reduction gives a q
// vector's normaliser where a max and then a sum took two (and two passes over the scores).
struct SoftmaxF {
  using T = float2;  // (m, z)
  static __device__ __forceinline__ T id() { return make_float2(-INFINITY, 0.0f); }
  static __device__ __forceinline__ T op(T a, T b) {
    const float m = fmaxf(a.x, b.x);
    if (m == -INFINITY) return id();
    return make_float2(m, a.y * ptx::ex2_approx(a.x - m) + b.y * ptx::ex2_approx(b.x - m));
  }
};

__device__ __forceinline__ float shfl_xor(float v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ float2 shfl_xor(float2 v, int o) { return make_float2(shfl_xor(v.x, o), shfl_xor(v.y, o)); }
__device__ __forceinline__ float shfl_idx(float v, int l) { return __shfl_sync(0xffffffffu, v, l); }
__device__ __forceinline__ float2 shfl_idx(float2 v, int l) { return make_float2(shfl_idx(v.x, l), shfl_idx(v.y, l)); }

// Exclusive prefixes over the block's threads (thread order) of N values at once: v becomes
// the prefix; on_total(k, sum) gets the block's sums. One barrier; buf ([N * kSelectWarps]) is
// rewritten only after the next barrier of its user (alternating halves, as in ClusterReduce).
template <class T, int N, class OnTotal>
__device__ __forceinline__ void block_exclusive_scan(T (&v)[N], T* buf, OnTotal&& on_total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T inc[N];
#pragma unroll
  for (int k = 0; k < N; ++k) inc[k] = v[k];
#pragma unroll
  for (int o = 1; o < 32; o <<= 1)
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const T y = __shfl_up_sync(0xffffffffu, inc[k], o);
      if (lane >= o) inc[k] += y;
    }
  if (lane == 31)
#pragma unroll
    for (int k = 0; k < N; ++k) buf[k * kSelectWarps + warp] = inc[k];
  __syncthreads();
  // Every warp scans the warp totals itself (lane w < kSelectWarps holds warp w's): a 4-step
  // shuffle scan per value, where a loop over the 16 totals took 16 loads and 32 adds.
#pragma unroll
  for (int k = 0; k < N; ++k) {
    T t = lane < kSelectWarps ? buf[k * kSelectWarps + lane] : T(0);
#pragma unroll
    for (int o = 1; o < kSelectWarps; o <<= 1) {
      const T y = __shfl_up_sync(0xffffffffu, t, o);
      if (lane >= o) t += y;
    }
    const T before = warp > 0 ? __shfl_sync(0xffffffffu, t, warp - 1) : T(0);
    on_total(k, __shfl_sync(0xffffffffu, t, kSelectWarps - 1));
    v[k] = before + inc[k] - v[k];
  }
}

struct ClusterReduce {
  uint32_t (*wbuf)[kMaxRed * kSelectWarps];  // [2][kMaxRed * kSelectWarps] this block's warp partials
  uint32_t (*bbuf)[kMaxRed];                 // [2][kMaxRed] this block's totals, read by the cluster
  unsigned rank = 0, n_blocks = 1;
  int par = 0;

  // Every warp: lane r < n_blocks reads value k of rank r's totals.
  __device__ __forceinline__ uint32_t remote(const uint32_t* bt, int k) const {
    const int lane = threadIdx.x & 31;
    return *cg::this_cluster().map_shared_rank(bt + k, lane);
  }

  // N values of Op::T (float: N <= kMaxRed; float2: N <= kMaxRed / 2) reduce together.
  template <class Op, int N>
  __device__ __forceinline__ void reduce(typename Op::T (&v)[N]) {
    using T = typename Op::T;
    static_assert(N * sizeof(T) <= kMaxRed * sizeof(uint32_t));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int k = 0; k < N; ++k)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v[k] = Op::op(v[k], shfl_xor(v[k], o));
    T* w = reinterpret_cast<T*>(wbuf[par]);
    T* bt = reinterpret_cast<T*>(bbuf[par]);
    par ^= 1;
    if (lane == 0)
#pragma unroll
      for (int k = 0; k < N; ++k) w[k * kSelectWarps + warp] = v[k];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int k = 0; k < N; ++k) {
        T t = lane < kSelectWarps ? w[k * kSelectWarps + lane] : Op::id();
#pragma unroll
        for (int o = kSelectWarps / 2; o > 0; o >>= 1) t = Op::op(t, shfl_xor(t, o));
        if (lane == 0) bt[k] = t;
      }
    }
    cg::this_cluster().sync();
    // Every warp: lane r < n_blocks reads rank r's totals (all N loads issued before the tree).
    T t[N];
#pragma unroll
    for (int k = 0; k < N; ++k) t[k] = lane < static_cast<int>(n_blocks) ? *cg::this_cluster().map_shared_rank(bt + k, lane) : Op::id();
    // The xor tree over the C ranks only: the levels o >= C of a 16-lane tree would combine
    // identities (op(x, id) == x exactly), so skipping them keeps every bit.
    // (The level loop outside, not unrolled; the N values inside, so their chains interleave.)
#pragma unroll 1
    for (int o = static_cast<int>(n_blocks) / 2; o > 0; o >>= 1)
#pragma unroll
      for (int k = 0; k < N; ++k) t[k] = Op::op(t[k], shfl_xor(t[k], o));
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = shfl_idx(t[k], 0);
  }
  // Exclusive prefixes over the cluster's threads in (rank, thread) order of N values at once;
  // total[k] gets the sums.
  template <int N>
  __device__ __forceinline__ void exclusive_scan(int (&v)[N], int (&total)[N]) {
    static_assert(N <= kMaxRed);
    const int lane = threadIdx.x & 31;
    uint32_t* bt = bbuf[par];
    block_exclusive_scan(v, reinterpret_cast<int*>(wbuf[par]), [&](int k, int all) {  // v: the prefix within the block
      if (threadIdx.x == 0) bt[k] = static_cast<uint32_t>(all);
    });
    par ^= 1;
    cg::this_cluster().sync();
    int t[N];
#pragma unroll
    for (int k = 0; k < N; ++k) t[k] = lane < static_cast<int>(n_blocks) ? static_cast<int>(remote(bt, k)) : 0;
    // The scan over the C ranks only (lanes >= C are never read); levels outside, values inside.
#pragma unroll 1
    for (int o = 1; o < static_cast<int>(n_blocks); o <<= 1)
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const int y = __shfl_up_sync(0xffffffffu, t[k], o);
        if (lane >= o) t[k] += y;
      }
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int lower = __shfl_sync(0xffffffffu, t[k], rank > 0 ? static_cast<int>(rank) - 1 : 0);
      total[k] = __shfl_sync(0xffffffffu, t[k], static_cast<int>(n_blocks) - 1);
      v[k] += rank > 0 ? lower : 0;
    }
  }
};

template <int N>
struct IntC {
  static constexpr int value = N;
};

// The cut search in fixed point: a page's mass as an integer of 2^-40 units (exact integer sums
// need no fixed order; 8,192 pages of mass <= 1 stay below 2^53). Masses under 2^-41 count 0.
__device__ __forceinline__ unsigned long long fixed_mass(float m) { return __float2ull_rn(m * 0x1p40f); }

// Histogram levels of the cut search over the float bits of the (non-negative) mass: level 0 the
// exponent and 3 mantissa bits (bits 30..20), levels 1 and 2 bits 19..9 and 8..0. For coverage,
// level 0 bins only exponents from kExpLow + 1 up (a mass below 2^-47 weighs 0 in fixed point, so
// the cut never falls there; they share bins 0-7): 49 * 8 of its 512 bins are used, where 2,048
// covered every exponent. Each bin is two 32-bit words, weight >> 12 and weight & 0xFFF: the
// weights (< 2^41, 2^-40 units) sum to about 2^40 (the masses sum to 1), so the high words stay
// below 2^29; a low word wraps only past 2^20 pages in one bin of one block (a per-thread run past
// 2^20 rounds, a warp's past 2^15 rounds per thread), and top-k's weights of 1 count pages. (v11b
// split at bit 16, which wraps at 65,537 uniform pages in a bin: a 2M-token list.) Shared-memory
// atomics on 32-bit words are native, on 64-bit ones a compare-and-swap loop (ncu: half of the
// kernel's stall samples sat in level 0's 64-bit adds and the remote reads after them).
constexpr int kHistBins = 2048;
constexpr int kHistLevels = 3;
constexpr int kAtomicShare = 4;  // lanes of a warp per bin up to which shared atomics are cheaper
constexpr int kExpLow = 79;      // level 0's bin 0: exponent fields <= 79 (masses < 2^-47)
__device__ __constant__ const int kHistHi[kHistLevels] = {31, 20, 9};
__device__ __constant__ const int kHistLo[kHistLevels] = {20, 9, 0};
__device__ __constant__ const int kHistN[kHistLevels] = {512, 2048, 512};  // (level 0 for coverage; top-k: 2048)
// Level 0's bin of mass bits, and the bits 31..20 a level-0 bin stands for (bins >= 8; bins 0-7 hold
// every exponent <= kExpLow).
__device__ __forceinline__ uint32_t level0_bin(uint32_t bits) {
  const int e = static_cast<int>(bits >> 23);
  return (static_cast<uint32_t>(max(e - kExpLow, 0)) << 3) | ((bits >> 20) & 7u);
}
__device__ __forceinline__ uint32_t level0_prefix(uint32_t bin) { return (((bin >> 3) + kExpLow) << 23) | ((bin & 7u) << 20); }

// A cluster per list (per request under SoloHead). Thread tid of rank r owns pages
// k * C * threads + r * threads + tid (every pass over the scores is coalesced, and round k
// covers consecutive pages in (rank, thread) order); the masses of its first kRegPer pages
// live in registers (lists up to C * 4,096 pages: 128k tokens at C = 2), the rest in shared
// memory (then the global workspace). Pages are emitted in index order by rounds, one cluster
// scan ranking a round. kRegPer = 8, not 16: every phase unrolls its rounds, and the kernel's
// code is fetched cold at each layer's call (the score kernel streams hundreds of MB through L2
// first): 413 -> 278 KB of code, select 58 -> 47 us at 128k x 8 (NOTES v13).
constexpr int kRegPer = 8;
// (>= 4: the emission's register scans are 1 or 4 wide below kRegPer rounds; a smaller kRegPer
// would scan past mr[] and emit rounds 1-3 twice, as a kRegPer = 1 build did in test_page_select.)
static_assert(kRegPer >= 4);
constexpr int kVecChunk = 4;  // q vectors whose (max, sum) reduce together
constexpr int kCacheRounds = 8;  // rounds whose exp-terms the mass pass reads from shared memory
constexpr int kCacheFloats = kCacheRounds * kVecChunk * kSelectThreads;  // 64 KiB

__global__ void __launch_bounds__(kSelectThreads, 1) select_pages_kernel(const __grid_constant__ detail::PageSelectKernelArgs p) {
  extern __shared__ float s_mass[];  // [smem_pages] overflow masses, then [kCacheRounds][kVecChunk][threads] terms
  float* const s_wcache = s_mass + p.smem_pages;
  __shared__ __align__(8) uint32_t s_wbuf[2][kMaxRed * kSelectWarps];
  __shared__ __align__(8) uint32_t s_bbuf[2][kMaxRed];
  __shared__ __align__(8) uint32_t s_hist[2][2 * kHistBins];  // the cut search's histograms, alternating levels
  __shared__ unsigned long long s_scan[2][kSelectWarps];
  __shared__ unsigned long long s_cut[2];               // (bin, weight above it) of the level's cut
  auto stamp = [&](int which) {  // (benchmark: each block's entry and exit)
    if (p.block_ns != nullptr && threadIdx.x == 0) p.block_ns[2 * blockIdx.x + which] = static_cast<long long>(ptx::globaltimer());
  };
  stamp(0);
  if (threadIdx.x == 0) ptx::stamp_span(p.span_ns == nullptr ? nullptr : p.span_ns + 2, 0);
  if (threadIdx.x == 0) ptx::stamp_span(p.span_ns == nullptr ? nullptr : p.span_ns + 8, 1);  // [9]: the last entry
  // Launched as a programmatic dependent (of the score kernel, or of whatever precedes it): its
  // blocks may be resident before that kernel ends; nothing is read before this wait.
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();  // compact may be scheduled (it waits for this kernel's end)
  if (threadIdx.x == 0 && p.span_ns != nullptr) {  // (benchmark: the first and last release from the wait)
    ptx::stamp_span(p.span_ns + 6, 0);
    ptx::stamp_span(p.span_ns + 6, 1);
  }
  const cg::cluster_group cluster = cg::this_cluster();
  ClusterReduce red{s_wbuf, s_bbuf, cluster.block_rank(), cluster.num_blocks()};
  const int n_blk = static_cast<int>(red.n_blocks), rank = static_cast<int>(red.rank);
  const int row = blockIdx.x / n_blk;
  const int req = row / p.n_heads_kv, h = row - req * p.n_heads_kv;
  if (p.share_heads && h != 0) return;  // SoloHead: the request's head-0 cluster decides for all
  const int base = p.dense_indptr[row], n = p.dense_indptr[row + 1] - base;
  const int seq = p.seq_len[req];
  const int q0 = p.q_indptr[req], q_len = p.q_indptr[req + 1] - q0;
  const int group = p.n_heads_q / p.n_heads_kv;
  const int tid = threadIdx.x;
  const int stride = n_blk * kSelectThreads, off = rank * kSelectThreads + tid;
  // Benchmark timeline: block 0's thread 0 stamps clock64() at the phase ends (phase_cycles).
  // Entries 12 and 13: %globaltimer (ns) at entry and exit, for the clock the cycles ran at.
  auto mark = [&](int k) {
    if (p.phase_cycles != nullptr && blockIdx.x == 0 && tid == 0) {
      p.phase_cycles[k] = clock64();
      if (k == 0 || k == 11) p.phase_cycles[k == 0 ? 12 : 13] = static_cast<long long>(ptx::globaltimer());
    }
  };
  mark(0);
  const int per = (n + stride - 1) / stride;  // rounds
  // The request's rule: its own (row_rules) or the launch's.
  RowRule rr{0, p.rule, p.gamma, p.budget, p.frac, p.n_sink, p.n_recent};
  if (p.row_rules != nullptr) rr = p.row_rules[req];
  const int sink = min(rr.n_sink, n), recent_from = max(sink, n - rr.n_recent);
  auto forced = [&](int i) { return i < sink || i >= recent_from; };

  enum Mode { kAll, kForced, kCut } mode = kCut;
  int k_top = 0;
  if (n == 0 || q_len == 0 || seq < p.dense_below || rr.all_pages) mode = kAll;
  else if (rr.rule == SelectRule::SinkWindow) mode = kForced;
  else if (rr.rule == SelectRule::Coverage && rr.gamma >= 1.0f) mode = kAll;
  else if (rr.rule == SelectRule::TopK) {
    k_top = p.budget_frac && !p.share_heads && p.row_rules == nullptr
                ? static_cast<int>(ceilf(p.budget_frac[h] * static_cast<float>(n)))
            : rr.frac > 0.0f ? static_cast<int>(ceilf(rr.frac * static_cast<float>(n)))
                             : rr.budget;
    if (k_top >= n) mode = kAll;
  }
  // A seeded draft's seeds (window_lists.h's rule): the first n_seeds of its store row. Its flag
  // below is its window or membership here (a seed past the list or inside the window adds
  // nothing); the histograms are unused in this mode. Every thread of a block takes the same branch.
  int n_seed = 0;
  int32_t* const s_seed = reinterpret_cast<int32_t*>(s_hist[0]);
  static_assert(sizeof(s_hist[0]) >= kMaxSeedPages * sizeof(int32_t));
  if (mode == kForced && rr.n_seeds > 0 && p.seeds != nullptr && !p.share_heads) {
    n_seed = min(rr.n_seeds, p.seed_cap);
    const int32_t* sd = p.seeds + ((static_cast<int64_t>(p.req_slot[req]) * p.n_layers + p.layer) * p.n_heads_kv + h) * p.seed_cap;
    for (int t = tid; t < n_seed; t += kSelectThreads) s_seed[t] = __ldg(sd + t);
    __syncthreads();
  }
  auto seeded = [&](int i) {
    for (int j = 0; j < n_seed; ++j)
      if (s_seed[j] == i) return true;  // (the same word for the whole warp: a broadcast)
    return false;
  };

  // The thread's masses: registers for rounds < kRegPer, then shared memory (m[(k - kRegPer) *
  // threads + tid]: consecutive threads, consecutive words) or the list's global workspace.
  float mr[kRegPer];
  const bool ovf_smem = (per - kRegPer) * kSelectThreads <= p.smem_pages;
  auto ovf = [&](int k) -> float& {
    return ovf_smem ? s_mass[(k - kRegPer) * kSelectThreads + tid] : p.mass[base + k * stride + off];
  };
  // f(round, page index, mass) over the thread's pages, in round order.
  auto for_owned = [&](auto&& f) {
    int i = off;
#pragma unroll
    for (int k = 0; k < kRegPer; ++k, i += stride) {
      if (i >= n) return;  // (i only grows)
      f(k, i, mr[k]);
    }
    for (int k = kRegPer; k < per && i < n; ++k, i += stride) f(k, i, ovf(k));
  };

  uint32_t thr = 0;  // the cut: pages of mass bits > thr are in, == thr by index up to k_eq
  int k_eq = 0;
  bool topk_forced_only = false;
  if (mode == kCut) {
    // Both histograms zeroed before the mass phase (its reductions' barriers order the stores).
    for (int t = tid; t < 4 * kHistBins; t += kSelectThreads) s_hist[t / (2 * kHistBins)][t % (2 * kHistBins)] = 0;
    mark(1);
    for_owned([&](int, int, float& m) { m = 0.0f; });
    const int h_first = p.share_heads ? 0 : h, h_last = p.share_heads ? p.n_heads_kv - 1 : h;
    const int n_vec = q_len * group;
    // (Scores of another launch: its list of this request's sequence, from this row's q vectors on.)
    const bool from = p.score_req != nullptr;
    const int score_row0 = from ? p.score_req[req] * p.n_heads_kv : req * p.n_heads_kv;
    const int vec0 = from ? p.score_vec0[req] : 0;
    for (int hh = h_first; hh <= h_last; ++hh) {
      const int bh = (from ? p.score_indptr : p.dense_indptr)[score_row0 + hh];
      for (int j0 = 0; j0 < n_vec; j0 += kVecChunk) {
        // Per q vector j of the chunk: the cluster's (max, sum) of n_i 2^s_i, then the masses.
        int qpos[kVecChunk];
#pragma unroll
        for (int c = 0; c < kVecChunk; ++c) qpos[c] = j0 + c < n_vec ? seq - q_len + (j0 + c) / group : -1;
        // A dense list holds every page of its request in order: page i is the request's page i
        // (no load of its position in each of the three passes).
        auto first_token = [&](int i) { return i * p.page_size; };
        auto visible = [&](int tok0, int c) { return min(max(qpos[c] + 1 - tok0, 0), p.page_size); };
        const float* srow[kVecChunk];  // q vector j0 + c's scores of this list (rows past n_vec are never read)
#pragma unroll
        for (int c = 0; c < kVecChunk; ++c) srow[c] = p.scores + static_cast<int64_t>(vec0 + j0 + c) * p.score_stride + bh;
        auto score = [&](int i, int c) { return srow[c][i]; };
        // Each thread's own (max, sum) of n_i 2^s_i per q vector, then one reduction of the pairs
        // (v10 reduced the max and the sum apart). One pass takes the max and the sum against 2^0:
        // where the thread's max lies in [-64, 64] that sum neither overflows (<= 2^64 * 16 * its
        // pages) nor loses its largest terms, and it stands as the pair (0, sum); otherwise (rare)
        // the thread sums again against its max.
        float2 mz[kVecChunk];
        float z0[kVecChunk];
#pragma unroll
        for (int c = 0; c < kVecChunk; ++c) {
          mz[c] = SoftmaxF::id();
          z0[c] = 0.0f;
        }
        // The terms n_i 2^s_i of the first kCacheRounds rounds stay in shared memory for the mass
        // pass (which then needs no score load and no exp2 where the thread's sum was plain).
        for_owned([&](int k, int i, float&) {
          const int tok0 = first_token(i);
#pragma unroll
          for (int c = 0; c < kVecChunk; ++c) {
            float e = 0.0f;
            if (const int nv = visible(tok0, c); nv > 0) {
              const float sc = score(i, c);
              mz[c].x = fmaxf(mz[c].x, sc);
              e = static_cast<float>(nv) * ptx::ex2_approx(sc);
              z0[c] += e;
            }
            if (k < kCacheRounds) s_wcache[(k * kVecChunk + c) * kSelectThreads + tid] = e;
          }
        });
        bool again = false;
        unsigned plain_c = 0;  // bit c: this thread's sum of q vector c is the plain one (cached terms valid)
#pragma unroll
        for (int c = 0; c < kVecChunk; ++c) {
          const bool plain = mz[c].x >= -64.0f && mz[c].x <= 64.0f;
          again = again || (!plain && mz[c].x != -INFINITY);
          if (plain) {
            mz[c] = make_float2(0.0f, z0[c]);  // (a thread that sees no key keeps (-inf, 0))
            plain_c |= 1u << c;
          }
        }
        if (again)
          for_owned([&](int, int i, float&) {
            const int tok0 = first_token(i);
#pragma unroll
            for (int c = 0; c < kVecChunk; ++c) {
              const int nv = visible(tok0, c);
              if (nv > 0 && mz[c].x != -INFINITY && mz[c].x != 0.0f) mz[c].y += static_cast<float>(nv) * ptx::ex2_approx(score(i, c) - mz[c].x);
            }
          });
        mark(2);
        red.reduce<SoftmaxF>(mz);
        mark(3);
        float mx[kVecChunk], z[kVecChunk];
#pragma unroll
        for (int c = 0; c < kVecChunk; ++c) {
          mx[c] = mz[c].x;
          z[c] = mz[c].y;
        }
        float inv_z[kVecChunk], f_c[kVecChunk];  // f_c: a cached term's factor, 2^-max / z
#pragma unroll
        for (int c = 0; c < kVecChunk; ++c) {
          inv_z[c] = mx[c] != -INFINITY && z[c] > 0.0f ? 1.0f / z[c] : 0.0f;  // 0: row sees no key
          f_c[c] = inv_z[c] == 0.0f ? 0.0f : ptx::ex2_approx(-mx[c]) * inv_z[c];
        }
        for_owned([&](int k, int i, float& m) {
          const int tok0 = first_token(i);
#pragma unroll
          for (int c = 0; c < kVecChunk; ++c) {
            if (inv_z[c] == 0.0f) continue;
            float w;
            if (k < kCacheRounds && (plain_c >> c & 1u)) {
              w = s_wcache[(k * kVecChunk + c) * kSelectThreads + tid] * f_c[c];
            } else {
              const int nv = visible(tok0, c);
              w = nv == 0 ? 0.0f : static_cast<float>(nv) * ptx::ex2_approx(score(i, c) - mx[c]) * inv_z[c];
            }
            m = p.combine_max ? fmaxf(m, w) : m + w;
          }
        });
      }
    }
    mark(4);
    if (p.stop_after == 1) {
      cluster.sync();
      return;
    }
    // The (forced, free) sums of the combined masses: their total normalises them (no reduction
    // of its own), the coverage rule needs both.
    float f2[2] = {0.0f, 0.0f};
    for_owned([&](int, int i, float& m) {
      if (forced(i)) f2[0] += m;
      else f2[1] += m;
    });
    red.reduce<SumF>(f2);
    mark(5);
    if (const float tot = f2[0] + f2[1]; tot > 0.0f) {
      const float inv = 1.0f / tot;
      for_owned([&](int, int, float& m) { m *= inv; });
      f2[0] *= inv;
      f2[1] *= inv;
    }
    if (p.mass_out) for_owned([&](int, int i, float& m) { p.mass_out[base + i] = m; });
    if (p.stop_after == 2) {
      cluster.sync();
      return;
    }

    // The cut: the largest thr with W(>= thr) >= need, W = the summed weight (fixed-point mass,
    // or 1 for top-k) of the free pages of mass bits >= thr. Three histogram levels settle 11, 11
    // and 9 bits of thr: each block bins its pages below the settled prefix, the cluster's
    // histograms are added (every block reads every rank's), and a block scan from the top bin
    // finds the bin where the running weight reaches need. 3 levels of 2 barriers and a cluster
    // barrier, where a bisection takes 16-31 block reductions. Returns false when the free pages'
    // weight is below need (the same in every block); above = W(> thr).
    // compress0: level 0 over the exponents that can carry fixed-point weight only (coverage; top-k
    // counts every page, so its level 0 covers every exponent).
    auto hist_cut = [&](auto&& weight, bool compress0, unsigned long long need_w, unsigned long long& above) -> bool {
      uint32_t prefix = 0;
      above = 0;
      for (int lv = 0; lv < kHistLevels; ++lv) {
        const bool c0 = lv == 0 && compress0;
        const int hi = kHistHi[lv], lo = kHistLo[lv], n_bins = c0 ? kHistN[0] : 1 << (hi - lo), per_thread = n_bins / kSelectThreads;
        uint32_t* hist = s_hist[lv & 1];  // [bin][weight >> 12, weight & 0xFFF]; zeroed (below, or before level 0)
        // Each thread first merges runs of its pages that share a bin (masses crowd into few
        // bins: a thread's pages mostly do) and adds a run when its bin changes; its last run goes
        // in warp-aggregated: the lanes with the same bin sum their weights (redux.sync over the
        // match_any group) and one of them adds the sum, where per-lane atomics on one shared word
        // would serialize; lanes add their own when no bin holds more than kAtomicShare of the
        // warp's lanes (MinMax masses spread over many bins, sketch4 masses crowd). v10 matched
        // and reduced every round (ncu: level 0 was a quarter of the kernel).
        uint32_t run_bin = 0xFFFFFFFFu;
        unsigned run_hi = 0, run_lo = 0;
        auto add_run = [&] {
          if (run_bin == 0xFFFFFFFFu) return;
          if (run_hi) atomicAdd(&hist[2 * run_bin], run_hi);
          atomicAdd(&hist[2 * run_bin + 1], run_lo);
        };
        auto add = [&](int i, float m) {
          const uint32_t bits = __float_as_uint(m);
          if (!(i < n && !forced(i) && (lv == 0 || (bits >> hi) == (prefix >> hi)))) return;
          const uint32_t bin = c0 ? level0_bin(bits) : (bits >> lo) & static_cast<uint32_t>(n_bins - 1);
          const unsigned long long w = weight(m);  // < 2^41 (coverage) or 1 (top-k)
          if (bin != run_bin) {
            add_run();
            run_bin = bin;
            run_hi = run_lo = 0;
          }
          run_hi += static_cast<unsigned>(w >> 12);
          run_lo += static_cast<unsigned>(w & 0xFFFu);
        };
#pragma unroll
        for (int k = 0; k < kRegPer; ++k) {
          if (k >= per) break;  // (uniform)
          add(k * stride + off, mr[k]);
        }
        for (int k = kRegPer; k < per; ++k) {
          const int i = k * stride + off;
          add(i, i < n ? ovf(k) : 0.0f);
        }
        {
          const bool in = run_bin != 0xFFFFFFFFu;
          const unsigned peers = __match_any_sync(0xffffffffu, run_bin);
          if (__any_sync(0xffffffffu, in && __popc(peers) > kAtomicShare)) {  // a crowded bin
            run_hi = __reduce_add_sync(peers, run_hi);
            run_lo = __reduce_add_sync(peers, run_lo);
            if (static_cast<int>(threadIdx.x & 31) != __ffs(peers) - 1) run_bin = 0xFFFFFFFFu;
          }
          add_run();
        }
        cluster.sync();  // every rank's histogram complete (the alternate one is no longer read)
        // The alternate histogram (level lv - 1's, whose remote reads every block finished before
        // this cluster barrier) is zeroed for level lv + 1; the barrier after the cut orders it.
        if (lv >= 1 && lv + 1 < kHistLevels)
          for (int t = tid; t < 2 * kHistBins; t += kSelectThreads) s_hist[(lv + 1) & 1][t] = 0;
        // Thread tid's bins from the top: q = per_thread * tid + k is bin n_bins - 1 - q. A bin's
        // two words are adjacent (one 8-byte remote read per rank); the reads of up to kAutoCluster
        // ranks are issued together, then added, one bin at a time (all of them at once spilled).
        constexpr int kMaxPer = kHistBins / kSelectThreads;
        unsigned long long v[kMaxPer], t_sum = 0;
#pragma unroll
        for (int k = 0; k < kMaxPer; ++k) {
          v[k] = 0;
          if (k < per_thread) {
            const uint2* h2 = reinterpret_cast<const uint2*>(hist) + (n_bins - 1 - (per_thread * tid + k));
            uint2 rv[kAutoCluster];
#pragma unroll
            for (int r = 0; r < kAutoCluster; ++r) rv[r] = r < n_blk ? *cluster.map_shared_rank(h2, r) : make_uint2(0u, 0u);
            unsigned long long sh = 0, sl = 0;
#pragma unroll
            for (int r = 0; r < kAutoCluster; ++r) {
              sh += rv[r].x;
              sl += rv[r].y;
            }
#pragma unroll 1
            for (int r = kAutoCluster; r < n_blk; ++r) {  // (C > 4: tests and sweeps only)
              const uint2 x = *cluster.map_shared_rank(h2, r);
              sh += x.x;
              sl += x.y;
            }
            v[k] = (sh << 12) + sl;
            t_sum += v[k];
          }
        }
        unsigned long long before[1] = {t_sum}, level_total = 0;
        block_exclusive_scan(before, s_scan[lv & 1], [&](int, unsigned long long all) { level_total = all; });
        unsigned long long cum = above + before[0];
        if (lv == 0 && level_total < need_w) return false;
#pragma unroll
        for (int k = 0; k < kMaxPer; ++k)
          if (k < per_thread) {
            if (cum < need_w && need_w <= cum + v[k]) {  // exactly one bin of the level (above < need <= above + total)
              s_cut[0] = static_cast<unsigned long long>(n_bins - 1 - (per_thread * tid + k));
              s_cut[1] = cum;
            }
            cum += v[k];
          }
        __syncthreads();
        prefix |= c0 ? level0_prefix(static_cast<uint32_t>(s_cut[0])) : static_cast<uint32_t>(s_cut[0]) << lo;
        above = s_cut[1];
        mark(6 + lv);
        if (p.stop_after == 3 + lv) return true;
      }
      thr = prefix;
      return true;
    };

    if (rr.rule == SelectRule::Coverage) {
      const float need = rr.gamma - f2[0];
      if (need <= 0.0f) mode = kForced;
      else if (f2[1] < need) mode = kAll;  // rounding shortfall: every page
      else {
        const unsigned long long need_w = max(1ull, __float2ull_ru(need * 0x1p40f));
        unsigned long long above;
        if (!hist_cut([](float m) { return fixed_mass(m); }, true, need_w, above)) mode = kAll;  // rounding shortfall
        else {
          // The cut's bin has weight > 0, so its pages (all of mass bits thr) weigh tw > 0 each.
          const unsigned long long tw = fixed_mass(__uint_as_float(thr));
          k_eq = tw > 0 ? static_cast<int>((need_w - above + tw - 1) / tw) : 0;  // (tw 0 only when the bench ends the cut early)
        }
      }
    } else {  // TopK
      const int n_forced = sink + (n - recent_from);
      if (k_top <= n_forced) topk_forced_only = true;
      else {
        const int want = k_top - n_forced;  // free pages to add (< the free pages: k_top < n)
        unsigned long long above = 0;
        hist_cut([](float) { return 1ull; }, false, static_cast<unsigned long long>(want), above);
        k_eq = want - static_cast<int>(above);
      }
    }
  }

  if (p.stop_after >= 3) {  // (the benchmark's phase prefixes)
    cluster.sync();
    return;
  }
  // Emit in index order, one round at a time. Within a round one cluster scan counts, for each
  // page, the chosen non-tied pages and the tied pages (free pages of mass bits == thr) before
  // it: the first k_eq tied pages of the list (by index) are in.
  const int k_sink = min(k_top, sink), k_recent = k_top - k_sink;  // top-k within the forced pages
  const bool cut = mode == kCut && !topk_forced_only;
  // flag: 1 for a page surely in, 1 << 16 for a tied page (a round has < 2^16 of each).
  auto flag = [&](int i, float m) -> int {
    if (i >= n) return 0;
    if (mode == kAll) return 1;
    if (mode == kForced) return forced(i) || seeded(i) ? 1 : 0;
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
      // Only the page's index: compact gathers its slot and position (their loads, latency-bound
      // here, run there on many blocks).
      if (!p.share_heads) p.stage_idx[base + o] = i;
      else
#pragma unroll 1
        for (int hh = 0; hh < p.n_heads_kv; ++hh) p.stage_idx[p.dense_indptr[req * p.n_heads_kv + hh] + o] = i;
    }
    out_before += (all & 0xFFFF) + min(all >> 16, quota);
    ties_before += all >> 16;
  };
  // The register rounds: one scan for all of them (N of them: as few as the list needs).
  auto emit_rounds = [&](auto n_c) {
    constexpr int N = decltype(n_c)::value;
    int f[N], ex[N], all[N];
#pragma unroll
    for (int k = 0; k < N; ++k) ex[k] = f[k] = flag(k * stride + off, mr[k]);
    red.exclusive_scan(ex, all);
    mark(9);
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (k < per) emit(k * stride + off, f[k], ex[k], all[k]);
  };
  if (per <= 1) emit_rounds(IntC<1>{});
  else if (per <= 4) emit_rounds(IntC<4>{});
  else emit_rounds(IntC<kRegPer>{});  // (128k x 8: 8 rounds; a 16-wide scan cost 25 us there)
  for (int k = kRegPer; k < per; ++k) {  // overflow rounds, one scan each
    const int i = k * stride + off;
    int f[1] = {flag(i, i < n ? ovf(k) : 0.0f)}, ex[1] = {f[0]}, all[1];
    red.exclusive_scan(ex, all);
    emit(i, f[0], ex[0], all[0]);
  }

  if (rank == 0 && tid == 0) {
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
  mark(10);
  cluster.sync();  // no block leaves while another may still read its totals
  mark(11);
  stamp(1);
  if (threadIdx.x == 0) ptx::stamp_span(p.span_ns == nullptr ? nullptr : p.span_ns + 2, 1);
}

// ---- 3. compact ----------------------------------------------------------------------
constexpr int kCompactThreads = 256, kCompactSplit = 8;  // blocks per list: copies in flight

__global__ void __launch_bounds__(kCompactThreads) compact_lists_kernel(const __grid_constant__ detail::PageSelectKernelArgs p) {
  __shared__ int s_red[kCompactThreads / 32];
  if (threadIdx.x == 0) ptx::stamp_span(p.span_ns == nullptr ? nullptr : p.span_ns + 4, 0);
  ptx::griddep_wait();  // the select kernel's counts and staged lists
  ptx::griddep_launch_dependents();  // attention may be scheduled (it waits for this kernel's end)
  const int row = blockIdx.x;
  int s = 0;
  for (int r = threadIdx.x; r < row; r += blockDim.x) s += p.counts[r];
  const int off = block_sum<kCompactThreads>(s, s_red);  // entries of the lists before this one
  const int c = p.counts[row];
  if (threadIdx.x == 0 && blockIdx.y == 0) {
    p.indptr[row + 1] = off + c;
    if (row == 0) p.indptr[0] = 0;
    if (p.sel_seq_len && row % p.n_heads_kv == 0) p.sel_seq_len[row / p.n_heads_kv] = p.seq_len[row / p.n_heads_kv];
  }
  const int base = p.dense_indptr[row];
  for (int i = blockIdx.y * kCompactThreads + threadIdx.x; i < c; i += kCompactSplit * kCompactThreads) {
    const int idx = p.stage_idx[base + i];
    p.slots[off + i] = p.dense_slots[base + idx];
    p.page_pos[off + i] = p.dense_page_pos[base + idx];
  }
  __syncthreads();
  if (threadIdx.x == 0) ptx::stamp_span(p.span_ns == nullptr ? nullptr : p.span_ns + 4, 1);
}

// The select kernel's launch: n_lists clusters of c blocks (not copyable: cfg points at attr).
// pdl: launched as a programmatic dependent of the score kernel (its blocks start as the score
// kernel's leave; griddep_wait before the scores are read).
struct SelectLaunch {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[2] = {};
  SelectLaunch(int n_lists, int c, size_t smem, cudaStream_t stream, bool pdl = false) {
    cfg.gridDim = dim3(static_cast<unsigned>(n_lists * c));
    cfg.blockDim = dim3(kSelectThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(c);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 2 : 1;
  }
  SelectLaunch(const SelectLaunch&) = delete;
  SelectLaunch& operator=(const SelectLaunch&) = delete;
};

// Blocks per list: the largest C in {4, 2} with n_lists * C blocks within the GPU's SMs and all
// n_lists clusters resident at once (a cluster's blocks share a GPC), else 1. Larger clusters
// cost more than they save (measured: docs/kernels/page_select_NOTES.md). `forced` > 0 (tests,
// benchmarks) takes that size, up to 16 (the non-portable size).
int select_cluster_size(int n_lists, int forced, size_t smem) {
  static const int n_sms = [] {
    int dev = 0, sms = 0;
    DHS_CUDA_CHECK(cudaGetDevice(&dev));
    DHS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    DHS_CUDA_CHECK(cudaFuncSetAttribute(select_pages_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    DHS_CUDA_CHECK(cudaFuncSetAttribute(select_pages_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (kSelectSmemPages + kCacheFloats) * 4));
    return sms;
  }();
  if (forced > 0) {
    if (forced > kMaxCluster || (forced & (forced - 1)) != 0)
      check(cudaErrorInvalidValue, "page_select: select_cluster must be a power of two <= 16", __FILE__, __LINE__);
    return forced;
  }
  static int active[kMaxCluster + 1] = {};  // resident clusters per size (0: not asked yet)
  for (int c = kAutoCluster; c >= 2; c >>= 1) {
    if (n_lists * c > n_sms) continue;
    if (active[c] == 0) {
      const SelectLaunch l(n_lists, c, smem, nullptr);
      int n = 0;
      if (cudaOccupancyMaxActiveClusters(&n, select_pages_kernel, &l.cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        n = -1;
      }
      active[c] = n > 0 ? n : -1;
    }
    if (active[c] >= n_lists) return c;
  }
  return 1;
}

}  // namespace

void launch_page_select_stage(const PageSelectParams& params, const PageSelectProbe& probe, int stage,
                              cudaStream_t stream) {
  const detail::PageSelectKernelArgs p{params, probe};
  const int n_lists = p.n_requests * p.n_heads_kv;
  if (n_lists <= 0) return;
  if (stage == 0) {
    if (p.rule != SelectRule::SinkWindow) detail::launch_score_pages(p, stream);
    return;
  } else if (stage == 1) {
    const size_t smem = (static_cast<size_t>(p.smem_pages) + kCacheFloats) * 4;
    const SelectLaunch l(n_lists, select_cluster_size(n_lists, p.select_cluster, smem), smem, stream, p.select_pdl);
    DHS_CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, select_pages_kernel, p));
  } else {
    // (A programmatic dependent of select, as select of the score kernel.)
    launch_programmatic(true, compact_lists_kernel, dim3(static_cast<unsigned>(n_lists), kCompactSplit),
                        dim3(kCompactThreads), 0, stream, p);
  }
  DHS_CUDA_CHECK(cudaGetLastError());
}

void launch_page_select_stage(const PageSelectParams& p, int stage, cudaStream_t stream) {
  launch_page_select_stage(p, PageSelectProbe{}, stage, stream);
}

int page_select_cluster(int n_lists) {
  return select_cluster_size(n_lists, 0, (static_cast<size_t>(kSelectSmemPages) + kCacheFloats) * 4);
}

void launch_page_select(const PageSelectParams& p, const PageSelectProbe& probe, cudaStream_t stream) {
  for (int stage = 0; stage < 3; ++stage) launch_page_select_stage(p, probe, stage, stream);
}

void launch_page_select(const PageSelectParams& p, cudaStream_t stream) { launch_page_select(p, PageSelectProbe{}, stream); }

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
  DHS_CUDA_CHECK(cudaMalloc(&stage_idx_d_, nnz * sizeof(int32_t)));
}

PageSelectWorkspace::~PageSelectWorkspace() {
  cudaFree(scores_d_);
  cudaFree(mass_d_);
  cudaFree(counts_d_);
  cudaFree(stage_idx_d_);
}

void PageSelectWorkspace::bind(PageSelectParams* p) const {
  p->scores = scores_d_;
  p->mass = mass_d_;
  p->counts = counts_d_;
  p->stage_idx = stage_idx_d_;
  p->q_stride = q_stride_;
  p->score_stride = max_nnz_ > 0 ? max_nnz_ : 1;
  p->n_score_warps = n_score_warps_;
  p->smem_pages = kSelectSmemPages;
}

}  // namespace dhs::cuda
