#include "engine/spec_controller.h"

#include <algorithm>
#include <cmath>

namespace dhs {

StepCostModel::StepCostModel(double forget) : forget_(forget) {
  // A wide prior around zero: the first steps set the fit.
  for (int i = 0; i < 3; ++i) P_[i][i] = 1e6;
}

void StepCostModel::observe(double rows, double kv_tokens, double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return;
  // Features scaled so that P stays well conditioned (rows ~1-2048, kv up to ~1e8).
  const std::array<double, 3> x{1.0, rows, kv_tokens * 1e-3};
  std::array<double, 3> Px{};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) Px[i] += P_[i][j] * x[j];
  double denom = forget_;
  for (int i = 0; i < 3; ++i) denom += x[i] * Px[i];
  const double err = seconds - (theta_[0] * x[0] + theta_[1] * x[1] + theta_[2] * 1e3 * x[2]);
  // theta holds p per token: the scaled coordinate's gain is scaled back.
  std::array<double, 3> k{};
  for (int i = 0; i < 3; ++i) k[i] = Px[i] / denom;
  theta_[0] += k[0] * err;
  theta_[1] += k[1] * err;
  theta_[2] += k[2] * err * 1e-3;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) P_[i][j] = (P_[i][j] - k[i] * Px[j]) / forget_;
  ++n_;
  if (first_rows_ < 0) first_rows_ = rows;
  else if (rows != first_rows_) rows_seen_varied_ = true;
}

double StepCostModel::predict(double rows, double kv_tokens) const {
  return theta_[0] + theta_[1] * rows + theta_[2] * kv_tokens;
}

void AcceptanceEstimate::observe(int drafted, int accepted) {
  drafted_ = drafted_ * forget_ + drafted;
  accepted_ = accepted_ * forget_ + accepted;
}

double spec_expected_tokens(double a, int k) {
  a = std::clamp(a, 0.0, 1.0);
  if (a >= 1.0) return k + 1.0;
  return (1.0 - std::pow(a, k + 1)) / (1.0 - a);
}

SpecChoice choose_speculation(const StepCostModel& cost, double alpha, const SpecCostInputs& in, int k_max,
                              double min_gain) {
  SpecChoice best;
  if (!cost.ready() || k_max <= 0) return best;
  const double w = std::max(0.0, cost.fixed()) / std::max(1, in.batch);
  const double m = std::max(0.0, cost.per_row()), p = std::max(0.0, cost.per_kv_token());
  const double ctx = static_cast<double>(in.context);
  const double draft_ctx = static_cast<double>(std::min(in.draft_context, in.context));
  const double plain = w + m + p * ctx;  // one token
  if (!(plain > 0)) return best;
  for (int k = 1; k <= k_max; ++k) {
    const double drafts = k * (w + m + p * draft_ctx);
    const double verify = w + (k + 1) * m + (in.verify_reads_once ? 1.0 : k + 1.0) * p * ctx;
    const double gain = spec_expected_tokens(alpha, k) * plain / (drafts + verify);
    if (gain > best.gain) best = {k, gain};
  }
  if (best.gain < min_gain) best = {};
  return best;
}

int SpecProbe::drafts(const StepCostModel& cost, const SpecCostInputs& in, int k_max, bool fit_saw_drafts) {
  // (A verify that reads the KV once per row never pays in this cost model: no probe.)
  if (k_max <= 0 || since_ < gap_ || in.context <= 2 * in.draft_context || !in.verify_reads_once) return 0;
  if (cost.ready() && fit_saw_drafts && choose_speculation(cost, kProbeAlpha, in, k_max).k == 0) return 0;
  since_ = 0;
  gap_ = std::min(2 * gap_, kMaxProbeGap);
  return std::min(kProbeDrafts, k_max);
}

}  // namespace dhs
