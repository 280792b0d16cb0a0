// Per-token 4-bit key sketch; see device_key_sketch.h.
#include "backend/cuda/device_key_sketch.h"

#include <cuda_bf16.h>

#include "backend/cuda/cuda_check.h"

namespace dhs::cuda {

DeviceKeySketch::DeviceKeySketch(int64_t n_pages, int page_size, int head_dim)
    : n_pages_(n_pages), page_size_(page_size), head_dim_(head_dim) {
  if (n_pages <= 0 || page_size <= 0 || !(head_dim == 64 || head_dim == 128 || head_dim == 256))
    check(cudaErrorInvalidValue, "DeviceKeySketch: bad shape (head_dim must be 64, 128 or 256)", __FILE__, __LINE__);
  DHS_CUDA_CHECK(cudaMalloc(&codes_d_, code_bytes()));
  DHS_CUDA_CHECK(cudaMalloc(&steps_d_, static_cast<size_t>(n_pages) * page_size * 4));
  // Rows are read only once written; zeros keep the unwritten ones finite anyway.
  DHS_CUDA_CHECK(cudaMemset(codes_d_, 0x88, code_bytes()));
  DHS_CUDA_CHECK(cudaMemset(steps_d_, 0, static_cast<size_t>(n_pages) * page_size * 4));
}

DeviceKeySketch::~DeviceKeySketch() {
  cudaFree(codes_d_);
  cudaFree(steps_d_);
}

namespace {

// One warp per (token, KV head): the row's absmax, then one lane per packed 32-bit word.
__global__ void __launch_bounds__(32) sketch_keys_kernel(const __grid_constant__ SketchKeysParams p) {
  const int64_t t = blockIdx.x;
  const int h = static_cast<int>(blockIdx.y);
  const int lane = static_cast<int>(threadIdx.x);
  const int32_t slot = p.dst_slot[t * p.n_heads_kv + h];
  if (slot < 0 || slot >= p.n_pages) return;
  const int row = p.pos[t] % p.page_size;
  const int D = p.head_dim, KS = D / 32;
  const __nv_bfloat16* k = p.k_pool + (static_cast<int64_t>(slot) * p.page_size + row) * D;
  float amax = 0.0f;
  for (int d = lane; d < D; d += 32) amax = fmaxf(amax, fabsf(__bfloat162float(k[d])));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  // Correctly rounded divisions, as the CPU store computes them (not the fast approximations).
  const float step = __fdiv_rn(amax, 7.0f);
  auto code = [&](int d) -> uint32_t {
    const float c = step > 0.0f ? fminf(7.0f, fmaxf(-7.0f, roundf(__fdiv_rn(__bfloat162float(k[d]), step)))) : 0.0f;
    return static_cast<uint32_t>(static_cast<int>(c) + 8);
  };
  if (lane < 4 * KS) {
    const int tig = lane / KS, ks = lane % KS;
    uint32_t w = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int d = ks * 32 + 4 * tig + b;
      w |= (code(d) | (code(d + 16) << 4)) << (8 * b);
    }
    uint32_t* dst = reinterpret_cast<uint32_t*>(p.codes + (static_cast<int64_t>(slot) * p.page_size + row) * (D / 2));
    dst[lane] = w;
  }
  if (lane == 0) p.steps[static_cast<int64_t>(slot) * p.page_size + row] = step;
}

}  // namespace

void launch_sketch_keys(const SketchKeysParams& p, cudaStream_t stream) {
  if (p.n_tok <= 0) return;
  const dim3 grid(static_cast<unsigned>(p.n_tok), static_cast<unsigned>(p.n_heads_kv));
  sketch_keys_kernel<<<grid, 32, 0, stream>>>(p);
  DHS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dhs::cuda
