// Weights kept in their GGUF block formats in HBM (issue 25): a decode GEMV that dequantizes in
// registers, and a dequantizer to f16 rows (the prefill path's GEMM input).
//
// Each weight is computed in fp32 exactly as the CPU's dequantize_row (model/dequant.h) computes
// it, by the same operations in the same order (products of a block scale and a code are exact
// in fp32 there and here), so the GEMV multiplies the file's own numbers: y = x W^T with f16
// activations and fp32 accumulation. No maintained library multiplies these formats with an f32
// accumulator against f16 activations (llama.cpp's mmvq quantizes the activations to int8), so
// this is written by hand.
//
// Layout: row r of a matrix starts at w + r * row_stride (bytes); a row holds in / block_elems
// blocks exactly as the file stores them; row_stride is a multiple of 16 (rows are padded at
// upload), so F16 rows load as 16-byte words. v1: CUDA cores, one lane per 32-weight group, each
// group decoded in pieces of 8 (docs/kernels/quant_gemv_NOTES.md).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace dhs::cuda {

// The formats the kernels read: F16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K.
bool quant_format_supported(DType t);

struct QuantGemvParams {
  DType type = DType::F16;
  const uint8_t* w = nullptr;  // [out] rows of row_stride bytes
  int64_t row_stride = 0;      // bytes, multiple of 16
  const __half* x = nullptr;   // [n_tok, in], 16-byte aligned
  void* y = nullptr;           // y[t * ldy + o] for o < out: f16 (y_f32 false) or fp32
  int64_t ldy = 0;             // >= out (a part of a fused matrix writes its own columns)
  bool y_f32 = false;
  bool accumulate = false;     // fp32 only: y += x W^T
  int n_tok = 0;               // 1 .. kQuantGemvMaxTok
  int64_t in = 0;              // a multiple of the format's block (32, or 256 for K-quants)
  int64_t out = 0;
};

inline constexpr int kQuantGemvMaxTok = 8;

// Checks the params (throws dhs::Error naming what is wrong); graph-capturable.
void launch_quant_gemv(const QuantGemvParams& p, cudaStream_t stream);

// rows x in weights of `type` -> dst[r * ld_dst + i] = f16(weight) (the CPU's fp32 value rounded
// to nearest even f16). Graph-capturable.
void launch_dequant_rows(DType type, const uint8_t* w, int64_t row_stride, int64_t rows, int64_t in, __half* dst,
                         int64_t ld_dst, cudaStream_t stream);

}  // namespace dhs::cuda
