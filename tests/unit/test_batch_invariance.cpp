// Bitwise batch invariance of the CPU forward (issue 21): a request's logits and K/V rows
// depend only on its own tokens, never on what shares its step (other requests' prefill
// chunks or decode rows), on how its prompt is chunked, or on decode vs recompute. Compared
// with memcmp, on the three tiny checkpoints (hidden 64 / 96, head_dim 16 / 32) with f32 and
// f16 weights, and on matmul directly with column counts where the dot's tail matters.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "../test_paths.h"
#include "backend/cpu/ops.h"
#include "engine/step_runner.h"
#include "kv/page_table.h"
#include "model/model_loader.h"

namespace dhs {
namespace {

// Index of the first element whose bits differ, for the failure message; n when none.
size_t first_diff(const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0) return i;
  return n;
}

// Every row of a matmul equals the same row computed alone (n_tok = 1), whatever the number
// of tokens (GEMV at 1-2, the 4x3-blocked GEMM from 3, its 48-token tiles at 48+) and whether
// cols is a multiple of 16, of 8, or neither. Rows 37: not a multiple of the 4/8-row blocks.
TEST(BatchInvariance, MatmulRowsEqualTheRowAlone) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto wt : {CpuWeightType::F32, CpuWeightType::F16}) {
    for (int64_t cols : {64, 96, 70, 13, 5, 577}) {
      const int64_t rows = 37;
      std::vector<float> w(static_cast<size_t>(rows * cols)), bias(static_cast<size_t>(rows));
      for (float& v : w) v = nd(rng);
      for (float& v : bias) v = nd(rng);
      const CpuMatrix m(w.data(), rows, cols, wt);
      for (int64_t n_tok : {1, 2, 3, 5, 48, 49, 97}) {
        std::vector<float> x(static_cast<size_t>(n_tok * cols)), y(static_cast<size_t>(n_tok * rows));
        for (float& v : x) v = nd(rng);
        cpu::matmul(m, x.data(), y.data(), n_tok, bias.data());
        std::vector<float> y1(static_cast<size_t>(rows));
        for (int64_t t = 0; t < n_tok; ++t) {
          cpu::matmul(m, x.data() + t * cols, y1.data(), 1, bias.data());
          const float* row = y.data() + t * rows;
          const size_t d = first_diff(row, y1.data(), static_cast<size_t>(rows));
          ASSERT_EQ(d, static_cast<size_t>(rows)) << (wt == CpuWeightType::F16 ? "f16" : "f32") << " cols " << cols
                                                  << " n_tok " << n_tok << " token " << t << " row " << d << ": "
                                                  << row[d] << " vs " << y1[d] << " alone";
        }
      }
    }
  }
}

using Param = std::tuple<std::string, std::string>;  // (tiny model, weight type)

class ModelInvariance : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    src_ = open_weights(test::data_dir() + "/tiny_models/" + std::get<0>(GetParam()));
    EngineOptions o;
    o.weight_type = std::get<1>(GetParam());
    o.kv_blocks = 64;  // several requests of up to ~100 tokens at once
    runner_ = make_cpu_runner(*src_, o, 256);
    V_ = runner_->config().vocab_size;
  }
  void TearDown() override {
    for (auto& t : tables_) t->release(runner_->pages());
    EXPECT_EQ(runner_->pages().stats().n_used, 0);
  }
  PageTable* table() {
    const ModelConfig& c = runner_->config();
    tables_.push_back(std::make_unique<PageTable>(static_cast<int>(c.n_layers), static_cast<int>(c.n_heads_kv), 16));
    return tables_.back().get();
  }
  // A prompt of n ids from `seed`.
  std::vector<int32_t> prompt(int64_t n, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(V_ - 1));
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (int32_t& v : p) v = d(rng);
    return p;
  }
  struct Part {
    PageTable* table;
    const int32_t* tokens;
    int64_t n;
  };
  // One step over parts; returns [n_parts, vocab] last-row logits.
  std::vector<float> step(const std::vector<Part>& parts) {
    std::vector<StepRequest> reqs;
    for (size_t i = 0; i < parts.size(); ++i) {
      EXPECT_TRUE(parts[i].table->reserve(runner_->pages(), parts[i].n));
      reqs.push_back(StepRequest{parts[i].table, static_cast<int>(i), parts[i].tokens, parts[i].n});
    }
    StepOutput out;
    runner_->step(reqs, &out, true);
    EXPECT_EQ(out.logits.size(), parts.size() * static_cast<size_t>(V_));
    return out.logits;
  }
  // Feeds ids to t in chunks of the given sizes (cycled), alone; returns the last logits.
  std::vector<float> feed(PageTable* t, const std::vector<int32_t>& ids, const std::vector<int64_t>& chunks) {
    std::vector<float> last;
    size_t k = 0;
    for (int64_t i = 0; i < static_cast<int64_t>(ids.size()); ++k) {
      const int64_t n = std::min<int64_t>(chunks[k % chunks.size()], static_cast<int64_t>(ids.size()) - i);
      last = step({{t, ids.data() + i, n}});
      i += n;
    }
    return last;
  }
  // Every K and V row of t's committed tokens, all layers and KV heads, in one vector.
  std::vector<float> kv_rows(const PageTable& t) {
    const ModelConfig& c = runner_->config();
    const int d = static_cast<int>(c.head_dim);
    std::vector<float> out;
    for (int l = 0; l < c.n_layers; ++l)
      for (int h = 0; h < c.n_heads_kv; ++h)
        for (int64_t p = 0; p < t.n_tokens(); ++p) {
          int row;
          const PageRef pg = t.page_of_token(l, h, p, &row);
          const float* k = runner_->pages().k_page(pg) + row * d;
          const float* v = runner_->pages().v_page(pg) + row * d;
          out.insert(out.end(), k, k + d);
          out.insert(out.end(), v, v + d);
        }
    return out;
  }
  void expect_same(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    const size_t d = first_diff(got.data(), want.data(), want.size());
    EXPECT_EQ(d, want.size()) << what << ": element " << d << " is " << got[d] << ", want " << want[d];
  }

  std::unique_ptr<WeightSource> src_;
  std::unique_ptr<StepRunner> runner_;
  std::vector<std::unique_ptr<PageTable>> tables_;
  int64_t V_ = 0;
};

// (a) A alone: a 53-token prompt (crosses pages and the GEMM's 48-token tile), then 4 decode
// tokens. Batched: the same steps of A beside other requests' chunks and decode rows, A first,
// middle or last, with steps of 2, 3 and 80+ rows.
TEST_P(ModelInvariance, MixedBatchLogitsEqualAlone) {
  const std::vector<int32_t> a = prompt(53, 1), b = prompt(70, 2), c = prompt(9, 3), d = prompt(31, 4);
  const std::vector<int32_t> a_dec = {7, 250, 3, 123};
  std::vector<std::vector<float>> want;
  PageTable* ta = table();
  want.push_back(step({{ta, a.data(), 53}}));
  for (const int32_t& tok : a_dec) want.push_back(step({{ta, &tok, 1}}));
  const std::vector<float> want_kv = kv_rows(*ta);

  PageTable *ba = table(), *bb = table(), *bc = table(), *bd = table();
  const int32_t b_dec = 42, c_dec[] = {9, 10, 11};
  std::vector<std::vector<float>> got;
  std::vector<float> l;
  // Step 0: A's prompt between B's first chunk and C's prompt.
  l = step({{bb, b.data(), 30}, {ba, a.data(), 53}, {bc, c.data(), 9}});
  got.emplace_back(l.begin() + V_, l.begin() + 2 * V_);
  // Step 1: A's decode row last, after B's second chunk and C's decode row.
  l = step({{bb, b.data() + 30, 40}, {bc, &c_dec[0], 1}, {ba, &a_dec[0], 1}});
  got.emplace_back(l.begin() + 2 * V_, l.end());
  // Step 2: decode rows only, A first (a GEMV step of 2 rows: A and C).
  l = step({{ba, &a_dec[1], 1}, {bc, &c_dec[1], 1}});
  got.emplace_back(l.begin(), l.begin() + V_);
  // Step 3: A with D's whole prompt and B's decode row.
  l = step({{bd, d.data(), 31}, {ba, &a_dec[2], 1}, {bb, &b_dec, 1}});
  got.emplace_back(l.begin() + V_, l.begin() + 2 * V_);
  // Step 4: A with C's decode row and D's decode row (3 rows: the GEMM path).
  l = step({{bc, &c_dec[2], 1}, {bd, &b_dec, 1}, {ba, &a_dec[3], 1}});
  got.emplace_back(l.begin() + 2 * V_, l.end());
  for (size_t s = 0; s < want.size(); ++s) expect_same(got[s], want[s], "A's logits at step " + std::to_string(s));
  expect_same(kv_rows(*ba), want_kv, "A's K/V rows");
}

// (b) A's 61-token prompt in one chunk vs in chunks of 1, 3, 7 and of odd mixed sizes: the
// last logits and every K/V row.
TEST_P(ModelInvariance, ChunkingDoesNotChangeLogitsOrKv) {
  const std::vector<int32_t> a = prompt(61, 5);
  PageTable* whole = table();
  const std::vector<float> want = feed(whole, a, {61});
  const std::vector<float> want_kv = kv_rows(*whole);
  for (const std::vector<int64_t>& chunks :
       std::vector<std::vector<int64_t>>{{1}, {3}, {7}, {5, 11, 2, 13, 1, 17}, {48, 13}, {49, 12}}) {
    PageTable* t = table();
    const std::vector<float> got = feed(t, a, chunks);
    std::string name = "chunks";
    for (int64_t n : chunks) name += " " + std::to_string(n);
    expect_same(got, want, name + ": last logits");
    expect_same(kv_rows(*t), want_kv, name + ": K/V rows");
  }
}

// (c) Decoding 6 tokens one by one after a 20-token prompt vs prefilling all 26 at once
// (preemption by recompute): the last logits and the K/V rows.
TEST_P(ModelInvariance, DecodeEqualsRecompute) {
  std::vector<int32_t> a = prompt(20, 6);
  PageTable* inc = table();
  std::vector<float> l = feed(inc, a, {20});
  for (int i = 0; i < 6; ++i) {
    // Greedy continuation, so the recompute sees the tokens a scheduler would have.
    const int32_t next = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    a.push_back(next);
    l = step({{inc, &a.back(), 1}});
  }
  PageTable* re = table();
  const std::vector<float> got = feed(re, a, {static_cast<int64_t>(a.size())});
  expect_same(got, l, "recomputed last logits");
  expect_same(kv_rows(*re), kv_rows(*inc), "recomputed K/V rows");
}

INSTANTIATE_TEST_SUITE_P(TinyModels, ModelInvariance,
                         ::testing::Combine(::testing::Values("qwen2_bias", "qwen3_qknorm", "llama31_rope_scaled"),
                                            ::testing::Values("f32", "f16")),
                         [](const ::testing::TestParamInfo<Param>& i) {
                           return std::get<0>(i.param) + "_" + std::get<1>(i.param);
                         });

}  // namespace
}  // namespace dhs
