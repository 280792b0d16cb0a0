#include "engine/continuous_scheduler.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "core/error.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "engine/sampler.h"
#include "engine/spec_accept.h"
#include "engine/stop_matcher.h"
#include "kv/page_table.h"

namespace dhs {

namespace {

// Bucket bounds in seconds: vLLM's for its histograms of the same names.
std::vector<double> ttft_bounds() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
          2.5,   5.0,   7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}
std::vector<double> tpot_bounds() {
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> e2e_bounds() {
  return {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
          1920.0, 7680.0};
}

void add_counts(PageCounts* to, const PageCounts& c) {
  to->read += c.read;
  to->total += c.total;
  if (c.layer_head_read.empty()) return;
  if (to->layer_head_read.empty()) {
    to->layer_head_read.assign(c.layer_head_read.size(), 0);
    to->layer_head_total.assign(c.layer_head_total.size(), 0);
  }
  for (size_t i = 0; i < c.layer_head_read.size() && i < to->layer_head_read.size(); ++i) {
    to->layer_head_read[i] += c.layer_head_read[i];
    to->layer_head_total[i] += c.layer_head_total[i];
  }
}

}  // namespace

// One request from submit to its last event.
struct ContinuousScheduler::Request {
  Request(uint64_t id_, RequestParams p, RequestSink s, const Tokenizer& tok, const ModelConfig& c, int page_size)
      : id(id_),
        params(std::move(p)),
        sink(std::move(s)),
        table(static_cast<int>(c.n_layers), static_cast<int>(c.n_heads_kv), page_size),
        history(params.prompt),
        n_prompt(static_cast<int64_t>(params.prompt.size())),
        dec(tok, /*skip_special=*/true),
        stops(params.options.stop) {}

  uint64_t id;
  RequestParams params;
  RequestSink sink;
  PageTable table;               // its KV: the first table.n_tokens() tokens of history
  std::vector<int32_t> history;  // prompt + generated: what the next rows feed (and the penalty reads)
  int64_t n_prompt;
  int64_t n_generated = 0;
  int slot = -1;                 // runner slot while running
  StreamDecoder dec;
  StopMatcher stops;
  double t_arrival = 0.0, t_first = -1.0, t_last = 0.0;
  bool cancelled = false;
  bool counted_prompt = false;   // prompt tokens counted in the stats (once, not again on recompute)
  bool own_policy = false;       // options.sparse_policy given: `policy` is the request's own
  PolicySpec policy;             // (as_request_policy over the runner's at submit)
  RequestEvent event;            // what this step has for the sink
  bool finished = false;
  // Speculative decoding (options.speculative_k > 0, checked at submit): a cycle appends its
  // drafts to history (not emitted) while the table takes their KV on the draft's pages; the
  // verify row then writes tokens spec_base.. again with the request's policy.
  PolicySpec draft;                 // the draft's pages
  std::optional<Sampler> verifier;  // the drafts' and verify rows' draws (the request's parameters and seed)
  std::vector<TokenDist> draft_q;   // sampled requests: the distribution each draft was drawn from
  int64_t spec_base = -1;           // table tokens when the cycle began (history[spec_base] feeds its first row); -1: none
  int k_cycle = 0, n_draft = 0;     // drafts this cycle aims for, and has
  int64_t spec_verifies = 0, spec_drafted = 0, spec_accepted = 0;
  AcceptanceEstimate acceptance;    // (auto) the share of its drafts kept, running
  SpecProbe probe;                  // (auto) cycles run where the choice is 0 (spec_controller.h)

  int64_t remaining() const { return static_cast<int64_t>(history.size()) - table.n_tokens(); }
};

ContinuousScheduler::ContinuousScheduler(StepRunner& runner, const Tokenizer& tok, int64_t max_context,
                                         const SchedulerOptions& o, std::shared_ptr<Clock> clock)
    : runner_(runner), tok_(tok), opt_(o), clock_(std::move(clock)) {
  DHS_CHECK(clock_ != nullptr, "scheduler: no clock");
  DHS_CHECK(opt_.max_num_seqs >= 1, "--max-num-seqs must be >= 1, got {}", opt_.max_num_seqs);
  DHS_CHECK(opt_.max_num_batched_tokens >= 1, "--max-num-batched-tokens must be >= 1, got {}",
            opt_.max_num_batched_tokens);
  DHS_CHECK(opt_.max_waiting >= 0, "--max-waiting must be >= 0, got {}", opt_.max_waiting);
  DHS_CHECK(opt_.max_model_len >= 0 && opt_.max_model_len <= max_context,
            "--max-model-len {} is larger than the engine's context of {} tokens", opt_.max_model_len, max_context);
  if (opt_.max_model_len == 0) opt_.max_model_len = max_context;
  if (opt_.speculative_k != 0) {
    GenerateOptions probe;
    probe.speculative_k = opt_.speculative_k;
    probe.draft_policy = opt_.draft_policy;
    PolicySpec draft;
    const std::string why = check_speculation(probe, &draft);
    DHS_CHECK(why.empty(), "--speculative-k {}: {}", opt_.speculative_k, why);
  }
  cap_ = std::min(opt_.max_num_seqs, runner_.max_batch());
  step_tokens_ = std::min(opt_.max_num_batched_tokens, runner_.max_step_tokens());
  // A step must hold a decode row of every running request.
  DHS_CHECK(step_tokens_ >= cap_, "--max-num-batched-tokens ({}) must be at least --max-num-seqs ({})", step_tokens_,
            cap_);
  for (int s = cap_ - 1; s >= 0; --s) free_slots_.push_back(s);
  stats_.ttft = Histogram(ttft_bounds());
  stats_.tpot = Histogram(tpot_bounds());
  stats_.e2e = Histogram(e2e_bounds());
  stats_.kv = runner_.pages().stats();
  stats_.kv_check = runner_.pages().check_invariants();
}

ContinuousScheduler::~ContinuousScheduler() {
  try {
    stop(/*drain=*/false);
  } catch (...) {
  }
}

int64_t ContinuousScheduler::chunk_cap() const {
  // With a KV hierarchy a prefill chunk's pages stay in the pool while its step runs, beside each
  // layer's pages being read: a chunk takes at most half the pool.
  if (runner_.host_tier_pages() == 0) return INT64_MAX;
  const int64_t ps = runner_.pages().page_size();
  return std::max(ps, runner_.pages().n_pages() / 2 / pages_per_token() * ps);
}

int64_t ContinuousScheduler::pages_per_token() const {
  return runner_.config().n_layers * runner_.config().n_heads_kv;
}

std::string ContinuousScheduler::check_speculation(const GenerateOptions& o, PolicySpec* draft) const {
  if ((o.speculative_k < 0 || o.speculative_k > kMaxSpeculativeK) && o.speculative_k != kSpeculativeAuto)
    return fmt::format("speculative_k must be in [0, {}] or auto, got {}", kMaxSpeculativeK, o.speculative_k);
  if (!runner_.verifies()) return "this backend does not run speculative verification";
  if (o.speculative_k + 1 > runner_.max_verify_rows())
    return fmt::format("speculative_k {} is more drafts than this backend verifies in one step ({}: its attention kernel "
                       "takes {} query rows per request at this model's GQA group)",
                       o.speculative_k, runner_.max_verify_rows() - 1, runner_.max_verify_rows());
  if (runner_.policy().reselect_every != 1)
    return fmt::format("speculative decoding needs a policy that selects at every step (the engine's reselects every {})",
                       runner_.policy().reselect_every);
  try {
    *draft = PolicySpec::parse(o.draft_policy, runner_.policy());
  } catch (const Error& e) {
    return std::string("draft policy: ") + e.what();
  }
  if (draft->seed_pages > runner_.max_draft_seeds())
    return fmt::format("draft policy {}: {} seed pages per list, this backend keeps at most {}", draft->str(),
                       draft->seed_pages, runner_.max_draft_seeds());
  if (draft->rule != SelectRule::SinkWindow)
    return fmt::format("draft policy {}: the draft reads sink and recent pages (sinkwindow:PAGES, or sinkwindow:PAGES+SEEDS "
                       "with the verifier's heaviest pages); scoring drafts are not built yet",
                       draft->str());
  return "";
}

SubmitResult ContinuousScheduler::submit(RequestParams params, RequestSink sink) {
  SubmitResult res;
  auto invalid = [&](std::string why) {
    res.status = SubmitStatus::Invalid;
    res.error = std::move(why);
    return res;
  };
  const std::vector<int32_t>& prompt = params.prompt;
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n == 0) return invalid("empty prompt");
  const int64_t vocab = runner_.config().vocab_size;
  for (const int32_t id : prompt)
    if (id < 0 || id >= vocab) return invalid(fmt::format("token id {} out of range [0, {})", id, vocab));
  if (n >= opt_.max_model_len)
    return invalid(fmt::format("prompt has {} tokens; the context holds {} (raise --ctx-size up to the model's {})", n,
                               opt_.max_model_len, runner_.config().max_context));
  if (params.options.max_tokens < 0) return invalid(fmt::format("max_tokens must be >= 0, got {}", params.options.max_tokens));
  try {
    validate(params.options.sampling);
  } catch (const Error& e) {
    return invalid(e.what());
  }
  PolicySpec own_policy;
  if (!params.options.sparse_policy.empty()) {
    try {
      own_policy = PolicySpec::parse(params.options.sparse_policy, runner_.policy()).as_request_policy(runner_.policy());
    } catch (const Error& e) {
      return invalid(e.what());
    }
  }
  PolicySpec draft;
  if (params.options.speculative_k == -1) params.options.speculative_k = opt_.speculative_k;  // the scheduler's
  if (params.options.draft_policy.empty()) params.options.draft_policy = opt_.draft_policy;
  if (params.options.speculative_k != 0) {
    if (std::string why = check_speculation(params.options, &draft); !why.empty()) return invalid(why);
  }
  // The pages its prompt and first token take, against the whole pool (and the host tier behind
  // it: a prompt streams through the pool there): a request that can never be admitted is refused
  // now rather than waiting forever.
  const int64_t page_size = runner_.pages().page_size();
  const int64_t need = (n + 1 + page_size - 1) / page_size * pages_per_token();
  const int64_t capacity = runner_.pages().n_pages() + runner_.host_tier_pages();
  if (need > capacity)
    return invalid(fmt::format("prompt of {} tokens needs {} KV pages; the pool holds {}{}", n, need,
                               runner_.pages().n_pages(),
                               runner_.host_tier_pages() > 0 ? fmt::format(" and the host tier {}", runner_.host_tier_pages()) : ""));
  if (!sink) sink = [](const RequestEvent&) {};

  std::unique_lock lk(mu_);
  if (!accepting_) {
    res.status = SubmitStatus::ShuttingDown;
    res.error = "the server is shutting down";
    return res;
  }
  if (static_cast<int64_t>(waiting_.size()) >= opt_.max_waiting) {
    lk.unlock();
    std::lock_guard sl(stats_mu_);
    ++stats_.n_rejected_full;
    res.status = SubmitStatus::QueueFull;
    res.error = fmt::format("too many requests: {} already wait (--max-waiting)", opt_.max_waiting);
    return res;
  }
  auto r = std::make_unique<Request>(next_id_++, std::move(params), std::move(sink), tok_, runner_.config(),
                                     static_cast<int>(page_size));
  r->t_arrival = clock_->now();
  r->own_policy = !r->params.options.sparse_policy.empty();
  r->policy = own_policy;
  r->draft = draft;
  if (r->params.options.speculative_k != 0) r->verifier.emplace(r->params.options.sampling);
  res.id = r->id;
  waiting_.push_back(std::move(r));
  lk.unlock();
  {
    std::lock_guard sl(stats_mu_);
    ++stats_.n_submitted;
  }
  cv_.notify_all();
  return res;
}

void ContinuousScheduler::cancel(uint64_t id) {
  {
    std::lock_guard lk(mu_);
    cancels_.push_back(id);
  }
  cv_.notify_all();
}

bool ContinuousScheduler::idle() const {
  std::lock_guard lk(mu_);
  return waiting_.empty() && n_running_ == 0 && cancels_.empty();
}

PageCounts ContinuousScheduler::take_page_counts() {
  std::lock_guard lk(step_mu_);
  PageCounts c = std::move(unread_pages_);
  unread_pages_ = PageCounts{};
  return c;
}

SchedulerStats ContinuousScheduler::stats() const {
  SchedulerStats s;
  {
    std::lock_guard sl(stats_mu_);
    s = stats_;
  }
  std::lock_guard lk(mu_);
  s.n_running = n_running_;
  s.n_waiting = static_cast<int64_t>(waiting_.size());
  return s;
}

// ---- the step ----

void ContinuousScheduler::finish(Request& r, const std::string& reason, const std::string& error, double now) {
  if (r.finished) return;
  if (reason != "abort" && reason != "error" && !r.stops.stopped()) r.event.text += r.stops.finish(r.dec.flush());
  r.finished = true;
  r.event.finished = true;
  r.event.finish_reason = reason;
  r.event.error = error;
  r.t_last = r.n_generated > 0 ? r.t_last : now;
  std::lock_guard sl(stats_mu_);
  if (reason == "stop") ++stats_.n_finished_stop;
  else if (reason == "length") ++stats_.n_finished_length;
  else if (reason == "abort") ++stats_.n_finished_abort;
  else ++stats_.n_finished_error;
  stats_.e2e.add(now - r.t_arrival);
  if (r.n_generated > 1) stats_.tpot.add((r.t_last - r.t_first) / static_cast<double>(r.n_generated - 1));
}

ContinuousScheduler::Owned ContinuousScheduler::remove_running(Request* r) {
  auto it = std::find_if(running_.begin(), running_.end(), [&](const Owned& o) { return o.get() == r; });
  DHS_ASSERT(it != running_.end());
  Owned o = std::move(*it);
  running_.erase(it);
  free_slots_.push_back(o->slot);
  o->slot = -1;
  std::lock_guard lk(mu_);
  --n_running_;
  return o;
}

void ContinuousScheduler::drop_cancelled(std::vector<Owned>* done) {
  const double now = clock_->now();
  std::vector<uint64_t> ids;
  bool abort_all = false;
  {
    std::lock_guard lk(mu_);
    ids.swap(cancels_);
    abort_all = abort_all_;
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (abort_all || std::find(ids.begin(), ids.end(), (*it)->id) != ids.end()) {
        done->push_back(std::move(*it));
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Owned& r : *done) finish(*r, "abort", "", now);
  for (size_t i = 0; i < running_.size();) {
    Request* r = running_[i].get();
    if (abort_all || std::find(ids.begin(), ids.end(), r->id) != ids.end()) {
      finish(*r, "abort", "", now);
      done->push_back(remove_running(r));
    } else {
      ++i;
    }
  }
}

void ContinuousScheduler::preempt_newest() {
  Owned r = remove_running(running_.back().get());
  // With a KV hierarchy its pages go to the host tier and it resumes where it was (not in a
  // speculative cycle: its drafts' KV would come back with it); else recompute: its tokens are
  // prefilled again on resume.
  const bool swapped = r->spec_base < 0 && runner_.swap_out(r->table);
  if (!swapped) runner_.release(r->table);
  if (r->spec_base >= 0) {  // its drafts go; a new cycle starts after the recompute
    r->history.resize(static_cast<size_t>(r->spec_base + 1));
    r->draft_q.clear();
    r->spec_base = -1;
  }
  {
    std::lock_guard sl(stats_mu_);
    ++stats_.n_preemptions;
    stats_.n_swapped += swapped;
  }
  std::lock_guard lk(mu_);
  waiting_.push_front(std::move(r));
}

bool ContinuousScheduler::reserve_or_preempt(Request& r, int64_t n) {
  while (!r.table.reserve(runner_.pages(), n)) {
    if (runner_.make_room(r.table.pages_needed(n))) continue;  // cold pages to the host tier first
    const bool self = running_.back().get() == &r;
    preempt_newest();
    if (self) return false;
  }
  return true;
}

int ContinuousScheduler::next_cycle_drafts(Request& r) {
  if (r.params.options.speculative_k != kSpeculativeAuto) return r.params.options.speculative_k;
  SpecCostInputs in;
  in.context = r.table.n_tokens() + 1;
  in.draft_context = static_cast<int64_t>(r.draft.budget + r.draft.seed_pages) * runner_.pages().page_size();
  in.batch = std::max<int>(1, static_cast<int>(running_.size()));
  in.verify_reads_once = runner_.verify_reads_kv_once();
  const int k_max = std::min(kSpeculativeAutoMaxK, runner_.max_verify_rows() - 1);
  const int k = choose_speculation(step_cost_, r.acceptance.alpha(), in, k_max).k;
  return k > 0 ? k : r.probe.drafts(step_cost_, in, k_max, steps_since_draft_ < kFitMemorySteps);
}

bool ContinuousScheduler::place_speculative(Request& r, std::vector<Row>* rows, int64_t* budget) {
  if (r.spec_base < 0) {
    // A new cycle: as many drafts as the request may still emit (a verify emits up to k + 1
    // tokens), the context holds, and a step's budget holds.
    const int64_t room = std::min({r.params.options.max_tokens - r.n_generated - 1,
                                   opt_.max_model_len - 1 - static_cast<int64_t>(r.history.size()), step_tokens_ - 1});
    r.k_cycle = room > 0 ? static_cast<int>(std::clamp<int64_t>(room, 0, next_cycle_drafts(r))) : 0;
    if (r.k_cycle > 0) {
      r.spec_base = r.table.n_tokens();
      r.n_draft = 0;
    }
  }
  if (r.spec_base < 0 || r.n_draft < r.k_cycle) {  // a plain decode row (no room to speculate), or a draft
    if (!reserve_or_preempt(r, 1)) return false;
    if (r.spec_base < 0) r.probe.plain_token();
    rows->push_back({&r, 1, r.spec_base < 0 ? RowKind::Normal : RowKind::Draft});
    --*budget;
    return true;
  }
  // The verify: the drafts' KV (computed on the draft's pages) is written again by its rows.
  // What older rows left of the budget bounds it: the drafts past that are dropped unverified
  // (a verify of one row is the cycle's first token decoded), so a request always progresses.
  if (r.k_cycle + 1 > *budget) {
    r.k_cycle = static_cast<int>(*budget - 1);
    r.history.resize(static_cast<size_t>(r.spec_base + 1 + r.k_cycle));
    if (!r.draft_q.empty()) r.draft_q.resize(static_cast<size_t>(r.k_cycle));
  }
  const int64_t n = r.k_cycle + 1;
  runner_.truncate(r.table, r.spec_base);
  if (!reserve_or_preempt(r, n)) return false;
  rows->push_back({&r, n, RowKind::Verify});
  *budget -= n;
  return true;
}

void ContinuousScheduler::accept_verified(Request& r, float* logits, const int32_t* ids, double now) {
  static const std::vector<int32_t> kNoHistory;
  const int64_t V = runner_.config().vocab_size;
  const int64_t n_vocab = std::min<int64_t>(V, tok_.vocab_size());
  const SamplingParams& sp = r.params.options.sampling;
  const bool penalty = sp.repetition_penalty != 1.0f;
  const std::vector<int32_t> drafts(r.history.begin() + r.spec_base + 1, r.history.end());
  DHS_ASSERT(static_cast<int>(drafts.size()) == r.k_cycle);
  // Row j is what decoding would sample from after history[..spec_base + j].
  std::vector<int32_t> prefix;
  auto row_history = [&](int j) -> const std::vector<int32_t>& {
    if (!penalty) return kNoHistory;
    prefix.assign(r.history.begin(), r.history.begin() + r.spec_base + j + 1);
    return prefix;
  };
  int a = 0;
  int32_t next = -1;
  if (sp.temperature == 0.0f) {
    // Greedy: the drafts are kept while they equal each row's token; the first that does not is
    // replaced by it (or, all kept, the last row's token follows them).
    for (int j = 0; j <= r.k_cycle; ++j) {
      // (ids: the runner's greedy ids of the rows, for a request without a penalty)
      const int32_t t = ids ? ids[j] : r.verifier->sample(logits + j * V, n_vocab, row_history(j));
      if (j < r.k_cycle && t == drafts[static_cast<size_t>(j)]) {
        ++a;
        continue;
      }
      next = t;
      break;
    }
  } else {
    std::vector<TokenDist> p(static_cast<size_t>(r.k_cycle + 1));
    for (int j = 0; j <= r.k_cycle; ++j) r.verifier->distribution(logits + j * V, n_vocab, row_history(j), &p[static_cast<size_t>(j)]);
    const SpecVerdict v = accept_sampled(drafts, r.draft_q, p, *r.verifier);
    a = v.accepted;
    next = v.next;
  }
  r.history.resize(static_cast<size_t>(r.spec_base + 1));
  r.draft_q.clear();
  runner_.truncate(r.table, r.spec_base + 1 + a);  // the rejected drafts' KV and page data go
  r.spec_base = -1;
  ++r.spec_verifies;
  r.spec_drafted += r.k_cycle;
  r.spec_accepted += a;
  r.acceptance.observe(r.k_cycle, a);
  {
    std::lock_guard sl(stats_mu_);
    ++stats_.spec_verifies;
    stats_.spec_drafted += static_cast<uint64_t>(r.k_cycle);
    stats_.spec_accepted += static_cast<uint64_t>(a);
  }
  for (int j = 0; j < a && !r.finished; ++j) take_token(r, drafts[static_cast<size_t>(j)], now);
  if (!r.finished) take_token(r, next, now);
}

bool ContinuousScheduler::prefill_pending() {
  for (const Owned& o : running_)
    if (o->remaining() > 1 && o->spec_base < 0) return true;
  std::lock_guard lk(mu_);
  return !waiting_.empty();
}

int ContinuousScheduler::prefill_rows(const std::vector<Row>& rows) {
  int n = 0;
  for (const Row& row : rows) n += row.req->remaining() > 1;  // (decode and verify rows: 1 left)
  return n;
}

void ContinuousScheduler::schedule_running(std::vector<Row>* rows, int64_t* budget, std::vector<Owned>*) {
  // Decode rows first, oldest first; preemption takes the newest, so rows already placed stay.
  // (A row that does not fit what verify rows left of the budget waits a step.)
  for (size_t i = 0; i < running_.size() && phase_ != Phase::PrefillOnly; ++i) {
    Request* r = running_[i].get();
    if (r->remaining() != 1 || *budget < 1) continue;
    if (r->params.options.speculative_k != 0) {
      if (!place_speculative(*r, rows, budget)) break;  // r was the newest: nothing after it runs either
      continue;
    }
    if (!reserve_or_preempt(*r, 1)) break;
    rows->push_back({r, 1});
    --*budget;
  }
  // Then prefill chunks of the requests still prefilling. Their pages were reserved at admission;
  // with a KV hierarchy only the first chunk's were, and each later chunk reserves its own, making
  // room by offloading cold pages (never by preemption here: rows are placed already), so a prompt
  // whose KV is larger than the pool streams through it.
  const bool chunked = runner_.host_tier_pages() > 0;
  for (const Owned& o : running_) {
    if (*budget <= 0 || phase_ == Phase::DecodeOnly || (phase_ == Phase::PrefillOnly && prefill_rows(*rows) > 0)) break;
    if (o->remaining() <= 1 || o->spec_base >= 0) continue;  // (a verify row was placed above)
    const int64_t n = std::min({o->remaining(), *budget, chunk_cap()});
    if (chunked && !o->table.reserve(runner_.pages(), n) &&
        !(runner_.make_room(o->table.pages_needed(n)) && o->table.reserve(runner_.pages(), n)))
      continue;  // no room this step
    rows->push_back({o.get(), n});
    *budget -= n;
  }
}

void ContinuousScheduler::admit(std::vector<Row>* rows, int64_t* budget, std::vector<Owned>* done) {
  PagePool& pool = runner_.pages();
  const double now = clock_->now();
  if (phase_ == Phase::DecodeOnly) return;
  // Full KV pages of a table: those it holds (t.n_tokens() tokens), or will hold after n more tokens.
  const auto full_pages = [](const PageTable& t, int64_t n) {
    return (t.n_tokens() + n) / t.page_size() * t.n_layers() * t.n_heads_kv();
  };
  int64_t admitted_held = 0;  // full pages held by the requests this call admitted (swapped ones)
  while (*budget > 0 && static_cast<int>(running_.size()) < cap_ && !(phase_ == Phase::PrefillOnly && prefill_rows(*rows) > 0)) {
    Owned r;
    int64_t first = 0;  // tokens whose pages admission reserves
    {
      std::lock_guard lk(mu_);
      if (waiting_.empty()) return;
      const Request& head = *waiting_.front();
      // (a swapped request: its appending pages back, then its remaining tokens; with a hierarchy,
      // only the first chunk's: schedule_running reserves each later one)
      first = runner_.host_tier_pages() > 0 ? std::min({head.remaining(), *budget, chunk_cap()}) : head.remaining();
      const int64_t need = runner_.swap_in_pages(head.table) + head.table.pages_needed(first);
      const int64_t headroom = static_cast<int64_t>(running_.size()) * pages_per_token();
      // With a KV hierarchy, running requests' cold pages can make the room — while the link
      // between the tiers keeps capacity with the new request running (IO-aware admission):
      // the running requests' and its working sets beyond the pool cross the link every step, so
      // admitting into that would stall every step; waiting for a request to finish costs less.
      // Priced whenever the room exists or can be made, not only when its first chunk needs
      // others' pages: a prompt whose first chunk fits pushes the running working sets out chunk
      // by chunk later (under the serving load all 16 requests were admitted that way, session 32).
      // (DHS_ADMIT_LOG: a line per admission the hierarchy weighs, on stderr)
      static const bool admit_log = std::getenv("DHS_ADMIT_LOG") != nullptr;
      if (admit_log && runner_.host_tier_pages() > 0)
        std::fprintf(stderr, "admit: running %zu free %lld reclaimable %lld need %lld headroom %lld\n", running_.size(),
                     static_cast<long long>(pool.n_free()), static_cast<long long>(runner_.reclaimable_pages()),
                     static_cast<long long>(need), static_cast<long long>(headroom));
      if (runner_.host_tier_pages() > 0 && !running_.empty() &&
          pool.n_free() + runner_.reclaimable_pages() >= need + headroom) {
        // The pages it will hold running (those it holds — a swapped request's, in the host tier
        // — and its whole prompt's; the tokens it will generate are not counted), and what the
        // runner's measurement does not hold yet: the prompt pages running requests have still to
        // prefill and the pages of requests admitted in this call.
        int64_t pages = full_pages(head.table, head.remaining()) + admitted_held;
        for (const Owned& o : running_)
          if (o->remaining() > 1) pages += full_pages(o->table, o->remaining()) - full_pages(o->table, 0);
        // (one that fits as it is and adds nothing to the link is admitted, however busy it is;
        // one that needs others' pages offloaded waits on a busy link, as before)
        const double with = runner_.kv_io_load_admitting(pages);
        if (admit_log)
          std::fprintf(stderr, "admit: pages %lld load %.3f with %.3f pays %d\n", static_cast<long long>(pages), runner_.kv_io_load(), with,
                       runner_.kv_admitting_pays(pages, static_cast<int64_t>(running_.size())) ? 1 : 0);
        if (with > opt_.kv_io_admit_max && (with > runner_.kv_io_load() || pool.n_free() < need + headroom)) {
          ++io_waits_;
          return;  // wait: the running requests' steps free the link (or finish)
        }
        // (the throughput rule: the pages it adds to the link every step, at what a page costs
        // the whole step, against the step's fixed part and the I/O the rows already share)
        if (opt_.kv_admit_throughput && !runner_.kv_admitting_pays(pages, static_cast<int64_t>(running_.size()))) {
          ++io_waits_;
          ++throughput_waits_;
          return;
        }
      }
      if (pool.n_free() < need + headroom && pool.n_free() + runner_.reclaimable_pages() >= need + headroom)
        runner_.make_room(need + headroom);
      if (pool.n_free() < need + headroom) {
        if (!running_.empty()) return;  // wait for pages to come back
        if (pool.n_free() >= need) {
          // Alone it fits: admit it.
        } else {
          // Nothing runs and still no room: pages are held outside the scheduler (sessions).
          r = std::move(waiting_.front());
          waiting_.pop_front();
          finish(*r, "error", fmt::format("out of KV pages: {} needed, {} free", need, pool.n_free()), now);
          done->push_back(std::move(r));
          continue;
        }
      }
      r = std::move(waiting_.front());
      waiting_.pop_front();
      ++n_running_;
    }
    admitted_held += full_pages(r->table, 0);
    DHS_CHECK(runner_.swap_in(r->table), "scheduler: swap-in after check failed");
    DHS_CHECK(r->table.reserve(pool, first), "scheduler: reserve after check failed");
    r->slot = free_slots_.back();
    free_slots_.pop_back();
    runner_.begin_request(r->slot, r->params.options.sampling);
    if (!r->counted_prompt) {
      r->counted_prompt = true;
      std::lock_guard sl(stats_mu_);
      stats_.prompt_tokens += static_cast<uint64_t>(r->n_prompt);
    }
    const int64_t n = std::min(r->remaining(), std::min(*budget, first));
    rows->push_back({r.get(), n});
    *budget -= n;
    running_.push_back(std::move(r));
  }
}

void ContinuousScheduler::take_token(Request& r, int32_t id, double now) {
  const auto& stop_ids = tok_.stop_ids();
  if (!r.params.options.ignore_eos && std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end()) {
    finish(r, "stop", "", now);
    return;
  }
  r.history.push_back(id);
  r.event.tokens.push_back(id);
  ++r.n_generated;
  r.t_last = now;
  if (r.t_first < 0) {
    r.t_first = now;
    std::lock_guard sl(stats_mu_);
    stats_.ttft.add(now - r.t_arrival);
  }
  {
    std::lock_guard sl(stats_mu_);
    ++stats_.generation_tokens;
  }
  r.event.text += r.stops.push(r.dec.push(id));
  if (r.stops.stopped()) finish(r, "stop", "", now);
  else if (r.n_generated >= r.params.options.max_tokens) finish(r, "length", "", now);
  // The context holds the prompt and every generated token (vLLM's max_model_len): the token
  // just sampled filling it ends generation, as max_tokens does.
  else if (static_cast<int64_t>(r.history.size()) >= opt_.max_model_len) finish(r, "length", "", now);
}

void ContinuousScheduler::run_rows(const std::vector<Row>& rows, std::vector<Owned>* done) {
  std::vector<StepRequest> batch;
  batch.reserve(rows.size());
  bool want_logits = false;
  for (const Row& row : rows) {
    Request& r = *row.req;
    const bool at_end = row.n == r.remaining();
    const bool sample = at_end && r.n_generated < r.params.options.max_tokens;
    // (The runner's policy may have changed since submit: eval sets one per run, between runs.)
    const PolicySpec* own = r.own_policy && !(r.policy == runner_.policy()) ? &r.policy : nullptr;
    if (row.kind == RowKind::Verify) {
      batch.push_back(StepRequest{&r.table, r.slot, r.history.data() + r.spec_base, row.n, false, &r.history, own});
      batch.back().verify = true;
      const SamplingParams& sp = r.params.options.sampling;
      batch.back().verify_ids = sp.temperature == 0.0f && sp.repetition_penalty == 1.0f;
    } else if (row.kind == RowKind::Draft) {
      // A sampled request's draft is drawn here, from the draft's logits (its distribution q is
      // kept for the acceptance test); a greedy one's by the runner.
      const bool greedy = r.params.options.sampling.temperature == 0.0f;
      want_logits = want_logits || !greedy;
      if (r.draft.seed_pages > 0) runner_.keep_draft_seeds(r.draft.seed_pages);  // (from its next verify on)
      batch.push_back(StepRequest{&r.table, r.slot, r.history.data() + r.table.n_tokens(), 1, greedy, &r.history, &r.draft});
      batch.back().draft = true;
    } else {
      batch.push_back(StepRequest{&r.table, r.slot, r.history.data() + r.table.n_tokens(), row.n, sample, &r.history, own});
    }
  }
  std::string failure;
  const double t0 = clock_->now();
  try {
    runner_.step(batch, &out_, want_logits);
  } catch (const Error& e) {
    failure = e.what();
  }
  const double now = clock_->now();
  if (failure.empty()) {
    // The step's shape for the cost model: its rows, and the context tokens they attend over
    // (a chunk's row j over ctx + j + 1; a draft over its sink and recent pages at most).
    double n_rows = 0, kv = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      const double n = static_cast<double>(rows[i].n);
      const double ctx = static_cast<double>(batch[i].table->n_tokens());
      n_rows += n;
      if (rows[i].kind == RowKind::Draft)
        kv += std::min(ctx, static_cast<double>(rows[i].req->draft.budget + rows[i].req->draft.seed_pages) *
                                runner_.pages().page_size());
      else if (rows[i].kind == RowKind::Verify && runner_.verify_reads_kv_once())
        kv += ctx;
      else
        kv += n * ctx - n * (n - 1) / 2;  // the table already holds the step's n tokens
    }
    // Steps with a prompt chunk are left out: a chunk's rows are compute-bound, a decode row's
    // bandwidth-bound, and one linear fit of both priced a decode row's KV at a chunk's rate (the
    // plain steps of a long context then read as weights alone, and auto never drafted).
    const bool chunk = std::any_of(rows.begin(), rows.end(), [](const Row& x) { return x.kind == RowKind::Normal && x.n > 1; });
    if (!chunk) {
      step_cost_.observe(n_rows, kv, now - t0);
      // (counted over the steps the fit takes: a draft beside a chunk is not one it saw)
      const bool drafted = std::any_of(rows.begin(), rows.end(), [](const Row& x) { return x.kind == RowKind::Draft; });
      steps_since_draft_ = drafted ? 0 : std::min(steps_since_draft_ + 1, kFitMemorySteps);
    }
  }
  if (!failure.empty()) {
    // A step that fails (the device, say) ends the requests in it, not the server.
    for (const Row& row : rows) {
      finish(*row.req, "error", failure, now);
      done->push_back(remove_running(row.req));
    }
    return;
  }
  const PageCounts counts = runner_.take_page_counts();
  add_counts(&unread_pages_, counts);
  {
    std::lock_guard sl(stats_mu_);
    add_counts(&stats_.pages, counts);
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    Request& r = *rows[i].req;
    if (rows[i].kind == RowKind::Draft) {
      int32_t d = out_.sampled.at(i);
      if (!batch[i].sample) {
        const size_t V = static_cast<size_t>(runner_.config().vocab_size);
        TokenDist& q = r.draft_q.emplace_back();
        r.verifier->distribution(out_.logits.data() + i * V, std::min<int64_t>(static_cast<int64_t>(V), tok_.vocab_size()),
                                 r.history, &q);
        d = r.verifier->draw(q);
      }
      r.history.push_back(d);  // not emitted: the verify decides
      ++r.n_draft;
    } else if (rows[i].kind == RowKind::Verify) {
      const size_t V = static_cast<size_t>(runner_.config().vocab_size);
      const size_t row = static_cast<size_t>(out_.verify_row.at(i));
      if (!out_.verify_ids.empty())
        accept_verified(r, nullptr, out_.verify_ids.data() + row, now);
      else
        accept_verified(r, out_.verify_logits.data() + row * V, nullptr, now);
    } else if (batch[i].sample) {
      take_token(r, out_.sampled.at(i), now);
    }
    else if (r.remaining() == 0) finish(r, "length", "", now);  // max_tokens 0: the prompt only
    if (r.finished) done->push_back(remove_running(&r));
  }
}

void ContinuousScheduler::publish(std::vector<Owned>* done) {
  for (Owned& r : *done) runner_.release(r->table);
  const bool quiet = [&] {
    std::lock_guard lk(mu_);
    return waiting_.empty() && n_running_ == 0;
  }();
  {
    std::lock_guard sl(stats_mu_);
    stats_.kv = runner_.pages().stats();
    stats_.tiers = runner_.tier_counts();
    stats_.kv_io_load = runner_.kv_io_load();
    stats_.kv_page_cost_us = runner_.kv_page_cost_seconds() * 1e6;
    stats_.n_admission_io_waits = io_waits_;
    stats_.n_admission_throughput_waits = throughput_waits_;
    stats_.kv_step_page_cost_us = runner_.kv_step_page_cost_seconds() * 1e6;
    stats_.kv_step_fixed_ms = runner_.kv_step_fixed_seconds() < 0.0 ? -1.0 : runner_.kv_step_fixed_seconds() * 1e3;
    stats_.kv_budget_target_miss = runner_.kv_budget_target_miss();
    // The full accounting check walks every page: when the scheduler goes quiet, not per step.
    if (quiet) {
      stats_.kv_check = runner_.pages().check_invariants();
      if (stats_.kv_check.empty()) stats_.kv_check = runner_.check_pages();
    }
  }
  // Events: every request that has something, the finished ones last time.
  std::vector<std::pair<RequestSink*, RequestEvent>> out;
  auto collect = [&](Request& r) {
    if (!r.event.finished && r.event.tokens.empty() && r.event.text.empty()) return;
    r.event.id = r.id;
    r.event.n_prompt = r.n_prompt;
    r.event.n_generated = r.n_generated;
    r.event.spec_verifies = r.spec_verifies;
    r.event.spec_drafted = r.spec_drafted;
    r.event.spec_accepted = r.spec_accepted;
    out.emplace_back(&r.sink, std::move(r.event));
    r.event = RequestEvent{};
  };
  for (Owned& r : running_) collect(*r);
  for (Owned& r : *done) collect(*r);
  for (auto& [sink, ev] : out) (*sink)(ev);
  done->clear();  // the finished requests (and their sinks) go now
}

bool ContinuousScheduler::step() {
  std::lock_guard step_lock(step_mu_);
  std::vector<Owned> done;
  drop_cancelled(&done);
  std::vector<Row> rows;
  int64_t budget = step_tokens_;
  if (runner_.prefill_alone()) {
    // A prefill step (one request's prompt chunk, alone) when one is pending and the last step
    // was not one; else a decode step; the other when the first places nothing.
    const bool prefill_first = !last_prefill_ && prefill_pending();
    for (const Phase ph : {prefill_first ? Phase::PrefillOnly : Phase::DecodeOnly,
                           prefill_first ? Phase::DecodeOnly : Phase::PrefillOnly}) {
      phase_ = ph;
      schedule_running(&rows, &budget, &done);
      admit(&rows, &budget, &done);
      if (!rows.empty()) break;
    }
    phase_ = Phase::Any;
    last_prefill_ = prefill_rows(rows) > 0;
  } else {
    schedule_running(&rows, &budget, &done);
    admit(&rows, &budget, &done);
  }
  const bool ran = !rows.empty();
  if (ran) {
    run_rows(rows, &done);
    std::lock_guard sl(stats_mu_);
    ++stats_.n_steps;
  }
  const bool any = ran || !done.empty();
  publish(&done);
  return any;
}

// ---- the loop thread ----

void ContinuousScheduler::start() {
  std::lock_guard lk(mu_);
  DHS_CHECK(!loop_.joinable(), "the scheduler is already started");
  DHS_CHECK(!stopping_, "the scheduler was stopped");
  loop_ = std::thread([this] { loop(); });
}

void ContinuousScheduler::loop() {
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !waiting_.empty() || !cancels_.empty() || n_running_ > 0; });
      if (stopping_ && waiting_.empty() && cancels_.empty() && n_running_ == 0) return;
    }
    try {
      step();
    } catch (const std::exception& e) {
      // A bug in the scheduler itself: end everything rather than spin on it.
      std::fprintf(stderr, "scheduler: %s; aborting every request\n", e.what());
      {
        std::lock_guard lk(mu_);
        abort_all_ = true;
      }
    }
  }
}

void ContinuousScheduler::stop(bool drain) {
  {
    std::lock_guard lk(mu_);
    accepting_ = false;
    stopping_ = true;
    if (!drain) abort_all_ = true;
  }
  cv_.notify_all();
  if (loop_.joinable()) {
    if (loop_.get_id() == std::this_thread::get_id()) return;  // from a sink: the loop ends itself
    loop_.join();
    return;
  }
  // Not started: the caller runs what is left (drain) or the aborts, here.
  while (!idle())
    if (!step()) break;
}

}  // namespace dhs
