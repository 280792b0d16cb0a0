// What a page crossing between the tiers costs a step, measured (IO-aware admission, issue 23).
// The link's bulk rate prices a page at its bytes (4 KiB at 55 GB/s: 75 ns), but a moved page
// also costs the host its bookkeeping (the tables, the LRU, the device table's patch, the
// landing's adoption: ~100–200 ns a page for the adoption alone on the H100; in a serving run of the
// default model the in-flight bookkeeping outlasted the step's kernels, ~1 µs per late page:
// docs/hierarchy.md), which the bulk rate does not see. IoCost fits the hierarchy's time per step against the pages it moved, as
//   seconds(step) ≈ fixed + per_page × pages,
// by least squares over recent steps (each step's weight decays by `forget` a step), so a fixed
// cost per step (the stamps' scan, the budgets) is not charged to the pages. The per-page cost
// is never below the link's (bytes over the bulk rate), and is the link's until the steps seen
// differ enough in pages moved to fit a slope.
#pragma once
#include <cstdint>

namespace dhs {

class IoCost {
 public:
  // link_page_seconds: one page's bytes over the link's bulk rate.
  explicit IoCost(double link_page_seconds = 0.0, double forget = 0.95);

  void set_link_page_seconds(double s) { link_ = s; }
  // One step: pages moved or read in place, and the hierarchy's seconds in it (the host's
  // bookkeeping measured, plus the pages' bytes at the link's rate).
  void observe(int64_t pages, double seconds);
  // Seconds one more page a step costs (>= the link's).
  double per_page_seconds() const;
  double link_page_seconds() const { return link_; }

 private:
  double link_ = 0.0, forget_ = 0.95;
  double w_ = 0.0, sx_ = 0.0, sy_ = 0.0, sxx_ = 0.0, sxy_ = 0.0;  // decayed sums: weight, x, y, x², xy
};

}  // namespace dhs
