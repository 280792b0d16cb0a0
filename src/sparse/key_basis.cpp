#include "sparse/key_basis.h"

#include <Eigen/Eigenvalues>
#include <Eigen/SVD>
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

float* KeyBasis::query_basis_mut(int layer, int kv_head) {
  if (qbasis_.empty()) qbasis_.assign(basis_.size(), 0.0f);
  return qbasis_.data() + off(layer, kv_head) * rank_;
}

void KeyBasis::project_query(int layer, int kv_head, const float* q, float* out) const {
  const float* b = query_basis(layer, kv_head);
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

namespace {

// Rows [n, d] -> (mean, second moment about `centre` ? mean : 0), in double.
void moments(const std::vector<float>& rows, int d, bool centre, Eigen::VectorXd* mu, Eigen::MatrixXd* m2) {
  const int64_t n = static_cast<int64_t>(rows.size()) / d;
  *mu = Eigen::VectorXd::Zero(d);
  for (int64_t t = 0; t < n; ++t)
    for (int e = 0; e < d; ++e) (*mu)[e] += rows[static_cast<size_t>(t * d + e)];
  *mu /= static_cast<double>(n);
  Eigen::MatrixXd c = Eigen::MatrixXd::Zero(d, d);
  Eigen::VectorXd x(d);
  for (int64_t t = 0; t < n; ++t) {
    for (int e = 0; e < d; ++e) x[e] = rows[static_cast<size_t>(t * d + e)] - (centre ? (*mu)[e] : 0.0);
    c.selfadjointView<Eigen::Lower>().rankUpdate(x);
  }
  *m2 = Eigen::MatrixXd(c.selfadjointView<Eigen::Lower>()) / static_cast<double>(n);
}

// S^(1/2) and S^(-1/2) of a covariance, the eigenvalues floored at 1e-6 of the largest.
void sqrt_pair(const Eigen::MatrixXd& s, Eigen::MatrixXd* half, Eigen::MatrixXd* inv_half) {
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(s);
  DHS_CHECK(es.info() == Eigen::Success, "key basis: eigen solver failed");
  const double top = std::max(es.eigenvalues().maxCoeff(), 1e-30);
  Eigen::VectorXd l = es.eigenvalues().cwiseMax(1e-6 * top);
  *half = es.eigenvectors() * l.cwiseSqrt().asDiagonal() * es.eigenvectors().transpose();
  *inv_half = es.eigenvectors() * l.cwiseSqrt().cwiseInverse().asDiagonal() * es.eigenvectors().transpose();
}

}  // namespace

KeyBasis fit_qk_basis(int n_layers, int n_heads_kv, int head_dim, int rank,
                      const std::function<void(int, int, std::vector<float>*)>& keys,
                      const std::function<void(int, int, std::vector<float>*)>& queries) {
  KeyBasis kb(n_layers, n_heads_kv, head_dim, rank);
  const int d = head_dim;
  std::vector<float> rows;
  for (int l = 0; l < n_layers; ++l)
    for (int h = 0; h < n_heads_kv; ++h) {
      Eigen::VectorXd mu_k, mu_q;
      Eigen::MatrixXd s_k, s_q;
      rows.clear();
      keys(l, h, &rows);
      DHS_CHECK(!rows.empty() && rows.size() % static_cast<size_t>(d) == 0, "key basis: layer {} head {}: no whole keys", l, h);
      moments(rows, d, /*centre=*/true, &mu_k, &s_k);
      rows.clear();
      queries(l, h, &rows);
      DHS_CHECK(!rows.empty() && rows.size() % static_cast<size_t>(d) == 0, "key basis: layer {} head {}: no whole queries", l, h);
      moments(rows, d, /*centre=*/false, &mu_q, &s_q);
      Eigen::MatrixXd qh, qih, kh, kih;
      sqrt_pair(s_q, &qh, &qih);
      sqrt_pair(s_k, &kh, &kih);
      const Eigen::BDCSVD<Eigen::MatrixXd> svd(qh * kh, Eigen::ComputeThinU | Eigen::ComputeThinV);
      const Eigen::VectorXd sv = svd.singularValues();  // descending
      const Eigen::MatrixXd a = sv.head(rank).cwiseSqrt().asDiagonal() * svd.matrixU().leftCols(rank).transpose() * qih;
      const Eigen::MatrixXd c = sv.head(rank).cwiseSqrt().asDiagonal() * svd.matrixV().leftCols(rank).transpose() * kih;
      float* bq = kb.query_basis_mut(l, h);
      float* bk = kb.basis_mut(l, h);
      for (int r = 0; r < rank; ++r)
        for (int e = 0; e < d; ++e) {
          bq[r * d + e] = static_cast<float>(a(r, e));
          bk[r * d + e] = static_cast<float>(c(r, e));
        }
      float* m = kb.mean_mut(l, h);
      for (int e = 0; e < d; ++e) m[e] = static_cast<float>(mu_k[e]);
      double all = 0.0, kept = 0.0;
      for (int i = 0; i < sv.size(); ++i) all += sv[i] * sv[i];
      for (int r = 0; r < rank; ++r) {
        kept += sv[r] * sv[r];
        kb.variance_mut(l, h)[r] = static_cast<float>(sv[r]);
      }
      kb.set_explained(l, h, all > 0.0 ? static_cast<float>(kept / all) : 1.0f);
    }
  return kb;
}

KeyBasis fit_key_basis(const PagePool& pool, const PageTable& table, int64_t n_tokens, int rank) {
  DHS_CHECK(pool.has_storage(), "key basis: the pool has no host storage");
  DHS_CHECK(n_tokens >= 1 && n_tokens <= table.n_tokens(), "key basis: {} calibration tokens, the table holds {}",
            n_tokens, table.n_tokens());
  return fit_key_basis(table.n_layers(), table.n_heads_kv(), pool.head_dim(), rank,
                       [&](int l, int h, std::vector<float>* rows) { table_key_rows(pool, table, n_tokens, l, h, rows); });
}

void table_key_rows(const PagePool& pool, const PageTable& table, int64_t n_tokens, int layer, int kv_head,
                    std::vector<float>* rows) {
  const int d = pool.head_dim(), ps = table.page_size();
  for (int64_t i = 0; i * ps < n_tokens; ++i) {
    const float* kp = pool.k_page(table.page(layer, kv_head, i));
    rows->insert(rows->end(), kp, kp + std::min<int64_t>(ps, n_tokens - i * ps) * d);
  }
}

}  // namespace dhs
