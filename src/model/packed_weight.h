// Weight matrices repacked for the device's bandwidth GEMV (issue 25, quant_gemv v2): the same
// numbers as the model file (Q8_0, Q4_K) or FP8 E4M3 with one fp32 scale per output row, laid out
// so that one 16-byte copy brings whole tensor-core fragments. Host code: the device only copies
// these bytes, and unpack_row is the CPU statement of the weights the device multiplies.
//
// A row of `in` elements is cut into chunks of kPackChunk = 256 (the last one zero-padded: zero
// codes with zero scales add nothing). Planes, each row-major over (row, chunk):
//   codes [rows, chunks, code_bytes]   Q8_0 / FP8: 256 bytes, element e at byte e;
//                                      Q4_K: 128 bytes, 32-element group j at bytes 16j..16j+15,
//                                      and inside it the 4-byte word w holds elements 8w..8w+7 with
//                                      element i in nibble kNibbleOf[i] (so that
//                                      (word >> 4k) & 0x000F000F is the f16-ready pair (2k, 2k+1)).
//   meta  [rows, chunks, 16]           Q8_0: the 8 blocks' f16 scales d; Q4_K: the super-block's
//                                      16-byte header as the file holds it (f16 d, f16 dmin, 12
//                                      bytes of 6-bit scales and mins); FP8: absent.
//   row_scale [rows] fp32              FP8 only: w = row_scale * e4m3(code).
// Bytes per weight equal the file's (Q8_0 8.5 bits, Q4_K 4.5) up to the last chunk's padding;
// FP8 is 8 bits + 4 bytes per row.
#pragma once
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/packed_layout.h"

namespace dhs {

struct PackedMatrix {
  PackedFormat format = PackedFormat::Q8_0;
  int64_t rows = 0, in = 0;
  int64_t chunks = 0;              // ceil(in / kPackChunk)
  std::vector<uint8_t> codes;      // rows * chunks * packed_code_bytes(format)
  std::vector<uint8_t> meta;       // rows * chunks * kPackMetaBytes, or empty (FP8)
  std::vector<float> row_scale;    // rows (FP8), or empty

  size_t bytes() const { return codes.size() + meta.size() + 4 * row_scale.size(); }
};

// Whether a file's block format has a packed form (Q8_0, Q4_K).
bool packable(DType t);

// rows x in elements of type t as the file stores them (rows contiguous, dtype_row_bytes(t, in)
// each) -> the packed form of the same numbers. Throws dhs::Error for an unpackable type or an
// `in` that is not a multiple of the type's block.
PackedMatrix pack_rows(DType t, const uint8_t* data, int64_t rows, int64_t in);

// rows x in fp32 weights -> FP8 E4M3 codes with one scale per row: scale = max|w| / 448 (1 for an
// all-zero row), code = e4m3(w / scale) rounded to nearest even. Throws dhs::Error on a
// non-finite weight.
PackedMatrix quantize_fp8_rows(const float* w, int64_t rows, int64_t in);

// Row r's in weights in fp32 as the device reads them: Q8_0 d * q, Q4_K d*sc*q - dmin*m computed
// as dequant.cpp computes it, FP8 row_scale * e4m3(code).
void unpack_row(const PackedMatrix& m, int64_t r, float* dst);

// OCP FP8 E4M3 (the "fn" variant: no infinities, 0x7F / 0xFF NaN, max 448).
float e4m3_to_float(uint8_t code);
// Round to nearest (ties to an even code), saturating at +-448; x must not be NaN.
uint8_t float_to_e4m3(float x);

}  // namespace dhs
