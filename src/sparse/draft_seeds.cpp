#include "sparse/draft_seeds.h"

#include <algorithm>

#include "core/error.h"

namespace dhs {

std::vector<int32_t> heaviest_pages(const std::vector<double>& mass, std::vector<int32_t> idx, int m) {
  const size_t k = std::min(idx.size(), static_cast<size_t>(std::max(m, 0)));
  const auto heavier = [&](int32_t a, int32_t b) {
    const double ma = mass[static_cast<size_t>(a)], mb = mass[static_cast<size_t>(b)];
    return ma != mb ? ma > mb : a < b;
  };
  std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(), heavier);
  idx.resize(k);
  return idx;
}

void DraftSeeds::set_capacity(int m) {
  DHS_CHECK(m >= 0 && m <= (1 << 16), "draft seeds per list must be in [0, 65536] (got {})", m);
  if (m == m_) return;
  m_ = m;
  clear();
}

void DraftSeeds::record(int layer, int head, int n_heads_kv, const std::vector<double>& mass,
                        const std::vector<int32_t>& chosen) {
  if (m_ == 0) return;
  DHS_ASSERT(layer >= 0 && head >= 0 && head < n_heads_kv);
  const size_t need = static_cast<size_t>(layer + 1) * static_cast<size_t>(n_heads_kv) * static_cast<size_t>(m_);
  if (pages_.size() < need) pages_.resize(need, -1);
  const std::vector<int32_t> top = heaviest_pages(mass, chosen, m_);
  int32_t* dst = pages_.data() + (static_cast<size_t>(layer) * static_cast<size_t>(n_heads_kv) + static_cast<size_t>(head)) *
                                     static_cast<size_t>(m_);
  std::fill(dst, dst + m_, -1);
  std::copy(top.begin(), top.end(), dst);
  first_pos_ = pending_pos_;
}

std::vector<int32_t> DraftSeeds::pages(int layer, int head, int n_heads_kv, int m, int64_t n_pages) const {
  std::vector<int32_t> out;
  const size_t base = (static_cast<size_t>(layer) * static_cast<size_t>(n_heads_kv) + static_cast<size_t>(head)) *
                      static_cast<size_t>(m_);
  if (empty() || base + static_cast<size_t>(m_) > pages_.size()) return out;
  for (int i = 0; i < std::min(m, m_); ++i) {
    const int32_t p = pages_[base + static_cast<size_t>(i)];
    if (p >= 0 && p < n_pages) out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void DraftSeeds::truncate(int64_t n_tokens) {
  if (first_pos_ >= n_tokens) clear();
}

void DraftSeeds::clear() {
  pages_.clear();
  first_pos_ = -1;
}

}  // namespace dhs
