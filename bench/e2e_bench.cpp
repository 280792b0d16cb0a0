// End-to-end decode on the Llama-3.1-8B shape with random f16 weights (speed
// does not depend on weight values): time per output token (one captured decode
// step: all 32 layers, logits and sampling) at each context x batch whose KV fits
// in HBM, next to the floor (weight bytes + KV bytes) / measured read bandwidth;
// plus one layer's weight GEMMs alone (opts.gemm_out) and chunked prefill throughput
// and TTFT. JSON lines to opts.out.
// Run as `dhisparse bench` (see src/cli/main.cpp).
#include <cuda_runtime.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_page_pool.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/prefill_attention.h"
#include "backend/cuda/pdl_launch.h"
#include "eval/budget_trace.h"
#include "bench/bench_policy.h"
#include "bench/device_rates.h"
#include "bench/e2e_bench.h"
#include "core/error.h"
#include "model/arch/llama_cuda.h"
#include "model/model_shapes.h"

namespace dhs {

namespace {

// One layer's weight GEMMs as the decode step runs them (gemm.h: fused QKV and gate/up to f16,
// O and down accumulated into the fp32 residual), over kLayers distinct weight sets in one
// captured graph (3.5 GB: nothing stays in L2 between replays), per layer = graph time /
// kLayers. Median of 30 replays. Returns µs per layer.
double time_layer_gemms(const ModelConfig& c, int64_t batch, cuda::Gemm& gemm, cudaStream_t stream) {
  constexpr int kLayers = 8;
  const int64_t H = c.hidden, F = c.ffn_hidden, QKV = (c.n_heads_q + 2 * c.n_heads_kv) * c.head_dim;
  const int64_t shapes[4][2] = {{QKV, H}, {H, c.n_heads_q * c.head_dim}, {2 * F, H}, {H, F}};  // [out, in]
  std::vector<__half*> w;
  for (int l = 0; l < kLayers; ++l)
    for (const auto& s : shapes) {
      __half* p = nullptr;
      DHS_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(s[0] * s[1]) * 2));
      cuda::fill_random_f16(p, static_cast<size_t>(s[0] * s[1]), 1000 + w.size(), -0.02f, 0.02f, stream);
      w.push_back(p);
    }
  const int64_t widest = std::max<int64_t>(2 * F, QKV);
  __half *x = nullptr, *y = nullptr;
  float* acc = nullptr;
  DHS_CUDA_CHECK(cudaMalloc(&x, static_cast<size_t>(batch * widest) * 2));
  DHS_CUDA_CHECK(cudaMalloc(&y, static_cast<size_t>(batch * widest) * 2));
  DHS_CUDA_CHECK(cudaMalloc(&acc, static_cast<size_t>(batch * H) * 4));
  cuda::fill_random_f16(x, static_cast<size_t>(batch * widest), 7, -1.0f, 1.0f, stream);
  DHS_CUDA_CHECK(cudaMemsetAsync(acc, 0, static_cast<size_t>(batch * H) * 4, stream));
  auto layers = [&] {
    for (int l = 0; l < kLayers; ++l) {
      gemm.run(w[l * 4 + 0], x, y, batch, H, QKV, cuda::GemmOut::F16, stream);
      gemm.run(w[l * 4 + 1], x, acc, batch, shapes[1][1], H, cuda::GemmOut::F32, stream, 1.0f);
      gemm.run(w[l * 4 + 2], x, y, batch, H, 2 * F, cuda::GemmOut::F16, stream);
      gemm.run(w[l * 4 + 3], x, acc, batch, F, H, cuda::GemmOut::F32, stream, 1.0f);
    }
  };
  layers();  // plans made outside the capture
  DHS_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  DHS_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  layers();
  DHS_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
  DHS_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < 33; ++i) {
    cudaEventRecord(e0, stream);
    cudaGraphLaunch(ge, stream);
    cudaEventRecord(e1, stream);
    cudaEventSynchronize(e1);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (i >= 3) ms.push_back(t);
  }
  DHS_CUDA_CHECK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  for (auto* p : w) cudaFree(p);
  cudaFree(x);
  cudaFree(y);
  cudaFree(acc);
  return ms[ms.size() / 2] * 1e3 / kLayers;
}

}  // namespace

// The weight GEMMs of one layer per batch size and kernel path (--gemm-batch), rows to --gemm-out.
void time_weight_gemms(const E2eBenchOptions& opts, const ModelConfig& cfg, const cudaDeviceProp& prop, double copy_gbps) {
  const std::string& commit = opts.commit;
  std::ofstream gl(opts.gemm_out, std::ios::app);
  cudaStream_t s;
  DHS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cuda::Gemm gemm;
  const double layer_bytes = 2.0 * cfg.hidden * ((cfg.n_heads_q + 2 * cfg.n_heads_kv) * cfg.head_dim +
                                                 cfg.n_heads_q * cfg.head_dim + 3 * cfg.ffn_hidden);
  std::printf("%-26s %-5s %10s %9s\n", "weight GEMMs of one layer", "batch", "us", "GB/s");
  for (int64_t b : opts.gemm_batch)
    for (int path = 0; path < 2 + static_cast<int>(opts.gemv_tc_shapes.size()); ++path) {
      // cuBLASLt for every shape, the CUDA-core GEMV, the tensor-core GEMV per ring shape
      const bool gemv = path != 0;
      if (gemv && b > cuda::kGemvMaxTok) continue;  // (the kernels' limit)
      gemm.set_gemv_max_tok(gemv ? cuda::kGemvMaxTok : 0);
      const int ring = path >= 2 ? opts.gemv_tc_shapes[static_cast<size_t>(path - 2)] : 0;
      gemm.set_gemv_kernel(cuda::GemvKernel{.tensor_cores = path >= 2, .tc_shape = ring});
      const std::string impl_s = path == 0   ? "dhisparse-cublaslt"
                                 : path == 1 ? "dhisparse-gemv-cudacore"
                                 : ring == 0 ? "dhisparse-gemv"
                                             : "dhisparse-gemv-ring" + std::to_string(ring);
      const char* impl = impl_s.c_str();
      const double us = time_layer_gemms(cfg, b, gemm, s);
      std::printf("%-26s %-5lld %10.1f %9.1f\n", impl, static_cast<long long>(b), us, layer_bytes / us / 1e3);
      gl << "{\"commit\":\"" << commit << "\",\"gpu\":\"" << prop.name << "\",\"impl\":\"" << impl << "\",\"model\":\"llama-3.1-8b-shape\",\"weights\":\"f16\",\"batch\":" << b
         << ",\"us\":" << us << ",\"weight_bytes\":" << layer_bytes << ",\"GBps\":" << layer_bytes / us / 1e3
         << ",\"copy_GBps\":" << copy_gbps << ",\"gemv_tc\":" << (gemm.gemv_kernel().tensor_cores ? "true" : "false")
         << ",\"method\":\"graph of 8 distinct layers, median of 30 replays / 8\"}\n";
    }
  DHS_CUDA_CHECK(cudaStreamDestroy(s));

}

// Speculative decoding at one shape, the verifier's policy set on `m` (and timed plainly as
// `plain_ms`): the draft step (sink + recent pages) and the verify step of k + 1 rows for each k,
// both graph replays of the real steps; TPOT at each replayed acceptance rate. The policy is set
// back to the verifier's before returning.
void time_speculation(const E2eBenchOptions& opts, const cudaDeviceProp& prop, LlamaCuda& m, std::vector<PageTable>& ts,
                      const BenchPolicy& verifier, const std::string& pol_spec, const std::string& weights, int64_t ctx,
                      double plain_ms, double dense_ms, double copy_gbps, std::ofstream& jl, std::ofstream& decode_jl) {
  const int64_t batch = static_cast<int64_t>(ts.size());
  std::vector<int32_t> tok(static_cast<size_t>(batch) * 17, 42);
  auto seqs = [&](int n, bool verify, bool draft = false) {
    std::vector<LlamaCuda::Seq> b;
    for (int64_t r = 0; r < batch; ++r) {
      PageTable& t = ts[static_cast<size_t>(r)];
      if (t.capacity_tokens() < t.n_tokens() + n) DHS_CHECK(t.reserve(m.allocator(), n), "bench: no room for {} rows", n);
      LlamaCuda::Seq s{&t, static_cast<int>(r), tok.data() + r * 17, n};
      s.verify = verify;
      s.draft = draft;  // (with FP8 draft projections the step reads them)
      b.push_back(s);
    }
    return b;
  };
  // The draft: the scheduler's draft rows carry their own sink + window rule in a step whose
  // engine policy is the verifier's; the same kernels run with it as the step's policy.
  const std::string draft_name = opts.draft_seeds > 0 ? fmt::format("sinkwindow:{}+{}", opts.draft_pages, opts.draft_seeds)
                                                      : fmt::format("sinkwindow:{}", opts.draft_pages);
  const PolicySpec draft = PolicySpec::parse(draft_name);
  bool seeded = false;
  if (opts.draft_seeds > 0 && !verifier.spec.dense()) {
    // Seeds first: one real decode step under the verifier records them (kept: the draft's steps
    // come after it), so the timed draft reads its window and the seeds; the verifies below
    // record them again inside their graphs.
    m.keep_draft_seeds(opts.draft_seeds);
    m.record_draft_seeds(true);
    m.set_sparsity(verifier.spec, verifier.frac);
    m.forward(seqs(1, false), nullptr, true);
    seeded = true;
  }
  m.set_sparsity(draft);
  m.reset_sparsity_stats();
  const double draft_ms = m.time_decode_step(seqs(1, false, true), 50);
  const std::string draft_weights = m.draft_weight_bytes() > 0 ? "fp8" : weights;
  const double draft_frac = m.sparsity_stats().read_frac();
  if (seeded)
    for (PageTable& t : ts) t.truncate(m.allocator(), t.n_tokens() - 1);
  m.reset_sparsity_stats();
  m.set_sparsity(verifier.spec, verifier.frac);
  for (const int k : opts.spec_k) {
    const double verify_ms = m.time_decode_step(seqs(k + 1, true), 30);
    const double read_frac = verifier.spec.dense() ? 1.0 : m.sparsity_stats().read_frac();
    m.reset_sparsity_stats();
    // Acceptance traces (scripts/acceptance_trace.py: drafts kept per verify measured by `dhisparse
    // eval` on a real model) for this k and this draft: TPOT replayed, one decode_e2e row each.
    for (const std::string& path : opts.spec_traces) {
      std::ifstream f(path);
      DHS_CHECK(f.good(), "--spec-trace {}: cannot open", path);
      const nlohmann::json t = nlohmann::json::parse(f);
      if (t.at("k").get<int>() != k || t.at("draft_policy").get<std::string>() != draft_name) continue;
      // (A trace's acceptance is its verifier's: a dense verifier records no seeds, for one.)
      if (t.at("verify_policy").get<std::string>() != verifier.spec.label("sketch4")) continue;
      const double kept = t.at("accepted_per_verify").get<double>(), e = kept + 1.0;
      const double tpot = (k * draft_ms + verify_ms) / e;
      const double kv = 2.0 * m.config().n_layers * m.config().n_heads_kv * m.config().head_dim * 2 * static_cast<double>(ctx) *
                        static_cast<double>(batch);
      const double w = static_cast<double>(m.step_weight_bytes(false)), wd = static_cast<double>(m.step_weight_bytes(true));
      const double floor_ms = (k * (wd + draft_frac * kv) + (w + read_frac * kv)) / e / (copy_gbps * 1e9) * 1e3;
      const std::string stem = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
      std::printf("  spec k %d, %s, trace %s: %.3f kept per verify -> TPOT %.3f ms (floor %.3f), plain/this %.2f%s\n", k,
                  draft_name.c_str(), stem.c_str(), kept, tpot, floor_ms, plain_ms / tpot,
                  dense_ms > 0 ? fmt::format(", dense/this {:.2f}", dense_ms / tpot).c_str() : "");
      decode_jl << "{\"commit\":\"" << opts.commit << "\",\"gpu\":\"" << prop.name << "\",\"model\":\"llama-3.1-8b-shape\",\"weights\":\""
                << weights << "\",\"ctx\":" << ctx << ",\"batch\":" << batch << ",\"policy\":\"" << pol_spec
                << "\",\"budgets\":\"" << verifier.budgets << "\",\"pages_read_frac\":" << read_frac << ",\"spec_k\":" << k
                << ",\"draft_budget\":\"" << draft_name << "\",\"draft_weights\":\"" << draft_weights
                << "\",\"verify_select\":\"" << opts.verify_selection
                << "\",\"accepted_per_verify\":" << kept << ",\"acceptance_trace\":\"" << stem << " ("
                << t.at("model").get<std::string>() << " at " << t.at("length").get<int>() << " tokens, "
                << t.at("verifies").get<int>() << " verifies)\",\"draft_ms\":" << draft_ms << ",\"verify_ms\":" << verify_ms
                << ",\"tpot_ms\":" << tpot << ",\"floor_ms\":" << floor_ms << ",\"plain_tpot_ms\":" << plain_ms
                << ",\"dense_tpot_ms\":" << dense_ms << ",\"copy_GBps\":" << copy_gbps << ",\"graph\":true}\n";
    }
    for (const double a : opts.spec_alpha) {
      const double e = (1.0 - std::pow(a, k + 1)) / (1.0 - a);  // tokens per cycle
      const double tpot = (k * draft_ms + verify_ms) / e;
      std::printf("  spec k %d (draft %s %.3f ms, pages %.4f; verify %.3f ms, pages %.3f): alpha %.2f -> %.2f tokens/cycle, "
                  "TPOT %.3f ms, plain/this %.2f\n",
                  k, draft_name.c_str(), draft_ms, draft_frac, verify_ms, read_frac, a, e, tpot, plain_ms / tpot);
      jl << "{\"commit\":\"" << opts.commit << "\",\"gpu\":\"" << prop.name << "\",\"model\":\"llama-3.1-8b-shape\",\"weights\":\"" << weights
         << "\",\"ctx\":" << ctx << ",\"batch\":" << batch << ",\"verify_policy\":\"" << pol_spec << "\",\"budgets\":\"" << verifier.budgets
         << "\",\"verify_select\":\"" << opts.verify_selection << "\",\"k\":" << k << ",\"draft_policy\":\"" << draft_name << "\",\"draft_weights\":\"" << draft_weights
         << "\",\"draft_ms\":" << draft_ms
         << ",\"draft_pages_read_frac\":" << draft_frac
         << ",\"verify_ms\":" << verify_ms << ",\"verify_pages_read_frac\":" << read_frac << ",\"plain_tpot_ms\":" << plain_ms
         << ",\"alpha\":" << a << ",\"tokens_per_cycle\":" << e << ",\"tpot_ms\":" << tpot << ",\"copy_GBps\":" << copy_gbps
         << ",\"method\":\"graph replays of the draft and verify steps (random weights and KV); TPOT = (k draft + verify) / E at a "
            "given per-token acceptance alpha, E = (1 - alpha^(k+1)) / (1 - alpha): acceptance not measured here\"}\n";
    }
  }
}

// TPOT per (context, batch, policy) on random weights and random KV, rows to --out.
void time_decode_steps(const E2eBenchOptions& opts, const ModelConfig& cfg, const cudaDeviceProp& prop, double copy_gbps,
                       std::ofstream& jl) {
  const cuda::GemvKernel gemv_kernel{.tensor_cores = opts.gemv_tc};  // every model's (LlamaCuda::gemm)
  const std::string& commit = opts.commit;
  size_t free_b, total_b;
  cudaMemGetInfo(&free_b, &total_b);
  const double kv_per_token = 2.0 * cfg.n_layers * cfg.n_heads_kv * cfg.head_dim * 2;  // bytes
  // (FP8 draft copies: 7 GB more, beside the f16 weights.)
  const double weights_est = opts.draft_fp8 && !opts.spec_k.empty() ? 23.1e9 : 16.06e9;
  if (opts.draft_fp8 && (opts.spec_k.empty() || std::find(opts.weights.begin(), opts.weights.end(), "f16") == opts.weights.end()))
    std::printf("--draft-quantization fp8: only with --spec-k and f16 weights (ignored here)\n");
  std::printf("%-7s %-5s %10s %10s %10s %8s\n", "ctx", "batch", "tpot_ms", "floor_ms", "tok/s", "vs_floor");
  std::ofstream spec_jl;
  if (!opts.spec_k.empty()) spec_jl.open(opts.spec_out, std::ios::app);
  for (const std::string& weights : opts.weights)
  for (int64_t ctx : opts.ctx)
    for (int64_t batch : opts.batch) {
      const double kv = kv_per_token * static_cast<double>(ctx + 64) * static_cast<double>(batch);
      if (weights_est + kv + 6e9 > static_cast<double>(free_b)) {
        std::printf("%-7lld %-5lld  KV %.0f GB does not fit\n", static_cast<long long>(ctx), static_cast<long long>(batch), kv / 1e9);
        continue;
      }
      CudaModelOptions o;
      o.gemv_max_tok = opts.gemv_max_tok;
      o.random_weights = weights;
      o.max_batch = static_cast<int>(batch);
      o.max_step_tokens = 2048;
      o.max_context = ctx + 64;
      const int max_k = opts.spec_k.empty() ? 0 : *std::max_element(opts.spec_k.begin(), opts.spec_k.end());
      o.max_verify_rows = 1 + max_k;
      o.verify_selection = opts.verify_selection == "per-row-union" ? "per-row" : opts.verify_selection;
      o.per_row_union = opts.verify_selection == "per-row-union";
      o.draft_fp8 = opts.draft_fp8 && !opts.spec_k.empty() && weights == "f16";
      // Only what the timed policies read: the summary or sketch kernels run in every step that keeps them.
      if (std::any_of(opts.policies.begin(), opts.policies.end(), needs_minmax)) o.summaries = "minmax";
      o.key_sketch = std::any_of(opts.policies.begin(), opts.policies.end(),
                                 [](const std::string& p) { return chosen_by_sketch(without_reselect(p)); });
      auto m = std::make_unique<LlamaCuda>(cfg, 1234, o);
      // Seeded drafts: the model keeps a seed store; plain steps are timed without recording into
      // it (decoding without speculation records nothing), the speculative ones with it.
      if (opts.draft_seeds > 0 && !opts.spec_k.empty()) m->keep_draft_seeds(opts.draft_seeds);
      m->gemm().set_gemv_kernel(gemv_kernel);
      m->kv_pool().fill_random(99, -1.0f, 1.0f, m->stream());
      if (auto* sm = m->summaries(cuda::SummaryKind::MinMax))  // summaries of the random KV: values do not change the cost
        cuda::fill_random_f16(sm->data_d(), sm->bytes() / 2, 98, -1.0f, 1.0f, m->stream());
      if (auto* sk = m->key_sketch()) {  // random codes, steps of 0 (any finite value costs the same)
        cuda::fill_random_f16(reinterpret_cast<__half*>(sk->codes_d()), sk->code_bytes() / 2, 97, -1.0f, 1.0f, m->stream());
        DHS_CUDA_CHECK(cudaMemsetAsync(sk->steps_d(), 0, sk->bytes() - sk->code_bytes(), m->stream()));
      }
      std::vector<PageTable> ts;
      std::vector<int32_t> tok(static_cast<size_t>(batch), 42);
      std::vector<LlamaCuda::Seq> b;
      for (int64_t r = 0; r < batch; ++r) ts.emplace_back(static_cast<int>(cfg.n_layers), static_cast<int>(cfg.n_heads_kv), 16);
      for (int64_t r = 0; r < batch; ++r) {
        // A context of ctx tokens whose KV is random: attention reads it all the same.
        ts[static_cast<size_t>(r)].reserve(m->allocator(), ctx + 1);
        ts[static_cast<size_t>(r)].commit(ctx);
        b.push_back(LlamaCuda::Seq{&ts[static_cast<size_t>(r)], static_cast<int>(r), &tok[static_cast<size_t>(r)], 1});
      }
      double dense_ms = 0;
      for (const std::string& pol_spec : opts.policies) {
        const BenchPolicy bp = parse_bench_policy(pol_spec, opts.trace, opts.trace_len, cfg);
        const PolicySpec& pc = bp.spec;
        m->set_sparsity(pc, bp.frac);
        m->record_draft_seeds(false);
        // time_decode_step hands the step's page back when it rolls the step back: room again.
        for (auto& t : ts)
          if (t.capacity_tokens() < t.n_tokens() + 1) t.reserve(m->allocator(), 1);
        const double ms = m->time_decode_step(b, 50);
        const double read_frac = pc.dense() ? 1.0 : m->sparsity_stats().read_frac();
        m->reset_sparsity_stats();
        if (bp.dense_label) dense_ms = ms;
        const double bytes = static_cast<double>(m->step_weight_bytes(false)) + read_frac * kv_per_token * static_cast<double>(ctx) * static_cast<double>(batch);
        const double floor_ms = bytes / (copy_gbps * 1e9) * 1e3;
        std::printf("%-7lld %-5lld %10.3f %10.3f %10.1f %8.2f  %-5s %-24s pages %.3f%s\n", static_cast<long long>(ctx),
                    static_cast<long long>(batch), ms, floor_ms, static_cast<double>(batch) / ms * 1e3, ms / floor_ms,
                    weights.c_str(), pol_spec.c_str(), read_frac,
                    dense_ms > 0 && !bp.dense_label ? fmt::format("  dense/this {:.2f}", dense_ms / ms).c_str() : "");
        jl << "{\"commit\":\"" << commit << "\",\"gpu\":\"" << prop.name << "\",\"model\":\"llama-3.1-8b-shape\",\"weights\":\"" << weights << "\",\"ctx\":" << ctx
           << ",\"batch\":" << batch << ",\"policy\":\"" << pol_spec << "\",\"estimator\":\"" << (pc.dense() ? "" : pc.estimator) << "\",\"gamma\":" << bp.gamma
           << ",\"reselect_every\":" << bp.reselect_every << ",\"budgets\":\"" << bp.budgets
           << "\",\"pages_read_frac\":" << read_frac << ",\"tpot_ms\":" << ms << ",\"floor_ms\":" << floor_ms
           << ",\"dense_tpot_ms\":" << dense_ms << ",\"weight_bytes\":" << m->step_weight_bytes(false)
           << ",\"kv_bytes\":" << kv_per_token * ctx * batch << ",\"copy_GBps\":" << copy_gbps << ",\"gemv_max_tok\":" << opts.gemv_max_tok << ",\"gemv_tc\":" << (opts.gemv_tc ? "true" : "false") << ",\"pdl\":" << (opts.pdl ? "true" : "false") << ",\"graph\":true}\n";
        if (!opts.spec_k.empty())
          time_speculation(opts, prop, *m, ts, bp, pol_spec, weights, ctx, ms, bp.dense_label ? ms : dense_ms, copy_gbps, spec_jl, jl);
      }
      for (auto& t : ts) t.release(m->allocator());
    }
}

// TTFT: a real chunked prefill of one request per --prefill length, rows to --out.
void time_prefill(const E2eBenchOptions& opts, const ModelConfig& cfg, const cudaDeviceProp& prop, std::ofstream& jl) {
  const cuda::GemvKernel gemv_kernel{.tensor_cores = opts.gemv_tc};
  const std::string& commit = opts.commit;
  // Prefill: a real chunked prefill of one request (2048-token chunks), timed whole; the prefill
  // attention on mma.sync (variant 0), on warpgroup MMAs (1), warp-specialized (2) and with ping-pong
  // consumers and a 3-tile ring (3, the default; sm_90, head_dim 128), alternated twice: the A/B.
  for (int64_t n : opts.prefill) {
    if (n <= 0) continue;  // --prefill 0: no TTFT run
    CudaModelOptions o;
    o.gemv_max_tok = opts.gemv_max_tok;
    o.max_batch = 1;
    o.max_step_tokens = 2048;
    o.max_context = n + 16;
    auto m = std::make_unique<LlamaCuda>(cfg, 1234, o);
    m->gemm().set_gemv_kernel(gemv_kernel);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % 128000);
    // (Past 32k only the two warp-specialized forms: mma.sync and the first wgmma form were timed
    // at 128k before, 17.6 s and ~15 s a run.)
    const std::vector<int> variants = n > 32768 ? std::vector<int>{2, 3, 2, 3} : std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3};
    for (const int variant : variants) {  // one model; a new request each time
      m->set_prefill_kernel({.wgmma = variant > 0,
                             .sm90_shape = {128, variant >= 2, variant == 3, variant == 3 ? 3 : 2}});
      PageTable t(static_cast<int>(cfg.n_layers), static_cast<int>(cfg.n_heads_kv), 16);
      cudaDeviceSynchronize();
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t s = 0; s < n; s += 2048) {
        const int64_t c = std::min<int64_t>(2048, n - s);
        t.reserve(m->allocator(), c);
        m->forward({LlamaCuda::Seq{&t, 0, ids.data() + s, c}}, nullptr);
      }
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const char* kernel = variant == 0 ? "mma.sync" : variant == 1 ? "wgmma" : variant == 2 ? "wgmma-ws" : "wgmma-ws-pp-s3";
      std::printf("prefill %lld tokens (attention on %s where it applies): TTFT %.2f s, %.0f tokens/s\n",
                  static_cast<long long>(n), kernel, sec, n / sec);
      jl << "{\"commit\":\"" << commit << "\",\"gpu\":\"" << prop.name << "\",\"model\":\"llama-3.1-8b-shape\",\"weights\":\"f16\",\"prefill_tokens\":" << n
         << ",\"chunk\":2048,\"prefill_attention\":\"" << kernel << "\",\"ttft_s\":" << sec
         << ",\"prefill_tok_s\":" << n / sec << "}\n";
      t.release(m->allocator());
    }
  }
}

int run_e2e_bench(const E2eBenchOptions& opts) {
  // Every launch and graph capture below runs on this thread, inside this scope.
  const cuda::ScopedPdlChain pdl_scope(opts.pdl);
  if (cuda::device_count() == 0) {
    std::printf("SKIP: no GPU\n");
    return 77;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  const double copy_gbps = measure_copy_gbps();
  std::printf("gpu %s, device copy %.0f GB/s (read+write)\n", prop.name, copy_gbps);
  std::ofstream jl(opts.out, std::ios::app);
  const ModelConfig cfg = model_shape("llama3-8b");
  if (!opts.gemm_batch.empty()) time_weight_gemms(opts, cfg, prop, copy_gbps);
  time_decode_steps(opts, cfg, prop, copy_gbps, jl);
  time_prefill(opts, cfg, prop, jl);
  return 0;
}

}  // namespace dhs
