#include "sparse/page_summary.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace dhs {

PageSummaryStore::PageSummaryStore(Tier tier, int64_t n_pages, int head_dim, int page_size)
    : tier_(tier), n_pages_(n_pages), n_first_(n_pages), head_dim_(head_dim), page_size_(page_size) {
  DHS_ASSERT(n_pages >= 0 && head_dim > 0 && page_size > 0);
  codes_.assign(static_cast<size_t>(n_pages) * page_size * head_dim, 0);
  code_scale_.assign(static_cast<size_t>(n_pages) * page_size, 0.0f);
  data_.assign(static_cast<size_t>(n_pages) * 4 * static_cast<size_t>(head_dim), 0.0f);
  n_rows_.assign(static_cast<size_t>(n_pages), 0);
  tag_.assign(static_cast<size_t>(n_pages), -1);
  for (int64_t s = 0; s < n_pages; ++s) reset(static_cast<int32_t>(s));
}

PageSummaryStore::PageSummaryStore(const PagePool& pool)
    : PageSummaryStore(pool.tier(), pool.n_pages(), pool.head_dim(), pool.page_size()) {}

PageSummaryStore::PageSummaryStore(const PagePool& pool, const PagePool& second)
    : PageSummaryStore(pool.tier(), pool.n_pages() + second.n_pages(), pool.head_dim(), pool.page_size()) {
  DHS_CHECK(second.tier() != pool.tier() && second.head_dim() == pool.head_dim() && second.page_size() == pool.page_size(),
            "page summaries over two tiers: the second pool must be of another tier and the same page shape");
  n_first_ = pool.n_pages();
}

void PageSummaryStore::copy_page(int32_t from, int32_t to) {
  const size_t f = idx(from), t = idx(to);
  const auto copy = [&](auto& v, size_t per) {
    if (!v.empty()) std::copy_n(v.begin() + static_cast<std::ptrdiff_t>(f * per), per, v.begin() + static_cast<std::ptrdiff_t>(t * per));
  };
  const size_t rows = static_cast<size_t>(page_size_);
  copy(data_, 4 * static_cast<size_t>(head_dim_));
  copy(codes_, rows * static_cast<size_t>(head_dim_));
  copy(code_scale_, rows);
  copy(codes2_, rows * static_cast<size_t>(head_dim_));
  copy(code2_scale_, rows);
  if (basis_) copy(pcodes_, rows * static_cast<size_t>(basis_->rank()));
  copy(pscale_, rows);
  n_rows_[t] = n_rows_[f];
  tag_[t] = tag_[f];
}

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

namespace {

// Symmetric 4-bit codes of one row: step = absmax / 7, code = clamp(round(x / step), -7, 7).
void quantize_row4(const float* x, int n, int8_t* code, float* step_out) {
  float amax = 0.0f;
  for (int d = 0; d < n; ++d) amax = std::max(amax, std::fabs(x[d]));
  const float step = amax / 7.0f;
  for (int d = 0; d < n; ++d)
    code[d] = static_cast<int8_t>(step > 0.0f ? std::clamp(std::lround(x[d] / step), -7L, 7L) : 0L);
  *step_out = step;
}

// 2-bit codes of one row: step = absmax / 3, code = the odd integer nearest x / step (ties up),
// clamped to [-3, 3].
void quantize_row2(const float* x, int n, int8_t* code, float* step_out) {
  float amax = 0.0f;
  for (int d = 0; d < n; ++d) amax = std::max(amax, std::fabs(x[d]));
  const float step = amax / 3.0f;
  for (int d = 0; d < n; ++d)
    code[d] = static_cast<int8_t>(step > 0.0f ? std::clamp(2.0f * std::floor(x[d] / step / 2.0f) + 1.0f, -3.0f, 3.0f) : 0.0f);
  *step_out = step;
}

}  // namespace

void PageSummaryStore::reencode(const PagePool& pool) {
  // The pages in `pool` (the store's own tier) from their rows; a page of the second tier holds
  // no rows it could be rebuilt from here.
  for (int64_t s = n_first_; s < n_pages_; ++s)
    DHS_CHECK(n_rows_[static_cast<size_t>(s)] == 0,
              "page summaries: re-encoding with pages in the second tier is not supported (offloaded page {})",
              s - n_first_);
  for (int64_t s = 0; s < n_first_; ++s) {
    const int32_t slot = static_cast<int32_t>(s);
    if (n_rows_[idx(slot)] > 0) rebuild(pool, slot, n_rows_[idx(slot)]);
  }
}

void PageSummaryStore::enable_two_bit_codes(const PagePool& pool) {
  if (two_bit_) return;
  two_bit_ = true;
  codes2_.assign(static_cast<size_t>(n_pages_) * page_size_ * head_dim_, 0);
  code2_scale_.assign(static_cast<size_t>(n_pages_) * page_size_, 0.0f);
  reencode(pool);
}

const int8_t* PageSummaryStore::key_codes2(int32_t slot) const {
  DHS_ASSERT(two_bit_);
  return codes2_.data() + idx(slot) * static_cast<size_t>(page_size_ * head_dim_);
}

const float* PageSummaryStore::key_code2_scales(int32_t slot) const {
  DHS_ASSERT(two_bit_);
  return code2_scale_.data() + idx(slot) * static_cast<size_t>(page_size_);
}

void PageSummaryStore::set_key_basis(std::shared_ptr<const KeyBasis> basis, const PagePool& pool) {
  basis_ = std::move(basis);
  pcodes_.clear();
  pscale_.clear();
  if (!basis_) return;
  DHS_CHECK(basis_->head_dim() == head_dim_, "key basis head_dim {} differs from the store's {}", basis_->head_dim(),
            head_dim_);
  pcodes_.assign(static_cast<size_t>(n_pages_) * page_size_ * basis_->rank(), 0);
  pscale_.assign(static_cast<size_t>(n_pages_) * page_size_, 0.0f);
  reencode(pool);
}

void PageSummaryStore::add_row(int32_t slot, const float* k, int layer, int kv_head) {
  float* mn = mut(slot, 0);
  float* mx = mut(slot, 1);
  float* mu = mut(slot, 2);
  float* m2 = mut(slot, 3);
  DHS_ASSERT(n_rows_[idx(slot)] < page_size_);
  const int32_t n = ++n_rows_[idx(slot)];
  const float inv_n = 1.0f / static_cast<float>(n);
  if (n == 1 && layer >= 0) tag_[idx(slot)] = layer * 65536 + kv_head;
  const size_t row = idx(slot) * page_size_ + static_cast<size_t>(n - 1);
  quantize_row4(k, head_dim_, codes_.data() + row * head_dim_, &code_scale_[row]);
  if (two_bit_) quantize_row2(k, head_dim_, codes2_.data() + row * head_dim_, &code2_scale_[row]);
  if (basis_) {
    const int32_t tag = tag_[idx(slot)];
    DHS_CHECK(tag >= 0, "page summary: slot {} has a key basis but no (layer, KV head)", slot);
    const int r = basis_->rank();
    thread_local std::vector<float> y;
    y.resize(static_cast<size_t>(r));
    basis_->project_key(tag / 65536, tag % 65536, k, y.data());
    quantize_row4(y.data(), r, pcodes_.data() + row * r, &pscale_[row]);
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

void PageSummaryStore::rebuild(const PagePool& pool, int32_t slot, int n_rows, int layer, int kv_head) {
  DHS_ASSERT(pool.tier() == tier_ && pool.head_dim() == head_dim_ && pool.has_storage());
  DHS_ASSERT(n_rows >= 0 && n_rows <= pool.page_size());
  const int32_t tag = layer >= 0 ? layer * 65536 + kv_head : tag_[idx(slot)];
  reset(slot);
  const float* kp = pool.k_page(PageRef{tier_, slot});
  for (int t = 0; t < n_rows; ++t)
    add_row(slot, kp + static_cast<size_t>(t) * head_dim_, tag < 0 ? -1 : tag / 65536, tag < 0 ? -1 : tag % 65536);
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
      store.add_row(pg.slot, k + (t * hkv + h) * d, layer, h);
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
