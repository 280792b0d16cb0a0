// Stage 1 of sparse selection (page_select.h): the estimated score of every dense page
// for every q vector of its list, as dot products on tensor cores.
//
// Every estimate is linear in the page data once q is mapped to a "B vector":
//   MinMax:     sum_d max(q_d mn_d, q_d mx_d) = [min(q, 0) | max(q, 0)] . [mn | mx]
//   MeanSpread: q.mean and sum_d q_d^2 var_d = [q | 0] . [mean | var] and [0 | q^2] . [mean | var]
//   Sketch4:    per token, q8 . code (int8 q, 4-bit codes)
// so a warp scores 16 pages (summaries: one row per page, K = 2 * head_dim) or the 16 tokens of
// one page (sketch: K = head_dim) against 8 B columns with mma.sync: the 5-step warp
// reduction per (page, q vector) of a lane-per-dimension kernel is gone (v1-v3 of
// docs/kernels/page_select_NOTES.md spent most of their time there).
//
// The K index of a dot product may be permuted freely if A and B agree: lane (g, tig) loads
// 16-byte chunks of its rows at element 8 * (tig + 4 * jj) and uses them as its A registers of
// k-steps 2jj and 2jj+1; its B registers are built from the same elements of its column's
// vector. Rows of the A tile are contiguous per lane (coalesced 64 B per row and 4 lanes).
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/page_select.h"
#include "backend/cuda/pdl_launch.h"
#include "backend/cuda/ptx.cuh"

namespace dhs::cuda {

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kScoreThreads = 128;

// The list holding flat page `i`: the largest row with indptr[row] <= i (never an empty one), by
// the whole warp: rows with indptr[row] <= i are a prefix (indptr does not decrease), so the answer
// is their count - 1; the loads are independent (one memory latency for up to 32 * 8 lists, where a
// binary search chains log2(n_lists) of them at every warp's start).
__device__ __forceinline__ int find_list_warp(const int32_t* indptr, int n_lists, int64_t i) {
  const int lane = threadIdx.x & 31;
  int count = 0;
#pragma unroll 8
  for (int r0 = 0; r0 < n_lists; r0 += 32) {
    const int r = r0 + lane;
    count += __popc(__ballot_sync(0xffffffffu, r < n_lists && indptr[r] <= i));
  }
  return count - 1;
}

__device__ __forceinline__ __half2 u32_as_half2(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }
__device__ __forceinline__ uint32_t half2_as_u32(__half2 v) { return *reinterpret_cast<uint32_t*>(&v); }

// ---- summaries (MinMax, MeanSpread / Gaussian) ---------------------------------------
// Columns of an n-tile: MinMax one per q vector (tile nt: vectors 8nt .. 8nt+7); mean/variance
// two per vector (vectors 4nt .. 4nt+3: column 2v' = [q | 0], 2v'+1 = [0 | f16(q^2)]).
// f16(q^2) rounds q^2 (22 significant bits) to 11: the variance term is within 2^-11 of the
// fp32 one (q^2 overflows f16 above |q| = 255); products and sums are fp32 (the MinMax B vector is exact: q is f16).
template <int D>
__global__ void __launch_bounds__(kScoreThreads) score_summaries_kernel(const __grid_constant__ detail::PageSelectKernelArgs p) {
  constexpr int JJ = 2 * D / 32;  // 16-byte chunks per row per lane
  const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const int warp = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
  ptx::griddep_wait();  // the dense lists and q are earlier kernels' output (pdl_launch.h)
  ptx::griddep_launch_dependents();
  const int n_lists = p.n_requests * p.n_heads_kv;
  const int64_t total = p.dense_indptr[n_lists];
  const int64_t n_tiles_all = (total + 15) / 16;
  const int64_t tb = warp * n_tiles_all / p.n_score_warps, te = (warp + 1) * n_tiles_all / p.n_score_warps;
  if (tb >= te) return;
  const bool minmax = p.kind == SummaryKind::MinMax;
  const int group = p.n_heads_q / p.n_heads_kv;
  const float mul = p.scale * kLog2e;
  int row = find_list_warp(p.dense_indptr, n_lists, tb * 16);
  int cur_row = -1, cur_nt = -1;
  uint4 bq[JJ];
  // The next tile's slots are loaded one tile ahead: the page loads then wait on one latency.
  auto slots_of = [&](int64_t tile, int32_t& sa, int32_t& sb) {
    const int64_t q0 = tile * 16, qe = min(q0 + 16, total);
    sa = q0 + g < qe ? p.dense_slots[q0 + g] : -1;
    sb = q0 + g + 8 < qe ? p.dense_slots[q0 + g + 8] : -1;
  };
  int32_t next_a, next_b;
  slots_of(tb, next_a, next_b);
  for (int64_t tile = tb; tile < te; ++tile) {
    const int64_t p0 = tile * 16, p_end = min(p0 + 16, total);
    const int64_t ia = p0 + g, ib = p0 + g + 8;
    const int32_t slot_a = next_a, slot_b = next_b;
    if (tile + 1 < te) slots_of(tile + 1, next_a, next_b);
    while (p.dense_indptr[row + 1] <= p0) ++row;
    // Usually one list covers the tile; at a boundary each list present takes a pass.
    for (int r = row; r < n_lists && p.dense_indptr[r] < p_end; ++r) {
      const int64_t r_begin = max(static_cast<int64_t>(p.dense_indptr[r]), p0);
      const int64_t r_end = min(static_cast<int64_t>(p.dense_indptr[r + 1]), p_end);
      if (r_begin >= r_end) continue;
      const int req = r / p.n_heads_kv, h = r - req * p.n_heads_kv;
      const int q0 = p.q_indptr[req], n_vec = (p.q_indptr[req + 1] - q0) * group;
      const int n_nt = minmax ? (n_vec + 7) / 8 : (n_vec + 3) / 4;
      for (int nt = 0; nt < n_nt; ++nt) {
        if (r != cur_row || nt != cur_nt) {  // this lane's B column: vector j, part (mean/variance)
          const int j = minmax ? nt * 8 + g : nt * 4 + (g >> 1), part = g & 1;
          const __half* qv =
              p.q + (static_cast<int64_t>(q0 + j / group) * p.n_heads_q + h * group + j % group) * D;
#pragma unroll
          for (int jj = 0; jj < JJ; ++jj) {
            const int e = 8 * (tig + 4 * jj);  // element of the 2D-long B vector
            const bool second = e >= D;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (j < n_vec && (minmax || part == (second ? 1 : 0))) {
              const uint4 raw = *reinterpret_cast<const uint4*>(qv + (second ? e - D : e));
              uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
              const __half2 zero = __float2half2_rn(0.0f);
#pragma unroll
              for (int c = 0; c < 4; ++c) {
                const __half2 x = u32_as_half2(w[c]);
                w[c] = half2_as_u32(minmax ? (second ? __hmax2(x, zero) : __hmin2(x, zero)) : second ? __hmul2(x, x) : x);
              }
              v = make_uint4(w[0], w[1], w[2], w[3]);
            }
            bq[jj] = v;
          }
          cur_row = r;
          cur_nt = nt;
        }
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const __half* ra = p.summaries + static_cast<int64_t>(slot_a < 0 ? 0 : slot_a) * 2 * D;
        const __half* rb = p.summaries + static_cast<int64_t>(slot_b < 0 ? 0 : slot_b) * 2 * D;
#pragma unroll
        for (int jj = 0; jj < JJ; ++jj) {
          const int e = 8 * (tig + 4 * jj);
          const uint4 a = slot_a >= 0 ? *reinterpret_cast<const uint4*>(ra + e) : make_uint4(0u, 0u, 0u, 0u);
          const uint4 b = slot_b >= 0 ? *reinterpret_cast<const uint4*>(rb + e) : make_uint4(0u, 0u, 0u, 0u);
          const uint32_t a0[4] = {a.x, b.x, a.y, b.y}, a1[4] = {a.z, b.z, a.w, b.w};
          ptx::mma_f16_16816(acc, a0, bq[jj].x, bq[jj].y);
          ptx::mma_f16_16816(acc, a1, bq[jj].z, bq[jj].w);
        }
        // acc: rows g (page ia) and g+8 (page ib), columns 2tig and 2tig+1.
        const bool in_a = ia >= r_begin && ia < r_end, in_b = ib >= r_begin && ib < r_end;
        if (minmax) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int j = nt * 8 + 2 * tig + c;
            if (j >= n_vec) continue;
            if (in_a) p.scores[j * p.score_stride + ia] = acc[c] * mul;
            if (in_b) p.scores[j * p.score_stride + ib] = acc[2 + c] * mul;
          }
        } else {
          const int j = nt * 4 + tig;
          auto est = [&](float m, float v) {
            v = fmaxf(v, 0.0f);
            return (m + (p.gaussian ? 0.5f * p.scale * v : p.kappa * sqrtf(v))) * mul;
          };
          if (j < n_vec) {
            if (in_a) p.scores[j * p.score_stride + ia] = est(acc[0], acc[1]);
            if (in_b) p.scores[j * p.score_stride + ib] = est(acc[2], acc[3]);
          }
        }
      }
    }
  }
}

// ---- key sketch -----------------------------------------------------------------------
// The page's codes are the A operand (rows = its 16 tokens: g and g + 8 of lane (g, tig); the
// 4-bit codes as code + 8), q quantized to int8 per vector (step absmax / 127, code round(q /
// step)) the B operand (columns = q vectors). Lane (g, tig) then holds the scores of tokens g,
// g + 8 for columns 2tig, 2tig + 1, and a (page, column)'s 16-token log-sum-exp is a 2-value
// local sum plus three shuffles (over g):
//   score = log2( (1/n_vis) sum_vis 2^x_t ),  x_t = (acc_t - 8 sum(q8)) qstep step_t scale log2 e
// so the select kernel's n_vis * 2^score is the page's summed exp-score.
// Paired (PP = 2: at most 4 q vectors per list, a GQA group of <= 4 at decode): B's columns 0-3
// are page X's list's q vectors and 4-7 page Y's; page X's codes times B gives X's scores in
// columns 0-3, page Y's in 4-7 of a second accumulator, and lane (g, tig) keeps those of page
// tig / 2: every lane of the epilogue holds real scores (with one page per MMA at GQA 4, as v10
// did, half of the lanes and 3/4 of the rows idled).
// The two pages may lie in different lists: each half keeps its own list.
// Otherwise one page per pass against tiles of 8 q vectors.
// When every x of the pass lies in [-96, 96] (or is masked) the sum needs no max: 2^x neither
// overflows nor loses a visible token's share (each term >= 2^-96 next to a sum <= 2^100, fp32);
// otherwise the pass takes the usual max-subtracted form (one vote per pass, for the whole warp).
template <int PP>
__device__ __forceinline__ int epilogue_page(int tig) { return PP == 2 ? tig >> 1 : 0; }

// Pages reach the warp through a shared-memory ring of kSketchStages passes filled by cp.async
// (v11 held two passes in registers and waited on them: 2.4 TB/s); a pass's stage holds its
// pages' codes (the page image, 256 * KS bytes each), steps (16 floats) and positions. The page
// ids come 32 at a time, one per lane, a batch ahead, and reach the copying lanes by shuffles.
constexpr int kSketchStages = 4;

template <int KS, int PP>
struct SketchStage {
  static constexpr int kPageBytes = 16 * KS * 16;  // 16 tokens x head_dim / 2
  static constexpr int kCodes = 0, kSteps = PP * kPageBytes, kPos = kSteps + PP * 64;
  static constexpr int kBytes = kPos + 16;
  static constexpr int kWarpBytes = kSketchStages * kBytes;
  // One-page passes (PP 1) of lists of 9-32 q vectors (a verify's rows scored as one request):
  // each tile's B words and column constants per lane, quantized once per list ([tile][word][lane]).
  static constexpr int kCacheTiles = PP == 1 ? 4 : 0;
  static constexpr int kTileWords = KS * 2 + 4;
  static constexpr int kCacheBytes = kCacheTiles * kTileWords * 32 * 4;
};

// Page ids of pages base .. base + 31 (lane l: page base + l), and the next 32.
struct SketchIds {
  int base = 0;
  int32_t slot = -1, pos = -1, next_slot = -1, next_pos = -1;
  __device__ __forceinline__ void load(const PageSelectParams& p, int first, int e, int lane, int32_t& s, int32_t& q) {
    const int i = first + lane;
    s = i < e ? p.dense_slots[i] : -1;
    q = i < e ? p.dense_page_pos[i] : -1;
  }
  __device__ __forceinline__ void start(const PageSelectParams& p, int b, int e, int lane) {
    base = b;
    load(p, b, e, lane, slot, pos);
    load(p, b + 32, e, lane, next_slot, next_pos);
  }
  // Makes page j (>= base, < base + 64) part of the current batch.
  __device__ __forceinline__ void reach(const PageSelectParams& p, int j, int e, int lane) {
    if (j >= base + 32) {
      base += 32;
      slot = next_slot;
      pos = next_pos;
      load(p, base + 32, e, lane, next_slot, next_pos);
    }
  }
};

// Issues the copies of the pass at page j0 into the stage at shared address `st` (pages past e:
// zeros, position -1). codes_lane / steps_lane: the sketch arrays advanced by this lane's chunk.
// (v11's first form spent 39 instructions a page here on 64-bit address arithmetic.)
template <int KS, int PP>
__device__ __forceinline__ void issue_sketch_pass(const PageSelectParams& p, SketchIds& ids, int j0, int e, int lane,
                                                  const uint8_t* codes_lane, const float* steps_lane, uint32_t st,
                                                  uint64_t stream_pol) {
  using S = SketchStage<KS, PP>;
  ids.reach(p, j0 + PP - 1, e, lane);
  const uint32_t dst = st + 16 * lane;
#pragma unroll
  for (int pp = 0; pp < PP; ++pp) {
    const int32_t slot = __shfl_sync(0xffffffffu, ids.slot, (j0 + pp - ids.base) & 31);  // -1 past e
    const uint8_t* codes = codes_lane + static_cast<uint64_t>(max(slot, 0)) * S::kPageBytes;
    if constexpr (S::kPageBytes < 512) {  // (KS = 1: 256 B, lanes 0-15)
      if (lane < S::kPageBytes / 16)
        ptx::cp_async_16_hint(dst + S::kCodes + pp * S::kPageBytes, codes, slot >= 0 ? 16 : 0, stream_pol);
    } else {
#pragma unroll
      for (int r = 0; r < S::kPageBytes / 16 / 32; ++r)
        ptx::cp_async_16_hint(dst + S::kCodes + pp * S::kPageBytes + 512 * r, codes + 512 * r, slot >= 0 ? 16 : 0, stream_pol);
    }
  }
  // Lane l < 4 PP: chunk l % 4 of page l / 4's steps; lane l < PP: page l's position.
  const int32_t slot_s = __shfl_sync(0xffffffffu, ids.slot, (j0 + (lane >> 2) - ids.base) & 31);
  const int32_t pos = __shfl_sync(0xffffffffu, ids.pos, (j0 + lane - ids.base) & 31);
  if (lane < 4 * PP)
    ptx::cp_async_16_hint(st + S::kSteps + 16 * lane, steps_lane + static_cast<uint64_t>(max(slot_s, 0)) * 16, slot_s >= 0 ? 16 : 0,
                          stream_pol);
  if (lane < PP) asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(st + S::kPos + 4 * lane), "r"(pos) : "memory");
  ptx::cp_async_commit();
}

// Lane (g, tig)'s share of q vector j quantized to int8: the words of its k-step ks (bytes c:
// dims 32 ks + 4 tig + c and, in w[ks][1], 32 ks + 16 + 4 tig + c: the codes' layout), and the
// vector's step and code sum (equal in the 4 lanes of a group). Zero for !valid.
template <int KS>
__device__ __forceinline__ void quantize_q(const __half* qv, bool valid, int tig, uint32_t (&w)[KS][2], float& st,
                                           int& sum) {
  auto lane_q = [&](int ks, int hh, float (&x)[4]) {
    const uint2 raw = *reinterpret_cast<const uint2*>(qv + ks * 32 + 16 * hh + 4 * tig);
    const __half2 lo = u32_as_half2(raw.x), hi = u32_as_half2(raw.y);
    x[0] = __low2float(lo);
    x[1] = __high2float(lo);
    x[2] = __low2float(hi);
    x[3] = __high2float(hi);
  };
  float amax = 0.0f;  // two passes over the lane's 8 * KS elements (L1 hits): absmax, then codes
  if (valid)
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float x[4];
        lane_q(ks, hh, x);
#pragma unroll
        for (int c = 0; c < 4; ++c) amax = fmaxf(amax, fabsf(x[c]));
      }
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  st = amax / 127.0f;
  sum = 0;
#pragma unroll
  for (int ks = 0; ks < KS; ++ks)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      uint32_t word = 0;
      if (valid && st > 0.0f) {
        float x[4];
        lane_q(ks, hh, x);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int qc = static_cast<int>(fminf(127.0f, fmaxf(-127.0f, rintf(x[c] / st))));
          sum += qc;
          word |= (static_cast<uint32_t>(qc) & 0xFFu) << (8 * c);
        }
      }
      w[ks][hh] = word;
    }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
}

// The list a half of the pass is in (warp-uniform) and its request's shape.
struct SketchList {
  int row = -1, end = 0;  // list index; its pages end here
  int h = 0, q0 = 0, n_vec = 0, qpos0 = 0;
};

template <int KS, int PP>
__global__ void __launch_bounds__(kScoreThreads, KS <= 4 ? 6 : 1) score_sketch_kernel(const __grid_constant__ detail::PageSelectKernelArgs p) {
  constexpr int D = KS * 32;
  const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const int warp = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
  // The dense lists and q are earlier kernels' output (pdl_launch.h). Then the select kernel may
  // be scheduled (one resident wave here: it takes SMs as these blocks leave, and waits for this
  // kernel's end before it reads the scores).
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  if (lane == 0) ptx::stamp_span(p.span_ns, 0);
  const int n_lists = p.n_requests * p.n_heads_kv;
  const int64_t total = p.dense_indptr[n_lists];  // < 2^31 (PageSelectWorkspace)
  const int b = static_cast<int>(warp * total / p.n_score_warps), e = static_cast<int>((warp + 1) * total / p.n_score_warps);
  if (b >= e) return;
  const int group = p.n_heads_q / p.n_heads_kv;
  const float mul = p.scale * kLog2e;
  const float log2_page = log2f(static_cast<float>(p.page_size));
  const int pe = epilogue_page<PP>(tig);  // the page of this lane's output columns
  SketchList lst[PP];
  const int first_row = find_list_warp(p.dense_indptr, n_lists, b);
#pragma unroll
  for (int pp = 0; pp < PP; ++pp) {
    lst[pp].row = first_row - 1;
    lst[pp].end = b;
  }
  int cur_nt = -1;
  uint32_t bq[KS][2];              // this lane's B words: column g of the tile (paired: of its half)
  float qf[2], qsum8[2];           // columns 2tig + c: qstep * scale * log2 e and 8 * sum(q8)
  int qpos[2];                     // columns 2tig + c: the query row's position (-1: no such q vector)
  float* srow[2];                  // columns 2tig + c: its scores
  int qfirst = 0;                  // the first query row's position (of this lane's page's list)

  // The B words and column constants of tile nt (paired: nt = 0; half = page). Warp-uniform.
  // A half's list by a lane-dependent choice, as selects (a dynamic index would put lst in local memory).
  auto list_of = [&](bool second) {
    SketchList l = lst[0];
    if (PP == 2 && second) l = lst[PP - 1];
    return l;
  };
  auto rebuild = [&](int nt) {
    const SketchList lb = list_of(g >= 4);  // the list of this lane's B column
    const int jb = PP == 2 ? (g & 3) : nt * 8 + g;
    const int jbc = min(jb, max(lb.n_vec - 1, 0));
    const __half* qv = p.q + (static_cast<int64_t>(lb.q0 + jbc / group) * p.n_heads_q + lb.h * group + jbc % group) * D;
    float st;
    int sum;
    quantize_q<KS>(qv, jb < lb.n_vec, tig, bq, st, sum);
    // Column col = 2tig + c is B column col: lane 4 col holds its vector's step and sum.
    const SketchList le = list_of(pe == 1);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int col = 2 * tig + c;
      const int j = PP == 2 ? (col & 3) : nt * 8 + col;
      qf[c] = __shfl_sync(0xffffffffu, st, 4 * col) * mul;
      qsum8[c] = static_cast<float>(8 * __shfl_sync(0xffffffffu, sum, 4 * col));
      qpos[c] = j < le.n_vec ? le.qpos0 + j / group : -1;
      srow[c] = p.scores + static_cast<int64_t>(min(j, max(le.n_vec - 1, 0))) * p.score_stride;
    }
    qfirst = le.qpos0;
    cur_nt = nt;
  };

  extern __shared__ __align__(16) uint8_t s_sketch[];
  using S = SketchStage<KS, PP>;
  const uint32_t ring = ptx::smem_u32(s_sketch + (threadIdx.x >> 5) * S::kWarpBytes);  // this warp's stages
  // Lists of 2..kCacheTiles tiles: rebuilding a tile quantizes its q vectors from global memory,
  // and the passes alternate tiles, so each tile is built once per list into this warp's cache and
  // read back per pass (rebuilt per pass, 16 vectors cost ~6x the scoring of 4: H100, session 43).
  uint32_t* const tile_cache = reinterpret_cast<uint32_t*>(s_sketch + (kScoreThreads / 32) * S::kWarpBytes) +
                               (threadIdx.x >> 5) * (S::kCacheBytes / 4) + lane;
  int cached_row = -1;  // the list whose tiles the cache holds
  auto store_tile = [&](int nt) {
    uint32_t* c = tile_cache + nt * S::kTileWords * 32;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      c[(2 * ks) * 32] = bq[ks][0];
      c[(2 * ks + 1) * 32] = bq[ks][1];
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      c[(2 * KS + k) * 32] = __float_as_uint(qf[k]);
      c[(2 * KS + 2 + k) * 32] = __float_as_uint(qsum8[k]);
    }
  };
  auto load_tile = [&](int nt) {  // (PP 1: this lane's page is lst[0]'s)
    const uint32_t* c = tile_cache + nt * S::kTileWords * 32;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      bq[ks][0] = c[(2 * ks) * 32];
      bq[ks][1] = c[(2 * ks + 1) * 32];
    }
    const SketchList le = lst[0];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      qf[k] = __uint_as_float(c[(2 * KS + k) * 32]);
      qsum8[k] = __uint_as_float(c[(2 * KS + 2 + k) * 32]);
      const int j = nt * 8 + 2 * tig + k;
      qpos[k] = j < le.n_vec ? le.qpos0 + j / group : -1;
      srow[k] = p.scores + static_cast<int64_t>(min(j, max(le.n_vec - 1, 0))) * p.score_stride;
    }
    qfirst = le.qpos0;
    cur_nt = nt;
  };
  const uint8_t* const codes_lane = p.sketch_codes + 16 * lane;
  const float* const steps_lane = p.sketch_steps + 4 * (lane & 3);
  // The codes stream through L2 once (evict_first); the scores are read back by the select
  // kernel (evict_last). Measured at 128k x 8 (NOTES v13a): this kernel 180-181 -> 170.4 us, the
  // select kernel's pass over the scores 6.6 -> 5.2 us in the pipeline.
  const uint64_t stream_pol = ptx::l2_evict_first_policy(), keep_pol = ptx::l2_evict_last_policy();
  SketchIds ids;
  ids.start(p, b, e, lane);
  const int n_pass = (e - b + PP - 1) / PP;
#pragma unroll
  for (int k = 0; k < kSketchStages - 1; ++k) {
    if (k < n_pass) issue_sketch_pass<KS, PP>(p, ids, b + k * PP, e, lane, codes_lane, steps_lane, ring + k * S::kBytes, stream_pol);
    else ptx::cp_async_commit();  // (empty groups keep the count)
  }
  int list_end = b;  // the smaller of the halves' list ends: below it no half changes list
  // The lists of the pass at page i (warp-uniform; a half entering a new list loads its shape).
  auto advance = [&](int i) {
    if (i + PP - 1 < list_end) return;
    bool changed = false;
#pragma unroll
    for (int pp = 0; pp < PP; ++pp) {
      const int ip = min(i + pp, e - 1);  // (a page past the range keeps the last list)
      if (ip >= lst[pp].end) {
        SketchList& l = lst[pp];
        do ++l.row; while (p.dense_indptr[l.row + 1] <= ip);
        l.end = p.dense_indptr[l.row + 1];
        const int req = l.row / p.n_heads_kv;
        l.h = l.row - req * p.n_heads_kv;
        l.q0 = p.q_indptr[req];
        const int q_len = p.q_indptr[req + 1] - l.q0;
        l.n_vec = q_len * group;
        l.qpos0 = p.seq_len[req] - q_len;  // query row r sees tokens <= qpos0 + r
        changed = true;
      }
    }
    if (changed) cur_nt = -1;
    list_end = lst[0].end;
#pragma unroll
    for (int pp = 1; pp < PP; ++pp) list_end = min(list_end, lst[pp].end);
  };
  // The first pass's lists and q while its pages are in flight (v12 loaded them after the wait).
  advance(b);
  rebuild(0);
  for (int k = 0; k < n_pass; ++k) {
    const int i = b + k * PP;
    // The stage of pass k - 1 is free once every lane has read it.
    __syncwarp();
    const int kn = k + kSketchStages - 1;
    if (kn < n_pass)
      issue_sketch_pass<KS, PP>(p, ids, b + kn * PP, e, lane, codes_lane, steps_lane,
                                ring + (kn % kSketchStages) * S::kBytes, stream_pol);
    else ptx::cp_async_commit();
    ptx::cp_async_wait<kSketchStages - 1>();  // pass k's group is complete
    __syncwarp();
    const uint32_t st = ring + (k % kSketchStages) * S::kBytes;
    uint32_t w[PP][2][KS];  // page pp, tokens g and g + 8: this lane's code words
#pragma unroll
    for (int pp = 0; pp < PP; ++pp)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint32_t src = st + S::kCodes + pp * S::kPageBytes + (g + 8 * half) * (KS * 16) + tig * KS * 4;
#pragma unroll
        for (int c = 0; c < KS; c += 4 > KS ? KS : 4) {
          if constexpr (KS == 1) {
            asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(w[pp][half][0]) : "r"(src) : "memory");
          } else if constexpr (KS == 2) {
            asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(w[pp][half][0]), "=r"(w[pp][half][1]) : "r"(src) : "memory");
          } else {
            asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(w[pp][half][c]), "=r"(w[pp][half][c + 1]), "=r"(w[pp][half][c + 2]), "=r"(w[pp][half][c + 3])
                         : "r"(src + 4 * c)
                         : "memory");
          }
        }
      }
    float step[2];
    int32_t pos;
    // (Shared-memory loads by address: "memory" keeps them after the __syncwarp that makes the
    // other lanes' copies visible.)
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(step[0]) : "r"(st + S::kSteps + pe * 64 + 4 * g) : "memory");
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(step[1]) : "r"(st + S::kSteps + pe * 64 + 4 * (g + 8)) : "memory");
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(pos) : "r"(st + S::kPos + 4 * pe) : "memory");

    advance(i);
    const int n_tiles = PP == 2 ? 1 : (lst[0].n_vec + 7) / 8;
    const int tok0 = pos * p.page_size;
    const bool live = pos >= 0;  // this lane's page exists
    for (int nt = 0; nt < n_tiles; ++nt) {
      if (nt != cur_nt) {
        if (PP == 1 && n_tiles > 1 && n_tiles <= S::kCacheTiles) {
          if (cached_row != lst[0].row) {  // (warp-uniform: every lane builds and keeps its own words)
            for (int t = 0; t < n_tiles; ++t) {
              rebuild(t);
              store_tile(t);
            }
            cached_row = lst[0].row;
          }
          load_tile(nt);
        } else {
          rebuild(nt);
        }
      }
      // Every row sees all of every live page of the pass (all but a request's last pages); after
      // the rebuild, which sets qfirst for a new list.
      const bool full = __all_sync(0xffffffffu, !live || tok0 + p.page_size - 1 <= qfirst);
      // Paired: page p's MMAs take every lane's B (column n: lane 4n's vector, of page n / 4's
      // list), into an accumulator of their own; columns 4p .. 4p + 3 of it are page p's scores.
      int acc_p[PP][4];
#pragma unroll
      for (int pp = 0; pp < PP; ++pp) {
#pragma unroll
        for (int r = 0; r < 4; ++r) acc_p[pp][r] = 0;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
          const uint32_t lo0 = w[pp][0][ks] & 0x0F0F0F0Fu, lo1 = w[pp][1][ks] & 0x0F0F0F0Fu;
          const uint32_t hi0 = (w[pp][0][ks] >> 4) & 0x0F0F0F0Fu, hi1 = (w[pp][1][ks] >> 4) & 0x0F0F0F0Fu;
          const uint32_t a[4] = {lo0, lo1, hi0, hi1};
          ptx::mma_s8_16832(acc_p[pp], a, bq[ks][0], bq[ks][1]);
        }
      }
      int acc[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[r] = PP == 2 && pe == 1 ? acc_p[PP - 1][r] : acc_p[0][r];
      // x[c][t]: column 2tig + c, token g + 8t of this lane's page; no branches but the two
      // warp-uniform ones (full pages, plain sums).
      auto epilogue = [&](auto full_tag) {
        constexpr bool kFull = decltype(full_tag)::value;
        float x[2][2], hi = -INFINITY, lo = INFINITY;
#pragma unroll
        for (int c = 0; c < 2; ++c)
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            const bool vis = live && (kFull ? qpos[c] >= 0 : tok0 + g + 8 * t <= qpos[c]);  // (qpos -1: no vector)
            x[c][t] = vis ? (static_cast<float>(acc[2 * t + c]) - qsum8[c]) * (qf[c] * step[t]) : -INFINITY;
            hi = fmaxf(hi, x[c][t]);
            lo = fminf(lo, vis ? x[c][t] : 0.0f);
          }
        const bool plain = __all_sync(0xffffffffu, hi <= 96.0f && lo >= -96.0f);
        float m[2] = {0.0f, 0.0f}, sum[2];
        if (plain) {
#pragma unroll
          for (int c = 0; c < 2; ++c) sum[c] = ptx::ex2_approx(x[c][0]) + ptx::ex2_approx(x[c][1]);
        } else {  // (rare)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            m[c] = fmaxf(x[c][0], x[c][1]);
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) m[c] = fmaxf(m[c], __shfl_xor_sync(0xffffffffu, m[c], o));
            if (m[c] == -INFINITY) m[c] = 0.0f;  // (every term is 0 then)
            sum[c] = ptx::ex2_approx(x[c][0] - m[c]) + ptx::ex2_approx(x[c][1] - m[c]);
          }
        }
        // The 8 lanes of a column group sum over g; one exchange first halves the work: lanes of
        // even g keep column 2tig and send 2tig + 1, odd ones the reverse.
        const bool odd = g & 1;
        float keep = odd ? sum[1] : sum[0];
        keep += __shfl_xor_sync(0xffffffffu, odd ? sum[0] : sum[1], 4);
        keep += __shfl_xor_sync(0xffffffffu, keep, 8);
        keep += __shfl_xor_sync(0xffffffffu, keep, 16);
        // Lanes g = 0, 1 (columns 2tig, 2tig + 1) write.
        const int qp = odd ? qpos[1] : qpos[0];
        if (g < 2 && live && qp >= 0) {
          const float mm = odd ? m[1] : m[0];
          int nv = p.page_size;
          float l2nv = log2_page;
          if constexpr (!kFull) {
            nv = min(max(qp + 1 - tok0, 0), p.page_size);
            if (nv != p.page_size) l2nv = ptx::lg2_approx(static_cast<float>(nv));
          }
          ptx::st_global_hint((odd ? srow[1] : srow[0]) + i + pe, nv > 0 && keep > 0.0f ? mm + ptx::lg2_approx(keep) - l2nv : -INFINITY,
                              keep_pol);
        }
      };
      if (full) epilogue(std::true_type{});
      else epilogue(std::false_type{});
    }
  }
  ptx::cp_async_wait<0>();
  if (lane == 0) ptx::stamp_span(p.span_ns, 1);
}

}  // namespace

// One resident wave: as many blocks as fit on the GPU at once (no tail wave), capped by the
// workspace's n_score_warps. The kernels split the pages over the warps of the actual grid.
// (The kernel is a template argument so that each kernel keeps its own occupancy.)
template <auto Kernel>
void launch_resident(const detail::PageSelectKernelArgs& p, cudaStream_t stream, int smem = 0) {
  static const int per_gpu = [smem] {
    int dev = 0, sms = 0, n = 0;
    DHS_CUDA_CHECK(cudaGetDevice(&dev));
    DHS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    if (smem > 48 * 1024) DHS_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    DHS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, Kernel, kScoreThreads, static_cast<size_t>(smem)));
    return std::max(1, n) * sms;
  }();
  detail::PageSelectKernelArgs q = p;
  const int blocks = std::min(per_gpu, std::max(1, p.n_score_warps * 32 / kScoreThreads));
  q.n_score_warps = blocks * (kScoreThreads / 32);
  launch_pdl(Kernel, dim3(blocks), dim3(kScoreThreads), static_cast<size_t>(smem), stream, q);
}

template <int KS>
void launch_sketch(const detail::PageSelectKernelArgs& p, cudaStream_t stream) {
  if (p.page_size != 16) check(cudaErrorInvalidValue, "page_select: the key sketch needs 16-token pages", __FILE__, __LINE__);
  constexpr int kWarps = kScoreThreads / 32;
  if ((p.q_vecs > 0 ? std::min(p.q_vecs, p.q_stride) : p.q_stride) <= 4)  // at most 4 q vectors per list: two pages per MMA
    launch_resident<score_sketch_kernel<KS, 2>>(p, stream, kWarps * SketchStage<KS, 2>::kWarpBytes);
  else
    launch_resident<score_sketch_kernel<KS, 1>>(p, stream,
                                                kWarps * (SketchStage<KS, 1>::kWarpBytes + SketchStage<KS, 1>::kCacheBytes));
}

void detail::launch_score_pages(const PageSelectKernelArgs& p, cudaStream_t stream) {
  const bool sketch = p.sketch_codes != nullptr;
  switch (p.head_dim) {
    case 32:  // a sketch of 32 entries a row: the projected sketch at rank 32 (head_dim = the rank, q projected)
      if (!sketch) check(cudaErrorInvalidValue, "page_select: head_dim 32 is for the key sketch only", __FILE__, __LINE__);
      launch_sketch<1>(p, stream);
      break;
    case 64: sketch ? launch_sketch<2>(p, stream) : launch_resident<score_summaries_kernel<64>>(p, stream); break;
    case 128: sketch ? launch_sketch<4>(p, stream) : launch_resident<score_summaries_kernel<128>>(p, stream); break;
    case 256: sketch ? launch_sketch<8>(p, stream) : launch_resident<score_summaries_kernel<256>>(p, stream); break;
    default: check(cudaErrorInvalidValue, "page_select: head_dim must be 64, 128 or 256 (32: projected sketch)", __FILE__, __LINE__);
  }
  DHS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dhs::cuda
