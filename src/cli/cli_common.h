// What the CLI's commands share: limits of numeric flags, where the default model is, the
// progress bar, the model path check, the exit status after stdout, and the sparse-policy flags.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <limits>
#include <string>

#include "dhisparse/engine.h"

namespace dhs::cli {

inline constexpr int64_t kMaxTokens = int64_t{1} << 24;  // the engine's largest context (local_engine.cpp)
inline constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

// Where the default model lives: $DHS_MODELS_DIR, else models/ beside the binary's
// source tree, else ./models.
std::string default_model_path();

// A bar on a terminal; elsewhere (a log, a pipe) nothing but the final state, since "\r"
// redraws would fill the log. eval's progress lines (EvalOptions::log) are what a log gets.
void progress_bar(const char* what, int64_t done, int64_t total);

// A model path the loader may open: a regular file or a directory (`given`: -m was on the
// command line, so an empty one is an error rather than the default model).
std::string resolve_model(const std::string& m, bool given);

// The exit status once what went to stdout through printf / std::cout (info, eval) is out:
// a write error throws, a reader gone gives the SIGPIPE status (stdout_writer.h).
int stdout_status(int rc);

// The GPU's weight storage, for generate, eval and serve: --gpu-weights (native | f16) and
// --quantization (none | fp8).
void add_gpu_weight_options(CLI::App* app, EngineOptions& eo);

// The KV hierarchy's flags, for generate and serve: --cpu-kv-gb (alias --swap-space) and
// --kv-device-budget.
void add_kv_tier_options(CLI::App* app, EngineOptions& eo);

// The sparse flags of generate and eval: they fill a PolicySpec that the policy text (generate's
// --sparse-policy, each of eval's --policies) completes.
struct PolicyFlags {
  PolicySpec spec;
  std::string combine = "sum";
  // --estimator (estimator_help; `any_estimator`: the CPU studies' too), --combine, --sink-pages,
  // --recent-pages, --dense-below.
  void add(CLI::App* app, const std::string& estimator_help, bool any_estimator);
  // `text` over the flags; a bad one is a CLI::ValidationError of `option`.
  PolicySpec parse(const std::string& text, const std::string& option);
};

}  // namespace dhs::cli
