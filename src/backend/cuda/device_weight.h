// A weight matrix in HBM: [out, in] in up to three row ranges (the parts of a fused projection:
// q, k, v or gate, up), each in its own format: F16 or a GGUF block format as the file holds it
// (quant_gemv.h, v1), or packed (packed_gemv.h, v2: Q8_0 and Q4_K repacked, FP8). A matrix whose
// rows are all f16 and contiguous is "plain" and takes the tensor-core GEMV and cuBLASLt directly
// (Gemm::run).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/packed_gemv.h"
#include "core/dtype.h"

namespace dhs::cuda {

struct WeightPart {
  DType type = DType::F16;
  const uint8_t* data = nullptr;  // rows x row_stride bytes (not packed)
  int64_t rows = 0;
  int64_t row_stride = 0;         // bytes (a multiple of 16)
  bool packed = false;            // then `pk` describes it and type/data/row_stride are unused
  PackedWeightView pk;
};

struct DeviceWeight {
  static constexpr int kMaxParts = 3;
  int64_t out = 0, in = 0;  // the parts' rows add up to out
  int n_parts = 0;
  WeightPart part[kMaxParts];
  size_t bytes = 0;         // HBM the parts hold

  bool plain_f16() const {
    return n_parts == 1 && !part[0].packed && part[0].type == DType::F16 && part[0].row_stride == 2 * in;
  }
  const __half* f16() const { return reinterpret_cast<const __half*>(part[0].data); }
  static DeviceWeight f16_matrix(const __half* d, int64_t out, int64_t in) {
    DeviceWeight w;
    w.out = out;
    w.in = in;
    w.n_parts = 1;
    w.part[0] = {DType::F16, reinterpret_cast<const uint8_t*>(d), out, 2 * in, false, {}};
    w.bytes = static_cast<size_t>(out * in) * 2;
    return w;
  }
};

}  // namespace dhs::cuda
