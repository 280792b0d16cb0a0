#include "model/model_config.h"

namespace dhs {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Llama: return "llama";
    case Arch::Qwen2: return "qwen2";
    case Arch::Qwen3: return "qwen3";
  }
  return "?";
}

std::vector<TensorSpec> required_tensors(const ModelConfig& c) {
  const int64_t H = c.hidden, D = c.head_dim, Hq = c.n_heads_q, Hkv = c.n_heads_kv, F = c.ffn_hidden, V = c.vocab_size;
  std::vector<TensorSpec> t = {{"token_embd.weight", {V, H}}, {"output_norm.weight", {H}}};
  if (!c.tied_embeddings) t.push_back({"output.weight", {V, H}});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    t.push_back({p + "attn_norm.weight", {H}});
    t.push_back({p + "ffn_norm.weight", {H}});
    t.push_back({p + "attn_q.weight", {Hq * D, H}});
    t.push_back({p + "attn_k.weight", {Hkv * D, H}});
    t.push_back({p + "attn_v.weight", {Hkv * D, H}});
    t.push_back({p + "attn_output.weight", {H, Hq * D}});
    t.push_back({p + "ffn_gate.weight", {F, H}});
    t.push_back({p + "ffn_up.weight", {F, H}});
    t.push_back({p + "ffn_down.weight", {H, F}});
    if (c.qkv_bias) {
      t.push_back({p + "attn_q.bias", {Hq * D}});
      t.push_back({p + "attn_k.bias", {Hkv * D}});
      t.push_back({p + "attn_v.bias", {Hkv * D}});
    }
    if (c.qk_norm) {
      t.push_back({p + "attn_q_norm.weight", {D}});
      t.push_back({p + "attn_k_norm.weight", {D}});
    }
  }
  return t;
}

}  // namespace dhs
