#include "sparse/policy.h"

#include <cmath>

#include <algorithm>
#include <iterator>
#include <numeric>

#include "core/error.h"
#include "core/thread_pool.h"

namespace dhs {

namespace {

int64_t n_pages_of(const SelectionInput& in, int req) {
  const PageTable& t = *(*in.tables)[static_cast<size_t>(req)];
  return ((*in.seq_len)[static_cast<size_t>(req)] + t.page_size() - 1) / t.page_size();
}

std::vector<int32_t> all_pages(int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

std::vector<uint8_t> forced_mask(int64_t n, int n_sink, int n_recent) {
  std::vector<uint8_t> f(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < std::min<int64_t>(n_sink, n); ++i) f[static_cast<size_t>(i)] = 1;
  for (int64_t i = std::max<int64_t>(0, n - n_recent); i < n; ++i) f[static_cast<size_t>(i)] = 1;
  return f;
}

// Non-forced pages ranked by mass descending, page index ascending (the tie rule).
std::vector<int32_t> ranked_free(const std::vector<double>& mass, const std::vector<uint8_t>& forced) {
  std::vector<int32_t> r;
  for (size_t i = 0; i < mass.size(); ++i)
    if (!forced[i]) r.push_back(static_cast<int32_t>(i));
  std::sort(r.begin(), r.end(), [&](int32_t a, int32_t b) {
    const double ma = mass[static_cast<size_t>(a)], mb = mass[static_cast<size_t>(b)];
    return ma != mb ? ma > mb : a < b;
  });
  return r;
}

MassQuery mass_query(const SelectionInput& in, int req) {
  MassQuery mq;
  mq.q = in.q;
  mq.row_begin = in.q_indptr[req];
  mq.row_end = in.q_indptr[req + 1];
  mq.n_heads_q = in.n_heads_q;
  mq.scale = in.scale;
  mq.seq_len = (*in.seq_len)[static_cast<size_t>(req)];
  return mq;
}

// True when the request's pages should simply all be read: nothing to score with.
bool no_scoring_possible(const SelectionInput& in, int req) {
  return in.q_indptr[req + 1] == in.q_indptr[req] || n_pages_of(in, req) == 0;
}

void fill_dense(const SelectionInput& in, int req, RequestPages* out) {
  const int hkv = (*in.tables)[static_cast<size_t>(req)]->n_heads_kv();
  out->assign(static_cast<size_t>(hkv), all_pages(n_pages_of(in, req)));
}

}  // namespace

std::vector<int32_t> coverage_set(const std::vector<double>& mass, int n_sink, int n_recent, double gamma) {
  const int64_t n = static_cast<int64_t>(mass.size());
  if (gamma >= 1.0) return all_pages(n);
  const std::vector<uint8_t> forced = forced_mask(n, n_sink, n_recent);
  std::vector<int32_t> out;
  double covered = 0.0;
  for (int64_t i = 0; i < n; ++i)
    if (forced[static_cast<size_t>(i)]) {
      out.push_back(static_cast<int32_t>(i));
      covered += mass[static_cast<size_t>(i)];
    }
  for (int32_t i : ranked_free(mass, forced)) {
    if (covered >= gamma) break;
    out.push_back(i);
    covered += mass[static_cast<size_t>(i)];
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int32_t> top_k_set(const std::vector<double>& mass, int n_sink, int n_recent, int k) {
  const int64_t n = static_cast<int64_t>(mass.size());
  const int64_t want = std::clamp<int64_t>(k, 0, n);
  const std::vector<uint8_t> forced = forced_mask(n, n_sink, n_recent);
  std::vector<int32_t> rank;
  for (int64_t i = 0; i < std::min<int64_t>(n_sink, n); ++i) rank.push_back(static_cast<int32_t>(i));
  for (int64_t i = n - 1; i >= std::max<int64_t>(0, n - n_recent); --i)
    if (i >= n_sink) rank.push_back(static_cast<int32_t>(i));
  for (int32_t i : ranked_free(mass, forced)) rank.push_back(i);
  rank.resize(static_cast<size_t>(want));
  std::sort(rank.begin(), rank.end());
  return rank;
}

PageLists SelectionPolicy::select(const SelectionInput& in) const {
  DHS_ASSERT(in.tables);
  return select_each(in, std::vector<const SelectionPolicy*>(in.tables->size(), this));
}

PageLists select_each(const SelectionInput& in, const std::vector<const SelectionPolicy*>& policies) {
  DHS_ASSERT(in.tables && in.seq_len && in.q_indptr && !in.tables->empty());
  DHS_ASSERT(in.tables->size() == in.seq_len->size() && policies.size() == in.tables->size());
  const int n_req = static_cast<int>(in.tables->size());
  const int hkv = (*in.tables)[0]->n_heads_kv();
  std::vector<RequestPages> chosen(static_cast<size_t>(n_req));
  ThreadPool::global().parallel_for(n_req, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      DHS_ASSERT((*in.seq_len)[static_cast<size_t>(r)] <= (*in.tables)[static_cast<size_t>(r)]->capacity_tokens());
      policies[static_cast<size_t>(r)]->select_request(in, static_cast<int>(r), &chosen[static_cast<size_t>(r)]);
    }
  });

  PageLists pl;
  pl.n_requests = n_req;
  pl.n_heads_kv = hkv;
  pl.seq_len = *in.seq_len;
  pl.indptr.reserve(static_cast<size_t>(n_req * hkv + 1));
  pl.indptr.push_back(0);
  for (int r = 0; r < n_req; ++r) {
    const PageTable& t = *(*in.tables)[static_cast<size_t>(r)];
    const RequestPages& rp = chosen[static_cast<size_t>(r)];
    DHS_ASSERT(static_cast<int>(rp.size()) == hkv && t.n_heads_kv() == hkv);
    const int64_t n_pages = n_pages_of(in, r);
    for (int h = 0; h < hkv; ++h) {
      for (int32_t i : rp[static_cast<size_t>(h)]) {
        DHS_ASSERT(i >= 0 && i < n_pages);
        pl.slots.push_back(t.page(in.layer, h, i).slot);
        pl.page_pos.push_back(i);
      }
      pl.indptr.push_back(static_cast<int32_t>(pl.slots.size()));
    }
  }
  return pl;
}

void DensePolicy::select_request(const SelectionInput& in, int req, RequestPages* out) const {
  fill_dense(in, req, out);
}

std::string SinkWindowPolicy::name() const {
  return n_seeds_ > 0 ? fmt::format("sinkwindow-{}-{}+{}", n_sink_, n_window_, n_seeds_)
                      : fmt::format("sinkwindow-{}-{}", n_sink_, n_window_);
}

void SinkWindowPolicy::select_request(const SelectionInput& in, int req, RequestPages* out) const {
  const int64_t n = n_pages_of(in, req);
  const std::vector<uint8_t> f = forced_mask(n, n_sink_, n_window_);
  std::vector<int32_t> pages;
  for (int64_t i = 0; i < n; ++i)
    if (f[static_cast<size_t>(i)]) pages.push_back(static_cast<int32_t>(i));
  const int hkv = (*in.tables)[static_cast<size_t>(req)]->n_heads_kv();
  out->assign(static_cast<size_t>(hkv), pages);
  const DraftSeeds* seeds = in.seeds ? in.seeds[req] : nullptr;
  if (n_seeds_ == 0 || seeds == nullptr || seeds->empty()) return;
  for (int h = 0; h < hkv; ++h) {  // the window's pages and the seeds, ascending, each once
    std::vector<int32_t> merged;
    const std::vector<int32_t> s = seeds->pages(in.layer, h, hkv, n_seeds_, n);
    std::set_union(pages.begin(), pages.end(), s.begin(), s.end(), std::back_inserter(merged));
    (*out)[static_cast<size_t>(h)] = std::move(merged);
  }
}

namespace {

// Scores every KV head of one request and lets `pick` choose its pages from the
// estimated masses (shared by the coverage and top-k policies).
template <typename Pick>
void select_per_head(const SelectionInput& in, int req, const MassEstimator& est, GroupCombine combine,
                     RequestPages* out, Pick pick) {
  DHS_ASSERT(in.summaries != nullptr);
  const PageTable& t = *(*in.tables)[static_cast<size_t>(req)];
  const MassQuery mq = mass_query(in, req);
  out->resize(static_cast<size_t>(t.n_heads_kv()));
  std::vector<double> mass;
  DraftSeeds* seeds = in.seeds ? in.seeds[req] : nullptr;
  for (int h = 0; h < t.n_heads_kv(); ++h) {
    estimate_page_mass(est, *in.summaries, t, in.layer, h, mq, combine, &mass);
    (*out)[static_cast<size_t>(h)] = pick(mass);
    if (seeds) seeds->record(in.layer, h, t.n_heads_kv(), mass, (*out)[static_cast<size_t>(h)]);
  }
}

}  // namespace

CoverageGammaPolicy::CoverageGammaPolicy(std::shared_ptr<const MassEstimator> est, ScoredParams p)
    : est_(std::move(est)), p_(p) {
  DHS_ASSERT(est_ && p_.n_sink >= 0 && p_.n_recent >= 0);
}

std::string CoverageGammaPolicy::name() const { return fmt::format("coverage-{}-{}", p_.gamma, est_->name()); }

void CoverageGammaPolicy::select_request(const SelectionInput& in, int req, RequestPages* out) const {
  if (no_scoring_possible(in, req) || p_.gamma >= 1.0) return fill_dense(in, req, out);
  select_per_head(in, req, *est_, p_.combine, out, [&](const std::vector<double>& mass) {
    return coverage_set(mass, p_.n_sink, p_.n_recent, p_.gamma);
  });
}

TopKPolicy::TopKPolicy(std::shared_ptr<const MassEstimator> est, ScoredParams p) : est_(std::move(est)), p_(p) {
  DHS_ASSERT(est_ && p_.budget >= 0 && p_.n_sink >= 0 && p_.n_recent >= 0);
}

std::string TopKPolicy::name() const {
  return p_.frac > 0.0 ? fmt::format("topfrac-{}-{}", p_.frac, est_->name())
                       : fmt::format("topk-{}-{}", p_.budget, est_->name());
}

int top_frac_k(double frac, int n) {
  return static_cast<int>(std::ceil(static_cast<float>(frac) * static_cast<float>(n)));
}

void TopKPolicy::select_request(const SelectionInput& in, int req, RequestPages* out) const {
  const int n = n_pages_of(in, req);
  const int k = p_.frac > 0.0 ? top_frac_k(p_.frac, n) : p_.budget;
  if (no_scoring_possible(in, req) || k >= n) return fill_dense(in, req, out);
  select_per_head(in, req, *est_, p_.combine, out, [&](const std::vector<double>& mass) {
    return top_k_set(mass, p_.n_sink, p_.n_recent, k);
  });
}

SoloHeadPolicy::SoloHeadPolicy(std::shared_ptr<const MassEstimator> est, ScoredParams p)
    : est_(std::move(est)), p_(p) {
  DHS_ASSERT(est_ && p_.budget >= 0 && p_.n_sink >= 0 && p_.n_recent >= 0);
}

std::string SoloHeadPolicy::name() const {
  return p_.budget > 0 ? fmt::format("solohead-k{}-{}", p_.budget, est_->name())
                       : fmt::format("solohead-{}-{}", p_.gamma, est_->name());
}

void SoloHeadPolicy::select_request(const SelectionInput& in, int req, RequestPages* out) const {
  if (no_scoring_possible(in, req)) return fill_dense(in, req, out);
  if (p_.budget > 0 ? p_.budget >= n_pages_of(in, req) : p_.gamma >= 1.0) return fill_dense(in, req, out);
  DHS_ASSERT(in.summaries != nullptr);
  const PageTable& t = *(*in.tables)[static_cast<size_t>(req)];
  std::vector<int> heads(static_cast<size_t>(t.n_heads_kv()));
  std::iota(heads.begin(), heads.end(), 0);
  std::vector<double> mass;
  estimate_page_mass_heads(*est_, *in.summaries, t, in.layer, heads, mass_query(in, req), p_.combine, &mass);
  const std::vector<int32_t> pages = p_.budget > 0 ? top_k_set(mass, p_.n_sink, p_.n_recent, p_.budget)
                                                   : coverage_set(mass, p_.n_sink, p_.n_recent, p_.gamma);
  out->assign(heads.size(), pages);
}

DenseBelowPolicy::DenseBelowPolicy(std::unique_ptr<SelectionPolicy> inner, int64_t min_seq_len)
    : inner_(std::move(inner)), min_seq_len_(min_seq_len) {
  DHS_ASSERT(inner_ != nullptr);
}

std::string DenseBelowPolicy::name() const { return fmt::format("{}-dense<{}", inner_->name(), min_seq_len_); }

void DenseBelowPolicy::select_request(const SelectionInput& in, int req, RequestPages* out) const {
  if ((*in.seq_len)[static_cast<size_t>(req)] < min_seq_len_) return dense_.select_request(in, req, out);
  inner_->select_request(in, req, out);
}

std::unique_ptr<SelectionPolicy> make_policy(const PolicySpec& spec) {
  spec.validate();
  ScoredParams sp;
  sp.gamma = spec.gamma;
  sp.budget = spec.budget;
  sp.n_sink = spec.n_sink;
  sp.n_recent = spec.n_recent;
  sp.combine = spec.combine;
  std::unique_ptr<SelectionPolicy> p;
  switch (spec.rule) {
    case SelectRule::Dense:
      return std::make_unique<DensePolicy>();
    case SelectRule::Coverage:
      p = std::make_unique<CoverageGammaPolicy>(make_estimator(spec.estimator), sp);
      break;
    case SelectRule::TopK:
      p = std::make_unique<TopKPolicy>(make_estimator(spec.estimator), sp);
      break;
    case SelectRule::TopFrac:
      sp.frac = spec.frac;
      p = std::make_unique<TopKPolicy>(make_estimator(spec.estimator), sp);
      break;
    case SelectRule::SinkWindow:
      // budget 0: the window is the recent pages.
      p = std::make_unique<SinkWindowPolicy>(spec.n_sink, spec.budget > 0 ? spec.budget - spec.n_sink : spec.n_recent,
                                             spec.seed_pages);
      break;
    case SelectRule::SoloHead:
      p = std::make_unique<SoloHeadPolicy>(make_estimator(spec.estimator), sp);
      break;
  }
  if (spec.dense_below > 0) p = std::make_unique<DenseBelowPolicy>(std::move(p), spec.dense_below);
  return p;
}

bool step_runs_policy(const std::vector<int64_t>& seq_len, int64_t dense_below, int64_t min_step_tokens) {
  bool all_short = dense_below > 0;
  int64_t total = 0;
  for (int64_t n : seq_len) {
    total += n;
    all_short = all_short && n < dense_below;
  }
  return !all_short && total >= min_step_tokens;
}

}  // namespace dhs
