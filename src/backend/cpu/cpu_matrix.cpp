#include "backend/cpu/cpu_matrix.h"

#include <immintrin.h>

#include <cstring>

#include "core/fp16.h"
#include "core/thread_pool.h"

namespace dhs {

CpuMatrix::CpuMatrix(const float* src, int64_t rows, int64_t cols, CpuWeightType type)
    : rows_(rows), cols_(cols), type_(type) {
  const size_t n = static_cast<size_t>(rows * cols);
  if (type == CpuWeightType::F32) {
    f32_.assign(src, src + n);
  } else {
    f16_.resize(n);
    ThreadPool::global().parallel_for(static_cast<int64_t>(n), [&](int64_t b, int64_t e, int) {
      int64_t i = b;
      // Hardware conversion rounds to nearest even, like f32_to_fp16.
      for (; i + 8 <= e; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(f16_.data() + i), h);
      }
      for (; i < e; ++i) f16_[static_cast<size_t>(i)] = f32_to_fp16(src[i]);
    }, 4096);
  }
}

void CpuMatrix::row_to_f32(int64_t r, float* dst) const {
  const size_t off = static_cast<size_t>(r * cols_);
  if (type_ == CpuWeightType::F32) {
    std::memcpy(dst, f32_.data() + off, static_cast<size_t>(cols_) * 4);
    return;
  }
  const uint16_t* s = f16_.data() + off;
  int64_t i = 0;
  for (; i + 8 <= cols_; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < cols_; ++i) dst[i] = fp16_to_f32(s[i]);
}

}  // namespace dhs
