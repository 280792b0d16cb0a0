// `dhisparse bench` (GPU builds): TPOT and TTFT of an 8B-shaped model with random weights
// (bench/e2e_bench.h). Still linked into the product binary; moving it to a tool of its own is
// part of the architecture issue that is left.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace dhs::cli {

class BenchCommand {
 public:
  explicit BenchCommand(CLI::App& app);
  bool parsed() const { return app_->parsed(); }
  int run();

 private:
  CLI::App* app_ = nullptr;
  std::vector<int64_t> ctx_ = {8192, 32768, 131072}, batch_ = {1, 4, 8, 32}, prefill_ = {32768};
  std::string out_ = "bench/results/decode_e2e.jsonl", commit_ = "unknown";
  std::vector<std::string> policies_ = {"dense"};
  std::string trace_;
  int64_t trace_len_ = 0;
  std::vector<int64_t> gemm_batch_ = {1, 4, 8, 32};
  std::string gemm_out_ = "bench/results/weight_gemm.jsonl";
  bool no_gemm_ = false, no_pdl_ = false, no_gemv_tc_ = false;
  int gemv_max_tok_ = 8;
  std::vector<int> gemv_tc_shapes_ = {0};
};

}  // namespace dhs::cli
