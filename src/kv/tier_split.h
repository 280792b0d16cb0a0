// The recall-ahead schedule's read of one layer (issue 23, docs/hierarchy.md "Recall ahead"):
// nothing moves inside a step, so a layer's lists name pages in either tier, and attention reads
// the resident part from the device pool and the late part in place from the host tier, the two
// results merged by log-sum-exp (core/merge_state.h: merge_normalized). This is the CPU statement
// of the split that the device runs (backend/cuda/tier_split.h) and the oracle of its test.
//
// In such lists a slot names its tier as a key: a device slot s is s, a host slot h is
// n_device + h (n_device: the device pool's pages) — the key under which the page's summaries and
// key sketch are kept (PageSummaryStore::key; the GPU's sketch likewise), so a device page table
// holds both tiers in one int32 and the estimators read a page's data wherever the page lives.
#pragma once
#include <cstdint>

#include "kv/page_lists.h"
#include "kv/page_ref.h"

namespace dhs {

inline int32_t tier_key(PageRef p, int64_t n_device) {
  return p.tier == Tier::Device ? p.slot : static_cast<int32_t>(n_device + p.slot);
}
inline PageRef tier_of_key(int32_t key, int64_t n_device) {
  return key < n_device ? PageRef{Tier::Device, key} : PageRef{Tier::Host, static_cast<int32_t>(key - n_device)};
}

// `in`'s entries (slots as keys) split by tier into `dev` (device slots) and `late` (host slots),
// with in's rows (n_requests x n_heads_kv, seq_len alike): each row keeps its entries' order, so
// each part is read in the order the whole list is.
void split_lists_by_tier(const PageLists& in, int64_t n_device, PageLists* dev, PageLists* late);

}  // namespace dhs
