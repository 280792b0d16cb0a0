#include "sparse/key_basis.h"

#include <Eigen/Eigenvalues>
#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dhs {

KeyBasis::KeyBasis(int n_layers, int n_heads_kv, int head_dim, int rank)
    : n_layers_(n_layers), n_heads_kv_(n_heads_kv), head_dim_(head_dim), rank_(rank) {
  DHS_CHECK(n_layers >= 1 && n_heads_kv >= 1 && head_dim >= 1, "key basis: bad shape");
  DHS_CHECK(rank >= 1 && rank <= head_dim, "key basis: rank {} outside 1..{}", rank, head_dim);
  const size_t n = static_cast<size_t>(n_layers) * n_heads_kv;
  basis_.assign(n * rank * head_dim, 0.0f);
  mean_.assign(n * head_dim, 0.0f);
  explained_.assign(n, 0.0f);
  variance_.assign(n * rank, 0.0f);
}

size_t KeyBasis::off(int layer, int kv_head) const {
  DHS_ASSERT(layer >= 0 && layer < n_layers_ && kv_head >= 0 && kv_head < n_heads_kv_);
  return (static_cast<size_t>(layer) * n_heads_kv_ + kv_head) * head_dim_;
}

void KeyBasis::project_key(int layer, int kv_head, const float* k, float* out) const {
  const float* b = basis(layer, kv_head);
  const float* mu = mean(layer, kv_head);
  for (int r = 0; r < rank_; ++r) {
    float acc = 0.0f;
    for (int d = 0; d < head_dim_; ++d) acc = std::fma(b[r * head_dim_ + d], k[d] - mu[d], acc);
    out[r] = acc;
  }
}

void KeyBasis::project_query(int layer, int kv_head, const float* q, float* out) const {
  const float* b = basis(layer, kv_head);
  for (int r = 0; r < rank_; ++r) {
    float acc = 0.0f;
    for (int d = 0; d < head_dim_; ++d) acc = std::fma(b[r * head_dim_ + d], q[d], acc);
    out[r] = acc;
  }
}

KeyBasis fit_key_basis(int n_layers, int n_heads_kv, int head_dim, int rank,
                       const std::function<void(int, int, std::vector<float>*)>& keys) {
  KeyBasis kb(n_layers, n_heads_kv, head_dim, rank);
  std::vector<float> rows;
  for (int l = 0; l < n_layers; ++l)
    for (int h = 0; h < n_heads_kv; ++h) {
      rows.clear();
      keys(l, h, &rows);
      const int64_t n = static_cast<int64_t>(rows.size()) / head_dim;
      DHS_CHECK(n >= 1 && static_cast<int64_t>(rows.size()) == n * head_dim,
                "key basis: layer {} head {}: {} floats are not whole keys", l, h, rows.size());
      Eigen::VectorXd mu = Eigen::VectorXd::Zero(head_dim);
      for (int64_t t = 0; t < n; ++t)
        for (int d = 0; d < head_dim; ++d) mu[d] += rows[static_cast<size_t>(t * head_dim + d)];
      mu /= static_cast<double>(n);
      Eigen::MatrixXd cov = Eigen::MatrixXd::Zero(head_dim, head_dim);
      Eigen::VectorXd x(head_dim);
      for (int64_t t = 0; t < n; ++t) {
        for (int d = 0; d < head_dim; ++d) x[d] = rows[static_cast<size_t>(t * head_dim + d)] - mu[d];
        cov.selfadjointView<Eigen::Lower>().rankUpdate(x);
      }
      cov = cov.selfadjointView<Eigen::Lower>();
      cov /= static_cast<double>(n);
      const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(cov);
      DHS_CHECK(es.info() == Eigen::Success, "key basis: eigen solver failed at layer {} head {}", l, h);
      // Eigenvalues ascend: the last `rank` columns, largest first.
      float* b = kb.basis_mut(l, h);
      double kept = 0.0, all = 0.0;
      for (int i = 0; i < head_dim; ++i) all += std::max(0.0, es.eigenvalues()[i]);
      for (int r = 0; r < rank; ++r) {
        const int col = head_dim - 1 - r;
        kept += std::max(0.0, es.eigenvalues()[col]);
        kb.variance_mut(l, h)[r] = static_cast<float>(std::max(0.0, es.eigenvalues()[col]));
        for (int d = 0; d < head_dim; ++d) b[r * head_dim + d] = static_cast<float>(es.eigenvectors()(d, col));
      }
      float* m = kb.mean_mut(l, h);
      for (int d = 0; d < head_dim; ++d) m[d] = static_cast<float>(mu[d]);
      kb.set_explained(l, h, all > 0.0 ? static_cast<float>(kept / all) : 1.0f);
    }
  return kb;
}

KeyBasis fit_key_basis(const PagePool& pool, const PageTable& table, int64_t n_tokens, int rank) {
  DHS_CHECK(pool.has_storage(), "key basis: the pool has no host storage");
  DHS_CHECK(n_tokens >= 1 && n_tokens <= table.n_tokens(), "key basis: {} calibration tokens, the table holds {}",
            n_tokens, table.n_tokens());
  const int d = pool.head_dim(), ps = table.page_size();
  return fit_key_basis(table.n_layers(), table.n_heads_kv(), d, rank, [&](int l, int h, std::vector<float>* rows) {
    for (int64_t i = 0; i * ps < n_tokens; ++i) {
      const float* kp = pool.k_page(table.page(l, h, i));
      const int64_t n = std::min<int64_t>(ps, n_tokens - i * ps);
      rows->insert(rows->end(), kp, kp + n * d);
    }
  });
}

}  // namespace dhs
