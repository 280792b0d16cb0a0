// Mass estimators (DESIGN.md §1.1): turn a query and the page summaries of one
// (request, KV head) into an estimated, normalised attention mass per page. The
// selection policies rank and cut pages on these masses.
//
//   mass_i = n_i * exp(score_i * scale - max_j score_j * scale),  normalised to sum 1,
// with n_i the page's tokens visible to the query row and score_i an estimate of
// the page's q·k (not scaled). The q heads of a GQA group (and, for multi-token
// steps, the query rows of the request) are each normalised, then combined.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kv/page_table.h"
#include "sparse/page_summary.h"
#include "dhisparse/policy.h"

namespace dhs {

class MassEstimator {
 public:
  virtual ~MassEstimator() = default;
  virtual std::string name() const = 0;
  // Estimated q·k of one page (unscaled: attention multiplies it by `scale`), in the
  // sense mass = n * exp(score * scale).  q: [head_dim]
  virtual float score(const PageSummaryStore& s, int32_t slot, const float* q, float scale) const = 0;
  // Dimensions of q the estimate uses: all (head_dim), or, for a channel-subset sketch, the
  // kept_dims(head_dim) dimensions of the largest summed |q| over the GQA group, in aligned blocks
  // of kChannelBlock (estimate_page_mass_heads zeroes the others before calling score).
  virtual int kept_dims(int head_dim) const { return head_dim; }
  // > 0: the estimate works in the R coordinates of the store's key basis (sparse/key_basis.h),
  // and score() gets q projected, B q ([R]), instead of q.
  virtual int projected_rank() const { return 0; }
  // Coordinates of B q kept per step (<= projected_rank(); see ProjectedSketchEstimator).
  virtual int projected_keep() const { return projected_rank(); }
  // The basis it needs is query-aware (KeyBasis::query_aware).
  virtual bool query_aware() const { return false; }
  // It reads the store's 2-bit codes (PageSummaryStore::enable_two_bit_codes, off by default).
  virtual bool needs_two_bit_codes() const { return false; }
};

// Channel blocks of a channel-subset sketch: 4 dims x 16 tokens x 4 bits = one 32-byte sector.
constexpr int kChannelBlock = 4;

// Quest: sum_d max(q_d * min_d, q_d * max_d). A true upper bound of q·k for every
// key in the page (up to float rounding), hence never misses a heavy page, but loose
// for pages of spread-out keys.
//
// alpha < 1 shrinks the bound toward the box centre: sum_d q_d c_d + alpha |q_d| r_d with
// c = (min + max) / 2, r = (max - min) / 2 (alpha = 1 is the bound; "minmax:0.5" by name).
// No longer a bound; an experiment on the bound's looseness (docs/sparse.md).
class MinMaxEstimator final : public MassEstimator {
 public:
  explicit MinMaxEstimator(float alpha = 1.0f) : alpha_(alpha) {}
  std::string name() const override;
  float score(const PageSummaryStore& s, int32_t slot, const float* q, float scale) const override;

 private:
  float alpha_;
};

// q·mean + kappa * sqrt(sum_d q_d^2 var_d): the mean score of the page plus kappa
// standard deviations of q·k over the page's keys, were the dimensions independent.
// Not a bound; tighter than min/max where keys cluster (kappa = 0: mean only).
class MeanSpreadEstimator final : public MassEstimator {
 public:
  explicit MeanSpreadEstimator(float kappa = 1.0f) : kappa_(kappa) {}
  std::string name() const override { return "meanspread"; }
  float kappa() const { return kappa_; }
  float score(const PageSummaryStore& s, int32_t slot, const float* q, float scale) const override;

 private:
  float kappa_;
};

// The page's expected exp-score were its keys Gaussian with the page's per-dimension mean
// and variance (the moment-generating function of q.k): the page's mass is
//   sum_k exp(scale q.k) ~= n * exp(scale q.mean + scale^2 / 2 * sum_d q_d^2 var_d),
// i.e. score = q.mean + (scale / 2) sum_d q_d^2 var_d. An estimate of the SUM of a page's
// attention weights, where MinMax bounds its largest one: what the coverage rule needs.
class GaussianEstimator final : public MassEstimator {
 public:
  std::string name() const override { return "gaussian"; }
  float score(const PageSummaryStore& s, int32_t slot, const float* q, float scale) const override;
};

// Per-token 4-bit key sketch (PageSummaryStore::key_codes): the page's mass is the sum of its
// tokens' exp-scores on the quantized keys, score = log((1/n) sum_t exp(scale q^.k^_t)) / scale,
// with q^ = q quantized to int8 per vector (step max|q| / 127), the device's definition too.
// Not a bound; close to the true page mass where a page-level summary cannot separate one
// aligned key from fifteen others (docs/sparse.md). The device twin: backend/cuda/device_key_sketch.h.
//
// keep > 0 (name "sketch4:KEEP"): only the KEEP dimensions of the largest summed |q| over the
// GQA group (per step, layer and KV head; blocks of kChannelBlock, as SparQ ranks q's dims) enter
// the dot products, so a device reads KEEP / head_dim of the codes.
class KeySketchEstimator final : public MassEstimator {
 public:
  explicit KeySketchEstimator(int keep = 0) : keep_(keep) {}
  std::string name() const override;
  float score(const PageSummaryStore& s, int32_t slot, const float* q, float scale) const override;
  int kept_dims(int head_dim) const override { return keep_ > 0 && keep_ < head_dim ? keep_ : head_dim; }

 private:
  int keep_;
};

// The key sketch in 2 bits per dimension ("sketch2", a CPU study; PageSummaryStore::key_codes2):
// sketch4's log-mean-exp on codes in {-3, -1, 1, 3}, all dimensions, half of sketch4's bytes.
class KeySketch2Estimator final : public MassEstimator {
 public:
  std::string name() const override { return "sketch2"; }
  bool needs_two_bit_codes() const override { return true; }
  float score(const PageSummaryStore& s, int32_t slot, const float* q, float scale) const override;
};

// The key sketch in a low-rank key basis ("psketch4:R"): sketch4's log-mean-exp of the page's
// tokens' exp-scores, on R coordinates per token (PageSummaryStore::projected_codes, the store
// needs a key basis of rank R) and q projected on the same basis and rounded to f16 (the device
// keeps it so), q^ = int8(f16(B q)). Scores are
// q·k up to the common q·mean term (key_basis.h), which cancels in the normalised masses.
// A device would read R / head_dim of sketch4's code bytes.
//
// keep > 0 ("psketch4:R:KEEP"): per step, layer and KV head only the KEEP / 4 blocks of 4
// coordinates with the largest summed |(B q)_i| * sqrt(variance_i) over the GQA group (the
// spread each coordinate adds to the scores; SparQ's choice, in the basis where the keys'
// variance is concentrated) enter the dot products; the others of B q are zeroed.
//
// query_aware ("qsketch4:R[:KEEP]"): the same on a query-aware basis (key_basis.h fit_qk_basis:
// A q for the queries, C (k - mean) for the keys), fitted to keep the scores' spread.
class ProjectedSketchEstimator final : public MassEstimator {
 public:
  explicit ProjectedSketchEstimator(int rank, int keep = 0, bool query_aware = false)
      : rank_(rank), keep_(keep), query_aware_(query_aware) {}
  std::string name() const override;
  float score(const PageSummaryStore& s, int32_t slot, const float* q, float scale) const override;
  int projected_rank() const override { return rank_; }
  int projected_keep() const override { return keep_ > 0 && keep_ < rank_ ? keep_ : rank_; }
  bool query_aware() const override { return query_aware_; }

 private:
  int rank_, keep_;
  bool query_aware_;
};

// "minmax" | "meanspread" (kappa 1) | "gaussian" | "sketch4" | "sketch4:KEEP" | "sketch2" | "psketch4:R[:KEEP]" | "qsketch4:R[:KEEP]" |
// "minmax:ALPHA".
// Throws dhs::Error on another name.
std::shared_ptr<const MassEstimator> make_estimator(const std::string& name);

// GroupCombine: dhisparse/policy.h.

struct MassQuery {
  const float* q = nullptr;  // [n_rows, n_heads_q, head_dim]; rows of this request at row_begin..row_end
  int32_t row_begin = 0, row_end = 0;
  int n_heads_q = 0;
  float scale = 0.0f;  // attention's softmax scale, usually 1/sqrt(head_dim)
  int64_t seq_len = 0;  // tokens in the request's KV, this step's rows included (last row at seq_len-1)
};

// Normalised estimated mass of each page 0..n_pages-1 of (layer, kv_head) of `table`,
// over q heads [kv_head * group, (kv_head+1) * group) with group = n_heads_q / n_heads_kv.
// Writes n_pages = ceil(seq_len / page_size) values summing to 1 (all 0 if no query row
// sees a key). Pages no row can see (causally) get 0.
void estimate_page_mass(const MassEstimator& est, const PageSummaryStore& store, const PageTable& table,
                        int layer, int kv_head, const MassQuery& mq, GroupCombine combine,
                        std::vector<double>* mass);

// Same, for several KV heads combined into one distribution per request (SoloHead's shared
// scoring): every q head of the listed KV heads counts once, combined with `combine`.
void estimate_page_mass_heads(const MassEstimator& est, const PageSummaryStore& store,
                              const PageTable& table, int layer, const std::vector<int>& kv_heads,
                              const MassQuery& mq, GroupCombine combine, std::vector<double>* mass);

}  // namespace dhs
