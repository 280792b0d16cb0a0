// What the GEMV tests (test_quant_gemv.cu, test_packed_gemv.cu) check of one launch's output, on
// the host: y = x W^T (+ y0 when accumulating) against a double-precision sum over the CPU's
// weights w [out, in] and the same f16 activations x [n_tok, in], every element; tolerance
// 2e-6 * in * S + 1e-6 (S = sum |w_i x_i|: fp32 sums in another order err by at most
// in * 2^-24 * S), plus 2^-10 |ref| for an f16 output (one rounding: 2^-11). Columns out..ldy-1 (other
// parts' columns) must be untouched. mode: 0 f16 output, 1 fp32, 2 fp32 accumulated.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/fp16.h"

namespace dhs::test {

// Elements out of tolerance (a touched gap column counts too); prints the first 3 and a summary
// line starting with `what`.
inline int gemv_errors(const std::string& what, const std::vector<float>& w, const std::vector<uint16_t>& x,
                       const std::vector<float>& y0, const std::vector<uint16_t>& y0_h, const std::vector<float>& got,
                       int n_tok, int64_t in, int64_t out, int64_t ldy, int mode) {
  const bool f32 = mode != 0, acc = mode == 2;
  int bad = 0;
  double worst = 0;
  for (int t = 0; t < n_tok; ++t) {
    for (int64_t o = 0; o < out; ++o) {
      const size_t at = static_cast<size_t>(t * ldy + o);
      double ref = acc ? y0[at] : 0.0, mag = 0.0;
      for (int64_t i = 0; i < in; ++i) {
        const double pr = static_cast<double>(w[static_cast<size_t>(o * in + i)]) *
                          dhs::fp16_to_f32(x[static_cast<size_t>(t * in + i)]);
        ref += pr;
        mag += std::fabs(pr);
      }
      const double tol = 2e-6 * static_cast<double>(in) * mag + 1e-6 + (f32 ? 0.0 : std::ldexp(std::fabs(ref), -10));
      const double err = std::fabs(got[at] - ref);
      worst = std::max(worst, err / tol);
      if (!(err <= tol)) {
        if (bad < 3)
          std::printf("  %s n_tok %d in %lld out %lld mode %d: y[%d, %lld] = %.7g, ref %.7g (tol %.3g)\n", what.c_str(),
                      n_tok, static_cast<long long>(in), static_cast<long long>(out), mode, t, static_cast<long long>(o),
                      got[at], ref, tol);
        ++bad;
      }
    }
    for (int64_t o = out; o < ldy; ++o) {  // the columns of other parts: untouched
      const size_t at = static_cast<size_t>(t * ldy + o);
      const float before = f32 ? y0[at] : dhs::fp16_to_f32(y0_h[at]);
      bad += got[at] != before;
    }
  }
  std::printf("%-5s n_tok %d in %6lld out %3lld %-7s worst err / tol %.3f\n", what.c_str(), n_tok,
              static_cast<long long>(in), static_cast<long long>(out), mode == 0 ? "f16" : mode == 1 ? "f32" : "f32 +=",
              worst);
  return bad;
}

}  // namespace dhs::test
