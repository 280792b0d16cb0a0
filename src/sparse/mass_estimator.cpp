#include "sparse/mass_estimator.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"

namespace dhs {

std::string MinMaxEstimator::name() const { return alpha_ == 1.0f ? "minmax" : fmt::format("minmax:{}", alpha_); }

float MinMaxEstimator::score(const PageSummaryStore& s, int32_t slot, const float* q, float) const {
  const float* mn = s.min(slot);
  const float* mx = s.max(slot);
  float acc = 0.0f;
  if (alpha_ == 1.0f) {
    for (int d = 0; d < s.head_dim(); ++d) acc += std::max(q[d] * mn[d], q[d] * mx[d]);
  } else {
    for (int d = 0; d < s.head_dim(); ++d)
      acc += q[d] * 0.5f * (mn[d] + mx[d]) + alpha_ * std::fabs(q[d]) * 0.5f * (mx[d] - mn[d]);
  }
  return acc;
}

namespace {

// q.mean and sum_d q_d^2 var_d of one page: what MeanSpread and Gaussian both build on.
struct MeanVarScore {
  float mean = 0.0f, var = 0.0f;
};
MeanVarScore mean_var_score(const PageSummaryStore& s, int32_t slot, const float* q) {
  const float* mu = s.mean(slot);
  const float* m2 = s.m2(slot);
  const int32_t n = s.n_rows(slot);
  const float inv_n = n > 0 ? 1.0f / static_cast<float>(n) : 0.0f;
  MeanVarScore r;
  for (int d = 0; d < s.head_dim(); ++d) {
    r.mean += q[d] * mu[d];
    r.var += q[d] * q[d] * std::max(0.0f, m2[d] * inv_n);
  }
  return r;
}

}  // namespace

float MeanSpreadEstimator::score(const PageSummaryStore& s, int32_t slot, const float* q, float) const {
  const MeanVarScore r = mean_var_score(s, slot, q);
  return r.mean + kappa_ * std::sqrt(r.var);
}

float GaussianEstimator::score(const PageSummaryStore& s, int32_t slot, const float* q, float scale) const {
  const MeanVarScore r = mean_var_score(s, slot, q);
  return r.mean + 0.5f * scale * r.var;
}

std::string KeySketchEstimator::name() const { return keep_ > 0 ? fmt::format("sketch4:{}", keep_) : "sketch4"; }

namespace {

// log((1/n) sum_t exp(scale q^.k^_t)) / scale over n 4-bit code rows of `dims` entries (step
// per row), with q^ = q quantized to int8 (step absmax / 127, round to nearest even), as the
// device scores it (backend/cuda/page_score.cu): the dot products with the codes are exact in
// int32 and vectorize; the quantization moves a token's q.k^ by at most (step / 2) sum_d |k^_d|.
float sketch_log_mean_exp(const int8_t* codes, const float* step, int n, int dims, const float* q, float scale) {
  if (n == 0) return 0.0f;
  float amax = 0.0f;
  for (int d = 0; d < dims; ++d) amax = std::max(amax, std::fabs(q[d]));
  if (amax == 0.0f) return 0.0f;  // every token scores 0: log-mean-exp 0
  const float qstep = amax / 127.0f;
  thread_local std::vector<int8_t> q8;
  thread_local std::vector<float> x;
  q8.resize(static_cast<size_t>(dims));
  x.resize(static_cast<size_t>(n));
  for (int d = 0; d < dims; ++d)
    q8[static_cast<size_t>(d)] = static_cast<int8_t>(std::clamp(std::nearbyint(q[d] / qstep), -127.0f, 127.0f));
  float m = -INFINITY;
  for (int t = 0; t < n; ++t) {
    const int8_t* c = codes + static_cast<size_t>(t) * dims;
    int32_t acc = 0;
    for (int d = 0; d < dims; ++d) acc += static_cast<int32_t>(c[d]) * static_cast<int32_t>(q8[static_cast<size_t>(d)]);
    x[static_cast<size_t>(t)] = static_cast<float>(acc) * (qstep * step[t] * scale);
    m = std::max(m, x[static_cast<size_t>(t)]);
  }
  float z = 0.0f;
  for (int t = 0; t < n; ++t) z += std::exp(x[static_cast<size_t>(t)] - m);
  return (m + std::log(z / static_cast<float>(n))) / scale;
}

}  // namespace

float KeySketchEstimator::score(const PageSummaryStore& s, int32_t slot, const float* q, float scale) const {
  return sketch_log_mean_exp(s.key_codes(slot), s.key_code_scales(slot), s.n_rows(slot), s.head_dim(), q, scale);
}

float KeySketch2Estimator::score(const PageSummaryStore& s, int32_t slot, const float* q, float scale) const {
  return sketch_log_mean_exp(s.key_codes2(slot), s.key_code2_scales(slot), s.n_rows(slot), s.head_dim(), q, scale);
}

std::string ProjectedSketchEstimator::name() const {
  const char* kind = query_aware_ ? "qsketch4" : "psketch4";
  return keep_ > 0 ? fmt::format("{}:{}:{}", kind, rank_, keep_) : fmt::format("{}:{}", kind, rank_);
}

float ProjectedSketchEstimator::score(const PageSummaryStore& s, int32_t slot, const float* q, float scale) const {
  DHS_ASSERT(s.key_basis() != nullptr && s.key_basis()->rank() == rank_);
  return sketch_log_mean_exp(s.projected_codes(slot), s.projected_scales(slot), s.n_rows(slot), rank_, q, scale);
}

namespace {

// The integer after "prefix" in name, or -1.
int parse_suffix_int(const std::string& name, size_t prefix) {
  try {
    size_t used = 0;
    const int v = std::stoi(name.substr(prefix), &used);
    return used == name.size() - prefix ? v : -1;
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

std::shared_ptr<const MassEstimator> make_estimator(const std::string& name) {
  if (name == "sketch4") return std::make_shared<KeySketchEstimator>();
  if (name.rfind("sketch4:", 0) == 0) {
    const int keep = parse_suffix_int(name, 8);
    DHS_CHECK(keep > 0 && keep % kChannelBlock == 0, "estimator '{}': KEEP must be a positive multiple of {}", name,
              kChannelBlock);
    return std::make_shared<KeySketchEstimator>(keep);
  }
  if (name.rfind("psketch4:", 0) == 0 || name.rfind("qsketch4:", 0) == 0) {
    const size_t colon = name.find(':', 9);
    const std::string head = name.substr(0, colon);
    const int rank = parse_suffix_int(head, 9);
    const int keep = colon == std::string::npos ? 0 : parse_suffix_int(name, colon + 1);
    DHS_CHECK(rank > 0 && rank <= 1024, "estimator '{}': R must be a positive rank", name);
    DHS_CHECK(colon == std::string::npos || (keep > 0 && keep % kChannelBlock == 0 && keep <= rank),
              "estimator '{}': KEEP must be a positive multiple of {} up to R", name, kChannelBlock);
    return std::make_shared<ProjectedSketchEstimator>(rank, keep, name[0] == 'q');
  }
  if (name == "sketch2") return std::make_shared<KeySketch2Estimator>();
  if (name == "minmax") return std::make_shared<MinMaxEstimator>();
  if (name.rfind("minmax:", 0) == 0) {
    float a = -1.0f;
    try {
      a = std::stof(name.substr(7));
    } catch (const std::exception&) {
    }
    DHS_CHECK(a >= 0.0f && a <= 1.0f, "estimator '{}': alpha must be in [0, 1]", name);
    return std::make_shared<MinMaxEstimator>(a);
  }
  if (name == "meanspread") return std::make_shared<MeanSpreadEstimator>();
  if (name == "gaussian") return std::make_shared<GaussianEstimator>();
  throw Error(fmt::format("unknown mass estimator '{}' (sketch4, sketch4:KEEP, sketch2, psketch4:R[:KEEP], qsketch4:R[:KEEP], minmax, minmax:ALPHA, meanspread, gaussian)", name));
}

namespace {

// The kept / kChannelBlock blocks of the largest summed weight w[e] (ties to the lower block).
// mask: [w.size()] 0/1.
void top_block_mask(const std::vector<double>& w_dims, int kept, std::vector<float>* mask) {
  const int n = static_cast<int>(w_dims.size()), n_blocks = n / kChannelBlock;
  std::vector<double> w(static_cast<size_t>(n_blocks), 0.0);
  for (int e = 0; e < n_blocks * kChannelBlock; ++e) w[static_cast<size_t>(e / kChannelBlock)] += w_dims[static_cast<size_t>(e)];
  std::vector<int> order(static_cast<size_t>(n_blocks));
  for (int b = 0; b < n_blocks; ++b) order[static_cast<size_t>(b)] = b;
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return w[static_cast<size_t>(a)] > w[static_cast<size_t>(b)]; });
  mask->assign(static_cast<size_t>(n), 0.0f);
  for (int k = 0; k < kept / kChannelBlock && k < n_blocks; ++k)
    for (int e = 0; e < kChannelBlock; ++e) (*mask)[static_cast<size_t>(order[static_cast<size_t>(k)] * kChannelBlock + e)] = 1.0f;
}

// The kept dimensions of one KV group (kept_dims < d): the blocks of the largest summed |q|
// over the group's q heads and rows.
void group_channel_mask(const MassQuery& mq, int d, int group, int hk, int kept, std::vector<float>* mask) {
  std::vector<double> w(static_cast<size_t>(d), 0.0);
  for (int g = 0; g < group; ++g)
    for (int32_t row = mq.row_begin; row < mq.row_end; ++row) {
      const float* q = mq.q + (static_cast<int64_t>(row) * mq.n_heads_q + hk * group + g) * d;
      for (int e = 0; e < d; ++e) w[static_cast<size_t>(e)] += std::fabs(q[e]);
    }
  top_block_mask(w, kept, mask);
}

}  // namespace

void estimate_page_mass_heads(const MassEstimator& est, const PageSummaryStore& store,
                              const PageTable& table, int layer, const std::vector<int>& kv_heads,
                              const MassQuery& mq, GroupCombine combine, std::vector<double>* mass) {
  DHS_ASSERT(mq.n_heads_q % table.n_heads_kv() == 0 && mq.seq_len >= 0);
  DHS_ASSERT(mq.seq_len <= table.capacity_tokens() && mq.row_end >= mq.row_begin);
  const int ps = table.page_size();
  const int d = store.head_dim();
  const int group = mq.n_heads_q / table.n_heads_kv();
  const int64_t n_pages = (mq.seq_len + ps - 1) / ps;
  const int64_t q_len = mq.row_end - mq.row_begin;
  mass->assign(static_cast<size_t>(n_pages), 0.0);
  if (n_pages == 0) return;

  std::vector<double> score(static_cast<size_t>(n_pages)), part(static_cast<size_t>(n_pages));
  const int kept = est.kept_dims(d);
  DHS_ASSERT(kept == d || (d % kChannelBlock == 0 && kept % kChannelBlock == 0));
  const int rank = est.projected_rank();
  DHS_CHECK(rank == 0 || (store.key_basis() != nullptr && store.key_basis()->rank() == rank &&
                          store.key_basis()->query_aware() == est.query_aware()),
            "estimator {}: the page summaries have no {}key basis of rank {} (calibrate one first)", est.name(),
            est.query_aware() ? "query-aware " : "", rank);
  const int pkeep = est.projected_keep();
  std::vector<float> mask, pmask, qm(static_cast<size_t>(d));
  // B q of every q head and row of the group, rounded to f16 as the device stores it.
  std::vector<float> qps(static_cast<size_t>(group * std::max<int64_t>(q_len, 0) * rank));
  for (int hk : kv_heads) {
    if (kept < d) group_channel_mask(mq, d, group, hk, kept, &mask);
    if (rank > 0) {
      const KeyBasis& kb = *store.key_basis();
      std::vector<double> w(static_cast<size_t>(rank), 0.0);
      for (int g = 0; g < group; ++g)
        for (int32_t row = mq.row_begin; row < mq.row_end; ++row) {
          float* out = qps.data() + (static_cast<size_t>(g) * q_len + (row - mq.row_begin)) * rank;
          kb.project_query(layer, hk, mq.q + (static_cast<int64_t>(row) * mq.n_heads_q + hk * group + g) * d, out);
          for (int i = 0; i < rank; ++i) {
            out[i] = fp16_to_f32(f32_to_fp16(out[i]));
            w[static_cast<size_t>(i)] += std::fabs(out[i]) * std::sqrt(static_cast<double>(kb.variance(layer, hk)[i]));
          }
        }
      if (pkeep < rank) {  // the coordinates of the most score spread, the others zeroed
        top_block_mask(w, pkeep, &pmask);
        for (size_t i = 0; i < qps.size(); ++i) qps[i] *= pmask[i % static_cast<size_t>(rank)];
      }
    }
    // Scores of every page for this KV head's pages, per q head and row.
    for (int g = 0; g < group; ++g) {
      const int hq = hk * group + g;
      for (int32_t row = mq.row_begin; row < mq.row_end; ++row) {
        const int64_t qpos = mq.seq_len - q_len + (row - mq.row_begin);
        const float* q = mq.q + (static_cast<int64_t>(row) * mq.n_heads_q + hq) * d;
        if (kept < d) {  // the dropped dimensions zeroed
          for (int e = 0; e < d; ++e) qm[static_cast<size_t>(e)] = q[e] * mask[static_cast<size_t>(e)];
          q = qm.data();
        }
        if (rank > 0) q = qps.data() + (static_cast<size_t>(g) * q_len + (row - mq.row_begin)) * rank;
        double m = -INFINITY;
        for (int64_t i = 0; i < n_pages; ++i) {
          const int64_t n_vis = std::clamp<int64_t>(qpos + 1 - i * ps, 0, ps);
          if (n_vis == 0) continue;
          const int32_t slot = store.key(table.page(layer, hk, i));  // (offloaded pages' summaries too)
          // A visible page without rows means append_summaries was not called for it.
          DHS_ASSERT(store.n_rows(slot) > 0);
          const float s = est.score(store, slot, q, mq.scale) * mq.scale;
          score[static_cast<size_t>(i)] = s;
          m = std::max(m, static_cast<double>(s));
        }
        double z = 0.0;
        for (int64_t i = 0; i < n_pages; ++i) {
          const int64_t n_vis = std::clamp<int64_t>(qpos + 1 - i * ps, 0, ps);
          const double w = n_vis == 0 ? 0.0 : static_cast<double>(n_vis) * std::exp(score[static_cast<size_t>(i)] - m);
          part[static_cast<size_t>(i)] = w;
          z += w;
        }
        if (z <= 0.0) continue;  // this row sees no key
        for (int64_t i = 0; i < n_pages; ++i) {
          const double p = part[static_cast<size_t>(i)] / z;
          double& acc = (*mass)[static_cast<size_t>(i)];
          acc = combine == GroupCombine::Sum ? acc + p : std::max(acc, p);
        }
      }
    }
  }
  double total = 0.0;
  for (double v : *mass) total += v;
  if (total > 0.0)
    for (double& v : *mass) v /= total;
}

void estimate_page_mass(const MassEstimator& est, const PageSummaryStore& store, const PageTable& table,
                        int layer, int kv_head, const MassQuery& mq, GroupCombine combine,
                        std::vector<double>* mass) {
  estimate_page_mass_heads(est, store, table, layer, std::vector<int>{kv_head}, mq, combine, mass);
}

}  // namespace dhs
