#include "kv/step_cost.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dhs {

StepCost::StepCost(double forget) : forget_(forget) {
  DHS_CHECK(forget > 0.0 && forget < 1.0, "StepCost: forget {} must be in (0, 1)", forget);
}

void StepCost::observe(double decode_rows, double prefill_tokens, double pages, double seconds) {
  const double z[kN] = {1.0, decode_rows, prefill_tokens, pages};
  for (const double v : z)
    if (!(v >= 0.0) || !std::isfinite(v)) return;
  if (!(seconds >= 0.0) || !std::isfinite(seconds)) return;
  w_ = forget_ * w_ + 1.0;
  sy_ = forget_ * sy_ + seconds;
  for (int i = 0; i < kN; ++i) {
    sz_[i] = forget_ * sz_[i] + z[i];
    szy_[i] = forget_ * szy_[i] + z[i] * seconds;
    for (int j = 0; j < kN; ++j) szz_[i * kN + j] = forget_ * szz_[i * kN + j] + z[i] * z[j];
  }
}

StepCost::Fit StepCost::fit() const {
  Fit f;
  if (w_ < 3.0) return f;
  // Centred: the covariates' covariance and their covariance with the seconds (means over the
  // decayed weights), then the slopes of the covariates that vary, by Gaussian elimination.
  double mean[kN], cov[kN][kN], cy[kN];
  for (int i = 1; i < kN; ++i) mean[i] = sz_[i] / w_;
  const double my = sy_ / w_;
  for (int i = 1; i < kN; ++i) {
    cy[i] = szy_[i] / w_ - mean[i] * my;
    for (int j = 1; j < kN; ++j) cov[i][j] = szz_[i * kN + j] / w_ - mean[i] * mean[j];
  }
  // Varies: a standard deviation of at least a third of a row (rows), a token, or a page and a
  // tenth of the mean (as IoCost asks of the pages).
  const auto varies = [&](int i, double floor) { return cov[i][i] > std::max(floor, 1e-2 * mean[i] * mean[i]); };
  f.rows_vary = varies(1, 0.1);
  f.tokens_vary = varies(2, 1.0);
  f.pages_vary = varies(3, 1.0);
  int idx[kN - 1], n = 0;
  if (f.rows_vary) idx[n++] = 1;
  if (f.tokens_vary) idx[n++] = 2;
  if (f.pages_vary) idx[n++] = 3;
  double a[kN - 1][kN] = {};  // [n x n | rhs]
  for (int r = 0; r < n; ++r) {
    for (int c = 0; c < n; ++c) a[r][c] = cov[idx[r]][idx[c]];
    a[r][n] = cy[idx[r]];
  }
  for (int c = 0; c < n; ++c) {
    int p = c;
    for (int r = c + 1; r < n; ++r)
      if (std::abs(a[r][c]) > std::abs(a[p][c])) p = r;
    // (a pivot lost to cancellation: the covariates move together and cannot be told apart)
    if (!(std::abs(a[p][c]) > 1e-9 * cov[idx[c]][idx[c]])) return f;
    for (int k = 0; k <= n; ++k) std::swap(a[c][k], a[p][k]);
    for (int r = 0; r < n; ++r) {
      if (r == c) continue;
      const double m = a[r][c] / a[c][c];
      for (int k = c; k <= n; ++k) a[r][k] -= m * a[c][k];
    }
  }
  double slope[kN] = {};
  for (int r = 0; r < n; ++r) slope[idx[r]] = a[r][n] / a[r][r];
  f.per_row = slope[1];
  f.per_token = slope[2];
  f.per_page = slope[3];
  f.fixed = my - slope[1] * mean[1] - slope[2] * mean[2] - slope[3] * mean[3];
  f.fixed_known = f.rows_vary && (f.tokens_vary || mean[2] == 0.0) && (f.pages_vary || mean[3] == 0.0);
  f.ok = true;
  return f;
}

}  // namespace dhs
