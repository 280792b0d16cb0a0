// The KV hierarchy's hit rate against the device budget (issue 23), measured on the CPU backend
// with the real default model: what the cache manager's buffer ratio buys.
//
// For each RULER-style prompt (eval/ruler_tasks.h) of --len tokens: a greedy decode of --steps
// tokens under the policy with everything resident gives the request's working set (pages its
// decode steps read per step, over all layers and KV heads); then the same decode with a host
// tier and a device budget of ratio x that working set, for each --ratios value. Per ratio, over
// the decode steps only: hit rate (pages read that were resident), pages recalled per step, and
// the recall traffic that rate would be at the 8B shape (each recalled head-page 4 KiB of K + 4
// KiB of V in f16, page 16). Greedy tokens are checked equal to the all-resident run.
//   tier_hit_rate [-m MODEL] [--policy coverage:0.99] [--len 4096] [--steps 64] [--samples 3]
//                 [--ratios 1,1.1,1.25,1.5,2] [--pool-fracs 0.5,0.7] [--out bench/results/hierarchy_hit_rate.jsonl]
//                 [--recall layer,ahead] [--commit C]
// --recall: the hierarchy's schedules (EngineOptions::kv_recall), each run at every budget. With
// "layer" a miss is a page recalled before its layer's attention; with "ahead" (the GPU's) a miss
// is a page read in place from the host tier (late), and the pages recalled per step are the
// ones recalled after each step for the next.
// --pool-fracs: also with the cache manager's budgets (`--kv-device-budget auto`, kv/device_budgets.h)
// and a device pool of that fraction of the request's pages (what pressure looks like to it).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "dhisparse/engine.h"
#include "dhisparse/policy.h"
#include "eval/ruler_tasks.h"

namespace {

struct Run {
  std::vector<int32_t> tokens;
  uint64_t read = 0;  // pages the decode steps read (all layers, KV heads)
  dhs::TierCounts tiers;
};

// Prefill, then `steps` greedy decode steps through a session; the tier counts and pages read
// of the decode steps only.
Run decode(dhs::Engine& e, const std::vector<int32_t>& prompt, int steps) {
  auto s = e.open_session();
  std::vector<float> logits;
  s->append(prompt, &logits);
  (void)e.take_page_counts();
  const dhs::TierCounts t0 = e.tier_counts();
  Run r;
  for (int i = 0; i < steps; ++i) {
    const int32_t tok = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    r.tokens.push_back(tok);
    s->append({tok}, &logits);
  }
  r.read = e.take_page_counts().read;
  const dhs::TierCounts t1 = e.tier_counts();
  r.tiers.hits = t1.hits - t0.hits;
  r.tiers.late = t1.late - t0.late;
  r.tiers.recalled = t1.recalled - t0.recalled;
  r.tiers.offloaded = t1.offloaded - t0.offloaded;
  r.tiers.dropped = t1.dropped - t0.dropped;
  r.tiers.host_used = t1.host_used;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"KV hierarchy: hit rate against the device budget (CPU backend, real model)"};
  std::string model = "models/SmolLM2-135M-Instruct.Q4_1.gguf", policy = "coverage:0.99", out, commit = "unknown";
  int64_t len = 4096;
  int steps = 64, samples = 3;
  std::vector<double> ratios = {1.0, 1.1, 1.25, 1.5, 2.0}, pool_fracs;
  std::vector<std::string> recalls = {"layer"};
  app.add_option("-m,--model", model, "GGUF model");
  app.add_option("--policy", policy, "sparse policy of the decode steps");
  app.add_option("--len", len, "prompt tokens")->check(CLI::Range(int64_t{256}, int64_t{1} << 20));
  app.add_option("--steps", steps, "decode steps per prompt")->check(CLI::Range(1, 4096));
  app.add_option("--samples", samples, "prompts (niah_single, vt, qa, ... in turn)")->check(CLI::Range(1, 100));
  app.add_option("--ratios", ratios, "device budgets as multiples of the working set")->delimiter(',');
  app.add_option("--pool-fracs", pool_fracs, "auto budgets with a device pool of these fractions of the request's pages")
      ->delimiter(',');
  app.add_option("--recall", recalls, "schedules: layer, ahead")->delimiter(',')->check(CLI::IsMember({"layer", "ahead"}));
  app.add_option("--out", out, "append JSON rows here");
  app.add_option("--commit", commit, "commit recorded in the rows");
  CLI11_PARSE(app, argc, argv);
  try {
    dhs::EngineOptions o;
    o.model_path = model;
    o.policy = dhs::PolicySpec::parse(policy);
    o.max_context = len + steps + 64;
    auto base = dhs::Engine::load(o);
    const dhs::ModelConfig& cfg = base->config();
    const std::vector<dhs::eval::TaskKind> tasks = {dhs::eval::TaskKind::NiahSingle, dhs::eval::TaskKind::VariableTracking,
                                                    dhs::eval::TaskKind::Qa, dhs::eval::TaskKind::NiahMultiKey};
    std::ofstream jl;
    if (!out.empty()) jl.open(out, std::ios::app);
    std::printf("%-8s %-6s %-9s %10s %10s %12s %10s %14s %8s\n", "sample", "recall", "ratio", "budget", "hit_rate",
                "recall/step", "late/step", "8B GB/step", "tokens");
    for (int si = 0; si < samples; ++si) {
      const auto task = tasks[static_cast<size_t>(si) % tasks.size()];
      const dhs::eval::Sample smp = dhs::eval::make_sample(task, len, 1000 + static_cast<uint64_t>(si),
                                                           [&](const std::string& t) { return static_cast<int64_t>(base->tokenize(t).size()); });
      const std::vector<int32_t> prompt = base->tokenize(smp.context + smp.question + smp.answer_prefix);
      const Run ref = decode(*base, prompt, steps);
      const double working_set = static_cast<double>(ref.read) / steps;  // pages per step
      const int64_t total_pages = cfg.n_layers * cfg.n_heads_kv * ((static_cast<int64_t>(prompt.size()) + steps + 15) / 16);
      // Fixed budgets (ratio x working set), then auto budgets over smaller pools (ratio < 0 marks them).
      std::vector<double> runs = ratios;
      for (double f : pool_fracs) runs.push_back(-f);
      for (const std::string& recall : recalls)
      for (double ratio : runs) {
        dhs::EngineOptions ot = o;
        const int64_t blocks = (static_cast<int64_t>(prompt.size()) + steps + 15) / 16;
        const bool auto_budget = ratio < 0;
        if (auto_budget) {
          ot.kv_budget_auto = true;
          ot.kv_blocks = static_cast<int64_t>(std::ceil(-ratio * static_cast<double>(blocks)));
        } else {
          // The budget counts full pages; a layer's attention needs its own pages at once, so the
          // budget is at least one layer's (n_heads_kv x pages per list).
          const int64_t one_layer = cfg.n_heads_kv * blocks;
          ot.kv_device_budget = std::max<int64_t>(one_layer, static_cast<int64_t>(std::ceil(ratio * working_set)));
        }
        ot.kv_recall = recall;
        ot.cpu_kv_gb = 1.25 * static_cast<double>(total_pages) * 2.0 * 16.0 * static_cast<double>(cfg.head_dim) * 4.0 / 1073741824.0;
        auto e = dhs::Engine::load(ot);
        const Run r = decode(*e, prompt, steps);
        // Misses: recalled before their layer (layer), or read in place (ahead).
        const bool ahead = recall == "ahead";
        const uint64_t missed = ahead ? r.tiers.late : r.tiers.recalled;
        const double reads = static_cast<double>(r.tiers.hits + missed);
        const double hit = reads > 0 ? static_cast<double>(r.tiers.hits) / reads : 1.0;
        const double per_step = static_cast<double>(r.tiers.recalled) / steps;
        const double late_per_step = static_cast<double>(r.tiers.late) / steps;
        // The same fraction of an 8B request's pages at this length: 32 layers x 8 KV heads.
        const double frac = per_step / static_cast<double>(total_pages);
        const double gb_8b = frac * 32.0 * 8.0 * std::ceil(static_cast<double>(prompt.size()) / 16.0) * 8192.0 / 1e9;
        const bool same = r.tokens == ref.tokens;
        const std::string label = auto_budget ? "auto@" + std::to_string(-ratio).substr(0, 4) : std::to_string(ratio).substr(0, 4);
        const int64_t shown = auto_budget ? ot.kv_blocks * cfg.n_layers * cfg.n_heads_kv : ot.kv_device_budget;
        std::printf("%-8s %-6s %-9s %10lld %9.2f%% %12.1f %10.1f %14.4f %8s\n", dhs::eval::task_name(task).c_str(),
                    recall.c_str(), label.c_str(), static_cast<long long>(shown), 100.0 * hit, per_step, late_per_step,
                    gb_8b, same ? "equal" : "DIFFER");
        if (jl.is_open()) {
          jl << "{\"commit\": \"" << commit << "\", \"model\": \"" << model.substr(model.find_last_of('/') + 1)
             << "\", \"backend\": \"cpu\", \"policy\": \"" << policy << "\", \"task\": \"" << dhs::eval::task_name(task)
             << "\", \"prompt_tokens\": " << prompt.size() << ", \"decode_steps\": " << steps
             << ", \"recall\": \"" << recall << "\", \"working_set_pages\": " << working_set << ", \"total_pages\": " << total_pages;
          if (auto_budget)
            jl << ", \"budget\": \"auto\", \"device_pool_frac\": " << -ratio << ", \"device_pool_pages\": " << shown;
          else
            jl << ", \"buffer_ratio\": " << ratio << ", \"budget_pages\": " << ot.kv_device_budget;
          jl << ", \"hit_rate\": " << hit << ", \"recalled_per_step\": " << per_step
             << ", \"late_per_step\": " << late_per_step
             << ", \"recalled_frac_per_step\": " << frac << ", \"recall_gb_per_step_8b_equiv\": " << gb_8b
             << ", \"tokens_equal\": " << (same ? "true" : "false") << "}\n";
        }
        if (!same) {
          std::fprintf(stderr, "greedy tokens differ with the host tier (%s)\n", label.c_str());
          return 1;
        }
      }
    }
    return 0;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "error: %s\n", ex.what());
    return 1;
  }
}
