// What the CUDA tests on random weights share: a small Llama shape with the decode kernel's
// head_dim, a WeightSource that is only a config (--load-format dummy), and small helpers.
#pragma once
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "gtest_shim.h"
#include "kv/page_pool.h"
#include "model/model_config.h"
#include "model/weight_source.h"

namespace dhs::test {

inline bool env_on(const char* name) {
  const char* e = std::getenv(name);
  return e && *e && *e != '0';
}
inline bool small_mode() { return env_on("DHS_TEST_SMALL") || env_on("DHS_TEST_QUICK"); }
inline bool have_gpu() { return cuda::device_count() > 0; }

// A small Llama: GQA 8/2 at head_dim 128 (the decode kernel's), 4 layers.
inline ModelConfig tiny_config() {
  ModelConfig c;
  c.name = "tiny-llama (random f16)";
  c.n_layers = 4;
  c.hidden = 1024;
  c.n_heads_q = 8;
  c.n_heads_kv = 2;
  c.head_dim = 128;
  c.ffn_hidden = 2048;
  c.vocab_size = 8192;
  c.max_context = 4096;
  c.rope_theta = 10000.0f;
  return c;
}

// What make_cuda_runner reads of a model under --load-format dummy: its config.
class ConfigSource final : public WeightSource {
 public:
  explicit ConfigSource(const ModelConfig& c) : c_(c) {}
  const ModelConfig& config() const override { return c_; }
  const RawTensor* find(const std::string&) const override { return nullptr; }
  std::vector<std::string> tensor_names() const override { return {}; }
  std::string format() const override { return "none"; }

 private:
  ModelConfig c_;
};

inline int32_t argmax(const float* l, int64_t n) { return static_cast<int32_t>(std::max_element(l, l + n) - l); }
inline float top2_gap(const float* l, int64_t n) {
  std::vector<float> v(l, l + n);
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
  return v[0] - v[1];
}

inline std::vector<int32_t> random_ids(int n, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = pick(rng);
  return v;
}

inline void expect_pool_empty(PagePool& pool, const char* where) {
  EXPECT_EQ(pool.n_used(), 0) << where << ": pages still in use";
  EXPECT_TRUE(pool.check_invariants().empty()) << where << ": " << pool.check_invariants();
}

}  // namespace dhs::test
