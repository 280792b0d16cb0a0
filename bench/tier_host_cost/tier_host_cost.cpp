// Host time per decode step of the KV hierarchy's bookkeeping on the recall-ahead schedule, at the
// page counts of the Llama-3.1-8B shape (32 layers x 8 KV heads, 16-token pages): TieredKv over
// storage-less pools (no bytes move: the copies are the GPU's), B requests of ctx tokens, each
// (request, layer, KV head) list selecting a fixed fraction of its pages, a fraction `churn` of
// them replaced by other pages every step (a real churn: the recalls need victims). Per step:
// what the runner calls before it (track_new_pages, prepare_append, adopt_new_pages) and after it
// (after_decode_step: hits by stamp, late reads, recalls ahead), timed apart. The first steps read
// everything late (warm-up); budgets are then the pages read x (1 + buffer). --mirror: the LRU
// mirrored on the device (BucketedLru::mirror_on): the patch staged before the step is the host's
// (timed with "before"), the mirror's own work (kv/lru_mirror.h: the patch applied, the reads
// written and counted, the copy back) is the GPU's and not timed, and the reads come back through
// after_step_reads' mirror form instead of the stamps' scan.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kv/lru_mirror.h"
#include "kv/page_pool.h"
#include "kv/page_table.h"
#include "kv/tiered_kv.h"

using namespace dhs;

int main(int argc, char** argv) {
  CLI::App app{"Host time per decode step of the KV hierarchy's bookkeeping (recall ahead) at the 8B shape's sizes"};
  int64_t ctx = 131072, batch = 4;
  double read_frac = 0.305, buffer = 0.5, churn = 0.055, hbm_gib = 32.0;
  int steps = 8, warm = 3;
  std::string out, commit = "unknown", machine = "unknown";
  app.add_option("--ctx", ctx)->capture_default_str();
  app.add_option("--batch", batch)->capture_default_str();
  app.add_option("--read-frac", read_frac, "fraction of each list's pages a step reads")->capture_default_str();
  app.add_option("--buffer", buffer)->capture_default_str();
  app.add_option("--churn", churn, "fraction of each list's selection replaced every step")->capture_default_str();
  app.add_option("--hbm-gib", hbm_gib, "HBM KV pool (8 KiB head-pages)")->capture_default_str();
  app.add_option("--steps", steps)->capture_default_str();
  app.add_option("--warm", warm, "steps before the timed ones (the budgets fill: evictions start)")->capture_default_str();
  app.add_option("--out", out, "a JSON line is appended here");
  app.add_option("--commit", commit);
  app.add_option("--machine", machine, "where it ran (recorded)");
  bool serial_recalls = false, land = false;
  app.add_flag("--land", land, "landing (kv/tier_land.h): slots reserved before each step, the late pages landed in them in order, adopted after");
  bool hook = false, fresh_victims = false;
  app.add_flag("--fresh-victims", fresh_victims, "recalls one request at a time select other requests' victims afresh each (the shared prefix off: the A/B)");
  app.add_flag("--hook", hook, "the CUDA runner's relocate hook emulated (a record per page moved)");
  bool mirror = false;
  app.add_flag("--mirror", mirror, "the LRU mirrored on the device: its patch staged before the step (timed), the reads taken back from the mirror (no stamps' scan)");
  app.add_flag("--serial-recalls", serial_recalls, "recalls one request at a time (the batched path off: the A/B)");
  int L = 32, H = 8, D = 128;
  int64_t hbm_blocks = 0;
  app.add_option("--layers", L, "the model's layers (default: the 8B shape's)")->capture_default_str();
  app.add_option("--kv-heads", H)->capture_default_str();
  app.add_option("--head-dim", D)->capture_default_str();
  app.add_option("--hbm-blocks", hbm_blocks, "HBM KV pool in 16-token blocks of every (layer, KV head), as serve's "
                 "--num-gpu-blocks-override (over --hbm-gib)");
  CLI11_PARSE(app, argc, argv);
  constexpr int P = 16;
  const int64_t page_bytes = 2 * P * D * 2;
  const int64_t n_dev = hbm_blocks > 0 ? hbm_blocks * L * H : static_cast<int64_t>(hbm_gib * 1073741824.0) / page_bytes;
  hbm_gib = static_cast<double>(n_dev * page_bytes) / 1073741824.0;  // (as recorded)
  const int64_t per_list = ctx / P, n_host = batch * per_list * L * H + n_dev;
  PagePool dev(Tier::Device, n_dev, P, D, false), host(Tier::Host, n_host, P, D, false);
  TieredKv kv(dev, host, LruParams{L, 4, true});
  kv.set_batch_recalls(!serial_recalls);
  kv.set_shared_victims(!fresh_victims);
  kv.set_mover([](const PagePool&, PagePool&, std::span<const PageMove> m) { return m.empty() ? int64_t{0} : int64_t{1}; });
  // --hook: the CUDA runner's relocate hook, emulated (its device page table records the page's
  // new key: the table read again, one record appended; cuda::DevicePageTable::patch).
  struct Patch {
    int64_t off;
    int32_t key;
  };
  std::vector<Patch> patches;
  if (hook)
    kv.set_relocate_hook([&patches, n_dev](const PageTable& t, int l, int h, int64_t i) {
      const PageRef p = t.page(l, h, i);
      patches.push_back({(static_cast<int64_t>(l) * t.n_heads_kv() + h) * t.n_pages_per_list() + i,
                         p.tier == Tier::Device ? p.slot : static_cast<int32_t>(n_dev + p.slot)});
    });
  std::vector<std::unique_ptr<PageTable>> ts;
  std::vector<PageTable*> tables;
  int64_t step = 0;
  for (int64_t r = 0; r < batch; ++r) {
    ts.push_back(std::make_unique<PageTable>(L, H, P));
    PageTable& t = *ts.back();
    t.reserve(host, ctx);
    t.commit(ctx);
    t.reserve(dev, 1);
    kv.add(t, 0);
    tables.push_back(&t);
  }
  // The selections: per list, read_frac of its full pages, at random; each step `churn` of them
  // replaced by pages not selected.
  std::mt19937_64 rng(11);
  const int64_t sel_n = static_cast<int64_t>(read_frac * static_cast<double>(per_list));
  std::vector<std::vector<int64_t>> sel(static_cast<size_t>(batch * L * H));
  for (auto& v : sel) {
    std::vector<int64_t> all(static_cast<size_t>(per_list));
    for (int64_t i = 0; i < per_list; ++i) all[static_cast<size_t>(i)] = i;
    std::shuffle(all.begin(), all.end(), rng);
    v.assign(all.begin(), all.begin() + sel_n);
  }
  std::printf("ctx %lld batch %lld: %lld pages per list, %lld read (%.3f), HBM pool %lld pages, churn %.3f, buffer %.2f\n",
              static_cast<long long>(ctx), static_cast<long long>(batch), static_cast<long long>(per_list),
              static_cast<long long>(sel_n), read_frac, static_cast<long long>(n_dev), churn, buffer);
  using Clock = std::chrono::steady_clock;
  double sum_before = 0, sum_after = 0, sum_patch = 0;
  std::vector<int32_t> stamps(static_cast<size_t>(n_dev), 0);
  // --mirror: the LRU's storage and the buffer the copy lands in, the device's side, the staging.
  std::vector<int32_t> store(mirror ? static_cast<size_t>(n_dev) : 0), copy_buf(store.size()), staging;
  std::span<int32_t> copy_to(copy_buf);
  std::unique_ptr<LruMirror> device;
  if (mirror) {
    kv.mirror_lru(store);
    device = std::make_unique<LruMirror>(n_dev);
    staging.resize(static_cast<size_t>(3 * n_dev));
  }
  int32_t n_owners = 0;
  int32_t stamp = 0;
  int64_t last_late = 1 << 16;
  TierStats sum;
  TieredKv::AfterStepTimes parts;  // the after-step by part, summed over the timed steps
  for (int s = 0; s < warm + steps; ++s) {
    const int64_t now = (step + 1) * L;
    auto t0 = Clock::now();
    for (PageTable* t : tables) kv.track_new_pages(*t, now);
    for (PageTable* t : tables) kv.prepare_append(*t, now);
    for (PageTable* t : tables) kv.adopt_new_pages(*t, now);
    std::vector<int32_t> stack;
    if (land) stack = kv.reserve_landing(last_late + last_late / 4 + 256, now);
    double patch_ms = 0;
    BucketedLru::Patch patch;  // (the device's copy of the staged patch: not timed)
    if (mirror) {
      const auto tp = Clock::now();
      const TieredKv::LruPatchSize z = kv.begin_lru_patch(now + L - 1);
      kv.fill_lru_patch(staging.data(), staging.data() + z.n, staging.data() + 2 * z.n);
      patch_ms = std::chrono::duration<double, std::milli>(Clock::now() - tp).count();
      patch.slot.assign(staging.begin(), staging.begin() + z.n);
      patch.use.assign(staging.begin() + z.n, staging.begin() + 2 * z.n);
      patch.owner.assign(staging.begin() + 2 * z.n, staging.begin() + 3 * z.n);
      patch.tick = z.tick;
      n_owners = z.n_owners;
    }
    const double before_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (mirror) device->apply(patch);
    // What the GPU records: a stamp per HBM slot read, the late pages in list order.
    ++stamp;
    std::vector<TieredKv::LateRead> late;
    std::vector<TieredKv::Landed> landed;
    size_t used = 0;
    for (int64_t r = 0; r < batch; ++r)
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h) {
          for (int64_t i : sel[static_cast<size_t>((r * L + l) * H + h)]) {
            const PageRef p = tables[static_cast<size_t>(r)]->page(l, h, i);
            if (p.tier == Tier::Device) {
              stamps[static_cast<size_t>(p.slot)] = stamp;
              if (mirror) device->read(p.slot);
            } else if (used < stack.size()) {  // (the GPU lands it and the split stamps the slot)
              stamps[static_cast<size_t>(stack[used])] = stamp;
              if (mirror) device->read(stack[used]);
              landed.push_back({static_cast<int>(r), PageId{l, h, i}, stack[used++], p.slot});
            } else {
              late.push_back({static_cast<int>(r), PageId{l, h, i}});
            }
          }
          const PageTable& t = *tables[static_cast<size_t>(r)];  // (and the page it appends into)
          stamps[static_cast<size_t>(t.page(l, h, t.n_pages_per_list() - 1).slot)] = stamp;
          if (mirror) device->read(t.page(l, h, t.n_pages_per_list() - 1).slot);
        }
    std::vector<int64_t> counts;
    if (mirror) {  // (the GPU's: the reads counted, the last uses copied back)
      counts = device->counts(n_owners);
      std::copy(device->use().begin(), device->use().end(), copy_to.begin());
    }
    t0 = Clock::now();
    TierStats st;
    if (mirror) {
      st = kv.after_step_reads(copy_to, counts, tables, now + L - 1, landed, &copy_to);
      st += kv.after_step_recalls(late, now + L - 1);
    } else {
      st = kv.after_decode_step(stamps, stamp, late, tables, now + L - 1, landed);
    }
    last_late = static_cast<int64_t>(late.size() + landed.size());
    patches.clear();  // (flushed to the device once a step)
    const double after_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    ++step;
    if (s == 0)
      for (PageTable* t : tables)
        kv.set_budget(*t, static_cast<int64_t>(static_cast<double>(sel_n * L * H) * (1.0 + buffer)), (step + 1) * L);
    std::printf("step %2d: before %8.2f ms, after %8.2f ms: hits %8lld late %8lld recalled %8lld offloaded %7lld dropped %7lld\n", s,
                before_ms, after_ms, static_cast<long long>(st.hits), static_cast<long long>(st.late),
                static_cast<long long>(st.recalled), static_cast<long long>(st.offloaded), static_cast<long long>(st.dropped));
    if (s >= warm) {
      sum_before += before_ms;
      sum_after += after_ms;
      sum_patch += patch_ms;
      sum += st;
      const TieredKv::AfterStepTimes& k = kv.after_step_times();  // (by part)
      parts.scan_ms += k.scan_ms, parts.adopt_ms += k.adopt_ms, parts.budgets_ms += k.budgets_ms;
      parts.plan_ms += k.plan_ms, parts.victims_ms += k.victims_ms, parts.recall_ms += k.recall_ms;
      parts.claim_ms += k.claim_ms;
    }
    // Churn: per list, `churn` of the selection replaced by unselected pages.
    for (auto& v : sel) {
      const int64_t k = static_cast<int64_t>(churn * static_cast<double>(v.size()) + 0.5);
      std::vector<uint8_t> in(static_cast<size_t>(per_list), 0);
      for (int64_t i : v) in[static_cast<size_t>(i)] = 1;
      std::shuffle(v.begin(), v.end(), rng);
      std::uniform_int_distribution<int64_t> pick(0, per_list - 1);
      for (int64_t j = 0; j < k; ++j) {
        int64_t x;
        do x = pick(rng);
        while (in[static_cast<size_t>(x)]);
        in[static_cast<size_t>(x)] = 1;
        in[static_cast<size_t>(v[static_cast<size_t>(j)])] = 0;
        v[static_cast<size_t>(j)] = x;
      }
    }
  }
  const std::string bad = kv.check_invariants();
  std::printf("steps whose recalls ran batched: %lld\n", static_cast<long long>(kv.batched_steps()));
  std::printf("mean over %d steps: before %.2f ms, after %.2f ms per step; hit rate %.4f; %s\n", steps, sum_before / steps,
              sum_after / steps, static_cast<double>(sum.hits) / static_cast<double>(sum.hits + sum.late),
              bad.empty() ? "invariants hold" : bad.c_str());
  std::printf("  before's patch %.2f ms (LRU mirror %s); after by part: scan %.2f, claim %.2f | adopt %.2f, budgets %.2f, plan %.2f, "
              "victims %.2f, recalls %.2f ms\n",
              sum_patch / steps, mirror ? "on" : "off", parts.scan_ms / steps, parts.claim_ms / steps, parts.adopt_ms / steps, parts.budgets_ms / steps, parts.plan_ms / steps,
              parts.victims_ms / steps, parts.recall_ms / steps);
  const std::string shape = L == 32 && H == 8 && D == 128 ? std::string("llama-3.1-8b pages")
                                                         : fmt::format("{} layers x {} kv heads, d {}", L, H, D);
  if (!out.empty()) {
    std::FILE* f = std::fopen(out.c_str(), "a");
    if (f) {
      std::fprintf(f,
                   "{\"commit\":\"%s\",\"machine\":\"%s\",\"shape\":\"%s\",\"ctx\":%lld,\"batch\":%lld,"
                   "\"read_frac\":%g,\"churn\":%g,\"buffer\":%g,\"hbm_kv_gib\":%g,\"steps\":%d,\"before_step_ms\":%.3f,"
                   "\"after_step_ms\":%.3f,\"kv_scan_ms\":%.3f,\"kv_adopt_ms\":%.3f,\"kv_budgets_ms\":%.3f,\"kv_plan_ms\":%.3f,"
                   "\"kv_victims_ms\":%.3f,\"kv_recall_ms\":%.3f,\"kv_claim_ms\":%.3f,\"lru_mirror\":%s,\"kv_patch_ms\":%.3f,"
                   "\"relocate_hook\":%s,\"any_victims\":\"%s\",\"recalls\":\"%s\",\"hit_rate\":%.4f,\"recalled_per_step\":%.0f,\"evicted_per_step\":%.0f,"
                   "\"method\":\"TieredKv alone, storage-less pools, mean host time per step after %d warm-up steps\"}\n",
                   commit.c_str(), machine.c_str(), shape.c_str(), static_cast<long long>(ctx), static_cast<long long>(batch), read_frac, churn, buffer,
                   hbm_gib, steps, sum_before / steps, sum_after / steps, parts.scan_ms / steps, parts.adopt_ms / steps,
                   parts.budgets_ms / steps, parts.plan_ms / steps, parts.victims_ms / steps, parts.recall_ms / steps,
                   parts.claim_ms / steps, mirror ? "true" : "false", sum_patch / steps, hook ? "true" : "false", fresh_victims ? "fresh per request" : "shared prefix", land ? "landed in the step" : serial_recalls ? "one request at a time" : "batched",
                   static_cast<double>(sum.hits) / static_cast<double>(sum.hits + sum.late), static_cast<double>(sum.recalled) / steps,
                   static_cast<double>(sum.offloaded + sum.dropped) / steps, warm);
      std::fclose(f);
    }
  }
  return bad.empty() ? 0 : 1;
}
