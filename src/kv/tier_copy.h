// Page moves between two pools with storage (the CPU statement of the hierarchy's I/O engine,
// issue 23): K and V of each move copied, runs of moves whose source and destination slots both
// advance by one coalesced into one copy. The device engine (a gather kernel over mapped pinned
// memory) takes the same move lists.
#pragma once
#include <cstdint>
#include <span>

#include "kv/page_pool.h"

namespace dhs {

struct PageMove {
  PageRef src, dst;
};

// Copies every move's K and V rows from `src` to `dst` (refs must be of those pools' tiers, used,
// and the pools' page shapes equal). Returns the number of coalesced runs (copies issued).
int64_t copy_pages(const PagePool& src, PagePool& dst, std::span<const PageMove> moves);

}  // namespace dhs
