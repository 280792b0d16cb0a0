// Dequantization tests. Hand-built blocks: each test encodes chosen quants and scales
// into bytes following the block layout (the encoding direction, written independently
// of the decoder) and checks every element. Cross-check: tensors quantized and
// dequantized by the Python gguf package (tests/data/gguf/quant_blocks.gguf).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "gguf_builder.h"
#include "model/dequant.h"
#include "model/gguf_file.h"
#include "test_paths.h"

namespace dhs {
namespace {

// fp16 constants used below, each exactly representable (checked in Fp16Constants).
constexpr uint16_t kH_0_25 = 0x3400, kH_0_5 = 0x3800, kH_m0_25 = 0xB400, kH_2 = 0x4000, kH_3 = 0x4200,
                   kH_m1_25 = 0xBD00, kH_100 = 0x5640;
// Scales with all 11 significand bits in use (about 0.10004, 0.01234, -0.000623; odd significands).
constexpr uint16_t kH_messy1 = 0x2E67, kH_messy2 = 0x2251, kH_messy3 = 0x911B;

TEST(Dequant, Fp16Constants) {
  EXPECT_EQ(fp16_to_f32(kH_0_25), 0.25f);
  EXPECT_EQ(fp16_to_f32(kH_0_5), 0.5f);
  EXPECT_EQ(fp16_to_f32(kH_m0_25), -0.25f);
  EXPECT_EQ(fp16_to_f32(kH_2), 2.0f);
  EXPECT_EQ(fp16_to_f32(kH_3), 3.0f);
  EXPECT_EQ(fp16_to_f32(kH_m1_25), -1.25f);
  EXPECT_EQ(fp16_to_f32(kH_100), 100.0f);
}

void put16(std::vector<uint8_t>& b, size_t at, uint16_t v) {
  b[at] = static_cast<uint8_t>(v & 0xFF);
  b[at + 1] = static_cast<uint8_t>(v >> 8);
}

std::vector<float> dequant(DType t, const std::vector<uint8_t>& src, int64_t n) {
  EXPECT_EQ(dtype_row_bytes(t, n), src.size());
  std::vector<float> out(static_cast<size_t>(n), -12345.f);
  dequantize_row(t, src.data(), out.data(), n);
  return out;
}

void expect_bits_eq(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(f32_to_bits(got[i]), f32_to_bits(want[i])) << "element " << i << ": " << got[i] << " vs " << want[i];
  }
}

// ---- float types ------------------------------------------------------------------

TEST(Dequant, F32IsABitwiseCopy) {
  const std::vector<uint32_t> bits = {0x3f800000, 0x80000000, 0x7fc00001, 0x7f800000, 0x00000001, 0xc2f60000};
  std::vector<uint8_t> src(bits.size() * 4);
  std::memcpy(src.data(), bits.data(), src.size());
  const std::vector<float> y = dequant(DType::F32, src, static_cast<int64_t>(bits.size()));
  for (size_t i = 0; i < bits.size(); ++i) EXPECT_EQ(f32_to_bits(y[i]), bits[i]);
}

TEST(Dequant, F16HandValues) {
  // 11 values: the 8-wide path and the scalar tail both run.
  const std::vector<std::pair<uint16_t, float>> cases = {
      {0x0000, 0.0f},        {0x8000, -0.0f},     {0x3C00, 1.0f},
      {0xC000, -2.0f},       {0x3555, 0.333251953125f}, {0x7BFF, 65504.0f},
      {0x0400, 0x1p-14f},    {0x0001, 0x1p-24f},  {0x83FF, -1023 * 0x1p-24f},
      {0x7C00, INFINITY},    {0xFC00, -INFINITY},
  };
  std::vector<uint8_t> src(cases.size() * 2);
  std::vector<float> want;
  for (size_t i = 0; i < cases.size(); ++i) {
    put16(src, 2 * i, cases[i].first);
    want.push_back(cases[i].second);
  }
  expect_bits_eq(dequant(DType::F16, src, static_cast<int64_t>(cases.size())), want);
}

TEST(Dequant, F16AllBitPatterns) {
  std::vector<uint8_t> src(65536 * 2);
  for (uint32_t h = 0; h < 65536; ++h) put16(src, 2 * h, static_cast<uint16_t>(h));
  const std::vector<float> y = dequant(DType::F16, src, 65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = fp16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      // F16C quiets signalling NaNs; any NaN is acceptable.
      EXPECT_TRUE(std::isnan(y[h])) << std::hex << h;
    } else {
      EXPECT_EQ(f32_to_bits(y[h]), f32_to_bits(want)) << std::hex << h;
    }
  }
}

TEST(Dequant, BF16) {
  // bf16 is the top half of an fp32: value bits are h << 16.
  const std::vector<std::pair<uint16_t, float>> cases = {
      {0x3F80, 1.0f}, {0xC040, -3.0f}, {0x4049, 3.140625f}, {0x0001, 0x1p-133f},
      {0x7F80, INFINITY}, {0x8000, -0.0f}, {0x7F7F, 0x1.FEp127f}, {0xBE00, -0.125f}, {0x4300, 128.0f},
  };
  std::vector<uint8_t> src(cases.size() * 2);
  std::vector<float> want;
  for (size_t i = 0; i < cases.size(); ++i) {
    put16(src, 2 * i, cases[i].first);
    want.push_back(cases[i].second);
  }
  expect_bits_eq(dequant(DType::BF16, src, static_cast<int64_t>(cases.size())), want);
}

// ---- 32-element blocks ------------------------------------------------------------

TEST(Dequant, Q8_0) {
  // Two blocks: [fp16 d][int8 q x 32].
  std::vector<uint8_t> src(2 * 34);
  std::vector<float> want;
  const uint16_t d_bits[2] = {kH_0_5, kH_m0_25};
  const float d[2] = {0.5f, -0.25f};
  for (int b = 0; b < 2; ++b) {
    put16(src, 34 * b, d_bits[b]);
    for (int j = 0; j < 32; ++j) {
      const int q = b == 0 ? j * 8 - 128 : 127 - j * 5;  // -128..120, 127..-28
      src[34 * b + 2 + j] = static_cast<uint8_t>(static_cast<int8_t>(q));
      want.push_back(d[b] * static_cast<float>(q));
    }
  }
  expect_bits_eq(dequant(DType::Q8_0, src, 64), want);
}

// Q4_0 / Q4_1: element j < 16 is the low nibble of qs[j], element j >= 16 the high
// nibble of qs[j - 16].
void put_nibble32(uint8_t* qs, int j, int q) {
  if (j < 16) {
    qs[j] = static_cast<uint8_t>((qs[j] & 0xF0) | q);
  } else {
    qs[j - 16] = static_cast<uint8_t>((qs[j - 16] & 0x0F) | (q << 4));
  }
}

TEST(Dequant, Q4_0) {
  std::vector<uint8_t> src(2 * 18, 0);
  std::vector<float> want;
  // Block 1 has d < 0, so its q = 8 element must be -0.0 (d * (q - 8)), not +0.0.
  const uint16_t d_bits[2] = {kH_3, kH_m0_25};
  const float d[2] = {3.0f, -0.25f};
  for (int b = 0; b < 2; ++b) {
    put16(src, 18 * b, d_bits[b]);
    for (int j = 0; j < 32; ++j) {
      const int q = (j * 5 + 3 + b) % 16;
      put_nibble32(&src[18 * b + 2], j, q);
      want.push_back(d[b] * static_cast<float>(q - 8));
    }
  }
  expect_bits_eq(dequant(DType::Q4_0, src, 64), want);
}

TEST(Dequant, Q4_1) {
  std::vector<uint8_t> src(2 * 20, 0);
  std::vector<float> want;
  const uint16_t d_bits[2] = {kH_0_5, kH_2}, m_bits[2] = {kH_m1_25, kH_100};
  const float d[2] = {0.5f, 2.0f}, m[2] = {-1.25f, 100.0f};
  for (int b = 0; b < 2; ++b) {
    put16(src, 20 * b, d_bits[b]);
    put16(src, 20 * b + 2, m_bits[b]);
    for (int j = 0; j < 32; ++j) {
      const int q = (j * 7 + b) % 16;
      put_nibble32(&src[20 * b + 4], j, q);
      want.push_back(d[b] * static_cast<float>(q) + m[b]);
    }
  }
  expect_bits_eq(dequant(DType::Q4_1, src, 64), want);
}

// Q5_0 (22 bytes): fp16 d, u32 qh little-endian at byte 2, qs[16] at byte 6 (nibbles as
// in Q4_0); bit j of qh is bit 4 of element j; x = d * (q - 16).
TEST(Dequant, Q5_0ByHand) {
  // Worked out by hand. Block 0: qh = 0x80018001 (bits 0, 15, 16, 31 set), d = 0.5.
  // Block 1: qh = 0x7FFE7FFE (the complement: those four bits clear, all others set),
  // d = -0.25. Both: qs[0] = 0xF3, qs[15] = 0x0C, every other qs byte 0.
  //   element  0: low  nibble of qs[0]  = 3,  block 0: 3 + 16 = 19 -> +3,  block 1: 3  -> -13
  //   element 16: high nibble of qs[0]  = 15, block 0: 31 -> +15,           block 1: 15 -> -1
  //   element 15: low  nibble of qs[15] = 12, block 0: 28 -> +12,           block 1: 12 -> -4
  //   element 31: high nibble of qs[15] = 0,  block 0: 16 -> 0,             block 1: 0  -> -16
  //   others    : nibble 0,                   block 0: 0  -> -16,           block 1: 16 -> 0
  const std::vector<uint8_t> src = {
      0x00, 0x38, 0x01, 0x80, 0x01, 0x80, 0xF3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0C,
      0x00, 0xB4, 0xFE, 0x7F, 0xFE, 0x7F, 0xF3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0C,
  };
  std::vector<float> want(64);
  for (int j = 0; j < 32; ++j) {
    want[j] = -8.0f;       // 0.5 * -16
    want[32 + j] = -0.0f;  // -0.25 * 0: the sign must survive
  }
  want[0] = 1.5f, want[16] = 7.5f, want[15] = 6.0f, want[31] = 0.0f;
  want[32] = 3.25f, want[48] = 0.25f, want[47] = 1.0f, want[63] = 4.0f;
  expect_bits_eq(dequant(DType::Q5_0, src, 64), want);
}

// Every 5-bit quant in both halves, fifth bit toggled through all 32 qh positions.
TEST(Dequant, Q5_0) {
  std::vector<uint8_t> src(3 * 22, 0);
  std::vector<float> want;
  const uint16_t d_bits[3] = {kH_2, kH_m1_25, kH_messy3};
  const float d[3] = {2.0f, -1.25f, fp16_to_f32(kH_messy3)};
  for (int b = 0; b < 3; ++b) {
    uint8_t* blk = &src[22 * b];
    put16(src, 22 * b, d_bits[b]);
    for (int j = 0; j < 32; ++j) {
      const int q = (j * 11 + 5 + 7 * b) % 32;  // a permutation of 0..31 for each block
      put_nibble32(blk + 6, j, q & 15);
      blk[2 + j / 8] = static_cast<uint8_t>(blk[2 + j / 8] | ((q >> 4) << (j % 8)));
      want.push_back(d[b] * static_cast<float>(q - 16));
    }
  }
  expect_bits_eq(dequant(DType::Q5_0, src, 96), want);
}

// The GGUF reader sizes a Q5_0 tensor (type id 6) as 22 bytes per 32 elements, and its
// rows dequantize in place.
TEST(Dequant, Q5_0FromGgufFile) {
  constexpr uint32_t kTypeQ5_0 = 6;
  std::vector<uint8_t> blocks(4 * 22, 0);  // ne {64, 2}: two rows of two blocks
  std::vector<float> want;
  for (int b = 0; b < 4; ++b) {
    put16(blocks, 22 * b, b % 2 ? kH_m0_25 : kH_0_5);
    for (int j = 0; j < 32; ++j) {
      const int q = (j * 3 + b) % 32;
      put_nibble32(&blocks[22 * b + 6], j, q & 15);
      blocks[22 * b + 2 + j / 8] = static_cast<uint8_t>(blocks[22 * b + 2 + j / 8] | ((q >> 4) << (j % 8)));
      want.push_back((b % 2 ? -0.25f : 0.5f) * static_cast<float>(q - 16));
    }
  }
  test::GgufBuilder g;
  g.kv_string("general.architecture", "llama");
  g.tensor_f32("a.weight", {3});  // 12 bytes, so the Q5_0 data starts at a padded offset
  g.tensor({"q.weight", {64, 2}, kTypeQ5_0, blocks, {}, {}});
  const std::vector<uint8_t> file = g.build();
  const gguf::GgufFile f = gguf::GgufFile::parse(file.data(), file.size());
  const gguf::TensorInfo* t = f.find_tensor("q.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->type, DType::Q5_0);
  EXPECT_EQ(t->n_bytes, 88u);
  EXPECT_EQ(t->offset, 32u);
  std::vector<float> got(128);
  for (int r = 0; r < 2; ++r) dequantize_row(t->type, t->data + r * dtype_row_bytes(t->type, 64), &got[64 * r], 64);
  expect_bits_eq(got, want);

  // A row length that is not a multiple of 32 is refused by the reader.
  g.tensors()[1].ne = {48, 2};
  const std::vector<uint8_t> bad = g.build();
  EXPECT_THROW(gguf::GgufFile::parse(bad.data(), bad.size()), Error);
}

// ---- K-quants -----------------------------------------------------------------------

void set_bits(uint8_t* bytes, int byte, int first_bit, int n_bits, int value) {
  for (int i = 0; i < n_bits; ++i) {
    const uint8_t mask = static_cast<uint8_t>(1u << (first_bit + i));
    bytes[byte] = static_cast<uint8_t>((bytes[byte] & ~mask) | (((value >> i) & 1) ? mask : 0));
  }
}

// Packs 8 six-bit scales and mins into the 12-byte K-quant layout, field by field:
//   scale j < 4 : bits 0-5 of byte j          min j < 4 : bits 0-5 of byte j+4
//   scale j >= 4: bits 0-3 -> bits 0-3 of byte j+4, bits 4-5 -> bits 6-7 of byte j-4
//   min j >= 4  : bits 0-3 -> bits 4-7 of byte j+4, bits 4-5 -> bits 6-7 of byte j
void pack_k_scales(uint8_t out[12], const int sc[8], const int mn[8]) {
  std::memset(out, 0, 12);
  for (int j = 0; j < 4; ++j) {
    set_bits(out, j, 0, 6, sc[j]);
    set_bits(out, j + 4, 0, 6, mn[j]);
  }
  for (int j = 4; j < 8; ++j) {
    set_bits(out, j + 4, 0, 4, sc[j] & 15);
    set_bits(out, j - 4, 6, 2, sc[j] >> 4);
    set_bits(out, j + 4, 4, 4, mn[j] & 15);
    set_bits(out, j, 6, 2, mn[j] >> 4);
  }
}

TEST(Dequant, KScalePackingByHand) {
  // scales {1,2,3,4,17,33,48,63}, mins {5,6,7,8,52,9,40,30}, worked out bit by bit
  // (the high bits of scales and mins 4..7 differ, so mixing them up shows):
  //   byte0 = 1 | (17>>4)<<6 = 0x41   byte4 = 5 | (52>>4)<<6 = 0xC5   byte8  = (17&15) | (52&15)<<4 = 0x41
  //   byte1 = 2 | (33>>4)<<6 = 0x82   byte5 = 6 | ( 9>>4)<<6 = 0x06   byte9  = (33&15) | ( 9&15)<<4 = 0x91
  //   byte2 = 3 | (48>>4)<<6 = 0xC3   byte6 = 7 | (40>>4)<<6 = 0x87   byte10 = (48&15) | (40&15)<<4 = 0x80
  //   byte3 = 4 | (63>>4)<<6 = 0xC4   byte7 = 8 | (30>>4)<<6 = 0x48   byte11 = (63&15) | (30&15)<<4 = 0xEF
  const int sc[8] = {1, 2, 3, 4, 17, 33, 48, 63};
  const int mn[8] = {5, 6, 7, 8, 52, 9, 40, 30};
  uint8_t packed[12];
  pack_k_scales(packed, sc, mn);
  const uint8_t by_hand[12] = {0x41, 0x82, 0xC3, 0xC4, 0xC5, 0x06, 0x87, 0x48, 0x41, 0x91, 0x80, 0xEF};
  for (int i = 0; i < 12; ++i) EXPECT_EQ(packed[i], by_hand[i]) << "byte " << i;

  // Decode through Q4_K with all quants 1 and d = 1, dmin = 0.5: element 32j is sc[j] - mn[j]/2.
  std::vector<uint8_t> src(144, 0);
  put16(src, 0, 0x3C00);
  put16(src, 2, kH_0_5);
  std::memcpy(&src[4], by_hand, 12);
  std::memset(&src[16], 0x11, 128);
  const std::vector<float> y = dequant(DType::Q4_K, src, 256);
  for (int j = 0; j < 8; ++j) {
    for (int i = 0; i < 32; ++i) EXPECT_EQ(y[32 * j + i], sc[j] - 0.5f * mn[j]) << "sub-block " << j;
  }
}

// Q4_K: sub-block j (32 elements) lives in qs[32 * (j / 2) ..], low nibbles for even j,
// high nibbles for odd j. x = d * sc[j] * q - dmin * mn[j].
TEST(Dequant, Q4_K) {
  const int sc[2][8] = {{1, 17, 33, 63, 16, 32, 48, 5}, {63, 0, 31, 47, 62, 15, 1, 20}};
  const int mn[2][8] = {{0, 63, 20, 31, 48, 7, 32, 15}, {16, 1, 2, 60, 33, 63, 0, 9}};
  // Block 1 uses inexact-looking fp16 scales: the products are still exact in fp32
  // (11 + 6 + 4 significant bits), so only the final subtraction rounds.
  const uint16_t d_bits[2] = {kH_0_5, kH_messy1}, dmin_bits[2] = {kH_0_25, kH_messy2};
  const float d[2] = {0.5f, fp16_to_f32(kH_messy1)}, dmin[2] = {0.25f, fp16_to_f32(kH_messy2)};
  std::vector<uint8_t> src(2 * 144, 0);
  std::vector<float> want;
  for (int b = 0; b < 2; ++b) {
    uint8_t* blk = &src[144 * b];
    put16(src, 144 * b, d_bits[b]);
    put16(src, 144 * b + 2, dmin_bits[b]);
    pack_k_scales(blk + 4, sc[b], mn[b]);
    for (int e = 0; e < 256; ++e) {
      const int j = e / 32, i = e % 32;
      const int q = (e * 7 + j + b) % 16;
      set_bits(blk + 16, 32 * (j / 2) + i, (j % 2) * 4, 4, q);
      // d, dmin, sc, mn and q are small enough that every product is exact.
      want.push_back(d[b] * sc[b][j] * q - dmin[b] * mn[b][j]);
    }
  }
  expect_bits_eq(dequant(DType::Q4_K, src, 512), want);
}

// Q5_K: as Q4_K for the low 4 bits (qs at byte 48); bit 4 of element i of sub-block j
// is bit j of qh[i] (qh at byte 16).
TEST(Dequant, Q5_K) {
  const int sc[2][8] = {{2, 19, 40, 63, 16, 31, 50, 7}, {60, 1, 29, 45, 63, 16, 3, 33}};
  const int mn[2][8] = {{1, 62, 21, 30, 49, 6, 33, 14}, {17, 0, 3, 61, 32, 62, 4, 8}};
  const uint16_t d_bits[2] = {kH_0_25, kH_messy2}, dmin_bits[2] = {kH_0_5, kH_messy1};
  const float d[2] = {0.25f, fp16_to_f32(kH_messy2)}, dmin[2] = {0.5f, fp16_to_f32(kH_messy1)};
  std::vector<uint8_t> src(2 * 176, 0);
  std::vector<float> want;
  for (int b = 0; b < 2; ++b) {
    uint8_t* blk = &src[176 * b];
    put16(src, 176 * b, d_bits[b]);
    put16(src, 176 * b + 2, dmin_bits[b]);
    pack_k_scales(blk + 4, sc[b], mn[b]);
    for (int e = 0; e < 256; ++e) {
      const int j = e / 32, i = e % 32;
      const int q = (e * 11 + 3 * j + b) % 32;
      set_bits(blk + 48, 32 * (j / 2) + i, (j % 2) * 4, 4, q & 15);
      set_bits(blk + 16, i, j, 1, q >> 4);
      want.push_back(d[b] * sc[b][j] * q - dmin[b] * mn[b][j]);
    }
  }
  expect_bits_eq(dequant(DType::Q5_K, src, 512), want);
}

// Q6_K: ql[128] at 0, qh[64] at 128, int8 scales[16] at 192, fp16 d at 208. Element e:
// half h = e / 128, r = e % 128, group k = r / 32, l = r % 32. The low 4 bits are a nibble
// of ql[64h + l + 32 * (k % 2)] (low for k < 2, high for k >= 2); the high 2 bits are
// bits 2k, 2k+1 of qh[32h + l]. x = d * scales[e / 16] * (q - 32).
TEST(Dequant, Q6_K) {
  const int scales[2][16] = {{-128, -1, 0, 1, 127, 64, -64, 17, 31, -31, 100, -100, 5, -5, 2, 63},
                             {7, -7, 120, -120, 33, -33, 1, -1, 0, 99, -99, 16, -16, 127, -128, 8}};
  const uint16_t d_bits[2] = {kH_0_5, kH_messy3};
  const float d[2] = {0.5f, fp16_to_f32(kH_messy3)};
  std::vector<uint8_t> src(2 * 210, 0);
  std::vector<float> want;
  for (int b = 0; b < 2; ++b) {
    uint8_t* blk = &src[210 * b];
    for (int s = 0; s < 16; ++s) blk[192 + s] = static_cast<uint8_t>(static_cast<int8_t>(scales[b][s]));
    put16(src, 210 * b + 208, d_bits[b]);
    for (int e = 0; e < 256; ++e) {
      const int h = e / 128, r = e % 128, k = r / 32, l = r % 32;
      const int q = (e * 13 + e / 16 + b) % 64;
      set_bits(blk, 64 * h + l + 32 * (k % 2), k < 2 ? 0 : 4, 4, q & 15);
      set_bits(blk + 128, 32 * h + l, 2 * k, 2, q >> 4);
      want.push_back(d[b] * scales[b][e / 16] * (q - 32));
    }
  }
  expect_bits_eq(dequant(DType::Q6_K, src, 512), want);
}

TEST(Dequant, UnalignedSourceGivesSameResult) {
  // Blocks inside a file need not be aligned for their fp16 fields; nor does our caller.
  for (DType t : {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q4_K,
                  DType::Q5_K, DType::Q6_K}) {
    const int64_t n = 512;
    const size_t bytes = dtype_row_bytes(t, n);
    std::vector<uint8_t> buf(bytes + 1);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>((i * 37 + 11) & 0x3B);  // no inf/nan
    std::vector<uint8_t> aligned(buf.begin() + 1, buf.end());
    std::vector<float> a(n), u(n);
    dequantize_row(t, aligned.data(), a.data(), n);
    dequantize_row(t, buf.data() + 1, u.data(), n);
    expect_bits_eq(u, a);
  }
}

// ---- sizes and errors --------------------------------------------------------------

TEST(Dequant, RowBytes) {
  EXPECT_EQ(dtype_row_bytes(DType::F32, 3), 12u);
  EXPECT_EQ(dtype_row_bytes(DType::F16, 3), 6u);
  EXPECT_EQ(dtype_row_bytes(DType::BF16, 5), 10u);
  EXPECT_EQ(dtype_row_bytes(DType::Q8_0, 64), 68u);
  EXPECT_EQ(dtype_row_bytes(DType::Q4_0, 96), 54u);
  EXPECT_EQ(dtype_row_bytes(DType::Q4_1, 32), 20u);
  EXPECT_EQ(dtype_row_bytes(DType::Q4_K, 256), 144u);
  EXPECT_EQ(dtype_row_bytes(DType::Q5_K, 512), 352u);
  EXPECT_EQ(dtype_row_bytes(DType::Q6_K, 768), 630u);
  EXPECT_EQ(dtype_row_bytes(DType::Q5_0, 96), 66u);
  EXPECT_EQ(dtype_row_bytes(DType::Q5_1, 32), 24u);  // sized although not dequantizable
  EXPECT_EQ(dtype_row_bytes(DType::Q4_K, 0), 0u);
  EXPECT_THROW(dtype_row_bytes(DType::Q4_K, 128), Error);
  EXPECT_THROW(dtype_row_bytes(DType::Q8_0, 33), Error);
  EXPECT_THROW(dtype_row_bytes(DType::Q5_0, 16), Error);
  EXPECT_THROW(dtype_row_bytes(DType::F32, -1), Error);
  EXPECT_THROW(dtype_row_bytes(static_cast<DType>(99), 32), Error);
}

TEST(Dequant, SupportedTypes) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                  DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    EXPECT_TRUE(dequant_supported(t)) << dtype_traits(t).name;
  }
  for (DType t : {DType::Q5_1, DType::Q8_1, DType::Q2_K, DType::Q3_K, DType::Q8_K, DType::I8,
                  DType::I32, DType::F64, static_cast<DType>(99)}) {
    EXPECT_FALSE(dequant_supported(t)) << static_cast<uint32_t>(t);
  }
}

TEST(Dequant, Errors) {
  std::vector<uint8_t> src(1024, 0);
  std::vector<float> dst(1024);
  try {
    dequantize_row(DType::Q4_K, src.data(), dst.data(), 100);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a multiple of the block size 256"), std::string::npos) << e.what();
  }
  try {
    dequantize_row(DType::Q5_1, src.data(), dst.data(), 32);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q5_1"), std::string::npos) << e.what();
  }
  try {
    dequantize_row(DType::Q5_0, src.data(), dst.data(), 48);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q5_0 row of 48 elements"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dequantize_row(DType::Q8_0, src.data(), dst.data(), -32), Error);
  EXPECT_NO_THROW(dequantize_row(DType::Q8_0, nullptr, nullptr, 0));
}

// ---- cross-check against the Python gguf package ------------------------------------

TEST(DequantCrossCheck, MatchesPythonGguf) {
  const std::string path = test::data_dir() + "/gguf/quant_blocks.gguf";
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " missing; run scripts/make_gguf_test_data.py";
  const gguf::GgufFile f = gguf::GgufFile::open(path);
  for (const char* name : {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q5_K", "Q6_K"}) {
    SCOPED_TRACE(name);
    const gguf::TensorInfo* q = f.find_tensor(std::string(name) + ".q");
    const gguf::TensorInfo* x = f.find_tensor(std::string(name) + ".expected");
    ASSERT_NE(q, nullptr);
    ASSERT_NE(x, nullptr);
    EXPECT_EQ(dtype_traits(q->type).name, name);
    ASSERT_EQ(x->type, DType::F32);
    ASSERT_EQ(q->ne, x->ne);
    const int64_t n_cols = q->ne[0];
    const int64_t n_rows = q->n_elems() / n_cols;
    std::vector<float> got(static_cast<size_t>(n_cols)), want(static_cast<size_t>(n_cols));
    for (int64_t r = 0; r < n_rows; ++r) {
      dequantize_row(q->type, q->data + r * dtype_row_bytes(q->type, n_cols), got.data(), n_cols);
      std::memcpy(want.data(), x->data + r * n_cols * 4, static_cast<size_t>(n_cols) * 4);
      // Bitwise for every type, not just the float ones. Every product in these formats is
      // exact in fp32: an fp16 scale has 11 significant bits, a 6-bit scale or min 6, a
      // quant at most 6 (Q6_K's |q - 32| <= 32), an int8 scale 7, so d * scale * q needs at
      // most 11 + 7 + 5 = 23 < 24 bits. Each formula thus rounds once, at its final add,
      // whatever the evaluation order or FMA contraction (g++ contracts by default for C++,
      // numpy never does), so a 1e-6 tolerance would only hide real layout bugs.
      expect_bits_eq(got, want);
    }
  }
}

}  // namespace
}  // namespace dhs
