// `dhisparse bench ARGS`: runs the GPU bench tool `dhisparse-bench` (bench/bench_main.cpp, built
// with the CUDA backend) that sits next to this binary, with the same arguments. The bench is a
// tool apart: the product binary does not link it.
#pragma once
#include <CLI/CLI.hpp>

namespace dhs::cli {

class BenchCommand {
 public:
  explicit BenchCommand(CLI::App& app);
  bool parsed() const { return app_->parsed(); }
  int run(const char* argv0);  // replaces this process with the tool; returns only on failure

 private:
  CLI::App* app_ = nullptr;
};

}  // namespace dhs::cli
