// `dhisparse`: the command-line front end. Uses only the public API.
//   dhisparse generate [-m MODEL] -p PROMPT [--chat] [-n N] [sampling flags]
//   dhisparse info [MODEL]
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

#include "dhisparse/engine.h"
#include "dhisparse/eval.h"
#ifdef DHS_HAVE_CUDA
#include "bench/e2e_bench.h"
#endif

namespace {

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

void progress_bar(int64_t done, int64_t total) {
  if (!isatty(STDERR_FILENO) && done != total) return;
  const int width = 30;
  const int filled = total > 0 ? static_cast<int>(width * done / total) : width;
  std::fprintf(stderr, "\rloading [%s%s] %3d%%", std::string(static_cast<size_t>(filled), '#').c_str(),
               std::string(static_cast<size_t>(width - filled), '.').c_str(),
               total > 0 ? static_cast<int>(100 * done / total) : 100);
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

std::string resolve_model(const std::string& m) {
  if (!m.empty()) return m;
  const std::string p = default_model_path();
  if (!std::filesystem::exists(p))
    throw dhs::Error("the default model is not here (" + p +
                     "); fetch it with `bash scripts/fetch_model.sh`, or pass -m MODEL");
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dhisparse: long-context LLM decoding engine.\n"
               "Examples:\n"
               "  dhisparse generate -p \"What is the capital of France?\" --chat\n"
               "  dhisparse generate -m model.gguf -p \"Once upon a time\" -n 64 --temperature 0.8\n"
               "  dhisparse info models/SmolLM2-135M-Instruct.Q4_1.gguf"};
  app.require_subcommand(1);

  dhs::EngineOptions eo;
  dhs::GenerateOptions go;
  std::string model, prompt, system_prompt;
  bool chat = false, quiet = false;

  auto* gen = app.add_subcommand("generate", "Generate text from a prompt, streaming it to stdout");
  gen->add_option("-m,--model", model, "GGUF file or Hugging Face directory (default: the bundled SmolLM2-135M-Instruct)");
  gen->add_option("-p,--prompt", prompt, "Prompt text")->required();
  gen->add_flag("--chat", chat, "Wrap the prompt as a user message in the model's chat template");
  gen->add_option("--system", system_prompt, "System message (with --chat)");
  gen->add_option("--chat-template", eo.chat_template, "Override the chat template (file path or template text)");
  gen->add_option("-n,--max-tokens", go.max_tokens, "Maximum tokens to generate")->check(CLI::Range(0, 1 << 24))->capture_default_str();
  gen->add_option("--temperature", go.sampling.temperature, "Sampling temperature; 0 = greedy")->check(CLI::Range(0.0, 100.0))->capture_default_str();
  gen->add_option("--top-k", go.sampling.top_k, "Keep the k most likely tokens; 0 = off")->check(CLI::NonNegativeNumber)->capture_default_str();
  gen->add_option("--top-p", go.sampling.top_p, "Nucleus sampling mass; 1 = off")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  gen->add_option("--min-p", go.sampling.min_p, "Drop tokens below min_p x the top probability; 0 = off")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  gen->add_option("--repeat-penalty", go.sampling.repetition_penalty, "Repetition penalty; 1 = off")->check(CLI::Range(0.01, 100.0))->capture_default_str();
  gen->add_option("--repeat-last-n", go.sampling.repetition_window, "Tokens the repetition penalty looks back over; 0 = all")->check(CLI::NonNegativeNumber)->capture_default_str();
  gen->add_option("--seed", go.sampling.seed, "RNG seed")->capture_default_str();
  gen->add_option("--stop", go.stop, "Stop string (repeatable)");
  gen->add_flag("--ignore-eos", go.ignore_eos, "Keep generating after end-of-sequence tokens");
  gen->add_option("--sparse-policy", eo.sparse_policy, "KV pages each head reads: dense, coverage (gamma), topk (budget), sinkwindow, solohead")
      ->check(CLI::IsMember({"dense", "coverage", "topk", "sinkwindow", "solohead"}))->capture_default_str();
  gen->add_option("--gamma", eo.gamma, "coverage: attention mass to keep per layer, KV head and step")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  gen->add_option("--budget", eo.budget, "topk / sinkwindow / solohead: pages per list")->check(CLI::NonNegativeNumber);
  gen->add_option("--dense-below", eo.dense_below, "contexts shorter than this many tokens stay dense")->check(CLI::NonNegativeNumber);
  gen->add_option("--sparse-min-tokens", eo.sparse_min_tokens,
                  "decode steps whose batch holds fewer context tokens in all read every page, no selection "
                  "(H200, 8B shape: selection pays from ~96k; docs/benchmarks.md)")
      ->check(CLI::NonNegativeNumber);
  gen->add_option("--estimator", eo.estimator, "Page mass estimate: sketch4 (per-token 4-bit keys: the accurate one), minmax, meanspread, gaussian")->check(CLI::IsMember({"minmax", "meanspread", "gaussian", "sketch4"}))->capture_default_str();
  gen->add_option("--combine", eo.combine, "q heads of a GQA group: sum or max")->check(CLI::IsMember({"sum", "max"}))->capture_default_str();
  gen->add_option("--sink-pages", eo.sink_pages, "First pages every sparse list keeps")->check(CLI::Range(0, 1 << 20))->capture_default_str();
  gen->add_option("--recent-pages", eo.recent_pages, "Last pages every sparse list keeps")->check(CLI::Range(0, 1 << 20))->capture_default_str();
  gen->add_option("--reselect-every", eo.reselect_every, "A layer selects its pages every N decode steps (staggered over layers) and reads its last selection plus the pages written since in between")->check(CLI::Range(1, 64))->capture_default_str();
  gen->add_option("--device", eo.device, "Backend: cpu, or cuda (needs a GPU and a CUDA build)")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  gen->add_option("-t,--threads", eo.n_threads, "CPU threads; 0 = all")->check(CLI::NonNegativeNumber);
  gen->add_option("-c,--ctx-size", eo.max_context, "Context size in tokens; 0 = model's (capped at 8192 on CPU)")->check(CLI::NonNegativeNumber);
  gen->add_option("--block-size", eo.page_size, "Tokens per KV head-page")->check(CLI::Range(1, 256))->capture_default_str();
  gen->add_option("--weights", eo.weight_type, "CPU weight storage: f16 or f32")->check(CLI::IsMember({"f16", "f32"}))->capture_default_str();
  gen->add_flag("-q,--quiet", quiet, "Print only the generated text");

  std::vector<int64_t> b_ctx = {8192, 32768, 131072}, b_batch = {1, 4, 8, 32}, b_prefill = {32768};
  std::string b_out = "bench/results/decode_e2e.jsonl", b_commit = "unknown";
  auto* bench = app.add_subcommand("bench", "GPU: time per output token and prefill of a Llama-3.1-8B-shaped model "
                                            "(random bf16 weights) at each context x batch that fits in HBM");
  bench->add_option("--ctx", b_ctx, "Context lengths")->delimiter(',')->capture_default_str();
  bench->add_option("--batch", b_batch, "Batch sizes")->delimiter(',')->capture_default_str();
  bench->add_option("--prefill", b_prefill, "Prompt lengths for the TTFT runs")->delimiter(',')->capture_default_str();
  bench->add_option("--out", b_out, "JSON lines are appended here")->capture_default_str();
  bench->add_option("--commit", b_commit, "Commit recorded in each row");
  std::vector<std::string> b_policies = {"dense"};
  std::string b_trace;
  int64_t b_trace_len = 0;
  bench->add_option("--policies", b_policies, "dense, trace:LABEL (per-head budgets from --trace), quest:TOKENS; each optionally @sketch4 (chosen by the key sketch), then /R (select every R steps)")->delimiter(',')->capture_default_str();
  bench->add_option("--trace", b_trace, "Budget trace of a real model (dhisparse eval --trace-out)");
  bench->add_option("--trace-len", b_trace_len, "Prompt length of the trace to replay (0: its longest)");
  std::vector<int64_t> b_gemm_batch = {1, 4, 8, 32};
  std::string b_gemm_out = "bench/results/weight_gemm.jsonl";
  bool b_no_gemm = false, b_no_pdl = false, b_no_gemv_tc = false;
  bench->add_option("--gemm-batch", b_gemm_batch, "Batch sizes of the one-layer weight GEMM timing")->delimiter(',')->capture_default_str();
  bench->add_option("--gemm-out", b_gemm_out, "JSON lines of the weight GEMM timing are appended here")->capture_default_str();
  bench->add_flag("--no-gemm", b_no_gemm, "Skip the weight GEMM timing");
  bench->add_flag("--no-pdl", b_no_pdl, "Launch the decode step's kernels plainly, not as programmatic dependents");
  int b_gemv_max_tok = 8;
  bench->add_option("--gemv-max-tok", b_gemv_max_tok, "Decode GEMMs of at most this many rows on the GEMV kernels (0: all on cuBLASLt)")->check(CLI::Range(0, 8))->capture_default_str();
  std::vector<int> b_gemv_tc_shapes = {0};
  bench->add_option("--gemv-tc-shapes", b_gemv_tc_shapes, "Ring shapes of the tensor-core GEMV to time in the one-layer GEMM timing (gemv.h)")->delimiter(',')->check(CLI::Range(0, 4));
  bench->add_flag("--no-gemv-tc", b_no_gemv_tc, "GEMVs on the CUDA-core kernel instead of the tensor-core one (the A/B)");

  dhs::EvalOptions ev;
  std::vector<std::string> ev_policies = {"coverage:0.95", "coverage:0.98", "coverage:0.99"};
  bool ev_no_chat = false;
  auto* evc = app.add_subcommand("eval", "Accuracy of sparse decode: RULER-style synthetic tasks, dense and each policy "
                                         "from one prefill; score, top-1 agreement and KL vs dense, pages read");
  evc->add_option("-m,--model", model, "GGUF file or Hugging Face directory (default: the bundled model)");
  evc->add_option("--device", eo.device, "Backend: cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  evc->add_option("--tasks", ev.tasks, "niah_single, niah_multikey, niah_multivalue, niah_multiquery, vt, cwe, qa (default: all)")->delimiter(',');
  evc->add_option("--lengths", ev.lengths, "Prompt lengths in tokens")->delimiter(',')->capture_default_str();
  evc->add_option("--samples", ev.samples, "Samples per task and length")->check(CLI::Range(1, 1000000))->capture_default_str();
  evc->add_option("--policies", ev_policies, "Policies besides dense: coverage:G, topk:K, sinkwindow:K, solohead:G|K, each optionally /R (select every R steps) and @ESTIMATOR")->delimiter(',')->capture_default_str();
  evc->add_option("--dense-below", ev.dense_below, "contexts shorter than this many tokens stay dense")->check(CLI::NonNegativeNumber);
  evc->add_option("--seed", ev.seed, "Sample seed")->capture_default_str();
  evc->add_option("--estimator", eo.estimator, "Page mass estimate: sketch4, minmax, meanspread, gaussian (CPU also minmax:ALPHA, sketch4:KEEP, sketch2, psketch4:R[:KEEP] and qsketch4:R[:KEEP] on a key basis fitted on a calibration sample)")->capture_default_str();
  evc->add_option("--combine", eo.combine, "q heads of a GQA group: sum or max")->check(CLI::IsMember({"sum", "max"}))->capture_default_str();
  evc->add_option("--sink-pages", eo.sink_pages, "First pages every sparse list keeps")->check(CLI::Range(0, 1 << 20))->capture_default_str();
  evc->add_option("--recent-pages", eo.recent_pages, "Last pages every sparse list keeps")->check(CLI::Range(0, 1 << 20))->capture_default_str();
  evc->add_flag("--no-chat", ev_no_chat, "Raw prompts, without the model's chat template");
  evc->add_option("-c,--ctx-size", eo.max_context, "Context size in tokens; 0 = model's")->check(CLI::NonNegativeNumber);
  evc->add_option("--out", ev.out, "JSON lines are appended here");
  evc->add_option("--trace-out", ev.trace_out, "Per-(layer, KV head) pages-read fractions per policy and length (JSON)");
  evc->add_option("--commit", ev.commit, "Commit recorded in each row");

  auto* info = app.add_subcommand("info", "Print a model's architecture, shapes, dtypes, context, RoPE and tokenizer");
  info->add_option("model", model, "GGUF file or Hugging Face directory (default: the bundled model)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

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
      std::cout << dhs::describe_model(resolve_model(model));
      return 0;
    }
    eo.model_path = resolve_model(model);
    if (evc->parsed()) {
      for (const std::string& p : ev_policies) ev.policies.push_back(dhs::parse_eval_policy(p));
      ev.chat = !ev_no_chat;
      ev.device = eo.device;
      ev.estimator = eo.estimator;
      ev.combine = eo.combine;
      ev.model_name = std::filesystem::path(eo.model_path).filename().string();
      eo.sparse_policy = "coverage";  // loads the page summaries every scoring policy needs
      eo.keep_all_estimators = true;  // ... and every estimator's, compared on one prefill
      auto engine = dhs::Engine::load(eo);
      ev.progress = progress_bar;
      return dhs::run_eval(*engine, ev);
    }
    if (!quiet) eo.progress = progress_bar;
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
    if (!chat) std::cout << prompt;
    std::cout.flush();
    auto res = engine->generate(ids, go, [](const std::string& piece) {
      std::cout << piece;
      std::cout.flush();
      return true;
    });
    std::cout << "\n";
    if (!quiet) {
      const double pp = res.prompt_seconds > 0 ? res.n_prompt / res.prompt_seconds : 0.0;
      const double tg = res.decode_seconds > 0 ? (res.tokens.size() - 1) / res.decode_seconds : 0.0;
      std::fprintf(stderr, "prompt: %lld tokens, %.1f tokens/s | decode: %zu tokens, %.1f tokens/s | finish: %s",
                   static_cast<long long>(res.n_prompt), pp, res.tokens.size(), tg, res.finish_reason.c_str());
      if (eo.sparse_policy != "dense") std::fprintf(stderr, " | KV pages read: %.1f%%", 100.0 * res.pages_read_frac);
      std::fprintf(stderr, "\n");
    }
    return 0;
  } catch (const dhs::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
