// CUDA glue kernels of one decode/prefill step, between the GEMMs:
//   embedding -> add+RMSNorm -> QKV GEMM -> (bias, q/k norm) RoPE + K/V append ->
//   attention -> O GEMM -> add+RMSNorm -> gate/up GEMM -> SwiGLU -> down GEMM.
// Each op: `<op>_kernel` (math), `launch_<op>(Params, stream)` (launch shape, no
// checks) and `<op>(Params, stream)` (checks the Params, then launches). No op
// allocates or synchronises, so all of them can be captured in a CUDA graph.
// Activations are f16 (or fp32 where a GEMM writes fp32); the residual stream is
// fp32; norm weights and biases are fp32 (small, and exact copies of f16 ones).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"
#include "dhisparse/rope_style.h"

namespace dhs::cuda {

// ---- embedding gather --------------------------------------------------------
struct EmbeddingParams {
  const __half* table = nullptr;  // [vocab, hidden]
  const int32_t* ids = nullptr;          // [n_tok]; an id outside [0, vocab) gives a zero row
  void* out = nullptr;                   // [n_tok, hidden] in out_dtype
  DType out_dtype = DType::F32;          // F32 (residual stream) or F16
  int64_t n_tok = 0;
  int64_t vocab = 0;
  int64_t hidden = 0;
};
void launch_embedding(const EmbeddingParams& p, cudaStream_t stream);
void embedding(const EmbeddingParams& p, cudaStream_t stream);

// ---- fused residual add + RMSNorm ----------------------------------------------
// x += delta (if delta), then y = x / rms(x) * weight. The add is one fp32 add per
// element, bit-identical to cpu::add_inplace.
struct AddRmsNormParams {
  float* x = nullptr;            // [n_rows, n] fp32 residual stream (updated in place)
  const void* delta = nullptr;   // [n_rows, n] in delta_dtype, or null: plain RMSNorm of x
  DType delta_dtype = DType::F16;  // F16 or F32
  const float* weight = nullptr; // [n]
  __half* y = nullptr;    // [n_rows, n] (the next GEMM's input)
  int64_t n_rows = 0;
  int64_t n = 0;
  float eps = 1e-5f;
};
void launch_add_rms_norm(const AddRmsNormParams& p, cudaStream_t stream);
void add_rms_norm(const AddRmsNormParams& p, cudaStream_t stream);

// ---- plain RMSNorm over contiguous rows --------------------------------------------
// Also the per-head norm (Qwen3 q/k norm) on [n_tok, n_heads, head_dim] with
// n_rows = n_tok * n_heads, n = head_dim. out may equal in when in is f16.
struct RmsNormParams {
  const void* in = nullptr;      // [n_rows, n] in in_dtype
  DType in_dtype = DType::F16;  // F16 or F32
  const float* weight = nullptr; // [n]
  __half* out = nullptr;  // [n_rows, n]
  int64_t n_rows = 0;
  int64_t n = 0;
  float eps = 1e-5f;
};
void launch_rms_norm(const RmsNormParams& p, cudaStream_t stream);
void rms_norm(const RmsNormParams& p, cudaStream_t stream);

// ---- QKV bias + optional q/k RMSNorm + RoPE + K/V append into head-pages -------
// Per token t and head h, in this order: x += bias; x = rmsnorm(x) * norm_w (q/k,
// if given); q and k rotated by pos[t] * inv_freq (angle in double: fp32 loses
// ~0.01 rad at position 131072); q written to q_out, k and v to row
// pos[t] % page_size of page dst_slot[t * n_heads_kv + h] of k_pool / v_pool.
// A slot outside [0, n_pages) is skipped (nothing written), so a padded batch row
// can carry -1. q, k, v may be views of one fused QKV GEMM output (set the *_ld).
struct RopeAppendParams {
  const void* q = nullptr;       // [n_tok, q_ld]: head h at h * head_dim
  const void* k = nullptr;       // [n_tok, k_ld]
  const void* v = nullptr;       // [n_tok, v_ld]
  DType in_dtype = DType::F16;  // F16 or F32, all three
  int64_t q_ld = 0, k_ld = 0, v_ld = 0;  // elements between tokens
  const float* q_bias = nullptr;  // [n_heads_q * head_dim] or null (Qwen2)
  const float* k_bias = nullptr;  // [n_heads_kv * head_dim] or null
  const float* v_bias = nullptr;  // [n_heads_kv * head_dim] or null
  const float* q_norm = nullptr;  // [head_dim] or null (Qwen3)
  const float* k_norm = nullptr;  // [head_dim] or null
  float norm_eps = 1e-6f;
  __half* q_out = nullptr;  // [n_tok, q_out_ld]; may equal q when in_dtype is F16 and ld match
  int64_t q_out_ld = 0;
  const int32_t* pos = nullptr;       // [n_tok]
  const float* inv_freq = nullptr;    // [head_dim / 2] (rope_inv_freq, model/rope.h, uploaded)
  RopeStyle style = RopeStyle::Half;
  const int32_t* dst_slot = nullptr;  // [n_tok * n_heads_kv] page slot of (t, kv head)
  __half* k_pool = nullptr;    // [n_pages, page_size, head_dim]
  __half* v_pool = nullptr;    // [n_pages, page_size, head_dim]
  int64_t n_pages = 0;
  int page_size = 0;
  int64_t n_tok = 0;
  int n_heads_q = 0;
  int n_heads_kv = 0;
  int head_dim = 0;  // 64, 128 or 256
};
void launch_rope_append(const RopeAppendParams& p, cudaStream_t stream);
void rope_append(const RopeAppendParams& p, cudaStream_t stream);

// ---- SwiGLU --------------------------------------------------------------------
// out[t, i] = silu(gate[t, i]) * up[t, i]. For one fused gate/up GEMM output
// [n_tok, 2n] set gate = buf, up = buf + n, in_ld = 2n.
struct SwiGluParams {
  const void* gate = nullptr;    // [n_tok, in_ld] first n used
  const void* up = nullptr;      // [n_tok, in_ld]
  DType in_dtype = DType::F16;  // F16 or F32
  int64_t in_ld = 0;
  __half* out = nullptr;  // [n_tok, out_ld]
  int64_t out_ld = 0;
  int64_t n_tok = 0;
  int64_t n = 0;
};
void launch_swiglu(const SwiGluParams& p, cudaStream_t stream);
void swiglu(const SwiGluParams& p, cudaStream_t stream);

}  // namespace dhs::cuda
