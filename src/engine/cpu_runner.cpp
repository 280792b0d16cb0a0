// StepRunner on the CPU backend.
#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "core/error.h"
#include "engine/host_sampling.h"
#include "engine/step_runner.h"
#include "engine/runner_tiers.h"
#include "model/arch/llama_cpu.h"

namespace dhs {

namespace {

class CpuRunner final : public StepRunner {
 public:
  CpuRunner(const WeightSource& src, const EngineOptions& o, int64_t max_ctx) {
    DHS_CHECK(o.weight_type == "f16" || o.weight_type == "f32", "weight type must be f16 or f32, got '{}'",
              o.weight_type);
    DHS_CHECK(o.quantization == "none" || o.quantization == "fp8", "quantization must be none or fp8, got '{}'",
              o.quantization);
    DHS_CHECK(o.draft_quantization == "none", "draft quantization {}: FP8 draft projections are built on the CUDA backend only",
              o.draft_quantization);
    DHS_CHECK(o.load_format == "auto", "load format {} (random weights, for speed runs) needs --device cuda",
              o.load_format);
    // (fp8: the CUDA backend's FP8 projections as fp32 values; with --weights f16 they are rounded
    // once more, so the oracle of the GPU's FP8 path is --weights f32.)
    model_ = std::make_unique<LlamaCpu>(src, o.weight_type == "f16" ? CpuWeightType::F16 : CpuWeightType::F32,
                                        o.progress, o.quantization == "fp8");
    const ModelConfig& c = model_->config();
    DHS_CHECK(o.max_batch >= 0 && o.max_batch <= kMaxBatch, "max batch must be in [0, {}], got {}", kMaxBatch, o.max_batch);
    max_batch_ = o.max_batch > 0 ? o.max_batch : kMaxBatch;
    sampling_ = std::make_unique<HostSampling>(c.vocab_size, max_batch_);
    // Default: one request of the whole context. kv_blocks: blocks of page_size tokens over every
    // (layer, KV head), as vLLM counts them.
    const int64_t blocks = o.kv_blocks > 0 ? o.kv_blocks : (max_ctx + o.page_size - 1) / o.page_size;
    DHS_CHECK(o.kv_blocks >= 0 && blocks <= (int64_t{1} << 31) / (c.n_layers * c.n_heads_kv),
              "KV blocks must be in [0, {}], got {}", (int64_t{1} << 31) / (c.n_layers * c.n_heads_kv), o.kv_blocks);
    // The KV hierarchy (kv/tiered_kv.h) when a host tier is asked for: the pool forward() reads
    // is then its device tier, and a second pool of cpu_kv_gb the host tier (both in host memory
    // here: the logic of the GPU's HBM-over-DRAM, run where CI runs).
    const int64_t host_pages = RunnerTiers::host_pages(o, 2 * int64_t{o.page_size} * c.head_dim * 4);  // K and V, fp32
    pool_ = std::make_unique<PagePool>(host_pages > 0 ? Tier::Device : Tier::Host, blocks * c.n_layers * c.n_heads_kv,
                                       o.page_size, static_cast<int>(c.head_dim));
    if (host_pages > 0) {
      // The clock ticks once per layer (LlamaCpu::set_tiers).
      tiers_ = std::make_unique<RunnerTiers>(
          *pool_, std::make_unique<PagePool>(Tier::Host, host_pages, o.page_size, static_cast<int>(c.head_dim)), o,
          static_cast<int>(c.n_layers), [m = model_.get()] { return m->tier_clock(); });
      model_->set_tiers(&tiers_->kv(),
                        tiers_->recall_ahead() ? LlamaCpu::RecallSchedule::Ahead : LlamaCpu::RecallSchedule::Layer);
      tiers_->set_io_rate(o.kv_io_gbps > 0 ? o.kv_io_gbps : RunnerTiers::measure_host_copy_gbps(),
                          2 * int64_t{o.page_size} * c.head_dim * 4);
    }
    if (!o.policy.dense()) {
      summaries_ = tiers_ ? std::make_unique<PageSummaryStore>(*pool_, tiers_->host()) : std::make_unique<PageSummaryStore>(*pool_);
      if (tiers_)  // a page's summary goes where the page goes
        tiers_->kv().set_move_hook([s = summaries_.get()](PageRef from, PageRef to) { s->copy_page(s->key(from), s->key(to)); });
      set_policy(o.policy);
    }
  }
  void set_policy(const PolicySpec& spec) override {
    spec.validate();
    DHS_CHECK(!spec.scores() || summaries_, "--sparse-policy {}: the engine was loaded dense, without page summaries",
              spec.str());
    policy_ = spec.dense() ? nullptr : make_policy(spec);
    spec_ = spec;
    own_.clear();
    DHS_CHECK(!(tiers_ && spec.scores() && make_estimator(spec.estimator)->needs_two_bit_codes()),
              "estimator {} (two-bit codes, a CPU study) with the host KV tier is not supported", spec.estimator);
    if (policy_ && summaries_ && spec.scores() && make_estimator(spec.estimator)->needs_two_bit_codes())
      summaries_->enable_two_bit_codes(*pool_);  // (re-encodes the rows already appended)
    model_->set_sparsity(policy_.get(), summaries_.get(), spec.reselect_every, spec.min_step_tokens, spec.dense_below);
  }
  const PolicySpec& policy() const override { return spec_; }
  const ModelConfig& config() const override { return model_->config(); }
  PagePool& pages() override { return *pool_; }
  // The CPU forward takes any batch; the pool's size is what limits it.
  int max_batch() const override { return max_batch_; }
  int64_t max_step_tokens() const override { return 512; }
  void set_sampled_vocab(int64_t n) override { sampling_->set_sampled_vocab(n); }
  void begin_request(int slot, const SamplingParams& p) override { sampling_->begin(slot, p); }
  int max_verify_rows() const override { return std::numeric_limits<int>::max(); }
  void keep_draft_seeds(int m) override { seed_pages_ = std::max(seed_pages_, m); }
  void truncate(PageTable& table, int64_t n_tokens) override {
    if (auto it = seeds_.find(&table); it != seeds_.end()) it->second.truncate(n_tokens);
    if (!(tiers_ && tiers_->truncate(table, n_tokens))) table.truncate(*pool_, n_tokens);
    if (!summaries_) return;
    // The last page's rows changed: its summary is rebuilt from the pool, now or, when the
    // hierarchy left that page in the host tier for lack of room, once the next step has it back.
    if (appending_pages_resident(table)) truncate_summaries(table, *pool_, *summaries_, n_tokens);
    else summaries_pending_.insert(&table);
  }
  bool appending_pages_resident(const PageTable& t) const {
    if (t.n_tokens() % t.page_size() == 0) return true;
    for (int l = 0; l < t.n_layers(); ++l)
      for (int h = 0; h < t.n_heads_kv(); ++h)
        if (t.page(l, h, t.n_tokens() / t.page_size()).tier != pool_->tier()) return false;
    return true;
  }
  void release(PageTable& table) override {
    summaries_pending_.erase(&table);
    seeds_.erase(&table);
    if (!(tiers_ && tiers_->release(table))) table.release(*pool_);
  }
  std::string check_pages() const override { return tiers_ ? tiers_->check() : pool_->check_invariants(); }
  int64_t host_tier_pages() const override { return tiers_ ? tiers_->host().n_pages() : 0; }
  bool make_room(int64_t n) override { return tiers_ ? tiers_->make_room(n) : pool_->n_free() >= n; }
  int64_t reclaimable_pages() const override { return tiers_ ? tiers_->reclaimable() : 0; }
  bool swap_out(PageTable& t) override { return tiers_ && tiers_->swap_out(t); }
  int64_t swap_in_pages(const PageTable& t) const override { return tiers_ ? tiers_->swap_in_pages(t) : 0; }
  bool swap_in(PageTable& t) override { return !tiers_ || tiers_->swap_in(t); }
  TierCounts tier_counts() const override { return tiers_ ? tiers_->counts() : TierCounts{}; }
  double kv_io_load() const override { return tiers_ ? tiers_->io_load() : 0.0; }
  double kv_io_load_admitting(int64_t pages) const override { return tiers_ ? tiers_->io_load_admitting(pages) : 0.0; }
  bool kv_admitting_pays(int64_t pages, int64_t running) const override {
    return !tiers_ || tiers_->admitting_pays(pages, running);
  }
  double kv_step_page_cost_seconds() const override { return tiers_ ? tiers_->step_page_seconds() : 0.0; }
  double kv_step_fixed_seconds() const override { return tiers_ ? tiers_->step_fixed_seconds() : -1.0; }
  double kv_budget_target_miss() const override { return tiers_ ? tiers_->budget_target_miss() : 0.0; }
  double kv_page_cost_seconds() const override { return tiers_ ? tiers_->io_cost().per_page_seconds() : 0.0; }
  void capture_queries(bool on) override {
    queries_.clear();
    if (!on) {
      model_->set_debug_hook(nullptr);
      return;
    }
    queries_.resize(static_cast<size_t>(model_->config().n_layers));
    model_->set_debug_hook([this](const std::string& name, int layer, const float* data, int64_t n_tok, int64_t n) {
      if (name == "q_rope") queries_[static_cast<size_t>(layer)].insert(queries_[static_cast<size_t>(layer)].end(), data, data + n_tok * n);
    });
  }
  double fit_key_basis(const PageTable& table, int64_t n_tokens, int rank, bool query_aware) override {
    DHS_CHECK(summaries_, "calibrating a key basis needs an engine loaded with a sparse policy (page summaries)");
    DHS_CHECK(!tiers_, "calibrating a key basis with the host KV tier (--cpu-kv-gb) is not supported yet");
    const ModelConfig& c = model_->config();
    const int d = static_cast<int>(c.head_dim), hq = static_cast<int>(c.n_heads_q), hkv = static_cast<int>(c.n_heads_kv);
    DHS_CHECK(!query_aware || !queries_.empty(), "a query-aware key basis needs the calibration's queries (capture_queries)");
    auto basis = std::make_shared<KeyBasis>(
        query_aware ? fit_qk_basis(static_cast<int>(c.n_layers), hkv, d, rank,
                                   [&](int l, int h, std::vector<float>* rows) { table_key_rows(*pool_, table, n_tokens, l, h, rows); },
                                   [&](int l, int h, std::vector<float>* rows) {
                                     const std::vector<float>& q = queries_[static_cast<size_t>(l)];  // [T, Hq, D]
                                     const int group = hq / hkv;
                                     for (size_t t = 0; t < q.size() / static_cast<size_t>(hq * d); ++t)
                                       for (int g = 0; g < group; ++g) {
                                         const float* row = q.data() + (t * hq + static_cast<size_t>(h * group + g)) * d;
                                         rows->insert(rows->end(), row, row + d);
                                       }
                                   })
                    : dhs::fit_key_basis(*pool_, table, n_tokens, rank));
    summaries_->set_key_basis(basis, *pool_);
    double sum = 0.0;
    for (int l = 0; l < c.n_layers; ++l)
      for (int h = 0; h < c.n_heads_kv; ++h) sum += basis->explained(l, h);
    return sum / (c.n_layers * c.n_heads_kv);
  }
  PageCounts take_page_counts() override {
    const auto st = model_->sparsity_stats();
    model_->reset_sparsity_stats();
    PageCounts c;  // (per (layer, KV head): selecting steps outside verifies)
    c.read = static_cast<uint64_t>(st.pages_read);
    c.total = static_cast<uint64_t>(st.pages_total);
    c.layer_head_read = st.read;
    c.layer_head_total = st.total;
    return c;
  }
  void step(const std::vector<StepRequest>& batch, StepOutput* out, bool want_logits) override {
    if (own_.size() > 64) own_.clear();  // a bound on requests' policies kept (made again on use), between steps
    std::vector<LlamaCpu::Seq> seqs;
    bool any_sample = false, any_verify = false;
    for (const StepRequest& r : batch) {
      DHS_CHECK(!(r.verify && r.sample), "a verify request is not sampled by the runner");
      DraftSeeds* seeds = nullptr;
      if (seed_pages_ > 0) {
        seeds = &seeds_[r.table];
        seeds->set_capacity(seed_pages_);
      }
      seqs.push_back(LlamaCpu::Seq{r.table, r.tokens, r.n_new, r.policy ? own_policy(*r.policy) : nullptr, r.verify, seeds});
      any_sample = any_sample || r.sample;
      any_verify = any_verify || r.verify;
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (tiers_)
      tiers_->before_step(batch, [this](PageTable& t) {
        if (summaries_pending_.erase(&t))  // (truncate left its last page in the host tier)
          truncate_summaries(t, *pool_, *summaries_, t.n_tokens());
      });
    double tier_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();  // (the host's tier calls outside the layers)
    out->logits.clear();
    out->verify_logits.clear();
    out->verify_row.assign(batch.size(), -1);
    const std::vector<TierStats> before = tiers_ ? tiers_->stats_of(batch) : std::vector<TierStats>{};
    // Landing (--kv-recall land): device slots for a decode step's late pages, the last one's late
    // reads and a quarter more (the step adopts its landings and frees the rest).
    const bool decode = std::none_of(batch.begin(), batch.end(), [](const StepRequest& r) { return r.n_new > 1 && !r.verify; });
    const int64_t late_before = tiers_ ? tiers_->kv().totals().late : 0;
    if (tiers_ && tiers_->land() && decode) {
      const auto tr = std::chrono::steady_clock::now();
      model_->set_landing_slots(tiers_->kv().reserve_landing(last_late_ + last_late_ / 4 + 16, model_->tier_clock()));
      tier_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - tr).count();
    }
    if (!any_verify) {
      model_->forward(seqs, *pool_, want_logits || any_sample ? &out->logits : nullptr);
    } else {
      // The model's rows: the last rows (sampling, want_logits) and the verify rows.
      std::vector<float> rows;
      model_->forward(seqs, *pool_, &rows);
      split_output_rows(batch, rows, model_->config().vocab_size, /*last_rows=*/true, out);
    }
    if (tiers_) {
      if (decode) last_late_ = tiers_->kv().totals().late - late_before;
      const auto ta = std::chrono::steady_clock::now();
      tiers_->after_step(batch, before);
      const auto t1 = std::chrono::steady_clock::now();
      tier_s += std::chrono::duration<double>(t1 - ta).count();
      const StepWork work = step_work(batch);
      tiers_->end_step_io(std::chrono::duration<double>(t1 - t0).count(), tier_s, work.decode_rows, work.prefill_tokens);
    }
    sampling_->sample(batch, out, want_logits);
  }

 private:
  static constexpr int kMaxBatch = 256;
  int max_batch_ = kMaxBatch;
  std::unique_ptr<HostSampling> sampling_;
  std::unique_ptr<LlamaCpu> model_;
  std::unique_ptr<PagePool> pool_;       // the pool forward() reads: the device tier with a host tier
  std::unique_ptr<RunnerTiers> tiers_;   // the KV hierarchy, or null
  int64_t last_late_ = 64;                // landing: the last decode step's late reads (the slots it asked for)
  std::set<const PageTable*> summaries_pending_;  // rolled back into a page the host tier kept
  int seed_pages_ = 0;                                // keep_draft_seeds
  std::map<const PageTable*, DraftSeeds> seeds_;      // each request's, while it holds its table
  // A request's own policy (StepRequest::policy), made once per spelling while the engine's stays.
  const SelectionPolicy* own_policy(const PolicySpec& spec) {
    auto& p = own_[spec.key()];
    if (!p) {
      // (as_request_policy refuses it for requests; a speculative draft's sink + window needs no page data.)
      DHS_CHECK(policy_ != nullptr || !spec.scores(), "a request's own scoring policy {} on a dense engine", spec.str());
      p = make_policy(spec);
    }
    return p.get();
  }

  std::unique_ptr<SelectionPolicy> policy_;
  PolicySpec spec_;
  std::map<std::string, std::unique_ptr<SelectionPolicy>> own_;
  std::unique_ptr<PageSummaryStore> summaries_;
  std::vector<std::vector<float>> queries_;  // [n_layers][T, Hq, D] while capturing
};

}  // namespace

std::unique_ptr<StepRunner> make_cpu_runner(const WeightSource& src, const EngineOptions& o, int64_t max_ctx) {
  return std::make_unique<CpuRunner>(src, o, max_ctx);
}

}  // namespace dhs
