#include "kv/device_budgets.h"

#include <algorithm>
#include <cmath>

namespace dhs {

DeviceBudgets::DeviceBudgets(BudgetParams p) : p_(p) {}

void DeviceBudgets::observe(int64_t id, int64_t read, int64_t recalled) {
  if (read <= 0) return;  // a step that read no page of its own says nothing
  State& s = st_[id];
  const double miss = static_cast<double>(std::clamp<int64_t>(recalled, 0, read)) / static_cast<double>(read);
  if (s.steps == 0) {
    s.working_set = static_cast<double>(read);
    s.miss = miss;
    s.buffer = p_.buffer;
  } else {
    s.working_set += p_.avg * (static_cast<double>(read) - s.working_set);
    s.miss += p_.avg * (miss - s.miss);
  }
  ++s.steps;
  if (s.miss > p_.target_miss) s.buffer *= p_.grow;
  else if (s.miss < p_.target_miss / 4) s.buffer *= p_.shrink;
  s.buffer = std::clamp(s.buffer, p_.min_buffer, p_.max_buffer);
}

void DeviceBudgets::forget(int64_t id) { st_.erase(id); }

void DeviceBudgets::set_target_miss(double target) {
  p_.target_miss = std::isfinite(target) ? std::clamp(target, p_.min_target_miss, p_.max_target_miss) : p_.max_target_miss;
}

DeviceBudgets::State DeviceBudgets::state(int64_t id) const {
  const auto it = st_.find(id);
  return it == st_.end() ? State{} : it->second;
}

std::vector<int64_t> DeviceBudgets::budgets(std::span<const Request> reqs, int64_t capacity, bool* bound) const {
  if (bound) *bound = false;
  std::vector<int64_t> out(reqs.size(), kUnlimited);
  int64_t all = 0, unobserved = 0;
  for (const Request& r : reqs) all += r.full_pages;
  if (all <= capacity) return out;  // room for everything: nothing offloaded
  std::vector<size_t> obs;
  std::vector<int64_t> ws(reqs.size(), 0), want(reqs.size(), 0);
  int64_t sum_ws = 0, sum_want = 0, sum_full = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const State s = state(reqs[i].id);
    if (s.steps < p_.warmup) {
      unobserved += reqs[i].full_pages;
      continue;
    }
    obs.push_back(i);
    ws[i] = std::min(reqs[i].full_pages, static_cast<int64_t>(std::ceil(s.working_set)));
    want[i] = std::min(reqs[i].full_pages, static_cast<int64_t>(std::ceil(s.working_set * (1.0 + s.buffer))));
    sum_ws += ws[i];
    sum_want += want[i];
    sum_full += reqs[i].full_pages;
  }
  // What the observed requests share: the requests still warming up keep what they hold.
  const int64_t cap = std::max<int64_t>(0, capacity - unobserved);
  if (sum_full <= cap) return out;
  if (sum_want <= cap) {
    for (size_t i : obs) out[i] = want[i];
    return out;
  }
  if (bound) *bound = true;
  if (sum_ws <= cap) {  // working sets, and the rest in proportion to the buffers wanted
    const double rest = static_cast<double>(cap - sum_ws), extra = static_cast<double>(sum_want - sum_ws);
    for (size_t i : obs)
      out[i] = ws[i] + static_cast<int64_t>(std::floor(rest * static_cast<double>(want[i] - ws[i]) / extra));
  } else {  // not even the working sets: scaled down alike
    for (size_t i : obs)
      out[i] = static_cast<int64_t>(std::floor(static_cast<double>(cap) * static_cast<double>(ws[i]) /
                                               static_cast<double>(sum_ws)));
  }
  return out;
}

}  // namespace dhs
