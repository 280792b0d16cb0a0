// Decode throughput of the Llama-3.1-8B shape with the KV hierarchy on the GPU (issue 23,
// docs/hierarchy.md "The throughput-beyond-HBM bench"). Random weights and KV, the engine's own
// hierarchy code: LlamaCuda with a host tier (split attention: HBM pages, then the late ones in
// place from pinned DRAM, merged by LSE), RunnerTiers' TieredKv over the two pools, and the CUDA
// runner's after-step (recall_after_decode: hits touched, late reads noted, recalled ahead).
//
// What the bench replays: random keys select the same pages every step, so the churn of a real
// model's selections (which pages a step reads that were not resident) is replayed — before each
// timed step a fraction `churn` of the pages the last step read is evicted (a clean drop: they
// came from the host tier and keep their copy, as in a real run's steady state) and as many other
// pages of the request recalled in their place (its budget full again), so the step reads them in
// place, then recalls them, evicting its least recently used pages: what a step whose selection
// moved by that much does. (The replay's own moves are not timed.)
// Budgets: per (layer, KV head), the fractions of a real model's trace (--trace), as in
// `dhisparse bench`.
//
// Phases per batch: warm-up steps (the first reads everything late and recalls it; budgets are
// set from its reads), resident steps (no churn: every read a hit), then the timed steps with
// churn. A step's time is the forward (graph replay, synchronized) plus the after-step host work
// and recalls (synchronized): the wall time a serving loop would see.
#include "bench/hierarchy_bench.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_page_pool.h"
#include "backend/cuda/page_recall.h"
#include "bench/bench_policy.h"
#include "bench/device_rates.h"
#include "core/error.h"
#include "engine/cuda_tiers.h"
#include "engine/runner_tiers.h"
#include "model/arch/llama_cuda.h"
#include "model/model_shapes.h"

namespace dhs {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

constexpr int kWarmSteps = 3, kResidentSteps = 3;

struct BatchResult {
  double step_ms = 0, forward_ms = 0, after_ms = 0, resident_ms = 0;
  // The forward's wall time by phase (LlamaCuda::Phases) and the after-step's: the host's
  // bookkeeping until recall_after_decode returns (copies launched, the mover's waits between
  // its calls included), then the wait for the copies left.
  double fwd_before_ms = 0, fwd_gpu_ms = 0, fwd_after_ms = 0, after_host_ms = 0, after_wait_ms = 0;
  double recalls_in_flight_ms = 0;  // of fwd_gpu_ms: the last step's recalls, run while the step ran (overlap)
  TieredKv::AfterStepTimes kv_times;  // the tiers' after-step host time by part, per step
  double read_frac = 0;
  TierStats tiers;  // over the timed steps
  int64_t late_overflow_steps = 0;
  int64_t overlapped_steps = 0;  // timed steps with the landing beside the resident attention
  double reserve_ms = 0;         // of after_host_ms: the next step's landing slots set aside (reserve_landing)
  double patch_ms = 0;           // of after_host_ms: the LRU mirror's patch staged (DHS_LRU_MIRROR)
};

}  // namespace

int run_hierarchy_bench(const HierarchyBenchOptions& opts) {
  if (cuda::device_count() == 0) {
    std::printf("SKIP: no GPU\n");
    return 77;
  }
  DHS_CHECK(opts.churn >= 0.0 && opts.churn < 1.0, "--churn must be in [0, 1), got {}", opts.churn);
  DHS_CHECK(opts.buffer >= 0.0, "--buffer must be >= 0, got {}", opts.buffer);
  DHS_CHECK(opts.steps >= 1, "--steps must be >= 1");
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  const double copy_gbps = measure_copy_gbps(), pcie_gbps = measure_h2d_gbps();
  std::printf("gpu %s, device copy %.0f GB/s (read+write), host -> device %.1f GB/s\n", prop.name, copy_gbps, pcie_gbps);
  const ModelConfig cfg = model_shape("llama3-8b");
  const BenchPolicy bp = parse_bench_policy(opts.policy, opts.trace, opts.trace_len, cfg);
  DHS_CHECK(bp.reselect_every == 1, "--hierarchy: reselection (/R) is not supported with the host tier");
  const int L = static_cast<int>(cfg.n_layers), Hkv = static_cast<int>(cfg.n_heads_kv), P = 16;
  const int64_t lists = int64_t{L} * Hkv;
  const int64_t page_bytes = 2 * int64_t{P} * cfg.head_dim * 2;  // K + V, f16
  const int64_t total_steps = kWarmSteps + kResidentSteps + opts.steps;
  const int64_t max_ctx = opts.ctx + total_steps + P;
  const int64_t pages_per_req = (max_ctx + P - 1) / P * lists;
  const bool tiered = opts.host_kv_gib > 0.0;
  const int64_t dev_pages = opts.hbm_kv_gib > 0.0 ? static_cast<int64_t>(opts.hbm_kv_gib * 1073741824.0) / page_bytes : 0;
  EngineOptions eo;
  eo.cpu_kv_gb = opts.host_kv_gib;
  eo.kv_recall = tiered ? "ahead" : "layer";
  const int64_t host_pages = RunnerTiers::host_pages(eo, page_bytes);

  std::vector<int64_t> batches = opts.batch;
  if (batches.empty()) {
    DHS_CHECK(!tiered && dev_pages > 0, "--hierarchy: give --batch with the host tier or without an HBM cap");
    batches = {dev_pages / pages_per_req};
    DHS_CHECK(batches[0] >= 1, "--hierarchy: one request of {} tokens needs {} pages, the cap holds {}", opts.ctx, pages_per_req,
              dev_pages);
  }
  std::ofstream jl(opts.out, std::ios::app);
  for (const int64_t batch : batches) {
    CudaModelOptions o;
    o.random_weights = "f16";
    o.max_batch = static_cast<int>(batch);
    o.max_step_tokens = std::max<int>(64, static_cast<int>(batch));
    o.max_context = max_ctx;
    o.n_pages = dev_pages;
    if (dev_pages == 0) o.gpu_memory_utilization = 0.92;
    o.host_pages = host_pages;
    // The landing beside the resident part's attention where the rule takes it (the engine's
    // default, auto; DHS_LAND_OVERLAP=off|on|auto: CudaModelOptions::land_overlap)
    o.land_overlap = land_overlap_env(LandOverlapRule{LandOverlapRule::Mode::Auto});
    o.summaries = needs_minmax(opts.policy) ? "minmax" : "none";
    o.key_sketch = chosen_by_sketch(without_reselect(opts.policy));
    auto m = std::make_unique<LlamaCuda>(cfg, 1234, o);
    m->kv_pool().fill_random(99, -1.0f, 1.0f, m->stream());
    if (cuda::HostPagePool* hp = m->host_pool()) {  // written over PCIe by a kernel: seconds, not minutes
      cuda::fill_random_f16(hp->k_d(), static_cast<size_t>(hp->n_pages()) * hp->page_elems(), 96, -1.0f, 1.0f, m->stream());
      cuda::fill_random_f16(hp->v_d(), static_cast<size_t>(hp->n_pages()) * hp->page_elems(), 95, -1.0f, 1.0f, m->stream());
    }
    if (auto* sm = m->summaries(cuda::SummaryKind::MinMax)) cuda::fill_random_f16(sm->data_d(), sm->bytes() / 2, 98, -1.0f, 1.0f, m->stream());
    if (auto* sk = m->key_sketch()) {  // random codes, steps of 0 (any finite value costs the same)
      cuda::fill_random_f16(reinterpret_cast<__half*>(sk->codes_d()), sk->code_bytes() / 2, 97, -1.0f, 1.0f, m->stream());
      DHS_CUDA_CHECK(cudaMemsetAsync(sk->steps_d(), 0, sk->bytes() - sk->code_bytes(), m->stream()));
    }
    DHS_CUDA_CHECK(cudaStreamSynchronize(m->stream()));
    m->set_sparsity(bp.spec, bp.frac);
    const int64_t n_dev = m->allocator().n_pages();
    if (!tiered && batch * pages_per_req > n_dev) {
      std::printf("ctx %lld batch %lld: %lld pages do not fit the HBM pool of %lld\n", static_cast<long long>(opts.ctx),
                  static_cast<long long>(batch), static_cast<long long>(batch * pages_per_req), static_cast<long long>(n_dev));
      continue;
    }

    int64_t steps_done = 0;
    std::unique_ptr<RunnerTiers> tiers;
    if (tiered) {
      tiers = std::make_unique<RunnerTiers>(
          m->allocator(), std::make_unique<PagePool>(Tier::Host, host_pages, P, static_cast<int>(cfg.head_dim), false), eo, L,
          [&steps_done, L] { return (steps_done + 1) * L; });
      LlamaCuda* mp = m.get();
      tiers->kv().set_mover([mp](const PagePool& src, PagePool& dst, std::span<const PageMove> mv) { return mp->move_pages(src, dst, mv); });
      tiers->kv().set_relocate_hook([mp](const PageTable& t, int l, int h, int64_t i) { mp->patch_table(t, l, h, i); });
      // (DHS_LRU_MIRROR=1: the LRU mirrored in HBM, as --kv-lru-mirror on: the A/B of the stamps' scan)
      if (lru_mirror_env(false)) mirror_lru(tiers->kv(), *m);
    }
    // The requests: ctx tokens of random KV each. With the host tier, as many of each request's
    // first pages in HBM as its share of the pool allows (at most half of it: the rest stays
    // free for recalls), the others in the host tier; then the page each list appends into, in HBM.
    std::vector<std::unique_ptr<PageTable>> ts;
    std::vector<PageTable*> tables;
    std::vector<int32_t> tok(static_cast<size_t>(batch), 42);
    std::vector<StepRequest> reqs;
    std::vector<LlamaCuda::Seq> seqs;
    for (int64_t r = 0; r < batch; ++r) {
      ts.push_back(std::make_unique<PageTable>(L, Hkv, P));
      PageTable& t = *ts.back();
      if (tiered) {
        const int64_t dev_tokens = std::min<int64_t>(opts.ctx, (n_dev / 2 / batch / lists) * P);
        const int64_t host_tokens = opts.ctx - dev_tokens;
        DHS_CHECK(host_tokens / P * lists <= tiers->host().n_free(), "--hierarchy: the host tier holds {} pages, batch {} at {} needs more",
                  host_pages, batch, opts.ctx);
        // (reserve: room for n tokens past the committed ones)
        if (dev_tokens > 0) {
          DHS_CHECK(t.reserve(m->allocator(), dev_tokens), "--hierarchy: HBM reserve");
          t.commit(dev_tokens);
        }
        if (host_tokens > 0) {
          DHS_CHECK(t.reserve(tiers->host(), host_tokens), "--hierarchy: host reserve");
          t.commit(host_tokens);
        }
      } else {
        DHS_CHECK(t.reserve(m->allocator(), opts.ctx), "--hierarchy: HBM reserve");
        t.commit(opts.ctx);
      }
      tables.push_back(&t);
      reqs.push_back(StepRequest{.table = &t, .slot = static_cast<int>(r), .tokens = &tok[static_cast<size_t>(r)], .n_new = 1});
      seqs.push_back(LlamaCuda::Seq{&t, static_cast<int>(r), &tok[static_cast<size_t>(r)], 1});
    }

    std::mt19937_64 rng(7);
    BatchResult res;
    std::vector<double> step_ms, fwd_ms, after_ms, resident_ms, ph_before, ph_gpu, ph_after, ph_while, aft_host, aft_wait;
    TieredKv::AfterStepTimes kv_times;  // summed over the timed steps
    double reserve_sum_ms = 0;          // reserve_landing, summed over the timed steps
    double patch_sum_ms = 0;            // the LRU mirror's patches, summed over the timed steps
    // The last step's recalls, not run yet (overlap: they run in the next step's forward, in flight).
    std::unique_ptr<DeferredRecalls> recalls;
    if (tiers) recalls = std::make_unique<DeferredRecalls>(*tiers);
    TierStats before_timed, replay;
    int64_t last_claims = int64_t{1} << 16, landed = 0;  // (landing: the last step's claims; landings timed)  // (replay: the churn replay's own moves, not the steps')
    for (int64_t s = 0; s < total_steps; ++s) {
      const bool timed = s >= kWarmSteps + kResidentSteps, resident = s >= kWarmSteps && !timed;
      // Room for the token: a new page per list every P steps (offloading cold pages for it).
      for (PageTable* t : tables)
        if (t->capacity_tokens() < t->n_tokens() + 1) {
          if (tiers) DHS_CHECK(tiers->make_room(lists), "--hierarchy: no room in HBM for a new page per list");
          DHS_CHECK(t->reserve(m->allocator(), 1), "--hierarchy: HBM reserve of a step's page");
        }
      if (tiers) tiers->before_step(reqs);
      if (timed && s == kWarmSteps + kResidentSteps) {
        before_timed = tiers ? tiers->kv().totals() : TierStats{};
        m->reset_sparsity_stats();
      }
      // Landing: slots for this step's late pages (the last step's claims and a margin), timed
      // with the after-step (it is the host's bookkeeping of the cycle).
      double reserve_ms = 0;
      if (tiers && opts.land) {
        const auto tr = Clock::now();
        const int64_t want = std::min<int64_t>(LlamaCuda::kLandMax, last_claims + last_claims / 4 + 256);
        const std::vector<int32_t> stack = tiers->kv().reserve_landing(want, tiers->clock());
        m->set_landing_slots(stack);
        reserve_ms = ms_since(tr);
      }
      double patch_ms = 0;  // (the LRU mirror's patch: the host's part of the cycle, as the reservation)
      if (tiers) {
        const auto tp = Clock::now();
        patch_lru(tiers->kv(), *m, tiers->clock() + L - 1);
        patch_ms = ms_since(tp);
      }
      DHS_CUDA_CHECK(cudaDeviceSynchronize());
      const auto t0 = Clock::now();
      m->forward(seqs, nullptr, true, recalls ? recalls->in_flight() : std::function<void()>{});
      if (recalls) recalls->rethrow_in_flight();
      const double f = ms_since(t0);
      const LlamaCuda::Phases ph = m->last_phases();
      // The slots the step read, for the churn below: taken before the tiers take the step's
      // record (with the LRU mirror its buffer becomes the LRU's, changed by the recalls).
      const bool churn_next = tiers && s + 1 >= kWarmSteps + kResidentSteps && s + 1 < total_steps && opts.churn > 0.0;
      std::vector<int32_t> read_now;
      if (churn_next) read_now = m->read_slots();
      const auto t1 = Clock::now();
      double a_host = 0;
      if (tiers) {
        // The step's reads now; its recalls in the next step's forward (overlap; not before the
        // budgets are set from the first step's reads), or now.
        recalls->after_decode(*m, tables, tiers->clock() + L - 1);
        if (!opts.overlap_recalls || s == 0) recalls->flush();
        a_host = ms_since(t1);
        DHS_CUDA_CHECK(cudaDeviceSynchronize());
      }
      const double a = ms_since(t1) + reserve_ms + patch_ms;
      last_claims = m->landing_claims();
      if (timed) landed += static_cast<int64_t>(m->landings().size());
      ++steps_done;
      if (tiers && m->late_log_overflowed()) ++res.late_overflow_steps;
      if (timed && m->last_step_overlapped()) ++res.overlapped_steps;
      if (tiers && s == 0) {
        // Budgets from the first step's reads: what each request read, times (1 + buffer).
        for (PageTable* t : tables) {
          const TierStats rs = tiers->kv().request_stats(*t);
          const int64_t w = rs.hits + rs.late;
          tiers->kv().set_budget(*t, static_cast<int64_t>(std::ceil(static_cast<double>(w) * (1.0 + opts.buffer))), tiers->clock());
        }
      }
      if (resident) resident_ms.push_back(f + a);
      if (timed) {
        step_ms.push_back(f + a);
        fwd_ms.push_back(f);
        after_ms.push_back(a);
        ph_before.push_back(ph.before_ms);
        ph_gpu.push_back(ph.gpu_ms);
        ph_after.push_back(ph.after_ms);
        ph_while.push_back(ph.while_ms);
        if (tiers) {
          const TieredKv::AfterStepTimes& k = tiers->kv().after_step_times();
          kv_times.scan_ms += k.scan_ms, kv_times.adopt_ms += k.adopt_ms, kv_times.budgets_ms += k.budgets_ms;
          kv_times.plan_ms += k.plan_ms, kv_times.victims_ms += k.victims_ms, kv_times.recall_ms += k.recall_ms;
          kv_times.claim_ms += k.claim_ms;
        }
        reserve_sum_ms += reserve_ms;
        patch_sum_ms += patch_ms;
        aft_host.push_back(a_host + reserve_ms + patch_ms);
        aft_wait.push_back(a - a_host);
      }
      // The churn before the next step: a random `churn` of the pages this step read leave HBM,
      // and as many other pages of each request come in from the host tier (at steady state a
      // request's budget is full: the next step's recalls must evict, as a real run's do). Not after
      // the last step: its recalls, flushed below at that step's clock, would find pages the replay
      // stamped at the next one (the LRU refuses a use later than its now).
      if (churn_next) {
        std::vector<int32_t> read = std::move(read_now);
        std::shuffle(read.begin(), read.end(), rng);
        read.resize(static_cast<size_t>(std::llround(opts.churn * static_cast<double>(read.size()))));
        std::vector<int64_t> left(static_cast<size_t>(batch), 0);
        for (int32_t slot : read) {
          const PageTable* t = nullptr;
          PageId id;
          if (!tiers->kv().page_at(slot, &t, &id)) continue;
          for (size_t i = 0; i < tables.size(); ++i) left[i] += tables[i] == t;
        }
        const TierStats ev = tiers->kv().evict_slots(read);
        if (s + 1 > kWarmSteps + kResidentSteps) replay += ev;  // (those before the first timed step are not in its window)
        for (size_t i = 0; i < tables.size(); ++i) {
          PageTable& t = *tables[i];
          std::uniform_int_distribution<int> pl(0, L - 1), ph(0, Hkv - 1);
          std::uniform_int_distribution<int64_t> pi(0, t.n_tokens() / P - 1);
          std::vector<PageId> fill;
          for (int64_t tries = 0; static_cast<int64_t>(fill.size()) < left[i] && tries < 20 * left[i]; ++tries) {
            const PageId id{pl(rng), ph(rng), pi(rng)};
            if (t.page(id.layer, id.head, id.idx).tier == Tier::Host) fill.push_back(id);
          }
          const TierStats rc = tiers->kv().recall_ahead(t, fill, tiers->clock());
          if (s + 1 > kWarmSteps + kResidentSteps) replay += rc;
        }
      }
    }
    const auto mean = [](const std::vector<double>& v) {
      double x = 0;
      for (double y : v) x += y;
      return v.empty() ? 0.0 : x / static_cast<double>(v.size());
    };
    res.step_ms = mean(step_ms);
    res.forward_ms = mean(fwd_ms);
    res.after_ms = mean(after_ms);
    res.resident_ms = mean(resident_ms);
    res.fwd_before_ms = mean(ph_before);
    res.fwd_gpu_ms = mean(ph_gpu);
    res.fwd_after_ms = mean(ph_after);
    res.recalls_in_flight_ms = mean(ph_while);
    if (!step_ms.empty()) {
      const double n = static_cast<double>(step_ms.size());
      res.kv_times = {kv_times.scan_ms / n, kv_times.adopt_ms / n, kv_times.budgets_ms / n,
                      kv_times.plan_ms / n, kv_times.victims_ms / n, kv_times.recall_ms / n};
      res.kv_times.claim_ms = kv_times.claim_ms / n;
      res.reserve_ms = reserve_sum_ms / n;
      res.patch_ms = patch_sum_ms / n;
    }
    res.after_host_ms = mean(aft_host);
    res.after_wait_ms = mean(aft_wait);
    res.read_frac = bp.spec.dense() ? 1.0 : m->sparsity_stats().read_frac();
    if (tiers) {
      const TierStats& now = tiers->kv().totals();
      res.tiers.hits = now.hits - before_timed.hits;
      res.tiers.late = now.late - before_timed.late;
      res.tiers.recalled = now.recalled - before_timed.recalled - replay.recalled;
      res.tiers.offloaded = now.offloaded - before_timed.offloaded - replay.offloaded;
      const std::string bad = tiers->check();
      DHS_CHECK(bad.empty(), "--hierarchy: the tiers' accounting after the run: {}", bad);
    }

    // The floor: weights, the selected pages and the sketch (all rows of the batch's pages) at
    // the HBM copy rate; late reads and recalls at the PCIe rate (this schedule runs them in
    // series with the step; overlapped, the step could take the larger of the two).
    const double n_steps = static_cast<double>(opts.steps);
    const double kv_bytes = static_cast<double>(batch) * static_cast<double>(opts.ctx) / P * lists * page_bytes;
    const double sketch_bytes = o.key_sketch ? kv_bytes / page_bytes * (P * (cfg.head_dim / 2) + P * 4) : 0.0;
    const double hbm_bytes = static_cast<double>(m->weight_bytes()) + res.read_frac * kv_bytes + sketch_bytes;
    const double late_gb = static_cast<double>(res.tiers.late) * page_bytes / n_steps / 1e9;
    const double recall_gb = static_cast<double>(res.tiers.recalled) * page_bytes / n_steps / 1e9;
    // (a landed page is counted as a late read and as a recall, and crossed PCIe once)
    const double landed_gb = static_cast<double>(landed) * page_bytes / n_steps / 1e9;
    const double hbm_ms = hbm_bytes / (copy_gbps * 1e9) * 1e3, pcie_ms = (late_gb + recall_gb - landed_gb) / pcie_gbps * 1e3;
    const double floor_ms = hbm_ms + pcie_ms, floor_overlap_ms = std::max(hbm_ms, pcie_ms);
    const double reads = static_cast<double>(res.tiers.hits + res.tiers.late);
    const double hit_rate = tiers ? (reads > 0 ? static_cast<double>(res.tiers.hits) / reads : 1.0) : 1.0;
    const double stall = res.step_ms > 0 ? std::max(0.0, res.step_ms - res.resident_ms) / res.step_ms : 0.0;
    const double tok_s = static_cast<double>(batch) / res.step_ms * 1e3;
    std::printf("ctx %lld batch %-3lld %-30s hbm %5.1f GiB host %5.1f GiB churn %.3f buffer %.2f: step %.2f ms (forward %.2f, after %.2f; "
                "resident %.2f) -> %.1f tok/s; floor %.2f ms (%.1f tok/s; overlapped %.2f ms); hits %.4f, late %.3f GB + recalled %.3f GB "
                "per step, stall %.2f, pages %.3f%s\n",
                static_cast<long long>(opts.ctx), static_cast<long long>(batch), opts.policy.c_str(),
                static_cast<double>(n_dev) * page_bytes / 1073741824.0, tiered ? static_cast<double>(host_pages) * page_bytes / 1073741824.0 : 0.0,
                opts.churn, opts.buffer, res.step_ms, res.forward_ms, res.after_ms, res.resident_ms, tok_s, floor_ms,
                static_cast<double>(batch) / floor_ms * 1e3, floor_overlap_ms, hit_rate, late_gb, recall_gb, stall, res.read_frac,
                res.late_overflow_steps ? " (late log overflowed)" : "");
    std::printf("  forward: %.2f ms before the launch, %.2f ms launch to wait (%.2f ms of it the last step's recalls, %s), %.2f ms "
                "after; after-step: %.2f ms host, %.2f ms copies' wait\n",
                res.fwd_before_ms, res.fwd_gpu_ms, res.recalls_in_flight_ms, opts.overlap_recalls ? "in flight" : "off",
                res.fwd_after_ms, res.after_host_ms, res.after_wait_ms);
    const TieredKv::AfterStepTimes& k = res.kv_times;
    // (left of "|": after_step_reads, before the next launch; right: after_step_recalls, in flight
    // with the overlap — the landings' adoption among them since they are adopted on the device)
    std::printf("  tiers' after-step: scan %.2f, claim %.2f, reserve %.2f, patch %.2f | adopt %.2f, budgets %.2f, plan %.2f, "
                "victims %.2f, recalls %.2f ms (LRU mirror %s)\n", k.scan_ms, k.claim_ms, res.reserve_ms, res.patch_ms, k.adopt_ms,
                k.budgets_ms, k.plan_ms, k.victims_ms, k.recall_ms, tiers && tiers->kv().lru_mirrored() ? "on" : "off");
    jl << "{\"commit\":\"" << opts.commit << "\",\"gpu\":\"" << prop.name << "\",\"model\":\"llama-3.1-8b-shape\",\"weights\":\"f16\",\"ctx\":"
       << opts.ctx << ",\"batch\":" << batch << ",\"policy\":\"" << opts.policy << "\",\"budgets\":\"" << bp.budgets
       << "\",\"hbm_kv_gib\":" << static_cast<double>(n_dev) * page_bytes / 1073741824.0
       << ",\"host_kv_gib\":" << (tiered ? static_cast<double>(host_pages) * page_bytes / 1073741824.0 : 0.0) << ",\"churn\":" << (tiered ? opts.churn : 0.0)
       << ",\"buffer\":" << (tiered ? opts.buffer : 0.0) << ",\"tok_s\":" << tok_s << ",\"step_ms\":" << res.step_ms
       << ",\"forward_ms\":" << res.forward_ms << ",\"fwd_before_launch_ms\":" << res.fwd_before_ms << ",\"fwd_gpu_ms\":" << res.fwd_gpu_ms
       << ",\"fwd_after_wait_ms\":" << res.fwd_after_ms << ",\"after_host_ms\":" << res.after_host_ms << ",\"after_wait_ms\":" << res.after_wait_ms
       << ",\"overlap_recalls\":" << (tiers && opts.overlap_recalls ? "true" : "false") << ",\"recalls_in_flight_ms\":" << res.recalls_in_flight_ms
       << ",\"kv_scan_ms\":" << k.scan_ms << ",\"kv_claim_ms\":" << k.claim_ms << ",\"kv_reserve_ms\":" << res.reserve_ms << ",\"kv_patch_ms\":" << res.patch_ms
       << ",\"kv_adopt_ms\":" << k.adopt_ms << ",\"kv_budgets_ms\":" << k.budgets_ms
       << ",\"kv_plan_ms\":" << k.plan_ms << ",\"kv_victims_ms\":" << k.victims_ms << ",\"kv_recall_ms\":" << k.recall_ms
       << ",\"after_step_ms\":" << res.after_ms << ",\"resident_step_ms\":" << res.resident_ms
       << ",\"floor_ms\":" << floor_ms << ",\"floor_tok_s\":" << static_cast<double>(batch) / floor_ms * 1e3
       << ",\"floor_overlap_ms\":" << floor_overlap_ms << ",\"hit_rate\":" << hit_rate << ",\"late_gb_per_step\":" << late_gb
       << ",\"recall_gb_per_step\":" << recall_gb << ",\"landing\":" << (opts.land ? "true" : "false")
       << ",\"lru_mirror\":" << (tiers && tiers->kv().lru_mirrored() ? "true" : "false")
       << ",\"land_overlap\":\"" << (tiers ? o.land_overlap.name() : "off") << "\",\"overlapped_frac\":"
       << static_cast<double>(res.overlapped_steps) / n_steps << ",\"landed_gb_per_step\":" << landed_gb << ",\"stall_frac\":" << stall << ",\"pages_read_frac\":" << res.read_frac
       << ",\"late_log_overflow_steps\":" << res.late_overflow_steps << ",\"steps\":" << opts.steps << ",\"copy_GBps\":" << copy_gbps
       << ",\"pcie_GBps\":" << pcie_gbps
       << ",\"method\":\"real decode steps (random weights and KV), wall time of forward + after-step recalls, mean over the timed "
          "steps; churn replayed: before each step that fraction of the last step's reads evicted\"}\n";
    jl.flush();
    if (tiers) {
      recalls->flush();  // (the last step's recalls: after the counts, untimed)
      DHS_CUDA_CHECK(cudaDeviceSynchronize());
    }
    for (PageTable* t : tables) {
      if (tiers) tiers->release(*t);
      else t->release(m->allocator());
    }
  }
  return 0;
}

}  // namespace dhs
