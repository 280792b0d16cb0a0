// PageSelector (page_selector.h): the policy's rule for the select kernels, the schedule of
// --reselect-every, and the launches that give each layer's attention its lists.
#include "backend/cuda/page_selector.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/page_select_rule.h"
#include "core/error.h"

namespace dhs::cuda {

double SparsityStats::read_frac() const {
  uint64_t r = 0, t = 0;
  for (size_t i = 0; i < read.size(); ++i) {
    r += read[i];
    t += total[i];
  }
  return t > 0 ? static_cast<double>(r) / static_cast<double>(t) : 1.0;
}

void* PageSelector::alloc(size_t bytes) {
  void* p = nullptr;
  DHS_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
  allocs_.push_back(p);
  return p;
}

PageSelector::PageSelector(const Sizes& s, const Inputs& in) : sz_(s), in_(in) {
  const int64_t L = s.n_layers, Hkv = s.n_heads_kv, n_lists = int64_t{s.max_batch} * Hkv;
  // (Without page data only window rules run: sink + recent lists, e.g. speculative drafts.)
  if (in.minmax != nullptr || in.meanspread != nullptr || in.sketch != nullptr)
    ws_ = std::make_unique<PageSelectWorkspace>(static_cast<int>(n_lists), n_lists * s.max_pages_per_seq,
                                                s.n_heads_q / s.n_heads_kv * s.max_q_len);
  auto ints = [&](int64_t n) { return static_cast<int32_t*>(alloc(static_cast<size_t>(n) * 4)); };
  sel_indptr_d_ = ints(n_lists + 1);
  sel_slots_d_ = ints(n_lists * s.max_pages_per_seq);
  sel_page_pos_d_ = ints(n_lists * s.max_pages_per_seq);
  budget_frac_d_ = static_cast<float*>(alloc(static_cast<size_t>(L * Hkv) * 4));
  row_rules_d_ = static_cast<RowRule*>(alloc(static_cast<size_t>(s.max_batch) * sizeof(RowRule)));
  DHS_CUDA_CHECK(cudaMallocHost(&row_rules_h_, static_cast<size_t>(s.max_batch) * sizeof(RowRule)));
  stats_d_ = static_cast<unsigned long long*>(alloc(static_cast<size_t>(L * Hkv * 2) * 8));
  DHS_CUDA_CHECK(cudaMemset(stats_d_, 0, static_cast<size_t>(L * Hkv * 2) * 8));
  // A reused selection is written where every layer's fresh one is (per launch: the layer's
  // stored lists and stats).
  reuse_ = {.dense_indptr = in.dense.indptr, .dense_slots = in.dense.slots, .seq_len = in.seq_len,
            .indptr = sel_indptr_d_, .slots = sel_slots_d_, .page_pos = sel_page_pos_d_,
            .n_heads_kv = s.n_heads_kv, .page_size = s.page_size};
  window_ = {.table = in.table, .req_slot = in.req_slot, .seq_len = in.seq_len, .indptr = sel_indptr_d_,
             .slots = sel_slots_d_, .page_pos = sel_page_pos_d_, .n_layers = s.n_layers, .n_heads_kv = s.n_heads_kv,
             .max_pages = s.max_pages_per_seq, .page_size = s.page_size};
}

PageSelector::~PageSelector() {
  if (selected_) cudaEventDestroy(selected_);
  if (recorded_) cudaEventDestroy(recorded_);
  if (side_) cudaStreamDestroy(side_);
  for (void* p : allocs_) cudaFree(p);
  if (row_rules_h_) cudaFreeHost(row_rules_h_);
}

void PageSelector::allocate_stored_lists() {
  // Once: every layer's selection kept for the steps that reuse it.
  const int64_t B = sz_.max_batch, L = sz_.n_layers, n_lists = B * sz_.n_heads_kv, nnz = ws_->max_nnz();
  st_indptr_d_ = static_cast<int32_t*>(alloc(static_cast<size_t>(L * (n_lists + 1)) * 4));
  st_slots_d_ = static_cast<int32_t*>(alloc(static_cast<size_t>(L * nnz) * 4));
  st_page_pos_d_ = static_cast<int32_t*>(alloc(static_cast<size_t>(L * nnz) * 4));
  st_seq_len_d_ = static_cast<int32_t*>(alloc(static_cast<size_t>(L * B) * 4));
}

void PageSelector::keep_seeds(int m) {
  DHS_CHECK(m >= 0 && m <= kMaxSeedPages, "draft seed pages: {} (the CUDA backend keeps at most {})", m, kMaxSeedPages);
  if (m <= seed_cap_ || ws_ == nullptr) return;  // (no page data: nothing is ever scored, drafts read windows)
  const int64_t B = sz_.max_batch, L = sz_.n_layers, Hkv = sz_.n_heads_kv;
  seeds_d_ = static_cast<int32_t*>(alloc(static_cast<size_t>(B * L * Hkv * m) * 4));
  DHS_CUDA_CHECK(cudaMemset(seeds_d_, 0xFF, static_cast<size_t>(B * L * Hkv * m) * 4));  // -1: none
  if (mass_d_ == nullptr) mass_d_ = static_cast<float*>(alloc(static_cast<size_t>(ws_->max_nnz()) * 4));
  if (side_ == nullptr) {
    DHS_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    DHS_CUDA_CHECK(cudaEventCreateWithFlags(&selected_, cudaEventDisableTiming));
    DHS_CUDA_CHECK(cudaEventCreateWithFlags(&recorded_, cudaEventDisableTiming));
  }
  seed_cap_ = m;  // (in every graph key: graphs captured before read the old store)
  seed_table_.assign(static_cast<size_t>(B), 0);
  seed_first_pos_.assign(static_cast<size_t>(B), -1);
}

void PageSelector::set_policy(const PolicySpec& spec, const std::vector<float>& budget_frac) {
  {
    PolicySpec check = spec;  // the CPU factory's validation: one set of rules for both backends
    if (!budget_frac.empty() && check.budget == 0) check.budget = 1;  // per-head budgets stand in for --budget
    (void)make_policy(check);
  }
  // Everything a captured step bakes in (the select kernels' parameters) is in the key.
  policy_key_ = fmt::format("{} budget_frac={}", spec.key(), budget_frac.empty() ? 0 : 1);
  spec_ = spec;
  sparse_ = !spec.dense();
  dense_below_ = spec.dense_below;
  min_step_tokens_ = spec.min_step_tokens;
  schedule_ = ReselectSchedule(sparse_ ? spec.reselect_every : 1);
  window_.dense_below = 0;  // (a dense engine's window steps: its requests' own rules, no threshold)
  if (!sparse_) return;
  // A window rule reads no page data: window_lists.h builds its lists (every step, not reselected).
  const bool window_rule = spec.rule == dhs::SelectRule::SinkWindow && spec.reselect_every == 1 && window_lists_;
  DHS_CHECK(ws_ != nullptr || window_rule, "--sparse-policy {}: the CUDA model was built without page summaries",
            spec.str());
  if (spec.reselect_every > 1 && st_indptr_d_ == nullptr) allocate_stored_lists();
  if (ws_ != nullptr) {
    select_ = rule_params(spec, budget_frac);
  } else {
    select_ = PageSelectParams{};
    (void)set_rule(spec, &select_);
  }
  window_.n_sink = select_.n_sink;
  window_.n_recent = select_.n_recent;
  window_.dense_below = select_.dense_below;
}

// The select kernels' parameters for `spec`: the rule (page_select_rule.h), and every buffer
// whose address is fixed.
PageSelectParams PageSelector::rule_params(const PolicySpec& spec, const std::vector<float>& budget_frac) const {
  PageSelectParams p;
  const RulePageData data = set_rule(spec, &p);
  const DevicePageSummaries* store = data.kind == SummaryKind::MinMax ? in_.minmax : in_.meanspread;
  DHS_CHECK(!data.scores || (data.sketch ? in_.sketch != nullptr : store != nullptr),
            "--sparse-policy {}: estimator {} needs summaries the CUDA model does not keep", spec.str(), spec.estimator);
  if (data.sketch) {
    p.sketch_codes = in_.sketch->codes_d();
    p.sketch_steps = in_.sketch->steps_d();
  }
  if (!budget_frac.empty()) {
    const int64_t L = sz_.n_layers, Hkv = sz_.n_heads_kv;
    DHS_CHECK(spec.rule == dhs::SelectRule::TopK, "per-head budget fractions go with --sparse-policy topk");
    DHS_CHECK(static_cast<int64_t>(budget_frac.size()) == L * Hkv, "budget fractions: {} values for {} layers x {} KV heads",
              budget_frac.size(), L, Hkv);
    DHS_CUDA_CHECK(cudaMemcpy(budget_frac_d_, budget_frac.data(), budget_frac.size() * 4, cudaMemcpyHostToDevice));
    p.budget_frac = budget_frac_d_;  // (per launch: the layer's row)
  }
  // The step's buffers (fixed addresses).
  p.dense_indptr = in_.dense.indptr;
  p.dense_slots = in_.dense.slots;
  p.dense_page_pos = in_.dense.page_pos;
  p.seq_len = in_.seq_len;
  p.q = in_.q;
  p.q_indptr = in_.q_indptr;
  // (SinkWindow scores nothing: its summaries, kept or not, are never read.)
  if (!p.sketch_codes && store != nullptr) p.summaries = store->data_d();
  p.indptr = sel_indptr_d_;  // (per launch under a reselect schedule: the layer's stored lists)
  p.slots = sel_slots_d_;
  p.page_pos = sel_page_pos_d_;
  p.n_heads_q = sz_.n_heads_q;
  p.n_heads_kv = sz_.n_heads_kv;
  p.head_dim = sz_.head_dim;
  p.page_size = sz_.page_size;
  p.scale = 1.0f / std::sqrt(static_cast<float>(sz_.head_dim));
  ws_->bind(&p);
  return p;
}

RowRule PageSelector::row_rule(const PolicySpec& spec) {
  RowRule r;
  if (spec.dense()) {
    r.all_pages = 1;
    return r;
  }
  PageSelectParams p;
  (void)set_rule(spec, &p);
  DHS_CHECK(!p.share_heads, "a request's own policy cannot be solohead");
  r.rule = p.rule;
  r.gamma = p.gamma;
  r.budget = p.budget;
  r.frac = p.frac;
  r.n_sink = p.n_sink;
  r.n_recent = p.n_recent;
  return r;
}

SelectPlan PageSelector::begin_step(const std::vector<Request>& batch, bool decode, cudaStream_t stream) {
  SelectPlan plan;
  std::vector<int> req_slots;
  for (const Request& r : batch) req_slots.push_back(r.req_slot);
  for (const Request& r : batch) plan.max_q = std::max(plan.max_q, static_cast<int>(r.n_new));
  // --dense-below N: a step whose requests are all shorter than N tokens (this step's token
  // included) runs the dense step, and so does one whose requests hold fewer than
  // --sparse-min-tokens in all: the selection would cost more than it saves there
  // (docs/benchmarks.md). A batch that mixes short and long requests selects, and the select
  // kernel gives the short ones their dense lists.
  bool own = false;  // some request has its own rule
  for (const Request& r : batch) own = own || (r.policy && !(*r.policy == spec_));
  // Seeded drafts take their seeds through the per-request rules.
  bool seeded = false;
  for (const Request& r : batch) seeded = seeded || (seed_cap_ > 0 && (r.policy ? *r.policy : spec_).seed_pages > 0);
  plan.runs_policy = decode && (sparse_ || own);
  if (plan.runs_policy && sparse_ && (dense_below_ > 0 || min_step_tokens_ > 0)) {
    // One length per sequence: a per-row verify's rows (consecutive requests of one table) count once.
    std::vector<int64_t> seq_len;
    const void* prev = nullptr;
    for (const Request& r : batch) {
      if (r.id != nullptr && r.id == prev) seq_len.back() = std::max(seq_len.back(), r.n_before + r.n_new);
      else seq_len.push_back(r.n_before + r.n_new);
      prev = r.id;
    }
    if (!step_runs_policy(seq_len, dense_below_, min_step_tokens_)) {
      plan.runs_policy = false;
      ++threshold_dense_steps_;
      for (int64_t n : seq_len) dense_step_pages_ += static_cast<uint64_t>((n + sz_.page_size - 1) / sz_.page_size);
    }
  }
  // Which layers run the policy (sparse/reselect_schedule.h): the stored selections serve only
  // the same requests in the same rows, continued by one token.
  if (plan.runs_policy) {
    std::vector<const void*> ids;
    std::vector<int64_t> n_before;
    for (const Request& r : batch) {
      ids.push_back(r.id);
      n_before.push_back(r.n_before);
    }
    if (req_slots != last_req_slots_) schedule_.invalidate();
    plan.phase = schedule_.begin_step(ids, n_before);
    // Requests with their own rule: every row's rule goes to the select kernel (the engine's
    // for the others; rows past the batch are padding with no pages).
    plan.per_request = own || seeded;
    if (plan.per_request) {
      // (Per-head budget fractions are the bench's, never with requests' own rules.)
      DHS_CHECK(select_.budget_frac == nullptr, "per-request policies with per-head budget fractions");
      DHS_CHECK(static_cast<int>(batch.size()) <= sz_.max_batch, "a step of {} requests (max {})", batch.size(), sz_.max_batch);
      for (size_t i = 0; i < batch.size(); ++i) {
        const Request& r = batch[i];
        const PolicySpec& spec = r.policy ? *r.policy : spec_;
        row_rules_h_[i] = row_rule(spec);
        // A seeded draft's seeds, when its row of the store holds this table's, recorded before
        // the tokens it now has (a rollback to or past the recording step makes them stale).
        const size_t slot = static_cast<size_t>(r.req_slot);
        if (spec.seed_pages > 0 && seed_cap_ > 0 && seed_table_[slot] == r.table_id && r.n_before > seed_first_pos_[slot])
          row_rules_h_[i].n_seeds = std::min(spec.seed_pages, seed_cap_);
      }
      for (int i = static_cast<int>(batch.size()); i < sz_.max_batch; ++i) row_rules_h_[i] = RowRule{1};
      DHS_CUDA_CHECK(cudaMemcpyAsync(row_rules_d_, row_rules_h_, static_cast<size_t>(sz_.max_batch) * sizeof(RowRule),
                                     cudaMemcpyHostToDevice, stream));
    }
    // A step of fixed windows only (speculative drafts, or the sinkwindow policy).
    if (window_lists_ && schedule_.every() == 1) {
      const auto window = [](const PolicySpec& p) { return p.dense() || p.rule == dhs::SelectRule::SinkWindow; };
      plan.window_only = spec_.rule == dhs::SelectRule::SinkWindow && !plan.per_request;
      if (plan.per_request) {
        plan.window_only = true;
        for (const Request& r : batch) plan.window_only = plan.window_only && window(r.policy ? *r.policy : spec_);
      }
    }
    DHS_CHECK(plan.window_only || ws_ != nullptr,
              "a request's own scoring policy on a CUDA model built without page summaries (dense engine)");
    // This step's scoring records seeds: which rows of the store now hold whose (the kernel
    // skips the same lists: those not cut by mass).
    // (SoloHead shares one set over the heads and records nothing, as on the CPU.)
    record_seeds_ = seed_cap_ > 0 && seed_recording_ && !plan.window_only && spec_.rule != dhs::SelectRule::SoloHead;
    if (record_seeds_) {
      for (size_t i = 0; i < batch.size(); ++i) {
        const Request& r = batch[i];
        const PolicySpec& spec = r.policy ? *r.policy : spec_;
        // The lists the select kernel cuts by mass (the record kernel skips the others).
        const int64_t seq = r.n_before + r.n_new, n = (seq + sz_.page_size - 1) / sz_.page_size;
        bool cut = spec.scores() && !(spec.rule == dhs::SelectRule::Coverage && spec.gamma >= 1.0) &&
                   seq >= spec_.dense_below && n > 0;
        if (cut && (spec.rule == dhs::SelectRule::TopK || spec.rule == dhs::SelectRule::TopFrac) && select_.budget_frac == nullptr) {
          const int64_t k = spec.rule == dhs::SelectRule::TopFrac ? top_frac_k(spec.frac, static_cast<int>(n)) : spec.budget;
          cut = k < n;
        }
        if (!cut) continue;
        // Stamped with the tokens before the step: a per-row verify's rows are consecutive
        // requests of one table, the first of them holds the smallest count.
        int64_t first_pos = r.n_before;
        for (size_t j = i; j-- > 0 && batch[j].table_id == r.table_id;) first_pos = std::min(first_pos, batch[j].n_before);
        const size_t slot = static_cast<size_t>(r.req_slot);
        if (seed_table_[slot] != r.table_id) {  // another table's seeds: gone, so a skipped list reads none
          const size_t per_slot = static_cast<size_t>(sz_.n_layers) * static_cast<size_t>(sz_.n_heads_kv) *
                                  static_cast<size_t>(seed_cap_);
          DHS_CUDA_CHECK(cudaMemsetAsync(seeds_d_ + slot * per_slot, 0xFF, per_slot * 4, stream));
        }
        seed_table_[slot] = r.table_id;
        seed_first_pos_[slot] = first_pos;
      }
    }
  } else {
    schedule_.invalidate();
    record_seeds_ = false;
  }
  last_req_slots_ = std::move(req_slots);
  return plan;
}

LayerLists PageSelector::select(int layer, int n_req, const SelectPlan& plan, cudaStream_t stream, const __half* q,
                                const int32_t* q_indptr, const ScoreFrom* from) const {
  if (!plan.runs_policy) return in_.dense;
  const int64_t l = layer, Hkv = sz_.n_heads_kv, B = sz_.max_batch;
  unsigned long long* stats = stats_d_ + l * Hkv * 2;
  const bool reuse = schedule_.every() > 1;
  // This layer's stored selection (reuse only): written where it selects, read where it does not.
  int32_t *st_indptr = nullptr, *st_slots = nullptr, *st_page_pos = nullptr, *st_seq_len = nullptr;
  if (reuse) {
    st_indptr = st_indptr_d_ + l * (B * Hkv + 1);
    st_slots = st_slots_d_ + l * ws_->max_nnz();
    st_page_pos = st_page_pos_d_ + l * ws_->max_nnz();
    st_seq_len = st_seq_len_d_ + l * B;
  }
  if (reuse && !schedule_.selects(layer, plan.phase)) {
    // The layer's last selection, grown by the pages written since (reuse_lists.h).
    ReuseListsParams p = reuse_;
    p.sel_indptr = st_indptr;
    p.sel_slots = st_slots;
    p.sel_page_pos = st_page_pos;
    p.sel_seq_len = st_seq_len;
    p.stats = stats;
    p.n_requests = n_req;
    launch_reuse_lists(p, stream);
    return {p.indptr, p.slots, p.page_pos};
  }
  if (plan.window_only) {
    WindowListsParams w = window_;
    w.row_rules = plan.per_request ? row_rules_d_ : nullptr;
    w.seeds = seed_cap_ > 0 ? seeds_d_ : nullptr;
    w.seed_cap = seed_cap_;
    w.stats = stats;
    w.n_requests = n_req;
    w.layer = layer;
    launch_window_lists(w, stream);
    return {w.indptr, w.slots, w.page_pos};
  }
  // Score and select on the device; attention reads the selected lists in place.
  PageSelectParams p = select_;
  if (p.budget_frac) p.budget_frac = budget_frac_d_ + l * Hkv;
  if (reuse) {
    p.indptr = st_indptr;
    p.slots = st_slots;
    p.page_pos = st_page_pos;
    p.sel_seq_len = st_seq_len;  // kept for the steps that reuse these lists
  }
  p.stats = stats;
  p.n_requests = n_req;
  const int group = sz_.n_heads_q / sz_.n_heads_kv;
  p.q_vecs = group * (q ? 1 : plan.max_q);
  if (q) {
    p.q = q;
    p.q_indptr = q_indptr;
  }
  if (plan.per_request) p.row_rules = row_rules_d_;
  if (plan.per_request && seed_cap_ > 0) {  // (seeded drafts beside scoring requests)
    p.seeds = seeds_d_;
    p.req_slot = in_.req_slot;
    p.seed_cap = seed_cap_;
    p.n_layers = sz_.n_layers;
    p.layer = layer;
  }
  if (record_seeds_) p.mass_out = mass_d_;
  if (from != nullptr) {
    // The scored requests' launch writes the scores; this one's select and compact read them.
    DHS_ASSERT(q == nullptr && from->req && from->vec0 && from->seq_len && from->q_indptr && from->dense.indptr);
    DHS_CHECK(group * from->max_q <= ws_->q_stride(), "page select: {} query rows scored as one request, the workspace holds {}",
              from->max_q, ws_->q_stride() / group);
    PageSelectParams s = p;
    s.dense_indptr = from->dense.indptr;
    s.dense_slots = from->dense.slots;
    s.dense_page_pos = from->dense.page_pos;
    s.seq_len = from->seq_len;
    s.q_indptr = from->q_indptr;
    s.n_requests = from->n_scored;
    s.q_vecs = group * from->max_q;
    s.row_rules = nullptr;  // (the score stage runs the launch's estimator for every request)
    launch_page_select_stage(s, 0, stream);
    p.score_req = from->req;
    p.score_vec0 = from->vec0;
    p.score_indptr = from->dense.indptr;
    launch_page_select_stage(p, 1, stream);
    launch_page_select_stage(p, 2, stream);
  } else {
    launch_page_select(p, stream);
  }
  if (record_seeds_) {
    RecordSeedsParams r{.sel_indptr = p.indptr, .sel_page_pos = p.page_pos, .dense_indptr = p.dense_indptr,
                        .mass = mass_d_, .seq_len = p.seq_len, .q_indptr = p.q_indptr, .req_slot = in_.req_slot,
                        .row_rules = p.row_rules,
                        .rule = RowRule{0, p.rule, p.gamma, p.budget, p.frac, p.n_sink, p.n_recent},
                        .budget_frac = p.budget_frac, .dense_below = p.dense_below,
                        .seeds = seeds_d_, .seed_cap = seed_cap_, .n_requests = n_req, .n_layers = sz_.n_layers,
                        .n_heads_kv = sz_.n_heads_kv, .layer = layer};
    // Forked onto the side stream: attention goes on at once; join() waits for it.
    DHS_CUDA_CHECK(cudaEventRecord(selected_, stream));
    DHS_CUDA_CHECK(cudaStreamWaitEvent(side_, selected_, 0));
    launch_record_seeds(r, side_);
    DHS_CUDA_CHECK(cudaEventRecord(recorded_, side_));
    record_pending_ = true;
  }
  return {p.indptr, p.slots, p.page_pos};
}

void PageSelector::forget_seeds(uint64_t table_id, int64_t n_tokens) {
  for (size_t slot = 0; slot < seed_table_.size(); ++slot)
    if (seed_table_[slot] == table_id && seed_first_pos_[slot] >= n_tokens) seed_table_[slot] = 0;
}

void PageSelector::join(cudaStream_t stream) const {
  if (!record_pending_) return;
  DHS_CUDA_CHECK(cudaStreamWaitEvent(stream, recorded_, 0));
  record_pending_ = false;
}

std::string PageSelector::graph_key(const SelectPlan& plan) const {
  // A threshold-dense step of a sparse policy runs the dense step's kernels: one graph for all.
  const std::string base = plan.runs_policy || !sparse_ ? policy_key_ : std::string("dense-step");
  const std::string rows = (plan.per_request ? base + "+rows" : base) + (plan.window_only ? "+window" : "") +
                           (seed_cap_ > 0 ? fmt::format("+seeds{}{}", seed_cap_, seed_recording_ ? "" : "-norec") : std::string());
  return plan.phase == ReselectSchedule::kFull ? rows : fmt::format("{}#{}", rows, plan.phase);
}

std::vector<SelectPlan> PageSelector::replay_cycle(const SelectPlan& last) const {
  // (Copies of the last plan, its max_q included: the score kernel's form follows it.)
  SelectPlan plan = last;
  if (!last.runs_policy || schedule_.every() == 1) {
    plan.phase = ReselectSchedule::kFull;
    return {plan};
  }
  std::vector<SelectPlan> cycle;
  plan.window_only = false;
  for (int ph = 0; ph < schedule_.every(); ++ph) {
    plan.phase = ph;
    cycle.push_back(plan);
  }
  return cycle;
}

SparsityStats PageSelector::stats() const {
  SparsityStats st;
  if (!stats_d_) return st;
  const size_t n = static_cast<size_t>(sz_.n_layers) * static_cast<size_t>(sz_.n_heads_kv);
  std::vector<unsigned long long> h(2 * n);
  DHS_CUDA_CHECK(cudaMemcpy(h.data(), stats_d_, h.size() * 8, cudaMemcpyDeviceToHost));
  st.read.resize(n);
  st.total.resize(n);
  for (size_t i = 0; i < n; ++i) {
    st.read[i] = h[2 * i] + dense_step_pages_;
    st.total[i] = h[2 * i + 1] + dense_step_pages_;
  }
  return st;
}

void PageSelector::reset_stats() {
  dense_step_pages_ = 0;
  threshold_dense_steps_ = 0;
  if (stats_d_)
    DHS_CUDA_CHECK(cudaMemset(stats_d_, 0, static_cast<size_t>(sz_.n_layers) * static_cast<size_t>(sz_.n_heads_kv) * 2 * 8));
}

}  // namespace dhs::cuda
