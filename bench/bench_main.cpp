// dhisparse-bench: time per output token and prefill of a Llama-3.1-8B-shaped model with random
// f16 weights on the GPU (e2e_bench.h). A tool apart from the product binary, which runs it for
// `dhisparse bench ARGS` (src/cli/bench_command.cpp) when it sits next to it.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include "bench/e2e_bench.h"
#include "bench/hierarchy_bench.h"
#include "cli/cli_common.h"
#include "cli/option_checks.h"

int main(int argc, char** argv) {
  using dhs::cli::int_in;
  using dhs::cli::kMaxTokens;
  CLI::App app{"GPU: time per output token and prefill of a Llama-3.1-8B-shaped model (random f16 weights) at each "
               "context x batch that fits in HBM",
               "dhisparse bench"};
  dhs::E2eBenchOptions bo;
  bo.ctx = {8192, 32768, 131072};
  bo.batch = {1, 4, 8, 32};
  bo.prefill = {32768};
  bo.out = "bench/results/decode_e2e.jsonl";
  bo.commit = "unknown";
  bo.policies = {"dense"};
  bo.gemm_batch = {1, 4, 8, 32};
  bo.gemm_out = "bench/results/weight_gemm.jsonl";
  bo.gemv_max_tok = 8;
  bo.gemv_tc_shapes = {0};
  bool no_gemm = false, no_pdl = false, no_gemv_tc = false, hierarchy = false;
  bool batch_given = false;
  std::string draft_q = "none";
  dhs::HierarchyBenchOptions ho;
  app.add_option("--ctx", bo.ctx, "Context lengths")->delimiter(',')->check(int_in(1, kMaxTokens))->capture_default_str();
  app.add_option("--batch", bo.batch, "Batch sizes")->delimiter(',')->check(int_in(1, 4096))->capture_default_str();
  app.add_option("--prefill", bo.prefill, "Prompt lengths for the TTFT runs (0: none)")->delimiter(',')->check(int_in(0, kMaxTokens))->capture_default_str();
  app.add_option("--out", bo.out, "JSON lines are appended here")->capture_default_str();
  app.add_option("--commit", bo.commit, "Commit recorded in each row");
  app.add_option("--policies", bo.policies, "dense, trace:LABEL (per-head budgets from --trace), quest:TOKENS, or any --sparse-policy rule with its value (coverage:0.99, topfrac:0.3, ...); each optionally @sketch4 (chosen by the key sketch, else MinMax summaries), then /R (select every R steps)")->delimiter(',')->capture_default_str();
  app.add_option("--trace", bo.trace, "Budget trace of a real model (dhisparse eval --trace-out)");
  app.add_option("--trace-len", bo.trace_len, "Prompt length of the trace to replay (0: its longest)")->check(int_in(0, kMaxTokens));
  app.add_option("--gemm-batch", bo.gemm_batch, "Batch sizes of the one-layer weight GEMM timing")->delimiter(',')->check(int_in(1, 4096))->capture_default_str();
  app.add_option("--gemm-out", bo.gemm_out, "JSON lines of the weight GEMM timing are appended here")->capture_default_str();
  app.add_flag("--no-gemm", no_gemm, "Skip the weight GEMM timing");
  app.add_flag("--no-pdl", no_pdl, "Launch the decode step's kernels plainly, not as programmatic dependents");
  app.add_option("--weights", bo.weights, "Projection formats timed in decode (random codes): f16, q8_0, q4_k, fp8")
      ->delimiter(',')
      ->check(CLI::IsMember({"f16", "q8_0", "q4_k", "fp8"}));
  app.add_option("--gemv-max-tok", bo.gemv_max_tok, "Decode GEMMs of at most this many rows on the GEMV kernels (0: all on cuBLASLt)")->check(int_in(0, 8))->capture_default_str();
  app.add_option("--gemv-tc-shapes", bo.gemv_tc_shapes, "Ring shapes of the tensor-core GEMV to time in the one-layer GEMM timing (gemv.h)")->delimiter(',')->check(int_in(0, 4));
  app.add_option("--spec-k", bo.spec_k, "Speculative decoding: drafts per cycle to time (draft and verify steps per policy; none by default)")->delimiter(',')->check(int_in(1, 16));
  app.add_option("--draft-pages", bo.draft_pages, "Speculative decoding: the draft's sink + recent pages per list")->check(int_in(2, 1 << 20))->capture_default_str();
  app.add_option("--spec-trace", bo.spec_traces, "Speculative decoding: acceptance traces (scripts/acceptance_trace.py) whose k and draft policy match a timed one: TPOT replayed, rows in --out")->delimiter(',')->check(CLI::ExistingFile);
  app.add_option("--draft-quantization", draft_q, "Speculative decoding: fp8 runs the drafts on an FP8 copy of the projections (f16 weights only)")
      ->check(CLI::IsMember({"none", "fp8"}))
      ->capture_default_str();
  app.add_option("--draft-seeds", bo.draft_seeds, "Speculative decoding: the draft also reads the verifier's M heaviest selected pages per list (sinkwindow:PAGES+M; the verify records them)")->check(int_in(0, 256))->capture_default_str();
  app.add_option("--spec-alpha", bo.spec_alpha, "Speculative decoding: per-token acceptance rates the TPOT is computed at (replayed, not measured)")->delimiter(',')->check(CLI::Range(0.0, 0.999))->capture_default_str();
  app.add_option("--verify-selection", bo.verify_selection, "Speculative decoding: what a sparse verify's rows read: last-row (one set, the last row's), all-rows (one set from every row's queries), per-row (each row its own, read once per row), per-row-union (each row its own, their union read once with row masks: experimental)")->check(CLI::IsMember({"last-row", "all-rows", "per-row", "per-row-union"}))->capture_default_str();
  app.add_option("--spec-out", bo.spec_out, "JSON lines of the speculative timing are appended here")->capture_default_str();
  app.add_flag("--no-gemv-tc", no_gemv_tc, "GEMVs on the CUDA-core kernel instead of the tensor-core one (the A/B)");
  app.add_flag("--hierarchy", hierarchy, "The KV hierarchy's throughput instead (hierarchy_bench.h): real decode steps at each --ctx, --batch (default without the host tier: the largest the HBM cap holds) and --policies with an HBM KV pool of --hbm-kv-gib and a host tier of --host-kv-gib, the churn of a real model's selections replayed");
  app.add_option("--hbm-kv-gib", ho.hbm_kv_gib, "--hierarchy: the HBM KV pool's cap in GiB (0: what the GPU's memory leaves)")->check(CLI::Range(0.0, 1e6))->capture_default_str();
  app.add_option("--host-kv-gib", ho.host_kv_gib, "--hierarchy: the host tier of pinned DRAM in GiB (0: none, every page in HBM)")->check(CLI::Range(0.0, 1e6))->capture_default_str();
  app.add_option("--churn", ho.churn, "--hierarchy: the fraction of a step's reads evicted before the next (a real model's late reads per step / pages read at the buffer used)")->check(CLI::Range(0.0, 0.999))->capture_default_str();
  app.add_option("--buffer", ho.buffer, "--hierarchy: each request's HBM budget is the pages a step reads x (1 + buffer)")->check(CLI::Range(0.0, 100.0))->capture_default_str();
  app.add_flag_function("--sync-recalls", [&ho](int64_t) { ho.overlap_recalls = false; }, "--hierarchy: a step's recalls planned and issued before the next step is launched (default: while it runs)");
  app.add_flag("--land", ho.land, "--hierarchy: late pages land in HBM slots reserved before the step, copied in the step before their attention (each miss crosses PCIe once), instead of being read in place and recalled after");
  app.add_option("--steps", ho.steps, "--hierarchy: timed steps (after 3 warm-up and 3 resident ones)")->check(int_in(1, 100000))->capture_default_str();
  app.add_option("--hierarchy-out", ho.out, "--hierarchy: JSON lines are appended here")->capture_default_str();
  app.callback([&] { batch_given = app.count("--batch") > 0; });
  CLI11_PARSE(app, argc, argv);
  if (hierarchy) {
    try {
      ho.trace = bo.trace;
      ho.trace_len = bo.trace_len;
      ho.commit = bo.commit;
      if (batch_given) ho.batch = bo.batch;
      for (const int64_t ctx : bo.ctx)
        for (const std::string& pol : bo.policies) {
          ho.ctx = ctx;
          ho.policy = pol;
          if (const int rc = dhs::run_hierarchy_bench(ho); rc != 0) return rc;
        }
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
  }
  if (no_gemm) bo.gemm_batch.clear();
  bo.draft_fp8 = draft_q == "fp8";
  bo.pdl = !no_pdl;
  bo.gemv_tc = !no_gemv_tc;
  try {
    return dhs::run_e2e_bench(bo);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
