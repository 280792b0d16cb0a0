// The default model on the CUDA backend against the CPU backend: prompt logits
// within a bf16 tolerance, greedy continuations equal for >= 32 tokens on each
// prompt (or a divergence at a near-tie of the CPU logits, with its top-2 gap
// printed), batched decode through the captured graph equal to one-by-one, and
// --reselect-every on the device reading exactly the pages the CPU definition reads.
// Standalone program (exit 77 = skipped: no GPU or no model).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cuda/cuda_check.h"
#include "model/arch/llama_cpu.h"
#include "model/arch/llama_cuda.h"
#include "model/gguf_source.h"
#include "test_paths.h"

using namespace dhs;

namespace {

int failures = 0;
#define CHECK_TRUE(c, ...)            \
  do {                                \
    if (!(c)) {                       \
      std::printf("FAIL: " __VA_ARGS__); \
      std::printf("\n");              \
      ++failures;                     \
    }                                 \
  } while (0)

int32_t argmax(const float* l, int64_t n) { return static_cast<int32_t>(std::max_element(l, l + n) - l); }
float top2_gap(const float* l, int64_t n) {
  std::vector<float> v(l, l + n);
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
  return v[0] - v[1];
}

}  // namespace

int main() {
  if (cuda::device_count() == 0) {
    std::printf("SKIP: no GPU\n");
    return 77;
  }
  if (!std::filesystem::exists(test::default_model_path())) {
    std::printf("SKIP: default model missing (scripts/fetch_model.sh)\n");
    return 77;
  }
  std::ifstream in(test::data_dir() + "/reference/smollm2_135m.json");
  const auto ref = nlohmann::json::parse(in);
  GgufSource src(test::default_model_path());
  const ModelConfig& c = src.config();
  const int64_t V = c.vocab_size;
  LlamaCpu cpu(src, CpuWeightType::F32);
  CudaModelOptions o;
  o.max_batch = 4;
  o.max_step_tokens = 512;
  o.max_context = 2048;
  LlamaCuda gpu(src, o);

  const int n_greedy = 32;
  // bf16 weights and activations against fp32: measured max |dlogit| ~0.1-0.3 on this
  // model; 1.0 still catches any real bug (a wrong head, page or mask moves logits by units).
  const float logit_tol = 1.0f;
  // A greedy divergence is accepted only where the CPU's top-2 gap is below this
  // (a near-tie that bf16 rounding can flip).
  const float tie_gap = 0.5f;
  std::vector<std::vector<int32_t>> gpu_greedy_all;
  std::vector<std::vector<std::vector<float>>> gpu_step_logits;
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& p : ref["prompts"]) prompts.push_back(p["prompt_ids"].get<std::vector<int32_t>>());
  // The prompt on both backends in 512-token chunks (the GPU model's step size); last logits in cl, gl.
  auto prefill_both = [&](LlamaCuda& g, const std::vector<int32_t>& ids, PagePool& cpool, PageTable& ct, PageTable& gt,
                          std::vector<float>* cl, std::vector<float>* gl) {
    for (size_t b = 0; b < ids.size(); b += 512) {
      const int64_t n = std::min<int64_t>(512, static_cast<int64_t>(ids.size() - b));
      ct.reserve(cpool, n);
      cpu.forward({LlamaCpu::Seq{&ct, ids.data() + b, n}}, cpool, cl);
      CHECK_TRUE(gt.reserve(g.allocator(), n), "reserve");
      g.forward({LlamaCuda::Seq{&gt, 0, ids.data() + b, n}}, gl);
    }
  };
  for (size_t pi = 0; pi < prompts.size(); ++pi) {
    const auto& ids = prompts[pi];
    PagePool cpool(Tier::Host, c.n_layers * c.n_heads_kv * 200, 16, static_cast<int>(c.head_dim));
    PageTable ct(static_cast<int>(c.n_layers), static_cast<int>(c.n_heads_kv), 16);
    PageTable gt(static_cast<int>(c.n_layers), static_cast<int>(c.n_heads_kv), 16);
    std::vector<float> cl, gl;
    prefill_both(gpu, ids, cpool, ct, gt, &cl, &gl);
    float md = 0;
    for (int64_t i = 0; i < V; ++i) md = std::max(md, std::fabs(cl[static_cast<size_t>(i)] - gl[static_cast<size_t>(i)]));
    std::printf("prompt %zu (%zu tokens): max |dlogit| %.3f\n", pi, ids.size(), md);
    CHECK_TRUE(md < logit_tol, "prompt %zu logits differ by %.3f", pi, md);
    CHECK_TRUE(gpu.greedy_ids()[0] == argmax(gl.data(), V), "GPU greedy sampler != argmax of GPU logits");
    // Greedy: each side continues with its own tokens; the first divergence is checked.
    std::vector<int32_t> cg, gg;
    std::vector<std::vector<float>> steps;  // GPU logits after each fed token (first prompts)
    int diverged = -1;
    for (int s = 0; s < n_greedy; ++s) {
      const int32_t a = argmax(cl.data(), V);
      const int32_t b = gpu.greedy_ids()[0];
      CHECK_TRUE(b == argmax(gl.data(), V), "GPU greedy sampler != argmax of GPU logits (step %d)", s);
      cg.push_back(a);
      gg.push_back(b);
      if (a != b && diverged < 0) {
        diverged = s;
        const float gap = top2_gap(cl.data(), V);
        std::printf("  diverged at step %d: cpu %d gpu %d, cpu top-2 gap %.4f\n", s, a, b, gap);
        CHECK_TRUE(gap < tie_gap, "prompt %zu diverged at step %d with a clear cpu top-2 gap %.3f", pi, s, gap);
      }
      if (s + 1 == n_greedy) break;
      ct.reserve(cpool, 1);
      cpu.forward({LlamaCpu::Seq{&ct, &a, 1}}, cpool, &cl);
      gt.reserve(gpu.allocator(), 1);
      gpu.forward({LlamaCuda::Seq{&gt, 0, &b, 1}}, &gl);  // decode: captured graph
      if (pi < 3) steps.push_back(gl);
    }
    if (diverged < 0) std::printf("  greedy equal for %d tokens\n", n_greedy);
    gpu_step_logits.push_back(std::move(steps));
    gpu_greedy_all.push_back(gg);
    ct.release(cpool);
    gt.release(gpu.allocator());
  }
  // Batched: 3 prompts decoded together through the graph, fed the tokens of their
  // solo runs, give each one's solo logits (GEMM shapes differ with the batch, so
  // bf16 rounding may differ: same tolerance as against the CPU).
  {
    std::vector<PageTable> ts;
    for (int r = 0; r < 3; ++r) ts.emplace_back(static_cast<int>(c.n_layers), static_cast<int>(c.n_heads_kv), 16);
    for (int r = 0; r < 3; ++r) {
      const auto& ids = prompts[static_cast<size_t>(r)];
      ts[r].reserve(gpu.allocator(), static_cast<int64_t>(ids.size()));
      gpu.forward({LlamaCuda::Seq{&ts[r], r, ids.data(), static_cast<int64_t>(ids.size())}}, nullptr);
    }
    float md = 0;
    std::vector<int32_t> cur(3);
    std::vector<float> bl;
    for (int s = 0; s < 16; ++s) {
      std::vector<LlamaCuda::Seq> b;
      for (int r = 0; r < 3; ++r) {
        cur[r] = gpu_greedy_all[static_cast<size_t>(r)][static_cast<size_t>(s)];
        ts[r].reserve(gpu.allocator(), 1);
        b.push_back(LlamaCuda::Seq{&ts[r], r, &cur[r], 1});
      }
      gpu.forward(b, &bl);
      for (int r = 0; r < 3; ++r) {
        const auto& solo = gpu_step_logits[static_cast<size_t>(r)][static_cast<size_t>(s)];
        for (int64_t i = 0; i < V; ++i) md = std::max(md, std::fabs(bl[static_cast<size_t>(r * V + i)] - solo[static_cast<size_t>(i)]));
      }
    }
    std::printf("batched (3 requests, 16 steps) vs solo: max |dlogit| %.3f\n", md);
    CHECK_TRUE(md < logit_tol, "batched decode differs from single-request decode by %.3f", md);
    for (auto& t : ts) t.release(gpu.allocator());
  }
  CHECK_TRUE(gpu.allocator().n_used() == 0 && gpu.allocator().check_invariants().empty(), "page accounting");

  // --reselect-every 3 with sink + window (a rule whose pages do not depend on the queries, so
  // both backends must list the same pages): 40 decode steps on the longest prompt; pages read
  // and pages in the lists counted on both sides must be equal exactly (fails if the device's
  // schedule, its stored lists or the pages appended since differ from the CPU's definition).
  // The logits are printed, not bounded: reading 4 of 75 pages puts the model far from its
  // trained regime, where bf16-vs-fp32 differences of 0.73 (cuBLASLt GEMMs) and 1.39 (the GEMV
  // kernel) were measured, so the dense bound above does not apply; that the reused lists give
  // exact attention is checked bitwise on the CPU (test_eval, Reselect).
  {
    CudaModelOptions so = o;
    so.summaries = "minmax";  // (a sparse-capable model: selection workspace and stats)
    LlamaCuda sg(src, so);
    PolicySpec pc;
    pc.rule = SelectRule::SinkWindow;
    pc.estimator = "minmax";
    pc.budget = 4;  // 1 sink + a window of 3 pages
    pc.reselect_every = 3;
    const auto& ids = prompts.back();  // the longest (1,186 tokens: 75 pages per list)
    // The first 4 steps are below --dense-below: dense on both, and the schedule starts over after
    // them (the CPU once kept its dense lists and reused them past the threshold; found in review).
    pc.dense_below = static_cast<int64_t>(ids.size()) + 5;
    sg.set_sparsity(pc);
    const auto cpu_policy = make_policy(pc);
    cpu.set_sparsity(cpu_policy.get(), nullptr, pc.reselect_every, pc.min_step_tokens, pc.dense_below);
    PagePool cpool(Tier::Host, c.n_layers * c.n_heads_kv * 200, 16, static_cast<int>(c.head_dim));
    PageTable ct(static_cast<int>(c.n_layers), static_cast<int>(c.n_heads_kv), 16);
    PageTable gt(static_cast<int>(c.n_layers), static_cast<int>(c.n_heads_kv), 16);
    std::vector<float> cl, gl;
    prefill_both(sg, ids, cpool, ct, gt, &cl, &gl);
    cpu.reset_sparsity_stats();
    sg.reset_sparsity_stats();
    float md = 0;
    for (int s = 0; s < 40; ++s) {
      const int32_t tok = gpu_greedy_all[0][static_cast<size_t>(s % n_greedy)];
      ct.reserve(cpool, 1);
      cpu.forward({LlamaCpu::Seq{&ct, &tok, 1}}, cpool, &cl);
      gt.reserve(sg.allocator(), 1);
      sg.forward({LlamaCuda::Seq{&gt, 0, &tok, 1}}, &gl);
      for (int64_t i = 0; i < V; ++i) md = std::max(md, std::fabs(cl[static_cast<size_t>(i)] - gl[static_cast<size_t>(i)]));
    }
    const CudaSparsityStats gs = sg.sparsity_stats();
    uint64_t g_read = 0, g_total = 0;
    for (size_t i = 0; i < gs.read.size(); ++i) {
      g_read += gs.read[i];
      g_total += gs.total[i];
    }
    const auto& cs = cpu.sparsity_stats();
    std::printf("sinkwindow, reselect every 3, dense below +5 (40 steps): pages read gpu %llu / %llu, cpu %lld / %lld; max |dlogit| %.3f\n",
                static_cast<unsigned long long>(g_read), static_cast<unsigned long long>(g_total),
                static_cast<long long>(cs.pages_read), static_cast<long long>(cs.pages_total), md);
    CHECK_TRUE(static_cast<int64_t>(g_read) == cs.pages_read && static_cast<int64_t>(g_total) == cs.pages_total,
               "reselect: the device read other pages than the CPU definition");
    CHECK_TRUE(g_read < g_total, "reselect: sink + window read every page (prompt too short for the test)");
    cpu.set_sparsity(nullptr, nullptr);
    ct.release(cpool);
    gt.release(sg.allocator());
  }
  // --dense-below N (and --sparse-min-tokens N) under a scoring policy: while every request is
  // shorter than N (the batch holds fewer than N tokens) the step is the
  // dense one — logits bitwise equal to the dense policy's on the same tokens, every page counted
  // as read, no selection kernels run (threshold_dense_steps) — and from N on the policy selects
  // (fewer pages than the lists hold). Fails if the threshold were ignored, applied one token
  // off, or if a threshold step ran the selection.
  {
    CudaModelOptions so = o;
    so.summaries = "minmax";
    LlamaCuda sg(src, so);
    const auto& ids = prompts.back();  // 1,186 tokens
    const int64_t n0 = static_cast<int64_t>(ids.size());
    constexpr int kSteps = 16, kDenseSteps = 6;  // steps 0..5 stay dense: seq_len n0 + 1 .. n0 + 6 < N
    PolicySpec pc;
    pc.rule = SelectRule::Coverage;
    pc.estimator = "minmax";
    pc.gamma = 0.5;  // a cut that leaves pages out at this length
    pc.dense_below = n0 + kDenseSteps + 1;
    PagePool cpool(Tier::Host, c.n_layers * c.n_heads_kv * 200, 16, static_cast<int>(c.head_dim));
    PageTable ct(static_cast<int>(c.n_layers), static_cast<int>(c.n_heads_kv), 16);
    PageTable gt(static_cast<int>(c.n_layers), static_cast<int>(c.n_heads_kv), 16);
    std::vector<float> cl, gl;
    prefill_both(sg, ids, cpool, ct, gt, &cl, &gl);
    std::vector<std::vector<float>> dense_logits;
    // mode 0: the dense policy (reference); 1: --dense-below; 2: --sparse-min-tokens at the same
    // threshold (one request: the step's tokens are its context).
    for (const int mode : {0, 1, 2}) {
      const bool sparse = mode > 0;
      PolicySpec run = pc;
      if (!sparse) run.rule = SelectRule::Dense;
      if (mode == 2) {
        run.min_step_tokens = run.dense_below;
        run.dense_below = 0;
      }
      sg.set_sparsity(run);
      sg.reset_sparsity_stats();
      int64_t read_dense_phase = -1, total_dense_phase = -1;
      for (int s = 0; s < kSteps; ++s) {
        const int32_t tok = gpu_greedy_all[0][static_cast<size_t>(s % n_greedy)];
        gt.reserve(sg.allocator(), 1);
        sg.forward({LlamaCuda::Seq{&gt, 0, &tok, 1}}, &gl);
        if (!sparse) {
          dense_logits.push_back(gl);
        } else if (s < kDenseSteps) {
          CHECK_TRUE(gl == dense_logits[static_cast<size_t>(s)], "dense-below step %d differs from the dense step", s);
        }
        if (sparse && s + 1 == kDenseSteps) {
          const CudaSparsityStats st = sg.sparsity_stats();
          read_dense_phase = 0;
          total_dense_phase = 0;
          for (size_t i = 0; i < st.read.size(); ++i) {
            read_dense_phase += static_cast<int64_t>(st.read[i]);
            total_dense_phase += static_cast<int64_t>(st.total[i]);
          }
          CHECK_TRUE(sg.threshold_dense_steps() == kDenseSteps, "dense-below: %lld threshold steps, expected %d",
                     static_cast<long long>(sg.threshold_dense_steps()), kDenseSteps);
        }
      }
      gt.truncate(sg.allocator(), n0);
      if (!sparse) continue;
      // Pages of steps 0..5: every (layer, KV head) list holds ceil((n0 + s + 1) / 16) pages.
      int64_t expect = 0;
      for (int s = 0; s < kDenseSteps; ++s) expect += (n0 + s + 1 + 15) / 16;
      expect *= c.n_layers * c.n_heads_kv;
      const CudaSparsityStats st = sg.sparsity_stats();
      int64_t read = 0, total = 0;
      for (size_t i = 0; i < st.read.size(); ++i) {
        read += static_cast<int64_t>(st.read[i]);
        total += static_cast<int64_t>(st.total[i]);
      }
      std::printf("%s %lld: %lld dense steps (pages %lld of %lld, expected %lld), then %d selecting steps "
                  "(pages %lld of %lld)\n",
                  mode == 1 ? "dense-below" : "sparse-min-tokens", static_cast<long long>(pc.dense_below),
                  static_cast<long long>(sg.threshold_dense_steps()),
                  static_cast<long long>(read_dense_phase), static_cast<long long>(total_dense_phase),
                  static_cast<long long>(expect), kSteps - kDenseSteps, static_cast<long long>(read - read_dense_phase),
                  static_cast<long long>(total - total_dense_phase));
      CHECK_TRUE(read_dense_phase == expect && total_dense_phase == expect, "dense-below: pages counted for dense steps");
      CHECK_TRUE(sg.threshold_dense_steps() == kDenseSteps, "dense-below: the policy did not select past the threshold");
      CHECK_TRUE(read - read_dense_phase < total - total_dense_phase, "dense-below: coverage 0.5 read every page");
    }
    gt.release(sg.allocator());
    ct.release(cpool);
  }
  std::printf(failures ? "FAILED (%d)\n" : "PASSED\n", failures);
  return failures ? 1 : 0;
}
