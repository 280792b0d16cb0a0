// Page pool of one tier: storage for n_pages head-pages, K and V apart, plus the
// allocator (a free stack) and ownership accounting. Storage is fp32 on the CPU
// backend (exact oracle); the CUDA backend keeps its bf16 pages in HBM
// (backend/cuda/device_page_pool.h) and uses this pool without storage, for allocation.
//
//   k_: [n_pages, page_size, head_dim]   v_: [n_pages, page_size, head_dim]
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dhisparse/kv_stats.h"
#include "kv/page_ref.h"

namespace dhs {


class PagePool {
 public:
  // with_storage = false: allocator and accounting only, for pools whose pages
  // live elsewhere (the CUDA backend's HBM pool); k_page/v_page must not be used.
  PagePool(Tier tier, int64_t n_pages, int page_size, int head_dim, bool with_storage = true);

  Tier tier() const { return tier_; }
  int page_size() const { return page_size_; }
  int head_dim() const { return head_dim_; }
  int64_t n_pages() const { return n_pages_; }
  bool has_storage() const { return !k_.empty(); }
  int64_t n_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t n_used() const { return n_pages_ - n_free(); }
  PoolStats stats() const { return {n_pages_, n_free(), n_used()}; }

  // Allocates n pages or none: returns false (and allocates nothing) if fewer are free.
  bool allocate(int64_t n, std::vector<PageRef>* out);
  // Frees a page. Throws dhs::Error on double free or a ref of another tier.
  void free(PageRef p);

  bool is_used(PageRef p) const;

  // [page_size, head_dim] for the page's K / V rows.
  float* k_page(PageRef p) { return k_.data() + offset(p); }
  float* v_page(PageRef p) { return v_.data() + offset(p); }
  const float* k_page(PageRef p) const { return k_.data() + offset(p); }
  const float* v_page(PageRef p) const { return v_.data() + offset(p); }

  // Consistency check: free + used == total, every free slot unique and not marked used.
  // Returns "" when consistent, else a description of the first violation.
  std::string check_invariants() const;

 private:
  size_t offset(PageRef p) const;

  Tier tier_;
  int64_t n_pages_;
  int page_size_, head_dim_;
  std::vector<float> k_, v_;      // storage, see header comment
  std::vector<int32_t> free_;     // stack of free slots
  std::vector<uint8_t> used_;     // [n_pages] 1 if allocated
};

}  // namespace dhs
