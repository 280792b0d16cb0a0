// `dhisparse generate`: one prompt (raw or as a chat), streamed to stdout, a stats line on stderr.
#pragma once
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "cli/stdout_writer.h"
#include "dhisparse/engine.h"

namespace dhs::cli {

class GenerateCommand {
 public:
  explicit GenerateCommand(CLI::App& app);  // adds the subcommand and its flags
  bool parsed() const { return app_->parsed(); }
  // Checks across flags, after parsing and before any model loads (throws CLI::Error).
  void check();
  // oom_while: what an std::bad_alloc would have interrupted, for main's message.
  int run(StdoutWriter& out, std::string& oom_while);

 private:
  CLI::App* app_ = nullptr;
  EngineOptions eo_;
  GenerateOptions go_;
  PolicyFlags policy_;
  std::string sparse_policy_ = "dense";
  std::string model_, prompt_arg_, prompt_file_, system_prompt_, seed_text_ = "0";
  std::vector<std::string> stops_;
  bool chat_ = false, quiet_ = false, no_escape_ = false;
};

}  // namespace dhs::cli
