// What the engine needs from a backend: a page allocator for its KV pool and one
// batched forward step. A step runs any mix of requests, each its own rows: a prefill
// chunk or one decode token, over its own page table, and samples each request's next
// token where asked, on the device where there is one. The CPU runner wraps LlamaCpu
// over a host pool; the CUDA runner wraps LlamaCuda over the HBM pool (graph-captured
// decode). `generate` is a batch of one; the scheduler of the serving issue fills it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dhisparse/engine.h"
#include "kv/page_pool.h"
#include "kv/page_table.h"
#include "model/weight_source.h"
#include "sparse/policy.h"

namespace dhs {

// One request's part of a step.
struct StepRequest {
  PageTable* table = nullptr;       // the request's KV; capacity reserved for the new tokens
  int slot = 0;                     // the request's row of per-request backend state, [0, max_batch())
  const int32_t* tokens = nullptr;  // [n_new] appended at positions table->n_tokens() ...
  int64_t n_new = 0;
  // Sample this request's next token after its last row (begin_request set its parameters);
  // history: its tokens so far, prompt included (the repetition penalty reads them).
  bool sample = false;
  const std::vector<int32_t>* history = nullptr;
  // This request's own sparse policy where it differs from the runner's (as_request_policy
  // checked it against policy()); null: the runner's. Read by decode steps.
  const PolicySpec* policy = nullptr;
  // Speculative verification: the n_new tokens are this request's next decode steps (the token
  // after its last committed one, then the draft's), each row reading the pages its own decode
  // step would, so row j's logits equal decoding them one at a time; every row's logits come
  // back (StepOutput::verify_logits). Not sampled by the runner (sample false).
  bool verify = false;
  // A verify judged by its rows' greedy ids alone (greedy, no repetition penalty): the runner
  // may return StepOutput::verify_ids instead of the rows' logits.
  bool verify_ids = false;
  // A speculative draft row (its pages are the draft's, not what the request's decode steps read:
  // the hierarchy's working-set measurement leaves it out).
  bool draft = false;
};

// What a step computes, as the KV hierarchy's step-cost fit counts it (kv/step_cost.h): decode
// rows (a request's one new token, or each row of its verify) and prefill tokens.
struct StepWork {
  int64_t decode_rows = 0, prefill_tokens = 0;
};
inline StepWork step_work(const std::vector<StepRequest>& batch) {
  StepWork w;
  for (const StepRequest& r : batch) (r.n_new == 1 || r.verify ? w.decode_rows : w.prefill_tokens) += r.n_new;
  return w;
}

struct StepOutput {
  std::vector<float> logits;     // [n_requests, vocab] last-row logits, when the step was asked for them
  std::vector<int32_t> sampled;  // [n_requests] next token of each request that asked, -1 elsewhere
  // The verify requests' rows: [sum of their n_new, vocab]; request i's first row at
  // verify_row[i] (-1 for the others).
  std::vector<float> verify_logits;
  std::vector<int64_t> verify_row;
  // Instead of verify_logits, where every verify request of the step asked for ids only
  // (StepRequest::verify_ids) and the step no logits: each verify row's greedy id over the
  // sampled vocabulary, [sum of their n_new], request i's first at verify_row[i]. Empty otherwise.
  std::vector<int32_t> verify_ids;
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual const ModelConfig& config() const = 0;
  virtual PagePool& pages() = 0;  // allocator / accounting of the KV pool
  virtual int max_batch() const = 0;            // requests per step
  virtual int64_t max_step_tokens() const = 0;  // tokens per step over all requests (prefill chunk)
  // Ids a sampler may return: [0, n). Logits past the tokenizer's vocabulary are padding of
  // the embedding (Qwen2.5 pads to a multiple of 128) and never sampled. Default: the model's vocab.
  virtual void set_sampled_vocab(int64_t n) = 0;
  // A request starts in `slot`: its sampling parameters, and its RNG seeded from p.seed.
  virtual void begin_request(int slot, const SamplingParams& p) = 0;
  // Runs every request's new tokens (each table has room for them), commits them, samples
  // where asked, and copies the last-row logits to the host when want_logits.
  virtual void step(const std::vector<StepRequest>& batch, StepOutput* out, bool want_logits) = 0;
  // The most rows a verify request (StepRequest::verify) may have: 1 + the drafts of a cycle;
  // 0: step() takes no verify requests (no speculative decoding).
  virtual int max_verify_rows() const { return 0; }
  // Whether a step that carries prompt rows must carry one request's prompt chunk and nothing
  // else; the scheduler then alternates prefill steps of one request with decode steps. The CUDA
  // runner with a host tier, when asked (DHS_TIER_PREFILL_ALONE: a step with prompt rows runs
  // every row through prefill attention, so a decode row beside a chunk reads all its pages, the
  // offloaded ones in place over PCIe; cuda_runner.cpp).
  virtual bool prefill_alone() const { return false; }
  bool verifies() const { return max_verify_rows() > 0; }
  // Whether a verify request's rows read its KV pages once between them (the speculation
  // controller's cost model, engine/spec_controller.h); the CPU runner's rows read theirs each.
  virtual bool verify_reads_kv_once() const { return false; }
  // Verification-seeded drafts (sparse/draft_seeds.h): from now on every scoring decode step of a
  // request records its m heaviest pages per (layer, KV head), which the request's seeded drafts
  // (sinkwindow:K+M) read; 0: nothing recorded (seeded drafts read their window alone). The
  // largest m asked stays.
  virtual void keep_draft_seeds(int m) { (void)m; }
  // The most seeds per list keep_draft_seeds takes.
  virtual int max_draft_seeds() const { return 1 << 16; }
  // Drops tokens past n_tokens (and whatever the backend derived from them).
  virtual void truncate(PageTable& table, int64_t n_tokens) { table.truncate(pages(), n_tokens); }
  // Frees every page of the table, in whichever tier it lives (request finished, cancelled or
  // preempted).
  virtual void release(PageTable& table) { table.release(pages()); }
  // The KV accounting's consistency ("" when consistent): the pool's invariants, and with a KV
  // hierarchy every page in the tier its table says (kv/tiered_kv.h).
  virtual std::string check_pages() const { return ""; }
  virtual TierCounts tier_counts() const { return {}; }
  // With a KV hierarchy (kv/tiered_kv.h; the defaults: none): room for n free pages in the pool
  // by offloading running requests' cold pages (false when they do not add up to n), and how many
  // such pages there are now;
  // The share of recent steps that the hierarchy's page moves and in-place reads took, each page
  // at its measured price (RunnerTiers::io_cost: its bytes over the link, or the host's time a
  // page where that is more; an average; 0 without a hierarchy): what IO-aware admission reads.
  virtual double kv_io_load() const { return 0.0; }
  // IO-aware admission: what that load would be with one more request of `pages` KV pages running
  // (RunnerTiers::io_load_admitting: the running requests' measured working sets and the new
  // one's, beyond what the pool holds, cross the link every step).
  virtual double kv_io_load_admitting(int64_t pages) const { (void)pages; return kv_io_load(); }
  // IO-aware admission's throughput rule: whether one more request of `pages` pages beside the
  // `running` ones keeps the batch's tokens per second (RunnerTiers::admitting_pays: the step's
  // cost fitted, kv/step_cost.h); true without a hierarchy.
  virtual bool kv_admitting_pays(int64_t pages, int64_t running) const { (void)pages; (void)running; return true; }
  // The price that rule puts on a page (seconds: the larger of kv_page_cost_seconds and
  // the whole step's fitted slope), and the step's fitted fixed part (seconds; < 0: not known).
  virtual double kv_step_page_cost_seconds() const { return 0.0; }
  virtual double kv_step_fixed_seconds() const { return -1.0; }
  // The cache manager's miss target (RunnerTiers::budget_target_miss; 0 without it).
  virtual double kv_budget_target_miss() const { return 0.0; }
  // What one more page crossing between the tiers costs a step, in seconds (kv/io_cost.h: fitted
  // from the host's time in the hierarchy and the pages moved; 0 without a hierarchy).
  virtual double kv_page_cost_seconds() const { return 0.0; }
  // Pages of the host tier (0: no hierarchy).
  virtual int64_t host_tier_pages() const { return 0; }
  virtual bool make_room(int64_t n) { return pages().n_free() >= n; }
  virtual int64_t reclaimable_pages() const { return 0; }
  // preemption by swap: every page of the table to the host tier, to resume without recompute
  // (false, changing nothing: no room there, or no hierarchy); the pages swap_in takes back, and
  // swap_in itself (false, changing nothing, when the pool has no room).
  virtual bool swap_out(PageTable&) { return false; }
  virtual int64_t swap_in_pages(const PageTable&) const { return 0; }
  virtual bool swap_in(PageTable&) { return true; }
  // Pages read by sparse decode steps since the last call, then reset.
  virtual PageCounts take_page_counts() = 0;
  // The policy of the following decode steps (prefill stays dense). Scoring policies
  // need page summaries, kept when the runner was built with a sparse policy.
  virtual void set_policy(const PolicySpec& spec) = 0;
  // The policy set last (the engine's; requests may carry their own, StepRequest::policy).
  virtual const PolicySpec& policy() const = 0;
  // Fits and installs the projected sketch's key basis from the first n_tokens keys of `table`
  // (Engine::calibrate_key_basis); returns the mean variance fraction kept.
  // query_aware: from the queries recorded since capture_queries(true) too (fit_qk_basis).
  virtual double fit_key_basis(const PageTable& table, int64_t n_tokens, int rank, bool query_aware) = 0;
  // Records every layer's RoPE'd query rows of the following steps (on) or drops them (off).
  virtual void capture_queries(bool on) = 0;
};

// The page data the CUDA backend keeps for scoring (CudaModelOptions::summaries / key_sketch):
// none when loaded dense; when sparse, what `estimator` reads (sketch4: the key sketch; minmax:
// MinMax summaries; meanspread and gaussian: mean / variance summaries), or everything when
// keep_all_estimators (eval compares estimators on one prefill). Each kind costs HBM and a kernel
// per layer and step.
struct GpuPageData {
  std::string summaries = "none";  // none | minmax | meanspread | both
  bool key_sketch = false;
};
GpuPageData gpu_page_data(const EngineOptions& o);

// A step's model output rows — one per request, every row of a verify request, in batch order —
// into `out`: verify_logits and verify_row, and (last_rows) each request's last row as logits.
void split_output_rows(const std::vector<StepRequest>& batch, const std::vector<float>& rows, int64_t vocab,
                       bool last_rows, StepOutput* out);

std::unique_ptr<StepRunner> make_cpu_runner(const WeightSource& src, const EngineOptions& o, int64_t max_ctx);
// Throws dhs::Error when this build has no CUDA backend or no GPU is present.
std::unique_ptr<StepRunner> make_cuda_runner(const WeightSource& src, const EngineOptions& o, int64_t max_ctx);

}  // namespace dhs
