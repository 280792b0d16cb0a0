#include "cli/bench_command.h"

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"

namespace dhs::cli {

BenchCommand::BenchCommand(CLI::App& app) {
  app_ = app.add_subcommand("bench", "GPU: time per output token and prefill of a Llama-3.1-8B-shaped model "
                                     "(random f16 weights); runs dhisparse-bench (`dhisparse bench --help`)");
  app_->prefix_command();    // every argument after "bench" goes to the tool as it is
  app_->set_help_flag();     // --help included
}

int BenchCommand::run(const char* argv0) {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) self = argv0;
  const std::filesystem::path tool = self.parent_path() / "dhisparse-bench";
  if (!std::filesystem::is_regular_file(tool, ec))
    throw Error("bench: " + tool.string() + " is not there (a build with the CUDA backend builds it beside dhisparse)");
  std::vector<std::string> args = {tool.string()};
  for (const std::string& a : app_->remaining()) args.push_back(a);
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  execv(cargs[0], cargs.data());
  throw Error("bench: cannot run " + tool.string() + ": " + std::error_code(errno, std::generic_category()).message());
}

}  // namespace dhs::cli
