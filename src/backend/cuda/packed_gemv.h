// The bandwidth GEMV for packed weights (quant_gemv v2, issue 25): Q8_0 and Q4_K as the file holds
// their numbers, FP8 E4M3 with per-row scales, in the layouts of core/packed_layout.h (made on
// the host by model/packed_weight.h). y = x W^T for 1-8 rows of f16 activations on tensor cores:
// the codes become f16 exactly (int8, 4-bit and E4M3 values all are f16 numbers) and go into
// mma.m16n8k16 with fp32 accumulation; each 32-element group's sum is then scaled in fp32
// (Q8_0 d, Q4_K d*sc and dmin*m against the group's sum of x), FP8's row scale at the end. So the
// product is of the file's weights as real numbers (Q4_K's d*sc*q - dmin*m not rounded to fp32
// first, as the CPU does); sums are fp32 in another order than the CPU's.
// llama.cpp's mmvq multiplies these formats with int8 activations; no maintained library does
// it with f16 activations and an fp32 accumulator, so this is written by hand.
// docs/kernels/quant_gemv_NOTES.md has the design and each version's measured time.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/packed_layout.h"

namespace dhs::cuda {

// A packed matrix in HBM (device pointers into one allocation).
struct PackedWeightView {
  PackedFormat format = PackedFormat::Q8_0;
  const uint8_t* codes = nullptr;   // [rows, chunks, packed_code_bytes], 16-byte aligned
  const uint8_t* meta = nullptr;    // [rows, chunks, 16] (Q8_0, Q4_K), 16-byte aligned
  const float* row_scale = nullptr; // [rows] (FP8)
  int64_t rows = 0, in = 0, chunks = 0;
};

struct PackedGemvParams {
  PackedWeightView w;
  const __half* x = nullptr;  // [n_tok, in], rows contiguous, 16-byte aligned (in % 8 == 0)
  void* y = nullptr;          // y[t * ldy + o] for o < rows: f16 (y_f32 false) or fp32
  int64_t ldy = 0;            // >= rows
  bool y_f32 = false;
  bool accumulate = false;    // fp32 only: y += x W^T
  int n_tok = 0;              // 1 .. 8
  // The block's form (0: chosen by the matrix's size and the SM count, docs/kernels/quant_gemv_NOTES.md);
  // tests and sweeps pin one: 1 = one 16-row tile, 4 warps; 2 = one tile, 8 warps; 3 = two tiles
  // (32 rows), 4 warps; Q4_K also 4 = one tile, 8 warps, 3 blocks per SM, 5 = two tiles, 4 warps,
  // the activations loaded into registers instead of staged, 6 = one tile, 16 warps, 2-slot
  // rings (as 2 where two such blocks would not fit an SM). Every form computes the same sums.
  int shape = 0;
};

// Block forms a format has: shape < packed_shapes(format).
constexpr int packed_shapes(PackedFormat f) { return f == PackedFormat::Q4_K ? 7 : 4; }

// Checks the params (throws dhs::Error naming what is wrong); graph-capturable; launched with
// programmatic dependent launch (pdl_launch.h).
void launch_packed_gemv(const PackedGemvParams& p, cudaStream_t stream);

// Every weight as f16: dst[r * ld_dst + i] = f16(w[r, i]) for i < in, w as model/packed_weight's
// unpack_row computes it (fp32, then rounded to nearest even). The prefill path's GEMM input.
void launch_unpack_rows(const PackedWeightView& w, __half* dst, int64_t ld_dst, cudaStream_t stream);

// Random packed weights for the speed benchmarks (values do not change a kernel's speed): codes
// uniform (FP8: finite, even exponent fields, |code| <= 240), scales so that |w| <= about a
// (Q8_0 d = a / 127, so |w| <= 128 a / 127; Q4_K d = a / 945, dmin = a / 126 with random 6-bit
// scales and mins; FP8 row scale a / 240).
// The view's planes are written (they are the caller's allocation).
void fill_random_packed(const PackedWeightView& w, uint64_t seed, float a, cudaStream_t stream);

// Bytes the packed matrix holds (codes + meta + row scales).
size_t packed_bytes(const PackedWeightView& w);

}  // namespace dhs::cuda
