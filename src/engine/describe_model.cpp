// `dhisparse info`: what a model file holds, without loading the weights, after the
// checks loading makes (LocalEngine's constructor, the backends' tensor loads), so that
// `info` fails, with the same message, on every file `generate` rejects.
#include <map>
#include <sstream>

#include "core/error.h"
#include "dhisparse/engine.h"
#include "model/gguf_source.h"
#include "model/dequant.h"
#include "model/hf_source.h"
#include "model/model_loader.h"
#include "tokenizer/tokenizer.h"

namespace dhs {

namespace {

// What load_tensor_f32 (model/tensor_load.cpp) checks of each tensor before reading it, with
// its messages; the data itself is not read.
void check_tensors(const WeightSource& src) {
  for (const TensorSpec& spec : required_tensors(src.config())) {
    const RawTensor* t = src.find(spec.name);
    DHS_CHECK(t != nullptr, "model: missing tensor '{}'", spec.name);
    DHS_CHECK(t->shape == spec.shape, "model: tensor '{}' has shape [{}], expected [{}]", spec.name,
              fmt::join(t->shape, ", "), fmt::join(spec.shape, ", "));
    DHS_CHECK(dequant_supported(t->dtype), "model: tensor '{}' has unsupported type {}", spec.name,
              dtype_traits(t->dtype).name);
    const int64_t cols = spec.shape.back();
    DHS_CHECK(dtype_row_bytes(t->dtype, cols) * static_cast<size_t>(t->n_elems() / cols) <= t->n_bytes,
              "model: tensor '{}' is truncated", spec.name);
  }
}

}  // namespace

std::string describe_model(const std::string& path) {
  auto src = open_weights(path);
  const ModelConfig& c = src->config();
  std::map<std::string, int64_t> n_by_type, params_by_type;
  int64_t n_params = 0;
  for (const auto& name : src->tensor_names()) {
    const RawTensor* t = src->find(name);
    const std::string ty(dtype_traits(t->dtype).name);
    n_by_type[ty] += 1;
    params_by_type[ty] += t->n_elems();
    n_params += t->n_elems();
  }
  // As LocalEngine loads them: the tokenizer first (one is required), then the tensors.
  std::unique_ptr<Tokenizer> tok;
  if (const auto* g = dynamic_cast<const GgufSource*>(src.get())) {
    tok = Tokenizer::from_gguf(g->file());
  } else if (const auto* h = dynamic_cast<const HfDirSource*>(src.get())) {
    DHS_CHECK(!h->tokenizer_json_path().empty(), "{}: no tokenizer.json in the model directory", h->dir());
    tok = Tokenizer::from_hf_files(h->tokenizer_json_path(), h->tokenizer_config_path());
  }
  DHS_CHECK(tok != nullptr, "unknown model source");
  DHS_CHECK(tok->vocab_size() <= c.vocab_size, "the tokenizer has {} tokens but the model's embedding only {} rows",
            tok->vocab_size(), c.vocab_size);
  check_tensors(*src);

  std::ostringstream o;
  o << fmt::format("model         {}\n", path);
  o << fmt::format("format        {}\n", src->format());
  o << fmt::format("name          {}\n", c.name);
  o << fmt::format("architecture  {}{}{}\n", arch_name(c.arch), c.qkv_bias ? " (qkv bias)" : "",
                   c.qk_norm ? " (q/k norm)" : "");
  o << fmt::format("parameters    {:.1f} M in {} tensors\n", n_params / 1e6, src->tensor_names().size());
  o << fmt::format("layers        {}\n", c.n_layers);
  o << fmt::format("hidden        {}   ffn {}   vocab {}\n", c.hidden, c.ffn_hidden, c.vocab_size);
  o << fmt::format("heads         {} q / {} kv (GQA group {}), head_dim {}\n", c.n_heads_q, c.n_heads_kv,
                   c.n_heads_kv ? c.n_heads_q / c.n_heads_kv : 0, c.head_dim);
  o << fmt::format("context       {} tokens (trained)\n", c.max_context);
  std::string scaling = "none";
  if (c.rope_scaling.kind == RopeScaling::Kind::Linear) scaling = fmt::format("linear x{}", c.rope_scaling.factor);
  if (c.rope_scaling.kind == RopeScaling::Kind::Llama3)
    scaling = fmt::format("llama3 (factor {}, low {}, high {}, original {})", c.rope_scaling.factor,
                          c.rope_scaling.low_freq_factor, c.rope_scaling.high_freq_factor,
                          c.rope_scaling.original_max_position);
  if (!c.rope_freq_factors.empty()) scaling += " + per-frequency factors (rope_freqs)";
  o << fmt::format("rope          theta {}, {} pairs, scaling {}\n", c.rope_theta,
                   c.rope_style == RopeStyle::Half ? "half-split" : "interleaved", scaling);
  o << fmt::format("rms eps       {}\n", c.rms_eps);
  o << fmt::format("embeddings    {}\n", c.tied_embeddings ? "tied (output = token_embd)" : "separate output");
  o << "dtypes       ";
  for (const auto& [ty, n] : n_by_type) o << fmt::format(" {}: {} tensors ({:.3f} M)", ty, n, params_by_type[ty] / 1e6);
  o << "\n";
  o << fmt::format("tokenizer     {}, {} tokens, bos {} eos {}{}\n", tok->kind_name(), tok->vocab_size(),
                   tok->bos_id() >= 0 ? tok->token_text(tok->bos_id()) : "-",
                   tok->eos_id() >= 0 ? tok->token_text(tok->eos_id()) : "-", tok->add_bos() ? " (adds bos)" : "");
  o << fmt::format("chat template {}\n", tok->chat_template().empty() ? "none" : fmt::format("yes ({} chars)", tok->chat_template().size()));
  return o.str();
}

}  // namespace dhs
