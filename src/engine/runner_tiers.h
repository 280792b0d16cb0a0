// The KV hierarchy as a step runner keeps it (issue 23): the host tier's page accounting, the
// TieredKv over the runner's pool and it, the per-request budgets (fixed, or the cache
// manager's: kv/device_budgets.h) and what the StepRunner interface asks of a hierarchy
// (make_room, swap, truncate, release, counts). One class for both backends: the CPU runner's
// pools hold their bytes; the CUDA runner's are accounting only and its mover copies HBM and
// pinned DRAM (TieredKv::set_mover).
//
// The clock ticks once per layer: step s, layer l is s * n_layers + l (the model's; `clock`
// returns the next step's start), the LRU's cyclic order with a cycle per step.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "dhisparse/engine.h"
#include "dhisparse/kv_stats.h"
#include "engine/step_runner.h"
#include "kv/device_budgets.h"
#include "kv/io_cost.h"
#include "kv/page_pool.h"
#include "kv/step_cost.h"
#include "kv/tiered_kv.h"

namespace dhs {

class RunnerTiers {
 public:
  // The host tier's pages for o.cpu_kv_gb at page_bytes each (0: none), after checking the
  // options that go with it (budgets and --kv-recall need the tier).
  static int64_t host_pages(const EngineOptions& o, int64_t page_bytes);

  // device: the pool steps read (Tier::Device); host: the host tier's pool (Tier::Host).
  RunnerTiers(PagePool& device, std::unique_ptr<PagePool> host, const EngineOptions& o, int n_layers,
              std::function<int64_t()> clock);

  TieredKv& kv() { return *kv_; }
  const TieredKv& kv() const { return *kv_; }
  PagePool& host() { return *host_; }
  bool recall_ahead() const { return recall_ahead_; }
  // --kv-recall land: the recall-ahead schedule with landing (kv/tier_land.h; the CUDA backend).
  bool land() const { return land_; }
  int64_t clock() const { return clock_(); }

  // Before a step: every table registered and its new pages tracked, then the pages each
  // appends into resident (a rollback may have left one in the host tier; `prepared` is called
  // for each table after that), and budgets kept.
  void before_step(const std::vector<StepRequest>& batch, const std::function<void(PageTable&)>& prepared = {});
  // After it: the cache manager's budgets from the step's decode rows (no-op without it).
  // `before` is the batch's request_stats taken before the step (stats_of).
  std::vector<TierStats> stats_of(const std::vector<StepRequest>& batch) const;
  void after_step(const std::vector<StepRequest>& batch, const std::vector<TierStats>& before);
  // The cache manager's miss target under the link rule (EngineOptions::kv_budget_io_share s > 0):
  // the misses a decode step may carry are those whose crossings (2 a miss on the recall-ahead
  // schedule, 1 on the layer one, as end_step_io counts them) take s of the measured decode step T
  // at a page's price p (step_page_seconds): target = s T / (crossings p R), R the pages the
  // step's decode rows read; set before the step's rows are observed, kept within BudgetParams'
  // bounds. Before a decode step and a price are measured, the fixed target stays. The target in
  // force (0 without the cache manager).
  double budget_target_miss() const { return auto_budgets_ ? auto_budgets_->target_miss() : 0.0; }

  // StepRunner's hierarchy calls. truncate / release: false when the table is not registered
  // (the caller frees it in its pool).
  bool truncate(PageTable& t, int64_t n_tokens);
  bool release(PageTable& t);
  bool make_room(int64_t n) { return kv_->make_room(n, clock_()); }
  int64_t reclaimable() const { return kv_->reclaimable(); }
  bool swap_out(PageTable& t) {
    if (!(kv_->has(t) && kv_->swap_out(t, clock_()))) return false;
    demand_.erase(t.id());  // (it reads nothing until swap_in; observed again after)
    return true;
  }
  int64_t swap_in_pages(const PageTable& t) const { return kv_->has(t) && kv_->swapped(t) ? kv_->swap_in_pages(t) : 0; }
  bool swap_in(PageTable& t) { return !kv_->has(t) || kv_->swap_in(t, clock_()); }
  TierCounts counts() const;
  std::string check() const { return kv_->check_invariants(); }

  // The I/O load (StepRunner::kv_io_load): the share of each step the pages it moved or read in
  // place took, each at its fitted price (IoCost: its bytes over the link's `gbps`, or more when
  // the host's time in the hierarchy — end_step_io's host_seconds — grows with the pages moved),
  // averaged (the newest step 0.3). The rate: EngineOptions::kv_io_gbps, or the runner's
  // measurement.
  void set_io_rate(double gbps, int64_t page_bytes);
  // GB/s of one bulk copy between two host buffers (the CPU backend's link between its tiers).
  static double measure_host_copy_gbps();
  // host_seconds: the host's time in the hierarchy's calls during the step, outside the model's
  // layers (the runner's measurement; IoCost fits it against the pages moved). decode_rows and
  // prefill_tokens: what the step computed (StepCost fits the whole step's seconds against them
  // and the pages moved: admitting_pays).
  void end_step_io(double step_seconds, double host_seconds = 0.0, int64_t decode_rows = 0, int64_t prefill_tokens = 0);
  double io_load() const { return io_load_; }
  // IO-aware admission's prediction (StepRunner::kv_io_load_admitting): the I/O load with one
  // more request of `pages` pages running. Each running request reads its working set a step
  // (measured over its decode steps; a request not observed yet, its pages times the read
  // fraction observed — pages read over pages held — or all of them when nothing is observed),
  // the new one its pages times that fraction. What the working sets hold beyond the device
  // pool crosses the link every step (counted twice on the recall-ahead schedule, landing
  // included: a late read and a recall; once with layer recalls), so the load grows by the increase of that
  // overflow times a page's measured cost (IoCost: at least its bytes at the link's rate) over
  // the measured step time. A cold page offloaded for the new request (no working set reads it)
  // costs nothing per step.
  double io_load_admitting(int64_t pages) const;
  // IO-aware admission's throughput rule (StepRunner::kv_admitting_pays): whether the batch's
  // decode tokens per second stay at least what they are with one more request of `pages` pages
  // beside the `running` ones. With a decode step as fixed + per-row × rows + I/O (StepCost over
  // pairs of decode steps), one more row pays while fixed + io ≥ running × added, where added is
  // the pages the working sets would then put on the link every step (as io_load_admitting counts
  // them) at a page's price — the larger of IoCost's and the decode steps' fitted slope — and io
  // the I/O the decode steps carry now. Where the fixed part is not known (the rows have not
  // varied) it counts as 0, which admits no request that adds I/O, and before any decode step
  // nothing adding I/O is admitted; a request that adds none always pays.
  bool admitting_pays(int64_t pages, int64_t running) const;
  // The fitted step (StepCost::fit, over pairs of consecutive steps: its fixed part is two
  // steps') and the price admitting_pays puts on a page, in seconds.
  StepCost::Fit step_fit() const { return step_cost_.fit(); }
  double step_page_seconds() const;
  // One step's fitted fixed part in seconds (< 0 while not known).
  double step_fixed_seconds() const;
  double io_gbps() const { return io_gbps_; }
  const IoCost& io_cost() const { return io_cost_; }

 private:
  // Pages a step more would put on the link with one more request of `pages` pages running (the
  // working sets beyond the pool, each crossing counted as end_step_io counts it).
  double overflow_added(int64_t pages) const;
  std::unique_ptr<PagePool> host_;
  std::unique_ptr<TieredKv> kv_;
  std::function<int64_t()> clock_;
  int64_t budget_ = TieredKv::kUnlimited;        // device pages per request
  std::unique_ptr<DeviceBudgets> auto_budgets_;  // --kv-device-budget auto
  double io_share_ = 0.0;                        // --kv-budget-io-share (0: the fixed miss target)
  bool recall_ahead_ = false;                    // --kv-recall ahead (or land)
  bool land_ = false;                            // --kv-recall land
  IoCost io_cost_;
  StepCost step_cost_;
  double io_gbps_ = 0.0, io_load_ = 0.0, step_seconds_ = 0.0;  // (step_seconds_: an average, as io_load_)
  // Decode steps (no prefill rows): their seconds and pages moved or read in place, averages as io_load_.
  double decode_seconds_ = 0.0, decode_moved_avg_ = 0.0;
  double miss_avg_ = 0.0;   // pages a step read that were not in the device tier, an average as io_load_
  bool budgets_bound_ = false;  // the cache manager's last budgets were cut by the pool (DeviceBudgets::budgets)
  int64_t misses_seen_ = 0;
  struct StepSample {
    double rows = 0.0, tokens = 0.0, pages = 0.0, seconds = 0.0;
  };
  StepSample last_sample_;  // the last step when it decoded (the step cost is fitted over pairs of decode steps)
  // What each registered request reads a step (io_load_admitting), by PageTable::id.
  struct Demand {
    double working_set = -1.0;  // pages read per decode step, an average (the newest 0.3); < 0: none observed
    int64_t full_pages = 0;     // full pages it holds, both tiers
  };
  std::unordered_map<uint64_t, Demand> demand_;
  int64_t page_bytes_ = 0, io_pages_seen_ = 0;   // pages moved or read in place counted so far
  PagePool& device_;
};

}  // namespace dhs
