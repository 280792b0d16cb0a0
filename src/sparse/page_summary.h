// Per-page key summaries (DESIGN.md §1.1): for every head-page slot of one pool,
// per-dimension min / max of its keys (Quest) and per-dimension mean / variance
// (Welford), kept up to date as K rows are appended. Selection policies score
// pages from these without reading the pages themselves.
//
// A store is parallel to ONE PagePool: summary i describes page slot i of that
// pool. Since a head-page holds one (layer, KV head), the slot alone identifies it.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "kv/page_pool.h"
#include "kv/page_table.h"
#include "sparse/key_basis.h"

namespace dhs {

class PageSummaryStore {
 public:
  // page_size bounds the rows of a page's key sketch (below).
  PageSummaryStore(Tier tier, int64_t n_pages, int head_dim, int page_size = 16);
  // Sized for `pool` (same tier, slot count and head_dim).
  explicit PageSummaryStore(const PagePool& pool);
  // Sized for the pages of two tiers (kv/tiered_kv.h): a page's summary is kept wherever the
  // page lives, under key(page): the slot in `pool`'s tier, pool.n_pages() + the slot in the
  // other. The hierarchy moves a page's summary with its bytes (copy_page).
  PageSummaryStore(const PagePool& pool, const PagePool& second);

  // The summary of the page at p (its slot in the store's own tier, or past them in the second).
  int32_t key(PageRef p) const {
    return p.tier == tier_ ? p.slot : static_cast<int32_t>(n_first_) + p.slot;
  }
  // Every per-page array of key `from` copied to key `to` (a page moved between tiers).
  void copy_page(int32_t from, int32_t to);

  Tier tier() const { return tier_; }
  int head_dim() const { return head_dim_; }
  int64_t n_pages() const { return n_pages_; }

  // Empties the summary of `slot` (no rows).
  void reset(int32_t slot);
  // Adds one key row.  k: [head_dim]. layer / kv_head name the page's list (they are kept
  // per slot, from its first row): the projected sketch needs them, -1 when unknown.
  void add_row(int32_t slot, const float* k, int layer = -1, int kv_head = -1);
  // Recomputes the summary of `slot` from the first n_rows key rows of the page in `pool`
  // (after a truncation, or to repair a page written behind the store's back). layer / kv_head
  // as add_row's; -1 keeps the slot's own.
  void rebuild(const PagePool& pool, int32_t slot, int n_rows, int layer = -1, int kv_head = -1);

  // Projected key sketch (sparse/key_basis.h): from now on every row is also kept as its R
  // coordinates B (k - mean) quantized to 4 bits (per-row absmax / 7, as key_codes). Rows
  // already in the store are re-encoded from `pool`. null turns it off.
  void set_key_basis(std::shared_ptr<const KeyBasis> basis, const PagePool& pool);
  const KeyBasis* key_basis() const { return basis_.get(); }
  // [page_size, R] codes in [-7, 7] and [page_size] steps; only with a key basis.
  const int8_t* projected_codes(int32_t slot) const {
    return pcodes_.data() + idx(slot) * static_cast<size_t>(page_size_ * basis_->rank());
  }
  const float* projected_scales(int32_t slot) const { return pscale_.data() + idx(slot) * static_cast<size_t>(page_size_); }

  int32_t n_rows(int32_t slot) const { return n_rows_[idx(slot)]; }
  // [head_dim] each. Undefined content (±inf for min/max, 0 for mean/var) while n_rows == 0.
  const float* min(int32_t slot) const { return data_.data() + base(slot) + 0 * head_dim_; }
  const float* max(int32_t slot) const { return data_.data() + base(slot) + 1 * head_dim_; }
  const float* mean(int32_t slot) const { return data_.data() + base(slot) + 2 * head_dim_; }
  // Welford M2 = sum (k_d - mean_d)^2; population variance = m2 / n_rows.
  const float* m2(int32_t slot) const { return data_.data() + base(slot) + 3 * head_dim_; }
  // Key sketch: every row's key quantized to 4 bits per dimension (symmetric, per-row absmax):
  // k_d ~= code[row * head_dim + d] * code_scale[row], codes in [-7, 7]. 64 B + a scale per row
  // at d 128 (1/4 of the bf16 key); per-token, where min/max/mean/var summarize the page.
  const int8_t* key_codes(int32_t slot) const { return codes_.data() + idx(slot) * static_cast<size_t>(page_size_ * head_dim_); }
  const float* key_code_scales(int32_t slot) const { return code_scale_.data() + idx(slot) * static_cast<size_t>(page_size_); }
  // The same keys in 2 bits per dimension (a CPU study, kept only once enabled: one more int8 per
  // key dimension): k_d ~= code * step, code the odd integer nearest k_d / step in {-3, -1, 1, 3},
  // step = max_d |k_d| / 3. Enabling re-encodes the rows already in the store from `pool`.
  void enable_two_bit_codes(const PagePool& pool);
  bool has_two_bit_codes() const { return two_bit_; }
  const int8_t* key_codes2(int32_t slot) const;  // (asserts they are enabled)
  const float* key_code2_scales(int32_t slot) const;
  int page_size() const { return page_size_; }

 private:
  size_t idx(int32_t slot) const;
  void reencode(const PagePool& pool);  // every page of the own tier rebuilt from `pool`
  size_t base(int32_t slot) const { return idx(slot) * 4 * static_cast<size_t>(head_dim_); }
  float* mut(int32_t slot, int which) { return data_.data() + base(slot) + static_cast<size_t>(which * head_dim_); }

  Tier tier_;
  int64_t n_pages_;
  int64_t n_first_;  // keys of the store's own tier: [0, n_first_); the second tier's follow
  int head_dim_;
  int page_size_;
  std::vector<int8_t> codes_;      // [n_pages, page_size, head_dim]
  std::vector<float> code_scale_;  // [n_pages, page_size]
  bool two_bit_ = false;
  std::vector<int8_t> codes2_;     // [n_pages, page_size, head_dim] in {-3, -1, 1, 3}, once enabled
  std::vector<float> code2_scale_; // [n_pages, page_size]
  std::vector<float> data_;      // [n_pages, 4 (min, max, mean, m2), head_dim]
  std::vector<int32_t> n_rows_;  // [n_pages] rows folded into the summary
  std::vector<int32_t> tag_;     // [n_pages] layer * 65536 + kv_head of the page's rows, -1 unknown
  std::shared_ptr<const KeyBasis> basis_;
  std::vector<int8_t> pcodes_;   // [n_pages, page_size, R] with a basis
  std::vector<float> pscale_;    // [n_pages, page_size]
};

// The summary half of cpu::append_kv: folds K rows of n_tok tokens into the summaries of
// the pages they are written to. Call it with the same arguments, after or before append_kv.
//   k: [n_tok, n_heads_kv, head_dim]; token t is at position pos[t] of `table`, in `layer`.
// A token written at row 0 of a page resets that page's summary first, so pages reused
// from the free stack need no separate reset. Positions must arrive in increasing order
// per page (the way decode, verification and prefill append).
void append_summaries(const PageTable& table, PageSummaryStore& store, int layer, const float* k,
                      const int32_t* pos, int64_t n_tok);

// After PageTable::truncate(pool, n_tokens) (rejected speculation): rebuilds the summary
// of each list's last, now partial, page from the pool so rolled-back rows leave no trace.
void truncate_summaries(const PageTable& table, const PagePool& pool, PageSummaryStore& store,
                        int64_t n_tokens);

}  // namespace dhs
