// Gathers rows of an fp32 matrix by index: the last token of each request
// before the final norm and the logits GEMM.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dhs::cuda {

struct GatherRowsParams {
  const float* src = nullptr;     // [n_src_rows, n]
  const int32_t* rows = nullptr;  // [n_out] indices into src
  float* dst = nullptr;           // [n_out, n]
  int64_t n_out = 0;
  int64_t n = 0;
};
void launch_gather_rows(const GatherRowsParams& p, cudaStream_t stream);

}  // namespace dhs::cuda
