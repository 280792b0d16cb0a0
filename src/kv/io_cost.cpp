#include "kv/io_cost.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dhs {

IoCost::IoCost(double link_page_seconds, double forget) : link_(link_page_seconds), forget_(forget) {
  DHS_CHECK(link_page_seconds >= 0.0 && forget > 0.0 && forget < 1.0, "IoCost: link {} s a page, forget {}", link_page_seconds,
            forget);
}

void IoCost::observe(int64_t pages, double seconds) {
  if (pages < 0 || !(seconds >= 0.0) || !std::isfinite(seconds)) return;
  const double x = static_cast<double>(pages);
  w_ = forget_ * w_ + 1.0;
  sx_ = forget_ * sx_ + x;
  sy_ = forget_ * sy_ + seconds;
  sxx_ = forget_ * sxx_ + x * x;
  sxy_ = forget_ * sxy_ + x * seconds;
}

double IoCost::per_page_seconds() const {
  if (w_ <= 0.0) return link_;
  const double mx = sx_ / w_, my = sy_ / w_;
  const double var = sxx_ / w_ - mx * mx;
  // (the pages moved must vary by a tenth of their mean, and by more than a page, for a slope)
  if (!(var > std::max(1.0, 1e-2 * mx * mx))) return link_;
  const double slope = (sxy_ / w_ - mx * my) / var;
  return std::max(link_, slope);
}

}  // namespace dhs
