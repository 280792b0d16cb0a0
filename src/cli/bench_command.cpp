#include "cli/bench_command.h"

#include "cli/cli_common.h"
#include "cli/option_checks.h"
#include "core/error.h"
#ifdef DHS_HAVE_CUDA
#include "bench/e2e_bench.h"
#endif

namespace dhs::cli {

BenchCommand::BenchCommand(CLI::App& app) {
  app_ = app.add_subcommand("bench", "GPU: time per output token and prefill of a Llama-3.1-8B-shaped model "
                                     "(random bf16 weights) at each context x batch that fits in HBM");
  app_->add_option("--ctx", ctx_, "Context lengths")->delimiter(',')->check(int_in(1, kMaxTokens))->capture_default_str();
  app_->add_option("--batch", batch_, "Batch sizes")->delimiter(',')->check(int_in(1, 4096))->capture_default_str();
  app_->add_option("--prefill", prefill_, "Prompt lengths for the TTFT runs (0: none)")->delimiter(',')->check(int_in(0, kMaxTokens))->capture_default_str();
  app_->add_option("--out", out_, "JSON lines are appended here")->capture_default_str();
  app_->add_option("--commit", commit_, "Commit recorded in each row");
  app_->add_option("--policies", policies_, "dense, trace:LABEL (per-head budgets from --trace), quest:TOKENS, or any --sparse-policy rule with its value (coverage:0.99, topfrac:0.3, ...); each optionally @sketch4 (chosen by the key sketch, else MinMax summaries), then /R (select every R steps)")->delimiter(',')->capture_default_str();
  app_->add_option("--trace", trace_, "Budget trace of a real model (dhisparse eval --trace-out)");
  app_->add_option("--trace-len", trace_len_, "Prompt length of the trace to replay (0: its longest)")->check(int_in(0, kMaxTokens));
  app_->add_option("--gemm-batch", gemm_batch_, "Batch sizes of the one-layer weight GEMM timing")->delimiter(',')->check(int_in(1, 4096))->capture_default_str();
  app_->add_option("--gemm-out", gemm_out_, "JSON lines of the weight GEMM timing are appended here")->capture_default_str();
  app_->add_flag("--no-gemm", no_gemm_, "Skip the weight GEMM timing");
  app_->add_flag("--no-pdl", no_pdl_, "Launch the decode step's kernels plainly, not as programmatic dependents");
  app_->add_option("--gemv-max-tok", gemv_max_tok_, "Decode GEMMs of at most this many rows on the GEMV kernels (0: all on cuBLASLt)")->check(int_in(0, 8))->capture_default_str();
  app_->add_option("--gemv-tc-shapes", gemv_tc_shapes_, "Ring shapes of the tensor-core GEMV to time in the one-layer GEMM timing (gemv.h)")->delimiter(',')->check(int_in(0, 4));
  app_->add_flag("--no-gemv-tc", no_gemv_tc_, "GEMVs on the CUDA-core kernel instead of the tensor-core one (the A/B)");
}

int BenchCommand::run() {
#ifdef DHS_HAVE_CUDA
  E2eBenchOptions bo;
  bo.ctx = ctx_;
  bo.batch = batch_;
  bo.prefill = prefill_;
  bo.out = out_;
  bo.commit = commit_;
  bo.policies = policies_;
  bo.trace = trace_;
  bo.trace_len = trace_len_;
  bo.gemm_batch = no_gemm_ ? std::vector<int64_t>{} : gemm_batch_;
  bo.gemm_out = gemm_out_;
  bo.gemv_max_tok = gemv_max_tok_;
  bo.pdl = !no_pdl_;
  bo.gemv_tc = !no_gemv_tc_;
  bo.gemv_tc_shapes = gemv_tc_shapes_;
  return run_e2e_bench(bo);
#else
  throw Error("bench: this build has no CUDA backend (nvcc was not found when it was configured)");
#endif
}

}  // namespace dhs::cli
