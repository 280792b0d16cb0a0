// Per-token 4-bit key sketch in HBM (DESIGN.md §1.1): the device twin of
// PageSummaryStore::key_codes (sparse/page_summary.h). Every K row appended is also kept
// as 4 bits per dimension with one fp32 step per row (symmetric, per-row absmax / 7):
//   k_d ~= code_d * step,  code_d = clamp(round(k_d / step), -7, 7),  step = max_d |k_d| / 7
// — the same definition and rounding as the CPU store, so the codes are equal bit for bit.
// Scoring (page_select.h, Sketch4) sums the page's tokens' exp-scores on these keys: a page
// estimate that sees one aligned key among fifteen others, where page-level min/max or
// mean/variance cannot (docs/sparse.md).
//
//   codes: [n_pages, page_size, head_dim / 2] uint8, two codes per byte, stored as code + 8
//          (1..15) in the order the int8 tensor-core MMA reads them (sketch_code_byte below)
//   steps: [n_pages, page_size] fp32
//
// 1,088 B per 16-token page at head_dim 128: 1/8 of the page's K + V (plus 1/64 for steps).
//
// Projected sketch (psketch4:R, sparse/key_basis.h): with a key basis the row quantized is
// y = B (k - mean), R = code_dims coordinates instead of head_dim, by the same rule (R / 2 bytes
// a row: 256 B a page at R = 32). The scores then take q projected by launch_project_queries.
// Rows are written by the append itself (each token quantizes its own row), so a truncated
// page needs no repair: the next append overwrites the rolled-back rows, and rows past a
// request's length are never read (they are not visible to any query).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dhs::cuda {

// Byte of a row's packed codes that holds dimension d, and whether in its high nibble.
// Row layout: 4 * KS 32-bit words (KS = head_dim / 32), word w = tig * KS + ks for
// tig = 0..3, ks = 0..KS-1; byte b of word (tig, ks) holds dimension ks*32 + 4*tig + b in
// its low nibble and ks*32 + 16 + 4*tig + b in its high nibble. So a lane (g, tig) of the
// m16n8k32 MMA loads its KS words of a row in one vector load, and `w & 0x0F0F0F0F`,
// `(w >> 4) & 0x0F0F0F0F` are its A-fragment registers for k-step ks.
__host__ __device__ inline int sketch_code_byte(int head_dim, int d, bool* high) {
  const int ks = d / 32, r = d % 32, tig = (r % 16) / 4, b = r % 4;
  *high = r >= 16;
  return (tig * (head_dim / 32) + ks) * 4 + b;
}
// The signed code of dimension d in one packed row.
__host__ __device__ inline int sketch_code(const uint8_t* row, int head_dim, int d) {
  bool high;
  const uint8_t v = row[sketch_code_byte(head_dim, d, &high)];
  return static_cast<int>(high ? v >> 4 : v & 15) - 8;
}

class DeviceKeySketch {
 public:
  // head_dim: the entries per row, i.e. code dims (32 with a rank-32 basis); 32, 64, 128 or 256.
  DeviceKeySketch(int64_t n_pages, int page_size, int head_dim);
  ~DeviceKeySketch();
  DeviceKeySketch(const DeviceKeySketch&) = delete;
  DeviceKeySketch& operator=(const DeviceKeySketch&) = delete;

  int64_t n_pages() const { return n_pages_; }
  int page_size() const { return page_size_; }
  int head_dim() const { return head_dim_; }
  size_t code_bytes() const { return static_cast<size_t>(n_pages_) * page_size_ * (head_dim_ / 2); }
  size_t bytes() const { return code_bytes() + static_cast<size_t>(n_pages_) * page_size_ * 4; }
  uint8_t* codes_d() { return codes_d_; }
  const uint8_t* codes_d() const { return codes_d_; }
  float* steps_d() { return steps_d_; }
  const float* steps_d() const { return steps_d_; }

 private:
  int64_t n_pages_;
  int page_size_;
  int head_dim_;
  uint8_t* codes_d_ = nullptr;
  float* steps_d_ = nullptr;
};

// Same token/slot arguments as SummarizePagesParams (device_page_summary.h), after the append.
struct SketchKeysParams {
  const __half* k_pool = nullptr;  // [n_pages, page_size, head_dim]
  uint8_t* codes = nullptr;               // [n_pages, page_size, C / 2], C = code_dims with a basis, else head_dim
  float* steps = nullptr;                 // [n_pages, page_size]
  const int32_t* pos = nullptr;           // [n_tok]
  const int32_t* dst_slot = nullptr;      // [n_tok * n_heads_kv]; outside [0, n_pages): skipped
  int64_t n_pages = 0;
  int page_size = 0;
  int64_t n_tok = 0;
  int n_heads_kv = 0;
  int head_dim = 0;  // 64, 128 or 256
  // Projected sketch: this layer's key basis, or null for the plain sketch.
  const float* basis = nullptr;       // [n_heads_kv, code_dims, head_dim]
  const float* basis_mean = nullptr;  // [n_heads_kv, head_dim]
  int code_dims = 0;                  // rank (32, 64, ...) with a basis; head_dim (or 0) without
};

// Quantizes the K row (or its projection) of every (token, KV head) of the step into its page's sketch.
void launch_sketch_keys(const SketchKeysParams& p, cudaStream_t stream);

// The key basis of the projected sketch in HBM (a copy of a sparse/key_basis.h KeyBasis).
class DeviceKeyBasis {
 public:
  // basis: [n_layers, n_heads_kv, rank, head_dim], mean: [n_layers, n_heads_kv, head_dim] (host);
  // query_basis: the query map of a query-aware basis (same shape as basis), or null (queries
  // take the key basis).
  DeviceKeyBasis(int n_layers, int n_heads_kv, int head_dim, int rank, const float* basis, const float* mean,
                 const float* query_basis = nullptr);
  ~DeviceKeyBasis();
  DeviceKeyBasis(const DeviceKeyBasis&) = delete;
  DeviceKeyBasis& operator=(const DeviceKeyBasis&) = delete;
  int rank() const { return rank_; }
  int head_dim() const { return head_dim_; }
  const float* basis_d(int layer) const { return basis_d_ + static_cast<size_t>(layer) * n_heads_kv_ * rank_ * head_dim_; }
  const float* mean_d(int layer) const { return mean_d_ + static_cast<size_t>(layer) * n_heads_kv_ * head_dim_; }
  // What launch_project_queries takes: the query map, or the key basis.
  const float* query_basis_d(int layer) const {
    return (qbasis_d_ != nullptr ? qbasis_d_ : basis_d_) + static_cast<size_t>(layer) * n_heads_kv_ * rank_ * head_dim_;
  }

 private:
  int n_layers_, n_heads_kv_, head_dim_, rank_;
  float* basis_d_ = nullptr;
  float* mean_d_ = nullptr;
  float* qbasis_d_ = nullptr;
};

// qp = f16(A q) per (row, q head), A the query map of the head's KV head (query_basis_d): what the projected
// sketch's scores take as q (PageSelectParams::q with head_dim = rank).
struct ProjectQueriesParams {
  const __half* q = nullptr;  // [n_rows, n_heads_q, head_dim]
  __half* qp = nullptr;       // [n_rows, n_heads_q, rank]
  const float* basis = nullptr;      // [n_heads_kv, rank, head_dim] (this layer's query map)
  int64_t n_rows = 0;
  int n_heads_q = 0, n_heads_kv = 0, head_dim = 0, rank = 0;
};
void launch_project_queries(const ProjectQueriesParams& p, cudaStream_t stream);

}  // namespace dhs::cuda
