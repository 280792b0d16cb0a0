// The work of one prefill attention block, derived on the device (both prefill kernels:
// prefill_attention.cu and prefill_attention_sm90.cu): which (request, query tile) blockIdx.y
// stands for, the tile's rows and positions, and the entries of its (request, KV head) page list
// that hold a key it can see.
#pragma once
#include <cstdint>

#include "backend/cuda/prefill_attention.h"

namespace dhs::cuda {

struct PrefillTile {
  int req = -1;                  // -1: no tile (grid.y is an upper bound on the tile count)
  int q_begin = 0, q_len = 0;    // the request's rows of this chunk
  int seq_len = 0;               // its keys, this chunk included
  int tok0 = 0, n_tok = 0;       // the tile's first token within the chunk, its token count
  int n_valid_rows = 0;          // n_tok * group (row m = token m / group, head m % group)
  int q_min = 0, q_max = 0;      // positions of the tile's first and last tokens
  const int32_t* slots = nullptr;     // the list's entries
  const int32_t* page_pos = nullptr;
  int n_vis = 0;                 // entries holding a key at a position <= q_max
};

// blockIdx.y walks the requests' tile counts; within a request the latest (heaviest, under the
// causal mask) tile goes first, so the light ones fill the tail of the grid. page_pos is
// increasing within a list, so the visible entries are a prefix (binary search).
__device__ __forceinline__ PrefillTile plan_prefill_tile(const PrefillAttentionParams& p, int kv_head, int tile_rows,
                                                         int page_size) {
  PrefillTile w;
  const int group = p.n_heads_q / p.n_heads_kv;
  const int tile_tokens = tile_rows / group;
  int tile = 0;
  int y = static_cast<int>(blockIdx.y);
  for (int r = 0; r < p.n_requests; ++r) {
    const int n_tiles = (p.q_indptr[r + 1] - p.q_indptr[r] + tile_tokens - 1) / tile_tokens;
    if (y < n_tiles) {
      w.req = r;
      tile = n_tiles - 1 - y;
      break;
    }
    y -= n_tiles;
  }
  if (w.req < 0) return w;
  w.q_begin = p.q_indptr[w.req];
  w.q_len = p.q_indptr[w.req + 1] - w.q_begin;
  w.seq_len = p.seq_len[w.req];
  w.tok0 = tile * tile_tokens;
  w.n_tok = min(tile_tokens, w.q_len - w.tok0);
  w.n_valid_rows = w.n_tok * group;
  w.q_min = w.seq_len - w.q_len + w.tok0;
  w.q_max = w.q_min + w.n_tok - 1;
  const int list_row = w.req * p.n_heads_kv + kv_head;
  w.slots = p.slots + p.kv_indptr[list_row];
  w.page_pos = p.page_pos + p.kv_indptr[list_row];
  int lo = 0, hi = p.kv_indptr[list_row + 1] - p.kv_indptr[list_row];
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (w.page_pos[mid] * page_size <= w.q_max) lo = mid + 1;
    else hi = mid;
  }
  w.n_vis = lo;
  return w;
}

}  // namespace dhs::cuda
