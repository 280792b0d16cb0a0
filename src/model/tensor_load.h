// Reads one tensor of a WeightSource into fp32, after checking its shape and
// type: how every backend gets its weights (the CPU keeps fp32/fp16, the CUDA
// backend rounds to bf16).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/weight_source.h"

namespace dhs {

// The named tensor after the checks load_tensor_f32 makes (present, of this shape, of a type
// dequantize_row reads, not truncated); throws dhs::Error naming it otherwise. For backends
// that keep a tensor's own bytes.
const RawTensor& checked_tensor(const WeightSource& src, const std::string& name, const std::vector<int64_t>& shape);

// out: [prod(shape)] row-major. Throws dhs::Error naming the tensor when it is
// missing, mis-shaped, of an unsupported type or truncated. Rows dequantize in parallel.
std::vector<float> load_tensor_f32(const WeightSource& src, const std::string& name, const std::vector<int64_t>& shape);

}  // namespace dhs
