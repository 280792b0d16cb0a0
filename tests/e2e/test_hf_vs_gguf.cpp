// The Hugging Face path end to end: the default GGUF model converted in the test
// to an HF directory (config.json, F16 safetensors with Q/K rows un-permuted to
// HF order, tokenizer.json) must give the same logits as the GGUF path. This
// exercises safetensors, config parsing, name mapping, half-split RoPE on HF
// weights and the tokenizer.json loader on a real model.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/fp16.h"
#include "dhisparse/engine.h"
#include "model/dequant.h"
#include "model/gguf_source.h"
#include "test_paths.h"

namespace dhs {
namespace {

namespace fs = std::filesystem;

// Writes tensors as one F16/F32 safetensors file.   tensors: name -> (shape, fp32 data, as_f16)
struct Out {
  std::vector<int64_t> shape;
  std::vector<float> data;
  bool f16;
};
void write_safetensors(const fs::path& path, const std::map<std::string, Out>& tensors) {
  nlohmann::json hdr = nlohmann::json::object();
  size_t off = 0;
  for (const auto& [name, t] : tensors) {
    const size_t bytes = t.data.size() * (t.f16 ? 2 : 4);
    hdr[name] = {{"dtype", t.f16 ? "F16" : "F32"}, {"shape", t.shape}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  std::string h = hdr.dump();
  while (h.size() % 8) h += ' ';
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = h.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& [name, t] : tensors) {
    if (t.f16) {
      std::vector<uint16_t> v(t.data.size());
      for (size_t i = 0; i < v.size(); ++i) v[i] = f32_to_fp16(t.data[i]);
      f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 2));
    } else {
      f.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size() * 4));
    }
  }
}

std::vector<float> dequant(const RawTensor& t) {
  std::vector<float> out(static_cast<size_t>(t.n_elems()));
  dequantize_row(t.dtype, t.data, out.data(), t.n_elems());
  return out;
}

// GGUF llama rows of one head are ordered (j, i) for pair j, half i; HF orders them (i, j).
std::vector<float> unpermute(const std::vector<float>& w, int64_t n_heads, int64_t head_dim, int64_t cols) {
  std::vector<float> out(w.size());
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < half; ++j) {
        const int64_t src = h * head_dim + 2 * j + i, dst = h * head_dim + i * half + j;
        std::copy_n(w.begin() + src * cols, cols, out.begin() + dst * cols);
      }
  return out;
}

TEST(HfVsGguf, ConvertedDirectoryGivesSameLogits) {
  const std::string gguf_path = test::default_model_path();
  if (!fs::exists(gguf_path)) GTEST_SKIP() << "default model missing: run scripts/fetch_model.sh";
  const fs::path dir = fs::temp_directory_path() / fmt::format("dhs_hf_{}", ::getpid());
  fs::create_directories(dir);
  {
    GgufSource src(gguf_path);
    const ModelConfig& c = src.config();
    std::map<std::string, Out> ts;
    auto mat = [&](const std::string& g, const std::string& hf, bool permuted_heads = false, int64_t n_heads = 0) {
      const RawTensor* t = src.find(g);
      ASSERT_NE(t, nullptr) << g;
      auto d = dequant(*t);
      if (permuted_heads) d = unpermute(d, n_heads, c.head_dim, t->shape[1]);
      ts[hf] = Out{t->shape, std::move(d), t->shape.size() == 2};
    };
    mat("token_embd.weight", "model.embed_tokens.weight");
    mat("output_norm.weight", "model.norm.weight");
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const std::string g = fmt::format("blk.{}.", l), h = fmt::format("model.layers.{}.", l);
      mat(g + "attn_norm.weight", h + "input_layernorm.weight");
      mat(g + "ffn_norm.weight", h + "post_attention_layernorm.weight");
      mat(g + "attn_q.weight", h + "self_attn.q_proj.weight", true, c.n_heads_q);
      mat(g + "attn_k.weight", h + "self_attn.k_proj.weight", true, c.n_heads_kv);
      mat(g + "attn_v.weight", h + "self_attn.v_proj.weight");
      mat(g + "attn_output.weight", h + "self_attn.o_proj.weight");
      mat(g + "ffn_gate.weight", h + "mlp.gate_proj.weight");
      mat(g + "ffn_up.weight", h + "mlp.up_proj.weight");
      mat(g + "ffn_down.weight", h + "mlp.down_proj.weight");
    }
    write_safetensors(dir / "model.safetensors", ts);
    nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                          {"hidden_size", c.hidden}, {"intermediate_size", c.ffn_hidden},
                          {"num_hidden_layers", c.n_layers}, {"num_attention_heads", c.n_heads_q},
                          {"num_key_value_heads", c.n_heads_kv}, {"vocab_size", c.vocab_size},
                          {"max_position_embeddings", c.max_context}, {"rms_norm_eps", c.rms_eps},
                          {"rope_theta", c.rope_theta}, {"tie_word_embeddings", true},
                          {"hidden_act", "silu"}, {"rope_scaling", nullptr}};
    std::ofstream(dir / "config.json") << cfg.dump(1);
    fs::copy_file(test::data_dir() + "/tokenizer/smollm2/tokenizer.json", dir / "tokenizer.json");
    fs::copy_file(test::data_dir() + "/tokenizer/smollm2/tokenizer_config.json", dir / "tokenizer_config.json");
  }

  EngineOptions o;
  o.weight_type = "f16";  // both paths then hold bit-identical fp16 weights
  o.model_path = gguf_path;
  auto from_gguf = Engine::load(o);
  o.model_path = dir.string();
  auto from_hf = Engine::load(o);
  EXPECT_EQ(from_hf->config().rope_style, RopeStyle::Half);
  EXPECT_EQ(from_gguf->config().rope_style, RopeStyle::Interleaved);

  for (const std::string text : {"The capital of France is", "def fibonacci(n):\n    if n < 2:",
                                 "Les 12 premiers nombres premiers sont 2, 3, 5, 7,"}) {
    const auto ids = from_gguf->tokenize(text);
    ASSERT_EQ(from_hf->tokenize(text), ids) << text;
    const auto a = from_gguf->prompt_logits(ids), b = from_hf->prompt_logits(ids);
    ASSERT_EQ(a.size(), b.size());
    float max_diff = 0;
    for (size_t i = 0; i < a.size(); ++i) max_diff = std::max(max_diff, std::fabs(a[i] - b[i]));
    // Same weights, same math; only the order of terms in q.k differs (the head
    // dimensions are permuted), so differences are fp32 rounding: ~1e-5 measured.
    EXPECT_LT(max_diff, 1e-3f) << text;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dhs
