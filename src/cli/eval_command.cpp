#include "cli/eval_command.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "cli/option_checks.h"
#include "core/error.h"

namespace dhs::cli {

EvalCommand::EvalCommand(CLI::App& app) {
  app_ = app.add_subcommand("eval", "Accuracy of sparse decode: RULER-style synthetic tasks, dense and each policy "
                                    "from one prefill; score, top-1 agreement and KL vs dense, pages read");
  app_->add_option("-m,--model", model_, "GGUF file or Hugging Face directory (default: the bundled model)");
  app_->add_option("--device", eo_.device, "Backend: cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  add_gpu_weight_options(app_, eo_);
  app_->add_option("--tasks", ev_.tasks, "niah_single, niah_multikey, niah_multivalue, niah_multiquery, vt, cwe, qa (default: all)")->delimiter(',');
  app_->add_option("--lengths", ev_.lengths, "Prompt lengths in tokens (default: 4096 on cuda, 1024 on cpu)")->delimiter(',')->check(int_in(1, kMaxTokens));
  app_->add_option("--samples", ev_.samples, "Samples per task and length (default: 100 on cuda, 5 on cpu)")->check(int_in(1, 1000000));
  app_->add_option("--policies", policies_, "Policies besides dense, as --sparse-policy spells one: coverage:G, topk:K, topfrac:F, sinkwindow:K, solohead:G|K, each optionally /R (select every R steps) and @ESTIMATOR")->delimiter(',')->capture_default_str();
  app_->add_option("--seed", ev_.seed, "Sample seed")->check(int_in(0, kNoLimit))->capture_default_str();
  policy_.add(app_, "Page mass estimate: sketch4, minmax, meanspread, gaussian (CPU also minmax:ALPHA, sketch4:KEEP, sketch2, "
                    "psketch4:R[:KEEP] and qsketch4:R[:KEEP] on a key basis fitted on a calibration sample)", true);
  app_->add_flag("--no-chat", no_chat_, "Raw prompts, without the model's chat template");
  app_->add_option("-c,--ctx-size", eo_.max_context, "Context size in tokens, at most the model's trained context; 0 = model's")->check(int_in(0, kMaxTokens));
  app_->add_option("--out", ev_.out, "JSON lines are appended here");
  app_->add_option("--trace-out", ev_.trace_out, "Per-(layer, KV head) pages-read fractions per policy and length (JSON)");
  app_->add_option("--commit", ev_.commit, "Commit recorded in each row");
  app_->add_option("--speculative-k", ev_.speculative_k,
                   "Speculative decoding's acceptance: each policy's output decoded again as cycles of K drafts on "
                   "--draft-policy, verified by the policy row by row; drafts kept per verification in the rows (0 = off)")
      ->check(int_in(0, 16))->capture_default_str();
  app_->add_option("--draft-policy", draft_, "The drafts' pages with --speculative-k: sinkwindow:PAGES, or sinkwindow:PAGES+SEEDS (also the verifier's SEEDS heaviest selected pages per list)")->capture_default_str();
}

void EvalCommand::check() {
  for (const std::string& p : policies_) ev_.policies.push_back(policy_.parse(p, "--policies"));
  ev_.draft = policy_.parse(draft_, "--draft-policy");
  DHS_CHECK(ev_.draft.rule == SelectRule::SinkWindow, "--draft-policy {}: the draft reads sink and recent pages (sinkwindow:PAGES[+SEEDS])",
            draft_);
}

int EvalCommand::run(std::string& oom_while) {
  eo_.model_path = resolve_model(model_, app_->count("--model") > 0);
  oom_while = eo_.max_context > 0 ? "loading the model with a KV cache of " + std::to_string(eo_.max_context) + " tokens"
                                  : "loading the model and its KV cache";
  if (eo_.device == "cpu") {
    if (app_->count("--samples") == 0) ev_.samples = kCpuEvalSamples;
    if (app_->count("--lengths") == 0) ev_.lengths = {kCpuEvalLength};
  }
  ev_.chat = !no_chat_;
  ev_.device = eo_.device;
  ev_.gpu_weights = eo_.gpu_weights;
  ev_.quantization = eo_.quantization;
  ev_.draft_quantization = eo_.draft_quantization;
  ev_.estimator = policy_.spec.estimator;
  ev_.model_name = std::filesystem::path(eo_.model_path).filename().string();
  eo_.policy = policy_.spec;  // a scoring policy loads the page summaries every policy needs
  eo_.policy.rule = SelectRule::Coverage;
  eo_.keep_all_estimators = true;  // ... and every estimator's, compared on one prefill
  eo_.progress = [](int64_t done, int64_t total) { progress_bar("loading", done, total); };
  auto engine = Engine::load(eo_);
  oom_while = "evaluating";
  ev_.progress = [](int64_t done, int64_t total) { progress_bar("eval", done, total); };
  const bool tty = isatty(STDERR_FILENO);
  ev_.log = [tty](const std::string& line) {
    std::fprintf(stderr, "%s%s\n", tty ? "\r\033[K" : "", line.c_str());  // over the bar, on a terminal
    std::fflush(stderr);
  };
  return stdout_status(run_eval(*engine, ev_));
}

}  // namespace dhs::cli
