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
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/page_select.h"
#include "backend/cuda/ptx.cuh"

namespace dhs::cuda {

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kScoreThreads = 128;

// The list holding flat page `i`: the largest row with indptr[row] <= i (never an empty one).
__device__ __forceinline__ int find_list(const int32_t* indptr, int n_lists, int64_t i) {
  int lo = 0, hi = n_lists;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (indptr[mid] <= i) lo = mid; else hi = mid;
  }
  return lo;
}

__device__ __forceinline__ __nv_bfloat162 u32_as_bf162(uint32_t u) { return *reinterpret_cast<__nv_bfloat162*>(&u); }
__device__ __forceinline__ uint32_t bf162_as_u32(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }

// ---- summaries (MinMax, MeanSpread / Gaussian) ---------------------------------------
// Columns of an n-tile: MinMax one per q vector (tile nt: vectors 8nt .. 8nt+7); mean/variance
// two per vector (vectors 4nt .. 4nt+3: column 2v' = [q | 0], 2v'+1 = [0 | bf16(q^2)]).
// bf16(q^2) rounds q^2 (16 significant bits) to 8: the variance term is within 2^-9 of the
// fp32 one; products and sums are fp32 (the MinMax B vector is exact: q is bf16).
template <int D>
__global__ void __launch_bounds__(kScoreThreads) score_summaries_kernel(const __grid_constant__ PageSelectParams p) {
  constexpr int JJ = 2 * D / 32;  // 16-byte chunks per row per lane
  const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const int warp = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
  const int n_lists = p.n_requests * p.n_heads_kv;
  const int64_t total = p.dense_indptr[n_lists];
  const int64_t n_tiles_all = (total + 15) / 16;
  const int64_t tb = warp * n_tiles_all / p.n_score_warps, te = (warp + 1) * n_tiles_all / p.n_score_warps;
  if (tb >= te) return;
  const bool minmax = p.kind == SummaryKind::MinMax;
  const int group = p.n_heads_q / p.n_heads_kv;
  const float mul = p.scale * kLog2e;
  int row = find_list(p.dense_indptr, n_lists, tb * 16);
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
          const __nv_bfloat16* qv =
              p.q + (static_cast<int64_t>(q0 + j / group) * p.n_heads_q + h * group + j % group) * D;
#pragma unroll
          for (int jj = 0; jj < JJ; ++jj) {
            const int e = 8 * (tig + 4 * jj);  // element of the 2D-long B vector
            const bool second = e >= D;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (j < n_vec && (minmax || part == (second ? 1 : 0))) {
              const uint4 raw = *reinterpret_cast<const uint4*>(qv + (second ? e - D : e));
              uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
              const __nv_bfloat162 zero = __float2bfloat162_rn(0.0f);
#pragma unroll
              for (int c = 0; c < 4; ++c) {
                const __nv_bfloat162 x = u32_as_bf162(w[c]);
                w[c] = bf162_as_u32(minmax ? (second ? __hmax2(x, zero) : __hmin2(x, zero)) : second ? __hmul2(x, x) : x);
              }
              v = make_uint4(w[0], w[1], w[2], w[3]);
            }
            bq[jj] = v;
          }
          cur_row = r;
          cur_nt = nt;
        }
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const __nv_bfloat16* ra = p.summaries + static_cast<int64_t>(slot_a < 0 ? 0 : slot_a) * 2 * D;
        const __nv_bfloat16* rb = p.summaries + static_cast<int64_t>(slot_b < 0 ? 0 : slot_b) * 2 * D;
#pragma unroll
        for (int jj = 0; jj < JJ; ++jj) {
          const int e = 8 * (tig + 4 * jj);
          const uint4 a = slot_a >= 0 ? *reinterpret_cast<const uint4*>(ra + e) : make_uint4(0u, 0u, 0u, 0u);
          const uint4 b = slot_b >= 0 ? *reinterpret_cast<const uint4*>(rb + e) : make_uint4(0u, 0u, 0u, 0u);
          const uint32_t a0[4] = {a.x, b.x, a.y, b.y}, a1[4] = {a.z, b.z, a.w, b.w};
          ptx::mma_bf16_16816(acc, a0, bq[jj].x, bq[jj].y);
          ptx::mma_bf16_16816(acc, a1, bq[jj].z, bq[jj].w);
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
// A warp per page, q as the A operand: A = 16 q vectors (rows; quantized to int8 per vector:
// step absmax / 127, code round(q / step)), B = the page's 4-bit codes (as code + 8), tokens
// 0-7 and 8-15 as two n-tiles. Lane (g, tig) then holds, for q vectors g and g + 8, the scores
// of tokens 2tig, 2tig+1, 8+2tig, 9+2tig, and a page's 16-token log-sum-exp per q vector is a
// 4-value local sum plus two shuffles:
//   score = log2( (1/n_vis) sum_vis 2^x_t ),  x_t = (acc_t - 8 sum(q8)) qstep step_t scale log2 e
// so the select kernel's n_vis * 2^score is the page's summed exp-score. When every x of the
// page lies in [-96, 96] (or is masked) the sum needs no max: 2^x neither overflows nor loses a
// visible token's share (each term >= 2^-96 next to a sum <= 2^100, fp32); otherwise the page
// takes the usual max-subtracted form (one vote per page decides, for the whole warp).
// (v7, with the codes as A and q as B, spent 12 shuffles per page on 8-lane reductions.)
template <int KS>
struct SketchPage {
  uint32_t w[2][KS];  // tokens g and g + 8: this lane's words
  float2 step[2];     // steps of tokens 2tig, 2tig+1 and 8+2tig, 9+2tig
  int32_t pos = 0;    // the page's position in its request
  // The slot and position of the page this ring slot takes next (3 pages on), loaded 3 pages
  // before its codes: the code loads then do not wait on the slot load (ncu at e6fafaa: the
  // first use of a page's data was a quarter of the kernel's stall samples).
  int32_t next_slot = 0, next_pos = 0;
};

template <int KS>
__device__ __forceinline__ void load_sketch_ids(const PageSelectParams& p, int i, SketchPage<KS>& s) {
  s.next_slot = p.dense_slots[i];
  s.next_pos = p.dense_page_pos[i];
}

// The codes and steps of the page whose ids load_sketch_ids fetched.
template <int KS>
__device__ __forceinline__ void load_sketch_page(const PageSelectParams& p, int g, int tig, SketchPage<KS>& s) {
  const int32_t slot = s.next_slot;
  s.pos = s.next_pos;
  const int row_bytes = KS * 16;  // head_dim / 2
  const uint8_t* codes = p.sketch_codes + static_cast<int64_t>(slot) * (p.page_size * row_bytes);  // this page's
  const float* steps = p.sketch_steps + static_cast<int64_t>(slot) * p.page_size;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const uint8_t* src = codes + (g + 8 * half) * row_bytes + tig * KS * 4;
    if constexpr (KS == 2) {
      const uint2 v = *reinterpret_cast<const uint2*>(src);
      s.w[half][0] = v.x;
      s.w[half][1] = v.y;
    } else {
#pragma unroll
      for (int c = 0; c < KS / 4; ++c) {
        const uint4 v = reinterpret_cast<const uint4*>(src)[c];
        s.w[half][4 * c] = v.x;
        s.w[half][4 * c + 1] = v.y;
        s.w[half][4 * c + 2] = v.z;
        s.w[half][4 * c + 3] = v.w;
      }
    }
    s.step[half] = *reinterpret_cast<const float2*>(steps + 8 * half + 2 * tig);
  }
}

// Lane (g, tig)'s share of q vector j quantized to int8: the words of its k-step ks (bytes c:
// dims 32 ks + 4 tig + c and, in w[ks][1], 32 ks + 16 + 4 tig + c: the codes' layout), and the
// vector's step and code sum (equal in the 4 lanes of a group). Zero for j >= n_vec.
template <int KS>
__device__ __forceinline__ void quantize_q(const __nv_bfloat16* qv, bool valid, int tig, uint32_t (&w)[KS][2], float& st,
                                           int& sum) {
  auto lane_q = [&](int ks, int hh, float (&x)[4]) {
    const uint2 raw = *reinterpret_cast<const uint2*>(qv + ks * 32 + 16 * hh + 4 * tig);
    const __nv_bfloat162 lo = u32_as_bf162(raw.x), hi = u32_as_bf162(raw.y);
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

template <int KS>
__global__ void __launch_bounds__(kScoreThreads) score_sketch_kernel(const __grid_constant__ PageSelectParams p) {
  constexpr int D = KS * 32;
  const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const int warp = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
  const int n_lists = p.n_requests * p.n_heads_kv;
  const int64_t total = p.dense_indptr[n_lists];  // < 2^31 (PageSelectWorkspace)
  const int b = static_cast<int>(warp * total / p.n_score_warps), e = static_cast<int>((warp + 1) * total / p.n_score_warps);
  if (b >= e) return;
  const int group = p.n_heads_q / p.n_heads_kv;
  const float mul = p.scale * kLog2e;
  const float log2_page = log2f(static_cast<float>(p.page_size));
  int row = find_list(p.dense_indptr, n_lists, b) - 1;
  int list_end = b;  // the current list's pages end here (the first page starts a list)
  int q_len = 0, n_vec = 0, qpos0 = 0, h = 0, q0 = 0, cur_nt = -1;
  uint32_t qa[KS][4];  // A registers of q vectors 16 nt + g (a0, a2) and 16 nt + 8 + g (a1, a3)
  float qf[2];         // per row: qstep * scale * log2 e
  float qsum8[2];      // per row: 8 * sum(q8) (the codes' +8 offset)
  int qpos[2];         // per row: the query row's position (-1: no such q vector)
  float* srow[2];      // per row: its scores (q vector j's row of the score matrix)

  // Scores page i (its loads in s), then reuses s for page i + 3: three pages in flight per warp
  // (~3 KiB) without copying registers between ring slots.
  auto step = [&](SketchPage<KS>& s, int i) {
    if (i >= list_end) {  // a new list: its request's shape, held in registers
      do ++row; while (p.dense_indptr[row + 1] <= i);
      list_end = p.dense_indptr[row + 1];
      const int req = row / p.n_heads_kv;
      h = row - req * p.n_heads_kv;
      q0 = p.q_indptr[req];
      q_len = p.q_indptr[req + 1] - q0;
      n_vec = q_len * group;
      qpos0 = p.seq_len[req] - q_len;  // query row r sees tokens <= qpos0 + r
      cur_nt = -1;
    }
    const int tok0 = s.pos * p.page_size;
    const bool all_visible = tok0 + p.page_size - 1 <= qpos0;
    const int n_rows = n_vec > 8 ? 2 : 1;  // warp-uniform: rows 8-15 only when there are > 8 q vectors
    for (int nt = 0; nt < (n_vec + 15) / 16; ++nt) {
      if (nt != cur_nt) {  // (once per list when n_vec <= 16)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int j = nt * 16 + 8 * r + g;
          const int jc = min(j, n_vec - 1);
          const __nv_bfloat16* qv = p.q + (static_cast<int64_t>(q0 + jc / group) * p.n_heads_q + h * group + jc % group) * D;
          uint32_t w[KS][2];
          float st;
          int sum;
          quantize_q<KS>(qv, j < n_vec, tig, w, st, sum);
#pragma unroll
          for (int ks = 0; ks < KS; ++ks) {
            qa[ks][r] = w[ks][0];
            qa[ks][2 + r] = w[ks][1];
          }
          qf[r] = st * mul;
          qsum8[r] = static_cast<float>(8 * sum);
          qpos[r] = j < n_vec ? qpos0 + j / group : -1;
          srow[r] = p.scores + static_cast<int64_t>(jc) * p.score_stride;
        }
        cur_nt = nt;
      }
      int acc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};  // [n-tile: tokens 0-7, 8-15][c0..c3]
#pragma unroll
      for (int nb = 0; nb < 2; ++nb)
#pragma unroll
        for (int ks = 0; ks < KS; ++ks)
          ptx::mma_s8_16832(acc[nb], qa[ks], s.w[nb][ks] & 0x0F0F0F0Fu, (s.w[nb][ks] >> 4) & 0x0F0F0F0Fu);
      // x[r][t]: q row 16 nt + 8 r + g, token t of {2tig, 2tig+1, 8+2tig, 9+2tig}.
      float x[2][4], lm[2] = {-INFINITY, -INFINITY};
      bool in_range = true;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (r >= n_rows) break;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const int nb = t >> 1, c = t & 1;
          const float stp = c ? s.step[nb].y : s.step[nb].x;
          const bool vis = all_visible ? qpos[r] >= 0 : tok0 + 8 * nb + 2 * tig + c <= qpos[r];
          x[r][t] = vis ? (static_cast<float>(acc[nb][2 * r + c]) - qsum8[r]) * (qf[r] * stp) : -INFINITY;
          lm[r] = fmaxf(lm[r], x[r][t]);
        }
        in_range = in_range && lm[r] <= 96.0f && (lm[r] >= -96.0f || lm[r] == -INFINITY);
      }
      const bool plain = __all_sync(0xffffffffu, in_range);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (r >= n_rows) break;
        float m = 0.0f, sum = 0.0f;
        if (plain) {
#pragma unroll
          for (int t = 0; t < 4; ++t) sum += ptx::ex2_approx(x[r][t]);
        } else {
          m = lm[r];
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
          if (m != -INFINITY)
#pragma unroll
            for (int t = 0; t < 4; ++t) sum += ptx::ex2_approx(x[r][t] - m);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (tig == 0 && qpos[r] >= 0) {
          const int nv = all_visible ? p.page_size : min(max(qpos[r] + 1 - tok0, 0), p.page_size);
          const float l2nv = nv == p.page_size ? log2_page : ptx::lg2_approx(static_cast<float>(nv));
          srow[r][i] = nv > 0 && sum > 0.0f ? m + ptx::lg2_approx(sum) - l2nv : -INFINITY;
        }
      }
    }
    if (i + 3 < e) load_sketch_page<KS>(p, g, tig, s);  // page i + 3 (ids loaded at page i - 3)
    if (i + 6 < e) load_sketch_ids<KS>(p, i + 6, s);
  };
  SketchPage<KS> s0, s1, s2;
  load_sketch_ids<KS>(p, b, s0);
  load_sketch_page<KS>(p, g, tig, s0);
  if (b + 1 < e) {
    load_sketch_ids<KS>(p, b + 1, s1);
    load_sketch_page<KS>(p, g, tig, s1);
  }
  if (b + 2 < e) {
    load_sketch_ids<KS>(p, b + 2, s2);
    load_sketch_page<KS>(p, g, tig, s2);
  }
  if (b + 3 < e) load_sketch_ids<KS>(p, b + 3, s0);
  if (b + 4 < e) load_sketch_ids<KS>(p, b + 4, s1);
  if (b + 5 < e) load_sketch_ids<KS>(p, b + 5, s2);
  int i = b;
  for (; i + 3 <= e; i += 3) {
    step(s0, i);
    step(s1, i + 1);
    step(s2, i + 2);
  }
  if (i < e) step(s0, i);
  if (i + 1 < e) step(s1, i + 1);
}

}  // namespace

// One resident wave: as many blocks as fit on the GPU at once (no tail wave), capped by the
// workspace's n_score_warps. The kernels split the pages over the warps of the actual grid.
// (The kernel is a template argument so that each kernel keeps its own occupancy.)
template <auto Kernel>
void launch_resident(const PageSelectParams& p, cudaStream_t stream) {
  static const int per_gpu = [] {
    int dev = 0, sms = 0, n = 0;
    DHS_CUDA_CHECK(cudaGetDevice(&dev));
    DHS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    DHS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, Kernel, kScoreThreads, 0));
    return std::max(1, n) * sms;
  }();
  PageSelectParams q = p;
  const int blocks = std::min(per_gpu, std::max(1, p.n_score_warps * 32 / kScoreThreads));
  q.n_score_warps = blocks * (kScoreThreads / 32);
  Kernel<<<blocks, kScoreThreads, 0, stream>>>(q);
}

void launch_score_pages(const PageSelectParams& p, cudaStream_t stream) {
  const bool sketch = p.sketch_codes != nullptr;
  switch (p.head_dim) {
    case 64: sketch ? launch_resident<score_sketch_kernel<2>>(p, stream) : launch_resident<score_summaries_kernel<64>>(p, stream); break;
    case 128: sketch ? launch_resident<score_sketch_kernel<4>>(p, stream) : launch_resident<score_summaries_kernel<128>>(p, stream); break;
    case 256: sketch ? launch_resident<score_sketch_kernel<8>>(p, stream) : launch_resident<score_summaries_kernel<256>>(p, stream); break;
    default: check(cudaErrorInvalidValue, "page_select: head_dim must be 64, 128 or 256", __FILE__, __LINE__);
  }
  DHS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dhs::cuda
