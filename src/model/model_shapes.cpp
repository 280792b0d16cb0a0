#include "model/model_shapes.h"

#include "core/error.h"

namespace dhs {

namespace {

// Llama-3.1-8B (meta-llama/Llama-3.1-8B config.json): 32 layers, GQA 32/8, d 128, 128k context
// with Llama-3 RoPE scaling; the shape `dhisparse bench` times.
ModelConfig llama3_8b() {
  ModelConfig c;
  c.name = "llama-3.1-8b-shape (random f16)";
  c.n_layers = 32;
  c.hidden = 4096;
  c.n_heads_q = 32;
  c.n_heads_kv = 8;
  c.head_dim = 128;
  c.ffn_hidden = 14336;
  c.vocab_size = 128256;
  c.max_context = 131072;
  c.rope_theta = 500000.0f;
  c.rope_scaling.kind = RopeScaling::Kind::Llama3;
  c.rope_scaling.factor = 8.0f;
  return c;
}

struct Named {
  const char* name;
  ModelConfig (*make)();
};
constexpr Named kShapes[] = {{"llama3-8b", llama3_8b}, {"llama3.1-8b", llama3_8b}};

}  // namespace

ModelConfig model_shape(const std::string& name) {
  for (const Named& s : kShapes)
    if (name == s.name) return s.make();
  std::string known;
  for (const std::string& n : model_shape_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(fmt::format("unknown model shape '{}' (known: {})", name, known));
}

std::vector<std::string> model_shape_names() {
  std::vector<std::string> v;
  for (const Named& s : kShapes) v.emplace_back(s.name);
  return v;
}

}  // namespace dhs
