// Histogram and the steady clock of the serving API (dhisparse/scheduler.h).
#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "dhisparse/scheduler.h"

namespace dhs {

Histogram::Histogram(std::vector<double> upper_bounds) : bounds(std::move(upper_bounds)), counts(bounds.size(), 0) {
  DHS_CHECK(std::is_sorted(bounds.begin(), bounds.end()), "histogram bounds must be sorted");
}

void Histogram::add(double v) {
  // Cumulative buckets (Prometheus' "le"): every bound >= v counts it.
  for (size_t i = bounds.size(); i-- > 0 && v <= bounds[i];) ++counts[i];
  ++count;
  sum += v;
}

double Histogram::quantile(double q) const {
  if (count == 0) return 0.0;
  const double want = q * static_cast<double>(count);
  for (size_t i = 0; i < bounds.size(); ++i)
    if (static_cast<double>(counts[i]) >= want) return bounds[i];
  return bounds.empty() ? 0.0 : bounds.back();  // past the last bound (+Inf bucket)
}

namespace {
class SteadyClock final : public Clock {
 public:
  double now() const override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
};
}  // namespace

std::shared_ptr<Clock> steady_clock() { return std::make_shared<SteadyClock>(); }

}  // namespace dhs
