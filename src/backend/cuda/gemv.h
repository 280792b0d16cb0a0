// Weight GEMMs of decode steps (a few rows of activations against a whole weight matrix) as a
// bandwidth-bound kernel: y[n_tok, out] (=|+=) x[n_tok, in] · W[out, in]^T for n_tok <= 8, f16
// in, fp32 accumulation. cuBLASLt (and PyTorch's cuBLAS) stream an 8B layer's weights at ~3.6
// TB/s on the H200, 79% of what a plain read kernel reaches (docs/benchmarks.md, weight GEMMs);
// no maintained library we can use here does better for these shapes, so this one is written by
// hand. Gemm::run (gemm.h) sends the shapes it supports here and everything else to cuBLASLt.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dhs::cuda {

struct GemvParams {
  const __half* w = nullptr;  // [out, in] row-major
  const __half* x = nullptr;  // [n_tok, in] row-major
  void* y = nullptr;                 // [n_tok, out]: f16 (y_f32 false) or fp32
  bool y_f32 = false;
  bool accumulate = false;           // fp32 only: y += x W^T (the residual stream)
  int n_tok = 0;                     // 1 .. kGemvMaxTok
  int64_t in = 0;                    // multiple of 8 (16-byte rows)
  int64_t out = 0;
};

inline constexpr int kGemvMaxTok = 8;

// Which kernel launch_gemv runs: the tensor-core one (gemv.cu) by default; the CUDA-core one and the
// ring shapes are for the benchmarks' A/B (Gemm::set_gemv_kernel, dhisparse bench --no-gemv-tc,
// --gemv-tc-shapes) and the tests.
// The tensor-core kernel's ring shape (warps per block, slots per warp, bytes per row piece):
// 0 (default) 8 x 3 x 256 B for 1-2 rows of activations and 4 x 4 x 256 B above; 1: 4 warps x 3
// slots x 256 B, 2: 4 x 4 x 256 B, 3: 4 x 2 x 512 B, 4: 8 x 3 x 256 B; 16-row blocks. Every shape is
// tested.
inline constexpr int kGemvTcShapes = 5;
struct GemvKernel {
  bool tensor_cores = true;  // false: the CUDA-core kernel
  int tc_shape = 0;          // the tensor-core kernel's ring shape, 0 .. kGemvTcShapes - 1
};

// Whether launch_gemv takes this shape (n_tok, in and the pointers' 16-byte alignment).
bool gemv_supported(const GemvParams& p);
// No checks beyond an assert of gemv_supported in debug builds; graph-capturable.
void launch_gemv(const GemvParams& p, cudaStream_t stream, const GemvKernel& kernel = {});

}  // namespace dhs::cuda
