#include "sparse/page_summary.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace dhs {

PageSummaryStore::PageSummaryStore(Tier tier, int64_t n_pages, int head_dim, int page_size)
    : tier_(tier), n_pages_(n_pages), head_dim_(head_dim), page_size_(page_size) {
  DHS_ASSERT(n_pages >= 0 && head_dim > 0 && page_size > 0);
  codes_.assign(static_cast<size_t>(n_pages) * page_size * head_dim, 0);
  code_scale_.assign(static_cast<size_t>(n_pages) * page_size, 0.0f);
  data_.assign(static_cast<size_t>(n_pages) * 4 * static_cast<size_t>(head_dim), 0.0f);
  n_rows_.assign(static_cast<size_t>(n_pages), 0);
  for (int64_t s = 0; s < n_pages; ++s) reset(static_cast<int32_t>(s));
}

PageSummaryStore::PageSummaryStore(const PagePool& pool)
    : PageSummaryStore(pool.tier(), pool.n_pages(), pool.head_dim(), pool.page_size()) {}

size_t PageSummaryStore::idx(int32_t slot) const {
  DHS_ASSERT(slot >= 0 && slot < n_pages_);
  return static_cast<size_t>(slot);
}

void PageSummaryStore::reset(int32_t slot) {
  float* mn = mut(slot, 0);
  float* mx = mut(slot, 1);
  float* mu = mut(slot, 2);
  float* m2 = mut(slot, 3);
  for (int d = 0; d < head_dim_; ++d) {
    mn[d] = std::numeric_limits<float>::infinity();
    mx[d] = -std::numeric_limits<float>::infinity();
    mu[d] = 0.0f;
    m2[d] = 0.0f;
  }
  n_rows_[idx(slot)] = 0;
}

void PageSummaryStore::add_row(int32_t slot, const float* k) {
  float* mn = mut(slot, 0);
  float* mx = mut(slot, 1);
  float* mu = mut(slot, 2);
  float* m2 = mut(slot, 3);
  DHS_ASSERT(n_rows_[idx(slot)] < page_size_);
  const int32_t n = ++n_rows_[idx(slot)];
  const float inv_n = 1.0f / static_cast<float>(n);
  {
    float amax = 0.0f;
    for (int d = 0; d < head_dim_; ++d) amax = std::max(amax, std::fabs(k[d]));
    const float step = amax / 7.0f;
    int8_t* code = codes_.data() + (idx(slot) * page_size_ + static_cast<size_t>(n - 1)) * head_dim_;
    for (int d = 0; d < head_dim_; ++d)
      code[d] = static_cast<int8_t>(step > 0.0f ? std::clamp(std::lround(k[d] / step), -7L, 7L) : 0L);
    code_scale_[idx(slot) * page_size_ + static_cast<size_t>(n - 1)] = step;
  }
  // Welford: mean and M2 stay accurate as rows arrive one by one (sum-of-squares would
  // cancel catastrophically for keys with a large common offset, which RoPE'd keys have).
  for (int d = 0; d < head_dim_; ++d) {
    mn[d] = std::min(mn[d], k[d]);
    mx[d] = std::max(mx[d], k[d]);
    const float delta = k[d] - mu[d];
    mu[d] += delta * inv_n;
    m2[d] += delta * (k[d] - mu[d]);
  }
}

void PageSummaryStore::rebuild(const PagePool& pool, int32_t slot, int n_rows) {
  DHS_ASSERT(pool.tier() == tier_ && pool.head_dim() == head_dim_ && pool.has_storage());
  DHS_ASSERT(n_rows >= 0 && n_rows <= pool.page_size());
  reset(slot);
  const float* kp = pool.k_page(PageRef{tier_, slot});
  for (int t = 0; t < n_rows; ++t) add_row(slot, kp + static_cast<size_t>(t) * head_dim_);
}

void append_summaries(const PageTable& table, PageSummaryStore& store, int layer, const float* k,
                      const int32_t* pos, int64_t n_tok) {
  const int hkv = table.n_heads_kv();
  const int d = store.head_dim();
  for (int64_t t = 0; t < n_tok; ++t) {
    DHS_ASSERT(pos[t] >= 0 && pos[t] < table.capacity_tokens());
    for (int h = 0; h < hkv; ++h) {
      int row;
      const PageRef pg = table.page_of_token(layer, h, pos[t], &row);
      DHS_ASSERT(pg.tier == store.tier());
      if (row == 0) store.reset(pg.slot);
      // Rows must extend the page in order, else the summary would count a row twice.
      DHS_ASSERT(store.n_rows(pg.slot) == row);
      store.add_row(pg.slot, k + (t * hkv + h) * d);
    }
  }
}

void truncate_summaries(const PageTable& table, const PagePool& pool, PageSummaryStore& store,
                        int64_t n_tokens) {
  const int ps = table.page_size();
  const int rows_last = static_cast<int>(n_tokens % ps);
  if (rows_last == 0) return;  // every remaining page is full and untouched
  const int64_t last = n_tokens / ps;
  for (int l = 0; l < table.n_layers(); ++l)
    for (int h = 0; h < table.n_heads_kv(); ++h) store.rebuild(pool, table.page(l, h, last).slot, rows_last);
}

}  // namespace dhs
