// Dequantization of GGUF block formats to fp32 (see dequant.h). Each kernel walks
// whole blocks with byte offsets and memcpy'd scales, so a source pointer needs no
// particular alignment; the inner loops are plain enough for g++ to vectorise.
#include "model/dequant.h"

#include <cstring>

#include "core/error.h"
#include "core/fp16.h"

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace dhs {

namespace {

constexpr int kQK = 32;    // elements per Q4_0 / Q4_1 / Q5_0 / Q8_0 block
constexpr int kQKK = 256;  // elements per K-quant super-block

inline float load_fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if defined(__F16C__)
  return _cvtsh_ss(h);  // branch-free; fp16_to_f32 loops on subnormals
#else
  return fp16_to_f32(h);
#endif
}

// 16 bytes of packed nibbles (element j < 16: low nibble of qs[j], element j + 16: high
// nibble) -> 32 floats (q + offset) * scale, plus bias if HAS_BIAS. NOTE: every product
// here is exact in fp32 (an fp16 scale has 11 significant bits, a nibble 4), so fused and
// unfused multiply-adds round identically. Q4_0 must not fold its -8 into a bias: for
// d < 0 and q = 8 that would give +0 where d * (q - 8) gives -0.
template <bool HAS_BIAS>
inline void nibbles_to_f32(const uint8_t* qs, float offset, float scale, float bias, float* y) {
#if defined(__AVX2__) && defined(__FMA__)
  // g++ turns the plain byte loop below into scalar code (x86 has no byte shift); this
  // path is ~5x faster, and x86-64-v3 is the project baseline.
  const __m128i m4 = _mm_set1_epi8(0x0F);
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i lo = _mm_and_si128(raw, m4);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
  const __m128i parts[4] = {lo, _mm_unpackhi_epi64(lo, lo), hi, _mm_unpackhi_epi64(hi, hi)};
  const __m256 o = _mm256_set1_ps(offset), s = _mm256_set1_ps(scale), b = _mm256_set1_ps(bias);
  for (int k = 0; k < 4; ++k) {
    const __m256 q = _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[k])), o);
    _mm256_storeu_ps(y + 8 * k, HAS_BIAS ? _mm256_fmadd_ps(q, s, b) : _mm256_mul_ps(q, s));
  }
#else
  for (int j = 0; j < 16; ++j) {
    const float q_lo = static_cast<float>(qs[j] & 0x0F) + offset;
    const float q_hi = static_cast<float>(qs[j] >> 4) + offset;
    y[j] = HAS_BIAS ? q_lo * scale + bias : q_lo * scale;
    y[j + 16] = HAS_BIAS ? q_hi * scale + bias : q_hi * scale;
  }
#endif
}

void dequant_f32(const uint8_t* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * 4);
}

void dequant_f16(const uint8_t* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  // vcvtph2ps is exact for every half (subnormals included); it only differs from
  // fp16_to_f32 by quieting signalling NaNs.
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = load_fp16(src + 2 * i);
}

void dequant_bf16(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    std::memcpy(dst + i, &u, 4);
  }
}

// Q8_0 block (34 bytes): fp16 d, int8 q[32]; x = d * q.
void dequant_q8_0(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += 34, dst += kQK) {
    const float d = load_fp16(src);
    const auto* q = reinterpret_cast<const int8_t*>(src + 2);
    for (int j = 0; j < kQK; ++j) dst[j] = d * static_cast<float>(q[j]);
  }
}

// Q4_0 block (18 bytes): fp16 d, u8 qs[16]. Element j < 16 is the low nibble of qs[j],
// element j + 16 its high nibble; x = d * (nibble - 8).
void dequant_q4_0(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += 18, dst += kQK) {
    const float d = load_fp16(src);
    const uint8_t* qs = src + 2;
    nibbles_to_f32<false>(qs, -8.f, d, 0.f, dst);
  }
}

// Q4_1 block (20 bytes): fp16 d, fp16 m, u8 qs[16] (nibbles as in Q4_0); x = d * nibble + m.
void dequant_q4_1(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += 20, dst += kQK) {
    const float d = load_fp16(src);
    const float m = load_fp16(src + 2);
    const uint8_t* qs = src + 4;
    nibbles_to_f32<true>(qs, 0.f, d, m, dst);
  }
}

// Q5_0 block (22 bytes): fp16 d, u32 qh (little-endian), u8 qs[16]. The low 4 bits of
// element j are the nibbles of qs as in Q4_0; bit j of qh is its fifth bit; x = d * (q - 16).
// As in Q4_0 the -16 stays inside the product so d < 0, q = 16 gives -0, not +0; every
// product is exact (11-bit d times a 5-bit |q - 16|).
void dequant_q5_0(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += 22, dst += kQK) {
    const float d = load_fp16(src);
    // Assembled byte by byte: the field is little-endian whatever the host, and at
    // offset 2 it is not 4-byte aligned.
    const uint32_t qh = static_cast<uint32_t>(src[2]) | (static_cast<uint32_t>(src[3]) << 8) |
                        (static_cast<uint32_t>(src[4]) << 16) | (static_cast<uint32_t>(src[5]) << 24);
    const uint8_t* qs = src + 6;
    for (int j = 0; j < 16; ++j) {
      const int q_lo = static_cast<int>((qs[j] & 0x0F) | (((qh >> j) & 1u) << 4)) - 16;
      const int q_hi = static_cast<int>((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16;
      dst[j] = d * static_cast<float>(q_lo);
      dst[j + 16] = d * static_cast<float>(q_hi);
    }
  }
}

// Q4_K / Q5_K keep 8 six-bit scales and 8 six-bit mins (one per 32-element sub-block)
// in 12 bytes:
//   bytes 0..3  : bits 0-5 scale[j],  bits 6-7 = bits 4-5 of scale[j + 4]
//   bytes 4..7  : bits 0-5 min[j],    bits 6-7 = bits 4-5 of min[j + 4]
//   bytes 8..11 : bits 0-3 = bits 0-3 of scale[j + 4], bits 4-7 = bits 0-3 of min[j + 4]
struct KScales {
  float d[8];  // super-block d * scale
  float m[8];  // super-block dmin * min
};

inline KScales unpack_k_scales(const uint8_t* p, float d, float dmin) {
  KScales s;
  for (int j = 0; j < 4; ++j) {
    const int sc_lo = p[j] & 0x3F;
    const int mn_lo = p[j + 4] & 0x3F;
    const int sc_hi = (p[j + 8] & 0x0F) | ((p[j] >> 6) << 4);
    const int mn_hi = (p[j + 8] >> 4) | ((p[j + 4] >> 6) << 4);
    s.d[j] = d * static_cast<float>(sc_lo);
    s.m[j] = dmin * static_cast<float>(mn_lo);
    s.d[j + 4] = d * static_cast<float>(sc_hi);
    s.m[j + 4] = dmin * static_cast<float>(mn_hi);
  }
  return s;
}

// Q4_K super-block (144 bytes): fp16 d, fp16 dmin, scales[12], qs[128]. The 256 elements
// come in 4 chunks of 64; chunk c reads qs[32c .. 32c+32): low nibbles are sub-block 2c,
// high nibbles sub-block 2c+1. x = d*scale * q - dmin*min.
void dequant_q4_k(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += 144, dst += kQKK) {
    const KScales s = unpack_k_scales(src + 4, load_fp16(src), load_fp16(src + 2));
    const uint8_t* qs = src + 16;
    for (int c = 0; c < 4; ++c) {
      const uint8_t* q = qs + 32 * c;
      float* y = dst + 64 * c;
      const float d1 = s.d[2 * c], m1 = s.m[2 * c];
      const float d2 = s.d[2 * c + 1], m2 = s.m[2 * c + 1];
      for (int l = 0; l < 32; ++l) y[l] = d1 * static_cast<float>(q[l] & 0x0F) - m1;
      for (int l = 0; l < 32; ++l) y[l + 32] = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

// Q5_K super-block (176 bytes): fp16 d, fp16 dmin, scales[12], qh[32], qs[128]. As Q4_K,
// plus a fifth bit per element: bit k of qh[l] is the high bit of element l of sub-block k.
void dequant_q5_k(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += 176, dst += kQKK) {
    const KScales s = unpack_k_scales(src + 4, load_fp16(src), load_fp16(src + 2));
    const uint8_t* qh = src + 16;
    const uint8_t* qs = src + 48;
    for (int c = 0; c < 4; ++c) {
      const uint8_t* q = qs + 32 * c;
      float* y = dst + 64 * c;
      const float d1 = s.d[2 * c], m1 = s.m[2 * c];
      const float d2 = s.d[2 * c + 1], m2 = s.m[2 * c + 1];
      const uint8_t hm1 = static_cast<uint8_t>(1u << (2 * c)), hm2 = static_cast<uint8_t>(2u << (2 * c));
      for (int l = 0; l < 32; ++l) {
        const int v = (q[l] & 0x0F) + ((qh[l] & hm1) ? 16 : 0);
        y[l] = d1 * static_cast<float>(v) - m1;
      }
      for (int l = 0; l < 32; ++l) {
        const int v = (q[l] >> 4) + ((qh[l] & hm2) ? 16 : 0);
        y[l + 32] = d2 * static_cast<float>(v) - m2;
      }
    }
  }
}

// Q6_K super-block (210 bytes): ql[128], qh[64], int8 scales[16], fp16 d. Two halves of
// 128 elements; half h uses ql[64h..], qh[32h..]. Within a half, for l < 32:
//   element l      : low nibble of ql[l]      | bits 0-1 of qh[l] << 4
//   element l + 32 : low nibble of ql[l + 32] | bits 2-3 of qh[l] << 4
//   element l + 64 : high nibble of ql[l]     | bits 4-5 of qh[l] << 4
//   element l + 96 : high nibble of ql[l + 32]| bits 6-7 of qh[l] << 4
// x = d * scales[e / 16] * (q - 32), with e the element index in the super-block.
void dequant_q6_k(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += 210, dst += kQKK) {
    const float d = load_fp16(src + 208);
    const auto* scales = reinterpret_cast<const int8_t*>(src + 192);
    float ds[16];
    for (int i = 0; i < 16; ++i) ds[i] = d * static_cast<float>(scales[i]);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = src + 64 * h;
      const uint8_t* qh = src + 128 + 32 * h;
      float* y = dst + 128 * h;
      const float* sc = ds + 8 * h;
      // Split l into two runs of 16 so each run has one scale per output group.
      for (int g = 0; g < 2; ++g) {
        for (int l = 16 * g; l < 16 * g + 16; ++l) {
          const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
          const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
          const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
          const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
          y[l] = sc[g + 0] * static_cast<float>(q1);
          y[l + 32] = sc[g + 2] * static_cast<float>(q2);
          y[l + 64] = sc[g + 4] * static_cast<float>(q3);
          y[l + 96] = sc[g + 6] * static_cast<float>(q4);
        }
      }
    }
  }
}

}  // namespace

// Sizes are defined for every type dtype_traits knows (the reader sizes tensors it
// cannot dequantize, e.g. Q5_1); only unknown type ids throw.
size_t dtype_row_bytes(DType t, int64_t n) {
  const DTypeTraits tr = dtype_traits(t);
  DHS_CHECK(tr.block_elems != 0, "unknown tensor type id {}", static_cast<uint32_t>(t));
  DHS_CHECK(n >= 0 && n % tr.block_elems == 0, "{} row of {} elements: not a multiple of the block size {}",
            tr.name, n, tr.block_elems);
  return static_cast<size_t>(n / tr.block_elems) * static_cast<size_t>(tr.block_bytes);
}

bool dequant_supported(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q8_0: case DType::Q4_0:
    case DType::Q4_1: case DType::Q5_0: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
      return true;
    default:
      return false;
  }
}

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  DHS_CHECK(dequant_supported(t), "dequantization of {} (type id {}) is not supported", dtype_traits(t).name,
            static_cast<uint32_t>(t));
  const DTypeTraits tr = dtype_traits(t);
  DHS_CHECK(n >= 0 && n % tr.block_elems == 0, "{} row of {} elements: not a multiple of the block size {}",
            tr.name, n, tr.block_elems);
  if (n == 0) return;
  DHS_ASSERT(src != nullptr && dst != nullptr);
  const auto* s = static_cast<const uint8_t*>(src);
  const int64_t n_blocks = n / tr.block_elems;
  switch (t) {
    case DType::F32: dequant_f32(s, dst, n); break;
    case DType::F16: dequant_f16(s, dst, n); break;
    case DType::BF16: dequant_bf16(s, dst, n); break;
    case DType::Q8_0: dequant_q8_0(s, dst, n_blocks); break;
    case DType::Q4_0: dequant_q4_0(s, dst, n_blocks); break;
    case DType::Q4_1: dequant_q4_1(s, dst, n_blocks); break;
    case DType::Q5_0: dequant_q5_0(s, dst, n_blocks); break;
    case DType::Q4_K: dequant_q4_k(s, dst, n_blocks); break;
    case DType::Q5_K: dequant_q5_k(s, dst, n_blocks); break;
    case DType::Q6_K: dequant_q6_k(s, dst, n_blocks); break;
    default: DHS_ASSERT(false);
  }
}

}  // namespace dhs
