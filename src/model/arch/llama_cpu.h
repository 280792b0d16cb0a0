// The Llama family (Llama 2/3.x, SmolLM2, Mistral, Qwen2/2.5 with QKV bias,
// Qwen3 with q/k RMSNorm) on the CPU backend: weights dequantized at load,
// forward written as a straight line of backend ops over head-paged KV.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/cpu_matrix.h"
#include "kv/page_pool.h"
#include "kv/tiered_kv.h"
#include "kv/page_table.h"
#include "model/weight_source.h"
#include "sparse/page_summary.h"
#include "sparse/policy.h"
#include "sparse/reselect_schedule.h"

namespace dhs {

class LlamaCpu {
 public:
  using Progress = std::function<void(int64_t done, int64_t total)>;
  // Dumps named intermediates ("attn_norm", layer) for golden comparisons.
  // data: [n_tok, n] row-major for the whole batch.
  using DebugHook = std::function<void(const std::string& name, int layer, const float* data, int64_t n_tok, int64_t n)>;

  // Throws dhs::Error when a required tensor is missing or has the wrong shape/type.
  // fp8_projections: every projection matrix (not the embeddings or the output head) rounded at
  // load to FP8 E4M3 with one scale per output row and stored as the values that makes
  // (model/packed_weight.h: quantize_fp8_rows, unpack_row) — the CPU statement of the CUDA
  // backend's `--quantization fp8`, so its greedy tokens have an oracle.
  LlamaCpu(const WeightSource& src, CpuWeightType weight_type, const Progress& progress = {},
           bool fp8_projections = false);

  const ModelConfig& config() const { return cfg_; }
  size_t weight_bytes() const;
  void set_debug_hook(DebugHook hook) { debug_ = std::move(hook); }
  // Sparse decode: page summaries kept up to date at every append (when a store is
  // given) and the policy choosing each layer's page lists (nullptr: dense), run by each
  // layer every `reselect_every` decode steps (sparse/reselect_schedule.h).
  // A decode step whose requests are all shorter than dense_below tokens, or hold fewer than
  // min_step_tokens in all, reads every page and runs no selection (PolicySpec::dense_below,
  // min_step_tokens; as the CUDA backend, so that the reselect schedules agree: such a step
  // invalidates the stored selections).
  void set_sparsity(const SelectionPolicy* policy, PageSummaryStore* summaries, int reselect_every = 1,
                    int64_t min_step_tokens = 0, int64_t dense_below = 0) {
    policy_ = policy;
    summaries_ = summaries;
    min_step_tokens_ = min_step_tokens;
    dense_below_ = dense_below;
    schedule_ = ReselectSchedule(reselect_every);
    selected_.assign(static_cast<size_t>(cfg_.n_layers), PageLists{});
  }

  // The KV hierarchy (kv/tiered_kv.h), or null: before each layer's attention the pages its lists
  // name are made resident in the device tier (the pool forward() reads and appends to) and the
  // lists point at them; after it they are unpinned.
  // Its clock counts layers: step s, layer l is s * n_layers + l. A page's last use then orders
  // the layers a step goes through, so eviction takes pages of layers this step has passed (and
  // did not select) before pages of layers still to come, which the step may read in a moment:
  // least recently used is then also the page needed last, layer-wise.
  // schedule Ahead (the GPU's; docs/hierarchy.md "Recall ahead") moves nothing inside a step
  // instead: each layer reads its pages where they live — attention over the resident ones and
  // over the late ones (host tier) apart, merged by their log-sum-exps (merge_normalized) — and
  // after a decode-like step (or a mixed step's decode rows) the pages it read that live in the host
  // tier are recalled for the next step (TieredKv::recall_ahead: the prediction of a step's reads is the step before's).
  enum class RecallSchedule { Layer, Ahead };
  void set_tiers(TieredKv* kv, RecallSchedule schedule = RecallSchedule::Layer) {
    tiers_ = kv;
    recall_ = schedule;
  }
  // Landing (kv/tier_land.h, TieredKv::reserve_landing) on the Ahead schedule: the next decode
  // step's late pages land in these device slots as far as they go (copied from the host tier,
  // read from the device pool) and are adopted after it; any step takes the stack, and frees
  // what it does not use.
  void set_landing_slots(std::vector<int32_t> slots) { land_next_ = std::move(slots); }
  // The clock between steps (the next step's start).
  int64_t tier_clock() const { return (tier_step_ + 1) * cfg_.n_layers; }

  struct Seq {
    PageTable* table = nullptr;      // KV of this request; capacity reserved for the new tokens
    const int32_t* tokens = nullptr; // [n_new] appended at positions table->n_tokens() ...
    int64_t n_new = 0;
    // Its own policy at sparse decode steps (PolicySpec::as_request_policy checked it against
    // the engine's); null: set_sparsity's.
    const SelectionPolicy* policy = nullptr;
    // Speculative verification: the rows are this request's next n_new decode steps (the token
    // after the last committed one, then the draft's tokens). Each row reads the pages its own
    // decode step would read: its own selection on a selecting step, over page data up to its
    // own position (rows are appended and selected in stages), so each row's logits equal
    // decoding the tokens one at a time. Needs reselect_every 1.
    bool verify = false;
    // Its draft seeds (sparse/draft_seeds.h), or null: a scoring step records its heaviest pages
    // there, a seeded draft step reads them.
    DraftSeeds* seeds = nullptr;
  };
  // Runs the new tokens of every sequence through the model, appends their K/V
  // and commits them to each table. logits: per sequence in order, its last row's
  // logits, or every row's for a verify sequence or when all_logits ([rows, vocab]);
  // null: no output head.
  void forward(const std::vector<Seq>& batch, PagePool& pool, std::vector<float>* logits,
               bool all_logits = false);

 private:
  struct Layer {
    std::vector<float> attn_norm, ffn_norm;        // [hidden]
    std::vector<float> bq, bk, bv;                 // [n_heads * head_dim] (Qwen2) or empty
    std::vector<float> q_norm, k_norm;             // [head_dim] (Qwen3) or empty
    CpuMatrix wq, wk, wv, wo;                      // [out, in]
    CpuMatrix w_gate, w_up, w_down;
  };
  void dump(const char* name, int layer, const float* data, int64_t n_tok, int64_t n) const {
    if (debug_) debug_(name, layer, data, n_tok, n);
  }
  // The final norm and the output matrix over the rows forward() returns logits for.
  void output_head(const std::vector<Seq>& batch, const std::vector<int32_t>& q_indptr, const std::vector<float>& x,
                   bool all_logits, std::vector<float>* logits) const;
  // A step with verify sequences: one attention request per prefill chunk or decode row, and
  // one per row of a verify sequence (its own position and pages).
  struct AttnReq {
    size_t seq;         // index in the batch
    int64_t first_row;  // its first row among the step's tokens
    int stage;          // the verify row's index (0 for the others): appended and selected in this order
    bool selects;       // runs a policy (else every page up to its position)
  };
  std::vector<AttnReq> plan_verify_step(const std::vector<Seq>& batch, const std::vector<int32_t>& q_indptr,
                                        std::vector<int32_t>* a_indptr, std::vector<int32_t>* a_seq_len,
                                        std::vector<const PageTable*>* a_tables) const;
  // One layer's appends of page data and lists of such a step, stage by stage.
  // A selecting step's lists of one layer counted per (layer, KV head) in stats_.read / total.
  // (counted[r]: whether request r's reads count — a mixed step's prompt chunks do not)
  void count_lists(const PageLists& lists, int layer, const std::vector<int32_t>& seq_len, int page_size,
                   const std::vector<uint8_t>& counted);
  PageLists verify_step_lists(const std::vector<Seq>& batch, const std::vector<AttnReq>& areq, int layer,
                              const std::vector<int32_t>& a_indptr, const std::vector<int32_t>& a_seq_len,
                              const std::vector<const PageTable*>& a_tables, const float* q, const float* k,
                              const std::vector<int32_t>& pos, float scale);

  ModelConfig cfg_;
  CpuMatrix tok_embd_;   // [vocab, hidden]
  CpuMatrix output_;     // [vocab, hidden]; empty when tied to tok_embd_
  std::vector<float> output_norm_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
  DebugHook debug_;
  const SelectionPolicy* policy_ = nullptr;
  DensePolicy dense_;  // the lists of rows that read every page, in a step whose others select
  ReselectSchedule schedule_;
  std::vector<PageLists> selected_;  // [n_layers] each layer's last selection (reselect_every > 1)
 public:
  // Pages the policy selected vs all pages, summed over decode steps, layers and heads.
  struct SparsityStats {
    int64_t pages_read = 0;
    int64_t pages_total = 0;
    // The same on selecting steps, per (layer, KV head): [n_layers * n_heads_kv] (the eval's
    // budget trace; the CUDA backend's PageSelector counts the same way).
    std::vector<uint64_t> read, total;
  };
  const SparsityStats& sparsity_stats() const { return stats_; }
  void reset_sparsity_stats() { stats_ = {}; }

 private:
  SparsityStats stats_;
  TieredKv* tiers_ = nullptr;
  RecallSchedule recall_ = RecallSchedule::Layer;
  std::vector<int32_t> land_next_;  // the next step's landing stack
  int64_t tier_step_ = 0;
  int64_t min_step_tokens_ = 0;
  int64_t dense_below_ = 0;
  PageSummaryStore* summaries_ = nullptr;
};

}  // namespace dhs
