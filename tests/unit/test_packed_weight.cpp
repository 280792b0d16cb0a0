// The packed weight layouts the device GEMV reads (model/packed_weight.h): FP8 E4M3 against a
// brute-force nearest search over every code; Q8_0 / Q4_K packing against the CPU dequantizer of
// the file's own rows, and the Q4_K nibble order against the device's decode rule written out
// from the header's statement.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "model/dequant.h"
#include "model/packed_weight.h"

namespace dhs {
namespace {

TEST(E4M3, KnownCodes) {
  EXPECT_EQ(e4m3_to_float(0x00), 0.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_float(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);                // largest finite
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
}

TEST(E4M3, EveryFiniteCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    const float v = e4m3_to_float(static_cast<uint8_t>(c));
    EXPECT_EQ(float_to_e4m3(v), c == 0x80 ? 0x80 : c) << "code " << c << " value " << v;
  }
}

// The nearest finite code by exhaustive search; a tie goes to the even code (mantissa bit 0 clear).
uint8_t nearest_e4m3(float x) {
  int best = -1;
  double best_d = 0;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    if (std::signbit(x) != ((c & 0x80) != 0)) continue;
    const double d = std::fabs(static_cast<double>(e4m3_to_float(static_cast<uint8_t>(c))) - x);
    if (best < 0 || d < best_d || (d == best_d && (c & 1) == 0)) best = c, best_d = d;
  }
  return static_cast<uint8_t>(best);
}

TEST(E4M3, RoundsToNearestEvenAndSaturates) {
  std::mt19937 rng(7);
  std::vector<float> xs;
  for (int c = 0; c < 0x7E; ++c) {  // every midpoint between neighbours (the ties), and near them
    const float a = e4m3_to_float(static_cast<uint8_t>(c)), b = e4m3_to_float(static_cast<uint8_t>(c + 1));
    const float mid = 0.5f * (a + b);
    xs.insert(xs.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), a, b});
  }
  std::uniform_real_distribution<float> ex(-14.0f, 10.0f);
  for (int i = 0; i < 20000; ++i) xs.push_back(std::exp2(ex(rng)));
  xs.insert(xs.end(), {448.0f, 464.0f, 1e6f, 1e-12f});
  for (const float x : xs) {
    for (const float s : {x, -x}) {
      const uint8_t want = std::fabs(s) >= 448.0f ? (s < 0 ? 0xFE : 0x7E) : nearest_e4m3(s);
      ASSERT_EQ(float_to_e4m3(s), want) << "x = " << s;
    }
  }
}

TEST(PackedFp8, ScalesEachRowToItsMaximum) {
  const int64_t rows = 3, in = 300;  // not a multiple of the 256-element chunk
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(rows * in));
  for (auto& v : w) v = nd(rng);
  for (int64_t i = 0; i < in; ++i) w[static_cast<size_t>(2 * in + i)] = 0.0f;  // an all-zero row
  w[17] = -0.5f;                                                                 // row 0's max, negative
  const PackedMatrix m = quantize_fp8_rows(w.data(), rows, in);
  ASSERT_EQ(m.chunks, 2);
  ASSERT_EQ(m.codes.size(), static_cast<size_t>(rows * 2 * 256));
  EXPECT_TRUE(m.meta.empty());
  EXPECT_EQ(m.row_scale[0], 0.5f / 448.0f);
  EXPECT_EQ(m.codes[17], 0xFE);  // -448
  EXPECT_EQ(m.row_scale[2], 1.0f);
  std::vector<float> got(static_cast<size_t>(in));
  for (int64_t r = 0; r < rows; ++r) {
    unpack_row(m, r, got.data());
    const float s = m.row_scale[static_cast<size_t>(r)];
    for (int64_t i = 0; i < in; ++i) {
      const float x = w[static_cast<size_t>(r * in + i)];
      // 3 mantissa bits: half a step is 2^-4 of the value for normals; below 2^-6 (scaled) the
      // subnormal step 2^-9 * scale, half of it absolute.
      const float tol = std::max(std::fabs(x) * 0.0625f, s * std::ldexp(1.0f, -10));
      ASSERT_NEAR(got[static_cast<size_t>(i)], x, tol) << "row " << r << " element " << i;
      ASSERT_EQ(got[static_cast<size_t>(i)], s * e4m3_to_float(float_to_e4m3(x / s)));
    }
    for (int64_t i = in; i < 512; ++i) ASSERT_EQ(m.codes[static_cast<size_t>(r * 512 + i)], 0) << "padding";
  }
}

TEST(PackedFp8, RefusesNonFiniteWeights) {
  std::vector<float> w(64, 0.1f);
  w[5] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(quantize_fp8_rows(w.data(), 2, 32), Error);
}

// Random rows in a block format with finite scales: random bytes, each block's f16 scale(s)
// replaced by a value in [-0.1, 0.1].
std::vector<uint8_t> random_rows(DType t, int64_t rows, int64_t in, uint32_t seed) {
  std::mt19937 rng(seed);
  const DTypeTraits tr = dtype_traits(t);
  std::vector<uint8_t> b(static_cast<size_t>(rows) * dtype_row_bytes(t, in));
  for (auto& v : b) v = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> sd(-0.1f, 0.1f);
  for (size_t at = 0; at < b.size(); at += static_cast<size_t>(tr.block_bytes)) {
    const int n_scales = t == DType::Q4_K ? 2 : 1;  // Q4_K: d and dmin
    for (int k = 0; k < n_scales; ++k) {
      const uint16_t h = f32_to_fp16(sd(rng));
      std::memcpy(&b[at + 2 * static_cast<size_t>(k)], &h, 2);
    }
  }
  return b;
}

void expect_packs_the_files_numbers(DType t, int64_t rows, int64_t in) {
  const std::vector<uint8_t> file = random_rows(t, rows, in, static_cast<uint32_t>(rows * 131 + in));
  const PackedMatrix m = pack_rows(t, file.data(), rows, in);
  ASSERT_EQ(m.chunks, (in + 255) / 256);
  EXPECT_EQ(m.codes.size(), static_cast<size_t>(rows * m.chunks * packed_code_bytes(m.format)));
  EXPECT_EQ(m.meta.size(), static_cast<size_t>(rows * m.chunks * 16));
  const size_t row_bytes = dtype_row_bytes(t, in);
  std::vector<float> want(static_cast<size_t>(in)), got(static_cast<size_t>(in));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(t, file.data() + static_cast<size_t>(r) * row_bytes, want.data(), in);
    unpack_row(m, r, got.data());
    for (int64_t i = 0; i < in; ++i)
      ASSERT_EQ(f32_to_bits(got[static_cast<size_t>(i)]), f32_to_bits(want[static_cast<size_t>(i)]))
          << dtype_traits(t).name << " row " << r << " element " << i;
  }
}

TEST(PackedGguf, Q8_0HoldsTheFilesNumbers) {
  expect_packs_the_files_numbers(DType::Q8_0, 5, 256);
  expect_packs_the_files_numbers(DType::Q8_0, 3, 576);  // 2.25 chunks (the default model's width)
  expect_packs_the_files_numbers(DType::Q8_0, 2, 32);
}

TEST(PackedGguf, Q4_KHoldsTheFilesNumbers) {
  expect_packs_the_files_numbers(DType::Q4_K, 4, 256);
  expect_packs_the_files_numbers(DType::Q4_K, 3, 1280);
}

// The device's rule, from the layout's statement alone: in group j of a chunk, word w (bytes
// 16j + 4w ..) holds elements 8w .. 8w+7, and (word >> 4k) & 0x000F000F is the pair (2k, 2k+1)
// in its two 16-bit halves.
TEST(PackedGguf, Q4_KWordsDecodeAsTheDeviceReadsThem) {
  const int64_t in = 512;
  const std::vector<uint8_t> file = random_rows(DType::Q4_K, 2, in, 99);
  const PackedMatrix m = pack_rows(DType::Q4_K, file.data(), 2, in);
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t c = 0; c < m.chunks; ++c) {
      const uint8_t* blk = file.data() + static_cast<size_t>(r) * dtype_row_bytes(DType::Q4_K, in) + 144 * c;
      const uint8_t* codes = m.codes.data() + (r * m.chunks + c) * 128;
      EXPECT_EQ(std::memcmp(m.meta.data() + (r * m.chunks + c) * 16, blk, 16), 0) << "header";
      for (int j = 0; j < 8; ++j) {
        for (int w = 0; w < 4; ++w) {
          uint32_t word;
          std::memcpy(&word, codes + 16 * j + 4 * w, 4);
          for (int k = 0; k < 4; ++k) {
            const uint32_t pair = (word >> (4 * k)) & 0x000F000Fu;
            for (int h = 0; h < 2; ++h) {
              const int e = 32 * j + 8 * w + 2 * k + h;  // element of the super-block
              // The file's nibble (dequant.cpp): group of 64 e / 64; low nibbles first.
              const uint8_t b = blk[16 + 32 * (e / 64) + e % 32];
              const uint32_t want = (e % 64) < 32 ? (b & 0x0F) : (b >> 4);
              ASSERT_EQ((pair >> (16 * h)) & 0xF, want) << "row " << r << " chunk " << c << " element " << e;
            }
          }
        }
      }
    }
  }
}

TEST(PackedGguf, RefusesOtherFormatsAndBadWidths) {
  std::vector<uint8_t> b(1024);
  EXPECT_THROW(pack_rows(DType::Q4_0, b.data(), 1, 32), Error);
  EXPECT_THROW(pack_rows(DType::Q4_K, b.data(), 1, 128), Error);
  EXPECT_THROW(pack_rows(DType::Q8_0, b.data(), 1, 48), Error);
}

}  // namespace
}  // namespace dhs
