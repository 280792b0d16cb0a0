// Weight GEMMs: y[n_tok, out] = x[n_tok, in] · W[out, in]^T, f16 inputs, fp32
// accumulation, f16 or fp32 output. Shapes of n_tok <= gemv_max_tok (default 8: decode steps up
// to batch 8) go to a bandwidth-bound kernel of our own (gemv.h), the rest to cuBLASLt. Plans (layouts + the
// heuristic's algorithm) are cached per shape; the workspace is allocated once,
// so calls are graph-capturable.
#pragma once
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "backend/cuda/device_weight.h"
#include "backend/cuda/gemv.h"

namespace dhs::cuda {

enum class GemmOut { F16, F32 };

class Gemm {
 public:
  explicit Gemm(size_t workspace_bytes = 32u << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // w_d: [out, in] f16 row-major; x_d: [n_tok, in] f16; y_d: [n_tok, out] (f16 or fp32).
  // beta = 1 accumulates into y (fp32 output only; residual adds).
  void run(const __half* w_d, const __half* x_d, void* y_d, int64_t n_tok, int64_t in,
           int64_t out, GemmOut out_type, cudaStream_t stream, float beta = 0.0f);
  // The same product for a weight kept in its file's formats (device_weight.h): a plain f16
  // matrix as above; otherwise up to kQuantTileRows rows of activations through the quantized
  // GEMV (quant_gemv.h), 8 rows per launch and one launch per part, and more rows by
  // dequantizing every part into the scratch (reserve_dequant) and cuBLASLt on it: the weights
  // are then written and read once more as f16, which costs less than re-reading them per 8
  // rows once the batch passes ~64 rows.
  void run(const DeviceWeight& w, const __half* x_d, void* y_d, int64_t n_tok, GemmOut out_type, cudaStream_t stream,
           float beta = 0.0f);
  static constexpr int64_t kQuantTileRows = 64;
  // The dequantization scratch: f16 elements for the largest non-plain matrix used with more
  // than kQuantTileRows rows. Call before graph capture.
  void reserve_dequant(size_t elems);
  // Rows of activations up to which gemv.h is used (0: every shape through cuBLASLt; at most
  // kGemvMaxTok). Measured: docs/kernels/ops_NOTES.md.
  void set_gemv_max_tok(int n) { gemv_max_tok_ = n; }
  // Which GEMV kernel those shapes run (default: the tensor-core one; the benchmarks' A/B).
  // Graphs keep the kernels they captured.
  void set_gemv_kernel(const GemvKernel& k) { gemv_kernel_ = k; }
  const GemvKernel& gemv_kernel() const { return gemv_kernel_; }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  const Plan& plan(int64_t n_tok, int64_t in, int64_t out, GemmOut out_type, float beta);

  cublasLtHandle_t lt_ = nullptr;
  void* workspace_d_ = nullptr;
  size_t workspace_bytes_;
  std::map<std::tuple<int64_t, int64_t, int64_t, int, bool>, Plan> plans_;
  int gemv_max_tok_ = 8;
  __half* scratch_d_ = nullptr;
  size_t scratch_elems_ = 0;
  GemvKernel gemv_kernel_;
};

}  // namespace dhs::cuda
