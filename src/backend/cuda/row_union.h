// A verify's rows, each selected on its own, read as one list (issue 24; the CPU statement and
// oracle is kv/page_lists.h union_row_lists): the per-row lists of the rows of each output
// request merged into one list per (request, KV head), in page order, each entry carrying the
// mask of the rows whose lists hold it. Decode attention (kv_row_mask) then reads each page once
// for all the rows, and each row attends exactly its own pages: the output of decoding the rows
// one at a time (verify_selection "per-row") at the cost of one read of their union.
//
// A memset and two kernels: (1) kScatterSlices blocks per output list OR its rows' entries' bits
// into a scratch mask per page position (and leave the page's slot beside it); the entry that finds
// a position empty counts it for its chunk of 1,024 positions; (2) one block per (list, chunk): its
// offset is the sum of the counts of the chunks before it, and its entries are written in page
// order, the scratch cleared behind them for the next call. (Session 28's form ran one block per
// list in both kernels: 8 blocks at batch 1, and the merge cost what the single read saved.) No
// host sync, no allocation: capturable (the grids follow the list count and max_pages, fixed per
// captured step).
//
//   in:         the rows' lists, one request per row: [n_in * n_heads_kv + 1] indptr, slots, page_pos
//   row_indptr: [n_out + 1] output request s merges input requests row_indptr[s] .. row_indptr[s+1]-1
//               (at most 32; with one row per input request it is also the output's q_indptr)
//   seq_len:    [n_out] each output request's tokens (its last row's): the page positions it may hold
//   out:        indptr [n_out * n_heads_kv + 1], slots / page_pos / row_mask [<= the input's nnz]
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dhs::cuda {

struct RowUnionParams {
  const int32_t* in_indptr = nullptr;
  const int32_t* in_slots = nullptr;
  const int32_t* in_page_pos = nullptr;
  const int32_t* row_indptr = nullptr;
  const int32_t* seq_len = nullptr;
  int n_out = 0;
  int n_heads_kv = 0;
  int page_size = 16;
  int max_pages = 0;             // page positions per list the scratch holds (seq_len <= max_pages * page_size)
  uint32_t* scratch_mask = nullptr;  // [n_out * n_heads_kv, max_pages], zero between calls (kept zero)
  int32_t* scratch_slot = nullptr;   // [n_out * n_heads_kv, max_pages]
  int32_t* counts = nullptr;         // [n_out * n_heads_kv, chunks of max_pages]
  int32_t* out_indptr = nullptr;
  int32_t* out_slots = nullptr;
  int32_t* out_page_pos = nullptr;
  uint32_t* out_row_mask = nullptr;
  int32_t* n_bad = nullptr;  // [1] or null: += entries skipped (a page position past the request's seq_len)
};

// The two kernels on `stream` (no checks).
void launch_row_union(const RowUnionParams& p, cudaStream_t stream);

// Scratch of one merge's size (zeroed once), the buffers above that persist between calls.
class RowUnionScratch {
 public:
  RowUnionScratch(int max_out_lists, int max_pages);
  ~RowUnionScratch();
  RowUnionScratch(const RowUnionScratch&) = delete;
  RowUnionScratch& operator=(const RowUnionScratch&) = delete;
  int max_out_lists() const { return max_out_lists_; }
  int max_pages() const { return max_pages_; }
  // p's scratch fields from this (max_pages included).
  void bind(RowUnionParams& p) const;

 private:
  int max_out_lists_, max_pages_;
  uint32_t* mask_d_ = nullptr;
  int32_t* slot_d_ = nullptr;
  int32_t* counts_d_ = nullptr;
};

// The op: checks the shapes against the scratch, then launches.
void row_union(const RowUnionParams& p, const RowUnionScratch& scratch, cudaStream_t stream);

}  // namespace dhs::cuda
