// The default model's next-token logits and greedy continuations against an
// independent NumPy implementation (scripts/reference_forward.py, float64,
// weights dequantized by the `gguf` package). Data: tests/data/reference/.
#include <gtest/gtest.h>

#include "test_base64.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../test_paths.h"
#include "kv/page_pool.h"
#include "kv/page_table.h"
#include "model/arch/llama_cpu.h"
#include "model/gguf_source.h"

namespace dhs {
namespace {

using test::decode_b64_f32;

struct Fixture {
  nlohmann::json ref;
  std::unique_ptr<GgufSource> src;
};

Fixture* load() {
  static std::unique_ptr<Fixture> f;
  if (f) return f.get();
  if (!std::filesystem::exists(test::default_model_path())) return nullptr;
  f = std::make_unique<Fixture>();
  std::ifstream in(test::data_dir() + "/reference/smollm2_135m.json");
  f->ref = nlohmann::json::parse(in);
  f->src = std::make_unique<GgufSource>(test::default_model_path());
  return f.get();
}

// Runs the prompt, then greedy decoding for n steps; returns the prompt logits
// and the greedy ids with each step's logits.
struct Run {
  std::vector<float> prompt_logits;
  std::vector<int32_t> greedy;
};

Run run(LlamaCpu& m, const std::vector<int32_t>& ids, int n_greedy) {
  const auto& c = m.config();
  PagePool pool(Tier::Host, c.n_layers * c.n_heads_kv * ((static_cast<int64_t>(ids.size()) + n_greedy) / 16 + 2), 16,
                static_cast<int>(c.head_dim));
  PageTable table(static_cast<int>(c.n_layers), static_cast<int>(c.n_heads_kv), 16);
  Run r;
  std::vector<float> logits;
  // Chunked prefill of 512 as the engine does, so chunk boundaries are covered by the 1k prompt.
  for (size_t b = 0; b < ids.size(); b += 512) {
    const int64_t n = std::min<int64_t>(512, static_cast<int64_t>(ids.size() - b));
    EXPECT_TRUE(table.reserve(pool, n));
    m.forward({LlamaCpu::Seq{&table, ids.data() + b, n}}, pool, &logits);
  }
  r.prompt_logits = logits;
  for (int i = 0; i < n_greedy; ++i) {
    const int32_t id = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    r.greedy.push_back(id);
    if (i + 1 == n_greedy) break;
    EXPECT_TRUE(table.reserve(pool, 1));
    m.forward({LlamaCpu::Seq{&table, &id, 1}}, pool, &logits);
  }
  table.release(pool);
  EXPECT_EQ(pool.n_free(), pool.n_pages());
  EXPECT_EQ(pool.check_invariants(), "");
  return r;
}

// Tolerances. The reference runs in float64 on the same dequantized weights; we
// run in float32 (f32 weights) or with weights rounded to fp16 (relative error
// 2^-11 per weight). Logits of this model span about +-30; measured max |diff|
// over all prompts was 2.7e-5 (f32) and 2.7e-2 (f16) on 2026-11-29, so the
// bounds below leave a 4-40x margin while still failing on any real bug (a wrong
// RoPE pairing, mask or page boundary moves logits by whole units).
void check_model(CpuWeightType wt, float logit_tol, int n_greedy_required) {
  Fixture* f = load();
  if (!f) GTEST_SKIP() << "default model missing: run scripts/fetch_model.sh";
  LlamaCpu m(*f->src, wt);
  for (const auto& p : f->ref["prompts"]) {
    SCOPED_TRACE(p["name"].get<std::string>());
    const auto ids = p["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = decode_b64_f32(p["logits_last_b64_f32le"].get<std::string>());
    const auto greedy_ref = p["greedy_ids"].get<std::vector<int32_t>>();
    const auto gaps = p["greedy_top2_gap"].get<std::vector<float>>();
    Run r = run(m, ids, static_cast<int>(greedy_ref.size()));
    ASSERT_EQ(r.prompt_logits.size(), want.size());
    float max_diff = 0.0f;
    for (size_t i = 0; i < want.size(); ++i) max_diff = std::max(max_diff, std::fabs(r.prompt_logits[i] - want[i]));
    EXPECT_LT(max_diff, logit_tol) << "prompt of " << ids.size() << " tokens";
    std::printf("  %-22s %5zu tokens  max|dlogit| %.2e\n", p["name"].get<std::string>().c_str(), ids.size(), max_diff);
    // Greedy continuations must agree; a divergence is only acceptable at a near-tie
    // of the reference (top-2 gap below the logit tolerance), and only after the
    // required number of agreeing tokens.
    for (size_t i = 0; i < greedy_ref.size(); ++i) {
      if (r.greedy[i] == greedy_ref[i]) continue;
      EXPECT_GE(static_cast<int>(i), n_greedy_required) << "diverged at step " << i;
      EXPECT_LT(gaps[i], logit_tol) << "diverged at step " << i << " where the reference top-2 gap is " << gaps[i];
      std::printf("    diverged at step %zu (reference top-2 gap %.3g)\n", i, gaps[i]);
      break;
    }
  }
}

TEST(ReferenceLogits, F32WeightsMatchNumPyReference) { check_model(CpuWeightType::F32, 1e-3f, 40); }
TEST(ReferenceLogits, F16WeightsMatchNumPyReference) { check_model(CpuWeightType::F16, 0.1f, 32); }

}  // namespace
}  // namespace dhs
