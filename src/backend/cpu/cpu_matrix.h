// A weight matrix as the CPU backend stores it: [rows, cols] row-major, in fp32
// (exact, used as the test oracle) or fp16 (half the memory traffic; decode on
// this backend is bandwidth-bound). Quantized GGUF weights are dequantized to
// fp32 at load and then stored in the chosen type.
#pragma once
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace dhs {

enum class CpuWeightType { F32, F16 };

class CpuMatrix {
 public:
  CpuMatrix() = default;
  // src: [rows, cols] fp32.
  CpuMatrix(const float* src, int64_t rows, int64_t cols, CpuWeightType type);

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  CpuWeightType type() const { return type_; }
  bool empty() const { return rows_ == 0; }
  size_t n_bytes() const { return f32_.size() * 4 + f16_.size() * 2; }

  // dst: [cols] fp32 copy of row r.
  void row_to_f32(int64_t r, float* dst) const;
  const float* f32_data() const { return f32_.data(); }
  const uint16_t* f16_data() const { return f16_.data(); }

 private:
  int64_t rows_ = 0, cols_ = 0;
  CpuWeightType type_ = CpuWeightType::F32;
  std::vector<float> f32_;
  std::vector<uint16_t> f16_;
};

}  // namespace dhs
