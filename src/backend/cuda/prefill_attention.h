// Causal prefill attention over head-paged bf16 KV (issue 3, item 2): one
// chunk of new query rows per request attends every key of its (request, KV
// head) page list at a position <= its own. The chunk's own K/V are appended
// into pages before the call, so the kernel reads all keys through the lists.
// Tensor cores (mma.sync m16n8k16 bf16), fp32 online softmax, GQA heads of a
// group packed into the M dimension of one tile so they share K/V tiles.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dhs::cuda {

// Query row j of request r (rows q_indptr[r] .. q_indptr[r+1]) sits at position
// seq_len[r] - q_len[r] + j, as in cpu::attention: a chunk on top of a prefix.
//
// Preconditions (launch_prefill_attention checks those it can see on the host):
//  - page_size == 16, head_dim 64 or 128, n_heads_q % n_heads_kv == 0;
//  - within each list row, page_pos is strictly increasing (dense lists are;
//    sparse policies emit sorted lists): the kernel stops at the first page
//    past the tile's last query position;
//  - q and out 16-byte aligned; slots index pages of the pools.
struct PrefillAttentionParams {
  const __nv_bfloat16* q = nullptr;       // [n_rows, n_heads_q, head_dim]
  __nv_bfloat16* out = nullptr;           // [n_rows, n_heads_q, head_dim]
  float* lse = nullptr;                   // [n_rows, n_heads_q] natural-log LSE of scaled scores, or null
  const __nv_bfloat16* k_pool = nullptr;  // [n_pages, page_size, head_dim]
  const __nv_bfloat16* v_pool = nullptr;  // [n_pages, page_size, head_dim]
  const int32_t* q_indptr = nullptr;      // [n_requests + 1]
  const int32_t* kv_indptr = nullptr;     // [n_requests * n_heads_kv + 1], row = req * n_heads_kv + kv_head
  const int32_t* slots = nullptr;         // [nnz] page slot in the pools
  const int32_t* page_pos = nullptr;      // [nnz] logical page index (tokens page_pos*page_size ..)
  const int32_t* seq_len = nullptr;       // [n_requests] keys per request, this chunk included
  int n_requests = 0;
  int n_rows = 0;  // q_indptr[n_requests] (host knows it: the chunk sizes it scheduled)
  int n_heads_q = 0;
  int n_heads_kv = 0;
  int head_dim = 0;
  int page_size = 16;
  float scale = 0.0f;  // usually 1/sqrt(head_dim)
};

// Checks the shape preconditions (throws dhs::Error, through cuda::check, so
// this header and the .cu stay free of fmt) and launches on `stream`.
// A row that sees no key gets output 0 and lse -inf.
void launch_prefill_attention(const PrefillAttentionParams& p, cudaStream_t stream);

// head_dim 128 on an sm_90 device runs the warpgroup-MMA kernel (prefill_attention_sm90.h) unless
// this process-wide switch is off (then the mma.sync kernel: the benchmark's A/B and the tests).
// Default on.
void set_prefill_wgmma(bool on);
bool prefill_wgmma_enabled();

}  // namespace dhs::cuda
