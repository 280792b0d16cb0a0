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

// Batch invariance: every y[t, r] is the same canonical dot product, whether the step has
// one token or 512 and whichever kernel below computes it, so a request's logits and K/V do
// not depend on what else shares its step (continuous batching must return the tokens
// `generate` returns alone). The canonical dot of a weight row w and a token row x:
//   acc = 0 (8 lanes); for each 8-block b of the columns, in order, acc = fma(w_b, x_b, acc),
//   the last block zero-padded when cols % 8 != 0; result = hsum(acc).
// One accumulator chain per (row, token); the kernels get their parallelism from several
// rows and tokens at once, never by splitting a chain. fp16 weights widen exactly to fp32,
// so the fp16 GEMV (converting in registers) and the GEMM (converting a block into a
// buffer) agree bit for bit.

// Lanes [0, n) set, n in [0, 8].
inline __m256i lane_mask(int64_t n) {
  alignas(32) static constexpr int32_t kMask[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMask + 8 - n));
}

// Rows of fp32 weights, row r at p + r * ld.
struct F32Rows {
  const float* p;
  int64_t ld;
  __m256 load(int r, int64_t i) const { return _mm256_loadu_ps(p + r * ld + i); }
  // Columns [i, n) and zeros: n - i < 8 lanes, set in m.
  __m256 load_tail(int r, int64_t i, int64_t, __m256i m) const { return _mm256_maskload_ps(p + r * ld + i, m); }
};

// Rows of fp16 weights, widened in registers.
struct F16Rows {
  const uint16_t* p;
  int64_t ld;
  __m256 load(int r, int64_t i) const {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + r * ld + i)));
  }
  // No 16-bit masked load in AVX2: copy the n - i < 8 last halves into a zeroed block.
  __m256 load_tail(int r, int64_t i, int64_t n, __m256i) const {
    alignas(16) uint16_t b[8] = {};
    for (int64_t j = i; j < n; ++j) b[j - i] = p[r * ld + j];
    return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(b)));
  }
};

// R weight rows x TT token rows of canonical dots: out[r * ldo + t].
// Registers: R * TT accumulators + TT token blocks + 1 weight block <= 16 (4x3, 8x1, 4x2).
template <int R, int TT, class W>
inline void dot_tile(const W& w, const float* x, int64_t ldx, int64_t n, float* out, int64_t ldo) {
  __m256 acc[R][TT];
  for (auto& a : acc)
    for (auto& v : a) v = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 xv[TT];
    for (int t = 0; t < TT; ++t) xv[t] = _mm256_loadu_ps(x + t * ldx + i);
    for (int r = 0; r < R; ++r) {
      const __m256 wr = w.load(r, i);
      for (int t = 0; t < TT; ++t) acc[r][t] = _mm256_fmadd_ps(wr, xv[t], acc[r][t]);
    }
  }
  if (i < n) {
    const __m256i m = lane_mask(n - i);
    __m256 xv[TT];
    for (int t = 0; t < TT; ++t) xv[t] = _mm256_maskload_ps(x + t * ldx + i, m);
    for (int r = 0; r < R; ++r) {
      const __m256 wr = w.load_tail(r, i, n, m);
      for (int t = 0; t < TT; ++t) acc[r][t] = _mm256_fmadd_ps(wr, xv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TT; ++t) out[r * ldo + t] = hsum(acc[r][t]);
}

// Rows [0, nr) of w against TT tokens: blocks of R_MAIN rows, then single rows (same dots).
template <int R_MAIN, int TT, class W>
inline void dot_rows(const W& w, int64_t nr, const float* x, int64_t ldx, int64_t n, float* out, int64_t ldo) {
  int64_t r = 0;
  for (; r + R_MAIN <= nr; r += R_MAIN)
    dot_tile<R_MAIN, TT>(W{w.p + r * w.ld, w.ld}, x, ldx, n, out + r * ldo, ldo);
  for (; r < nr; ++r) dot_tile<1, TT>(W{w.p + r * w.ld, w.ld}, x, ldx, n, out + r * ldo, ldo);
}

}  // namespace

void matmul(const CpuMatrix& w, const float* x, float* y, int64_t n_tok, const float* bias) {
  const int64_t rows = w.rows(), cols = w.cols();
  constexpr int64_t kRowBlock = 16;
  // out: [kRowBlock, 3] dots of a row block, written to y with the bias.
  auto emit = [&](int64_t r0, int64_t nr, int64_t t0, int64_t nt, const float* out) {
    for (int64_t r = 0; r < nr; ++r)
      for (int64_t t = 0; t < nt; ++t) y[(t0 + t) * rows + r0 + r] = out[r * 3 + t] + (bias ? bias[r0 + r] : 0.0f);
  };
  if (n_tok <= 2) {
    // Decode: one pass over the weights, straight from storage.
    ThreadPool::global().parallel_for(rows, [&](int64_t b, int64_t e, int) {
      float out[kRowBlock * 3];
      for (int64_t r0 = b; r0 < e; r0 += kRowBlock) {
        const int64_t nr = std::min(kRowBlock, e - r0);
        auto run = [&](auto rows_of) {
          if (n_tok == 1) dot_rows<8, 1>(rows_of, nr, x, cols, cols, out, 3);
          else dot_rows<4, 2>(rows_of, nr, x, cols, cols, out, 3);
        };
        if (w.type() == CpuWeightType::F32) run(F32Rows{w.f32_data() + r0 * cols, cols});
        else run(F16Rows{w.f16_data() + r0 * cols, cols});
        emit(r0, nr, 0, n_tok, out);
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
    float out[kRowBlock * 3];
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
        const F32Rows wr{wb, cols};
        int64_t t = t0;
        for (; t + 3 <= t1; t += 3) {
          dot_rows<4, 3>(wr, nr, x + t * cols, cols, cols, out, 3);
          emit(r0, nr, t, 3, out);
        }
        if (t1 - t == 2) dot_rows<4, 2>(wr, nr, x + t * cols, cols, cols, out, 3);
        if (t1 - t == 1) dot_rows<8, 1>(wr, nr, x + t * cols, cols, cols, out, 3);
        emit(r0, nr, t, t1 - t, out);
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
