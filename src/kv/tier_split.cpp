#include "kv/tier_split.h"

#include "core/error.h"

namespace dhs {

void split_lists_by_tier(const PageLists& in, int64_t n_device, PageLists* dev, PageLists* late) {
  DHS_CHECK(dev != nullptr && late != nullptr && dev != late && n_device >= 0, "split_lists_by_tier: two distinct outputs");
  const size_t n_rows = static_cast<size_t>(in.n_requests) * static_cast<size_t>(in.n_heads_kv);
  DHS_CHECK(in.indptr.size() == n_rows + 1 && in.slots.size() == in.page_pos.size() &&
                static_cast<size_t>(in.indptr.back()) == in.slots.size(),
            "split_lists_by_tier: malformed lists ({} rows, indptr of {}, {} slots, {} positions)", n_rows,
            in.indptr.size(), in.slots.size(), in.page_pos.size());
  for (PageLists* out : {dev, late}) {
    out->n_requests = in.n_requests;
    out->n_heads_kv = in.n_heads_kv;
    out->seq_len = in.seq_len;
    out->indptr.assign(1, 0);
    out->slots.clear();
    out->page_pos.clear();
  }
  for (size_t r = 0; r < n_rows; ++r) {
    for (int32_t k = in.indptr[r]; k < in.indptr[r + 1]; ++k) {
      const PageRef p = tier_of_key(in.slots[static_cast<size_t>(k)], n_device);
      PageLists& to = p.tier == Tier::Device ? *dev : *late;
      to.slots.push_back(p.slot);
      to.page_pos.push_back(in.page_pos[static_cast<size_t>(k)]);
    }
    dev->indptr.push_back(static_cast<int32_t>(dev->slots.size()));
    late->indptr.push_back(static_cast<int32_t>(late->slots.size()));
  }
}

}  // namespace dhs
