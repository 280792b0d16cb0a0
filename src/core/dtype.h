// Element types of stored tensors. Values equal ggml's type ids so that GGUF
// tensor infos map directly; safetensors dtypes map onto the float subset.
#pragma once
#include <cstdint>
#include <string_view>

namespace dhs {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
};

// Elements per block and bytes per block; {0, 0} for ids this project does not know.
struct DTypeTraits {
  int64_t block_elems;
  int64_t block_bytes;
  std::string_view name;
};

constexpr DTypeTraits dtype_traits(DType t) {
  switch (t) {
    case DType::F32: return {1, 4, "F32"};
    case DType::F16: return {1, 2, "F16"};
    case DType::BF16: return {1, 2, "BF16"};
    case DType::F64: return {1, 8, "F64"};
    case DType::I8: return {1, 1, "I8"};
    case DType::I16: return {1, 2, "I16"};
    case DType::I32: return {1, 4, "I32"};
    case DType::I64: return {1, 8, "I64"};
    case DType::Q4_0: return {32, 18, "Q4_0"};
    case DType::Q4_1: return {32, 20, "Q4_1"};
    case DType::Q5_0: return {32, 22, "Q5_0"};
    case DType::Q5_1: return {32, 24, "Q5_1"};
    case DType::Q8_0: return {32, 34, "Q8_0"};
    case DType::Q8_1: return {32, 36, "Q8_1"};
    case DType::Q2_K: return {256, 84, "Q2_K"};
    case DType::Q3_K: return {256, 110, "Q3_K"};
    case DType::Q4_K: return {256, 144, "Q4_K"};
    case DType::Q5_K: return {256, 176, "Q5_K"};
    case DType::Q6_K: return {256, 210, "Q6_K"};
    case DType::Q8_K: return {256, 292, "Q8_K"};
  }
  return {0, 0, "unknown"};
}

inline bool dtype_known(uint32_t id) { return dtype_traits(static_cast<DType>(id)).block_elems != 0; }

}  // namespace dhs
