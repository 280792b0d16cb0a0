#include "kv/page_lists.h"

#include <algorithm>
#include <map>

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

PageLists pick_requests(const std::vector<ListPick>& pick) {
  PageLists out;
  out.n_requests = static_cast<int>(pick.size());
  out.indptr.push_back(0);
  bool masks = false;
  for (const ListPick& p : pick) masks = masks || !p.lists->row_mask.empty();
  for (const ListPick& p : pick) {
    const PageLists& in = *p.lists;
    DHS_CHECK(p.req >= 0 && p.req < in.n_requests, "pick_requests: request {} of lists of {}", p.req, in.n_requests);
    DHS_CHECK(out.seq_len.empty() || in.n_heads_kv == out.n_heads_kv, "pick_requests: {} KV heads beside {}", in.n_heads_kv,
              out.n_heads_kv);
    out.n_heads_kv = in.n_heads_kv;
    out.seq_len.push_back(in.seq_len[static_cast<size_t>(p.req)]);
    const size_t b = static_cast<size_t>(in.row_begin(p.req, 0)), e = static_cast<size_t>(in.row_end(p.req, in.n_heads_kv - 1));
    out.slots.insert(out.slots.end(), in.slots.begin() + static_cast<std::ptrdiff_t>(b), in.slots.begin() + static_cast<std::ptrdiff_t>(e));
    out.page_pos.insert(out.page_pos.end(), in.page_pos.begin() + static_cast<std::ptrdiff_t>(b),
                        in.page_pos.begin() + static_cast<std::ptrdiff_t>(e));
    if (masks) {
      if (in.row_mask.empty()) out.row_mask.insert(out.row_mask.end(), e - b, ~uint32_t{0});
      else out.row_mask.insert(out.row_mask.end(), in.row_mask.begin() + static_cast<std::ptrdiff_t>(b),
                               in.row_mask.begin() + static_cast<std::ptrdiff_t>(e));
    }
    const int32_t shift = static_cast<int32_t>(out.indptr.back()) - static_cast<int32_t>(b);
    for (int h = 0; h < in.n_heads_kv; ++h) out.indptr.push_back(in.row_end(p.req, h) + shift);
  }
  return out;
}

PageLists union_row_lists(const PageLists& rows, const std::vector<int32_t>& row_indptr) {
  DHS_CHECK(!row_indptr.empty() && row_indptr.front() == 0 && row_indptr.back() == rows.n_requests,
            "union_row_lists: row_indptr must run from 0 to the {} input requests", rows.n_requests);
  DHS_CHECK(rows.row_mask.empty(), "union_row_lists: the input lists already carry row masks");
  PageLists out;
  out.n_requests = static_cast<int>(row_indptr.size()) - 1;
  out.n_heads_kv = rows.n_heads_kv;
  out.indptr.push_back(0);
  for (int s = 0; s < out.n_requests; ++s) {
    const int r0 = row_indptr[static_cast<size_t>(s)], r1 = row_indptr[static_cast<size_t>(s) + 1];
    DHS_CHECK(r1 > r0 && r1 - r0 <= 32, "union_row_lists: request {} merges {} rows (1 to 32)", s, r1 - r0);
    out.seq_len.push_back(rows.seq_len[static_cast<size_t>(r1 - 1)]);
    for (int h = 0; h < rows.n_heads_kv; ++h) {
      std::map<int32_t, std::pair<int32_t, uint32_t>> merged;  // page position -> (slot, rows' bits)
      for (int r = r0; r < r1; ++r)
        for (int32_t k = rows.row_begin(r, h); k < rows.row_end(r, h); ++k) {
          const int32_t pos = rows.page_pos[static_cast<size_t>(k)], slot = rows.slots[static_cast<size_t>(k)];
          const uint32_t bit = uint32_t{1} << (r - r0);
          auto [it, fresh] = merged.try_emplace(pos, slot, 0u);
          DHS_CHECK(it->second.first == slot, "union_row_lists: page {} of KV head {} is at slot {} in one row and {} in another",
                    pos, h, it->second.first, slot);
          DHS_CHECK(!(it->second.second & bit), "union_row_lists: page {} twice in row {}'s list", pos, r);
          it->second.second |= bit;
        }
      for (const auto& [pos, e] : merged) {
        out.page_pos.push_back(pos);
        out.slots.push_back(e.first);
        out.row_mask.push_back(e.second);
      }
      out.indptr.push_back(static_cast<int32_t>(out.slots.size()));
    }
  }
  return out;
}

}  // namespace dhs
