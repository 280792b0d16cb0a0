// What a whole step costs, fitted (IO-aware admission's throughput rule, issue 23):
//   seconds(step) ≈ fixed + per_row × decode rows + per_token × prefill tokens + per_page × pages
// where pages are those the KV hierarchy moved between its tiers or read in place in the step.
// IoCost (io_cost.h) prices a page from the host's time in the hierarchy; this fit sees what a
// page costs the step as a whole (the landing kernel's mapped reads, waits, the host's work that
// the kernels do not hide) and the step's fixed part, which one more running request shares. By
// least squares over recent steps (each step's weight decays by `forget`). A covariate that has
// not varied enough over those steps cannot be told from the fixed part: it is left out of the fit
// and the fit says so (Fit::rows_vary, Fit::pages_vary), so the fixed part is known only when the
// decode rows varied (and the pages and prefill tokens varied, or were 0).
#pragma once
#include <array>

namespace dhs {

class StepCost {
 public:
  explicit StepCost(double forget = 0.98);

  // One step: its decode rows (each request's one new token, or its verify rows), prefill tokens,
  // the pages the hierarchy moved or read in place, and its wall seconds.
  void observe(double decode_rows, double prefill_tokens, double pages, double seconds);

  struct Fit {
    bool ok = false;                        // a fit was made (some steps, a solvable system)
    double fixed = 0.0;                     // seconds a step costs with no rows, tokens or pages
    double per_row = 0.0, per_token = 0.0;  // seconds per decode row, per prefill token
    double per_page = 0.0;                  // seconds per page moved or read in place
    bool rows_vary = false, tokens_vary = false, pages_vary = false;
    bool fixed_known = false;               // the fixed part is not the unfitted covariates' mean
  };
  Fit fit() const;
  double steps() const { return w_; }  // the decayed count of steps observed

 private:
  static constexpr int kN = 4;  // 1, rows, tokens, pages
  double forget_ = 0.98, w_ = 0.0;
  std::array<double, kN> sz_{};           // decayed sums of z
  std::array<double, kN * kN> szz_{};     // of z zᵀ
  std::array<double, kN> szy_{};          // of z y
  double sy_ = 0.0;
};

}  // namespace dhs
