// Selection policies (DESIGN.md §1.1, the "unified partition abstraction"): a policy
// turns one layer's page tables, this step's query rows and the page summaries into
// CSR page lists (kv/page_lists.h). Attention consumes the lists and never knows
// which policy made them. In the step: append K/V + summaries -> select -> attention.
//
// Every policy chooses, per (request, KV head), a set of logical page indices of
// the request's sequence; SelectionPolicy::select() turns those into slots. Pages
// are always listed in ascending page order.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kv/page_lists.h"
#include "kv/page_table.h"
#include "sparse/draft_seeds.h"
#include "sparse/mass_estimator.h"
#include "sparse/page_summary.h"
#include "dhisparse/policy.h"

namespace dhs {

struct SelectionInput {
  const std::vector<const PageTable*>* tables = nullptr;  // [n_requests]
  int layer = 0;
  const std::vector<int32_t>* seq_len = nullptr;  // [n_requests] tokens in KV, this step's included
  const float* q = nullptr;                       // [n_rows, n_heads_q, head_dim] (RoPE applied)
  const int32_t* q_indptr = nullptr;              // [n_requests + 1] rows of request r
  int n_heads_q = 0;
  float scale = 0.0f;                             // softmax scale, usually 1/sqrt(head_dim)
  const PageSummaryStore* summaries = nullptr;    // required by scoring policies (coverage, topk, solohead)
  // [n_requests] each request's draft seeds (sparse/draft_seeds.h), or null (none kept): scoring
  // policies record their masses' heaviest pages there, seeded sink-window drafts read them.
  DraftSeeds* const* seeds = nullptr;
};

// Logical page indices chosen for each KV head of one request: [n_heads_kv][...], ascending.
using RequestPages = std::vector<std::vector<int32_t>>;

class SelectionPolicy {
 public:
  virtual ~SelectionPolicy() = default;
  virtual std::string name() const = 0;
  // One layer's page lists for the batch (parallel over requests).
  PageLists select(const SelectionInput& in) const;
  // The pages of request `req`, one ascending, duplicate-free vector per KV head.
  virtual void select_request(const SelectionInput& in, int req, RequestPages* out) const = 0;
};

// Set rules on one distribution of page masses, exposed for tests and for the device
// selection kernels to be checked against. Forced pages: the first n_sink and the last
// n_recent of the n = mass.size() pages. Result ascending.
//
// Coverage: the forced pages plus the fewest others, taken by mass descending then page
// index ascending, whose summed mass reaches gamma. gamma >= 1 takes every page (so a
// rounding shortfall of the sum never drops a page); gamma <= 0 only the forced ones.
std::vector<int32_t> coverage_set(const std::vector<double>& mass, int n_sink, int n_recent, double gamma);
// Top-k: exactly min(k, n) pages. Ranking: sinks (first to last), then recent pages
// (newest first), then the rest by mass descending, page index ascending.
std::vector<int32_t> top_k_set(const std::vector<double>& mass, int n_sink, int n_recent, int k);
// TopFrac's k of a list of n pages: ceil(frac x n) computed in float, as the device does (in
// double, 0.3 x 10 would give 4 on one side and 3 on the other at some n).
int top_frac_k(double frac, int n);

// All pages (the reference; same lists as dense_page_lists).
class DensePolicy final : public SelectionPolicy {
 public:
  std::string name() const override { return "dense"; }
  void select_request(const SelectionInput& in, int req, RequestPages* out) const override;
};

// StreamingLLM: the first n_sink pages and the last n_window pages, no scoring; with n_seeds > 0
// (a seeded draft, `sinkwindow:W+M`) also the n_seeds heaviest pages the request's last scored
// step recorded per (layer, KV head) (SelectionInput::seeds; none recorded: the window alone).
class SinkWindowPolicy final : public SelectionPolicy {
 public:
  SinkWindowPolicy(int n_sink, int n_window, int n_seeds = 0) : n_sink_(n_sink), n_window_(n_window), n_seeds_(n_seeds) {}
  std::string name() const override;
  void select_request(const SelectionInput& in, int req, RequestPages* out) const override;

 private:
  int n_sink_, n_window_, n_seeds_;
};

struct ScoredParams {
  double gamma = 0.99;  // coverage policies
  int budget = 0;       // top-k policies: pages per list
  int n_sink = 1;
  int n_recent = 1;
  GroupCombine combine = GroupCombine::Sum;
  double frac = 0.0;    // > 0: top-k takes top_frac_k(frac, pages of the list) instead of budget
};

// The dhisparse rule: per (request, layer, KV head, step), coverage_set over the
// estimated masses of the KV head's q heads (and query rows), combined by params.combine.
class CoverageGammaPolicy final : public SelectionPolicy {
 public:
  CoverageGammaPolicy(std::shared_ptr<const MassEstimator> est, ScoredParams p);
  std::string name() const override;
  void select_request(const SelectionInput& in, int req, RequestPages* out) const override;

 private:
  std::shared_ptr<const MassEstimator> est_;
  ScoredParams p_;
};

// Quest: top_k_set with k = params.budget per (request, KV head).
class TopKPolicy final : public SelectionPolicy {
 public:
  TopKPolicy(std::shared_ptr<const MassEstimator> est, ScoredParams p);
  std::string name() const override;
  void select_request(const SelectionInput& in, int req, RequestPages* out) const override;

 private:
  std::shared_ptr<const MassEstimator> est_;
  ScoredParams p_;
};

// SoloHead: one page set for all KV heads of a layer (transfers of a page position move
// every head's page together). SHARED SCORING, not a union of per-head sets: the
// normalised masses of every q head of the layer are combined (params.combine) into one
// distribution per request, then cut by coverage_set (budget == 0) or top_k_set (budget > 0).
// A union would make the set grow with the number of heads and lose the budget's meaning.
class SoloHeadPolicy final : public SelectionPolicy {
 public:
  SoloHeadPolicy(std::shared_ptr<const MassEstimator> est, ScoredParams p);
  std::string name() const override;
  void select_request(const SelectionInput& in, int req, RequestPages* out) const override;

 private:
  std::shared_ptr<const MassEstimator> est_;
  ScoredParams p_;
};

// Dense below a context threshold: requests with seq_len < min_seq_len get all pages
// (selection costs more than it saves on short contexts), the others `inner`'s pages.
class DenseBelowPolicy final : public SelectionPolicy {
 public:
  DenseBelowPolicy(std::unique_ptr<SelectionPolicy> inner, int64_t min_seq_len);
  std::string name() const override;
  void select_request(const SelectionInput& in, int req, RequestPages* out) const override;

 private:
  std::unique_ptr<SelectionPolicy> inner_;
  int64_t min_seq_len_;
  DensePolicy dense_;
};

// The policy a spec names (dhisparse/policy.h): nullptr-free; DensePolicy for dense. Validates
// the spec (dhs::Error). dense_below wraps the rule in DenseBelowPolicy; min_step_tokens and
// reselect_every are read by the runners.
std::unique_ptr<SelectionPolicy> make_policy(const PolicySpec& spec);

// One layer's page lists with each request's own policy (policies[r], one per request of
// in.tables); SelectionPolicy::select is this with one policy for all.
PageLists select_each(const SelectionInput& in, const std::vector<const SelectionPolicy*>& policies);

// Whether a decode step whose requests hold seq_len tokens (this step's included) runs the policy:
// not when every request is shorter than dense_below (> 0), nor when they hold fewer than
// min_step_tokens in all. Such a step reads every page and selects nothing; both backends ask
// here, so their reselect schedules restart at the same steps.
bool step_runs_policy(const std::vector<int64_t>& seq_len, int64_t dense_below, int64_t min_step_tokens);

}  // namespace dhs
