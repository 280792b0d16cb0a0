// CPU paged attention over CSR page lists: the reference for decode (q_len 1),
// multi-token verification (q_len k+1, causal among the new rows) and prefill
// (q_len = chunk). Query row j of request r sits at position
// seq_len[r] - q_len[r] + j and attends keys at positions <= its own that are
// in its (request, KV head) list (and, where the lists carry row masks, whose mask names row j).
#pragma once
#include <cstdint>

#include "kv/page_lists.h"
#include "kv/page_pool.h"

namespace dhs::cpu {

struct AttentionParams {
  const float* q = nullptr;         // [n_rows, n_heads_q, head_dim], rows of request r at q_indptr[r]..
  float* out = nullptr;             // [n_rows, n_heads_q, head_dim]
  float* lse = nullptr;             // [n_rows, n_heads_q] log-sum-exp of scaled scores, or null
  const int32_t* q_indptr = nullptr;  // [n_requests + 1]
  const PageLists* lists = nullptr;   // one layer's lists, rows per (request, KV head)
  const PagePool* pool = nullptr;
  int n_heads_q = 0;
  int n_heads_kv = 0;
  int head_dim = 0;
  float scale = 0.0f;  // usually 1/sqrt(head_dim)
};

// A row that sees no key (empty list) gets output 0 and lse -inf.
// Batch-invariant: a row's output depends only on its query, its position and the pages of its
// list up to that position, visited in list order; the same bits whether it is a decode row or
// any row of a prefill chunk, whatever else shares the call (test_batch_invariance).
void attention(const AttentionParams& p);

// Writes K/V rows of n_tok tokens into their pages.
//   k, v: [n_tok, n_heads_kv, head_dim]; token t goes to position pos[t] of `table`, in `layer`.
void append_kv(const PageTable& table, PagePool& pool, int layer, const float* k, const float* v,
               const int32_t* pos, int64_t n_tok);

}  // namespace dhs::cpu
