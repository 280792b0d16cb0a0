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
  // [nnz] or empty: bit j set when query row j of the entry's request reads the page (a verify's
  // rows, each with its own selection, over the union of their lists: union_row_lists). Empty:
  // every row reads every page of its list. Rows past 31 read every page.
  std::vector<uint32_t> row_mask;

  int32_t row_begin(int req, int head) const { return indptr[static_cast<size_t>(req * n_heads_kv + head)]; }
  int32_t row_end(int req, int head) const { return indptr[static_cast<size_t>(req * n_heads_kv + head) + 1]; }
  int64_t nnz() const { return static_cast<int64_t>(slots.size()); }
};

// The lists of requests that are rows of one request (a verify's rows, each selected on its own,
// as requests of one query row each), merged into one list per (request, KV head): the union of
// its rows' pages in page order, each entry's row_mask naming the rows whose list holds it. So
// attention reads each page once for all rows, and each row attends exactly the pages of its own
// list (cpu::attention honours row_mask). row_indptr [n_out + 1]: output request s merges input
// requests row_indptr[s] .. row_indptr[s + 1] - 1 (at most 32), its rows in that order; its
// seq_len is its last row's. Input lists in any order (the policies build them in page order, so
// each row visits its pages in the same order as before); a page position twice in one row's
// list, or at two slots in two rows' lists, throws dhs::Error.
PageLists union_row_lists(const PageLists& rows, const std::vector<int32_t>& row_indptr);

// Lists whose request r is request pick[r].req of *pick[r].lists: its heads' entries (row masks
// too, when that input carries them) and seq_len. A step's decode rows apart from its prompt
// chunks and back (LlamaCpu's mixed steps with a reused selection). Every input must have the
// same n_heads_kv; a request index out of its input's range throws dhs::Error.
struct ListPick {
  const PageLists* lists = nullptr;
  int req = 0;
};
PageLists pick_requests(const std::vector<ListPick>& pick);

// All pages of `layer` for each request, covering seq_len[r] tokens each.
// tables[r]->capacity_tokens() must be >= seq_len[r].
PageLists dense_page_lists(const std::vector<const PageTable*>& tables, int layer,
                           const std::vector<int32_t>& seq_len);

}  // namespace dhs
