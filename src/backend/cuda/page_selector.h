// The owner of sparse decode's selection on the GPU (DESIGN.md §1.1): the policy's rule as
// the select kernels take it, their workspace, the lists they write, each layer's stored
// selection for --reselect-every (sparse/reselect_schedule.h), the schedule, and the
// pages-read statistics. The model asks it once per step which layers run the policy
// (begin_step) and once per layer which lists attention reads (select); select only
// launches kernels, so a decode step with it is captured in one CUDA graph.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/device_key_sketch.h"
#include "backend/cuda/device_page_summary.h"
#include "backend/cuda/draft_seeds.h"
#include "backend/cuda/page_select.h"
#include "backend/cuda/reuse_lists.h"
#include "backend/cuda/window_lists.h"
#include "sparse/policy.h"
#include "sparse/reselect_schedule.h"

namespace dhs::cuda {

// One layer's CSR page lists on the device, as attention reads them.
struct LayerLists {
  const int32_t* indptr = nullptr;    // [n_requests * n_heads_kv + 1]
  const int32_t* slots = nullptr;     // [nnz]
  const int32_t* page_pos = nullptr;  // [nnz]
};

// Pages in the lists sparse decode read since the last reset, per (layer, KV head).
struct SparsityStats {
  std::vector<uint64_t> read, total;  // [n_layers * n_heads_kv]
  double read_frac() const;            // all layers and heads; 1 when nothing was counted
};

// What a step selects: begin_step's answer, the key of the step's graph with the batch size.
struct SelectPlan {
  bool runs_policy = false;             // scores and selects (a decode step under a sparse policy)
  int phase = ReselectSchedule::kFull;  // the layers that select at this step (kFull: all)
  bool per_request = false;             // some request has its own rule (PageSelectParams::row_rules)
  // Every request reads a fixed window (sink + recent pages, or all pages): the lists come from
  // the page table directly (window_lists.h), no score or select kernel, no dense lists.
  bool window_only = false;
  int max_q = 1;  // query rows of the longest request (the score kernel's form: PageSelectParams::q_vecs)
};

class PageSelector {
 public:
  struct Sizes {
    int n_layers = 0;
    int n_heads_q = 0;
    int n_heads_kv = 0;
    int head_dim = 0;
    int page_size = 16;
    int max_batch = 0;
    int64_t max_pages_per_seq = 0;  // pages of one (request, layer, KV head) list
    int max_q_len = 1;              // query rows of one request (speculative verification: 1 + drafts)
  };
  // What the kernels read: the page data kept on append (null where not kept: then no
  // scoring policy can run and nothing is allocated), and the step's buffers, whose fixed
  // addresses the captured graphs keep reading.
  struct Inputs {
    const DevicePageSummaries* minmax = nullptr;
    const DevicePageSummaries* meanspread = nullptr;  // (gaussian reads these too)
    const DeviceKeySketch* sketch = nullptr;
    LayerLists dense;                   // the current layer's every page, ascending page_pos
    const int32_t* seq_len = nullptr;   // [max_batch] tokens in KV, this step's included
    const __half* q = nullptr;   // [max_batch, n_heads_q, head_dim] rotated queries of a decode step
    const int32_t* q_indptr = nullptr;  // [max_batch + 1]
    const int32_t* table = nullptr;     // the device page table (device_page_table.h), for window lists
    const int32_t* req_slot = nullptr;  // [max_batch] each request's row of it
  };
  // A request of the step; decode steps add one token to each.
  struct Request {
    const void* id = nullptr;  // what identifies its sequence between steps (its page table)
    int req_slot = 0;          // its row of the device page table
    int64_t n_before = 0;      // tokens in KV before the step
    int64_t n_new = 1;         // tokens the step adds (a verify: its rows)
    // Its own policy (PolicySpec::as_request_policy checked it against set_policy's); null:
    // set_policy's.
    const PolicySpec* policy = nullptr;
    uint64_t table_id = 0;  // its table's PageTable::id() (whose seeds a req_slot row holds)
  };

  PageSelector(const Sizes& sizes, const Inputs& in);
  ~PageSelector();
  PageSelector(const PageSelector&) = delete;
  PageSelector& operator=(const PageSelector&) = delete;

  // The policy of every following decode step (prefill stays dense). Validated as the CPU
  // factory validates it. budget_frac (topk only, optional): per (layer, KV head) fraction of
  // each list's pages, [n_layers * n_heads_kv]. Throws dhs::Error on what the device lacks.
  void set_policy(const PolicySpec& spec, const std::vector<float>& budget_frac = {});

  // Start of a step: whether it runs the policy (a decode step under a sparse policy, unless
  // every request is shorter than --dense-below or they hold fewer than --sparse-min-tokens:
  // then it is counted as a dense step) and which layers select (the reselect schedule).
  // Requests with their own policy have their rules uploaded on `stream` for this step's select
  // launches (the graph reads them from a fixed buffer: one graph per bucket for any mix). The
  // pinned staging buffer is rewritten here with no wait: it relies on the model waiting for the
  // stream once per step (LlamaCuda::forward), so no copy of the previous step is pending.
  SelectPlan begin_step(const std::vector<Request>& batch, bool decode, cudaStream_t stream);
  // The next step selects at every layer.
  void restart_schedule() { schedule_.invalidate(); }
  // Whether window-only steps take window_lists.h's kernel (default) or the select kernel's
  // SinkWindow rule (the same lists: the tests compare them).
  void set_window_lists(bool on) { window_lists_ = on; }
  // Whether the policy set last selects (not dense).
  bool sparse() const { return sparse_; }
  // Verification-seeded drafts (draft_seeds.h; the CPU statement sparse/draft_seeds.h): from now
  // on every scoring step records each scored request's m heaviest selected pages per (layer, KV
  // head), which its seeded drafts (sinkwindow:K+M) read: in window-only steps through
  // window_lists.h, in steps where other requests score (and under --reselect-every > 1) through
  // the select kernel's SinkWindow rule, which takes the same seeds. The largest m asked stays
  // (<= kMaxSeedPages).
  void keep_seeds(int m);
  int seed_cap() const { return seed_cap_; }
  // The runner's rollback (n_tokens: the table's tokens after it) or release (0) of a table: its
  // seeds recorded at a step that started at or past n_tokens are stale (the CPU's rule).
  void forget_seeds(uint64_t table_id, int64_t n_tokens);
  // Whether scoring steps record seeds while a store is kept (default on; the bench times plain
  // decoding with it off: a step that records is another graph).
  void set_seed_recording(bool on) { seed_recording_ = on; }
  // The seed record kernels run on a side stream, off the step's critical path (nothing reads
  // the seeds before the next draft step); the model calls join before anything rewrites what
  // they read (the next layer's dense lists and selection) and at the end of the step.
  void join(cudaStream_t stream) const;

  // Requests selected from another set of requests' scores (PageSelectParams::score_req): a
  // verify's rows, each its own request of one query row, scored as their sequence, once. The
  // scored requests' dense lists of this layer, tokens and query rows (into Inputs' q), and per
  // selecting request its scored request and first q vector.
  struct ScoreFrom {
    LayerLists dense;
    const int32_t* seq_len = nullptr;   // [n_scored]
    const int32_t* q_indptr = nullptr;  // [n_scored + 1]
    int n_scored = 0;
    const int32_t* req = nullptr;       // [n_req]
    const int32_t* vec0 = nullptr;      // [n_req]
    int max_q = 1;                      // query rows of the longest scored request
  };

  // Launches on `stream` what `layer` needs at this step and returns the lists its attention
  // reads: the dense lists (no policy this step), the layer's last selection grown by the pages
  // written since (a reselect step where the layer does not select), or this step's selection.
  // q / q_indptr (optional): the queries to score instead of Inputs' (a verify step scoring one
  // row per request: [n_req, n_heads_q, head_dim] with q_indptr 0, 1, .., n_req). from
  // (optional, not with q): the scores are those of from's requests (their q vectors fit
  // Sizes::max_q_len rows).
  LayerLists select(int layer, int n_req, const SelectPlan& plan, cudaStream_t stream, const __half* q = nullptr,
                    const int32_t* q_indptr = nullptr, const ScoreFrom* from = nullptr) const;

  // Everything a graph captured with `plan` baked in (the rule's parameters, the phase).
  std::string graph_key(const SelectPlan& plan) const;
  // The plans a timed replay of `last`'s batch cycles through: one per phase under a reselect
  // schedule (each phase selects at other layers), else `last`.
  std::vector<SelectPlan> replay_cycle(const SelectPlan& last) const;

  SparsityStats stats() const;
  // Decode steps since reset_stats() that a sparse policy ran as the dense step (below
  // --dense-below or --sparse-min-tokens: no scoring or selection kernels ran).
  int64_t threshold_dense_steps() const { return threshold_dense_steps_; }
  void reset_stats();

 private:
  PageSelectParams rule_params(const PolicySpec& spec, const std::vector<float>& budget_frac) const;
  // A request's rule as the select kernel takes it.
  static RowRule row_rule(const PolicySpec& spec);
  void allocate_stored_lists();
  void* alloc(size_t bytes);

  Sizes sz_;
  Inputs in_;
  std::vector<void*> allocs_;
  std::unique_ptr<PageSelectWorkspace> ws_;  // null: the model keeps no page data to score

  // The policy.
  bool sparse_ = false;
  int64_t dense_below_ = 0;
  int64_t min_step_tokens_ = 0;
  std::string policy_key_ = "dense";
  PageSelectParams select_;  // built by set_policy; per launch: the layer's slices and n_requests
  ReuseListsParams reuse_;   // built at construction; likewise
  WindowListsParams window_; // built at construction (the rule's n_sink / n_recent by set_policy); likewise

  // Device buffers (allocated with the workspace).
  float* budget_frac_d_ = nullptr;              // [n_layers, n_heads_kv] or unused
  RowRule* row_rules_d_ = nullptr;              // [max_batch] this step's per-request rules
  RowRule* row_rules_h_ = nullptr;              // (pinned staging of the same)
  PolicySpec spec_;                             // set_policy's
  unsigned long long* stats_d_ = nullptr;       // [n_layers, n_heads_kv, 2] (read, total)
  int32_t *sel_indptr_d_ = nullptr, *sel_slots_d_ = nullptr, *sel_page_pos_d_ = nullptr;  // selected lists
  // --reselect-every R > 1: each layer's last selection, read (grown by the pages written since)
  // at the steps where the layer does not select. Allocated at the first such policy.
  int32_t* st_indptr_d_ = nullptr;    // [n_layers, max_batch * n_heads_kv + 1]
  int32_t* st_slots_d_ = nullptr;     // [n_layers, max_nnz]
  int32_t* st_page_pos_d_ = nullptr;  // [n_layers, max_nnz]
  int32_t* st_seq_len_d_ = nullptr;   // [n_layers, max_batch] tokens at each layer's last selection

  // The schedule.
  ReselectSchedule schedule_;
  std::vector<int> last_req_slots_;  // the last step's request rows

  // Draft seeds (keep_seeds): the store, the select kernel's masses, and per store row the table
  // whose seeds it holds and the tokens before the step that recorded them (a later step of that
  // table at or below that count was rolled back past it: the seeds are stale).
  int seed_cap_ = 0;
  int32_t* seeds_d_ = nullptr;  // [max_batch, n_layers, n_heads_kv, seed_cap]
  float* mass_d_ = nullptr;     // [max_nnz]
  std::vector<uint64_t> seed_table_;
  std::vector<int64_t> seed_first_pos_;
  bool record_seeds_ = false;   // this step's scoring launches record (set by begin_step)
  bool seed_recording_ = true;  // set_seed_recording
  cudaStream_t side_ = nullptr;             // (created with the store)
  cudaEvent_t selected_ = nullptr, recorded_ = nullptr;
  mutable bool record_pending_ = false;     // a record kernel not yet joined

  // Statistics kept on the host.
  // Pages of the steps that went dense under a sparse policy, added to every (layer, KV head)'s
  // (read, total) in stats(): they read every page.
  uint64_t dense_step_pages_ = 0;
  bool window_lists_ = true;
  int64_t threshold_dense_steps_ = 0;
};

}  // namespace dhs::cuda
