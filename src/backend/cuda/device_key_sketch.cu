// Per-token 4-bit key sketch; see device_key_sketch.h.
#include "backend/cuda/device_key_sketch.h"

#include <cuda_fp16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl_launch.h"
#include "backend/cuda/ptx.cuh"

namespace dhs::cuda {

DeviceKeySketch::DeviceKeySketch(int64_t n_pages, int page_size, int head_dim)
    : n_pages_(n_pages), page_size_(page_size), head_dim_(head_dim) {
  if (n_pages <= 0 || page_size <= 0 || !(head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256))
    check(cudaErrorInvalidValue, "DeviceKeySketch: bad shape (code dims must be 32, 64, 128 or 256)", __FILE__, __LINE__);
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

// One warp per (token, KV head): the row (or its projection B (k - mean)) staged in shared
// memory, its absmax, then one lane per packed 32-bit word.
__global__ void __launch_bounds__(32) sketch_keys_kernel(const __grid_constant__ SketchKeysParams p) {
  __shared__ float s_row[256];
  ptx::griddep_wait();  // the pool rows are the previous kernels' output (pdl_launch.h)
  ptx::griddep_launch_dependents();
  const int64_t t = blockIdx.x;
  const int h = static_cast<int>(blockIdx.y);
  const int lane = static_cast<int>(threadIdx.x);
  const int32_t slot = p.dst_slot[t * p.n_heads_kv + h];
  if (slot < 0 || slot >= p.n_pages) return;
  const int row = p.pos[t] % p.page_size;
  const int D = p.head_dim;
  const __half* k = p.k_pool + (static_cast<int64_t>(slot) * p.page_size + row) * D;
  const int C = p.basis != nullptr ? p.code_dims : D;  // entries per code row
  const int KS = C / 32;
  if (p.basis != nullptr) {
    // y_r = B_r . (k - mean): one fp32 fma chain over d ascending, k - mean rounded first (the
    // CPU's KeyBasis::project_key, so that both quantize the same y).
    for (int d = lane; d < D; d += 32) s_row[d] = __fsub_rn(__half2float(k[d]), p.basis_mean[h * D + d]);
    __syncwarp();
    float y[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) y[i] = 0.0f;
    const float* b = p.basis + static_cast<int64_t>(h) * C * D;
    for (int d = 0; d < D; ++d) {
      const float x = s_row[d];
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (lane + 32 * i < C) y[i] = __fmaf_rn(b[(lane + 32 * i) * D + d], x, y[i]);
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (lane + 32 * i < C) s_row[lane + 32 * i] = y[i];
  } else {
    for (int d = lane; d < D; d += 32) s_row[d] = __half2float(k[d]);
  }
  __syncwarp();
  float amax = 0.0f;
  for (int d = lane; d < C; d += 32) amax = fmaxf(amax, fabsf(s_row[d]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  // Correctly rounded divisions, as the CPU store computes them (not the fast approximations).
  const float step = __fdiv_rn(amax, 7.0f);
  auto code = [&](int d) -> uint32_t {
    const float c = step > 0.0f ? fminf(7.0f, fmaxf(-7.0f, roundf(__fdiv_rn(s_row[d], step)))) : 0.0f;
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
    uint32_t* dst = reinterpret_cast<uint32_t*>(p.codes + (static_cast<int64_t>(slot) * p.page_size + row) * (C / 2));
    dst[lane] = w;
  }
  if (lane == 0) p.steps[static_cast<int64_t>(slot) * p.page_size + row] = step;
}

// One warp per (row, q head); lane r computes coordinates r, r + 32, ... of B q.
__global__ void __launch_bounds__(32) project_queries_kernel(const __grid_constant__ ProjectQueriesParams p) {
  __shared__ float s_q[256];
  const int64_t row = blockIdx.x;
  const int hq = static_cast<int>(blockIdx.y), lane = static_cast<int>(threadIdx.x);
  const int D = p.head_dim, R = p.rank;
  const __half* q = p.q + (row * p.n_heads_q + hq) * D;
  for (int d = lane; d < D; d += 32) s_q[d] = __half2float(q[d]);
  __syncwarp();
  const int hk = hq / (p.n_heads_q / p.n_heads_kv);
  const float* b = p.basis + static_cast<int64_t>(hk) * R * D;
  for (int r = lane; r < R; r += 32) {
    float acc = 0.0f;  // the fma chain of KeyBasis::project_query
    for (int d = 0; d < D; ++d) acc = __fmaf_rn(b[r * D + d], s_q[d], acc);
    p.qp[(row * p.n_heads_q + hq) * R + r] = __float2half_rn(acc);
  }
}

}  // namespace

void launch_sketch_keys(const SketchKeysParams& p, cudaStream_t stream) {
  if (p.n_tok <= 0) return;
  if (p.head_dim < 32 || p.head_dim > 256 || p.head_dim % 32 != 0)  // (the row is staged in a 256-float buffer)
    check(cudaErrorInvalidValue, "sketch_keys: head_dim must be a multiple of 32 up to 256", __FILE__, __LINE__);
  if (p.basis != nullptr && (p.code_dims % 32 != 0 || p.code_dims < 32 || p.code_dims > 256 || p.basis_mean == nullptr))
    check(cudaErrorInvalidValue, "sketch_keys: a key basis needs code_dims in {32, 64, ..., 256} and its mean", __FILE__,
          __LINE__);
  const dim3 grid(static_cast<unsigned>(p.n_tok), static_cast<unsigned>(p.n_heads_kv));
  launch_pdl(sketch_keys_kernel, grid, dim3(32), 0, stream, p);
  DHS_CUDA_CHECK(cudaGetLastError());
}

void launch_project_queries(const ProjectQueriesParams& p, cudaStream_t stream) {
  if (p.n_rows <= 0) return;
  if (p.rank < 1 || p.rank > 256 || p.head_dim < 1 || p.head_dim > 256 || p.n_heads_kv < 1 || p.n_heads_q < 1 ||
      p.n_heads_q % p.n_heads_kv != 0)
    check(cudaErrorInvalidValue, "project_queries: bad shape", __FILE__, __LINE__);
  const dim3 grid(static_cast<unsigned>(p.n_rows), static_cast<unsigned>(p.n_heads_q));
  project_queries_kernel<<<grid, 32, 0, stream>>>(p);
  DHS_CUDA_CHECK(cudaGetLastError());
}

DeviceKeyBasis::DeviceKeyBasis(int n_layers, int n_heads_kv, int head_dim, int rank, const float* basis, const float* mean,
                               const float* query_basis)
    : n_layers_(n_layers), n_heads_kv_(n_heads_kv), head_dim_(head_dim), rank_(rank) {
  if (n_layers < 1 || n_heads_kv < 1 || head_dim < 1 || head_dim > 256 || rank < 1 || rank > head_dim)
    check(cudaErrorInvalidValue, "DeviceKeyBasis: bad shape", __FILE__, __LINE__);
  const size_t nb = static_cast<size_t>(n_layers) * n_heads_kv * rank * head_dim, nm = static_cast<size_t>(n_layers) * n_heads_kv * head_dim;
  DHS_CUDA_CHECK(cudaMalloc(&basis_d_, nb * 4));
  DHS_CUDA_CHECK(cudaMalloc(&mean_d_, nm * 4));
  DHS_CUDA_CHECK(cudaMemcpy(basis_d_, basis, nb * 4, cudaMemcpyHostToDevice));
  DHS_CUDA_CHECK(cudaMemcpy(mean_d_, mean, nm * 4, cudaMemcpyHostToDevice));
  if (query_basis != nullptr) {
    DHS_CUDA_CHECK(cudaMalloc(&qbasis_d_, nb * 4));
    DHS_CUDA_CHECK(cudaMemcpy(qbasis_d_, query_basis, nb * 4, cudaMemcpyHostToDevice));
  }
}

DeviceKeyBasis::~DeviceKeyBasis() {
  cudaFree(basis_d_);
  cudaFree(mean_d_);
  cudaFree(qbasis_d_);
}

}  // namespace dhs::cuda
