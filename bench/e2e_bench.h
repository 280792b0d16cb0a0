// `dhisparse bench`: end-to-end decode (TPOT) and prefill (TTFT) of the
// Llama-3.1-8B shape with random weights on the GPU. CUDA builds only.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dhs {

struct E2eBenchOptions {
  std::vector<int64_t> ctx = {8192, 32768, 131072};
  std::vector<int64_t> batch = {1, 4, 8, 32};
  std::vector<int64_t> prefill = {32768};
  std::string out = "bench/results/decode_e2e.jsonl";
  std::string commit = "unknown";
  // Decode policies timed at each shape: "dense"; "trace:LABEL" (top-k with per-(layer, KV head)
  // budgets replayed from `trace`, e.g. trace:coverage-0.99); "quest:TOKENS" (top-k, fixed budget).
  std::vector<std::string> policies = {"dense"};
  std::string trace;       // budget trace JSON (dhisparse eval --trace-out)
  int64_t trace_len = 0;   // its prompt length to use (0: longest)
  // One layer's weight GEMMs (fused QKV, O, fused gate/up, down) per batch size; rows to gemm_out.
  std::vector<int64_t> gemm_batch = {1, 4, 8, 32};
  std::string gemm_out = "bench/results/weight_gemm.jsonl";
  bool pdl = true;       // the decode chain's kernels as programmatic dependents (pdl_launch.h; recorded)
  int gemv_max_tok = 8;  // CudaModelOptions::gemv_max_tok of the models timed (recorded in the rows)
  bool gemv_tc = true;   // the models' GEMV kernel: tensor cores, or the CUDA-core one (recorded in the rows)
  std::vector<int> gemv_tc_shapes = {0};  // ring shapes of the tensor-core GEMV in the GEMM timing
  // The projections' format in the decode timing (CudaModelOptions::random_weights: f16, q8_0,
  // q4_k, fp8; recorded in the rows' "weights").
  std::vector<std::string> weights = {"f16"};
  // Speculative decoding (issue 24), per shape and verifier policy: the draft step (sink + recent
  // pages, draft_pages of them per list) and the verify step of k + 1 rows per request for each k
  // timed as graphs; TPOT = (k draft + verify) / E(alpha, k), E = (1 - alpha^(k+1)) / (1 - alpha)
  // tokens per cycle at per-token acceptance alpha (given: replayed, never measured here). Rows
  // to spec_out.
  std::vector<int> spec_k;
  int draft_pages = 16;
  // Verification-seeded drafts: the draft also reads the verifier's draft_seeds heaviest selected
  // pages per list (sinkwindow:draft_pages+draft_seeds), the verify records them (0: window only).
  int draft_seeds = 0;
  // Drafts on an FP8 copy of the projections (CudaModelOptions::draft_fp8; f16 weights only):
  // the timed draft step reads it, the verify and plain steps the f16 weights.
  bool draft_fp8 = false;
  // Acceptance traces (scripts/acceptance_trace.py) replayed at their k and draft: decode_e2e rows
  // with spec_k, draft_budget, accepted_per_verify, acceptance_trace.
  std::vector<std::string> spec_traces;
  std::vector<double> spec_alpha = {0.6, 0.7, 0.8, 0.9};
  std::string spec_out = "bench/results/spec_e2e.jsonl";
  // CudaModelOptions::verify_selection; "per-row-union": per-row with per_row_union on.
  std::string verify_selection = "last-row";
};

// Prints a table, appends JSON lines to opts.out. Returns 0, or 77 when no GPU is present.
int run_e2e_bench(const E2eBenchOptions& opts);

}  // namespace dhs
