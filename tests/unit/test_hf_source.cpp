// HfDirSource: tiny Llama / Qwen2 / Qwen3 directories written here (single file
// and sharded) load with the right config, canonical names, shapes and data;
// malformed directories throw dhs::Error saying what is wrong and where.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/hf_source.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using dhs::HfDirSource;
using dhs::ModelConfig;

// --- a tiny safetensors writer (test-only) ---

struct StTensor {
  std::string name;  // HF name
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

std::string st_build(const std::vector<StTensor>& tensors) {
  json header = json::object();
  std::string data;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  return out + h + data;
}

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << p;
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// F32 tensor whose element i holds seed + i (so data pointers can be checked).
StTensor f32(const std::string& name, std::vector<int64_t> shape, float seed) {
  std::vector<float> v(static_cast<size_t>(numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = seed + static_cast<float>(i);
  return {name, "F32", shape, std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4)};
}

// 2-byte tensor (F16/BF16) of zeros.
StTensor half(const std::string& name, const std::string& dtype, std::vector<int64_t> shape) {
  return {name, dtype, shape, std::string(static_cast<size_t>(numel(shape)) * 2, '\0')};
}

// --- tiny models ---

struct TinyModel {
  json config;
  std::vector<StTensor> tensors;

  StTensor* tensor(const std::string& name) {
    for (auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  void erase(const std::string& name) {
    std::erase_if(tensors, [&](const StTensor& t) { return t.name == name; });
  }
};

// 2 layers, hidden 8, 2 heads of dim hd, 1 KV head, FFN 16, vocab 32.
TinyModel tiny(const std::string& arch, int64_t hd = 4) {
  TinyModel m;
  m.config = {{"architectures", {arch}},
              {"hidden_size", 8},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 2},
              {"num_key_value_heads", 1},
              {"intermediate_size", 16},
              {"vocab_size", 32},
              {"max_position_embeddings", 256},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", 500000.0},
              {"hidden_act", "silu"},
              {"tie_word_embeddings", false},
              {"torch_dtype", "bfloat16"}};
  const int64_t q = 2 * hd, kv = 1 * hd;
  float seed = 0;
  auto add = [&](const std::string& n, std::vector<int64_t> s) {
    m.tensors.push_back(f32(n, s, seed));
    seed += 1000;
  };
  add("model.embed_tokens.weight", {32, 8});
  add("model.norm.weight", {8});
  add("lm_head.weight", {32, 8});
  for (int i = 0; i < 2; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {8});
    add(p + "self_attn.q_proj.weight", {q, 8});
    add(p + "self_attn.k_proj.weight", {kv, 8});
    add(p + "self_attn.v_proj.weight", {kv, 8});
    m.tensors.push_back(half(p + "self_attn.o_proj.weight", "BF16", {8, q}));
    if (arch == "Qwen2ForCausalLM") {
      add(p + "self_attn.q_proj.bias", {q});
      add(p + "self_attn.k_proj.bias", {kv});
      add(p + "self_attn.v_proj.bias", {kv});
    }
    if (arch == "Qwen3ForCausalLM") {
      add(p + "self_attn.q_norm.weight", {hd});
      add(p + "self_attn.k_norm.weight", {hd});
    }
    add(p + "post_attention_layernorm.weight", {8});
    add(p + "mlp.gate_proj.weight", {16, 8});
    m.tensors.push_back(half(p + "mlp.up_proj.weight", "F16", {16, 8}));
    add(p + "mlp.down_proj.weight", {8, 16});
  }
  add("model.layers.0.self_attn.rotary_emb.inv_freq", {hd / 2});  // ignored
  return m;
}

// A fresh directory under /tmp, removed at scope exit.
class TempDir {
 public:
  explicit TempDir(const std::string& name) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("dhs_hf_" + std::to_string(::getpid()) + "_" + info->name()) / name;
    fs::remove_all(path_.parent_path());
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_.parent_path()); }
  const fs::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

// Writes config.json and the tensors, as one model.safetensors or as n_shards
// shards with model.safetensors.index.json.
void write_model(const fs::path& dir, const TinyModel& m, int n_shards = 1) {
  write_file(dir / "config.json", m.config.dump(2));
  if (n_shards == 1) {
    write_file(dir / "model.safetensors", st_build(m.tensors));
    return;
  }
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
  size_t per = (m.tensors.size() + n_shards - 1) / n_shards;
  for (int s = 0; s < n_shards; ++s) {
    char file[64];
    std::snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
    std::vector<StTensor> part;
    for (size_t i = s * per; i < std::min(m.tensors.size(), (s + 1) * per); ++i) {
      part.push_back(m.tensors[i]);
      index["weight_map"][m.tensors[i].name] = file;
    }
    write_file(dir / file, st_build(part));
  }
  write_file(dir / "model.safetensors.index.json", index.dump(2));
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no dhs::Error thrown; expected one mentioning '" << parts.front() << "'";
  } catch (const dhs::Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg;
  }
}

float f32_at(const dhs::RawTensor* t, size_t i) {
  float v;
  std::memcpy(&v, t->data + 4 * i, 4);  // data need not be 4-byte aligned
  return v;
}

// Checks the tiny Llama as loaded, however it was stored.
void check_tiny_llama(const HfDirSource& src) {
  const ModelConfig& c = src.config();
  EXPECT_EQ(c.arch, dhs::Arch::Llama);
  EXPECT_EQ(c.name, "tiny-llama");
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.hidden, 8);
  EXPECT_EQ(c.n_heads_q, 2);
  EXPECT_EQ(c.n_heads_kv, 1);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.ffn_hidden, 16);
  EXPECT_EQ(c.vocab_size, 32);
  EXPECT_EQ(c.max_context, 256);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 500000.0f);
  EXPECT_EQ(c.rope_style, dhs::RopeStyle::Half);
  EXPECT_EQ(c.rope_scaling.kind, dhs::RopeScaling::Kind::None);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(src.format(), "safetensors");

  // 3 global + 2 layers x 9; inv_freq is not among them.
  auto names = src.tensor_names();
  EXPECT_EQ(names.size(), 21u);
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_EQ(src.find("blk.0.rotary_emb.inv_freq"), nullptr);

  const auto* embd = src.find("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->name, "token_embd.weight");
  EXPECT_EQ(embd->dtype, dhs::DType::F32);
  EXPECT_EQ(embd->shape, (std::vector<int64_t>{32, 8}));
  EXPECT_EQ(embd->n_bytes, 32u * 8 * 4);
  EXPECT_EQ(f32_at(embd, 0), 0.0f);
  EXPECT_EQ(f32_at(embd, 255), 255.0f);

  const auto* out = src.find("output.weight");
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(f32_at(out, 7), 2007.0f);  // third F32 tensor written

  const auto* k1 = src.find("blk.1.attn_k.weight");
  ASSERT_NE(k1, nullptr);
  EXPECT_EQ(k1->shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(f32_at(k1, 31), 31.0f + f32_at(k1, 0));

  const auto* o0 = src.find("blk.0.attn_output.weight");
  ASSERT_NE(o0, nullptr);
  EXPECT_EQ(o0->dtype, dhs::DType::BF16);
  EXPECT_EQ(o0->shape, (std::vector<int64_t>{8, 8}));
  const auto* up1 = src.find("blk.1.ffn_up.weight");
  ASSERT_NE(up1, nullptr);
  EXPECT_EQ(up1->dtype, dhs::DType::F16);
  EXPECT_EQ(up1->shape, (std::vector<int64_t>{16, 8}));
  const auto* down1 = src.find("blk.1.ffn_down.weight");
  ASSERT_NE(down1, nullptr);
  EXPECT_EQ(down1->shape, (std::vector<int64_t>{8, 16}));
  for (const char* n : {"output_norm.weight", "blk.0.attn_norm.weight", "blk.1.ffn_norm.weight",
                        "blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.1.ffn_gate.weight"})
    EXPECT_NE(src.find(n), nullptr) << n;
  EXPECT_EQ(src.find("blk.0.attn_q.bias"), nullptr);
  EXPECT_EQ(src.find("blk.2.attn_q.weight"), nullptr);
}

// --- names ---

TEST(HfNames, CanonicalMapping) {
  EXPECT_EQ(dhs::hf_canonical_name("model.embed_tokens.weight"), "token_embd.weight");
  EXPECT_EQ(dhs::hf_canonical_name("model.norm.weight"), "output_norm.weight");
  EXPECT_EQ(dhs::hf_canonical_name("lm_head.weight"), "output.weight");
  EXPECT_EQ(dhs::hf_canonical_name("model.layers.0.input_layernorm.weight"), "blk.0.attn_norm.weight");
  EXPECT_EQ(dhs::hf_canonical_name("model.layers.17.self_attn.o_proj.weight"),
            "blk.17.attn_output.weight");
  EXPECT_EQ(dhs::hf_canonical_name("model.layers.3.self_attn.v_proj.bias"), "blk.3.attn_v.bias");
  EXPECT_EQ(dhs::hf_canonical_name("model.layers.3.self_attn.k_norm.weight"),
            "blk.3.attn_k_norm.weight");
  EXPECT_EQ(dhs::hf_canonical_name("model.layers.9.post_attention_layernorm.weight"),
            "blk.9.ffn_norm.weight");
  EXPECT_EQ(dhs::hf_canonical_name("model.layers.9.mlp.down_proj.weight"), "blk.9.ffn_down.weight");
  EXPECT_FALSE(dhs::hf_canonical_name("model.layers.0.self_attn.rotary_emb.inv_freq"));
  EXPECT_FALSE(dhs::hf_canonical_name("model.layers.x.mlp.up_proj.weight"));
  EXPECT_FALSE(dhs::hf_canonical_name("model.layers.-1.mlp.up_proj.weight"));
  EXPECT_FALSE(dhs::hf_canonical_name("model.layers.01.mlp.up_proj.weight"));
  EXPECT_FALSE(dhs::hf_canonical_name("model.layers.99999999999.mlp.up_proj.weight"));
  EXPECT_FALSE(dhs::hf_canonical_name("model.layers..mlp.up_proj.weight"));
  EXPECT_FALSE(dhs::hf_canonical_name("model.layers.0"));
}

// --- valid directories ---

TEST(HfDirSource, LlamaSingleFile) {
  TempDir d("tiny-llama");
  write_model(d.path(), tiny("LlamaForCausalLM"));
  write_file(d.path() / "tokenizer.json", "{}");
  auto src = HfDirSource::open(d.str());
  check_tiny_llama(*src);
  EXPECT_EQ(src->tokenizer_json_path(), (d.path() / "tokenizer.json").string());
  EXPECT_EQ(src->tokenizer_config_path(), "");
  // A trailing slash does not change the name.
  EXPECT_EQ(HfDirSource::open(d.str() + "/")->config().name, "tiny-llama");
}

TEST(HfDirSource, LlamaTwoShards) {
  TempDir d("tiny-llama");
  write_model(d.path(), tiny("LlamaForCausalLM"), 2);
  write_file(d.path() / "tokenizer.json", "{}");
  write_file(d.path() / "tokenizer_config.json", "{}");
  ASSERT_TRUE(fs::exists(d.path() / "model-00002-of-00002.safetensors"));
  ASSERT_FALSE(fs::exists(d.path() / "model.safetensors"));
  auto src = HfDirSource::open(d.str());
  check_tiny_llama(*src);
  EXPECT_EQ(src->tokenizer_config_path(), (d.path() / "tokenizer_config.json").string());
}

TEST(HfDirSource, MistralIsLlamaWithWindowCappedContext) {
  TempDir d("tiny-mistral");
  TinyModel m = tiny("MistralForCausalLM");
  m.config["sliding_window"] = 128;
  write_model(d.path(), m);
  auto src = HfDirSource::open(d.str());
  EXPECT_EQ(src->config().arch, dhs::Arch::Llama);
  EXPECT_EQ(src->config().max_context, 128);
  m.config["sliding_window"] = nullptr;
  write_model(d.path(), m);
  EXPECT_EQ(HfDirSource::open(d.str())->config().max_context, 256);
}

TEST(HfDirSource, Qwen2WithBiases) {
  TempDir d("tiny-qwen2");
  TinyModel m = tiny("Qwen2ForCausalLM");
  m.config["sliding_window"] = 64;  // ignored: use_sliding_window is false
  m.config["use_sliding_window"] = false;
  write_model(d.path(), m);
  auto src = HfDirSource::open(d.str());
  const auto& c = src->config();
  EXPECT_EQ(c.arch, dhs::Arch::Qwen2);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.max_context, 256);
  EXPECT_EQ(src->tensor_names().size(), 27u);
  const auto* qb = src->find("blk.1.attn_q.bias");
  ASSERT_NE(qb, nullptr);
  EXPECT_EQ(qb->shape, (std::vector<int64_t>{8}));
  const auto* kb = src->find("blk.0.attn_k.bias");
  ASSERT_NE(kb, nullptr);
  EXPECT_EQ(kb->shape, (std::vector<int64_t>{4}));
  EXPECT_NE(src->find("blk.0.attn_v.bias"), nullptr);

  // A Qwen2 checkpoint without its biases is incomplete.
  m.erase("model.layers.1.self_attn.v_proj.bias");
  write_model(d.path(), m);
  expect_error([&] { HfDirSource::open(d.str()); }, {"blk.1.attn_v.bias", "missing"});
}

TEST(HfDirSource, Qwen3WithQkNormAndExplicitHeadDim) {
  TempDir d("tiny-qwen3");
  TinyModel m = tiny("Qwen3ForCausalLM", /*hd=*/8);  // head_dim 8 != hidden / heads = 4
  m.config["head_dim"] = 8;
  m.config["attention_bias"] = false;
  write_model(d.path(), m, 2);
  auto src = HfDirSource::open(d.str());
  const auto& c = src->config();
  EXPECT_EQ(c.arch, dhs::Arch::Qwen3);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.head_dim, 8);
  const auto* q = src->find("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->shape, (std::vector<int64_t>{16, 8}));
  const auto* o = src->find("blk.1.attn_output.weight");
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(o->shape, (std::vector<int64_t>{8, 16}));
  const auto* kn = src->find("blk.1.attn_k_norm.weight");
  ASSERT_NE(kn, nullptr);
  EXPECT_EQ(kn->shape, (std::vector<int64_t>{8}));
  EXPECT_NE(src->find("blk.0.attn_q_norm.weight"), nullptr);
}

TEST(HfDirSource, TiedEmbeddings) {
  TempDir d("tiny-tied");
  TinyModel m = tiny("Qwen2ForCausalLM");
  m.config["tie_word_embeddings"] = true;
  m.erase("lm_head.weight");
  write_model(d.path(), m);
  auto src = HfDirSource::open(d.str());
  EXPECT_TRUE(src->config().tied_embeddings);
  EXPECT_EQ(src->find("output.weight"), nullptr);
  EXPECT_NE(src->find("token_embd.weight"), nullptr);

  // Tied and lm_head stored anyway: transformers ties, so the copy is dropped.
  TinyModel m2 = tiny("LlamaForCausalLM");
  m2.config["tie_word_embeddings"] = true;
  write_model(d.path(), m2);
  src = HfDirSource::open(d.str());
  EXPECT_TRUE(src->config().tied_embeddings);
  EXPECT_EQ(src->find("output.weight"), nullptr);
}

// --- config.json parsing ---

json base_config(const std::string& arch = "LlamaForCausalLM") { return tiny(arch).config; }

ModelConfig parse(const json& j) { return dhs::parse_hf_config(j.dump(), "m"); }

TEST(HfConfig, Defaults) {
  json j = base_config();
  for (const char* k : {"num_key_value_heads", "rope_theta", "rms_norm_eps",
                        "tie_word_embeddings", "max_position_embeddings", "hidden_act"})
    j.erase(k);
  ModelConfig c = parse(j);
  EXPECT_EQ(c.n_heads_kv, 2);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-6f);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_EQ(c.max_context, 2048);
  EXPECT_EQ(c.name, "m");
  j["head_dim"] = nullptr;  // explicit null = default
  EXPECT_EQ(parse(j).head_dim, 4);
  j.erase("architectures");
  j["model_type"] = "qwen3";  // older configs without "architectures"
  EXPECT_EQ(parse(j).arch, dhs::Arch::Qwen3);
}

TEST(HfConfig, RopeScalingLlama3) {
  json j = base_config();
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  ModelConfig c = parse(j);
  EXPECT_EQ(c.rope_scaling.kind, dhs::RopeScaling::Kind::Llama3);
  EXPECT_FLOAT_EQ(c.rope_scaling.factor, 8.0f);
  EXPECT_FLOAT_EQ(c.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_FLOAT_EQ(c.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(c.rope_scaling.original_max_position, 8192);

  j["rope_scaling"]["factor"] = 32.0;
  j["rope_scaling"]["original_max_position_embeddings"] = 4096;
  j["rope_scaling"]["high_freq_factor"] = 2.0;
  c = parse(j);
  EXPECT_FLOAT_EQ(c.rope_scaling.factor, 32.0f);
  EXPECT_FLOAT_EQ(c.rope_scaling.high_freq_factor, 2.0f);
  EXPECT_EQ(c.rope_scaling.original_max_position, 4096);

  j["rope_scaling"].erase("factor");
  expect_error([&] { parse(j); }, {"factor"});
}

TEST(HfConfig, RopeScalingOtherForms) {
  json j = base_config();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};  // older key name
  ModelConfig c = parse(j);
  EXPECT_EQ(c.rope_scaling.kind, dhs::RopeScaling::Kind::Linear);
  EXPECT_FLOAT_EQ(c.rope_scaling.factor, 2.0f);

  j["rope_scaling"] = nullptr;
  EXPECT_EQ(parse(j).rope_scaling.kind, dhs::RopeScaling::Kind::None);

  // transformers 5 folds rope_theta and the scaling into rope_parameters.
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  c = parse(j);
  EXPECT_EQ(c.rope_scaling.kind, dhs::RopeScaling::Kind::None);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);

  j.erase("rope_parameters");
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  expect_error([&] { parse(j); }, {"unsupported rope_scaling type yarn"});
  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 4.0}};
  expect_error([&] { parse(j); }, {"unsupported rope_scaling type dynamic"});
}

TEST(HfConfig, RejectsBadValues) {
  json j = base_config();
  j["architectures"] = {"GPT2LMHeadModel"};
  expect_error([&] { parse(j); },
               {"unsupported architecture 'GPT2LMHeadModel'", "LlamaForCausalLM",
                "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"});
  j = base_config();
  j.erase("hidden_size");
  expect_error([&] { parse(j); }, {"missing required key \"hidden_size\""});
  j = base_config();
  j["num_key_value_heads"] = 3;
  expect_error([&] { parse(j); }, {"not a multiple of num_key_value_heads 3"});
  j = base_config();
  j["vocab_size"] = -5;
  expect_error([&] { parse(j); }, {"\"vocab_size\" = -5 is out of range"});
  j = base_config();
  j["intermediate_size"] = "16";
  expect_error([&] { parse(j); }, {"\"intermediate_size\" must be an integer"});
  j = base_config();
  j["hidden_act"] = "gelu";
  expect_error([&] { parse(j); }, {"unsupported hidden_act"});
  j = base_config();
  j["attention_bias"] = true;
  expect_error([&] { parse(j); }, {"attention_bias"});
  expect_error([] { dhs::parse_hf_config("{\"hidden_size\": ", "m"); }, {"config.json", "not valid JSON"});
}

// --- malformed directories ---

TEST(HfDirMalformed, MissingConfig) {
  TempDir d("m");
  write_file(d.path() / "model.safetensors", st_build(tiny("LlamaForCausalLM").tensors));
  expect_error([&] { HfDirSource::open(d.str()); }, {d.str(), "no config.json"});
  expect_error([&] { HfDirSource::open(d.str() + "/nope"); }, {"not a directory"});
}

TEST(HfDirMalformed, BadConfigJson) {
  TempDir d("m");
  write_model(d.path(), tiny("LlamaForCausalLM"));
  write_file(d.path() / "config.json", "{\"architectures\": [");
  expect_error([&] { HfDirSource::open(d.str()); }, {"config.json", "not valid JSON"});
}

TEST(HfDirMalformed, UnknownArchitecture) {
  TempDir d("m");
  TinyModel m = tiny("LlamaForCausalLM");
  m.config["architectures"] = {"MixtralForCausalLM"};
  write_model(d.path(), m);
  expect_error([&] { HfDirSource::open(d.str()); },
               {"config.json", "unsupported architecture 'MixtralForCausalLM'", "Qwen3ForCausalLM"});
}

TEST(HfDirMalformed, NoWeights) {
  TempDir d("m");
  write_file(d.path() / "config.json", base_config().dump());
  expect_error([&] { HfDirSource::open(d.str()); },
               {"neither model.safetensors nor model.safetensors.index.json"});
}

TEST(HfDirMalformed, MissingShard) {
  TempDir d("m");
  write_model(d.path(), tiny("LlamaForCausalLM"), 2);
  fs::remove(d.path() / "model-00002-of-00002.safetensors");
  expect_error([&] { HfDirSource::open(d.str()); },
               {"model.safetensors.index.json", "shard 'model-00002-of-00002.safetensors'", "missing"});
}

TEST(HfDirMalformed, TensorNotWhereIndexSays) {
  TempDir d("m");
  write_model(d.path(), tiny("LlamaForCausalLM"), 2);
  auto index_path = d.path() / "model.safetensors.index.json";
  json index = json::parse(std::ifstream(index_path));
  index["weight_map"]["model.embed_tokens.weight"] = "model-00002-of-00002.safetensors";
  write_file(index_path, index.dump());
  expect_error([&] { HfDirSource::open(d.str()); },
               {"'model.embed_tokens.weight' is in 'model-00002-of-00002.safetensors'",
                "lacks it"});
}

TEST(HfDirMalformed, IndexShardOutsideDirectory) {
  TempDir d("m");
  write_model(d.path(), tiny("LlamaForCausalLM"), 2);
  auto index_path = d.path() / "model.safetensors.index.json";
  json index = json::parse(std::ifstream(index_path));
  index["weight_map"]["model.norm.weight"] = "../model-00001-of-00002.safetensors";
  write_file(index_path, index.dump());
  expect_error([&] { HfDirSource::open(d.str()); }, {"not a plain file name", "model.norm.weight"});
  index.erase("weight_map");
  write_file(index_path, index.dump());
  expect_error([&] { HfDirSource::open(d.str()); }, {"weight_map"});
}

TEST(HfDirMalformed, CorruptShardNamesFile) {
  TempDir d("m");
  write_model(d.path(), tiny("LlamaForCausalLM"), 2);
  write_file(d.path() / "model-00001-of-00002.safetensors", std::string("\x10\0\0\0\0\0\0\0{", 9));
  expect_error([&] { HfDirSource::open(d.str()); },
               {"model-00001-of-00002.safetensors", "past the end"});
}

TEST(HfDirMalformed, MissingRequiredTensor) {
  TempDir d("m");
  TinyModel m = tiny("LlamaForCausalLM");
  m.erase("model.layers.1.mlp.gate_proj.weight");
  write_model(d.path(), m);
  expect_error([&] { HfDirSource::open(d.str()); },
               {"required tensor 'model.layers.1.mlp.gate_proj.weight' ('blk.1.ffn_gate.weight') "
                "is missing"});
}

TEST(HfDirMalformed, MissingLmHeadWithoutTying) {
  TempDir d("m");
  TinyModel m = tiny("LlamaForCausalLM");
  m.erase("lm_head.weight");
  write_model(d.path(), m);
  expect_error([&] { HfDirSource::open(d.str()); }, {"'lm_head.weight' ('output.weight') is missing"});
}

TEST(HfDirMalformed, WrongShape) {
  TempDir d("m");
  TinyModel m = tiny("LlamaForCausalLM");
  *m.tensor("model.layers.0.self_attn.k_proj.weight") = f32("model.layers.0.self_attn.k_proj.weight", {8, 8}, 0);
  write_model(d.path(), m);
  expect_error([&] { HfDirSource::open(d.str()); },
               {"model.layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight", "has shape [8,8]",
                "implies [4,8]"});
}

TEST(HfDirMalformed, IntegerWeights) {
  TempDir d("m");
  TinyModel m = tiny("LlamaForCausalLM");
  m.tensor("model.norm.weight")->dtype = "I32";
  write_model(d.path(), m);
  expect_error([&] { HfDirSource::open(d.str()); }, {"model.norm.weight", "dtype I32", "F32, F16 or BF16"});
}

TEST(HfDirMalformed, UnexpectedTensors) {
  TempDir d("m");
  TinyModel m = tiny("LlamaForCausalLM");
  m.tensors.push_back(f32("model.layers.0.self_attn.q_proj.bias", {8}, 0));
  write_model(d.path(), m);
  expect_error([&] { HfDirSource::open(d.str()); }, {"blk.0.attn_q.bias", "not used by arch llama"});

  TinyModel m2 = tiny("LlamaForCausalLM");
  m2.config["num_hidden_layers"] = 1;  // the checkpoint has 2
  write_model(d.path(), m2);
  expect_error([&] { HfDirSource::open(d.str()); }, {"blk.1.", "not used"});
}

}  // namespace
