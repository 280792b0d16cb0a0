#include "model/gguf_source.h"

#include "core/error.h"
#include "model/dequant.h"

namespace dhs {

GgufSource::GgufSource(const std::string& path) : file_(gguf::GgufFile::open(path)) {
  const std::string arch = file_.get_string("general.architecture");
  if (arch == "llama") {
    cfg_.arch = Arch::Llama;
    // llama.cpp's converter permutes Q/K rows so adjacent-pair RoPE reproduces HF.
    cfg_.rope_style = RopeStyle::Interleaved;
  } else if (arch == "qwen2") {
    cfg_.arch = Arch::Qwen2;
    cfg_.rope_style = RopeStyle::Half;
  } else if (arch == "qwen3") {
    cfg_.arch = Arch::Qwen3;
    cfg_.rope_style = RopeStyle::Half;
  } else {
    throw Error(fmt::format("{}: unsupported architecture '{}' (supported: llama, qwen2, qwen3)", path, arch));
  }
  auto key = [&](const char* k) { return arch + "." + k; };
  cfg_.name = file_.get_string("general.name", std::string("unnamed"));
  cfg_.n_layers = static_cast<int64_t>(file_.get_u64(key("block_count")));
  cfg_.hidden = static_cast<int64_t>(file_.get_u64(key("embedding_length")));
  cfg_.n_heads_q = static_cast<int64_t>(file_.get_u64(key("attention.head_count")));
  cfg_.n_heads_kv = static_cast<int64_t>(file_.get_u64(key("attention.head_count_kv"), cfg_.n_heads_q));
  cfg_.ffn_hidden = static_cast<int64_t>(file_.get_u64(key("feed_forward_length")));
  cfg_.max_context = static_cast<int64_t>(file_.get_u64(key("context_length"), 2048));
  DHS_CHECK(cfg_.n_layers > 0 && cfg_.n_layers <= 1024 && cfg_.hidden > 0 && cfg_.n_heads_q > 0 &&
                cfg_.n_heads_kv > 0 && cfg_.n_heads_q % cfg_.n_heads_kv == 0,
            "{}: inconsistent shape metadata (layers {}, hidden {}, heads {}/{})", path, cfg_.n_layers,
            cfg_.hidden, cfg_.n_heads_q, cfg_.n_heads_kv);
  cfg_.head_dim = static_cast<int64_t>(file_.get_u64(key("attention.key_length"),
                                                     static_cast<uint64_t>(cfg_.hidden / cfg_.n_heads_q)));
  DHS_CHECK(cfg_.head_dim > 0 && cfg_.head_dim % 2 == 0 && cfg_.head_dim <= 512, "{}: bad head_dim {}", path,
            cfg_.head_dim);
  cfg_.rms_eps = static_cast<float>(file_.get_f64(key("attention.layer_norm_rms_epsilon"), 1e-5));
  cfg_.rope_theta = static_cast<float>(file_.get_f64(key("rope.freq_base"), 10000.0));
  // RoPE rotates rope.dimension_count dimensions of each head (absent: all of them). Llama,
  // Qwen2 and Qwen3 rotate all; fewer (partial rotary, as Phi or StableLM) the backends do not do.
  const auto rope_dims = static_cast<int64_t>(file_.get_u64(key("rope.dimension_count"), static_cast<uint64_t>(cfg_.head_dim)));
  DHS_CHECK(rope_dims >= cfg_.head_dim, "{}: partial rotary embedding (rope.dimension_count {} < head_dim {}) is not supported",
            path, rope_dims, cfg_.head_dim);
  DHS_CHECK(rope_dims == cfg_.head_dim, "{}: rope.dimension_count {} is larger than head_dim {}", path, rope_dims,
            cfg_.head_dim);
  const std::string scaling = file_.get_string(key("rope.scaling.type"), std::string("none"));
  if (scaling == "linear") {
    cfg_.rope_scaling.kind = RopeScaling::Kind::Linear;
    cfg_.rope_scaling.factor = static_cast<float>(file_.get_f64(key("rope.scaling.factor"), 1.0));
  } else if (scaling != "none") {
    throw Error(fmt::format("{}: unsupported rope scaling '{}'", path, scaling));
  }

  for (const auto& ti : file_.tensors()) {
    RawTensor t;
    t.name = ti.name;
    t.dtype = ti.type;
    t.shape = ti.shape();
    t.data = ti.data;
    t.n_bytes = ti.n_bytes;
    tensors_.emplace(ti.name, std::move(t));
  }
  const auto* tok = file_.find("tokenizer.ggml.tokens");
  cfg_.vocab_size = static_cast<int64_t>(
      file_.get_u64(key("vocab_size"), tok ? tok->as_strings("tokenizer.ggml.tokens").size() : 0));
  cfg_.tied_embeddings = find("output.weight") == nullptr;
  cfg_.qkv_bias = find("blk.0.attn_q.bias") != nullptr;
  cfg_.qk_norm = find("blk.0.attn_q_norm.weight") != nullptr;
  if (const RawTensor* rf = find("rope_freqs.weight")) {
    DHS_CHECK(rf->n_elems() == cfg_.head_dim / 2, "{}: rope_freqs has {} elements, expected {}", path,
              rf->n_elems(), cfg_.head_dim / 2);
    cfg_.rope_freq_factors.resize(static_cast<size_t>(rf->n_elems()));
    dequantize_row(rf->dtype, rf->data, cfg_.rope_freq_factors.data(), rf->n_elems());
  }
}

const RawTensor* GgufSource::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> GgufSource::tensor_names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : tensors_) out.push_back(k);
  return out;
}

}  // namespace dhs
