#include "model/hf_source.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dhs {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr std::string_view kSupportedArchs =
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM";

// Config dims above this are corrupt; the bound also keeps products of two dims
// (n_heads * head_dim, vocab * hidden) inside int64.
constexpr int64_t kMaxDim = int64_t{1} << 31;

enum class HfFamily { Llama, Mistral, Qwen2, Qwen3 };

// For error messages. (Local so that this file does not depend on model_config.cpp.)
std::string_view arch_label(Arch a) {
  switch (a) {
    case Arch::Llama: return "llama";
    case Arch::Qwen2: return "qwen2";
    case Arch::Qwen3: return "qwen3";
  }
  return "?";
}

std::optional<HfFamily> family_from_arch(std::string_view a) {
  if (a == "LlamaForCausalLM") return HfFamily::Llama;
  if (a == "MistralForCausalLM") return HfFamily::Mistral;
  if (a == "Qwen2ForCausalLM") return HfFamily::Qwen2;
  if (a == "Qwen3ForCausalLM") return HfFamily::Qwen3;
  return std::nullopt;
}

std::optional<HfFamily> family_from_model_type(std::string_view t) {
  if (t == "llama") return HfFamily::Llama;
  if (t == "mistral") return HfFamily::Mistral;
  if (t == "qwen2") return HfFamily::Qwen2;
  if (t == "qwen3") return HfFamily::Qwen3;
  return std::nullopt;
}

// Typed access to config.json keys; absent and null both mean "use the default".
class ConfigReader {
 public:
  ConfigReader(const json& j, std::string_view where) : j_(j), where_(where) {}

  const json* find(std::string_view key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }

  int64_t dim(std::string_view key, std::optional<int64_t> def = std::nullopt) const {
    const json* v = find(key);
    if (v == nullptr) {
      DHS_CHECK(def.has_value(), "{}: missing required key \"{}\"", where_, key);
      return *def;
    }
    DHS_CHECK(v->is_number_integer(), "{}: \"{}\" must be an integer, got {}", where_, key,
              v->dump());
    int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)
                    ? INT64_MAX
                    : v->get<int64_t>();
    DHS_CHECK(x > 0 && x <= kMaxDim, "{}: \"{}\" = {} is out of range (1 .. {})", where_, key,
              x, kMaxDim);
    return x;
  }

  double number(std::string_view key, std::optional<double> def = std::nullopt) const {
    const json* v = find(key);
    if (v == nullptr) {
      DHS_CHECK(def.has_value(), "{}: missing required key \"{}\"", where_, key);
      return *def;
    }
    DHS_CHECK(v->is_number(), "{}: \"{}\" must be a number, got {}", where_, key, v->dump());
    return v->get<double>();
  }

  bool flag(std::string_view key, bool def) const {
    const json* v = find(key);
    if (v == nullptr) return def;
    DHS_CHECK(v->is_boolean(), "{}: \"{}\" must be true or false, got {}", where_, key,
              v->dump());
    return v->get<bool>();
  }

  std::string_view where() const { return where_; }

 private:
  const json& j_;
  std::string_view where_;
};

// rope_scaling (or transformers v5's rope_parameters, which holds the same keys).
RopeScaling parse_rope_scaling(const json& rs, std::string_view where) {
  DHS_CHECK(rs.is_object(), "{}: rope_scaling must be an object or null, got {}", where,
            rs.dump());
  ConfigReader r(rs, where);
  const json* type = r.find("rope_type");
  if (type == nullptr) type = r.find("type");
  DHS_CHECK(type != nullptr && type->is_string(),
            "{}: rope_scaling has no \"rope_type\"/\"type\" string", where);
  const std::string& kind = type->get_ref<const std::string&>();

  RopeScaling s;
  auto positive = [&](std::string_view key) {
    double v = r.number(key);
    DHS_CHECK(v > 0.0, "{}: rope_scaling \"{}\" must be positive, got {}", where, key, v);
    return static_cast<float>(v);
  };
  if (kind == "default") {
    s.kind = RopeScaling::Kind::None;
  } else if (kind == "linear") {
    s.kind = RopeScaling::Kind::Linear;
    s.factor = positive("factor");
  } else if (kind == "llama3") {
    s.kind = RopeScaling::Kind::Llama3;
    s.factor = positive("factor");
    s.low_freq_factor = positive("low_freq_factor");
    s.high_freq_factor = positive("high_freq_factor");
    s.original_max_position = r.dim("original_max_position_embeddings");
    // The smoothing between the two wavelength bounds divides by (high - low).
    DHS_CHECK(s.high_freq_factor > s.low_freq_factor,
              "{}: rope_scaling high_freq_factor ({}) must exceed low_freq_factor ({})", where,
              s.high_freq_factor, s.low_freq_factor);
  } else {
    throw Error(fmt::format("{}: unsupported rope_scaling type {} (supported: linear, llama3)",
                            where, kind));
  }
  return s;
}

std::string read_text_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  DHS_CHECK(in.good(), "cannot open '{}'", p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  DHS_CHECK(!in.bad(), "cannot read '{}'", p.string());
  return ss.str();
}

json parse_json_file(const fs::path& p) {
  std::string text = read_text_file(p);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(fmt::format("'{}' is not valid JSON: {}", p.string(), e.what()));
  }
}

std::string shape_str(const std::vector<int64_t>& s) { return json(s).dump(); }

// A tensor found in the directory, before the config check.
struct Found {
  RawTensor raw;
  safetensors::ElemType type;
  std::string hf_name;
  std::string file;
};

}  // namespace

ModelConfig parse_hf_config(std::string_view text, std::string name, std::string_view where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(fmt::format("{} is not valid JSON: {}", where, e.what()));
  }
  DHS_CHECK(j.is_object(), "{}: not a JSON object", where);
  ConfigReader r(j, where);

  // Architecture: the first supported entry of "architectures", else "model_type".
  std::optional<HfFamily> family;
  std::string declared;
  if (const json* archs = r.find("architectures")) {
    DHS_CHECK(archs->is_array(), "{}: \"architectures\" must be a list", where);
    for (const auto& a : *archs) {
      DHS_CHECK(a.is_string(), "{}: \"architectures\" entries must be strings", where);
      if (!declared.empty()) declared += ", ";
      declared += a.get<std::string>();
      if (!family) family = family_from_arch(a.get_ref<const std::string&>());
    }
  } else if (const json* mt = r.find("model_type"); mt != nullptr && mt->is_string()) {
    declared = "model_type " + mt->get<std::string>();
    family = family_from_model_type(mt->get_ref<const std::string&>());
  }
  DHS_CHECK(family.has_value(), "{}: unsupported architecture '{}' (supported: {})", where,
            declared.empty() ? "<none declared>" : declared, kSupportedArchs);

  ModelConfig c;
  c.name = std::move(name);
  c.arch = *family == HfFamily::Qwen2 ? Arch::Qwen2
           : *family == HfFamily::Qwen3 ? Arch::Qwen3
                                        : Arch::Llama;
  c.hidden = r.dim("hidden_size");
  c.n_layers = r.dim("num_hidden_layers");
  c.n_heads_q = r.dim("num_attention_heads");
  c.n_heads_kv = r.dim("num_key_value_heads", c.n_heads_q);
  if (r.find("head_dim") == nullptr)
    DHS_CHECK(c.hidden % c.n_heads_q == 0,
              "{}: hidden_size {} is not divisible by num_attention_heads {} (and no head_dim)",
              where, c.hidden, c.n_heads_q);
  c.head_dim = r.dim("head_dim", c.hidden / c.n_heads_q);
  c.ffn_hidden = r.dim("intermediate_size");
  c.vocab_size = r.dim("vocab_size");
  // Defaults are those of the transformers config classes.
  const int64_t default_ctx = *family == HfFamily::Llama     ? 2048
                              : *family == HfFamily::Mistral ? 4096 * 32
                                                             : 32768;
  c.max_context = r.dim("max_position_embeddings", default_ctx);
  c.rms_eps = static_cast<float>(r.number("rms_norm_eps", 1e-6));
  c.rope_style = RopeStyle::Half;  // HF checkpoints rotate (x[i], x[i + d/2])
  c.tied_embeddings = r.flag("tie_word_embeddings", false);  // false in all four classes
  c.qkv_bias = *family == HfFamily::Qwen2;  // Qwen2 hard-codes q/k/v biases, no o_proj bias
  c.qk_norm = *family == HfFamily::Qwen3;

  DHS_CHECK(c.n_heads_q % c.n_heads_kv == 0,
            "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", where,
            c.n_heads_q, c.n_heads_kv);
  DHS_CHECK(c.head_dim % 2 == 0, "{}: head_dim {} must be even for RoPE", where, c.head_dim);
  DHS_CHECK(c.rms_eps > 0.0f, "{}: rms_norm_eps must be positive", where);

  // Features the engine does not implement: refuse rather than run a different model.
  if (const json* act = r.find("hidden_act"))
    DHS_CHECK(act->is_string() && act->get<std::string>() == "silu",
              "{}: unsupported hidden_act {} (only silu)", where, act->dump());
  DHS_CHECK(*family == HfFamily::Qwen2 || !r.flag("attention_bias", false),
            "{}: attention_bias = true (bias on o_proj) is not supported", where);
  DHS_CHECK(!r.flag("mlp_bias", false), "{}: mlp_bias = true is not supported", where);

  // Sliding-window attention: within a context no longer than the window it equals
  // full attention, so cap the usable context at the window instead of refusing.
  bool windowed = *family == HfFamily::Mistral ||
                  ((*family == HfFamily::Qwen2 || *family == HfFamily::Qwen3) &&
                   r.flag("use_sliding_window", false));
  if (windowed && r.find("sliding_window") != nullptr)
    c.max_context = std::min(c.max_context, r.dim("sliding_window"));

  // RoPE: rope_theta/rope_scaling (transformers 4.x) or rope_parameters (5.x).
  c.rope_theta = static_cast<float>(r.number("rope_theta", 10000.0));
  if (const json* rp = r.find("rope_parameters")) {
    DHS_CHECK(rp->is_object(), "{}: rope_parameters must be an object", where);
    c.rope_theta = static_cast<float>(ConfigReader(*rp, where).number("rope_theta", c.rope_theta));
    c.rope_scaling = parse_rope_scaling(*rp, where);
  } else if (const json* rs = r.find("rope_scaling")) {
    c.rope_scaling = parse_rope_scaling(*rs, where);
  }
  DHS_CHECK(c.rope_theta > 0.0f, "{}: rope_theta must be positive", where);
  return c;
}

std::optional<std::string> hf_canonical_name(std::string_view n) {
  if (n == "model.embed_tokens.weight") return "token_embd.weight";
  if (n == "model.norm.weight") return "output_norm.weight";
  if (n == "lm_head.weight") return "output.weight";

  constexpr std::string_view kLayers = "model.layers.";
  if (!n.starts_with(kLayers)) return std::nullopt;
  n.remove_prefix(kLayers.size());
  size_t dot = n.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot > 9) return std::nullopt;
  std::string_view digits = n.substr(0, dot);
  // Plain decimal only (from_chars would take a sign); no leading zeros, so that a
  // layer has exactly one spelling.
  if (!std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
    return std::nullopt;
  if (digits.size() > 1 && digits[0] == '0') return std::nullopt;
  int64_t layer = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), layer);
  if (ec != std::errc() || ptr != digits.data() + digits.size()) return std::nullopt;
  std::string_view rest = n.substr(dot + 1);

  static constexpr std::pair<std::string_view, std::string_view> kLayerNames[] = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.bias", "attn_output.bias"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      // Mapped so that a checkpoint carrying them is refused (no model uses them).
      {"mlp.gate_proj.bias", "ffn_gate.bias"},
      {"mlp.up_proj.bias", "ffn_up.bias"},
      {"mlp.down_proj.bias", "ffn_down.bias"},
  };
  for (const auto& [hf, canonical] : kLayerNames)
    if (rest == hf) return fmt::format("blk.{}.{}", layer, canonical);
  return std::nullopt;
}

std::unique_ptr<HfDirSource> HfDirSource::open(const std::string& dir_arg) {
  const fs::path dir = fs::path(dir_arg);
  std::error_code ec;
  DHS_CHECK(fs::is_directory(dir, ec), "'{}' is not a directory", dir_arg);

  auto src = std::unique_ptr<HfDirSource>(new HfDirSource());
  src->dir_ = dir_arg;

  const fs::path config_path = dir / "config.json";
  DHS_CHECK(fs::is_regular_file(config_path, ec),
            "'{}' has no config.json (not a Hugging Face model directory?)", dir_arg);
  // config.name: the directory's own name, also for "." or a trailing slash.
  fs::path norm = fs::absolute(dir, ec).lexically_normal();
  if (!norm.has_filename()) norm = norm.parent_path();
  std::string name = norm.filename().string();
  src->config_ = parse_hf_config(read_text_file(config_path), name, config_path.string());
  const ModelConfig& c = src->config_;

  // Collect the tensors the engine knows, by canonical name.
  std::map<std::string, Found, std::less<>> found;
  auto add = [&](const safetensors::TensorInfo& t, const std::string& file) {
    auto canonical = hf_canonical_name(t.name);
    if (!canonical) return;  // rotary inv_freq and other tensors the engine does not use
    Found f;
    f.raw.name = *canonical;
    f.raw.shape = t.shape;
    f.raw.data = t.data;
    f.raw.n_bytes = static_cast<size_t>(t.n_bytes());
    f.type = t.type;
    f.hf_name = t.name;
    f.file = file;
    found.emplace(*canonical, std::move(f));
  };

  const fs::path single = dir / "model.safetensors";
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (fs::exists(single, ec)) {
    src->shards_.push_back(safetensors::SafetensorsFile::open(single.string()));
    for (const auto& t : src->shards_.back().tensors()) add(t, single.string());
  } else if (fs::exists(index_path, ec)) {
    const json index = parse_json_file(index_path);
    const std::string where = index_path.string();
    DHS_CHECK(index.is_object(), "'{}': not a JSON object", where);
    auto wm = index.find("weight_map");
    DHS_CHECK(wm != index.end() && wm->is_object(), "'{}': missing \"weight_map\" object",
              where);
    // shard file -> tensor names the index places in it
    std::map<std::string, std::vector<std::string>> by_shard;
    for (const auto& [tensor, shard] : wm->items()) {
      DHS_CHECK(shard.is_string(), "'{}': shard of tensor '{}' is not a string", where, tensor);
      const std::string& file = shard.get_ref<const std::string&>();
      // Shards live next to the index; a path would let the index point anywhere.
      DHS_CHECK(!file.empty() && file != "." && file != ".." &&
                    file.find('/') == std::string::npos && file.find('\\') == std::string::npos,
                "'{}': shard name '{}' of tensor '{}' is not a plain file name", where, file,
                tensor);
      by_shard[file].push_back(tensor);
    }
    DHS_CHECK(!by_shard.empty(), "'{}': \"weight_map\" is empty", where);
    for (const auto& [file, names] : by_shard) {
      const fs::path shard_path = dir / file;
      DHS_CHECK(fs::is_regular_file(shard_path, ec),
                "'{}': shard '{}' (holding e.g. '{}') is missing from the directory", where,
                file, names.front());
      src->shards_.push_back(safetensors::SafetensorsFile::open(shard_path.string()));
      const auto& shard = src->shards_.back();
      for (const auto& tensor_name : names) {
        const safetensors::TensorInfo* t = shard.find(tensor_name);
        DHS_CHECK(t != nullptr, "'{}' says tensor '{}' is in '{}', but that shard lacks it",
                  where, tensor_name, file);
        add(*t, shard_path.string());
      }
    }
  } else {
    throw Error(fmt::format("'{}' has neither model.safetensors nor model.safetensors.index.json",
                            dir_arg));
  }

  // transformers ties lm_head to embed_tokens when the config says so, even when
  // the checkpoint also stores a (then identical) lm_head: do the same.
  if (c.tied_embeddings) found.erase("output.weight");

  // Every tensor the config implies, present with its shape and a float dtype.
  std::set<std::string, std::less<>> used;
  auto expect = [&](const std::string& name, std::string_view hf_name,
                    std::vector<int64_t> shape) {
    auto it = found.find(name);
    DHS_CHECK(it != found.end(),
              "'{}': required tensor '{}' ('{}') is missing (arch {}, num_hidden_layers {})",
              dir_arg, hf_name, name, arch_label(c.arch), c.n_layers);
    const Found& f = it->second;
    DHS_CHECK(f.raw.shape == shape, "'{}': tensor '{}' ('{}') has shape {}, config.json implies {}",
              f.file, f.hf_name, name, shape_str(f.raw.shape), shape_str(shape));
    DHS_CHECK(safetensors::is_weight_type(f.type),
              "'{}': tensor '{}' has dtype {}; weights must be F32, F16 or BF16", f.file,
              f.hf_name, safetensors::elem_type_name(f.type));
    used.insert(name);
  };
  const int64_t q_dim = c.n_heads_q * c.head_dim;
  const int64_t kv_dim = c.n_heads_kv * c.head_dim;
  expect("token_embd.weight", "model.embed_tokens.weight", {c.vocab_size, c.hidden});
  expect("output_norm.weight", "model.norm.weight", {c.hidden});
  if (!c.tied_embeddings) expect("output.weight", "lm_head.weight", {c.vocab_size, c.hidden});
  for (int64_t i = 0; i < c.n_layers; ++i) {
    // (canonical suffix, HF suffix, shape)
    auto layer = [&](std::string_view canonical, std::string_view hf, std::vector<int64_t> shape) {
      expect(fmt::format("blk.{}.{}", i, canonical), fmt::format("model.layers.{}.{}", i, hf),
             std::move(shape));
    };
    layer("attn_norm.weight", "input_layernorm.weight", {c.hidden});
    layer("attn_q.weight", "self_attn.q_proj.weight", {q_dim, c.hidden});
    layer("attn_k.weight", "self_attn.k_proj.weight", {kv_dim, c.hidden});
    layer("attn_v.weight", "self_attn.v_proj.weight", {kv_dim, c.hidden});
    layer("attn_output.weight", "self_attn.o_proj.weight", {c.hidden, q_dim});
    if (c.qkv_bias) {
      layer("attn_q.bias", "self_attn.q_proj.bias", {q_dim});
      layer("attn_k.bias", "self_attn.k_proj.bias", {kv_dim});
      layer("attn_v.bias", "self_attn.v_proj.bias", {kv_dim});
    }
    if (c.qk_norm) {
      layer("attn_q_norm.weight", "self_attn.q_norm.weight", {c.head_dim});
      layer("attn_k_norm.weight", "self_attn.k_norm.weight", {c.head_dim});
    }
    layer("ffn_norm.weight", "post_attention_layernorm.weight", {c.hidden});
    layer("ffn_gate.weight", "mlp.gate_proj.weight", {c.ffn_hidden, c.hidden});
    layer("ffn_up.weight", "mlp.up_proj.weight", {c.ffn_hidden, c.hidden});
    layer("ffn_down.weight", "mlp.down_proj.weight", {c.hidden, c.ffn_hidden});
  }
  // A known tensor the config does not call for (a bias in a Llama, a layer past
  // num_hidden_layers) means checkpoint and config disagree: the model would
  // silently drop weights, so refuse.
  for (auto& [name, f] : found) {
    DHS_CHECK(used.count(name) != 0,
              "'{}': tensor '{}' ('{}') is not used by arch {} with this config.json", f.file,
              f.hf_name, name, arch_label(c.arch));
    f.raw.dtype = *safetensors::elem_type_dtype(f.type);
    src->tensors_.emplace(name, std::move(f.raw));
  }

  const fs::path tok = dir / "tokenizer.json";
  const fs::path tok_cfg = dir / "tokenizer_config.json";
  if (fs::is_regular_file(tok, ec)) src->tokenizer_json_path_ = tok.string();
  if (fs::is_regular_file(tok_cfg, ec)) src->tokenizer_config_path_ = tok_cfg.string();
  return src;
}

const RawTensor* HfDirSource::find(const std::string& canonical_name) const {
  auto it = tensors_.find(canonical_name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> HfDirSource::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, t] : tensors_) names.push_back(name);
  return names;
}

}  // namespace dhs
