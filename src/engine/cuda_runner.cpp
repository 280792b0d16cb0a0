// StepRunner on the CUDA backend (built only where nvcc is found): LlamaCuda at serving sizes
// (max_batch requests per step, decode graphs per batch-size bucket, the KV pool sized from
// kv_blocks or the GPU memory left), sampling on the device: a step copies back only the
// sampled ids, and the logits when asked for them.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/decode_attention.h"
#include "core/error.h"
#include "dhisparse/scheduler.h"
#include "engine/cuda_tiers.h"
#include "engine/runner_tiers.h"
#include "engine/sampler.h"
#include "engine/step_runner.h"
#include "model/arch/llama_cuda.h"
#include "model/model_shapes.h"

namespace dhs {

namespace {

constexpr int kMaxBatchLimit = 1024;  // LlamaCuda's
constexpr int64_t kStepTokens = 2048;
constexpr uint64_t kDummySeed = 1234;  // --load-format dummy: the weights `dhisparse bench` times

class CudaRunner final : public StepRunner {
 public:
  CudaRunner(const WeightSource& src, const EngineOptions& o, int64_t max_ctx) {
    DHS_CHECK(cuda::device_count() > 0, "--device cuda: no GPU found");
    DHS_CHECK(o.max_batch >= 0 && o.max_batch <= kMaxBatchLimit, "max batch must be in [0, {}], got {}", kMaxBatchLimit,
              o.max_batch);
    DHS_CHECK(o.load_format == "auto" || o.load_format == "dummy", "load format must be auto or dummy, got '{}'",
              o.load_format);
    const bool dummy = o.load_format == "dummy";
    const ModelConfig cfg = dummy && !o.dummy_shape.empty() ? model_shape(o.dummy_shape) : src.config();
    max_batch_ = o.max_batch > 0 ? o.max_batch : 1;  // generate: one request
    CudaModelOptions co;
    DHS_CHECK(o.gpu_weights == "native" || o.gpu_weights == "packed" || o.gpu_weights == "f16",
              "GPU weights must be native, packed or f16, got '{}'", o.gpu_weights);
    co.quantized_weights = o.gpu_weights != "f16";
    co.packed_weights = o.gpu_weights == "packed";
    DHS_CHECK(o.quantization == "none" || o.quantization == "fp8", "quantization must be none or fp8, got '{}'",
              o.quantization);
    co.fp8_weights = o.quantization == "fp8";
    DHS_CHECK(o.draft_quantization == "none" || o.draft_quantization == "fp8",
              "draft quantization must be none or fp8, got '{}'", o.draft_quantization);
    co.draft_fp8 = o.draft_quantization == "fp8";
    DHS_CHECK(o.verify_selection == "last-row" || o.verify_selection == "all-rows" || o.verify_selection == "per-row" ||
                  o.verify_selection == "per-row-union",
              "verify selection must be last-row, all-rows, per-row or per-row-union, got '{}'", o.verify_selection);
    co.per_row_union = o.verify_selection == "per-row-union";  // (per-row lists read once, as their union)
    co.verify_selection = co.per_row_union ? "per-row" : o.verify_selection;
    // The KV hierarchy: a host tier of pinned DRAM (f16 head-pages, K and V), on the recall-ahead
    // schedule only (a step moves nothing: its late pages are read in place; docs/hierarchy.md).
    const int64_t host_pages = RunnerTiers::host_pages(o, 2 * int64_t{o.page_size} * cfg.head_dim * 2);
    DHS_CHECK(host_pages == 0 || o.kv_recall == "ahead" || o.kv_recall == "land",
              "the KV hierarchy on the GPU runs the recall-ahead schedule: add --kv-recall ahead or land (the layer "
              "schedule needs a host round trip per layer inside the step)");
    co.host_pages = host_pages;
    // DHS_MIXED_PREFILL=1: a mixed step's decode rows through prefill attention, dense, as before
    // session 35 (the serving A/B of CudaModelOptions::mixed_decode_attention).
    co.mixed_decode_attention = std::getenv("DHS_MIXED_PREFILL") == nullptr;
    // A decode step's landing (and in-place late reads) on a second stream beside the resident
    // part's attention, where the rule takes it (CudaModelOptions::land_overlap).
    const std::optional<LandOverlapRule> overlap = LandOverlapRule::parse(o.kv_land_overlap);
    DHS_CHECK(overlap.has_value(), "--kv-land-overlap must be auto, on or off, got '{}'", o.kv_land_overlap);
    if (host_pages > 0) co.land_overlap = land_overlap_env(*overlap);
    const GpuPageData pd = gpu_page_data(o);  // only what the estimator reads (eval: all)
    co.summaries = pd.summaries;
    co.key_sketch = pd.key_sketch;
    co.max_batch = max_batch_;
    co.max_step_tokens = static_cast<int>(kStepTokens);
    co.max_context = max_ctx;
    co.page_size = o.page_size;
    // Speculative verification: 1 + the drafts a cycle may make (kSpeculativeAutoMaxK), as many
    // as the attention kernel takes at this GQA group.
    co.max_verify_rows = std::clamp<int>(cuda::kDecodeMaxQVecs / static_cast<int>(cfg.n_heads_q / cfg.n_heads_kv), 1,
                                         1 + kSpeculativeAutoMaxK);
    const int64_t per_block = cfg.n_layers * cfg.n_heads_kv;  // head-pages of one block of page_size tokens
    DHS_CHECK(o.kv_blocks >= 0 && o.kv_blocks <= ((int64_t{1} << 31) - 1) / per_block, "KV blocks must be in [0, {}], got {}",
              ((int64_t{1} << 31) - 1) / per_block, o.kv_blocks);
    DHS_CHECK(o.gpu_memory_utilization > 0.0 && o.gpu_memory_utilization <= 1.0,
              "gpu memory utilization must be in (0, 1], got {}", o.gpu_memory_utilization);
    // The pool: kv_blocks when given; else, serving (max_batch given), what gpu_memory_utilization
    // leaves, as vLLM sizes it; else (generate, eval: one request) one whole context, as before,
    // so that a single request does not take the GPU's memory.
    if (o.kv_blocks > 0)
      co.n_pages = o.kv_blocks * per_block;
    else if (o.max_batch > 0)
      co.gpu_memory_utilization = o.gpu_memory_utilization;
    if (o.progress) o.progress(0, 1);
    model_ = dummy ? std::make_unique<LlamaCuda>(cfg, kDummySeed, co) : std::make_unique<LlamaCuda>(src, co);
    if (o.progress) o.progress(1, 1);
    if (host_pages > 0) {
      tiers_ = std::make_unique<RunnerTiers>(
          model_->allocator(),
          std::make_unique<PagePool>(Tier::Host, host_pages, o.page_size, static_cast<int>(cfg.head_dim), /*with_storage=*/false),
          o, static_cast<int>(cfg.n_layers), [this] { return (steps_ + 1) * model_->config().n_layers; });
      LlamaCuda* m = model_.get();
      tiers_->kv().set_mover([m](const PagePool& src, PagePool& dst, std::span<const PageMove> moves) {
        return m->move_pages(src, dst, moves);
      });
      tiers_->kv().set_relocate_hook([m](const PageTable& t, int l, int h, int64_t i) { m->patch_table(t, l, h, i); });
      tiers_->kv().set_time_hooks(phases_log_);  // (DHS_STEP_PHASES: the hook's share of the after-step)
      tiers_->set_io_rate(o.kv_io_gbps > 0 ? o.kv_io_gbps : measure_pcie_gbps(), 2 * int64_t{o.page_size} * cfg.head_dim * 2);
      recalls_ = std::make_unique<DeferredRecalls>(*tiers_);
      DHS_CHECK(o.kv_lru_mirror == "on" || o.kv_lru_mirror == "off", "--kv-lru-mirror must be on or off, got '{}'", o.kv_lru_mirror);
      if (lru_mirror_env(o.kv_lru_mirror == "on")) mirror_lru(tiers_->kv(), *model_);
    }
    overlap_recalls_ = o.kv_overlap_recalls;
    rows_.resize(static_cast<size_t>(max_batch_));
    rng_.assign(static_cast<size_t>(max_batch_), 0);
    window_.assign(static_cast<size_t>(max_batch_), 0);
    begun_.assign(static_cast<size_t>(max_batch_), false);
    if (!o.policy.dense()) set_policy(o.policy);
  }
  void set_policy(const PolicySpec& spec) override {
    // A reused selection holds the keys its pages had when it was made; the hierarchy moves pages
    // between steps (the CPU re-reads them from the tables; the GPU does not yet).
    DHS_CHECK(!tiers_ || spec.reselect_every <= 1,
              "--reselect-every {} with the host KV tier on the GPU is not supported yet", spec.reselect_every);
    model_->set_sparsity(spec);
    policy_ = spec;
  }
  const PolicySpec& policy() const override { return policy_; }
  double fit_key_basis(const PageTable&, int64_t, int, bool) override {
    throw Error("the projected key sketch (psketch4:R, qsketch4:R) is a CPU experiment so far: --device cpu");
  }
  void capture_queries(bool) override {}
  PageCounts take_page_counts() override {
    const CudaSparsityStats st = model_->sparsity_stats();
    model_->reset_sparsity_stats();
    PageCounts c;
    c.layer_head_read = st.read;
    c.layer_head_total = st.total;
    for (size_t i = 0; i < st.read.size(); ++i) {
      c.read += st.read[i];
      c.total += st.total[i];
    }
    return c;
  }
  const ModelConfig& config() const override { return model_->config(); }
  // A verify's rows are decode rows of one request in one attention call: each selected page is
  // read once for all of them (LlamaCuda::Seq::verify), unless each row selects its own.
  int max_verify_rows() const override { return model_->options().max_verify_rows; }
  // DHS_TIER_PREFILL_ALONE=1, with a host tier: a prompt chunk runs alone (the scheduler
  // alternates prefill and decode steps). Until session 35 a step with prompt rows ran every row
  // through prefill attention, so a decode row beside a chunk was read densely, its offloaded pages
  // in place over PCIe, with no landing and no recall after — under the serving load (session 34,
  // H100) such steps took 25–38 ms with 5–12 requests against 15 ms with up to 4, ~2.5 ms a decode
  // row. Now those rows read their policy's pages as a decode step's rows do
  // (CudaModelOptions::mixed_decode_attention: landing, reads scanned, late pages recalled after
  // the step), and running chunks alone loses (session 35, H100: landing 5.63 -> 4.90 req/s under
  // the serving load). Off by default (docs/hierarchy.md).
  bool prefill_alone() const override { return tiers_ != nullptr && prefill_alone_; }
  // (per-row verify selections read them once per row)
  void keep_draft_seeds(int m) override { model_->keep_draft_seeds(m); }
  int max_draft_seeds() const override { return cuda::kMaxSeedPages; }
  void truncate(PageTable& table, int64_t n_tokens) override {
    flush_recalls();
    model_->forget_draft_seeds(table.id(), n_tokens);
    if (!(tiers_ && tiers_->truncate(table, n_tokens))) table.truncate(pages(), n_tokens);
  }
  void release(PageTable& table) override {
    flush_recalls();
    model_->forget_draft_seeds(table.id(), 0);
    if (!(tiers_ && tiers_->release(table))) table.release(pages());
  }
  // The KV hierarchy (RunnerTiers), as the CPU runner keeps it.
  std::string check_pages() const override { return tiers_ ? tiers_->check() : model_->allocator().check_invariants(); }
  int64_t host_tier_pages() const override { return tiers_ ? tiers_->host().n_pages() : 0; }
  bool make_room(int64_t n) override {
    flush_recalls();  // (they take free slots: before the room is counted)
    return tiers_ ? tiers_->make_room(n) : model_->allocator().n_free() >= n;
  }
  int64_t reclaimable_pages() const override { return tiers_ ? tiers_->reclaimable() : 0; }
  bool swap_out(PageTable& t) override {
    flush_recalls();
    return tiers_ && tiers_->swap_out(t);
  }
  int64_t swap_in_pages(const PageTable& t) const override { return tiers_ ? tiers_->swap_in_pages(t) : 0; }
  bool swap_in(PageTable& t) override {
    flush_recalls();
    return !tiers_ || tiers_->swap_in(t);
  }
  TierCounts tier_counts() const override {
    if (!tiers_) return {};
    TierCounts c = tiers_->counts();
    c.tier_steps = static_cast<uint64_t>(model_->tier_steps());
    c.overlapped_steps = static_cast<uint64_t>(model_->overlapped_steps());
    return c;
  }
  double kv_io_load() const override { return tiers_ ? tiers_->io_load() : 0.0; }
  double kv_io_load_admitting(int64_t pages) const override { return tiers_ ? tiers_->io_load_admitting(pages) : 0.0; }
  bool kv_admitting_pays(int64_t pages, int64_t running) const override {
    return !tiers_ || tiers_->admitting_pays(pages, running);
  }
  double kv_step_page_cost_seconds() const override { return tiers_ ? tiers_->step_page_seconds() : 0.0; }
  double kv_step_fixed_seconds() const override { return tiers_ ? tiers_->step_fixed_seconds() : -1.0; }
  double kv_budget_target_miss() const override { return tiers_ ? tiers_->budget_target_miss() : 0.0; }
  double kv_page_cost_seconds() const override { return tiers_ ? tiers_->io_cost().per_page_seconds() : 0.0; }
  // (per-row selections read as their union read the pages once, except over the host tier)
  bool verify_reads_kv_once() const override {
    const CudaModelOptions& o = model_->options();
    return o.verify_selection != "per-row" || (o.per_row_union && o.host_pages == 0);
  }
  PagePool& pages() override { return model_->allocator(); }
  int max_batch() const override { return max_batch_; }
  int64_t max_step_tokens() const override { return kStepTokens; }
  void set_sampled_vocab(int64_t n) override { model_->set_sampled_vocab(n); }
  void begin_request(int slot, const SamplingParams& p) override {
    check_slot(slot);
    validate(p);
    // Same meaning as the host Sampler's parameters (sampling.h); the draws come from the
    // request's own Philox stream (seed, counter = tokens sampled so far).
    cuda::SamplingRow& r = rows_[static_cast<size_t>(slot)];
    r.temperature = p.temperature;
    r.top_k = p.top_k;
    r.top_p = p.top_p;
    r.min_p = p.min_p;
    r.repetition_penalty = p.repetition_penalty;
    r.seed = p.seed;
    rng_[static_cast<size_t>(slot)] = 0;
    window_[static_cast<size_t>(slot)] = p.repetition_window;
    begun_[static_cast<size_t>(slot)] = true;
    model_->reset_history(slot);
  }
  // One forward of every request's rows; the sampler (the step's last kernel) draws each
  // request's next token with its own parameters, so only the ids come back.
  void step(const std::vector<StepRequest>& batch, StepOutput* out, bool want_logits) override {
    std::vector<LlamaCuda::Seq> seqs;
    seqs.reserve(batch.size());
    bool any_verify = false;
    for (const StepRequest& r : batch) {
      check_slot(r.slot);
      const size_t s = static_cast<size_t>(r.slot);
      DHS_CHECK(!r.sample || begun_[s], "sampling slot {} before begin_request", r.slot);
      DHS_CHECK(!(r.verify && r.sample), "a verify request is not sampled by the runner");
      LlamaCuda::Seq q{r.table, r.slot, r.tokens, r.n_new};
      q.policy = r.policy;
      q.verify = r.verify;
      q.draft = r.draft;
      any_verify = any_verify || r.verify;
      if (r.sample) {
        q.sampling = &rows_[s];
        q.rng_offset = rng_[s];
        q.history = r.history;
        q.history_window = window_[s];
      }
      seqs.push_back(q);
    }
    const auto t0 = std::chrono::steady_clock::now();
    // (the counts since here: the last step's recalls in flight, this step's reads)
    const TierStats totals0 = tiers_ && phases_log_ ? tiers_->kv().totals() : TierStats{};
    const bool prefill = std::any_of(batch.begin(), batch.end(), [](const StepRequest& r) { return r.n_new > 1 && !r.verify; });
    std::vector<TierStats> tier_before;
    // A step whose rows all read as a decode step's, or a mixed step whose decode and verify rows
    // do (CudaModelOptions::mixed_decode_attention; LlamaCuda::forward's split): landing slots, and
    // the reads scanned after it.
    const bool decode_reads =
        !prefill || (model_->options().mixed_decode_attention &&
                     std::any_of(batch.begin(), batch.end(), [&](const StepRequest& r) { return model_->reads_as_decode(r.n_new, r.verify); }));
    // The last decode step's recalls run while this step runs when it is a decode step too (the
    // overlap: docs/hierarchy.md), else now.
    const bool overlap = tiers_ && overlap_recalls_ && !prefill;
    if (!overlap) flush_recalls();
    const std::function<void()> while_running = overlap ? recalls_->in_flight() : std::function<void()>{};
    if (tiers_) {
      tiers_->before_step(batch);  // (prefill and decode attention read either tier: nothing is pinned)
      tier_before = tiers_->stats_of(batch);
      // Landing (--kv-recall land): slots for a decode step's late pages, the last one's claims
      // and a quarter more (after_decode_step adopts the landings and frees the rest).
      if (tiers_->land() && decode_reads) {
        const int64_t want = std::min<int64_t>(LlamaCuda::kLandMax, last_claims_ + last_claims_ / 4 + 64);
        model_->set_landing_slots(tiers_->kv().reserve_landing(want, tiers_->clock()));
      }
      // The LRU's changes into its mirror in HBM, at the step's last layer's tick (after the
      // landing's reservation: what runs in flight from here is after the step's reads).
      if (decode_reads) patch_lru(tiers_->kv(), *model_, tiers_->clock() + model_->config().n_layers - 1);
    }
    // The host's time in the hierarchy's calls this step (RunnerTiers::end_step_io: the measured
    // cost of a moved page): before the launch, after the step, and the part of the recalls in
    // flight that outlasted the step's kernels (the step waited for it: at batch 16 of the default
    // model the in-flight work took 21-35 ms beside ~9 ms of kernels; docs/hierarchy.md).
    double tier_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out->logits.clear();
    out->verify_logits.clear();
    out->verify_row.assign(batch.size(), -1);
    out->verify_ids.clear();
    bool ids_only = any_verify && !want_logits;
    for (const StepRequest& r : batch) ids_only = ids_only && (!r.verify || r.verify_ids);
    if (!any_verify) {
      model_->forward(seqs, want_logits ? &out->logits : nullptr, true, while_running);
    } else if (ids_only) {
      // Greedy verifies: the device's argmax of every row, no logits over PCIe.
      model_->forward(seqs, nullptr, true, while_running);
      const std::vector<int32_t>& rows = model_->row_ids();
      for (size_t i = 0; i < batch.size(); ++i)
        if (batch[i].verify) {
          out->verify_row[i] = static_cast<int64_t>(out->verify_ids.size());
          const size_t first = static_cast<size_t>(model_->out_row(i));
          out->verify_ids.insert(out->verify_ids.end(), rows.begin() + static_cast<std::ptrdiff_t>(first),
                                 rows.begin() + static_cast<std::ptrdiff_t>(first + static_cast<size_t>(batch[i].n_new)));
        }
    } else {
      // The model's output rows (in batch order: LlamaCuda::out_row): the last rows
      // (want_logits) and the verify rows.
      model_->forward(seqs, &rows_out_, true, while_running);
      split_output_rows(batch, rows_out_, model_->config().vocab_size, want_logits, out);
    }
    if (recalls_) recalls_->rethrow_in_flight();
    if (overlap && while_running) {
      const LlamaCuda::Phases& ph = model_->last_phases();
      tier_s += std::max(0.0, ph.while_ms - ph.graph_ms) * 1e-3;
    }
    // The step is done: the hierarchy's clock reads past its layers from here (so what after it
    // touches or chooses by last use, budgets included, is later than every read of the step).
    ++steps_;
    if (tiers_) {
      const auto ta = std::chrono::steady_clock::now();
      after_tier_step(batch, prefill, tier_before);
      if (decode_reads) last_claims_ = model_->landing_claims();
      const auto t1 = std::chrono::steady_clock::now();
      tier_s += std::chrono::duration<double>(t1 - ta).count();
      const StepWork work = step_work(batch);
      tiers_->end_step_io(std::chrono::duration<double>(t1 - t0).count(), tier_s, work.decode_rows, work.prefill_tokens);
      if (phases_log_) log_phases(batch, prefill, totals0, std::chrono::duration<double>(t1 - t0).count(), tier_s,
                                  std::chrono::duration<double>(t1 - ta).count());
    }
    const std::vector<int32_t>& ids = model_->sampled_ids();
    out->sampled.assign(batch.size(), -1);
    for (size_t i = 0; i < batch.size(); ++i)
      if (batch[i].sample) {
        out->sampled[i] = ids[i];
        ++rng_[static_cast<size_t>(batch[i].slot)];
      }
  }

 private:
  // GB/s of a 64 MiB copy from pinned DRAM into HBM (the best of three): the link the host tier's
  // pages cross.
  static double measure_pcie_gbps() {
    const size_t n = size_t{64} << 20;
    void *h = nullptr, *d = nullptr;
    DHS_CUDA_CHECK(cudaMallocHost(&h, n));
    DHS_CUDA_CHECK(cudaMalloc(&d, n));
    std::memset(h, 1, n);
    cudaEvent_t a, b;
    DHS_CUDA_CHECK(cudaEventCreate(&a));
    DHS_CUDA_CHECK(cudaEventCreate(&b));
    float best_ms = 0.0f;
    for (int i = 0; i < 3; ++i) {
      DHS_CUDA_CHECK(cudaEventRecord(a));
      DHS_CUDA_CHECK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice));
      DHS_CUDA_CHECK(cudaEventRecord(b));
      DHS_CUDA_CHECK(cudaEventSynchronize(b));
      float ms = 0.0f;
      DHS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
      if (ms > 0.0f && (best_ms == 0.0f || ms < best_ms)) best_ms = ms;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaFree(d);
    cudaFreeHost(h);
    return best_ms > 0.0f ? static_cast<double>(n) / (best_ms * 1e-3) / 1e9 : 50.0;
  }

  // After a step with the host tier: a step with prompt rows holds each request to its budget
  // (end_step offloads what a chunk added past it); a decode step's late reads are noted and
  // recalled for the next step, in the order logged (TieredKv::recall_ahead), its hits touched in
  // the LRU (the read stamps); then the cache manager's budgets.
  void after_tier_step(const std::vector<StepRequest>& batch, bool prefill, const std::vector<TierStats>& before) {
    TieredKv& kv = tiers_->kv();
    const int64_t now = tiers_->clock() - 1;  // this step's last layer (steps_ counts it already)
    if (prefill) {
      // A mixed step's decode rows were read as a decode step reads them
      // (CudaModelOptions::mixed_decode_attention): their hits touched, their landings adopted,
      // their late pages recalled now (the next step may be another chunk's: nothing overlaps
      // them); then the chunks' pages past their budgets offloaded.
      if (model_->read_stamp() >= 0) {
        std::vector<PageTable*> tables;
        for (const StepRequest& r : batch) tables.push_back(r.table);
        recall_after_decode(kv, *model_, tables, now);
      }
      kv.end_step(now);
    } else {
      // Each request's reads: its hits and its late reads; recall_ahead keeps the first and
      // brings back the second (as the CPU's).
      std::vector<PageTable*> tables;
      for (const StepRequest& r : batch) tables.push_back(r.table);
      recalls_->after_decode(*model_, tables, now);
      if (!overlap_recalls_) flush_recalls();
    }
    tiers_->after_step(batch, before);
  }

  // DHS_STEP_PHASES=1 (a diagnostic, with the host tier): one line per step on stderr — its rows,
  // where its wall time went (LlamaCuda::last_phases: before the launch, launch to wait with the
  // in-flight recalls inside it, after the wait; the hierarchy's after-step) and the pages it
  // moved — to find what a late page costs a serving step (docs/hierarchy.md, session 32).
  void log_phases(const std::vector<StepRequest>& batch, bool prefill, const TierStats& before, double step_s,
                  double tier_s, double after_s) const {
    int64_t rows = 0;
    for (const StepRequest& r : batch) rows += r.n_new;
    const LlamaCuda::Phases& ph = model_->last_phases();
    const TierStats& t = tiers_->kv().totals();
    const TieredKv::AfterStepTimes& k = tiers_->kv().after_step_times();  // (the last reads' and recalls' calls)
    std::fprintf(stderr,
                 "step phases: %s seqs %zu rows %lld | step %.3f ms, hierarchy host %.3f (after-step %.3f) | forward before %.3f "
                 "launch-to-wait %.3f (in flight %.3f, kernels %.3f) after %.3f | late %lld recalled %lld offloaded %lld hits %lld "
                 "landings %zu | kv parts: scan %.3f adopt %.3f budgets %.3f plan %.3f victims %.3f recalls %.3f (io %.3f, hooks %.3f) ms, "
                 "batched steps %lld\n",
                 prefill ? "prefill" : "decode", batch.size(), static_cast<long long>(rows), step_s * 1e3, tier_s * 1e3,
                 after_s * 1e3, ph.before_ms, ph.gpu_ms, ph.while_ms, ph.graph_ms, ph.after_ms, static_cast<long long>(t.late - before.late),
                 static_cast<long long>(t.recalled - before.recalled), static_cast<long long>(t.offloaded - before.offloaded),
                 static_cast<long long>(t.hits - before.hits), model_->landings().size(), k.scan_ms, k.adopt_ms, k.budgets_ms, k.plan_ms,
                 k.victims_ms, k.recall_ms, k.io_ms, k.hooks_ms, static_cast<long long>(tiers_->kv().batched_steps()));
  }

  // The last decode step's recalls (TieredKv::after_step_recalls), if not run yet.
  void flush_recalls() {
    if (recalls_) recalls_->flush();
  }

  void check_slot(int slot) const {
    DHS_CHECK(slot >= 0 && slot < max_batch_, "request slot {} outside [0, {})", slot, max_batch_);
  }

  int max_batch_ = 1;
  int64_t last_claims_ = 1024;  // landing: the last decode step's late entries (slots it asked for)
  const bool phases_log_ = std::getenv("DHS_STEP_PHASES") != nullptr;  // DHS_STEP_PHASES: log_phases
  const bool prefill_alone_ = std::getenv("DHS_TIER_PREFILL_ALONE") != nullptr;  // (prefill_alone's A/B)
  PolicySpec policy_;
  std::unique_ptr<LlamaCuda> model_;
  std::vector<cuda::SamplingRow> rows_;  // [max_batch] each slot's sampling parameters
  std::vector<uint64_t> rng_;            // [max_batch] draws made in each slot's stream
  std::vector<int> window_;              // [max_batch] repetition windows
  std::vector<bool> begun_;
  std::vector<float> rows_out_;          // a verify step's output rows (reused)
  std::unique_ptr<RunnerTiers> tiers_;   // the KV hierarchy (--cpu-kv-gb), or null
  int64_t steps_ = 0;                    // steps run: the hierarchy's clock is steps_ x n_layers
  std::unique_ptr<DeferredRecalls> recalls_;  // the last decode step's recalls not run yet (with tiers_)
  bool overlap_recalls_ = true;  // EngineOptions::kv_overlap_recalls
};

}  // namespace

std::unique_ptr<StepRunner> make_cuda_runner(const WeightSource& src, const EngineOptions& o, int64_t max_ctx) {
  return std::make_unique<CudaRunner>(src, o, max_ctx);
}

}  // namespace dhs
