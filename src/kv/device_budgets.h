// The KV hierarchy's cache manager (issue 23, item 2): how many full pages each request keeps in
// the device tier, from what its steps read, how often they missed, and how much the device tier
// holds across requests. A policy object: the runner reports each request's decode steps and asks
// for budgets; TieredKv::set_budget enforces them.
//
// Per request r, from its decode steps (a prefill chunk reads its own pages and is not observed):
//   W_r  working set — pages a step reads (all layers and KV heads), an exponential average;
//   m_r  miss rate — the share of those pages the step had to recall, an exponential average;
//   b_r  buffer ratio — starts at `buffer`; ×grow after a step whose average miss rate is above
//        `target_miss`, ×shrink after one below a quarter of it, kept in [min_buffer, max_buffer].
// The budget wanted is ceil(W_r × (1 + b_r)). Across the requests sharing `capacity` device pages
// (what the tier holds for full pages, the pages lists append into not counted):
//   - all requests' full pages fit: no budget (nothing is offloaded; the hierarchy costs nothing);
//   - else each request's wanted budget if they fit together; if they do not, each first gets its
//     working set (scaled down alike when even the working sets do not fit), and what is left is
//     shared in proportion to the buffers wanted, W_r × b_r;
//   - a request with fewer than `warmup` observed decode steps (its prefill, its first steps)
//     keeps no budget, and the full pages it holds come off the capacity the others share.
// A budget below what one layer reads at once is kept softly: TieredKv keeps the pages of the
// layer being computed resident past it and offloads the excess when the step ends.
//
// The miss target follows the link's load where the runner measures it (set_target_miss, from
// RunnerTiers' link rule: the misses a step may carry within a share of its time at a page's
// measured price): a loaded or slow link lowers it, so the buffers grow and fewer pages cross;
// a link with time to spare raises it, so the buffers shrink and leave HBM to other requests.
#pragma once
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace dhs {

struct BudgetParams {
  double buffer = 0.5;         // initial buffer ratio (the reference design: up to 4-5x)
  double min_buffer = 0.1, max_buffer = 4.0;
  double grow = 1.5, shrink = 0.9;
  double target_miss = 0.025;  // pages recalled per page read (docs/hierarchy.md: churn <~ 2.5%)
  // set_target_miss keeps the target within these (below 0.1%: buffers past any pool; above 10%:
  // a step mostly misses whatever the link allows)
  double min_target_miss = 0.001, max_target_miss = 0.1;
  double avg = 0.3;            // weight of the newest step in the averages
  int warmup = 2;              // decode steps observed before a budget applies
};

class DeviceBudgets {
 public:
  static constexpr int64_t kUnlimited = INT64_MAX;

  explicit DeviceBudgets(BudgetParams p = {});

  // One decode step of request `id`: pages it read and how many of them were recalled.
  void observe(int64_t id, int64_t read, int64_t recalled);
  void forget(int64_t id);
  // The miss rate the buffers are sized against from the next observe on, kept within
  // [min_target_miss, max_target_miss]; target_miss() the one in force.
  void set_target_miss(double target);
  double target_miss() const { return p_.target_miss; }

  struct Request {
    int64_t id = 0;
    int64_t full_pages = 0;  // full pages it holds in both tiers (what could be offloaded at most)
  };
  // Budgets (full device pages) for `reqs`, in their order, sharing `capacity` pages. bound
  // (optional): whether capacity bound them — the observed requests' wanted budgets, working set
  // and buffer, did not all fit, so the pool is full and the buffers were cut; false where every
  // request got what it wants (or everything fits).
  std::vector<int64_t> budgets(std::span<const Request> reqs, int64_t capacity, bool* bound = nullptr) const;

  struct State {
    double working_set = 0, miss = 0, buffer = 0;
    int64_t steps = 0;
  };
  // A request's current estimates (zeros before its first observation).
  State state(int64_t id) const;

 private:
  BudgetParams p_;
  std::unordered_map<int64_t, State> st_;
};

}  // namespace dhs
