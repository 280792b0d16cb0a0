// The recall-ahead schedule's read of one layer (issue 23, docs/hierarchy.md "Recall ahead"):
// nothing moves inside a step, so a layer's lists name pages in either tier, and attention reads
// the resident part from the device pool and the late part in place from the host tier, the two
// results merged by log-sum-exp (core/merge_state.h: merge_normalized). This is the CPU statement
// of the split that the device runs (backend/cuda/tier_split.h) and the oracle of its test.
//
// In such lists a slot names its tier by its sign: a device slot s is s, a host slot h is -1 - h
// (so a device page table can hold both in one int32).
#pragma once
#include <cstdint>

#include "kv/page_lists.h"
#include "kv/page_ref.h"

namespace dhs {

inline int32_t encode_tier_slot(PageRef p) { return p.tier == Tier::Device ? p.slot : -1 - p.slot; }
inline PageRef decode_tier_slot(int32_t v) { return v >= 0 ? PageRef{Tier::Device, v} : PageRef{Tier::Host, -1 - v}; }

// `in`'s entries (slots encoded as above) split by tier into `dev` (device slots) and `late`
// (host slots, decoded), with in's rows (n_requests x n_heads_kv, seq_len alike): each row keeps
// its entries' order, so each part is read in the order the whole list is.
void split_lists_by_tier(const PageLists& in, PageLists* dev, PageLists* late);

}  // namespace dhs
