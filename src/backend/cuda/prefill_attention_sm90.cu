// Causal prefill attention on Hopper's warpgroup MMA (wgmma), head_dim 128: the same contract,
// tiles and results as the mma.sync kernel (prefill_attention.cu), with both GEMMs of a tile issued
// as asynchronous warpgroup MMAs that read K and V straight from shared memory.
//
// One thread block = 128 query rows (token x GQA head, as in prefill_attention.cu) of one
// (request, KV head): two consumer warpgroups of 64 rows; K/V tiles of BN = 128 (or 64) keys,
// gathered page by page with cp.async into a ring of 2 or 3 buffers shared by both. Per tile and
// consumer:
//   S[64 x BN]   = Q K^T: 8 x wgmma.m64nBNk16, A = Q and B = K from shared memory (K-major);
//   mask, online softmax (base 2) on S in registers, P = f16(S);
//   O[64 x 128] += P V: BN/16 x wgmma.m64n128k16, A = P from registers, B = V from shared memory
//   (MN-major: V's rows are keys, the reduction dimension; the transposed-B form).
// Forms (docs/kernels/prefill_attention_NOTES.md, v2-v4): every thread gathers and the block meets
// at a __syncthreads per tile (v2); or (WS) a third warpgroup gathers into an mbarrier ring (full /
// empty per buffer) and the consumers never wait for each other (v3), or take turns at the tensor
// cores (PP, ping-pong) with a 3-buffer ring (v4, the default).
// Shared-memory tiles use the 128-byte swizzle the MMA descriptors describe: a tile of R rows x
// 128 dims is two column blocks of R rows x 64 dims (128 B per row); 16-byte chunk c of row r sits
// at chunk c ^ (r % 8) of its row, 8-row groups 1,024 B apart (every block 1,024-B aligned).
// Written by hand: cuDNN's paged prefill wants one page table for all heads of a request, while
// this engine pages each KV head separately; CUTLASS/FA3 are not Debian packages.
#include "backend/cuda/prefill_attention_sm90.h"

#include <climits>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/prefill_tile.cuh"
#include "backend/cuda/ptx.cuh"

namespace dhs::cuda {

namespace {

constexpr int kPageSize = 16;
constexpr int kHeadDim = 128;
constexpr int kBlockM = 128;  // query rows per block: two warpgroups of 64
// Threads of a block: two consumer warpgroups; with WS (warp-specialized) a third, first, that only
// gathers K/V tiles (cp.async into an mbarrier ring) while the two consumers each run on their own.
template <bool WS>
inline constexpr int kThreadsOf = WS ? 384 : 256;
constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
constexpr int kQBytes = kBlockM * kHeadDim * 2;  // 32 KiB
// Keys per K/V tile (64 or 128: the template argument BN below); K/V in a ring of ST buffers (2,
// or 3 in the warp-specialized form: 32 + 3 x 64 KiB + slack at 128 keys, under the 227 KiB).
template <int BN, int ST = 2>
struct Tile {
  static constexpr int kPages = BN / kPageSize;
  static constexpr int kStages = ST;
  static constexpr int kKVBytes = BN * kHeadDim * 2;  // one K (or V) tile
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKVBytes + 1024;  // Q, K/V ring, alignment slack
};
constexpr int kNoKey = INT_MAX / 2;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Byte offset of chunk c of row r in a 128B-swizzled tile of `rows` rows (see the top).
__device__ __forceinline__ uint32_t sw128(int rows, int r, int c) {
  return static_cast<uint32_t>((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// Shared-memory matrix descriptor, 128-byte swizzle (PTX ISA, "Matrix Descriptor Format").
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// Makes this thread's shared-memory writes (cp.async included) visible to the MMA's async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups of this warpgroup's MMAs are still running.
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Keeps the compiler from moving reads or writes of an accumulator across an MMA's issue or wait
// (the asynchronous MMA writes it between the two).
template <int N>
__device__ __forceinline__ void pin(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// The same for a register A operand: read by the MMA until its wait.
template <int N>
__device__ __forceinline__ void pin(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// d (+)= A B, m64 n64 / n128 k16, A and B from shared memory (both K-major). scale_d 0: d = A B.
__device__ __forceinline__ void wgmma_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// d += A B, m64 n128 k16, A from registers (the m16n8k16 A-fragment layout per warp), B from
// shared memory MN-major (the transposed-B form). A is read asynchronously until the wait: it is an
// in-out operand here so that the compiler binds the variable's own registers (an input copy's
// registers could be reused while the MMA still reads them).
__device__ __forceinline__ void wgmma_m64n128k16_rs_tb(float (&d)[64], uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      , "+r"(a[0]), "+r"(a[1]), "+r"(a[2]), "+r"(a[3])
      : "l"(desc_b), "r"(1));
}

// 2^x on the SFU, shared-memory addresses, and the mbarrier helpers of the warp-specialized
// form's K/V ring: backend/cuda/ptx.cuh.
using ptx::mbar_arrive;
using ptx::mbar_init;
using ptx::mbar_wait;
using ptx::smem_u32;
__device__ __forceinline__ float fast_exp2(float x) { return ptx::ex2_approx(x); }
// Arrives on `bar` once every cp.async this thread issued before has landed.
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Barrier `id` (1..15) among `n` threads (one warpgroup: 128).
__device__ __forceinline__ void named_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <int BN, bool WS, bool PP, int ST>
__global__ void __launch_bounds__(kThreadsOf<WS>, 1) prefill_attention_sm90_kernel(const __grid_constant__ PrefillAttentionParams p) {
  static_assert(WS || (!PP && ST == 2), "ping-pong and a deeper ring are forms of the warp-specialized kernel");
  static_assert(Tile<BN, ST>::kSmemBytes + 2 * ST * 8 <= 227 * 1024, "shared memory (dynamic + the barriers)");
  using T = Tile<BN, ST>;
  constexpr int kThreads = kThreadsOf<WS>;
  __shared__ __align__(8) uint64_t s_bars[2 * ST];  // WS: full[ST] (tile landed), empty[ST] (tile consumed)
  // WS: registers per thread of the producer and of the consumers (setmaxnreg; 128 P + 256 C within
  // the 384 x 168 launched). The split with no spill in ptxas -v, per form: 56 / 224 (2 tiles), 72 /
  // 216 (3 tiles), 88 / 208 (ping-pong, 3 tiles); ping-pong with 2 tiles spills 8 B at 56 / 224,
  // more at 40 / 232 and 72 / 216.
  constexpr int kProducerRegs = ST == 3 ? (PP ? 88 : 72) : 56;
  constexpr int kConsumerRegs = (504 - kProducerRegs) / 2 / 8 * 8;
  constexpr int kBlockN = BN, kPagesPerTile = T::kPages, kKVBytes = T::kKVBytes, kStages = T::kStages;
  extern __shared__ unsigned char smem_raw[];
  // The swizzle atoms must sit on 1,024-byte boundaries.
  const uint32_t base = (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
  unsigned char* const smem = smem_raw + (base - static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)));
  const uint32_t s_q = base;                   // [2 column blocks][128 rows][128 B]
  const uint32_t s_k = base + kQBytes;           // [kStages buffers][2 column blocks][BN rows][128 B]
  const uint32_t s_v = s_k + kStages * kKVBytes;  // the same for V

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = WS ? (warp >> 2) - 1 : warp >> 2;  // consumer warpgroup: rows 64 wg ..; -1: the producer
  const int wrow = 64 * wg + 16 * (warp & 3);       // first row of this warp's 16
  const int g = lane >> 2, t = lane & 3;
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

  // Q tile -> shared (padding rows zero-filled). NOTE: size_t: the pools reach 2^31 elements.
  const size_t tok_stride = static_cast<size_t>(p.n_heads_q) * kHeadDim;
  const __half* q_tile =
      p.q + static_cast<size_t>(q_begin + tok0) * tok_stride + static_cast<size_t>(kv_head) * group * kHeadDim;
  // (WS: each consumer warpgroup copies its own 64 rows; the producer none.)
  if (wg >= 0) {
    constexpr int kQThreads = WS ? 128 : kThreads;
    const int qt = WS ? tid & 127 : tid, row0 = WS ? 64 * wg : 0;
#pragma unroll
    for (int i = 0; i < (WS ? 64 : kBlockM) * kChunks / kQThreads; ++i) {
      const int c = qt + i * kQThreads;
      const int m = row0 + c / kChunks, ch = c % kChunks;
      const bool valid = m < n_valid_rows;
      const int tk = m / group, h = m - tk * group;
      cp_async_16(s_q + sw128(kBlockM, m, ch), valid ? q_tile + tk * tok_stride + h * kHeadDim + ch * 8 : p.q, valid);
    }
  }

  auto fetch_pages = [&](int kt, int (&slot)[kPagesPerTile], int (&kbase)[kPagesPerTile]) {
#pragma unroll
    for (int i = 0; i < kPagesPerTile; ++i) {
      const int e = kt * kPagesPerTile + i;
      const bool in = e < n_vis;
      slot[i] = in ? __ldg(slots + e) : 0;
      kbase[i] = in ? __ldg(page_pos + e) * kPageSize : kNoKey;
    }
  };
  // K/V tile -> buffer `buf` by kLoaders threads, 16-byte chunks of 16
  // rows x 16 chunks per page; rows past seq_len (a last page's unused rows may hold NaN) and past
  // the list are zero-filled.
  // (The loaders: every thread, or with WS the producer's 128 (threads 0-127); a compile-time
  // count, so that every copy's offset is static.)
  constexpr int kLoaders = WS ? 128 : kThreads;
  auto load_kv = [&](int buf, const int (&slot)[kPagesPerTile], const int (&kbase)[kPagesPerTile]) {
    constexpr int kRowsPerPass = kLoaders / kChunks;
    const int lt = tid, ch = lt % kChunks;
#pragma unroll
    for (int pg = 0; pg < kPagesPerTile; ++pg)
#pragma unroll
      for (int pass = 0; pass < kPageSize / kRowsPerPass; ++pass) {
        const int pr = pass * kRowsPerPass + lt / kChunks;
        const int r = pg * kPageSize + pr;
        const bool valid = kbase[pg] + pr < seq_len;
        const size_t off = (static_cast<size_t>(slot[pg]) * kPageSize + pr) * kHeadDim + ch * 8;
        const uint32_t at = buf * kKVBytes + sw128(kBlockN, r, ch);
        cp_async_16(s_k + at, valid ? p.k_pool + off : p.k_pool, valid);
        cp_async_16(s_v + at, valid ? p.v_pool + off : p.v_pool, valid);
      }
  };

  // o[4j + e]: dims 8j + 2t + (e & 1) of rows g (e < 2) and g + 8 of this warp's 16.
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
  const float scale_log2 = p.scale * kLog2e;
  // Query positions of this thread's two rows (-1: padding).
  int row_pos[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int m = wrow + g + 8 * hh;
    row_pos[hh] = m < n_valid_rows ? q_min + m / group : -1;
  }

  // S = Q K^T of the tile in buffer `buf` (64 rows of this warpgroup x BN keys), issued.
  auto issue_s = [&](int buf, float (&s)[BN / 2]) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) s[i] = 0.0f;
    pin(s);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const uint32_t qa = s_q + (kk >> 2) * (kBlockM * 128) + wg * (64 * 128) + (kk & 3) * 32;
      const uint32_t kb = s_k + buf * kKVBytes + (kk >> 2) * (kBlockN * 128) + (kk & 3) * 32;
      wgmma_ss(s, smem_desc(qa, 16, 1024), smem_desc(kb, 16, 1024), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
  };
  // O += P V of the tile in buffer `buf`, issued: keys 16 kk .. 16 kk + 15 are S's n8 tiles 2kk
  // and 2kk + 1, whose accumulator layout is the A fragment of one k16 step.
  auto issue_pv = [&](int buf, uint32_t (&pa)[BN / 16][4]) {
    pin(o);
    pin(pa);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      // 16 keys = two 8-row groups (SBO 1,024 B); 128 dims = two 64-dim column blocks (LBO).
      const uint32_t vb = s_v + buf * kKVBytes + kk * (16 * 128);
      wgmma_m64n128k16_rs_tb(o, pa[kk], smem_desc(vb, kBlockN * 128, 1024));
    }
    wgmma_commit();
  };
  // Mask (tile keys at kbase), online softmax (base 2, scale folded in) and P = f16(exp2(..)):
  // s[4i + e] is key 8i + 2t + (e & 1) of the tile, row g + 8 (e >> 1). Returns in alpha the
  // factor O must be scaled by before this tile's P V is added. m_use = 0 keeps a row with no
  // key yet away from (-inf) - (-inf).
  auto softmax = [&](float (&s)[BN / 2], const int (&kbase)[kPagesPerTile], uint32_t (&pa)[BN / 16][4], float (&alpha)[2]) {
    if (kbase[kPagesPerTile - 1] + kPageSize - 1 > q_min) {
#pragma unroll
      for (int i = 0; i < BN / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int kpos = kbase[i >> 1] + (i & 1) * 8 + 2 * t + (e & 1);
          if (kpos > row_pos[e >> 1]) s[4 * i + e] = -INFINITY;
        }
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float mx = -INFINITY;
#pragma unroll
      for (int i = 0; i < BN / 8; ++i) mx = fmaxf(mx, fmaxf(s[4 * i + 2 * hh], s[4 * i + 2 * hh + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(row_max[hh], mx * scale_log2);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      alpha[hh] = fast_exp2(row_max[hh] - m_use);
      row_max[hh] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < BN / 8; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pe = fast_exp2(fmaf(s[4 * i + 2 * hh + e], scale_log2, -m_use));
          s[4 * i + 2 * hh + e] = pe;
          sum += pe;
        }
      row_sum[hh] = row_sum[hh] * alpha[hh] + sum;
    }
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      pa[kk][0] = pack_f16(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = pack_f16(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = pack_f16(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = pack_f16(s[8 * kk + 6], s[8 * kk + 7]);
    }
  };
  // (Skipped when no row of the warp has a new max: x 1 is exact, so the bits are the same, and
  // past the first tiles of a row the max rarely moves. ncu at d36d612: these 64 FMULs were 7% of
  // the kernel's instructions.)
  auto rescale = [&](const float (&alpha)[2]) {
    if (!__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[4 * j + 0] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
  };

  // Tile kt lives in buffer kt % kStages. Without WS (2 buffers) the next tile's copy is issued
  // once every warp is past the tile that used its buffer (the __syncthreads after each tile's
  // arrival).
  if constexpr (WS) {
    // full[b]: the producer's 128 threads arrive as their copies of a tile into buffer b land;
    // empty[b]: the consumers' 256 threads arrive when done with it. Tile kt uses buffer
    // kt % kStages (2 or 3), phase kt / kStages of both. (A consumer must arrive on every tile, even one
    // whose rows are all padding, or the producer waits forever.)
    const uint32_t full0 = smem_u32(&s_bars[0]), empty0 = smem_u32(&s_bars[kStages]);
    if (tid == 0) {
      for (int b = 0; b < kStages; ++b) {
        mbar_init(full0 + 8 * b, 128);
        mbar_init(empty0 + 8 * b, 256);
      }
    }
    __syncthreads();
    if (wg < 0) {  // the producer
      // The register split must add up to what the block was launched with (384 x 168), or the
      // consumers' setmaxnreg.inc waits forever.
      static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= kThreadsOf<true> * 168 && kThreadsOf<true> == 384,
                    "setmaxnreg split");
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs) : "memory");
      int slot[kPagesPerTile], kbase[kPagesPerTile];
      for (int kt = 0; kt < n_kv_tiles; ++kt) {
        const int b = kt % kStages;
        if (kt >= kStages) mbar_wait(empty0 + 8 * b, ((kt / kStages) - 1) & 1);
        fetch_pages(kt, slot, kbase);
        load_kv(b, slot, kbase);
        cp_async_mbar_arrive(full0 + 8 * b);
      }
      cp_async_commit();
      cp_async_wait_all();
      return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs) : "memory");
    cp_async_commit();
    cp_async_wait_all();  // this warpgroup's Q rows
    fence_proxy_async();
    named_sync(1 + wg, 128);
    float s[BN / 2], alpha[2];
    uint32_t pa[BN / 16][4];
    int slot_c[kPagesPerTile], kbase_c[kPagesPerTile];
    if constexpr (PP) {
      // Ping-pong (FA3's inter-warpgroup schedule): each consumer's tensor-core work of a step,
      // P V of tile kt and S of tile kt + 1 issued together, runs while the other consumer does
      // its softmax. Named barrier 3 + w is consumer w's turn to issue: it syncs there (its 128
      // threads) and the other consumer arrives there (128) once it has issued its own. Consumer
      // 0 goes first (consumer 1 arrives once up front); both run n_kv_tiles + 1 steps (the
      // first issues S of tile 0 only), and consumer 1 does not arrive after its last, so every
      // arrival is matched. Same MMAs, softmax and key order as the loop below: the same bits.
      if (n_kv_tiles > 0) {  // (block-uniform)
        const int mine = 3 + wg, other = 4 - wg;
        auto turn = [&] { asm volatile("bar.sync %0, 256;\n" ::"r"(mine) : "memory"); };
        auto pass = [&] { asm volatile("bar.arrive %0, 256;\n" ::"r"(other) : "memory"); };
        if (wg == 1) pass();
        fetch_pages(0, slot_c, kbase_c);
        mbar_wait(full0, 0);
        fence_proxy_async();
        turn();
        issue_s(0, s);
        pass();
        wgmma_wait<0>();
        pin(s);
        softmax(s, kbase_c, pa, alpha);
        rescale(alpha);
        for (int kt = 0; kt < n_kv_tiles; ++kt) {
          const int b = kt % kStages, bn = (kt + 1) % kStages;
          const bool has_next = kt + 1 < n_kv_tiles;
          if (has_next) {
            fetch_pages(kt + 1, slot_c, kbase_c);
            mbar_wait(full0 + 8 * bn, ((kt + 1) / kStages) & 1);
            fence_proxy_async();
          }
          turn();
          issue_pv(b, pa);
          if (has_next) issue_s(bn, s);
          if (has_next || wg == 0) pass();
          wgmma_wait<0>();
          pin(o);
          pin(pa);
          pin(s);
          mbar_arrive(empty0 + 8 * b);
          if (has_next) {
            softmax(s, kbase_c, pa, alpha);
            rescale(alpha);
          }
        }
      }
    } else {
      for (int kt = 0; kt < n_kv_tiles; ++kt) {
        const int b = kt % kStages;
        fetch_pages(kt, slot_c, kbase_c);  // (the positions, for the mask)
        mbar_wait(full0 + 8 * b, (kt / kStages) & 1);
        fence_proxy_async();
        issue_s(b, s);
        wgmma_wait<0>();
        pin(s);
        softmax(s, kbase_c, pa, alpha);
        rescale(alpha);
        issue_pv(b, pa);
        wgmma_wait<0>();
        pin(o);
        pin(pa);
        mbar_arrive(empty0 + 8 * b);
      }
    }
  } else {
    int slot_n[kPagesPerTile], kbase_n[kPagesPerTile], kbase_c[kPagesPerTile];
    if (n_kv_tiles > 0) {
      fetch_pages(0, slot_n, kbase_c);
      load_kv(0, slot_n, kbase_c);
    }
    cp_async_commit();
    float s[BN / 2], alpha[2];
    uint32_t pa[BN / 16][4];
    for (int kt = 0; kt < n_kv_tiles; ++kt) {
      const int buf = kt % kStages;
      const bool has_next = kt + 1 < n_kv_tiles;
      if (has_next) fetch_pages(kt + 1, slot_n, kbase_n);
      cp_async_wait_all();
      fence_proxy_async();
      __syncthreads();  // tile kt landed for all; every warp is done with the buffer refilled next
      if (has_next) load_kv((kt + 1) % kStages, slot_n, kbase_n);
      cp_async_commit();
      issue_s(buf, s);
      wgmma_wait<0>();
      pin(s);
      softmax(s, kbase_c, pa, alpha);
      rescale(alpha);
      issue_pv(buf, pa);
      wgmma_wait<0>();
      pin(o);
      pin(pa);
      if (has_next) {
#pragma unroll
        for (int i = 0; i < kPagesPerTile; ++i) kbase_c[i] = kbase_n[i];
      }
    }
  }

  // Epilogue: both warpgroups are past their last MMA on Q (and an unused Q copy has landed)
  // before the Q tile is reused to stage O (WS: each consumer stages and writes its own rows,
  // which only its own MMAs read).
  if constexpr (!WS) {
    cp_async_wait_all();
    __syncthreads();
  }
  float inv_sum[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float l = row_sum[hh];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    row_sum[hh] = l;
    inv_sum[hh] = l > 0.0f ? 1.0f / l : 0.0f;
  }
  // Staging: row m's chunk c at sw128(kBlockM, m, c) (the Q tile's own layout).
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int m = wrow + g + 8 * hh;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint32_t v = pack_f16(o[4 * j + 2 * hh] * inv_sum[hh], o[4 * j + 2 * hh + 1] * inv_sum[hh]);
      *reinterpret_cast<uint32_t*>(smem + (sw128(kBlockM, m, j) + 4 * t)) = v;
    }
  }
  if constexpr (WS) named_sync(1 + wg, 128);
  else __syncthreads();
  __half* out_tile =
      p.out + static_cast<size_t>(q_begin + tok0) * tok_stride + static_cast<size_t>(kv_head) * group * kHeadDim;
  constexpr int kOutThreads = WS ? 128 : kThreads;
  const int ot = WS ? tid & 127 : tid, orow0 = WS ? 64 * wg : 0;
#pragma unroll
  for (int i = 0; i < (WS ? 64 : kBlockM) * kChunks / kOutThreads; ++i) {
    const int c = ot + i * kOutThreads;
    const int m = orow0 + c / kChunks, ch = c % kChunks;
    if (m < n_valid_rows) {
      const int tk = m / group, h = m - tk * group;
      *reinterpret_cast<uint4*>(out_tile + tk * tok_stride + h * kHeadDim + ch * 8) =
          *reinterpret_cast<const uint4*>(smem + sw128(kBlockM, m, ch));
    }
  }
  if (p.lse != nullptr && t == 0) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int m = wrow + g + 8 * hh;
      if (m < n_valid_rows) {
        const int tk = m / group, h = m - tk * group;
        const float l = row_sum[hh];
        p.lse[static_cast<size_t>(q_begin + tok0 + tk) * p.n_heads_q + kv_head * group + h] =
            l > 0.0f ? (row_max[hh] + log2f(l)) * kLn2 : -INFINITY;
      }
    }
  }
}

template <int BN, bool WS, bool PP, int ST>
void launch_shape(const PrefillAttentionParams& p, dim3 grid, cudaStream_t stream) {
  static const bool attr_set = [] {
    DHS_CUDA_CHECK(cudaFuncSetAttribute(prefill_attention_sm90_kernel<BN, WS, PP, ST>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, Tile<BN, ST>::kSmemBytes));
    return true;
  }();
  (void)attr_set;
  prefill_attention_sm90_kernel<BN, WS, PP, ST><<<grid, kThreadsOf<WS>, Tile<BN, ST>::kSmemBytes, stream>>>(p);
  DHS_CUDA_CHECK(cudaGetLastError());
}

template <int BN>
void launch_block_n(const PrefillAttentionParams& p, const PrefillSm90Shape& shape, dim3 grid, cudaStream_t stream) {
  const bool three = shape.stages == 3;
  if (!shape.warp_specialized) launch_shape<BN, false, false, 2>(p, grid, stream);
  else if (shape.ping_pong)
    three ? launch_shape<BN, true, true, 3>(p, grid, stream) : launch_shape<BN, true, true, 2>(p, grid, stream);
  else three ? launch_shape<BN, true, false, 3>(p, grid, stream) : launch_shape<BN, true, false, 2>(p, grid, stream);
}

}  // namespace

void check_prefill_sm90_shape(const PrefillSm90Shape& shape) {
  auto fail = [](const char* what) { check(cudaErrorInvalidValue, what, __FILE__, __LINE__); };
  if (shape.block_n != 64 && shape.block_n != 128) fail("prefill_attention_sm90 shape: 64 or 128 keys");
  if (shape.stages != 2 && shape.stages != 3) fail("prefill_attention_sm90 shape: a ring of 2 or 3 K/V tiles");
  if (!shape.warp_specialized && (shape.ping_pong || shape.stages != 2))
    fail("prefill_attention_sm90 shape: ping-pong and a 3-tile ring need the warp-specialized form");
}

bool prefill_sm90_available() {
  static const bool ok = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    // The kernel image exists only where the build targeted sm_90a.
    cudaFuncAttributes attr{};
    return major == 9 && cudaFuncGetAttributes(&attr, prefill_attention_sm90_kernel<128, false, false, 2>) == cudaSuccess;
  }();
  return ok;
}

void launch_prefill_attention_sm90(const PrefillAttentionParams& p, const PrefillSm90Shape& shape, dim3 grid,
                                   cudaStream_t stream) {
  if (shape.block_n == 128) launch_block_n<128>(p, shape, grid, stream);
  else launch_block_n<64>(p, shape, grid, stream);
}

}  // namespace dhs::cuda
