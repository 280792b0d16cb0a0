#include "kv/page_lists.h"

#include "core/error.h"

namespace dhs {

PageLists dense_page_lists(const std::vector<const PageTable*>& tables, int layer,
                           const std::vector<int32_t>& seq_len) {
  DHS_ASSERT(tables.size() == seq_len.size() && !tables.empty());
  PageLists pl;
  pl.n_requests = static_cast<int>(tables.size());
  pl.n_heads_kv = tables[0]->n_heads_kv();
  pl.seq_len = seq_len;
  pl.indptr.reserve(static_cast<size_t>(pl.n_requests * pl.n_heads_kv + 1));
  pl.indptr.push_back(0);
  for (int r = 0; r < pl.n_requests; ++r) {
    const PageTable& t = *tables[static_cast<size_t>(r)];
    DHS_ASSERT(seq_len[static_cast<size_t>(r)] <= t.capacity_tokens());
    const int64_t n_pages = (seq_len[static_cast<size_t>(r)] + t.page_size() - 1) / t.page_size();
    for (int h = 0; h < pl.n_heads_kv; ++h) {
      for (int64_t i = 0; i < n_pages; ++i) {
        pl.slots.push_back(t.page(layer, h, i).slot);
        pl.page_pos.push_back(static_cast<int32_t>(i));
      }
      pl.indptr.push_back(static_cast<int32_t>(pl.slots.size()));
    }
  }
  return pl;
}

}  // namespace dhs
