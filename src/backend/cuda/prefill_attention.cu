// Causal prefill attention over head-paged f16 KV: FlashAttention-2-style
// tiles on mma.sync m16n8k16 (f16 in, fp32 accumulate), K/V tiles gathered
// page by page with cp.async, double-buffered. See prefill_attention.h for the
// contract and docs/kernels/prefill_attention_NOTES.md for measurements.
//
// One thread block = one tile of kBlockM query rows of one (request, KV head):
// row m of the tile is (token m / group, q head m % group of the KV head's
// group), so the group's heads share every K/V tile they read. 4 warps, each
// owning 32 rows (two m16 tiles); K/V tiles are kBlockN = 64 keys = 4 pages.
#include "backend/cuda/prefill_attention.h"

#include <climits>
#include <cstdint>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/prefill_tile.cuh"
#include "backend/cuda/prefill_attention_sm90.h"

namespace dhs::cuda {

namespace {

constexpr int kPageSize = 16;
constexpr int kBlockM = 128;  // query rows (token x head of the group) per tile
constexpr int kBlockN = 64;   // keys per K/V tile
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpRows = kBlockM / kWarps;  // 32 = two m16 tiles per warp
constexpr int kPagesPerTile = kBlockN / kPageSize;
static_assert(kWarpRows == 32 && kPagesPerTile == 4, "fragment code below assumes these");
// Position given to the key slots of a tile past the end of the list: above
// every query position, so the causal test masks them; small enough that
// adding a page offset does not overflow.
constexpr int kNoKey = INT_MAX / 2;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared-memory tiles are rows of HEAD_DIM f16 in 16-byte chunks; chunk c of
// row r is stored at chunk c ^ (r & 7), so the 8 rows one ldmatrix 8x8 reads
// at the same logical chunk land in 8 different bank groups.
template <int HEAD_DIM>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return row * HEAD_DIM + ((chunk ^ (row & 7)) << 3);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; when !valid the destination is zero-filled and
// nothing is read (src must still be a mapped address: callers pass a base).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a * b for one m16n8k16 tile (a row-major 16x16, b "col" 16x8).
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float fast_exp2(float x) {  // ex2.approx: 2^-22 relative; exp2(-inf) = 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <int HEAD_DIM>
__global__ void __launch_bounds__(kThreads, 2)
    prefill_attention_kernel(const __grid_constant__ PrefillAttentionParams p) {
  constexpr int kChunks = HEAD_DIM / 8;             // 16-byte chunks per row
  constexpr int kKSteps = HEAD_DIM / 16;            // k16 steps of Q.K^T
  constexpr int kDTiles = HEAD_DIM / 8;             // n8 tiles of the output
  constexpr int kRowsPerPass = kThreads / kChunks;  // rows one pass of the block copies
  constexpr int kPassesPerPage = kPageSize / kRowsPerPass;
  static_assert(kPageSize % kRowsPerPass == 0, "a pass must not straddle pages");

  extern __shared__ __align__(128) unsigned char smem_raw[];
  __half* s_q = reinterpret_cast<__half*>(smem_raw);  // [kBlockM, HEAD_DIM]
  __half* s_k = s_q + kBlockM * HEAD_DIM;                      // [2, kBlockN, HEAD_DIM]
  __half* s_v = s_k + 2 * kBlockN * HEAD_DIM;                  // [2, kBlockN, HEAD_DIM]

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int kv_head = blockIdx.x;
  const int group = p.n_heads_q / p.n_heads_kv;
  // (request, query tile) of this block and the list entries it can see (prefill_tile.cuh).
  const PrefillTile w = plan_prefill_tile(p, kv_head, kBlockM, kPageSize);
  if (w.req < 0) return;
  const int q_begin = w.q_begin, seq_len = w.seq_len, tok0 = w.tok0;
  const int n_valid_rows = w.n_valid_rows, q_min = w.q_min, n_vis = w.n_vis;
  const int32_t* const slots = w.slots;
  const int32_t* const page_pos = w.page_pos;
  const int n_kv_tiles = (n_vis + kPagesPerTile - 1) / kPagesPerTile;

  // Q tile -> shared (padding rows zero-filled). NOTE: size_t offsets: the
  // pools reach 2^31 elements at 16 GiB.
  const size_t tok_stride = static_cast<size_t>(p.n_heads_q) * HEAD_DIM;
  const __half* q_tile =
      p.q + static_cast<size_t>(q_begin + tok0) * tok_stride + static_cast<size_t>(kv_head) * group * HEAD_DIM;
  for (int c = tid; c < kBlockM * kChunks; c += kThreads) {
    const int m = c / kChunks, ch = c % kChunks;
    const bool valid = m < n_valid_rows;
    const int t = m / group, h = m - t * group;
    const __half* src = valid ? q_tile + t * tok_stride + h * HEAD_DIM + ch * 8 : p.q;
    cp_async_16(smem_addr(s_q + swizzle<HEAD_DIM>(m, ch)), src, valid);
  }

  // Page slots and first key positions of K/V tile kt; kNoKey past the list.
  auto fetch_pages = [&](int kt, int (&slot)[kPagesPerTile], int (&kbase)[kPagesPerTile]) {
#pragma unroll
    for (int i = 0; i < kPagesPerTile; ++i) {
      const int e = kt * kPagesPerTile + i;
      const bool in = e < n_vis;
      slot[i] = in ? __ldg(slots + e) : 0;
      kbase[i] = in ? __ldg(page_pos + e) * kPageSize : kNoKey;
    }
  };
  // K/V tile -> shared buffer `buf`; rows past seq_len (the last page's unused
  // rows, which may hold anything, NaN included) and past the list are zero-filled.
  auto load_kv = [&](int buf, const int (&slot)[kPagesPerTile], const int (&kbase)[kPagesPerTile]) {
    __half* sk = s_k + buf * kBlockN * HEAD_DIM;
    __half* sv = s_v + buf * kBlockN * HEAD_DIM;
    const int r_in = tid / kChunks, ch = tid % kChunks;
#pragma unroll
    for (int pg = 0; pg < kPagesPerTile; ++pg) {
#pragma unroll
      for (int pass = 0; pass < kPassesPerPage; ++pass) {
        const int pr = pass * kRowsPerPass + r_in;  // row in the page
        const int r = pg * kPageSize + pr;          // row in the tile
        const bool valid = kbase[pg] + pr < seq_len;
        const size_t off = (static_cast<size_t>(slot[pg]) * kPageSize + pr) * HEAD_DIM + ch * 8;
        cp_async_16(smem_addr(sk + swizzle<HEAD_DIM>(r, ch)), valid ? p.k_pool + off : p.k_pool, valid);
        cp_async_16(smem_addr(sv + swizzle<HEAD_DIM>(r, ch)), valid ? p.v_pool + off : p.v_pool, valid);
      }
    }
  };

  int cur_slot[kPagesPerTile], cur_kbase[kPagesPerTile];
  if (n_kv_tiles > 0) {
    fetch_pages(0, cur_slot, cur_kbase);
    load_kv(0, cur_slot, cur_kbase);
  }
  cp_async_commit();

  float acc_o[2][kDTiles][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int j = 0; j < kDTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mi][j][e] = 0.0f;
  float row_max[2][2], row_sum[2][2];  // log2-scaled running max; this thread's part of the sum
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      row_max[mi][hh] = -INFINITY;
      row_sum[mi][hh] = 0.0f;
    }
  const float scale_log2 = p.scale * kLog2e;

  for (int kt = 0; kt < n_kv_tiles; ++kt) {
    const int buf = kt & 1;
    const bool has_next = kt + 1 < n_kv_tiles;
    int nxt_slot[kPagesPerTile], nxt_kbase[kPagesPerTile];
    if (has_next) fetch_pages(kt + 1, nxt_slot, nxt_kbase);
    cp_async_wait_all();
    __syncthreads();  // tile kt landed for all; every warp is done with buffer buf ^ 1
    if (has_next) load_kv(buf ^ 1, nxt_slot, nxt_kbase);
    cp_async_commit();

    // S = Q K^T for this warp's 32 rows x 64 keys.
    const __half* sk = s_k + buf * kBlockN * HEAD_DIM;
    const __half* sv = s_v + buf * kBlockN * HEAD_DIM;
    float s[2][8][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mi][j][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      uint32_t a[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        ldmatrix_x4(a[mi], smem_addr(s_q + swizzle<HEAD_DIM>(warp * kWarpRows + mi * 16 + (lane & 15),
                                                             kk * 2 + (lane >> 4))));
#pragma unroll
      for (int jp = 0; jp < 4; ++jp) {  // 16 keys: n8 tiles 2jp and 2jp+1
        uint32_t b[4];
        ldmatrix_x4(b, smem_addr(sk + swizzle<HEAD_DIM>(jp * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                        kk * 2 + ((lane >> 3) & 1))));
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma_f16(s[mi][2 * jp], a[mi], b[0], b[1]);
          mma_f16(s[mi][2 * jp + 1], a[mi], b[2], b[3]);
        }
      }
    }

    // Causal mask, only on tiles that reach past the tile's first query
    // position (the diagonal) or past the list.
    if (cur_kbase[kPagesPerTile - 1] + kPageSize - 1 > q_min) {
      // Query position of the 4 rows this thread holds ([m16 tile][upper/lower
      // 8 rows]); -1 for padding rows (never written out). Recomputed here
      // rather than kept: registers are the limit of this kernel.
      int row_pos[2][2];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int m = warp * kWarpRows + mi * 16 + hh * 8 + (lane >> 2);
          row_pos[mi][hh] = m < n_valid_rows ? q_min + m / group : -1;
        }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int kpos = cur_kbase[j >> 1] + (j & 1) * 8 + 2 * (lane & 3) + (e & 1);
            if (kpos > row_pos[mi][e >> 1]) s[mi][j][e] = -INFINITY;
          }
    }

    // Online softmax (base 2, scale folded in). A row with no key yet keeps
    // max -inf; m_use = 0 then keeps exp2 away from (-inf) - (-inf).
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; ++j) mx = fmaxf(mx, fmaxf(s[mi][j][2 * hh], s[mi][j][2 * hh + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(row_max[mi][hh], mx * scale_log2);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        const float alpha = fast_exp2(row_max[mi][hh] - m_use);
        row_max[mi][hh] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pe = fast_exp2(fmaf(s[mi][j][2 * hh + e], scale_log2, -m_use));
            s[mi][j][2 * hh + e] = pe;
            sum += pe;
          }
        row_sum[mi][hh] = row_sum[mi][hh] * alpha + sum;
#pragma unroll
        for (int j = 0; j < kDTiles; ++j) {
          acc_o[mi][j][2 * hh] *= alpha;
          acc_o[mi][j][2 * hh + 1] *= alpha;
        }
      }

    // O += P V: the m16n8 accumulator layout of two adjacent key tiles is the
    // A-fragment layout of one k16 step, so P stays in registers (as f16).
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        a[mi][0] = pack_f16(s[mi][2 * kk][0], s[mi][2 * kk][1]);
        a[mi][1] = pack_f16(s[mi][2 * kk][2], s[mi][2 * kk][3]);
        a[mi][2] = pack_f16(s[mi][2 * kk + 1][0], s[mi][2 * kk + 1][1]);
        a[mi][3] = pack_f16(s[mi][2 * kk + 1][2], s[mi][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < HEAD_DIM / 16; ++dp) {  // 16 dims: n8 tiles 2dp and 2dp+1
        uint32_t b[4];
        ldmatrix_x4_trans(b, smem_addr(sv + swizzle<HEAD_DIM>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3),
                                                              dp * 2 + (lane >> 4))));
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma_f16(acc_o[mi][2 * dp], a[mi], b[0], b[1]);
          mma_f16(acc_o[mi][2 * dp + 1], a[mi], b[2], b[3]);
        }
      }
    }

    if (has_next) {
#pragma unroll
      for (int i = 0; i < kPagesPerTile; ++i) cur_kbase[i] = nxt_kbase[i];
    }
  }

  // Epilogue. With no K/V tile the Q copy may still be in flight: drain it
  // before reusing s_q. Each warp then stages its own 32 rows of O (rows no
  // other warp reads) in s_q and writes them out 16 bytes per lane.
  cp_async_wait_all();
  __syncthreads();
  float inv_sum[2][2];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float l = row_sum[mi][hh];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      row_sum[mi][hh] = l;
      inv_sum[mi][hh] = l > 0.0f ? 1.0f / l : 0.0f;
    }
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int m = warp * kWarpRows + mi * 16 + hh * 8 + (lane >> 2);
#pragma unroll
      for (int j = 0; j < kDTiles; ++j) {
        const uint32_t v = pack_f16(acc_o[mi][j][2 * hh] * inv_sum[mi][hh], acc_o[mi][j][2 * hh + 1] * inv_sum[mi][hh]);
        *reinterpret_cast<uint32_t*>(s_q + swizzle<HEAD_DIM>(m, j) + 2 * (lane & 3)) = v;
      }
    }
  __syncwarp();
  __half* out_tile =
      p.out + static_cast<size_t>(q_begin + tok0) * tok_stride + static_cast<size_t>(kv_head) * group * HEAD_DIM;
#pragma unroll 4
  for (int c = lane; c < kWarpRows * kChunks; c += 32) {
    const int m = warp * kWarpRows + c / kChunks, ch = c % kChunks;
    if (m < n_valid_rows) {
      const int t = m / group, h = m - t * group;
      *reinterpret_cast<uint4*>(out_tile + t * tok_stride + h * HEAD_DIM + ch * 8) =
          *reinterpret_cast<const uint4*>(s_q + swizzle<HEAD_DIM>(m, ch));
    }
  }
  if (p.lse != nullptr && (lane & 3) == 0) {
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int m = warp * kWarpRows + mi * 16 + hh * 8 + (lane >> 2);
        if (m < n_valid_rows) {
          const int t = m / group, h = m - t * group;
          const float l = row_sum[mi][hh];
          p.lse[static_cast<size_t>(q_begin + tok0 + t) * p.n_heads_q + kv_head * group + h] =
              l > 0.0f ? (row_max[mi][hh] + log2f(l)) * kLn2 : -INFINITY;
        }
      }
  }
}

template <int HEAD_DIM>
void launch_for_head_dim(const PrefillAttentionParams& p, dim3 grid, cudaStream_t stream) {
  constexpr int smem = (kBlockM + 4 * kBlockN) * HEAD_DIM * static_cast<int>(sizeof(__half));
  static const bool attr_set = [] {
    DHS_CUDA_CHECK(cudaFuncSetAttribute(prefill_attention_kernel<HEAD_DIM>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)attr_set;
  prefill_attention_kernel<HEAD_DIM><<<grid, kThreads, smem, stream>>>(p);
  DHS_CUDA_CHECK(cudaGetLastError());
}

// A precondition failure reported as dhs::Error through cuda::check (this file
// cannot include core/error.h: it pulls fmt, which nvcc 13 rejects).
void require(bool ok, const std::string& what) {
  if (!ok) check(cudaErrorInvalidValue, ("prefill_attention: " + what).c_str(), __FILE__, __LINE__);
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

}  // namespace

void launch_prefill_attention(const PrefillAttentionParams& p, cudaStream_t stream, const PrefillKernel& kernel) {
  require(p.page_size == kPageSize, "page_size " + std::to_string(p.page_size) + " (supported: 16)");
  require(p.n_heads_kv > 0 && p.n_heads_q > 0 && p.n_heads_q % p.n_heads_kv == 0,
          "n_heads_q " + std::to_string(p.n_heads_q) + " not a multiple of n_heads_kv " +
              std::to_string(p.n_heads_kv));
  const int group = p.n_heads_q / p.n_heads_kv;
  require(group <= kBlockM, "query heads per KV head " + std::to_string(group) + " > 128");
  require(p.n_requests >= 0 && p.n_rows >= 0, "negative sizes");
  require(p.scale > 0.0f, "scale must be > 0");
  check_prefill_sm90_shape(kernel.sm90_shape);
  if (p.n_requests == 0 || p.n_rows == 0) return;
  require(p.q && p.out && p.k_pool && p.v_pool && p.q_indptr && p.kv_indptr && p.slots && p.page_pos && p.seq_len,
          "null pointer");
  require(aligned16(p.q) && aligned16(p.out) && aligned16(p.k_pool) && aligned16(p.v_pool),
          "q, out and the pools must be 16-byte aligned");
  // Sum over requests of ceil(q_len / tile_tokens) <= n_rows / tile_tokens + n_requests.
  const int tile_tokens = kBlockM / group;
  const int64_t n_tiles_bound = static_cast<int64_t>(p.n_rows) / tile_tokens + p.n_requests;
  require(n_tiles_bound <= 65535, "too many query tiles for grid.y (" + std::to_string(n_tiles_bound) + ")");
  const dim3 grid(static_cast<unsigned>(p.n_heads_kv), static_cast<unsigned>(n_tiles_bound));
  switch (p.head_dim) {
    case 64: launch_for_head_dim<64>(p, grid, stream); break;
    case 128:
      if (kernel.wgmma && prefill_sm90_available()) launch_prefill_attention_sm90(p, kernel.sm90_shape, grid, stream);
      else launch_for_head_dim<128>(p, grid, stream);
      break;
    default: require(false, "head_dim " + std::to_string(p.head_dim) + " (supported: 64, 128)");
  }
}

}  // namespace dhs::cuda
