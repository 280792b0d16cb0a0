// What the warp-per-rows GEMVs (gemv.cu's CUDA-core kernel, quant_gemv.cu) share.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace dhs::cuda {

// 8 f16 (one 16-byte word) as floats.
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __half22float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

// The end of the kernel: each lane holds partial sums acc[r][t] of rows row0 + r and activation
// rows t; the warp adds them and lane (r * NT + t) % 32 writes y[t * ldy + row0 + r] (f16, fp32,
// or fp32 added to what is there).
template <int R, int NT>
__device__ __forceinline__ void warp_sum_store(float (&acc)[R][NT], int lane, int64_t row0, int64_t out, int64_t ldy,
                                               void* y, bool y_f32, bool accumulate) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], o);
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t)
      if (lane == (r * NT + t) % 32 && row0 + r < out) {
        const int64_t at = t * ldy + row0 + r;
        if (y_f32) {
          float* yf = static_cast<float*>(y);
          yf[at] = accumulate ? yf[at] + acc[r][t] : acc[r][t];
        } else {
          static_cast<__half*>(y)[at] = __float2half_rn(acc[r][t]);
        }
      }
}

}  // namespace dhs::cuda
