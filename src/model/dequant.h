// Dequantization of stored tensor rows to fp32 (the CPU reference for every
// GGUF block format we load). Block layouts follow ggml's public format spec.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace dhs {

// Bytes that n elements of type t occupy. Throws dhs::Error if t is unsupported
// or n is not a multiple of the block size.
size_t dtype_row_bytes(DType t, int64_t n);

// Whether dequantize_row supports t (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K).
bool dequant_supported(DType t);

// src: n elements of type t (dtype_row_bytes(t, n) bytes); dst: [n] fp32.
// Throws dhs::Error for unsupported t or n not a multiple of the block size.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

}  // namespace dhs
