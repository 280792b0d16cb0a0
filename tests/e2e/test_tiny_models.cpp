// Tiny random HF checkpoints of the Llama-family variants the default model does
// not cover -- Llama-3.1 rope_scaling "llama3", Qwen2 QKV bias + tied lm_head,
// Qwen3 per-head q/k RMSNorm with head_dim != hidden / heads -- loaded through
// HfDirSource and run by LlamaCpu, against an independent NumPy float64
// reference (scripts/make_tiny_models.py). Data: tests/data/tiny_models/<name>/.
//
// Checked per model: last-position logits of prompts of 5, 40 and 300 tokens
// (one-shot prefill, and the 300 one also as a 200 + 100 chunked prefill whose
// boundary falls mid-page); logits at every position of the 40-token prompt
// (causal mask); two prompts batched in one forward call; 10 greedy ids after
// each prompt (decode path, one token per step).
#include <gtest/gtest.h>

#include "test_base64.h"
#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "../test_paths.h"
#include "backend/cpu/ops.h"
#include "kv/page_pool.h"
#include "kv/page_table.h"
#include "model/arch/llama_cpu.h"
#include "model/hf_source.h"
#include "model/packed_weight.h"
#include "model/tensor_load.h"

namespace dhs {
namespace {

// Tolerance on |engine - reference| per logit. The reference is float64 on the
// same F32 weights; the engine accumulates in f32 (FMA dot products, f32 softmax,
// inv_freq rounded to f32). Logits here span about +-7. Measured max |diff| over
// all checks of the three models: see the lines each test prints (1.2e-5 at most
// when written, Qwen3 300 tokens chunked); 1e-4 leaves an 8x margin and still catches any real bug:
// dropping the QKV bias, the q/k norm, the llama3 scaling or flipping the RoPE
// pairing each move logits by 0.1 - 5 (verified when the test was written).
constexpr float kLogitTol = 1e-4f;
constexpr int kPageSize = 16;

using test::decode_b64_f32;

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0.0f;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const float d = std::fabs(a[i] - b[i]);
    m = std::isnan(d) ? INFINITY : std::max(m, d);
  }
  return m;
}

int32_t argmax(const float* x, int64_t n) { return static_cast<int32_t>(std::max_element(x, x + n) - x); }

struct Seq {
  std::string name;
  std::vector<int32_t> ids;
  std::vector<float> last;  // [vocab]
  std::vector<float> all;   // [n, vocab] or empty
  std::vector<int32_t> greedy;
};

struct TinyModel {
  std::string name;
  nlohmann::json ref;
  std::unique_ptr<HfDirSource> src;
  std::unique_ptr<LlamaCpu> model;
  std::vector<Seq> seqs;
  float worst = 0.0f;  // max |diff| over every check

  explicit TinyModel(const std::string& n) : name(n) {
    const std::string dir = test::data_dir() + "/tiny_models/" + n;
    std::ifstream in(dir + "/reference.json");
    if (!in) throw std::runtime_error("missing " + dir + "/reference.json (run scripts/make_tiny_models.py)");
    ref = nlohmann::json::parse(in);
    src = HfDirSource::open(dir);
    model = std::make_unique<LlamaCpu>(*src, CpuWeightType::F32);
    for (const auto& s : ref["sequences"]) {
      Seq q;
      q.name = s["name"].get<std::string>();
      q.ids = s["ids"].get<std::vector<int32_t>>();
      q.last = decode_b64_f32(s["logits_last_b64_f32le"].get<std::string>());
      if (s.contains("logits_all_b64_f32le")) q.all = decode_b64_f32(s["logits_all_b64_f32le"].get<std::string>());
      q.greedy = s["greedy_ids"].get<std::vector<int32_t>>();
      seqs.push_back(std::move(q));
    }
  }
  int64_t vocab() const { return model->config().vocab_size; }

  PagePool make_pool(int64_t max_tokens_total) const {
    const auto& c = model->config();
    return PagePool(Tier::Host, c.n_layers * c.n_heads_kv * (max_tokens_total / kPageSize + 4), kPageSize,
                    static_cast<int>(c.head_dim));
  }
  PageTable make_table() const {
    const auto& c = model->config();
    return PageTable(static_cast<int>(c.n_layers), static_cast<int>(c.n_heads_kv), kPageSize);
  }

  float check(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
    const float d = max_abs_diff(got, want);
    EXPECT_LT(d, kLogitTol) << name << ": " << what;
    worst = std::max(worst, d);
    std::printf("  %-20s %-34s max|dlogit| %.2e\n", name.c_str(), what.c_str(), d);
    return d;
  }
};

// Prefill `ids` in chunks of the given sizes (last-token logits), compare, then
// decode n greedy tokens one at a time and compare the ids.
void run_prompt(TinyModel& t, const Seq& s, const std::vector<int64_t>& chunks, bool greedy) {
  const int64_t n = static_cast<int64_t>(s.ids.size());
  PagePool pool = t.make_pool(n + static_cast<int64_t>(s.greedy.size()));
  PageTable table = t.make_table();
  std::vector<float> logits;
  int64_t done = 0;
  std::string label = s.name + " prefill ";
  for (size_t i = 0; i < chunks.size(); ++i) {
    const int64_t c = chunks[i];
    ASSERT_TRUE(table.reserve(pool, c));
    t.model->forward({LlamaCpu::Seq{&table, s.ids.data() + done, c}}, pool, &logits);
    done += c;
    if (i > 0) label += '+';
    label += std::to_string(c);
  }
  ASSERT_EQ(done, n);
  ASSERT_EQ(table.n_tokens(), n);
  t.check(logits, s.last, label);
  if (greedy) {
    std::vector<int32_t> got;
    for (size_t i = 0; i < s.greedy.size(); ++i) {
      const int32_t id = argmax(logits.data(), t.vocab());
      got.push_back(id);
      if (i + 1 == s.greedy.size()) break;
      ASSERT_TRUE(table.reserve(pool, 1));
      t.model->forward({LlamaCpu::Seq{&table, &id, 1}}, pool, &logits);
    }
    EXPECT_EQ(got, s.greedy) << t.name << ": greedy continuation of " << s.name;
  }
  table.release(pool);
  EXPECT_EQ(pool.n_free(), pool.n_pages());
  EXPECT_EQ(pool.check_invariants(), "");
}

void check_tiny_model(const std::string& name, Arch arch, bool tied) {
  TinyModel t(name);
  const ModelConfig& c = t.model->config();
  // The loader must have parsed what the generator meant; otherwise a silent
  // config mismatch could make engine and reference agree on the wrong model.
  EXPECT_EQ(c.arch, arch);
  EXPECT_EQ(c.tied_embeddings, tied);
  EXPECT_EQ(c.rope_style, RopeStyle::Half);
  EXPECT_EQ(c.vocab_size, 300);
  ASSERT_EQ(t.seqs.size(), 3u);

  // inv_freq the generator computed (incl. llama3 scaling) vs ours, in isolation.
  const auto ref_inv = t.ref["inv_freq"].get<std::vector<double>>();
  ASSERT_EQ(static_cast<int64_t>(ref_inv.size()), c.head_dim / 2);
  std::vector<float> inv(ref_inv.size());
  rope_inv_freq(c, inv.data());
  for (size_t i = 0; i < inv.size(); ++i)
    EXPECT_NEAR(inv[i], ref_inv[i], 1e-6 * ref_inv[i]) << name << ": inv_freq[" << i << "]";

  for (const Seq& s : t.seqs) {
    SCOPED_TRACE(name + " " + s.name);
    const int64_t n = static_cast<int64_t>(s.ids.size());
    run_prompt(t, s, {n}, true);
    if (n >= 200) run_prompt(t, s, {200, n - 200}, true);  // chunk boundary mid-page (200 = 12.5 pages)
    if (!s.all.empty()) {
      // Every position of one prefill: causal masking, no leakage from later tokens.
      PagePool pool = t.make_pool(n);
      PageTable table = t.make_table();
      std::vector<float> logits;
      ASSERT_TRUE(table.reserve(pool, n));
      t.model->forward({LlamaCpu::Seq{&table, s.ids.data(), n}}, pool, &logits, /*all_logits=*/true);
      ASSERT_EQ(static_cast<int64_t>(logits.size()), n * t.vocab());
      t.check(logits, s.all, s.name + " all positions");
      table.release(pool);
    }
  }

  {
    // Two prompts in one forward call (ragged batch): each gets its own last logits.
    const Seq& a = t.seqs[0];
    const Seq& b = t.seqs[1];
    const int64_t na = static_cast<int64_t>(a.ids.size()), nb = static_cast<int64_t>(b.ids.size());
    PagePool pool = t.make_pool(na + nb + 2 * kPageSize);
    PageTable ta = t.make_table(), tb = t.make_table();
    ASSERT_TRUE(ta.reserve(pool, na));
    ASSERT_TRUE(tb.reserve(pool, nb));
    std::vector<float> logits;
    t.model->forward({LlamaCpu::Seq{&ta, a.ids.data(), na}, LlamaCpu::Seq{&tb, b.ids.data(), nb}}, pool, &logits);
    ASSERT_EQ(static_cast<int64_t>(logits.size()), 2 * t.vocab());
    t.check(std::vector<float>(logits.begin(), logits.begin() + t.vocab()), a.last, a.name + "+" + b.name + " batched [0]");
    t.check(std::vector<float>(logits.begin() + t.vocab(), logits.end()), b.last, a.name + "+" + b.name + " batched [1]");
    ta.release(pool);
    tb.release(pool);
    EXPECT_EQ(pool.n_free(), pool.n_pages());
  }
  std::printf("  %-20s worst max|dlogit| %.2e (tolerance %.0e)\n", name.c_str(), t.worst, kLogitTol);
}

TEST(TinyModels, Llama31RopeScaled) {
  check_tiny_model("llama31_rope_scaled", Arch::Llama, true);
}

TEST(TinyModels, Qwen2Bias) { check_tiny_model("qwen2_bias", Arch::Qwen2, true); }

TEST(TinyModels, Qwen3QkNorm) { check_tiny_model("qwen3_qknorm", Arch::Qwen3, false); }

// A source whose projection matrices (attn_{q,k,v,output}, ffn_{gate,up,down}) read as their
// FP8 rounding (model/packed_weight.h, tested against a brute-force E4M3 search in
// test_packed_weight) in f32; every other tensor as the wrapped source has it.
class Fp8RoundedSource final : public WeightSource {
 public:
  explicit Fp8RoundedSource(const WeightSource& in) : in_(in) {
    for (const std::string& name : in.tensor_names()) {
      const RawTensor* t = in.find(name);
      const bool proj = name.rfind("blk.", 0) == 0 && t->shape.size() == 2 &&
                        (name.find(".attn_") != std::string::npos || name.find(".ffn_") != std::string::npos) &&
                        name.find("norm") == std::string::npos;
      if (!proj) continue;
      std::vector<float> f = load_tensor_f32(in, name, t->shape);
      const PackedMatrix q = quantize_fp8_rows(f.data(), t->shape[0], t->shape[1]);
      for (int64_t r = 0; r < t->shape[0]; ++r) unpack_row(q, r, f.data() + r * t->shape[1]);
      data_[name] = std::move(f);
      RawTensor& rt = raw_[name];
      rt = *t;
      rt.dtype = DType::F32;
      rt.data = reinterpret_cast<const uint8_t*>(data_[name].data());
      rt.n_bytes = data_[name].size() * sizeof(float);
    }
  }
  const ModelConfig& config() const override { return in_.config(); }
  const RawTensor* find(const std::string& name) const override {
    const auto it = raw_.find(name);
    return it != raw_.end() ? &it->second : in_.find(name);
  }
  std::vector<std::string> tensor_names() const override { return in_.tensor_names(); }
  std::string format() const override { return in_.format(); }
  size_t n_rounded() const { return raw_.size(); }

 private:
  const WeightSource& in_;
  std::map<std::string, std::vector<float>> data_;
  std::map<std::string, RawTensor> raw_;
};

// The CPU statement of `--quantization fp8` (LlamaCpu's fp8_projections): the model computes with
// exactly the FP8-rounded projections — logits bit-equal to a plain load of a source whose
// projections were rounded beforehand — and nothing else rounded (embeddings, norms, biases, the
// output head stay: the plain-f32 model's logits differ, and so would a rounding of those).
TEST(TinyModels, Fp8ProjectionsAreTheRoundedWeights) {
  for (const char* name : {"llama31_rope_scaled", "qwen2_bias", "qwen3_qknorm"}) {
    SCOPED_TRACE(name);
    TinyModel t(name);
    const Fp8RoundedSource rounded(*t.src);
    EXPECT_EQ(rounded.n_rounded(), 7u * static_cast<size_t>(t.model->config().n_layers));
    LlamaCpu fp8(*t.src, CpuWeightType::F32, {}, /*fp8_projections=*/true);
    LlamaCpu pre(rounded, CpuWeightType::F32);
    const Seq& s = t.seqs[0];
    const int64_t n = static_cast<int64_t>(s.ids.size());
    const auto logits_of = [&](LlamaCpu& m) {
      PagePool pool = t.make_pool(n);
      PageTable table = t.make_table();
      std::vector<float> logits;
      EXPECT_TRUE(table.reserve(pool, n));
      m.forward({LlamaCpu::Seq{&table, s.ids.data(), n}}, pool, &logits);
      table.release(pool);
      return logits;
    };
    const std::vector<float> a = logits_of(fp8), b = logits_of(pre), plain = logits_of(*t.model);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "FP8 load differs from the rounded weights";
    EXPECT_GT(max_abs_diff(a, plain), 0.0f) << "FP8 rounding changed nothing";
  }
}

// Config-level facts the three models are meant to exercise.
TEST(TinyModels, ConfigsExerciseTheVariants) {
  const std::string root = test::data_dir() + "/tiny_models/";
  {
    auto src = HfDirSource::open(root + "llama31_rope_scaled");
    const auto& c = src->config();
    EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::Llama3);
    EXPECT_EQ(c.rope_scaling.factor, 8.0f);
    EXPECT_EQ(c.rope_scaling.original_max_position, 64);
    EXPECT_EQ(c.max_context, 512);
    EXPECT_FALSE(c.qkv_bias);
    EXPECT_FALSE(c.qk_norm);
  }
  {
    auto src = HfDirSource::open(root + "qwen2_bias");
    const auto& c = src->config();
    EXPECT_TRUE(c.qkv_bias);
    EXPECT_TRUE(c.tied_embeddings);
    EXPECT_NE(src->find("blk.0.attn_k.bias"), nullptr);
    EXPECT_EQ(src->find("output.weight"), nullptr);
  }
  {
    auto src = HfDirSource::open(root + "qwen3_qknorm");
    const auto& c = src->config();
    EXPECT_TRUE(c.qk_norm);
    EXPECT_FALSE(c.qkv_bias);
    EXPECT_EQ(c.head_dim, 32);
    EXPECT_NE(c.head_dim * c.n_heads_q, c.hidden);
    EXPECT_NE(src->find("output.weight"), nullptr);
  }
}

}  // namespace
}  // namespace dhs
