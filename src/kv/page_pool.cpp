#include "kv/page_pool.h"

#include "core/error.h"

namespace dhs {

PagePool::PagePool(Tier tier, int64_t n_pages, int page_size, int head_dim, bool with_storage)
    : tier_(tier), n_pages_(n_pages), page_size_(page_size), head_dim_(head_dim) {
  DHS_CHECK(n_pages > 0 && n_pages < (int64_t{1} << 31), "page pool: bad page count {}", n_pages);
  DHS_CHECK(page_size > 0 && head_dim > 0, "page pool: bad page shape {}x{}", page_size, head_dim);
  const size_t n_elems = static_cast<size_t>(n_pages) * page_size * head_dim;
  if (with_storage) {
    k_.assign(n_elems, 0.0f);
    v_.assign(n_elems, 0.0f);
  }
  used_.assign(static_cast<size_t>(n_pages), 0);
  free_.reserve(static_cast<size_t>(n_pages));
  // Highest slot at the bottom so slots come out in ascending order (easier to read in tests).
  for (int64_t i = n_pages - 1; i >= 0; --i) free_.push_back(static_cast<int32_t>(i));
}

bool PagePool::allocate(int64_t n, std::vector<PageRef>* out) {
  if (n > n_free()) return false;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t s = free_.back();
    free_.pop_back();
    used_[static_cast<size_t>(s)] = 1;
    out->push_back(PageRef{tier_, s});
  }
  return true;
}

void PagePool::free(PageRef p) {
  DHS_CHECK(p.tier == tier_, "page pool: freeing a {} page into the {} pool", tier_name(p.tier),
            tier_name(tier_));
  DHS_CHECK(p.slot >= 0 && p.slot < n_pages_, "page pool: slot {} out of range", p.slot);
  DHS_CHECK(used_[static_cast<size_t>(p.slot)] == 1, "page pool: double free of slot {}", p.slot);
  used_[static_cast<size_t>(p.slot)] = 0;
  free_.push_back(p.slot);
}

bool PagePool::is_used(PageRef p) const {
  return p.tier == tier_ && p.slot >= 0 && p.slot < n_pages_ && used_[static_cast<size_t>(p.slot)];
}

size_t PagePool::offset(PageRef p) const {
  // NOTE: size_t arithmetic: a 128k-token pool exceeds 2^31 elements.
  return static_cast<size_t>(p.slot) * static_cast<size_t>(page_size_) * static_cast<size_t>(head_dim_);
}

std::string PagePool::check_invariants() const {
  int64_t n_marked = 0;
  for (auto u : used_) n_marked += u;
  std::vector<uint8_t> seen(used_.size(), 0);
  for (auto s : free_) {
    if (s < 0 || s >= n_pages_) return fmt::format("free slot {} out of range", s);
    if (seen[static_cast<size_t>(s)]) return fmt::format("slot {} is free twice", s);
    if (used_[static_cast<size_t>(s)]) return fmt::format("slot {} is both free and used", s);
    seen[static_cast<size_t>(s)] = 1;
  }
  if (n_marked + n_free() != n_pages_)
    return fmt::format("used {} + free {} != total {}", n_marked, n_free(), n_pages_);
  return "";
}

}  // namespace dhs
