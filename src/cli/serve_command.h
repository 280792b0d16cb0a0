// `dhisparse serve [MODEL]`: the OpenAI-compatible HTTP server (src/server/) over one engine,
// flags named as vLLM's. Listens before the model loads (/health: 503 until ready); SIGTERM or
// SIGINT stops accepting, lets running requests finish for --shutdown-timeout, aborts the rest,
// and exits 0.
#pragma once
#include <CLI/CLI.hpp>

#include <string>

#include "cli/cli_common.h"
#include "dhisparse/engine.h"
#include "dhisparse/scheduler.h"
#include "server/server_options.h"

namespace dhs::cli {

class ServeCommand {
 public:
  explicit ServeCommand(CLI::App& app);  // adds the subcommand and its flags
  bool parsed() const { return app_->parsed(); }
  // Checks across flags, before any model loads (throws CLI::Error).
  void check();
  int run(std::string& oom_while);

 private:
  CLI::App* app_ = nullptr;
  EngineOptions eo_;
  SchedulerOptions so_;
  server::ServerOptions http_;
  PolicyFlags policy_;
  std::string sparse_policy_ = "dense";
  std::string model_;
  int64_t max_model_len_ = 0;
  std::string kv_io_admit_ = "throughput";  // --kv-io-admit
};

}  // namespace dhs::cli
