// Embedding, residual add + RMSNorm, RoPE + K/V append and SwiGLU kernels; see ops.h.
// All memory-bound: one pass over their inputs, fp32 math, f16 rounding at the store.
#include "backend/cuda/ops.h"

#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl_launch.h"
#include "backend/cuda/ptx.cuh"

namespace dhs::cuda {

namespace {

// dhs::Error without fmt in a .cu file (nvcc 13 rejects fmt): cuda::check throws it.
void require(bool cond, const char* what) {
  if (!cond) check(cudaErrorInvalidValue, what, __FILE__, __LINE__);
}

bool is_act_dtype(DType t) { return t == DType::F32 || t == DType::F16; }

template <typename T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_f32<__half>(__half v) { return __half2float(v); }

// Sum over the block; every thread gets the same value (fixed order: deterministic).
__device__ float block_sum(float v, float* s_part /*[32]*/) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) s_part[warp] = v;
  __syncthreads();
  float r = 0.0f;
  const int n_warps = (blockDim.x + 31) >> 5;
  for (int w = 0; w < n_warps; ++w) r += s_part[w];
  return r;
}

// Threads per row for the norm kernels: ~4 elements each, a multiple of 32, <= 1024.
int norm_threads(int64_t n) {
  int64_t t = (n + 3) / 4;
  t = (t + 31) / 32 * 32;
  if (t < 32) t = 32;
  if (t > 1024) t = 1024;
  return static_cast<int>(t);
}

// ---- embedding ----------------------------------------------------------------

template <typename TOut, bool VEC>
__global__ void embedding_kernel(const __grid_constant__ EmbeddingParams p) {
  ptx::griddep_launch_dependents();  // (the step's first kernel: the first norm may be scheduled)
  TOut* out = static_cast<TOut*>(p.out);
  for (int64_t t = blockIdx.y; t < p.n_tok; t += gridDim.y) {
    const int32_t id = p.ids[t];
    const bool valid = id >= 0 && id < p.vocab;
    const __half* src = p.table + static_cast<int64_t>(valid ? id : 0) * p.hidden;
    TOut* dst = out + t * p.hidden;
    if constexpr (VEC) {
      // 8 f16 per 16-byte load; hidden % 8 == 0 and 16-byte aligned rows (checked by the launcher).
      const int64_t n8 = p.hidden / 8;
      for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n8;
           j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        uint4 raw = valid ? reinterpret_cast<const uint4*>(src)[j] : make_uint4(0, 0, 0, 0);
        if constexpr (sizeof(TOut) == 2) {
          reinterpret_cast<uint4*>(dst)[j] = raw;
        } else {
          const __half* h = reinterpret_cast<const __half*>(&raw);
          float4 a = make_float4(__half2float(h[0]), __half2float(h[1]), __half2float(h[2]),
                                 __half2float(h[3]));
          float4 b = make_float4(__half2float(h[4]), __half2float(h[5]), __half2float(h[6]),
                                 __half2float(h[7]));
          reinterpret_cast<float4*>(dst)[2 * j] = a;
          reinterpret_cast<float4*>(dst)[2 * j + 1] = b;
        }
      }
    } else {
      for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < p.hidden;
           j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const __half v = valid ? src[j] : __float2half_rn(0.0f);
        if constexpr (sizeof(TOut) == 2) dst[j] = v;
        else dst[j] = __half2float(v);
      }
    }
  }
}

// ---- add + RMSNorm -------------------------------------------------------------

template <typename TDelta>
__global__ void add_rms_norm_kernel(const __grid_constant__ AddRmsNormParams p) {
  __shared__ float s_part[32];
  ptx::griddep_wait();  // x is the previous kernel's output (pdl_launch.h)
  ptx::griddep_launch_dependents();
  const int64_t r = blockIdx.x;
  float* x = p.x + r * p.n;
  const TDelta* d = p.delta ? static_cast<const TDelta*>(p.delta) + r * p.n : nullptr;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) {
    float v = x[i];
    if (d) {
      v += to_f32(d[i]);
      x[i] = v;
    }
    ss += v * v;
  }
  ss = block_sum(ss, s_part);
  // Same expression as cpu::rms_norm (which sums in double; fp32 here is ~1e-6 relative).
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(p.n) + p.eps);
  __half* y = p.y + r * p.n;
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) y[i] = __float2half_rn(x[i] * inv * p.weight[i]);
}

template <typename TIn>
__global__ void rms_norm_kernel(const __grid_constant__ RmsNormParams p) {
  __shared__ float s_part[32];
  const int64_t r = blockIdx.x;
  const TIn* x = static_cast<const TIn*>(p.in) + r * p.n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) {
    const float v = to_f32(x[i]);
    ss += v * v;
  }
  ss = block_sum(ss, s_part);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(p.n) + p.eps);
  __half* y = p.out + r * p.n;
  // out may alias in: each element is read and written by the same thread.
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) y[i] = __float2half_rn(to_f32(x[i]) * inv * p.weight[i]);
}

// ---- RoPE + append -------------------------------------------------------------

constexpr int kRopeWarps = 8;  // (token, head) items per block, one warp each

template <int HEAD_DIM, typename TIn>
__global__ void __launch_bounds__(kRopeWarps * 32) rope_append_kernel(const __grid_constant__ RopeAppendParams p) {
  static_assert(HEAD_DIM % 64 == 0, "a lane holds HEAD_DIM / 64 rotation pairs");
  constexpr int kHalf = HEAD_DIM / 2;
  constexpr int kPairs = HEAD_DIM / 64;  // pairs per lane
  __shared__ float s_cos[kHalf], s_sin[kHalf];
  const int64_t t = blockIdx.x;
  const int32_t pos = p.pos[t];
  for (int i = threadIdx.x; i < kHalf; i += blockDim.x) {
    // NOTE: double: pos * inv_freq reaches 1.3e5 rad, where an fp32 angle is off by up to 2^-7.
    double s, c;
    sincos(static_cast<double>(pos) * static_cast<double>(p.inv_freq[i]), &s, &c);
    s_cos[i] = static_cast<float>(c);
    s_sin[i] = static_cast<float>(s);
  }
  // The angles above read only the step's inputs; q, k, v are the previous kernel's output
  // (pdl_launch.h).
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int item = blockIdx.y * kRopeWarps + warp;  // q heads, then k heads, then v heads
  const int n_items = p.n_heads_q + 2 * p.n_heads_kv;
  if (item >= n_items) return;
  const int kind = item < p.n_heads_q ? 0 : (item < p.n_heads_q + p.n_heads_kv ? 1 : 2);
  const int h = kind == 0 ? item : (kind == 1 ? item - p.n_heads_q : item - p.n_heads_q - p.n_heads_kv);
  const TIn* src;
  const float* bias;
  const float* norm_w;
  if (kind == 0) {
    src = static_cast<const TIn*>(p.q) + t * p.q_ld + h * HEAD_DIM;
    bias = p.q_bias ? p.q_bias + h * HEAD_DIM : nullptr;
    norm_w = p.q_norm;
  } else if (kind == 1) {
    src = static_cast<const TIn*>(p.k) + t * p.k_ld + h * HEAD_DIM;
    bias = p.k_bias ? p.k_bias + h * HEAD_DIM : nullptr;
    norm_w = p.k_norm;
  } else {
    src = static_cast<const TIn*>(p.v) + t * p.v_ld + h * HEAD_DIM;
    bias = p.v_bias ? p.v_bias + h * HEAD_DIM : nullptr;
    norm_w = nullptr;
  }

  // Lane owns pairs i = lane + 32 j: elements (i, i + HEAD_DIM/2) or (2i, 2i + 1).
  const bool half = p.style == RopeStyle::Half;
  int ia[kPairs], ib[kPairs];
  float x0[kPairs], x1[kPairs];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int i = lane + 32 * j;
    ia[j] = half ? i : 2 * i;
    ib[j] = half ? i + kHalf : 2 * i + 1;
    x0[j] = to_f32(src[ia[j]]);
    x1[j] = to_f32(src[ib[j]]);
    if (bias) {
      x0[j] += bias[ia[j]];
      x1[j] += bias[ib[j]];
    }
    ss += x0[j] * x0[j] + x1[j] * x1[j];
  }
  if (norm_w) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(HEAD_DIM) + p.norm_eps);
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      x0[j] = x0[j] * inv * norm_w[ia[j]];
      x1[j] = x1[j] * inv * norm_w[ib[j]];
    }
  }
  if (kind != 2) {
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const int i = lane + 32 * j;
      const float c = s_cos[i], s = s_sin[i];
      const float a = x0[j], b = x1[j];
      x0[j] = a * c - b * s;
      x1[j] = a * s + b * c;
    }
  }
  __half* dst;
  if (kind == 0) {
    dst = p.q_out + t * p.q_out_ld + h * HEAD_DIM;
  } else {
    const int32_t slot = p.dst_slot[t * p.n_heads_kv + h];
    if (slot < 0 || slot >= p.n_pages) return;
    const int row = pos % p.page_size;
    // NOTE: int64: a 128k-token pool holds more than 2^31 elements.
    const int64_t off = (static_cast<int64_t>(slot) * p.page_size + row) * HEAD_DIM;
    dst = (kind == 1 ? p.k_pool : p.v_pool) + off;
  }
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    dst[ia[j]] = __float2half_rn(x0[j]);
    dst[ib[j]] = __float2half_rn(x1[j]);
  }
}

// ---- SwiGLU ----------------------------------------------------------------------

template <typename TIn>
__global__ void swiglu_kernel(const __grid_constant__ SwiGluParams p) {
  ptx::griddep_wait();  // gate / up are the previous kernel's output (pdl_launch.h)
  ptx::griddep_launch_dependents();
  const TIn* gate = static_cast<const TIn*>(p.gate);
  const TIn* up = static_cast<const TIn*>(p.up);
  for (int64_t t = blockIdx.y; t < p.n_tok; t += gridDim.y) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < p.n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const float g = to_f32(gate[t * p.in_ld + i]);
      const float u = to_f32(up[t * p.in_ld + i]);
      // Same expression as cpu::silu_mul.
      p.out[t * p.out_ld + i] = __float2half_rn(g / (1.0f + expf(-g)) * u);
    }
  }
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

unsigned grid_y(int64_t n_tok) { return static_cast<unsigned>(n_tok < 65535 ? n_tok : 65535); }

}  // namespace

// ---- launchers -----------------------------------------------------------------------

void launch_embedding(const EmbeddingParams& p, cudaStream_t stream) {
  if (p.n_tok == 0) return;
  const bool vec = p.hidden % 8 == 0 && aligned16(p.table) && aligned16(p.out);
  const int64_t work = vec ? p.hidden / 8 : p.hidden;
  const int threads = 256;
  const dim3 grid(static_cast<unsigned>((work + threads - 1) / threads), grid_y(p.n_tok));
  if (p.out_dtype == DType::F32) {
    if (vec) embedding_kernel<float, true><<<grid, threads, 0, stream>>>(p);
    else embedding_kernel<float, false><<<grid, threads, 0, stream>>>(p);
  } else {
    if (vec) embedding_kernel<__half, true><<<grid, threads, 0, stream>>>(p);
    else embedding_kernel<__half, false><<<grid, threads, 0, stream>>>(p);
  }
  DHS_CUDA_CHECK(cudaGetLastError());
}

void embedding(const EmbeddingParams& p, cudaStream_t stream) {
  require(p.table && p.ids && p.out, "embedding: null pointer");
  require(p.n_tok >= 0 && p.vocab > 0 && p.hidden > 0, "embedding: bad shape");
  require(is_act_dtype(p.out_dtype), "embedding: out dtype must be F32 or F16");
  launch_embedding(p, stream);
}

void launch_add_rms_norm(const AddRmsNormParams& p, cudaStream_t stream) {
  if (p.n_rows == 0) return;
  const int threads = norm_threads(p.n);
  const dim3 grid(static_cast<unsigned>(p.n_rows));
  if (p.delta_dtype == DType::F32) launch_pdl(add_rms_norm_kernel<float>, grid, dim3(threads), 0, stream, p);
  else launch_pdl(add_rms_norm_kernel<__half>, grid, dim3(threads), 0, stream, p);
  DHS_CUDA_CHECK(cudaGetLastError());
}

void add_rms_norm(const AddRmsNormParams& p, cudaStream_t stream) {
  require(p.x && p.weight && p.y, "add_rms_norm: null pointer");
  require(p.n_rows >= 0 && p.n_rows < (int64_t{1} << 31) && p.n > 0, "add_rms_norm: bad shape");
  require(is_act_dtype(p.delta_dtype), "add_rms_norm: delta dtype must be F32 or F16");
  require(p.eps >= 0.0f, "add_rms_norm: eps must be >= 0");
  launch_add_rms_norm(p, stream);
}

void launch_rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.n_rows == 0) return;
  const int threads = norm_threads(p.n);
  if (p.in_dtype == DType::F32) rms_norm_kernel<float><<<static_cast<unsigned>(p.n_rows), threads, 0, stream>>>(p);
  else rms_norm_kernel<__half><<<static_cast<unsigned>(p.n_rows), threads, 0, stream>>>(p);
  DHS_CUDA_CHECK(cudaGetLastError());
}

void rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  require(p.in && p.weight && p.out, "rms_norm: null pointer");
  require(p.n_rows >= 0 && p.n_rows < (int64_t{1} << 31) && p.n > 0, "rms_norm: bad shape");
  require(is_act_dtype(p.in_dtype), "rms_norm: in dtype must be F32 or F16");
  require(p.in_dtype == DType::F16 || p.in != static_cast<const void*>(p.out), "rms_norm: fp32 in cannot alias f16 out");
  launch_rms_norm(p, stream);
}

// Runtime head_dim -> compile-time HEAD_DIM, in one place; unsupported values fail loudly.
#define DHS_DISPATCH_HEAD_DIM(hd, ...)                                        \
  switch (hd) {                                                               \
    case 64: { constexpr int HEAD_DIM = 64; __VA_ARGS__; break; }             \
    case 128: { constexpr int HEAD_DIM = 128; __VA_ARGS__; break; }           \
    case 256: { constexpr int HEAD_DIM = 256; __VA_ARGS__; break; }           \
    default: require(false, "rope_append: head_dim must be 64, 128 or 256"); \
  }

void launch_rope_append(const RopeAppendParams& p, cudaStream_t stream) {
  if (p.n_tok == 0) return;
  const int n_items = p.n_heads_q + 2 * p.n_heads_kv;
  const dim3 grid(static_cast<unsigned>(p.n_tok), static_cast<unsigned>((n_items + kRopeWarps - 1) / kRopeWarps));
  const int threads = kRopeWarps * 32;
  DHS_DISPATCH_HEAD_DIM(p.head_dim, {
    if (p.in_dtype == DType::F32) launch_pdl(rope_append_kernel<HEAD_DIM, float>, grid, dim3(threads), 0, stream, p);
    else launch_pdl(rope_append_kernel<HEAD_DIM, __half>, grid, dim3(threads), 0, stream, p);
  });
  DHS_CUDA_CHECK(cudaGetLastError());
}

void rope_append(const RopeAppendParams& p, cudaStream_t stream) {
  require(p.q && p.k && p.v && p.q_out && p.pos && p.inv_freq && p.dst_slot && p.k_pool && p.v_pool,
          "rope_append: null pointer");
  require(p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256, "rope_append: head_dim must be 64, 128 or 256");
  require(p.n_heads_q > 0 && p.n_heads_kv > 0 && p.n_heads_q % p.n_heads_kv == 0, "rope_append: bad head counts");
  require(p.n_tok >= 0 && p.n_tok < (int64_t{1} << 31) && p.page_size > 0 && p.n_pages > 0, "rope_append: bad shape");
  require(p.q_ld >= int64_t{p.n_heads_q} * p.head_dim && p.k_ld >= int64_t{p.n_heads_kv} * p.head_dim &&
              p.v_ld >= int64_t{p.n_heads_kv} * p.head_dim && p.q_out_ld >= int64_t{p.n_heads_q} * p.head_dim,
          "rope_append: leading dimension smaller than a token's heads");
  require(is_act_dtype(p.in_dtype), "rope_append: in dtype must be F32 or F16");
  require(p.in_dtype == DType::F16 || p.q != static_cast<const void*>(p.q_out), "rope_append: fp32 q cannot be rotated in place");
  require(p.q != static_cast<const void*>(p.q_out) || p.q_ld == p.q_out_ld, "rope_append: in-place q needs q_ld == q_out_ld");
  launch_rope_append(p, stream);
}

void launch_swiglu(const SwiGluParams& p, cudaStream_t stream) {
  if (p.n_tok == 0) return;
  const int threads = 256;
  const dim3 grid(static_cast<unsigned>((p.n + threads - 1) / threads), grid_y(p.n_tok));
  if (p.in_dtype == DType::F32) launch_pdl(swiglu_kernel<float>, grid, dim3(threads), 0, stream, p);
  else launch_pdl(swiglu_kernel<__half>, grid, dim3(threads), 0, stream, p);
  DHS_CUDA_CHECK(cudaGetLastError());
}

void swiglu(const SwiGluParams& p, cudaStream_t stream) {
  require(p.gate && p.up && p.out, "swiglu: null pointer");
  require(p.n_tok >= 0 && p.n > 0 && p.in_ld >= p.n && p.out_ld >= p.n, "swiglu: bad shape");
  require(is_act_dtype(p.in_dtype), "swiglu: in dtype must be F32 or F16");
  launch_swiglu(p, stream);
}

}  // namespace dhs::cuda
