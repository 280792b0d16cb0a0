// CSR page lists: what attention consumes. One row per (request, KV head) of
// one layer; each entry is a page slot in the pool plus the page's logical
// index in its sequence (so a sparse list knows which token positions it holds
// and how full the last page is). A policy builds these; the attention kernel
// never knows which policy did. Dense decode is "all pages".
#pragma once
#include <cstdint>
#include <vector>

#include "kv/page_table.h"

namespace dhs {

struct PageLists {
  int n_requests = 0;
  int n_heads_kv = 0;
  std::vector<int32_t> indptr;    // [n_requests * n_heads_kv + 1]; row = req * n_heads_kv + head
  std::vector<int32_t> slots;     // [nnz] page slots in the pool
  std::vector<int32_t> page_pos;  // [nnz] logical page index of each entry in its sequence
  std::vector<int32_t> seq_len;   // [n_requests] tokens in each request's KV (this step's included)

  int32_t row_begin(int req, int head) const { return indptr[static_cast<size_t>(req * n_heads_kv + head)]; }
  int32_t row_end(int req, int head) const { return indptr[static_cast<size_t>(req * n_heads_kv + head) + 1]; }
  int64_t nnz() const { return static_cast<int64_t>(slots.size()); }
};

// All pages of `layer` for each request, covering seq_len[r] tokens each.
// tables[r]->capacity_tokens() must be >= seq_len[r].
PageLists dense_page_lists(const std::vector<const PageTable*>& tables, int layer,
                           const std::vector<int32_t>& seq_len);

}  // namespace dhs
