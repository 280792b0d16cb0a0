#include "backend/cuda/gemv.h"

#include <cassert>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl_launch.h"
#include "backend/cuda/ptx.cuh"

namespace dhs::cuda {

namespace {

constexpr int kWarps = 8;  // per block
constexpr int kUnroll = 4; // 16-byte weight loads per row in flight per lane

// 8 bf16 (one 16-byte word) as floats.
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

// Weights are read once per step: streamed past L1 (ld.global.nc.L1::no_allocate).
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// One warp owns ROWS consecutive output rows. Lane l reads 16-byte words l, l + 32, ... of each
// row (kUnroll words per row in flight) and the same words of the NT activation rows, keeps
// ROWS x NT fp32 partial dot products, and the warp adds them up at the end.
template <int NT, int ROWS>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const __grid_constant__ GemvParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * ROWS;
  if (row0 >= p.out) return;
  const int64_t n_words = p.in / 8;
  const uint4* x = reinterpret_cast<const uint4*>(p.x);
  const uint4* w[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)  // rows past `out` re-read the last row; their sums are dropped
    w[r] = reinterpret_cast<const uint4*>(p.w) + min(row0 + r, p.out - 1) * n_words;
  float acc[ROWS][NT] = {};
  uint4 wv[kUnroll][ROWS];
  const auto load_w = [&](int64_t k0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
        wv[u][r] = k0 + u * 32 < n_words ? ld_stream(w[r] + k0 + u * 32) : make_uint4(0, 0, 0, 0);
  };
  // The first weights are in flight before the wait for x, the previous kernel's output
  // (pdl_launch.h): they stream while that kernel drains.
  load_w(lane);
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  for (int64_t k0 = lane; k0 < n_words; k0 += 32 * kUnroll) {
    if (k0 != lane) load_w(k0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t k = k0 + u * 32;
      if (k >= n_words) break;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        float xf[8];
        unpack8(__ldg(x + t * n_words + k), xf);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          float wf[8];
          unpack8(wv[u][r], wf);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r][t] = fmaf(wf[i], xf[i], acc[r][t]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], o);
  // Lane r * NT + t writes (t, row0 + r).
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t)
      if (lane == (r * NT + t) % 32 && row0 + r < p.out) {
        const int64_t at = t * p.out + row0 + r;
        if (p.y_f32) {
          float* y = static_cast<float*>(p.y);
          y[at] = p.accumulate ? y[at] + acc[r][t] : acc[r][t];
        } else {
          static_cast<__nv_bfloat16*>(p.y)[at] = __float2bfloat16(acc[r][t]);
        }
      }
}

template <int NT>
void launch_nt(const GemvParams& p, cudaStream_t stream) {
  constexpr int ROWS = NT <= 2 ? 2 : 4;  // more rows per warp amortize the activation loads
  const int64_t rows_per_block = int64_t{kWarps} * ROWS;
  const unsigned grid = static_cast<unsigned>((p.out + rows_per_block - 1) / rows_per_block);
  launch_pdl(gemv_kernel<NT, ROWS>, dim3(grid), dim3(kWarps * 32), 0, stream, p);
}

}  // namespace

bool gemv_supported(const GemvParams& p) {
  const auto aligned = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  return p.n_tok >= 1 && p.n_tok <= kGemvMaxTok && p.in > 0 && p.in % 8 == 0 && p.out > 0 &&
         (p.out + kWarps * 4) / (kWarps * 2) < (int64_t{1} << 31) && aligned(p.w) && aligned(p.x) &&
         (!p.accumulate || p.y_f32);
}

void launch_gemv(const GemvParams& p, cudaStream_t stream) {
  assert(gemv_supported(p));
  switch (p.n_tok) {
    case 1: launch_nt<1>(p, stream); break;
    case 2: launch_nt<2>(p, stream); break;
    case 3: launch_nt<3>(p, stream); break;
    case 4: launch_nt<4>(p, stream); break;
    case 5: launch_nt<5>(p, stream); break;
    case 6: launch_nt<6>(p, stream); break;
    case 7: launch_nt<7>(p, stream); break;
    case 8: launch_nt<8>(p, stream); break;
    default: check(cudaErrorInvalidValue, "launch_gemv: n_tok must be 1..8", __FILE__, __LINE__);
  }
  DHS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dhs::cuda
