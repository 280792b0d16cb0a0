#include "backend/cpu/ops.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace dhs::cpu {

namespace {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_hadd_ps(lo, lo);
  lo = _mm_hadd_ps(lo, lo);
  return _mm_cvtss_f32(lo);
}

inline float dot_f32(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline float dot_f16_f32(const uint16_t* w, const float* x, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i)));
    __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i + 8)));
    s0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), s0);
    s1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), s1);
  }
  float s = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) {
    float wf = _cvtsh_ss(w[i]);
    s += wf * x[i];
  }
  return s;
}

// 4 rows x 3 tokens register block over fp32 weights: 12 accumulators, 7 loads per 12 FMAs.
inline void dot_4x3(const float* w, int64_t ldw, const float* x, int64_t ldx, int64_t n, float out[4][3]) {
  __m256 acc[4][3];
  for (auto& r : acc) r[0] = r[1] = r[2] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + ldx + i), x2 = _mm256_loadu_ps(x + 2 * ldx + i);
    for (int r = 0; r < 4; ++r) {
      const __m256 wr = _mm256_loadu_ps(w + r * ldw + i);
      acc[r][0] = _mm256_fmadd_ps(wr, x0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(wr, x1, acc[r][1]);
      acc[r][2] = _mm256_fmadd_ps(wr, x2, acc[r][2]);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int t = 0; t < 3; ++t) {
      float s = hsum(acc[r][t]);
      for (int64_t j = i; j < n; ++j) s += w[r * ldw + j] * x[t * ldx + j];
      out[r][t] = s;
    }
}

}  // namespace

void matmul(const CpuMatrix& w, const float* x, float* y, int64_t n_tok, const float* bias) {
  const int64_t rows = w.rows(), cols = w.cols();
  constexpr int64_t kRowBlock = 16;
  if (n_tok <= 2) {
    // Decode: one pass over the weights, straight from storage.
    ThreadPool::global().parallel_for(rows, [&](int64_t b, int64_t e, int) {
      for (int64_t r = b; r < e; ++r)
        for (int64_t t = 0; t < n_tok; ++t) {
          const float* xt = x + t * cols;
          float s = w.type() == CpuWeightType::F32 ? dot_f32(w.f32_data() + r * cols, xt, cols)
                                                   : dot_f16_f32(w.f16_data() + r * cols, xt, cols);
          y[t * rows + r] = s + (bias ? bias[r] : 0.0f);
        }
    }, kRowBlock);
    return;
  }
  // Prefill: GEMM blocked so a tile of tokens (kTokTile x cols fp32, <= 300 KB) stays
  // in L2 while each block of weight rows, converted to fp32 once per tile, is used
  // against every token of the tile.
  constexpr int64_t kTokTile = 48;
  ThreadPool::global().parallel_for(rows, [&](int64_t b, int64_t e, int) {
    std::vector<float> buf(static_cast<size_t>(kRowBlock * cols));
    for (int64_t t0 = 0; t0 < n_tok; t0 += kTokTile) {
      const int64_t t1 = std::min(n_tok, t0 + kTokTile);
      for (int64_t r0 = b; r0 < e; r0 += kRowBlock) {
        const int64_t nr = std::min(kRowBlock, e - r0);
        const float* wb;
        if (w.type() == CpuWeightType::F32) {
          wb = w.f32_data() + r0 * cols;
        } else {
          for (int64_t r = 0; r < nr; ++r) w.row_to_f32(r0 + r, buf.data() + r * cols);
          wb = buf.data();
        }
        auto emit = [&](int64_t t, int64_t r, float v) { y[t * rows + r0 + r] = v + (bias ? bias[r0 + r] : 0.0f); };
        int64_t t = t0;
        for (; t + 3 <= t1; t += 3) {
          int64_t r = 0;
          for (; r + 4 <= nr; r += 4) {
            float o[4][3];
            dot_4x3(wb + r * cols, cols, x + t * cols, cols, cols, o);
            for (int i = 0; i < 4; ++i)
              for (int j = 0; j < 3; ++j) emit(t + j, r + i, o[i][j]);
          }
          for (; r < nr; ++r)
            for (int j = 0; j < 3; ++j) emit(t + j, r, dot_f32(wb + r * cols, x + (t + j) * cols, cols));
        }
        for (; t < t1; ++t)
          for (int64_t r = 0; r < nr; ++r) emit(t, r, dot_f32(wb + r * cols, x + t * cols, cols));
      }
    }
  }, kRowBlock);
}

void rms_norm(const float* x, const float* weight, float* y, int64_t n_rows, int64_t n, float eps) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * weight[i];
  }
}

void rope(float* x, const int32_t* pos, int64_t n_tok, int64_t n_heads, int64_t head_dim,
          const float* inv_freq, RopeStyle style) {
  const int64_t half = head_dim / 2;
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      // NOTE: angle in double: position x frequency loses digits in fp32 at 100k+ positions.
      const double a = static_cast<double>(pos[t]) * inv_freq[i];
      cs[static_cast<size_t>(i)] = static_cast<float>(std::cos(a));
      sn[static_cast<size_t>(i)] = static_cast<float>(std::sin(a));
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = style == RopeStyle::Half ? i : 2 * i;
        const int64_t b = style == RopeStyle::Half ? i + half : 2 * i + 1;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * cs[static_cast<size_t>(i)] - x1 * sn[static_cast<size_t>(i)];
        v[b] = x0 * sn[static_cast<size_t>(i)] + x1 * cs[static_cast<size_t>(i)];
      }
    }
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n_tok, int64_t n) {
  const int64_t total = n_tok * n;
  for (int64_t i = 0; i < total; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace dhs::cpu
