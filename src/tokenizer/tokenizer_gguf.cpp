// Tokenizer factory for GGUF metadata (tokenizer.ggml.*): model "gpt2" is byte-level
// BPE with the pre-tokenizer named by tokenizer.ggml.pre, model "llama" is
// SentencePiece BPE over tokenizer.ggml.scores. Kept apart from tokenizer.cpp so
// that code using only tokenizer.json does not need the GGUF reader.
#include "core/error.h"
#include "model/gguf_file.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/spm_tokenizer.h"

namespace dhs {
namespace {

bool is_signed(gguf::ValueType t) {
  using T = gguf::ValueType;
  return t == T::I8 || t == T::I16 || t == T::I32 || t == T::I64;
}

// Optional token id; -1 when absent.
int32_t optional_id(const gguf::GgufFile& f, std::string_view key) {
  const gguf::Value* v = f.find(key);
  if (!v) return -1;
  const int64_t id = is_signed(v->type) ? v->as_i64(key) : static_cast<int64_t>(v->as_u64(key));
  DHS_CHECK(id >= -1 && id < (int64_t{1} << 31), "tokenizer: {} = {} is not a token id", key, id);
  return static_cast<int32_t>(id);
}

bool optional_bool(const gguf::GgufFile& f, std::string_view key, bool def) {
  const gguf::Value* v = f.find(key);
  return v ? v->as_bool(key) : def;
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::GgufFile& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  DHS_CHECK(model == "gpt2" || model == "llama",
            "tokenizer: unsupported tokenizer.ggml.model '{}' (supported: gpt2, llama)", model);
  std::vector<std::string> tokens =
      f.at("tokenizer.ggml.tokens").as_strings("tokenizer.ggml.tokens");
  std::vector<TokenType> types(tokens.size(), TokenType::Normal);
  if (const gguf::Value* v = f.find("tokenizer.ggml.token_type")) {
    const std::vector<int64_t>& tt = v->as_ints("tokenizer.ggml.token_type");
    DHS_CHECK(tt.size() == tokens.size(), "tokenizer: {} token types for {} tokens", tt.size(),
              tokens.size());
    for (size_t i = 0; i < tt.size(); ++i)  // 0 (undefined) and unknown values read as normal
      if (tt[i] >= 1 && tt[i] <= 6) types[i] = static_cast<TokenType>(tt[i]);
  }
  std::vector<AddedToken> added;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const TokenType t = types[i];
    if (t == TokenType::Control || t == TokenType::Unknown || t == TokenType::UserDefined)
      added.push_back({static_cast<int32_t>(i), tokens[i], t != TokenType::UserDefined});
  }

  std::unique_ptr<TokenizerBase> tok;
  if (model == "gpt2") {
    ByteLevelBpeSpec spec;
    for (const std::string& m : f.at("tokenizer.ggml.merges").as_strings("tokenizer.ggml.merges")) {
      // Byte-level spellings contain no space (0x20 is "Ġ"), so the first one separates.
      const size_t sp = m.find(' ', 1);
      DHS_CHECK(sp != std::string::npos, "tokenizer: bad merge '{}' in tokenizer.ggml.merges", m);
      spec.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
    spec.pre_name = f.get_string("tokenizer.ggml.pre", "default");
    spec.pre = PreTokenizer::from_gguf_pre(spec.pre_name);
    spec.vocab = Vocab(std::move(tokens), std::move(types));
    spec.added = std::move(added);
    tok = std::make_unique<ByteLevelBpeTokenizer>(std::move(spec));
  } else {
    SentencePieceSpec spec;
    const std::vector<double>& scores =
        f.at("tokenizer.ggml.scores").as_floats("tokenizer.ggml.scores");
    spec.scores.assign(scores.begin(), scores.end());
    spec.prefix = optional_bool(f, "tokenizer.ggml.add_space_prefix", true) ? SpacePrefix::Always
                                                                            : SpacePrefix::Never;
    spec.prefix_before_space = true;
    spec.unk_id = optional_id(f, "tokenizer.ggml.unknown_token_id");
    if (spec.unk_id < 0) {
      for (size_t i = 0; i < types.size() && spec.unk_id < 0; ++i)
        if (types[i] == TokenType::Unknown) spec.unk_id = static_cast<int32_t>(i);
    }
    spec.vocab = Vocab(std::move(tokens), std::move(types));
    spec.added = std::move(added);
    tok = std::make_unique<SentencePieceTokenizer>(std::move(spec));
  }

  TokenizerMeta meta;
  meta.bos_id = optional_id(f, "tokenizer.ggml.bos_token_id");
  meta.eos_id = optional_id(f, "tokenizer.ggml.eos_token_id");
  meta.add_bos = optional_bool(f, "tokenizer.ggml.add_bos_token", model == "llama");
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
    if (const int32_t id = optional_id(f, key); id >= 0) meta.extra_stop_ids.push_back(id);
  meta.chat_template = f.get_string("tokenizer.chat_template", "");
  tok->set_meta(meta);
  return tok;
}

}  // namespace dhs
