// `dhisparse`: the command-line front end. Uses only the public API.
//   dhisparse generate [-m MODEL] (-p PROMPT | -p @FILE | -p - | -f FILE) [--chat] [-n N] [sampling flags]
//   dhisparse info [MODEL]
//   dhisparse eval [...] | bench [...] | --version
// Every flag value is checked while parsing (cli/option_checks.h), before a model loads, so a
// typo costs no load and its message never lands in the generated text.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <new>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "cli/escapes.h"
#include "cli/option_checks.h"
#include "cli/prompt_input.h"
#include "cli/stdout_writer.h"
#include "cli/version.h"
#include "dhisparse/engine.h"
#include "dhisparse/eval.h"
#ifdef DHS_HAVE_CUDA
#include "bench/e2e_bench.h"
#endif

namespace {

using dhs::cli::End;
using dhs::cli::int_in;
using dhs::cli::real_in;

constexpr std::array<std::string_view, 4> kCommands = {"generate", "info", "eval", "bench"};
constexpr int64_t kMaxTokens = int64_t{1} << 24;  // the engine's largest context (local_engine.cpp)
constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

// Where the default model lives: $DHS_MODELS_DIR, else models/ beside the binary's
// source tree, else ./models.
std::string default_model_path() {
  const std::string name = "SmolLM2-135M-Instruct.Q4_1.gguf";
  if (const char* d = std::getenv("DHS_MODELS_DIR")) return std::string(d) + "/" + name;
#ifdef DHS_SOURCE_DIR
  const std::string src = std::string(DHS_SOURCE_DIR) + "/models/" + name;
  if (std::filesystem::exists(src)) return src;
#endif
  return "models/" + name;
}

// A bar on a terminal; elsewhere (a log, a pipe) nothing but the final state, since "\r"
// redraws would fill the log. eval's progress lines (EvalOptions::log) are what a log gets.
void progress_bar(const char* what, int64_t done, int64_t total) {
  if (!isatty(STDERR_FILENO) && done != total) return;
  const int width = 30;
  const int filled = total > 0 ? static_cast<int>(width * done / total) : width;
  std::fprintf(stderr, "\r%s [%s%s] %3d%%", what, std::string(static_cast<size_t>(filled), '#').c_str(),
               std::string(static_cast<size_t>(width - filled), '.').c_str(),
               total > 0 ? static_cast<int>(100 * done / total) : 100);
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

// A model path the loader may open: a regular file or a directory. A FIFO would block the
// open, a device (/dev/zero) would map or read forever; stat() answers without opening.
// (model_loader.cpp checks the same for library callers.)
std::string resolve_model(const std::string& m, bool given) {
  if (given && m.empty()) throw dhs::Error("-m/--model: empty path (leave -m out for the default model)");
  const std::string p = m.empty() ? default_model_path() : m;
  std::error_code ec;
  const auto st = std::filesystem::status(p, ec);
  if (m.empty() && !std::filesystem::exists(st))
    throw dhs::Error("the default model is not here (" + p +
                     "); fetch it with `bash scripts/fetch_model.sh`, or pass -m MODEL");
  if (!std::filesystem::exists(st)) throw dhs::Error("model path '" + p + "' does not exist");
  if (!std::filesystem::is_regular_file(st) && !std::filesystem::is_directory(st))
    throw dhs::Error("model path '" + p + "' is neither a regular file nor a directory");
  return p;
}

// `dhisparse foo`: CLI11 would say "A subcommand is required"; name the commands instead.
std::string command_error(int argc, char** argv) {
  std::string list;
  for (const auto c : kCommands) list += (list.empty() ? "" : ", ") + std::string(c);
  if (argc < 2) return "a command is required; commands: " + list + " (dhisparse --help)";
  const std::string first = argv[1];
  if (first.empty() || first[0] != '-')
    if (std::find(kCommands.begin(), kCommands.end(), first) == kCommands.end())
      return "unknown command '" + first + "'; commands: " + list + " (dhisparse --help)";
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dhisparse: long-context LLM decoding engine.\n"
               "Examples:\n"
               "  dhisparse generate -p \"What is the capital of France?\" --chat\n"
               "  dhisparse generate -m model.gguf -p \"Once upon a time\" -n 64 --temperature 0.8\n"
               "  dhisparse generate -f prompt.txt -q > answer.txt\n"
               "  dhisparse info models/SmolLM2-135M-Instruct.Q4_1.gguf"};
  app.require_subcommand(1);
  app.set_version_flag("--version", dhs::cli::version_text());
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "error: " + std::string(e.what()) + "\nRun with --help for more information.\n";
  });
  if (const std::string err = command_error(argc, argv); !err.empty()) {
    std::fprintf(stderr, "error: %s\n", err.c_str());
    return 2;
  }

  dhs::EngineOptions eo;
  // The sparse flags fill a PolicySpec, which --sparse-policy's text (or each of eval's --policies) completes.
  dhs::PolicySpec spec;
  std::string sparse_policy = "dense", combine = "sum";
  dhs::GenerateOptions go;
  std::string model, prompt_arg, prompt_file, system_prompt, seed_text = "0";
  std::vector<std::string> stops;
  bool chat = false, quiet = false, no_escape = false;

  auto* gen = app.add_subcommand("generate", "Generate text from a prompt, streaming it to stdout");
  gen->add_option("-m,--model", model, "GGUF file or Hugging Face directory (default: the bundled SmolLM2-135M-Instruct)");
  auto* p_opt = gen->add_option("-p,--prompt", prompt_arg,
                                "Prompt text, with C-style escapes (\\n, \\t, \\\\, \\xHH, \\uXXXX) unless --no-escape; "
                                "@FILE reads FILE, @@TEXT is TEXT with one leading @, - reads stdin");
  gen->add_option("-f,--file", prompt_file, "Read the prompt from FILE (taken as is: no escapes; one trailing newline dropped)")
      ->excludes(p_opt);
  gen->add_flag("--no-escape", no_escape, "Take -p, --system and --stop text as typed (no \\n, \\t, ... processing)");
  gen->add_flag("--chat", chat, "Wrap the prompt as a user message in the model's chat template");
  gen->add_option("--system", system_prompt, "System message (implies --chat)");
  gen->add_option("--chat-template", eo.chat_template, "Override the chat template (file path or template text; implies --chat)");
  gen->add_option("-n,--max-tokens", go.max_tokens, "Maximum tokens to generate")->check(int_in(0, kMaxTokens))->capture_default_str();
  gen->add_option("--temperature", go.sampling.temperature, "Sampling temperature; 0 = greedy")->check(real_in(0.0, End::Closed, 100.0, End::Closed))->capture_default_str();
  gen->add_option("--top-k", go.sampling.top_k, "Keep the k most likely tokens; 0 = off")->check(int_in(0, kMaxTokens))->capture_default_str();
  gen->add_option("--top-p", go.sampling.top_p, "Nucleus sampling mass; 1 = off")->check(real_in(0.0, End::Open, 1.0, End::Closed))->capture_default_str();
  gen->add_option("--min-p", go.sampling.min_p, "Drop tokens below min_p x the top probability; 0 = off")->check(real_in(0.0, End::Closed, 1.0, End::Closed))->capture_default_str();
  gen->add_option("--repeat-penalty", go.sampling.repetition_penalty, "Repetition penalty; 1 = off")->check(real_in(0.0, End::Open, 100.0, End::Closed))->capture_default_str();
  gen->add_option("--repeat-last-n", go.sampling.repetition_window, "Tokens the repetition penalty looks back over; 0 = all")->check(int_in(0, kMaxTokens))->capture_default_str();
  gen->add_option("--seed", seed_text, "RNG seed; -1 = a random one (printed in the stats line)")->check(dhs::cli::seed_value())->type_name("INT")->capture_default_str();
  gen->add_option("--stop", stops, "Stop string (repeatable; escapes as in -p)");
  gen->add_flag("--ignore-eos", go.ignore_eos, "Keep generating after end-of-sequence tokens");
  gen->add_option("--sparse-policy", sparse_policy,
                  "KV pages each head reads: RULE[:VALUE][/R][@ESTIMATOR], RULE one of dense, coverage:GAMMA, topk:PAGES, "
                  "topfrac:FRACTION, sinkwindow:PAGES, solohead:GAMMA|PAGES (e.g. coverage:0.99/2@sketch4); the flags "
                  "below give what the text leaves out")
      ->capture_default_str();
  gen->add_option("--gamma", spec.gamma, "coverage / solohead: attention mass to keep per layer, KV head and step")->check(real_in(0.0, End::Open, 1.0, End::Closed))->capture_default_str();
  gen->add_option("--budget", spec.budget, "topk / sinkwindow / solohead: pages per list")->check(int_in(0, kMaxTokens));
  gen->add_option("--dense-below", spec.dense_below, "contexts shorter than this many tokens stay dense")->check(int_in(0, kNoLimit));
  gen->add_option("--sparse-min-tokens", spec.min_step_tokens,
                  "decode steps whose batch holds fewer context tokens in all read every page, no selection "
                  "(H200, 8B shape: selection pays from ~96k; docs/benchmarks.md)")
      ->check(int_in(0, kNoLimit));
  gen->add_option("--estimator", spec.estimator, "Page mass estimate: sketch4 (per-token 4-bit keys: the accurate one), minmax, meanspread, gaussian")->check(CLI::IsMember({"minmax", "meanspread", "gaussian", "sketch4"}))->capture_default_str();
  gen->add_option("--combine", combine, "q heads of a GQA group: sum or max")->check(CLI::IsMember({"sum", "max"}))->capture_default_str();
  gen->add_option("--sink-pages", spec.n_sink, "First pages every sparse list keeps")->check(int_in(0, 1 << 20))->capture_default_str();
  gen->add_option("--recent-pages", spec.n_recent, "Last pages every sparse list keeps")->check(int_in(0, 1 << 20))->capture_default_str();
  gen->add_option("--reselect-every", spec.reselect_every, "A layer selects its pages every N decode steps (staggered over layers) and reads its last selection plus the pages written since in between")->check(int_in(1, 64))->capture_default_str();
  gen->add_option("--device", eo.device, "Backend: cpu, or cuda (needs a GPU and a CUDA build)")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  gen->add_option("-t,--threads", eo.n_threads, "CPU threads; 0 = all (more than the machine's hardware threads are not started)")->check(int_in(0, 4096));
  gen->add_option("-c,--ctx-size", eo.max_context, "Context size in tokens, at most the model's trained context; 0 = the model's (capped at 8192 on CPU)")->check(int_in(0, kMaxTokens));
  gen->add_option("--block-size", eo.page_size, "Tokens per KV head-page")->check(int_in(1, 256))->capture_default_str();
  gen->add_option("--weights", eo.weight_type, "CPU weight storage: f16 or f32")->check(CLI::IsMember({"f16", "f32"}))->capture_default_str();
  gen->add_flag("-q,--quiet", quiet, "Print only the generated text: no prompt echo, no progress, no stats line");

  std::vector<int64_t> b_ctx = {8192, 32768, 131072}, b_batch = {1, 4, 8, 32}, b_prefill = {32768};
  std::string b_out = "bench/results/decode_e2e.jsonl", b_commit = "unknown";
  auto* bench = app.add_subcommand("bench", "GPU: time per output token and prefill of a Llama-3.1-8B-shaped model "
                                            "(random bf16 weights) at each context x batch that fits in HBM");
  bench->add_option("--ctx", b_ctx, "Context lengths")->delimiter(',')->check(int_in(1, kMaxTokens))->capture_default_str();
  bench->add_option("--batch", b_batch, "Batch sizes")->delimiter(',')->check(int_in(1, 4096))->capture_default_str();
  bench->add_option("--prefill", b_prefill, "Prompt lengths for the TTFT runs (0: none)")->delimiter(',')->check(int_in(0, kMaxTokens))->capture_default_str();
  bench->add_option("--out", b_out, "JSON lines are appended here")->capture_default_str();
  bench->add_option("--commit", b_commit, "Commit recorded in each row");
  std::vector<std::string> b_policies = {"dense"};
  std::string b_trace;
  int64_t b_trace_len = 0;
  bench->add_option("--policies", b_policies, "dense, trace:LABEL (per-head budgets from --trace), quest:TOKENS, or any --sparse-policy rule with its value (coverage:0.99, topfrac:0.3, ...); each optionally @sketch4 (chosen by the key sketch, else MinMax summaries), then /R (select every R steps)")->delimiter(',')->capture_default_str();
  bench->add_option("--trace", b_trace, "Budget trace of a real model (dhisparse eval --trace-out)");
  bench->add_option("--trace-len", b_trace_len, "Prompt length of the trace to replay (0: its longest)")->check(int_in(0, kMaxTokens));
  std::vector<int64_t> b_gemm_batch = {1, 4, 8, 32};
  std::string b_gemm_out = "bench/results/weight_gemm.jsonl";
  bool b_no_gemm = false, b_no_pdl = false, b_no_gemv_tc = false;
  bench->add_option("--gemm-batch", b_gemm_batch, "Batch sizes of the one-layer weight GEMM timing")->delimiter(',')->check(int_in(1, 4096))->capture_default_str();
  bench->add_option("--gemm-out", b_gemm_out, "JSON lines of the weight GEMM timing are appended here")->capture_default_str();
  bench->add_flag("--no-gemm", b_no_gemm, "Skip the weight GEMM timing");
  bench->add_flag("--no-pdl", b_no_pdl, "Launch the decode step's kernels plainly, not as programmatic dependents");
  int b_gemv_max_tok = 8;
  bench->add_option("--gemv-max-tok", b_gemv_max_tok, "Decode GEMMs of at most this many rows on the GEMV kernels (0: all on cuBLASLt)")->check(int_in(0, 8))->capture_default_str();
  std::vector<int> b_gemv_tc_shapes = {0};
  bench->add_option("--gemv-tc-shapes", b_gemv_tc_shapes, "Ring shapes of the tensor-core GEMV to time in the one-layer GEMM timing (gemv.h)")->delimiter(',')->check(int_in(0, 4));
  bench->add_flag("--no-gemv-tc", b_no_gemv_tc, "GEMVs on the CUDA-core kernel instead of the tensor-core one (the A/B)");

  // A CPU study at the CUDA defaults (7 tasks x 100 samples x 4k tokens) takes hours; on the
  // CPU, unless asked, a smaller one that still gives every task a few samples.
  constexpr int kCpuEvalSamples = 5;
  constexpr int64_t kCpuEvalLength = 1024;
  dhs::EvalOptions ev;
  std::vector<std::string> ev_policies = {"coverage:0.95", "coverage:0.98", "coverage:0.99"};
  bool ev_no_chat = false;
  auto* evc = app.add_subcommand("eval", "Accuracy of sparse decode: RULER-style synthetic tasks, dense and each policy "
                                         "from one prefill; score, top-1 agreement and KL vs dense, pages read");
  evc->add_option("-m,--model", model, "GGUF file or Hugging Face directory (default: the bundled model)");
  evc->add_option("--device", eo.device, "Backend: cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  evc->add_option("--tasks", ev.tasks, "niah_single, niah_multikey, niah_multivalue, niah_multiquery, vt, cwe, qa (default: all)")->delimiter(',');
  evc->add_option("--lengths", ev.lengths, "Prompt lengths in tokens (default: 4096 on cuda, 1024 on cpu)")->delimiter(',')->check(int_in(1, kMaxTokens));
  evc->add_option("--samples", ev.samples, "Samples per task and length (default: 100 on cuda, 5 on cpu)")->check(int_in(1, 1000000));
  evc->add_option("--policies", ev_policies, "Policies besides dense, as --sparse-policy spells one: coverage:G, topk:K, topfrac:F, sinkwindow:K, solohead:G|K, each optionally /R (select every R steps) and @ESTIMATOR")->delimiter(',')->capture_default_str();
  evc->add_option("--dense-below", spec.dense_below, "contexts shorter than this many tokens stay dense")->check(int_in(0, kNoLimit));
  evc->add_option("--seed", ev.seed, "Sample seed")->check(int_in(0, kNoLimit))->capture_default_str();
  evc->add_option("--estimator", spec.estimator, "Page mass estimate: sketch4, minmax, meanspread, gaussian (CPU also minmax:ALPHA, sketch4:KEEP, sketch2, psketch4:R[:KEEP] and qsketch4:R[:KEEP] on a key basis fitted on a calibration sample)")->capture_default_str();
  evc->add_option("--combine", combine, "q heads of a GQA group: sum or max")->check(CLI::IsMember({"sum", "max"}))->capture_default_str();
  evc->add_option("--sink-pages", spec.n_sink, "First pages every sparse list keeps")->check(int_in(0, 1 << 20))->capture_default_str();
  evc->add_option("--recent-pages", spec.n_recent, "Last pages every sparse list keeps")->check(int_in(0, 1 << 20))->capture_default_str();
  evc->add_flag("--no-chat", ev_no_chat, "Raw prompts, without the model's chat template");
  evc->add_option("-c,--ctx-size", eo.max_context, "Context size in tokens, at most the model's trained context; 0 = model's")->check(int_in(0, kMaxTokens));
  evc->add_option("--out", ev.out, "JSON lines are appended here");
  evc->add_option("--trace-out", ev.trace_out, "Per-(layer, KV head) pages-read fractions per policy and length (JSON)");
  evc->add_option("--commit", ev.commit, "Commit recorded in each row");

  auto* info = app.add_subcommand("info", "Print a model's architecture, shapes, dtypes, context, RoPE and tokenizer, "
                                          "after the checks loading makes (without loading the weights)");
  info->add_option("model", model, "GGUF file or Hugging Face directory (default: the bundled model)");

  try {
    app.parse(argc, argv);
    if (gen->parsed()) {
      // Checks across flags, still before any model loads.
      if (gen->count("--prompt") == 0 && gen->count("--file") == 0)
        throw CLI::RequiredError("a prompt (-p/--prompt TEXT, -p @FILE, -p - for stdin, or -f/--file FILE)");
      for (const std::string& s : stops)
        if (s.empty()) throw CLI::ValidationError("--stop", "an empty stop string would match nothing");
      // One PolicySpec from the text and the flags; --gamma and --budget only where the rule reads them.
      spec.combine = combine == "max" ? dhs::GroupCombine::Max : dhs::GroupCombine::Sum;
      try {
        eo.policy = dhs::PolicySpec::parse(sparse_policy, spec);
      } catch (const dhs::Error& e) {
        throw CLI::ValidationError("--sparse-policy", e.what());
      }
      const dhs::RuleArg arg = dhs::rule_info(eo.policy.rule).arg;
      const std::string pol = eo.policy.rule_name();
      if (gen->count("--gamma") > 0 && arg != dhs::RuleArg::Mass && arg != dhs::RuleArg::MassOrPages)
        throw CLI::ValidationError("--gamma", "applies to --sparse-policy coverage or solohead, not " + pol);
      if (gen->count("--budget") > 0 && arg != dhs::RuleArg::Pages && arg != dhs::RuleArg::MassOrPages)
        throw CLI::ValidationError("--budget", "applies to --sparse-policy topk, sinkwindow or solohead, not " + pol);
    }
    if (evc->parsed()) {
      spec.combine = combine == "max" ? dhs::GroupCombine::Max : dhs::GroupCombine::Sum;
      for (const std::string& p : ev_policies) {
        try {
          ev.policies.push_back(dhs::PolicySpec::parse(p, spec));
        } catch (const dhs::Error& e) {
          throw CLI::ValidationError("--policies", e.what());
        }
      }
    }
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  dhs::cli::StdoutWriter out;
  std::string oom_while = "loading the model";  // what an std::bad_alloc interrupted, for its message
  // The exit status once what went to stdout through printf / std::cout (info, eval) is out:
  // a write error throws, a reader gone gives the SIGPIPE status (stdout_writer.h).
  auto stdout_status = [](int rc) {
    bool gone = false;
    if (const std::string err = dhs::cli::flush_stdout(&gone); !err.empty()) {
      if (gone) return dhs::cli::kExitReaderGone;
      throw dhs::Error(err);
    }
    return rc;
  };
  try {
    if (bench->parsed()) {
#ifdef DHS_HAVE_CUDA
      dhs::E2eBenchOptions bo;
      bo.ctx = b_ctx;
      bo.batch = b_batch;
      bo.prefill = b_prefill;
      bo.out = b_out;
      bo.commit = b_commit;
      bo.policies = b_policies;
      bo.trace = b_trace;
      bo.trace_len = b_trace_len;
      bo.gemm_batch = b_no_gemm ? std::vector<int64_t>{} : b_gemm_batch;
      bo.gemm_out = b_gemm_out;
      bo.gemv_max_tok = b_gemv_max_tok;
      bo.pdl = !b_no_pdl;
      bo.gemv_tc = !b_no_gemv_tc;
      bo.gemv_tc_shapes = b_gemv_tc_shapes;
      return dhs::run_e2e_bench(bo);
#else
      throw dhs::Error("bench: this build has no CUDA backend (nvcc was not found when it was configured)");
#endif
    }
    if (info->parsed()) {
      std::cout << dhs::describe_model(resolve_model(model, info->count("model") > 0));
      return stdout_status(0);
    }
    eo.model_path = resolve_model(model, (evc->parsed() ? evc : gen)->count("--model") > 0);
    oom_while = eo.max_context > 0 ? "loading the model with a KV cache of " + std::to_string(eo.max_context) + " tokens"
                                    : "loading the model and its KV cache";
    if (eo.n_threads > 0) {
      // ThreadPool::set_global_threads caps the pool the same way; say so rather than be slow quietly.
      const int hw = static_cast<int>(std::thread::hardware_concurrency());
      if (hw > 0 && eo.n_threads > hw)
        std::fprintf(stderr, "note: -t %d is more than the %d hardware threads; using %d\n", eo.n_threads, hw, hw);
    }
    if (evc->parsed()) {
      if (eo.device == "cpu") {
        if (evc->count("--samples") == 0) ev.samples = kCpuEvalSamples;
        if (evc->count("--lengths") == 0) ev.lengths = {kCpuEvalLength};
      }
      ev.chat = !ev_no_chat;
      ev.device = eo.device;
      ev.estimator = spec.estimator;
      ev.model_name = std::filesystem::path(eo.model_path).filename().string();
      eo.policy = spec;  // a scoring policy loads the page summaries every policy needs
      eo.policy.rule = dhs::SelectRule::Coverage;
      eo.keep_all_estimators = true;  // ... and every estimator's, compared on one prefill
      eo.progress = [](int64_t done, int64_t total) { progress_bar("loading", done, total); };
      auto engine = dhs::Engine::load(eo);
      oom_while = "evaluating";
      ev.progress = [](int64_t done, int64_t total) { progress_bar("eval", done, total); };
      const bool tty = isatty(STDERR_FILENO);
      ev.log = [tty](const std::string& line) {
        std::fprintf(stderr, "%s%s\n", tty ? "\r\033[K" : "", line.c_str());  // over the bar, on a terminal
        std::fflush(stderr);
      };
      return stdout_status(dhs::run_eval(*engine, ev));
    }
    // The prompt is read (file, stdin) before the model loads: a bad path costs no load.
    if (gen->count("--system") > 0 || gen->count("--chat-template") > 0) chat = true;
    const std::string prompt = gen->count("--file") > 0 ? dhs::cli::read_prompt_file(prompt_file)
                                                        : dhs::cli::prompt_from_arg(prompt_arg, !no_escape, std::cin);
    if (!no_escape) system_prompt = dhs::cli::process_escapes(system_prompt);
    for (const std::string& s : stops) go.stop.push_back(no_escape ? s : dhs::cli::process_escapes(s));
    go.sampling.seed = dhs::cli::resolve_seed(seed_text);
    if (!quiet) eo.progress = [](int64_t done, int64_t total) { progress_bar("loading", done, total); };
    auto engine = dhs::Engine::load(eo);
    // A raw prompt is the operator's own text, special tokens and all (as llama.cpp reads -p);
    // chat messages are user text: their special-token spellings stay text.
    std::vector<int32_t> ids;
    if (chat) {
      std::vector<dhs::ChatMessage> msgs;
      if (!system_prompt.empty()) msgs.push_back({"system", system_prompt});
      msgs.push_back({"user", prompt});
      ids = engine->tokenize_chat(msgs, true);
    } else {
      ids = engine->tokenize(prompt);
    }
    oom_while = "generating";
    // The prompt is echoed with the first generated text, once the prefill has passed: a prompt
    // the engine rejects (too long for -c) gives the error alone, not the prompt and then it.
    bool echo = !chat && !quiet;
    auto res = engine->generate(ids, go, [&](const std::string& piece) {
      if (std::exchange(echo, false)) out.write(prompt);
      return out.write(piece);
    });
    if (echo) out.write(prompt);
    out.end_line();
    if (out.failed()) {
      if (out.reader_gone()) return dhs::cli::kExitReaderGone;  // `| head`: quiet, as cat (stdout_writer.h)
      throw dhs::Error(out.error());
    }
    if (!quiet) {
      const double pp = res.prompt_seconds > 0 ? res.n_prompt / res.prompt_seconds : 0.0;
      const double tg = res.decode_seconds > 0 ? (res.tokens.size() - 1) / res.decode_seconds : 0.0;
      std::fprintf(stderr, "prompt: %lld tokens, %.1f tokens/s | decode: %zu tokens, %.1f tokens/s | finish: %s",
                   static_cast<long long>(res.n_prompt), pp, res.tokens.size(), tg, res.finish_reason.c_str());
      if (!eo.policy.dense()) std::fprintf(stderr, " | KV pages read: %.1f%%", 100.0 * res.pages_read_frac);
      std::fprintf(stderr, " | seed: %llu\n", static_cast<unsigned long long>(go.sampling.seed));
    }
    return 0;
  } catch (const std::bad_alloc&) {
    out.end_line();
    std::fprintf(stderr, "error: out of memory %s; lower --ctx-size (-c), or use a smaller model\n", oom_while.c_str());
    return 1;
  } catch (const std::exception& e) {
    out.end_line();  // the message starts a line of its own, after any echoed prompt
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
