#include "engine/runner_tiers.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace dhs {

namespace {
// DHS_ADMIT_LOG: the terms of each admission the hierarchy weighs, on stderr (with the scheduler's lines).
bool admit_log() {
  static const bool on = std::getenv("DHS_ADMIT_LOG") != nullptr;
  return on;
}
}  // namespace

int64_t RunnerTiers::host_pages(const EngineOptions& o, int64_t page_bytes) {
  DHS_CHECK(o.cpu_kv_gb >= 0.0 && o.kv_device_budget >= 0, "the host KV tier and device budget must be >= 0");
  const int64_t pages = static_cast<int64_t>(o.cpu_kv_gb * 1073741824.0) / page_bytes;
  DHS_CHECK(o.cpu_kv_gb == 0.0 || pages > 0, "--cpu-kv-gb {} holds no page of {} bytes", o.cpu_kv_gb, page_bytes);
  DHS_CHECK((o.kv_device_budget == 0 && !o.kv_budget_auto) || pages > 0, "a device KV budget needs the host tier (--cpu-kv-gb)");
  DHS_CHECK(o.kv_budget_io_share >= 0.0 && o.kv_budget_io_share <= 1.0, "--kv-budget-io-share must be in [0, 1], got {}",
            o.kv_budget_io_share);
  DHS_CHECK(o.kv_budget_io_share == 0.0 || o.kv_budget_auto, "--kv-budget-io-share needs --kv-device-budget auto");
  DHS_CHECK(o.kv_recall == "layer" || o.kv_recall == "ahead" || o.kv_recall == "land",
            "--kv-recall must be layer, ahead or land, got '{}'", o.kv_recall);
  DHS_CHECK(o.kv_recall == "layer" || pages > 0, "--kv-recall {} needs the host tier (--cpu-kv-gb)", o.kv_recall);
  return pages;
}

RunnerTiers::RunnerTiers(PagePool& device, std::unique_ptr<PagePool> host, const EngineOptions& o, int n_layers,
                         std::function<int64_t()> clock)
    : host_(std::move(host)), clock_(std::move(clock)), device_(device) {
  // The cyclic order, a cycle per step, pages kept apart by how many steps ago they were used, up to 4.
  kv_ = std::make_unique<TieredKv>(device, *host_, LruParams{n_layers, 4, /*cyclic=*/true});
  budget_ = o.kv_device_budget > 0 ? o.kv_device_budget : TieredKv::kUnlimited;
  if (o.kv_budget_auto) auto_budgets_ = std::make_unique<DeviceBudgets>();
  io_share_ = o.kv_budget_io_share;
  recall_ahead_ = o.kv_recall == "ahead" || o.kv_recall == "land";
  land_ = o.kv_recall == "land";
}

void RunnerTiers::before_step(const std::vector<StepRequest>& batch, const std::function<void(PageTable&)>& prepared) {
  const int64_t now = clock_();
  for (const StepRequest& r : batch)
    if (!kv_->has(*r.table)) kv_->add(*r.table, now, budget_);
  for (const StepRequest& r : batch) kv_->track_new_pages(*r.table, now);
  for (const StepRequest& r : batch) {
    kv_->prepare_append(*r.table, now);
    if (prepared) prepared(*r.table);
  }
  for (const StepRequest& r : batch) kv_->adopt_new_pages(*r.table, now);
}

std::vector<TierStats> RunnerTiers::stats_of(const std::vector<StepRequest>& batch) const {
  std::vector<TierStats> st;
  for (const StepRequest& r : batch) st.push_back(kv_->request_stats(*r.table));
  return st;
}

// The cache manager (kv/device_budgets.h): each decode row's pages read and missed this step
// observed, then budgets for the batch's requests over the device pages they can share (free
// slots and the full pages they hold; other requests' pages stay as they are).
void RunnerTiers::after_step(const std::vector<StepRequest>& batch, const std::vector<TierStats>& before) {
  DHS_CHECK(before.size() == batch.size(), "RunnerTiers::after_step: {} stats for a batch of {}", before.size(), batch.size());
  std::vector<DeviceBudgets::Request> reqs;
  // The device pages the batch shares: free slots, the full pages it holds, and the slots its step
  // landed pages in that the host has not adopted yet (the CUDA runner adopts them while the next
  // step runs: they are this batch's pages already). Without the last, the budgets came out short
  // by the step's landings whenever they bound, and the adoption then evicted as many pages.
  int64_t capacity = device_.n_free() + kv_->landing_claimed();
  // Each decode row's pages read and missed this step (-1: not a decode row).
  std::vector<int64_t> read_of(batch.size(), -1), missed_of(batch.size(), 0);
  int64_t read_all = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].n_new != 1 || batch[i].verify) continue;
    // Misses: the pages the step recalled for its layers, or (recall ahead) read in place.
    const TierStats now = kv_->request_stats(*batch[i].table);
    missed_of[i] = recall_ahead_ ? now.late - before[i].late : now.recalled - before[i].recalled;
    read_of[i] = now.hits - before[i].hits + missed_of[i];
    read_all += read_of[i];
  }
  // The link rule (budget_target_miss): the misses the budgets allow priced against the step.
  if (auto_budgets_ && io_share_ > 0.0 && decode_seconds_ > 0.0 && read_all > 0) {
    const double price = step_page_seconds();
    if (price > 0.0)
      auto_budgets_->set_target_miss(io_share_ * decode_seconds_ / ((recall_ahead_ ? 2.0 : 1.0) * price * static_cast<double>(read_all)));
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    const PageTable& t = *batch[i].table;
    const int64_t id = static_cast<int64_t>(t.id());
    const int64_t lists = static_cast<int64_t>(t.n_layers()) * t.n_heads_kv();
    Demand& d = demand_[t.id()];
    d.full_pages = t.n_tokens() / t.page_size() * lists;
    if (read_of[i] >= 0) {
      const int64_t missed = missed_of[i];
      const double read = static_cast<double>(read_of[i]);
      // (a draft row reads the draft's pages; a request that only drafts and verifies stays
      // unobserved, counted at the read fraction of the others; a step that counted no read of
      // its own says nothing, as DeviceBudgets::observe has it: until session 35 the CUDA runner
      // counted a decode row's reads only in decode-only steps — in a step with a prefill chunk
      // they were 0, and under the serving load every request came out observed with a working
      // set of 0, so admission saw every working set fit, session 34; with
      // CudaModelOptions::mixed_decode_attention off they still are)
      if (!batch[i].draft && read > 0.0) d.working_set = d.working_set < 0.0 ? read : 0.7 * d.working_set + 0.3 * read;
      if (auto_budgets_) auto_budgets_->observe(id, read_of[i], missed);
    }
    if (!auto_budgets_) continue;
    reqs.push_back({id, d.full_pages});
    capacity += kv_->movable_resident_pages(t);
  }
  if (!auto_budgets_) return;
  std::vector<int64_t> b = auto_budgets_->budgets(reqs, capacity, &budgets_bound_);
  std::vector<PageTable*> tables;
  for (size_t i = 0; i < batch.size(); ++i) {
    tables.push_back(batch[i].table);
    if (b[i] == DeviceBudgets::kUnlimited) b[i] = TieredKv::kUnlimited;
  }
  // (all at once: one selection over the LRU, not one per request — 16 of them took ~5 ms a step
  // under the serving load)
  kv_->set_budgets(tables, b, clock_());
}

bool RunnerTiers::truncate(PageTable& t, int64_t n_tokens) {
  if (!kv_->has(t)) return false;
  kv_->truncate(t, n_tokens, clock_());
  return true;
}

bool RunnerTiers::release(PageTable& t) {
  if (auto_budgets_) auto_budgets_->forget(static_cast<int64_t>(t.id()));
  demand_.erase(t.id());
  if (!kv_->has(t)) return false;
  kv_->release(t);
  return true;
}

double RunnerTiers::measure_host_copy_gbps() {
  // 64 MiB, the best of three copies (the first touches the pages).
  const size_t n = size_t{64} << 20;
  std::vector<char> a(n, 1), b(n, 0);
  double best = 0.0;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, static_cast<double>(n) / s / 1e9);
    a[static_cast<size_t>(i)] = b[n - 1 - static_cast<size_t>(i)];  // (keeps the copies observable)
  }
  return best > 0 ? best : 1.0;
}

void RunnerTiers::set_io_rate(double gbps, int64_t page_bytes) {
  DHS_CHECK(gbps > 0.0 && page_bytes > 0, "the host tier's link rate must be > 0 GB/s, got {}", gbps);
  io_gbps_ = gbps;
  page_bytes_ = page_bytes;
  io_cost_.set_link_page_seconds(static_cast<double>(page_bytes) / (gbps * 1e9));
}

void RunnerTiers::end_step_io(double step_seconds, double host_seconds, int64_t decode_rows, int64_t prefill_tokens) {
  const TierStats& t = kv_->totals();
  const int64_t pages = t.recalled + t.offloaded + t.late;
  const int64_t moved = pages - io_pages_seen_;
  io_pages_seen_ = pages;
  // (a miss: a page a step read that was not in the device tier — read in place on the
  // recall-ahead schedule, recalled on the layer schedule)
  const int64_t misses_total = recall_ahead_ ? t.late : t.recalled;
  const int64_t misses = misses_total - misses_seen_;
  misses_seen_ = misses_total;
  if (io_gbps_ <= 0.0 || step_seconds <= 0.0) return;
  // The throughput rule weighs decode steps (what a running request's every step costs; a
  // prefill chunk's time says little about them: session 34's serving run admitted all 16
  // requests against prefill steps several times a decode step's). Its fit sees two decode
  // steps at a time (this one and the last): a step's late pages cost it their reads and the
  // next step the recalls and adoptions run in flight beside it, so steps alternate between many
  // pages counted and the time they cost (docs/hierarchy.md).
  const bool decode = decode_rows > 0 && prefill_tokens == 0;
  const StepSample now{static_cast<double>(decode_rows), static_cast<double>(prefill_tokens), static_cast<double>(moved), step_seconds};
  if (decode && last_sample_.seconds > 0.0)
    step_cost_.observe(now.rows + last_sample_.rows, 0.0, now.pages + last_sample_.pages, now.seconds + last_sample_.seconds);
  last_sample_ = decode ? now : StepSample{};
  if (decode) {
    decode_moved_avg_ = decode_seconds_ > 0.0 ? 0.7 * decode_moved_avg_ + 0.3 * static_cast<double>(moved) : static_cast<double>(moved);
    decode_seconds_ = decode_seconds_ > 0.0 ? 0.7 * decode_seconds_ + 0.3 * step_seconds : step_seconds;
  }
  miss_avg_ = 0.7 * miss_avg_ + 0.3 * static_cast<double>(misses);
  io_cost_.observe(moved, static_cast<double>(moved) * io_cost_.link_page_seconds() + std::max(host_seconds, 0.0));
  // (the pages' share at their fitted price: the host's fixed cost a step, which admitting or
  // waiting does not change, is not load)
  const double load = static_cast<double>(moved) * io_cost_.per_page_seconds() / step_seconds;
  io_load_ = 0.7 * io_load_ + 0.3 * load;
  step_seconds_ = step_seconds_ > 0.0 ? 0.7 * step_seconds_ + 0.3 * step_seconds : step_seconds;
}

double RunnerTiers::overflow_added(int64_t pages) const {
  // What each request must keep resident: its working set, and with the cache manager's budgets
  // (--kv-device-budget auto) its buffer on top, W (1 + b) — what the manager sizes to hold the
  // misses near its target as the working set moves from step to step (at 16 requests whose
  // one-step working sets came to ~1.1 pools, the serving run's hit rate was 0.87, session 34).
  // A request not observed yet, and the new one, at the observed buffers' mean (the manager's
  // initial one when none is).
  double observed = 0.0, observed_full = 0.0, unobserved_full = 0.0, resident = 0.0, buffers = 0.0;
  int64_t n_observed = 0;
  for (const auto& [id, d] : demand_) {
    if (d.working_set >= 0.0) {
      const double b = auto_budgets_ ? auto_budgets_->state(static_cast<int64_t>(id)).buffer : 0.0;
      observed += d.working_set;
      resident += d.working_set * (1.0 + b);
      observed_full += static_cast<double>(d.full_pages);
      buffers += b;
      ++n_observed;
    } else {
      unobserved_full += static_cast<double>(d.full_pages);
    }
  }
  const double frac = observed_full > 0.0 ? std::min(1.0, observed / observed_full) : 1.0;
  const double b_new = !auto_budgets_ ? 0.0 : n_observed > 0 ? buffers / static_cast<double>(n_observed) : BudgetParams{}.buffer;
  const double cap = static_cast<double>(device_.n_pages());
  // (the working sets, or, where the steps already miss, at least the pool plus their misses: a
  // working set moves from step to step, so the pool can be oversubscribed before their
  // one-step sizes add up to it — the serving run's hit rate was 0.87 with working sets of ~1.1
  // times the pool, session 34 — and then the new request's whole working set adds to the misses)
  // (only with the pool full — the cache manager's budgets cut by its capacity, or no page free:
  // misses under budgets that left pages free are those budgets' churn, not the pool's; counting
  // them as a full pool, whenever the manager set budgets at all, held the serving run of session
  // 35 at 5 requests with ~100k of its 180k pages free and 0.8% of the reads missing)
  const bool full = (auto_budgets_ != nullptr && budgets_bound_) || device_.n_free() == 0;
  const double before =
      std::max(resident + frac * (1.0 + b_new) * unobserved_full, full && miss_avg_ > 0.5 ? cap + miss_avg_ : 0.0);
  const double after = before + frac * (1.0 + b_new) * static_cast<double>(std::max<int64_t>(pages, 0));
  const double more = std::max(0.0, after - cap) - std::max(0.0, before - cap);  // pages crossing per step
  // (pages as end_step_io counts them: on the recall-ahead schedule a miss is a late read and a
  // recall — with landing too, where the landed page is counted as both — on the layer schedule a
  // recall, its victim dropped where it has a clean host copy)
  const double crossings = recall_ahead_ ? 2.0 : 1.0;
  if (admit_log())
    std::fprintf(stderr, "admit: overflow: observed %.0f of %.0f (%lld requests), unobserved %.0f, frac %.3f, buffer %.2f, before %.0f after %.0f pool %.0f misses %.1f\n",
                 observed, observed_full, static_cast<long long>(n_observed), unobserved_full, frac, b_new, before, after, cap, miss_avg_);
  return crossings * more;
}

double RunnerTiers::io_load_admitting(int64_t pages) const {
  const double more = overflow_added(pages);
  if (more <= 0.0) return io_load_;
  if (io_gbps_ <= 0.0 || step_seconds_ <= 0.0) return io_load_ + 1.0;  // (no rate or no step measured yet: as full)
  return io_load_ + more * io_cost_.per_page_seconds() / step_seconds_;
}

double RunnerTiers::step_page_seconds() const {
  const StepCost::Fit f = step_cost_.fit();
  return std::max(io_cost_.per_page_seconds(), f.ok && f.pages_vary ? f.per_page : 0.0);
}

double RunnerTiers::step_fixed_seconds() const {
  const StepCost::Fit f = step_cost_.fit();
  return f.ok && f.fixed_known ? 0.5 * f.fixed : -1.0;  // (the fit is over pairs of steps)
}

bool RunnerTiers::admitting_pays(int64_t pages, int64_t running) const {
  const double more = overflow_added(pages);
  if (more <= 0.0) return true;
  if (io_gbps_ <= 0.0 || decode_seconds_ <= 0.0) return false;  // (no decode step measured yet: nothing known to share)
  // (n + 1) / (T + t + X) >= n / T with T = fixed + n t + io: fixed + io >= n X.
  // (the I/O the steps carry now and what the request adds, at the same price)
  const double price = step_page_seconds();
  const double io = std::min(decode_moved_avg_ * price, decode_seconds_);
  const double fixed = std::clamp(step_fixed_seconds(), 0.0, decode_seconds_ - io);
  if (admit_log())
    std::fprintf(stderr, "admit: more %.0f pages a step, price %.3f us, decode step %.3f ms, io %.3f ms, fixed %.3f ms, misses %.0f\n",
                 more, price * 1e6, decode_seconds_ * 1e3, io * 1e3, fixed * 1e3, miss_avg_);
  return fixed + io >= static_cast<double>(std::max<int64_t>(running, 1)) * more * price;
}

TierCounts RunnerTiers::counts() const {
  TierCounts c;
  const TierStats& t = kv_->totals();
  c.hits = static_cast<uint64_t>(t.hits);
  c.late = static_cast<uint64_t>(t.late);
  c.recalled = static_cast<uint64_t>(t.recalled);
  c.offloaded = static_cast<uint64_t>(t.offloaded);
  c.dropped = static_cast<uint64_t>(t.dropped);
  c.host_used = host_->n_used();
  return c;
}

}  // namespace dhs
