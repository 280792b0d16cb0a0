#include "cli/generate_command.h"

#include <cstdio>
#include <iostream>
#include <thread>
#include <utility>

#include "cli/escapes.h"
#include "cli/option_checks.h"
#include "cli/prompt_input.h"
#include "dhisparse/scheduler.h"

namespace dhs::cli {

GenerateCommand::GenerateCommand(CLI::App& app) {
  app_ = app.add_subcommand("generate", "Generate text from a prompt, streaming it to stdout");
  app_->add_option("-m,--model", model_, "GGUF file or Hugging Face directory (default: the bundled SmolLM2-135M-Instruct)");
  auto* p_opt = app_->add_option("-p,--prompt", prompt_arg_,
                                 "Prompt text, with C-style escapes (\\n, \\t, \\\\, \\xHH, \\uXXXX) unless --no-escape; "
                                 "@FILE reads FILE, @@TEXT is TEXT with one leading @, - reads stdin");
  app_->add_option("-f,--file", prompt_file_, "Read the prompt from FILE (taken as is: no escapes; one trailing newline dropped)")
      ->excludes(p_opt);
  app_->add_flag("--no-escape", no_escape_, "Take -p, --system and --stop text as typed (no \\n, \\t, ... processing)");
  app_->add_flag("--chat", chat_, "Wrap the prompt as a user message in the model's chat template");
  app_->add_option("--system", system_prompt_, "System message (implies --chat)");
  app_->add_option("--chat-template", eo_.chat_template, "Override the chat template (file path or template text; implies --chat)");
  app_->add_option("-n,--max-tokens", go_.max_tokens, "Maximum tokens to generate")->check(int_in(0, kMaxTokens))->capture_default_str();
  app_->add_option("--temperature", go_.sampling.temperature, "Sampling temperature; 0 = greedy")->check(real_in(0.0, End::Closed, 100.0, End::Closed))->capture_default_str();
  app_->add_option("--top-k", go_.sampling.top_k, "Keep the k most likely tokens; 0 = off")->check(int_in(0, kMaxTokens))->capture_default_str();
  app_->add_option("--top-p", go_.sampling.top_p, "Nucleus sampling mass; 1 = off")->check(real_in(0.0, End::Open, 1.0, End::Closed))->capture_default_str();
  app_->add_option("--min-p", go_.sampling.min_p, "Drop tokens below min_p x the top probability; 0 = off")->check(real_in(0.0, End::Closed, 1.0, End::Closed))->capture_default_str();
  app_->add_option("--repeat-penalty", go_.sampling.repetition_penalty, "Repetition penalty; 1 = off")->check(real_in(0.0, End::Open, 100.0, End::Closed))->capture_default_str();
  app_->add_option("--repeat-last-n", go_.sampling.repetition_window, "Tokens the repetition penalty looks back over; 0 = all")->check(int_in(0, kMaxTokens))->capture_default_str();
  app_->add_option("--seed", seed_text_, "RNG seed; -1 = a random one (printed in the stats line)")->check(seed_value())->type_name("INT")->capture_default_str();
  app_->add_option("--stop", stops_, "Stop string (repeatable; escapes as in -p)");
  app_->add_flag("--ignore-eos", go_.ignore_eos, "Keep generating after end-of-sequence tokens");
  app_->add_option("--sparse-policy", sparse_policy_,
                  "KV pages each head reads: RULE[:VALUE][/R][@ESTIMATOR], RULE one of dense, coverage:GAMMA, topk:PAGES, "
                  "topfrac:FRACTION, sinkwindow:PAGES, solohead:GAMMA|PAGES (e.g. coverage:0.99/2@sketch4); the flags "
                  "below give what the text leaves out")
      ->capture_default_str();
  app_->add_option("--gamma", policy_.spec.gamma, "coverage / solohead: attention mass to keep per layer, KV head and step")->check(real_in(0.0, End::Open, 1.0, End::Closed))->capture_default_str();
  app_->add_option("--budget", policy_.spec.budget, "topk / sinkwindow / solohead: pages per list")->check(int_in(0, kMaxTokens));
  app_->add_option("--sparse-min-tokens", policy_.spec.min_step_tokens,
                  "decode steps whose batch holds fewer context tokens in all read every page, no selection "
                  "(H200, 8B shape: selection pays from ~96k; docs/benchmarks.md)")
      ->check(int_in(0, kNoLimit));
  policy_.add(app_, "Page mass estimate: sketch4 (per-token 4-bit keys: the accurate one), minmax, meanspread, gaussian", false);
  app_->add_option("--reselect-every", policy_.spec.reselect_every, "A layer selects its pages every N decode steps (staggered over layers) and reads its last selection plus the pages written since in between")->check(int_in(1, 64))->capture_default_str();
  go_.speculative_k = 0;
  go_.draft_policy = SchedulerOptions{}.draft_policy;
  app_->add_option("--speculative-k", go_.speculative_k,
                  "Speculative decoding: draft up to K tokens per cycle on --draft-policy, verify them in one step "
                  "(greedy: the tokens of decoding without it; sampled: its distribution; on the GPU the verify rows of a sparse policy share one selection); 0 = off; auto = "
                  "drafts chosen per cycle from the measured acceptance and step costs, 0 where speculation would not pay")
      ->transform(speculative_k_value(16))->capture_default_str();
  app_->add_option("--draft-policy", go_.draft_policy, "The draft's pages: sinkwindow:PAGES (sink and recent pages), or sinkwindow:PAGES+SEEDS (also the verifier's SEEDS heaviest selected pages per list)")
      ->capture_default_str();
  app_->add_option("--device", eo_.device, "Backend: cpu, or cuda (needs a GPU and a CUDA build)")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  app_->add_option("-t,--threads", eo_.n_threads, "CPU threads; 0 = all (more than the machine's hardware threads are not started)")->check(int_in(0, 4096));
  app_->add_option("-c,--ctx-size", eo_.max_context, "Context size in tokens, at most the model's trained context; 0 = the model's (capped at 8192 on CPU)")->check(int_in(0, kMaxTokens));
  app_->add_option("--block-size", eo_.page_size, "Tokens per KV head-page")->check(int_in(1, 256))->capture_default_str();
  app_->add_option("--weights", eo_.weight_type, "CPU weight storage: f16 or f32")->check(CLI::IsMember({"f16", "f32"}))->capture_default_str();
  add_gpu_weight_options(app_, eo_);
  add_kv_tier_options(app_, eo_);
  app_->add_flag("-q,--quiet", quiet_, "Print only the generated text: no prompt echo, no progress, no stats line");
}

void GenerateCommand::check() {
  // Checks across flags, still before any model loads.
  if (app_->count("--prompt") == 0 && app_->count("--file") == 0)
    throw CLI::RequiredError("a prompt (-p/--prompt TEXT, -p @FILE, -p - for stdin, or -f/--file FILE)");
  for (const std::string& s : stops_)
    if (s.empty()) throw CLI::ValidationError("--stop", "an empty stop string would match nothing");
  // One PolicySpec from the text and the flags; --gamma and --budget only where the rule reads them.
  eo_.policy = policy_.parse(sparse_policy_, "--sparse-policy");
  const RuleArg arg = rule_info(eo_.policy.rule).arg;
  const std::string pol = eo_.policy.rule_name();
  if (app_->count("--gamma") > 0 && arg != RuleArg::Mass && arg != RuleArg::MassOrPages)
    throw CLI::ValidationError("--gamma", "applies to --sparse-policy coverage or solohead, not " + pol);
  if (app_->count("--budget") > 0 && arg != RuleArg::Pages && arg != RuleArg::MassOrPages)
    throw CLI::ValidationError("--budget", "applies to --sparse-policy topk, sinkwindow or solohead, not " + pol);
}

int GenerateCommand::run(StdoutWriter& out, std::string& oom_while) {
  eo_.model_path = resolve_model(model_, app_->count("--model") > 0);
  oom_while = eo_.max_context > 0 ? "loading the model with a KV cache of " + std::to_string(eo_.max_context) + " tokens"
                                  : "loading the model and its KV cache";
  if (eo_.n_threads > 0) {
    // ThreadPool::set_global_threads caps the pool the same way; say so rather than be slow quietly.
    const int hw = static_cast<int>(std::thread::hardware_concurrency());
    if (hw > 0 && eo_.n_threads > hw)
      std::fprintf(stderr, "note: -t %d is more than the %d hardware threads; using %d\n", eo_.n_threads, hw, hw);
  }
  // The prompt is read (file, stdin) before the model loads: a bad path costs no load.
  if (app_->count("--system") > 0 || app_->count("--chat-template") > 0) chat_ = true;
  const std::string prompt = app_->count("--file") > 0 ? read_prompt_file(prompt_file_)
                                                      : prompt_from_arg(prompt_arg_, !no_escape_, std::cin);
  if (!no_escape_) system_prompt_ = process_escapes(system_prompt_);
  for (const std::string& s : stops_) go_.stop.push_back(no_escape_ ? s : process_escapes(s));
  go_.sampling.seed = resolve_seed(seed_text_);
  if (!quiet_) eo_.progress = [](int64_t done, int64_t total) { progress_bar("loading", done, total); };
  auto engine = Engine::load(eo_);
  // A raw prompt is the operator's own text, special tokens and all (as llama.cpp reads -p);
  // chat messages are user text: their special-token spellings stay text.
  std::vector<int32_t> ids;
  if (chat_) {
    std::vector<ChatMessage> msgs;
    if (!system_prompt_.empty()) msgs.push_back({"system", system_prompt_});
    msgs.push_back({"user", prompt});
    ids = engine->tokenize_chat(msgs, true);
  } else {
    ids = engine->tokenize(prompt);
  }
  oom_while = "generating";
  // The prompt is echoed with the first generated text, once the prefill has passed: a prompt
  // the engine rejects (too long for -c) gives the error alone, not the prompt and then it.
  bool echo = !chat_ && !quiet_;
  auto res = engine->generate(ids, go_, [&](const std::string& piece) {
    if (std::exchange(echo, false)) out.write(prompt);
    return out.write(piece);
  });
  if (echo) out.write(prompt);
  out.end_line();
  if (out.failed()) {
    if (out.reader_gone()) return kExitReaderGone;  // `| head`: quiet, as cat (stdout_writer.h)
    throw Error(out.error());
  }
  if (!quiet_) {
    const double pp = res.prompt_seconds > 0 ? res.n_prompt / res.prompt_seconds : 0.0;
    const double tg = res.decode_seconds > 0 ? (res.tokens.size() - 1) / res.decode_seconds : 0.0;
    std::fprintf(stderr, "prompt: %lld tokens, %.1f tokens/s | decode: %zu tokens, %.1f tokens/s | finish: %s",
                 static_cast<long long>(res.n_prompt), pp, res.tokens.size(), tg, res.finish_reason.c_str());
    if (!eo_.policy.dense()) std::fprintf(stderr, " | KV pages read: %.1f%%", 100.0 * res.pages_read_frac);
    if (res.spec_verifies > 0)
      std::fprintf(stderr, " | speculative: %lld verifies, %.2f of %.2f drafts accepted per verify",
                   static_cast<long long>(res.spec_verifies),
                   static_cast<double>(res.spec_accepted) / static_cast<double>(res.spec_verifies),
                   static_cast<double>(res.spec_drafted) / static_cast<double>(res.spec_verifies));
    std::fprintf(stderr, " | seed: %llu\n", static_cast<unsigned long long>(go_.sampling.seed));
  }
  return 0;
}

}  // namespace dhs::cli
