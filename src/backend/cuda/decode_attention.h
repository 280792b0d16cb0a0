// Self-planning paged decode attention (DESIGN.md §1.2): the attention step of
// decode (q_len 1) and of speculative verification (q_len k+1, causal among the
// new rows) over per-(request, KV head) CSR page lists of different lengths.
//
// The grid is fixed by the GPU (SM count x occupancy). Each warp is a worker
// that takes an equal share of the flattened page space [0, indptr[last]) —
// indptr is the prefix sum of the list lengths, read on the device — and runs
// split-KV chunks over it for all q heads of the GQA group and all q rows;
// chunks that do not cover a whole list write partial (o, m, d) to a workspace
// and a small merge kernel combines them with dhs::merge(). No host plan, no
// host sync, no allocation per call: capturable in a CUDA graph.
//
// Semantics are those of cpu::attention: query row j of request r (q_len rows)
// sits at position seq_len[r] - q_len + j and attends the keys at positions
// <= its own that are in its list (and whose row mask names row j, where the
// lists carry masks). Rows whose list is empty (or sees no key)
// get output 0 and lse -inf.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_page_pool.h"
#include "core/merge_state.h"

namespace dhs::cuda {

inline constexpr int kDecodePageSize = 16;      // the only page size the kernel takes
inline constexpr int kDecodeMaxQVecs = 32;      // group * q_len per (request, KV head)
inline constexpr int kDecodeWarpsPerBlock = 4;  // workers per thread block

// Everything the kernels read, by value (__grid_constant__).
struct DecodeAttentionParams {
  const __half* q = nullptr;       // [n_rows, n_heads_q, head_dim]; request r's rows at q_indptr[r]..
  __half* out = nullptr;           // [n_rows, n_heads_q, head_dim]
  float* lse = nullptr;                   // [n_rows, n_heads_q] natural-log LSE of scaled scores, or null
  const int32_t* q_indptr = nullptr;      // [n_requests + 1]
  const int32_t* kv_indptr = nullptr;     // [n_requests * n_heads_kv + 1]
  const int32_t* kv_slots = nullptr;      // [nnz]
  const int32_t* kv_page_pos = nullptr;   // [nnz]
  // [nnz] or null: bit j set when query row j of the entry's request reads the page (a verify's
  // rows each over its own selection, read once as their union: kv/page_lists.h union_row_lists);
  // null: every row reads every page of its list.
  const uint32_t* kv_row_mask = nullptr;
  const int32_t* seq_len = nullptr;       // [n_requests]
  const __half* k_pool = nullptr;  // [n_pages, page_size, head_dim]
  const __half* v_pool = nullptr;  // [n_pages, page_size, head_dim]
  float* ws_o = nullptr;                  // [n_workers + n_requests * n_heads_kv, ws_q_vecs, head_dim]
  MergeState* ws_state = nullptr;         // [n_workers + n_requests * n_heads_kv, ws_q_vecs]
  int n_requests = 0;
  int n_heads_q = 0;
  int n_heads_kv = 0;
  int head_dim = 0;
  int max_q_len = 1;             // every request has 1 <= q_len <= max_q_len (the kernel traps otherwise)
  int ws_q_vecs = 0;             // partial stride: >= (n_heads_q / n_heads_kv) * max_q_len
  int n_workers = 0;             // warps in the grid (multiple of kDecodeWarpsPerBlock)
  int min_pages_per_worker = 8;  // fewer, longer chunks when the lists are short
  int stages = 3;                // cp.async pipeline depth per warp (2..4)
  float scale = 0.0f;            // usually 1/sqrt(head_dim)
  int l2_evict_first = 1;        // DecodeAttentionArgs::l2_evict_first
};

// Launches the split-KV kernel and the merge kernel on `stream` (no checks).
void launch_decode_attention(const DecodeAttentionParams& p, cudaStream_t stream);

// The benchmark's probe (attention_bench --probe), apart from the production parameters: only
// the overloads that take one run it.
struct DecodeAttentionProbe {
  bool split_only = false;  // the split-KV grid alone, no merge launch (lists split over workers get no output)
};
void launch_decode_attention(const DecodeAttentionParams& p, const DecodeAttentionProbe& probe, cudaStream_t stream);

// Warps the split-KV kernel can keep resident on this device for the variant.
int decode_attention_max_workers(int head_dim, int max_q_vecs, int stages);

// Workspace sized once from maxima; reused by every call (and graph replay).
class DecodeAttentionWorkspace {
 public:
  DecodeAttentionWorkspace(int max_requests, int n_heads_q, int n_heads_kv, int head_dim, int max_q_len,
                           int stages = 3);
  ~DecodeAttentionWorkspace();
  DecodeAttentionWorkspace(const DecodeAttentionWorkspace&) = delete;
  DecodeAttentionWorkspace& operator=(const DecodeAttentionWorkspace&) = delete;

  int max_requests() const { return max_requests_; }
  int n_heads_q() const { return n_heads_q_; }
  int n_heads_kv() const { return n_heads_kv_; }
  int head_dim() const { return head_dim_; }
  int max_q_len() const { return max_q_len_; }
  int q_vecs() const { return q_vecs_; }
  int stages() const { return stages_; }
  int n_workers() const { return n_workers_; }
  size_t bytes() const { return bytes_; }
  float* o_d() { return o_d_; }
  MergeState* state_d() { return state_d_; }

 private:
  int max_requests_, n_heads_q_, n_heads_kv_, head_dim_, max_q_len_, q_vecs_, stages_, n_workers_;
  size_t bytes_ = 0;
  float* o_d_ = nullptr;
  MergeState* state_d_ = nullptr;
};

struct DecodeAttentionArgs {
  const __half* q_d = nullptr;   // [n_rows, n_heads_q, head_dim]
  const int32_t* q_indptr_d = nullptr;  // [n_requests + 1], q_len >= 1 each
  int max_q_len = 1;                    // host-known bound on q_len (spec decode: k + 1)
  float scale = 0.0f;
  __half* out_d = nullptr;  // [n_rows, n_heads_q, head_dim]
  float* lse_d = nullptr;          // [n_rows, n_heads_q] or null
  int min_pages_per_worker = 8;
  // The K/V page copies stream through L2 with an evict_first policy (each byte is read once):
  // measured 0.2-1.5% faster at every probe shape (docs/kernels/decode_attention_NOTES.md, v2 probes).
  bool l2_evict_first = true;
};

// One layer's lists by pointer, as the device holds them (a selection's, or a part of a split
// by tier: tier_split.h).
struct DecodeListsView {
  const int32_t* indptr = nullptr;    // [n_requests * n_heads_kv + 1]
  const int32_t* slots = nullptr;     // [nnz] slots of the pool the call reads
  const int32_t* page_pos = nullptr;  // [nnz]
  const int32_t* seq_len = nullptr;   // [n_requests]
  int n_requests = 0;
  int n_heads_kv = 0;
  const uint32_t* row_mask = nullptr;  // [nnz] or null (DecodeAttentionParams::kv_row_mask)
};

// The backend op: checks shapes against the workspace, pool and lists, then launches.
// The pool may be HBM or the host tier's mapped pages (PagePoolView).
// Throws dhs::Error on unsupported shapes (head_dim other than 64/128, page_size other than 16,
// group * max_q_len > 32, more requests than the workspace holds).
void decode_attention(const DecodeAttentionArgs& args, const DevicePageLists& lists, const DevicePagePool& pool,
                      DecodeAttentionWorkspace& ws, cudaStream_t stream);
void decode_attention(const DecodeAttentionArgs& args, const DecodeListsView& lists, const PagePoolView& pool,
                      DecodeAttentionWorkspace& ws, cudaStream_t stream);
// The same with the benchmark's probe.
void decode_attention(const DecodeAttentionArgs& args, const DevicePageLists& lists, const DevicePagePool& pool,
                      DecodeAttentionWorkspace& ws, cudaStream_t stream, const DecodeAttentionProbe& probe);

}  // namespace dhs::cuda
