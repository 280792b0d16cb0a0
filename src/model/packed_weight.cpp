#include "model/packed_weight.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "model/dequant.h"

namespace dhs {

namespace {

constexpr int64_t kQ8Block = 34;   // f16 d, int8 q[32]
constexpr int64_t kQ4KBlock = 144; // f16 d, f16 dmin, scales[12], qs[128]

// Element e (0..255) of a Q4_K super-block's qs: group of 64 c = e / 64, low nibbles the first
// 32 of it, high nibbles the next 32 (dequant.cpp).
uint8_t q4k_code(const uint8_t* qs, int e) {
  const int c = e / 64, l = e % 32;
  const uint8_t b = qs[32 * c + l];
  return (e % 64) < 32 ? (b & 0x0F) : (b >> 4);
}

void set_q4k_code(uint8_t* qs, int e, uint8_t q) {
  const int c = e / 64, l = e % 32;
  uint8_t& b = qs[32 * c + l];
  if ((e % 64) < 32) b = static_cast<uint8_t>((b & 0xF0) | q);
  else b = static_cast<uint8_t>((b & 0x0F) | (q << 4));
}

// Packed Q4_K: element e of a chunk -> (byte, shift) in its 128 code bytes.
void q4k_packed_at(int e, int& byte, int& shift) {
  const int j = e / 32, in_j = e % 32, word = in_j / 8, i = in_j % 8;
  const int nib = kNibbleOf[static_cast<size_t>(i)];
  byte = 16 * j + 4 * word + nib / 2;
  shift = 4 * (nib % 2);
}

// The file's bytes of row r, chunk c (one Q4_K super-block, or 8 Q8_0 blocks with zero blocks
// past the row's end), rebuilt from the packed planes: the CPU dequantizer then says what they
// hold.
void rebuild_chunk(const PackedMatrix& m, int64_t r, int64_t c, uint8_t* blocks) {
  const uint8_t* codes = m.codes.data() + (r * m.chunks + c) * packed_code_bytes(m.format);
  const uint8_t* meta = m.meta.data() + (r * m.chunks + c) * kPackMetaBytes;
  if (m.format == PackedFormat::Q8_0) {
    for (int b = 0; b < 8; ++b) {
      std::memcpy(blocks + kQ8Block * b, meta + 2 * b, 2);
      std::memcpy(blocks + kQ8Block * b + 2, codes + 32 * b, 32);
    }
    return;
  }
  std::memcpy(blocks, meta, kPackMetaBytes);
  uint8_t* qs = blocks + kPackMetaBytes;
  std::memset(qs, 0, 128);
  for (int e = 0; e < 256; ++e) {
    int byte, shift;
    q4k_packed_at(e, byte, shift);
    set_q4k_code(qs, e, static_cast<uint8_t>((codes[byte] >> shift) & 0x0F));
  }
}

}  // namespace

bool packable(DType t) { return t == DType::Q8_0 || t == DType::Q4_K; }

PackedMatrix pack_rows(DType t, const uint8_t* data, int64_t rows, int64_t in) {
  DHS_CHECK(packable(t), "no packed form for {}", dtype_traits(t).name);
  DHS_CHECK(rows >= 0 && in > 0 && in % dtype_traits(t).block_elems == 0, "cannot pack {} x {} of {}", rows, in,
            dtype_traits(t).name);
  PackedMatrix m;
  m.format = t == DType::Q8_0 ? PackedFormat::Q8_0 : PackedFormat::Q4_K;
  m.rows = rows;
  m.in = in;
  m.chunks = (in + kPackChunk - 1) / kPackChunk;
  const int64_t cb = packed_code_bytes(m.format);
  m.codes.assign(static_cast<size_t>(rows * m.chunks * cb), 0);
  m.meta.assign(static_cast<size_t>(rows * m.chunks * kPackMetaBytes), 0);
  const size_t row_bytes = dtype_row_bytes(t, in);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* src = data + static_cast<size_t>(r) * row_bytes;
    for (int64_t c = 0; c < m.chunks; ++c) {
      uint8_t* codes = m.codes.data() + (r * m.chunks + c) * cb;
      uint8_t* meta = m.meta.data() + (r * m.chunks + c) * kPackMetaBytes;
      if (m.format == PackedFormat::Q8_0) {
        for (int64_t b = 0; b < 8 && 256 * c + 32 * b < in; ++b) {
          const uint8_t* blk = src + kQ8Block * (8 * c + b);
          std::memcpy(meta + 2 * b, blk, 2);
          std::memcpy(codes + 32 * b, blk + 2, 32);
        }
      } else {
        const uint8_t* blk = src + kQ4KBlock * c;
        std::memcpy(meta, blk, kPackMetaBytes);
        for (int e = 0; e < 256; ++e) {
          int byte, shift;
          q4k_packed_at(e, byte, shift);
          codes[byte] = static_cast<uint8_t>(codes[byte] | (q4k_code(blk + kPackMetaBytes, e) << shift));
        }
      }
    }
  }
  return m;
}

float e4m3_to_float(uint8_t code) {
  const int s = code >> 7, e = (code >> 3) & 0xF, mant = code & 7;
  if (e == 15 && mant == 7) return std::nanf("");
  const float mag = e == 0 ? std::ldexp(static_cast<float>(mant), -9) : std::ldexp(1.0f + mant / 8.0f, e - 7);
  return s ? -mag : mag;
}

uint8_t float_to_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  if (a >= 448.0f) return sign | 0x7E;
  // The representable magnitudes are k * 2^(e-3) for the binade of a (e >= -6; below it the
  // subnormal step 2^-9): round a to that step, ties to even (std::nearbyint in the default
  // mode), and re-encode; a rounding that carries into the next binade lands on its first value.
  int e = 0;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1): the binade's exponent is e - 1
  const int step_exp = std::max(e - 1, -6) - 3;
  const float k = std::nearbyint(std::ldexp(a, -step_exp));  // a / step, an integer <= 16
  const float v = std::ldexp(k, step_exp);
  if (v >= 448.0f) return sign | 0x7E;
  if (v == 0.0f) return sign;
  int ve = 0;
  std::frexp(v, &ve);
  const int be = ve - 1;  // v in [2^be, 2^(be+1))
  if (be < -6) return sign | static_cast<uint8_t>(std::ldexp(v, 9));  // subnormal: v = m * 2^-9
  const int mant = static_cast<int>(std::ldexp(v, -be) * 8.0f) - 8;
  return sign | static_cast<uint8_t>(((be + 7) << 3) | mant);
}

PackedMatrix quantize_fp8_rows(const float* w, int64_t rows, int64_t in) {
  DHS_CHECK(rows >= 0 && in > 0, "cannot quantize {} x {} to FP8", rows, in);
  PackedMatrix m;
  m.format = PackedFormat::FP8;
  m.rows = rows;
  m.in = in;
  m.chunks = (in + kPackChunk - 1) / kPackChunk;
  m.codes.assign(static_cast<size_t>(rows * m.chunks * kPackChunk), 0);
  m.row_scale.assign(static_cast<size_t>(rows), 1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = w + r * in;
    float amax = 0.0f;
    for (int64_t i = 0; i < in; ++i) {
      DHS_CHECK(std::isfinite(row[i]), "FP8 quantization: weight {} of row {} is not finite", i, r);
      amax = std::max(amax, std::fabs(row[i]));
    }
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    m.row_scale[static_cast<size_t>(r)] = scale;
    uint8_t* codes = m.codes.data() + r * m.chunks * kPackChunk;
    for (int64_t i = 0; i < in; ++i) codes[i] = float_to_e4m3(row[i] / scale);
  }
  return m;
}

void unpack_row(const PackedMatrix& m, int64_t r, float* dst) {
  DHS_CHECK(r >= 0 && r < m.rows, "row {} of a {}-row packed matrix", r, m.rows);
  if (m.format == PackedFormat::FP8) {
    const uint8_t* codes = m.codes.data() + r * m.chunks * kPackChunk;
    const float s = m.row_scale[static_cast<size_t>(r)];
    for (int64_t i = 0; i < m.in; ++i) dst[i] = s * e4m3_to_float(codes[i]);
    return;
  }
  const DType t = m.format == PackedFormat::Q8_0 ? DType::Q8_0 : DType::Q4_K;
  uint8_t blocks[8 * kQ8Block > kQ4KBlock ? 8 * kQ8Block : kQ4KBlock];
  float vals[kPackChunk];
  for (int64_t c = 0; c < m.chunks; ++c) {
    rebuild_chunk(m, r, c, blocks);
    dequantize_row(t, blocks, vals, kPackChunk);
    const int64_t n = std::min(kPackChunk, m.in - c * kPackChunk);
    std::memcpy(dst + c * kPackChunk, vals, static_cast<size_t>(n) * 4);
  }
}

}  // namespace dhs
