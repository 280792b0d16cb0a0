#include "sparse/reselect_schedule.h"

#include "core/error.h"

namespace dhs {

ReselectSchedule::ReselectSchedule(int every) : every_(every) {
  DHS_CHECK(every >= 1, "--reselect-every must be >= 1 (got {})", every);
}

int ReselectSchedule::begin_step(const std::vector<const void*>& ids, const std::vector<int64_t>& n_before) {
  DHS_ASSERT(ids.size() == n_before.size());
  const bool continues = !ids_.empty() && ids == ids_ && n_before == n_after_;
  ids_ = ids;
  n_after_ = n_before;
  for (int64_t& n : n_after_) ++n;
  if (every_ == 1 || !continues) {
    k_ = 0;
    return kFull;
  }
  ++k_;
  return static_cast<int>(k_ % every_);
}

PageLists reuse_selection(const PageLists& stored, const std::vector<const PageTable*>& tables, int layer,
                          const std::vector<int32_t>& seq_len) {
  const int n_req = stored.n_requests, hkv = stored.n_heads_kv;
  DHS_ASSERT(static_cast<int>(tables.size()) == n_req && static_cast<int>(seq_len.size()) == n_req);
  DHS_ASSERT(static_cast<int>(stored.seq_len.size()) == n_req);
  PageLists pl;
  pl.n_requests = n_req;
  pl.n_heads_kv = hkv;
  pl.seq_len = seq_len;
  pl.indptr.reserve(static_cast<size_t>(n_req * hkv + 1));
  pl.indptr.push_back(0);
  for (int r = 0; r < n_req; ++r) {
    const PageTable& t = *tables[static_cast<size_t>(r)];
    const int64_t ps = t.page_size();
    // The first page written since the selection: the one holding token seq_len then.
    const int64_t first_new = stored.seq_len[static_cast<size_t>(r)] / ps;
    const int64_t now = (seq_len[static_cast<size_t>(r)] + ps - 1) / ps;
    DHS_CHECK(seq_len[static_cast<size_t>(r)] >= stored.seq_len[static_cast<size_t>(r)] &&
                  seq_len[static_cast<size_t>(r)] <= t.capacity_tokens(),
              "reuse_selection: request {} shrank since its selection ({} -> {} tokens)", r,
              stored.seq_len[static_cast<size_t>(r)], seq_len[static_cast<size_t>(r)]);
    for (int h = 0; h < hkv; ++h) {
      for (int32_t i = stored.row_begin(r, h); i < stored.row_end(r, h); ++i) {
        const int32_t pos = stored.page_pos[static_cast<size_t>(i)];
        if (pos >= first_new) break;  // (ascending) read below with the pages written since
        pl.slots.push_back(t.page(layer, h, pos).slot);
        pl.page_pos.push_back(pos);
      }
      for (int64_t pos = first_new; pos < now; ++pos) {
        pl.slots.push_back(t.page(layer, h, pos).slot);
        pl.page_pos.push_back(static_cast<int32_t>(pos));
      }
      pl.indptr.push_back(static_cast<int32_t>(pl.slots.size()));
    }
  }
  return pl;
}

}  // namespace dhs
