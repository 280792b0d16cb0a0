// Causal prefill attention over head-paged f16 KV (issue 3, item 2): one
// chunk of new query rows per request attends every key of its (request, KV
// head) page list at a position <= its own. The chunk's own K/V are appended
// into pages before the call, so the kernel reads all keys through the lists.
// Tensor cores (mma.sync m16n8k16 f16), fp32 online softmax, GQA heads of a
// group packed into the M dimension of one tile so they share K/V tiles.
#pragma once
#include <cuda_fp16.h>
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
  const __half* q = nullptr;       // [n_rows, n_heads_q, head_dim]
  __half* out = nullptr;           // [n_rows, n_heads_q, head_dim]
  float* lse = nullptr;                   // [n_rows, n_heads_q] natural-log LSE of scaled scores, or null
  const __half* k_pool = nullptr;  // [n_pages, page_size, head_dim]
  const __half* v_pool = nullptr;  // [n_pages, page_size, head_dim]
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

// The warpgroup-MMA kernel's shape (prefill_attention_sm90.h): keys per K/V tile, 64 or 128;
// warp-specialized: a third warpgroup gathers the K/V tiles into an mbarrier ring and the two
// consumer warpgroups run each at its own pace, else all threads gather and meet once per tile;
// ping-pong (warp-specialized only): the two consumers instead take turns at the tensor cores, one's
// softmax under the other's MMAs; stages: K/V tiles in the ring, 2 or 3 (3: warp-specialized only).
// The default is the fastest measured (docs/kernels/prefill_attention_NOTES.md); every shape is
// tested.
struct PrefillSm90Shape {
  int block_n = 128;
  bool warp_specialized = true;
  bool ping_pong = true;
  int stages = 3;
};
inline constexpr PrefillSm90Shape kPrefillSm90Default{};

// Which kernel launch_prefill_attention runs for head_dim 128: the warpgroup-MMA one where the device
// and build allow (sm_90a; elsewhere, and for head_dim 64, the mma.sync kernel whatever this says),
// in the default shape. The mma.sync kernel on Hopper and the other shapes are for the benchmarks'
// A/B (LlamaCuda::set_prefill_kernel, prefill_bench) and the tests.
struct PrefillKernel {
  bool wgmma = true;                                // false: the mma.sync kernel
  PrefillSm90Shape sm90_shape = kPrefillSm90Default;  // the wgmma kernel's shape
};

// Throws dhs::Error (through cuda::check) unless `shape` is one of the compiled forms; needs no GPU.
void check_prefill_sm90_shape(const PrefillSm90Shape& shape);

// Checks the shape preconditions and the kernel's shape (throws dhs::Error, through cuda::check,
// so this header and the .cu stay free of fmt) and launches on `stream`.
// A row that sees no key gets output 0 and lse -inf.
void launch_prefill_attention(const PrefillAttentionParams& p, cudaStream_t stream, const PrefillKernel& kernel = {});

}  // namespace dhs::cuda
