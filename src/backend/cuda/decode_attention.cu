// Self-planning split-KV decode attention; see decode_attention.h for the contract
// and docs/kernels/decode_attention_NOTES.md for the design and measured versions.
//
// Work split (all on the device, from kv_indptr = prefix sums of list lengths):
//   total = kv_indptr[n_requests * n_heads_kv] pages, nw = min(n_workers, ceil(total / min_pages))
//   worker w (one warp) owns flat pages [w*total/nw, (w+1)*total/nw) of the CSR, which may
//   span several lists (segments). A segment that covers a whole list writes the final
//   output; any other writes a partial (o, m, d) at workspace row (w + list_row), which is
//   unique because w + row strictly increases along the flattened page order.
//   The merge kernel recomputes the owners of each list's first and last page and merges
//   their partials with dhs::merge().
// Per page (16 tokens) a warp runs S = Q K^T and O += P V on the tensor cores
// (mma.m16n8k16 f16, fp32 accumulation) for up to 32 query vectors (GQA group x q rows),
// K/V staged through a per-warp cp.async ring of STAGES pages.
#include "backend/cuda/decode_attention.h"

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl_launch.h"
#include "backend/cuda/ptx.cuh"

namespace dhs::cuda {

namespace {

constexpr int kWarps = kDecodeWarpsPerBlock;
constexpr int kPage = kDecodePageSize;
constexpr int kMergeUnroll = 8;  // partials whose loads a merge warp issues together
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// dhs::Error with a clear message, without pulling fmt into a .cu file (nvcc 13 rejects it).
void require(bool cond, const std::string& what) {
  if (!cond) check(cudaErrorInvalidValue, what.c_str(), __FILE__, __LINE__);
}

[[noreturn]] void unsupported(const char* what, int value, const char* supported) {
  check(cudaErrorInvalidValue,
        (std::string("decode_attention: ") + what + " = " + std::to_string(value) + " is not supported (" +
         supported + ")")
            .c_str(),
        __FILE__, __LINE__);
  throw;  // unreachable: check() throws on any error code
}

// Runtime -> compile-time dispatch, in one place; anything else fails loudly.
#define DHS_DISPATCH_HEAD_DIM(value, NAME, ...)            \
  [&] {                                                    \
    switch (value) {                                       \
      case 64: {                                           \
        constexpr int NAME = 64;                           \
        return __VA_ARGS__();                              \
      }                                                    \
      case 128: {                                          \
        constexpr int NAME = 128;                          \
        return __VA_ARGS__();                              \
      }                                                    \
      default: unsupported("head_dim", value, "64, 128"); \
    }                                                      \
  }()

// Query vectors per (request, KV head) -> 16-row MMA tiles.
#define DHS_DISPATCH_M_TILES(q_vecs, NAME, ...)                              \
  [&] {                                                                      \
    if ((q_vecs) >= 1 && (q_vecs) <= 16) {                                   \
      constexpr int NAME = 1;                                                \
      return __VA_ARGS__();                                                  \
    } else if ((q_vecs) > 16 && (q_vecs) <= kDecodeMaxQVecs) {               \
      constexpr int NAME = 2;                                                \
      return __VA_ARGS__();                                                  \
    }                                                                        \
    unsupported("n_heads_q / n_heads_kv * max_q_len", q_vecs, "1..32");      \
  }()

#define DHS_DISPATCH_STAGES(value, NAME, ...)               \
  [&] {                                                     \
    switch (value) {                                        \
      case 2: {                                             \
        constexpr int NAME = 2;                             \
        return __VA_ARGS__();                               \
      }                                                     \
      case 3: {                                             \
        constexpr int NAME = 3;                             \
        return __VA_ARGS__();                               \
      }                                                     \
      case 4: {                                             \
        constexpr int NAME = 4;                             \
        return __VA_ARGS__();                               \
      }                                                     \
      default: unsupported("stages", value, "2, 3, 4");    \
    }                                                       \
  }()

template <int HEAD_DIM, int M_TILES, int STAGES>
struct SplitKvShape {
  static_assert(HEAD_DIM % 16 == 0 && HEAD_DIM <= 256, "head_dim must be a multiple of 16");
  static constexpr int kChunks = HEAD_DIM / 8;            // 16-byte chunks per token row
  static constexpr int kRowBytes = HEAD_DIM * 2;          // f16
  static constexpr int kTileBytes = kPage * kRowBytes;    // one K (or V) head-page
  static constexpr int kQBytes = M_TILES * 16 * kRowBytes;
  static constexpr int kWarpSmem = STAGES * 2 * kTileBytes + kQBytes;
  static constexpr int kBlockSmem = kWarps * kWarpSmem;
};

// ---- PTX wrappers ----------------------------------------------------------------

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

using ptx::cp_async_16;  // backend/cuda/ptx.cuh
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::mma_f16_16816;
using ptx::smem_u32;
using ptx::pack_f16x2;

// Byte offset of 16-byte chunk `chunk` of row `row` in a [rows][HEAD_DIM] f16 tile. The chunk
// index is XOR-swizzled with row % 8 so that the 8 row addresses of one ldmatrix 8x8 matrix
// (and the cp.async stores) hit 8 different 16-byte bank groups.
template <int HEAD_DIM>
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return static_cast<uint32_t>(row * (HEAD_DIM * 2) + ((chunk ^ (row & 7)) << 4));
}

// ---- the device-side plan (shared by both kernels) -------------------------------

__device__ __forceinline__ int active_workers(int64_t total, int n_workers, int min_pages) {
  const int64_t want = (total + min_pages - 1) / min_pages;
  return static_cast<int>(want < n_workers ? want : n_workers);
}
// Worker w owns flat pages [w*total/nw, (w+1)*total/nw); this inverts that (total > 0).
__device__ __forceinline__ int worker_of(int64_t pg, int64_t total, int nw) {
  return static_cast<int>(((pg + 1) * nw - 1) / total);
}
// The list row holding flat page pg: first i with indptr[i + 1] > pg (pg < indptr[n_rows]).
// Warp-cooperative: each round tests 32 evenly spaced rows in parallel and keeps the
// segment where the predicate flips, so 2 dependent loads for up to 1024 rows (a binary
// search would chain log2(n_rows) of them on the critical path of every worker).
__device__ __forceinline__ int row_of_warp(const int32_t* __restrict__ indptr, int n_rows, int64_t pg, int lane) {
  int lo = 0, hi = n_rows;  // answer in [lo, hi); indptr[hi] > pg
  while (hi - lo > 1) {
    const int step = (hi - lo + 31) >> 5;
    const int i = min(lo + lane * step + step - 1, hi - 1);  // last row of this lane's segment
    const unsigned flips = __ballot_sync(0xffffffffu, __ldg(indptr + i + 1) > pg);
    const int seg = __ffs(flips) - 1;  // lane 31 tests hi - 1, so flips != 0
    lo += seg * step;
    hi = min(lo + step, hi);
  }
  return lo;
}

// ---- split-KV kernel ---------------------------------------------------------------

template <int HEAD_DIM, int M_TILES, int STAGES>
__global__ void __launch_bounds__(kWarps * 32)
    decode_attention_kernel(const __grid_constant__ DecodeAttentionParams p) {
  using Shape = SplitKvShape<HEAD_DIM, M_TILES, STAGES>;
  constexpr int kChunks = Shape::kChunks;
  constexpr int kDTiles = HEAD_DIM / 8;  // n-tiles of O
  extern __shared__ __align__(128) uint8_t smem[];

  // Launched as a programmatic dependent of the step's previous kernel (pdl_launch.h): q and the
  // lists are its (or earlier kernels') output. Then the merge kernel may get scheduled as soon as
  // SM room frees up; it waits on griddepcontrol.wait for this grid's completion before reading
  // anything we write.
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;  // MMA fragment coordinates
  const int n_kv_rows = p.n_requests * p.n_heads_kv;
  const int64_t total = __ldg(p.kv_indptr + n_kv_rows);
  if (total <= 0) return;
  const int nw = active_workers(total, p.n_workers, p.min_pages_per_worker);
  const int worker = blockIdx.x * kWarps + warp;
  if (worker >= nw) return;
  const int64_t begin = worker * total / nw;
  const int64_t end = (worker + 1) * total / nw;
  const int group = p.n_heads_q / p.n_heads_kv;
  const float scale_log2 = p.scale * kLog2e;

  uint8_t* s_warp = smem + warp * Shape::kWarpSmem;
  const uint32_t s_stage = smem_u32(s_warp);                          // [STAGES][K | V][kPage][HEAD_DIM]
  uint8_t* s_q = s_warp + STAGES * 2 * Shape::kTileBytes;             // [M_TILES * 16][HEAD_DIM]
  const uint32_t s_q_u = smem_u32(s_q);

  // ldmatrix lane roles: matrix mi = lane / 8, row rr = lane % 8 of it.
  const int mi = lane >> 3, rr = lane & 7;

  // ---- loader ----
  // Page metadata comes in windows of 32 pages, one per lane (slot, valid rows), loaded
  // in parallel; issue() takes its page's values by shuffle. Without this every page
  // would chain indptr -> seq_len -> slot loads in front of its copy.
  int row = row_of_warp(p.kv_indptr, n_kv_rows, begin, lane);
  int64_t win0 = begin;
  int win_row = row;  // a row <= the row of page win0 (cursor start for the lanes)
  int w_slot = 0, w_valid = 0;
  auto load_window = [&](int64_t w0) {  // warp-uniform
    win0 = w0;
    const int64_t pg = w0 + lane;
    int r = win_row;
    w_slot = 0;
    w_valid = 0;
    if (pg < end) {
      w_slot = __ldg(p.kv_slots + pg);
      const int pos = __ldg(p.kv_page_pos + pg);
      while (__ldg(p.kv_indptr + r + 1) <= pg) ++r;  // indptr is tiny and L1-resident
      w_valid = min(max(__ldg(p.seq_len + r / p.n_heads_kv) - pos * kPage, 0), kPage);
    }
    win_row = __shfl_sync(0xffffffffu, r, 31);
  };
  load_window(begin);

  const uint64_t stream_pol = ptx::l2_evict_first_policy();
  // Page pg of the flat range into ring stage st (an empty group past the end).
  auto issue = [&](int64_t pg, int st) {
    if (pg < end) {
      if (pg >= win0 + 32) load_window(win0 + 32);
      const int j = static_cast<int>(pg - win0);
      const int slot = __shfl_sync(0xffffffffu, w_slot, j);
      const int n_valid = __shfl_sync(0xffffffffu, w_valid, j);
      // NOTE: size_t: slot * page elements exceeds 2^31 in a 128k x 32 pool.
      const size_t base = static_cast<size_t>(slot) * (kPage * HEAD_DIM);
      const __half* k_src = p.k_pool + base;
      const __half* v_src = p.v_pool + base;
      const uint32_t k_dst = s_stage + st * 2 * Shape::kTileBytes;
      const uint32_t v_dst = k_dst + Shape::kTileBytes;
#pragma unroll
      for (int i = 0; i < kPage * kChunks / 32; ++i) {
        const int id = lane + 32 * i;
        const int tok = id / kChunks, c = id % kChunks;
        // Token rows past seq_len are zero-filled, never read: their pool bytes may be
        // anything (NaN included), and 0 * NaN would poison P V.
        const int bytes = tok < n_valid ? 16 : 0;
        const uint32_t off = swz<HEAD_DIM>(tok, c);
        if (p.l2_evict_first) {  // (warp-uniform)
          ptx::cp_async_16_hint(k_dst + off, k_src + tok * HEAD_DIM + c * 8, bytes, stream_pol);
          ptx::cp_async_16_hint(v_dst + off, v_src + tok * HEAD_DIM + c * 8, bytes, stream_pol);
        } else {
          cp_async_16(k_dst + off, k_src + tok * HEAD_DIM + c * 8, bytes);
          cp_async_16(v_dst + off, v_src + tok * HEAD_DIM + c * 8, bytes);
        }
      }
    }
    cp_async_commit();
  };

  // ---- per-list state ----
  int req = 0, kvh = 0, q0 = 0, nq = 0;
  int64_t row_lo = 0, row_hi = 0;
  int qlim[M_TILES][2];  // last key position each fragment row may see (-1: padding row)
  int qbit[M_TILES][2];  // its query row's bit in the entries' row masks (kv_row_mask)
  float o[M_TILES][kDTiles][4];
  float m[M_TILES][2], l[M_TILES][2];  // running max (log2 units) and per-lane partial denominators

  auto setup_row = [&]() {
    req = row / p.n_heads_kv;
    kvh = row - req * p.n_heads_kv;
    q0 = __ldg(p.q_indptr + req);
    const int q_len = __ldg(p.q_indptr + req + 1) - q0;
    if (q_len < 1 || q_len > p.max_q_len) __trap();  // precondition of the workspace / M_TILES choice
    nq = group * q_len;
    const int qpos0 = __ldg(p.seq_len + req) - q_len;
    row_lo = __ldg(p.kv_indptr + row);
    row_hi = __ldg(p.kv_indptr + row + 1);
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = mt * 16 + h * 8 + g;  // query vector r = j * group + head-in-group
        qlim[mt][h] = r < nq ? qpos0 + r / group : -1;
        qbit[mt][h] = r < nq ? r / group : 0;  // (< 32: group * q_len <= kDecodeMaxQVecs)
      }
    // Q tile of this (request, KV head); padding rows are zero.
    __syncwarp();  // every lane is done reading the previous tile
#pragma unroll
    for (int i = 0; i < M_TILES * 16 * kChunks / 32; ++i) {
      const int id = lane + 32 * i;
      const int r = id / kChunks, c = id % kChunks;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (r < nq) {
        const size_t qrow = static_cast<size_t>(q0 + r / group) * p.n_heads_q + kvh * group + r % group;
        val = __ldg(reinterpret_cast<const uint4*>(p.q + qrow * HEAD_DIM) + c);
      }
      *reinterpret_cast<uint4*>(s_q + swz<HEAD_DIM>(r, c)) = val;
    }
    // The __syncwarp after the next cp.async wait publishes the tile before any ldmatrix.
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) {
#pragma unroll
      for (int dn = 0; dn < kDTiles; ++dn)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][dn][e] = 0.0f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m[mt][h] = -INFINITY;
        l[mt][h] = 0.0f;
      }
    }
  };

  auto flush = [&]() {
    const bool whole = row_lo >= begin && row_hi <= end;
    const int part = worker + row;
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float d = l[mt][h];
        d += __shfl_xor_sync(0xffffffffu, d, 1);
        d += __shfl_xor_sync(0xffffffffu, d, 2);
        const int r = mt * 16 + h * 8 + g;
        if (r >= nq) continue;
        const float m_nat = d > 0.0f ? m[mt][h] * kLn2 : -INFINITY;
        if (whole) {
          const float inv = d > 0.0f ? 1.0f / d : 0.0f;
          const size_t orow = static_cast<size_t>(q0 + r / group) * p.n_heads_q + kvh * group + r % group;
          __half* dst = p.out + orow * HEAD_DIM + 2 * t;
#pragma unroll
          for (int dn = 0; dn < kDTiles; ++dn)
            *reinterpret_cast<__half2*>(dst + dn * 8) =
                __floats2half2_rn(o[mt][dn][2 * h] * inv, o[mt][dn][2 * h + 1] * inv);
          if (t == 0 && p.lse != nullptr) p.lse[orow] = d > 0.0f ? m_nat + logf(d) : -INFINITY;
        } else {
          const size_t prow = static_cast<size_t>(part) * p.ws_q_vecs + r;
          float* dst = p.ws_o + prow * HEAD_DIM + 2 * t;
#pragma unroll
          for (int dn = 0; dn < kDTiles; ++dn)
            *reinterpret_cast<float2*>(dst + dn * 8) = make_float2(o[mt][dn][2 * h], o[mt][dn][2 * h + 1]);
          if (t == 0) p.ws_state[prow] = MergeState{m_nat, d};
        }
      }
  };

  // One staged page: S = Q K^T, online softmax (causal + padding mask, and the rows the page's
  // row mask leaves out), O += P V.
  auto compute = [&](int st, int tok_base, uint32_t row_mask) {
    const uint32_t k_s = s_stage + st * 2 * Shape::kTileBytes;
    const uint32_t v_s = k_s + Shape::kTileBytes;
    float s[M_TILES][2][4];
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;

#pragma unroll
    for (int ks = 0; ks < HEAD_DIM / 16; ++ks) {
      // K rows are the B operand (col-major n x k): matrices (tok 0-7 | 8-15) x (d chunk 2ks | 2ks+1).
      uint32_t kb[4];
      {
        const int tok = (mi >> 1) * 8 + rr;
        ldmatrix_x4(kb, k_s + swz<HEAD_DIM>(tok, 2 * ks + (mi & 1)));
      }
#pragma unroll
      for (int mt = 0; mt < M_TILES; ++mt) {
        if (mt * 16 >= nq) continue;  // warp-uniform
        uint32_t a[4];
        ldmatrix_x4(a, s_q_u + swz<HEAD_DIM>(mt * 16 + (mi & 1) * 8 + rr, 2 * ks + (mi >> 1)));
        mma_f16_16816(s[mt][0], a, kb[0], kb[1]);
        mma_f16_16816(s[mt][1], a, kb[2], kb[3]);
      }
    }

    uint32_t pa[M_TILES][4];
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) {
      if (mt * 16 >= nq) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // This lane's scores of fragment row (mt, h): tokens 2t, 2t+1, 8+2t, 9+2t.
        float v[4] = {s[mt][0][2 * h], s[mt][0][2 * h + 1], s[mt][1][2 * h], s[mt][1][2 * h + 1]};
        const int lim = (row_mask >> qbit[mt][h]) & 1u ? qlim[mt][h] - tok_base : -1;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tok = 2 * t + (e & 1) + (e >> 1) * 8;
          v[e] = tok <= lim ? v[e] * scale_log2 : -INFINITY;
        }
        float mx = fmaxf(fmaxf(v[0], v[1]), fmaxf(v[2], v[3]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[mt][h], mx);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row that has seen nothing yet
        const float alpha = exp2f(m[mt][h] - m_use);
        m[mt][h] = m_new;
        // P is rounded to f16 for the MMA; the denominator sums the same rounded values, so
        // the output stays an exact convex combination of the V rows.
        __half pb[4];
        float sum = 0.0f;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          pb[e] = __float2half_rn(exp2f(v[e] - m_use));
          sum += __half2float(pb[e]);
        }
        l[mt][h] = l[mt][h] * alpha + sum;
#pragma unroll
        for (int dn = 0; dn < kDTiles; ++dn) {
          o[mt][dn][2 * h] *= alpha;
          o[mt][dn][2 * h + 1] *= alpha;
        }
        pa[mt][h] = pack_f16x2(pb[0], pb[1]);      // A rows g / g+8, k = 2t, 2t+1
        pa[mt][2 + h] = pack_f16x2(pb[2], pb[3]);  // k = 8+2t, 9+2t
      }
    }

#pragma unroll
    for (int dp = 0; dp < HEAD_DIM / 16; ++dp) {
      // V rows are the B operand (row-major k x n): transposed matrices (tok 0-7 | 8-15) x (chunk 2dp | 2dp+1).
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, v_s + swz<HEAD_DIM>((mi & 1) * 8 + rr, 2 * dp + (mi >> 1)));
#pragma unroll
      for (int mt = 0; mt < M_TILES; ++mt) {
        if (mt * 16 >= nq) continue;
        mma_f16_16816(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
        mma_f16_16816(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
      }
    }
  };

  // ---- main loop over this worker's flat page range ----
  // First copies go out before the Q tile's loads: their latencies overlap.
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) issue(begin + s, s);
  setup_row();
  for (int64_t pg = begin; pg < end; ++pg) {
    if (pg >= row_hi) {  // next list: finish this one, skip empty lists
      flush();
      do {
        ++row;
      } while (__ldg(p.kv_indptr + row + 1) <= pg);
      setup_row();
    }
    cp_async_wait<STAGES - 2>();  // this lane's copies of page pg have landed
    __syncwarp();                 // ... and every lane's; the stage of page pg-1 is free
    const int k = static_cast<int>(pg - begin);
    issue(pg + STAGES - 1, (k + STAGES - 1) % STAGES);
    compute(k % STAGES, __ldg(p.kv_page_pos + pg) * kPage, p.kv_row_mask ? __ldg(p.kv_row_mask + pg) : 0xffffffffu);
  }
  flush();
  cp_async_wait<0>();  // no copy outlives the block
}

// ---- merge kernel: one block per (list row, query vector) -------------------------

// kMergeWarps: 8, or 16 / 32 when a list holds more than 64 / 128 partials (long lists at small
// batch: 32k-128k x 1 has ~132 per list), so that one round of loads covers them.
template <int HEAD_DIM, int kMergeWarps>
__global__ void __launch_bounds__(kMergeWarps * 32)
    decode_attention_merge_kernel(const __grid_constant__ DecodeAttentionParams p) {
  constexpr int kVec = HEAD_DIM / 32;  // floats per lane
  __shared__ __align__(16) float s_o[kMergeWarps][HEAD_DIM];
  __shared__ MergeState s_st[kMergeWarps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = blockIdx.x, v = blockIdx.y;
  const int n_kv_rows = p.n_requests * p.n_heads_kv;
  const int group = p.n_heads_q / p.n_heads_kv;
  const int req = row / p.n_heads_kv, kvh = row - req * p.n_heads_kv;
  const int q0 = __ldg(p.q_indptr + req);
  const int nq = group * (__ldg(p.q_indptr + req + 1) - q0);
  if (v >= nq) return;
  const size_t orow = static_cast<size_t>(q0 + v / group) * p.n_heads_q + kvh * group + v % group;
  // (Read before the wait, an exception to pdl_launch.h's rule that holds here: this grid is released
  // only once every split-KV block has passed its own wait, so the kernel that wrote the lists —
  // dense lists, compact or reuse — has completed. Moving the split-KV kernel's wait would break it.)
  const int64_t total = __ldg(p.kv_indptr + n_kv_rows);
  const int64_t lo = __ldg(p.kv_indptr + row), hi = __ldg(p.kv_indptr + row + 1);

  // Everything below reads what the split-KV kernel wrote (or writes what it must not).
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();  // the next kernel (the O projection) may stream its weights

  if (hi == lo) {  // empty list: nothing attended
    if (threadIdx.x < HEAD_DIM) p.out[orow * HEAD_DIM + threadIdx.x] = __float2half_rn(0.0f);
    if (threadIdx.x == 0 && p.lse != nullptr) p.lse[orow] = -INFINITY;
    return;
  }
  const int nw = active_workers(total, p.n_workers, p.min_pages_per_worker);
  const int w_lo = worker_of(lo, total, nw), w_hi = worker_of(hi - 1, total, nw);
  if (w_lo == w_hi) return;  // one worker held the whole list and wrote the output

  MergeState st;
  float acc[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) acc[i] = 0.0f;
  // The warps in use: enough for one round of kMergeUnroll loads each (the block is sized from the
  // host's estimate of partials per list; a shorter step uses fewer, and the final merge below
  // folds only theirs).
  const int n_active = min(kMergeWarps, (w_hi - w_lo + kMergeUnroll) / kMergeUnroll);
  // Each warp merges partials w_lo + warp, + n_active, ...; the loads of kMergeUnroll of them are
  // issued before the first merge, so a list of up to kMergeUnroll * n_active chunks costs one
  // memory round trip.
  for (int w0 = w_lo + warp; warp < n_active && w0 <= w_hi; w0 += n_active * kMergeUnroll) {
    MergeState b[kMergeUnroll];
    float ob[kMergeUnroll][kVec];
#pragma unroll
    for (int u = 0; u < kMergeUnroll; ++u) {
      const int w = w0 + u * n_active;
      if (w <= w_hi) {
        const size_t prow = static_cast<size_t>(w + row) * p.ws_q_vecs + v;
        b[u] = p.ws_state[prow];
        const float* src = p.ws_o + prow * HEAD_DIM + lane * kVec;
        if constexpr (kVec == 4) {
          const float4 x = *reinterpret_cast<const float4*>(src);
          ob[u][0] = x.x, ob[u][1] = x.y, ob[u][2] = x.z, ob[u][3] = x.w;
        } else {
          const float2 x = *reinterpret_cast<const float2*>(src);
          ob[u][0] = x.x, ob[u][1] = x.y;
        }
      } else {
        b[u] = MergeState{};  // d = 0: merge() skips it
#pragma unroll
        for (int i = 0; i < kVec; ++i) ob[u][i] = 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kMergeUnroll; ++u) merge(st, acc, b[u], ob[u], kVec);
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) s_o[warp][lane * kVec + i] = acc[i];
  if (lane == 0) s_st[warp] = st;
  __syncthreads();
  if (warp != 0) return;
  MergeState a = s_st[0];
  float out[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) out[i] = s_o[0][lane * kVec + i];
#pragma unroll
  for (int k = 1; k < n_active; ++k) merge(a, out, s_st[k], &s_o[k][lane * kVec], kVec);
  const float inv = a.d > 0.0f ? 1.0f / a.d : 0.0f;
#pragma unroll
  for (int i = 0; i < kVec; i += 2)
    *reinterpret_cast<__half2*>(p.out + orow * HEAD_DIM + lane * kVec + i) =
        __floats2half2_rn(out[i] * inv, out[i + 1] * inv);
  if (lane == 0 && p.lse != nullptr) p.lse[orow] = a.lse();
}

// ---- launch configuration ------------------------------------------------------------

constexpr int kMaxDevices = 64;

template <int HEAD_DIM, int M_TILES, int STAGES>
int configure_split_kv() {  // raises the smem limit once per device; returns blocks per SM
  using Shape = SplitKvShape<HEAD_DIM, M_TILES, STAGES>;
  static int blocks_per_sm[kMaxDevices] = {};
  int dev = 0;
  DHS_CUDA_CHECK(cudaGetDevice(&dev));
  require(dev < kMaxDevices, "decode_attention: device index out of range");
  if (blocks_per_sm[dev] == 0) {
    auto kernel = decode_attention_kernel<HEAD_DIM, M_TILES, STAGES>;
    DHS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape::kBlockSmem));
    int n = 0;
    DHS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kWarps * 32, Shape::kBlockSmem));
    require(n > 0, "decode_attention: kernel variant does not fit on this device");
    blocks_per_sm[dev] = n;
  }
  return blocks_per_sm[dev];
}

template <int HEAD_DIM, int M_TILES, int STAGES>
void launch_split_kv(const DecodeAttentionParams& p, cudaStream_t stream) {
  using Shape = SplitKvShape<HEAD_DIM, M_TILES, STAGES>;
  configure_split_kv<HEAD_DIM, M_TILES, STAGES>();  // no-op after the first call on this device
  launch_pdl(decode_attention_kernel<HEAD_DIM, M_TILES, STAGES>, dim3(p.n_workers / kWarps), dim3(kWarps * 32),
             Shape::kBlockSmem, stream, p);
  DHS_CUDA_CHECK(cudaGetLastError());
}

template <int HEAD_DIM>
void launch_merge(const DecodeAttentionParams& p, cudaStream_t stream) {
  const int q_vecs = (p.n_heads_q / p.n_heads_kv) * p.max_q_len;
  const dim3 grid(static_cast<unsigned>(p.n_requests * p.n_heads_kv), static_cast<unsigned>(q_vecs));
  // The merge grid is scheduled while the split-KV grid drains and waits for it with
  // griddepcontrol.wait (a programmatic edge in CUDA graphs: always, whatever pdl_chain() says).
  // Partials per list, about (the longest list of a sparse step may hold more: more rounds).
  const int per_list = p.n_workers / std::max(1, p.n_requests * p.n_heads_kv) + 1;
  if (per_list > 16 * kMergeUnroll)
    launch_programmatic(true, decode_attention_merge_kernel<HEAD_DIM, 32>, grid, dim3(32 * 32), 0, stream, p);
  else if (per_list > 8 * kMergeUnroll)
    launch_programmatic(true, decode_attention_merge_kernel<HEAD_DIM, 16>, grid, dim3(16 * 32), 0, stream, p);
  else
    launch_programmatic(true, decode_attention_merge_kernel<HEAD_DIM, 8>, grid, dim3(8 * 32), 0, stream, p);
}

}  // namespace

void launch_decode_attention(const DecodeAttentionParams& p, const DecodeAttentionProbe& probe, cudaStream_t stream) {
  const int q_vecs = (p.n_heads_q / p.n_heads_kv) * p.max_q_len;
  DHS_DISPATCH_HEAD_DIM(p.head_dim, HEAD_DIM, [&] {
    DHS_DISPATCH_M_TILES(q_vecs, M_TILES, [&] {
      DHS_DISPATCH_STAGES(p.stages, STAGES, [&] { launch_split_kv<HEAD_DIM, M_TILES, STAGES>(p, stream); });
    });
    if (!probe.split_only) launch_merge<HEAD_DIM>(p, stream);
  });
}

void launch_decode_attention(const DecodeAttentionParams& p, cudaStream_t stream) {
  launch_decode_attention(p, DecodeAttentionProbe{}, stream);
}

int decode_attention_max_workers(int head_dim, int max_q_vecs, int stages) {
  int dev = 0, n_sm = 0;
  DHS_CUDA_CHECK(cudaGetDevice(&dev));
  DHS_CUDA_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
  const int blocks = DHS_DISPATCH_HEAD_DIM(head_dim, HEAD_DIM, [&] {
    return DHS_DISPATCH_M_TILES(max_q_vecs, M_TILES, [&] {
      return DHS_DISPATCH_STAGES(stages, STAGES, [&] { return configure_split_kv<HEAD_DIM, M_TILES, STAGES>(); });
    });
  });
  return n_sm * blocks * kWarps;
}

DecodeAttentionWorkspace::DecodeAttentionWorkspace(int max_requests, int n_heads_q, int n_heads_kv, int head_dim,
                                                   int max_q_len, int stages)
    : max_requests_(max_requests),
      n_heads_q_(n_heads_q),
      n_heads_kv_(n_heads_kv),
      head_dim_(head_dim),
      max_q_len_(max_q_len),
      q_vecs_(0),
      stages_(stages),
      n_workers_(0) {
  require(max_requests >= 1 && n_heads_kv >= 1 && n_heads_q >= n_heads_kv && n_heads_q % n_heads_kv == 0,
          "DecodeAttentionWorkspace: bad request / head counts");
  require(max_q_len >= 1, "DecodeAttentionWorkspace: max_q_len must be >= 1");
  q_vecs_ = (n_heads_q / n_heads_kv) * max_q_len;
  n_workers_ = decode_attention_max_workers(head_dim, q_vecs_, stages);  // validates head_dim, q_vecs, stages
  const size_t n_parts = static_cast<size_t>(n_workers_) + static_cast<size_t>(max_requests) * n_heads_kv;
  const size_t n_o = n_parts * q_vecs_ * head_dim, n_st = n_parts * q_vecs_;
  bytes_ = n_o * sizeof(float) + n_st * sizeof(MergeState);
  DHS_CUDA_CHECK(cudaMalloc(&o_d_, n_o * sizeof(float)));
  DHS_CUDA_CHECK(cudaMalloc(&state_d_, n_st * sizeof(MergeState)));
}

DecodeAttentionWorkspace::~DecodeAttentionWorkspace() {
  cudaFree(o_d_);
  cudaFree(state_d_);
}

void decode_attention(const DecodeAttentionArgs& a, const DevicePageLists& lists, const DevicePagePool& pool,
                      DecodeAttentionWorkspace& ws, cudaStream_t stream) {
  decode_attention(a, lists, pool, ws, stream, DecodeAttentionProbe{});
}

namespace {

void decode_attention_checked(const DecodeAttentionArgs& a, const DecodeListsView& lists, const PagePoolView& pool,
                              DecodeAttentionWorkspace& ws, cudaStream_t stream, const DecodeAttentionProbe& probe) {
  require(pool.page_size == kPage, "decode_attention: page_size " + std::to_string(pool.page_size) +
                                       " is not supported (16)");
  require(pool.head_dim == ws.head_dim(), "decode_attention: pool head_dim differs from the workspace's");
  require(pool.k != nullptr && pool.v != nullptr, "decode_attention: null pool");
  require(lists.n_heads_kv == ws.n_heads_kv(), "decode_attention: lists n_heads_kv differs from the workspace's");
  require(lists.n_requests >= 1 && lists.n_requests <= ws.max_requests(),
          "decode_attention: " + std::to_string(lists.n_requests) + " requests, workspace holds " +
              std::to_string(ws.max_requests()));
  require(lists.indptr != nullptr && lists.slots != nullptr && lists.page_pos != nullptr && lists.seq_len != nullptr,
          "decode_attention: null lists");
  require(a.max_q_len >= 1 && a.max_q_len <= ws.max_q_len(),
          "decode_attention: max_q_len " + std::to_string(a.max_q_len) + " outside the workspace's 1.." +
              std::to_string(ws.max_q_len()));
  require(a.q_d != nullptr && a.q_indptr_d != nullptr && a.out_d != nullptr, "decode_attention: null tensor");
  require(reinterpret_cast<uintptr_t>(a.q_d) % 16 == 0 && reinterpret_cast<uintptr_t>(a.out_d) % 4 == 0,
          "decode_attention: q must be 16-byte aligned, out 4-byte aligned");
  require(a.scale > 0.0f && a.scale < INFINITY, "decode_attention: scale must be positive and finite");
  require(a.min_pages_per_worker >= 1, "decode_attention: min_pages_per_worker must be >= 1");

  DecodeAttentionParams p;
  p.q = a.q_d;
  p.out = a.out_d;
  p.lse = a.lse_d;
  p.q_indptr = a.q_indptr_d;
  p.kv_indptr = lists.indptr;
  p.kv_slots = lists.slots;
  p.kv_page_pos = lists.page_pos;
  p.kv_row_mask = lists.row_mask;
  p.seq_len = lists.seq_len;
  p.k_pool = pool.k;
  p.v_pool = pool.v;
  p.ws_o = ws.o_d();
  p.ws_state = ws.state_d();
  p.n_requests = lists.n_requests;
  p.n_heads_q = ws.n_heads_q();
  p.n_heads_kv = ws.n_heads_kv();
  p.head_dim = ws.head_dim();
  p.max_q_len = a.max_q_len;
  p.ws_q_vecs = ws.q_vecs();
  p.n_workers = ws.n_workers();
  p.min_pages_per_worker = a.min_pages_per_worker;
  p.stages = ws.stages();
  p.scale = a.scale;
  p.l2_evict_first = a.l2_evict_first ? 1 : 0;
  launch_decode_attention(p, probe, stream);
}

DecodeListsView view_of(const DevicePageLists& l) {
  return {l.indptr_d(), l.slots_d(), l.page_pos_d(), l.seq_len_d(), l.n_requests(), l.n_heads_kv()};
}

}  // namespace

void decode_attention(const DecodeAttentionArgs& a, const DevicePageLists& lists, const DevicePagePool& pool,
                      DecodeAttentionWorkspace& ws, cudaStream_t stream, const DecodeAttentionProbe& probe) {
  decode_attention_checked(a, view_of(lists), pool.view(), ws, stream, probe);
}

void decode_attention(const DecodeAttentionArgs& a, const DecodeListsView& lists, const PagePoolView& pool,
                      DecodeAttentionWorkspace& ws, cudaStream_t stream) {
  decode_attention_checked(a, lists, pool, ws, stream, DecodeAttentionProbe{});
}

}  // namespace dhs::cuda
