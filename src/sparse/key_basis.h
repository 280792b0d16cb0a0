// A low-rank key basis per (layer, KV head) (DESIGN.md §1.1, an experiment on the key sketch's
// bytes): the R principal directions of the keys, so that a sketch can store R coordinates
// per token instead of head_dim, and q·k for every key of one query is estimated as
//   q·k ≈ q·mean + (B q)·(B (k - mean)),     B: [R, head_dim], orthonormal rows
// The q·mean term is the same for every key of a (query, KV head), so it cancels in the
// softmax and the page masses do not need it: a sketch scores (B q)·code(B (k - mean)).
// Keys are low-rank per head (Loki, "Loki: Low-rank Keys for Efficient Sparse Attention",
// 2024; also after RoPE), which is what the truncation bets on.
//
// The basis is fitted once per model from the keys of a calibration prompt (not per request),
// so every request and the GPU can share it; fit_key_basis below.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "kv/page_pool.h"
#include "kv/page_table.h"

namespace dhs {

class KeyBasis {
 public:
  KeyBasis(int n_layers, int n_heads_kv, int head_dim, int rank);

  int n_layers() const { return n_layers_; }
  int n_heads_kv() const { return n_heads_kv_; }
  int head_dim() const { return head_dim_; }
  int rank() const { return rank_; }
  // [rank, head_dim] rows in order of decreasing variance; [head_dim].
  const float* basis(int layer, int kv_head) const { return basis_.data() + off(layer, kv_head) * rank_; }
  const float* mean(int layer, int kv_head) const { return mean_.data() + off(layer, kv_head); }
  // [rank] the calibration keys' variance along each direction (the eigenvalues, descending).
  const float* variance(int layer, int kv_head) const {
    return variance_.data() + static_cast<size_t>(layer * n_heads_kv_ + kv_head) * rank_;
  }
  float* variance_mut(int layer, int kv_head) { return variance_.data() + static_cast<size_t>(layer * n_heads_kv_ + kv_head) * rank_; }
  float* basis_mut(int layer, int kv_head) { return basis_.data() + off(layer, kv_head) * rank_; }
  float* mean_mut(int layer, int kv_head) { return mean_.data() + off(layer, kv_head); }
  // Fraction of the calibration keys' variance the R directions hold, per (layer, KV head).
  float explained(int layer, int kv_head) const { return explained_[static_cast<size_t>(layer * n_heads_kv_ + kv_head)]; }
  void set_explained(int layer, int kv_head, float f) { explained_[static_cast<size_t>(layer * n_heads_kv_ + kv_head)] = f; }

  // The query map of a query-aware basis (fit_qk_basis): [rank, head_dim], or null when queries
  // take the key basis B itself.
  const float* query_basis(int layer, int kv_head) const {
    return qbasis_.empty() ? basis(layer, kv_head) : qbasis_.data() + off(layer, kv_head) * rank_;
  }
  bool query_aware() const { return !qbasis_.empty(); }
  float* query_basis_mut(int layer, int kv_head);

  // out = B (k - mean)   k: [head_dim], out: [rank]
  // out = A q            q: [head_dim], out: [rank]   (A = query_basis: B unless query-aware)
  // Each output is one fp32 fma chain over d ascending (k - mean rounded first): the device
  // (backend/cuda/device_key_sketch.cu) computes the same chain, so the codes agree bit for bit.
  void project_key(int layer, int kv_head, const float* k, float* out) const;
  void project_query(int layer, int kv_head, const float* q, float* out) const;

 private:
  size_t off(int layer, int kv_head) const;
  int n_layers_, n_heads_kv_, head_dim_, rank_;
  std::vector<float> basis_;      // [n_layers, n_heads_kv, rank, head_dim]
  std::vector<float> mean_;       // [n_layers, n_heads_kv, head_dim]
  std::vector<float> explained_;  // [n_layers, n_heads_kv]
  std::vector<float> variance_;   // [n_layers, n_heads_kv, rank]
  std::vector<float> qbasis_;     // [n_layers, n_heads_kv, rank, head_dim] or empty
};

// PCA of each (layer, KV head)'s calibration keys: mean, then the top `rank` eigenvectors of
// their covariance (Eigen's self-adjoint solver, in double). keys(layer, kv_head, &rows) fills
// rows with n x head_dim floats (n >= 1).
KeyBasis fit_key_basis(int n_layers, int n_heads_kv, int head_dim, int rank,
                       const std::function<void(int, int, std::vector<float>*)>& keys);

}  // namespace dhs

namespace dhs {

// The first n_tokens key rows of list (layer, kv_head) of `table` in a host pool, appended to rows.
void table_key_rows(const PagePool& pool, const PageTable& table, int64_t n_tokens, int layer, int kv_head,
                    std::vector<float>* rows);

// Same, from the first n_tokens keys of every (layer, KV head) list of `table` in a host pool.
KeyBasis fit_key_basis(const PagePool& pool, const PageTable& table, int64_t n_tokens, int rank);

// A query-aware basis: maps A (queries) and C (keys) of rank R that minimise the mean squared
// error of the scores, E[(q.(k - mean) - (A q).(C (k - mean)))^2], over the calibration queries
// and keys taken as independent: with S_q = E[q q^T], S_k = Cov(k) and the SVD
// S_q^(1/2) S_k^(1/2) = U S V^T,   A = S_R^(1/2) U_R^T S_q^(-1/2),   C = S_R^(1/2) V_R^T S_k^(-1/2)
// (the eigenvalues under S^(-1/2) floored at 1e-6 of the largest). Key PCA keeps the directions
// of the keys' spread whatever the queries look at; this keeps those of the scores' spread.
// variance() is then S's first R values (the variance of each coordinate of C (k - mean)), explained()
// the fraction of E[(q.(k - mean))^2] they hold. queries(layer, kv_head, &rows): the q rows of
// the KV head's GQA group.
KeyBasis fit_qk_basis(int n_layers, int n_heads_kv, int head_dim, int rank,
                      const std::function<void(int, int, std::vector<float>*)>& keys,
                      const std::function<void(int, int, std::vector<float>*)>& queries);

}  // namespace dhs
