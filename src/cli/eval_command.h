// `dhisparse eval`: the accuracy study of sparse decode (include/dhisparse/eval.h).
#pragma once
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "dhisparse/eval.h"

namespace dhs::cli {

class EvalCommand {
 public:
  explicit EvalCommand(CLI::App& app);
  bool parsed() const { return app_->parsed(); }
  void check();  // parses --policies over the flags (throws CLI::Error)
  int run(std::string& oom_while);

 private:
  // A CPU study at the CUDA defaults (7 tasks x 100 samples x 4k tokens) takes hours; on the
  // CPU, unless asked, a smaller one that still gives every task a few samples.
  static constexpr int kCpuEvalSamples = 5;
  static constexpr int64_t kCpuEvalLength = 1024;

  CLI::App* app_ = nullptr;
  EngineOptions eo_;
  EvalOptions ev_;
  PolicyFlags policy_;
  std::string draft_ = "sinkwindow:16";  // --draft-policy
  std::string model_;
  std::vector<std::string> policies_ = {"coverage:0.95", "coverage:0.98", "coverage:0.99"};
  bool no_chat_ = false;
};

}  // namespace dhs::cli
