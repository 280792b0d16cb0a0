// Tokenizer factory for Hugging Face files: tokenizer.json (BPE model, byte-level or
// SentencePiece-style with byte fallback) and tokenizer_config.json (bos/eos,
// add_bos_token, chat_template). The GGUF factory is in tokenizer_gguf.cpp.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/spm_tokenizer.h"

namespace dhs {
namespace {

using nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DHS_CHECK(in, "tokenizer: cannot open {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    throw Error(fmt::format("tokenizer: {} is not valid JSON: {}", path, e.what()));
  }
}

std::string str_or(const json& j, const char* key, const std::string& def) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : def;
}
bool bool_or(const json& j, const char* key, bool def) {
  const auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : def;
}

// Calls fn on `j` and, for "Sequence" nodes, on every member (pre_tokenizers,
// normalizers, decoders and post_processors all nest this way).
template <class Fn>
void for_each_component(const json& j, Fn&& fn) {
  if (!j.is_object()) return;
  if (str_or(j, "type", "") == "Sequence") {
    for (const char* list : {"pretokenizers", "normalizers", "decoders", "processors"})
      if (j.contains(list))
        for (const json& c : j[list]) for_each_component(c, fn);
    return;
  }
  fn(j);
}

bool has_component(const json& j, const std::string& type) {
  bool found = false;
  for_each_component(j, [&](const json& c) { found |= str_or(c, "type", "") == type; });
  return found;
}

// A special-token field of tokenizer_config.json: "<s>" or {"content": "<s>", ...}.
std::string token_content(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object()) return str_or(j, "content", "");
  return "";
}

SplitBehavior parse_behavior(const std::string& s) {
  if (s == "Removed") return SplitBehavior::Removed;
  if (s == "Isolated") return SplitBehavior::Isolated;
  if (s == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (s == "Contiguous") return SplitBehavior::Contiguous;
  throw Error(fmt::format("tokenizer.json: unknown Split behavior '{}'", s));
}

PreTokenizer parse_byte_level_pre(const json& pre) {
  PreTokenizer p;
  for_each_component(pre, [&](const json& c) {
    const std::string type = str_or(c, "type", "");
    if (type == "ByteLevel") {
      p.add_byte_level(bool_or(c, "add_prefix_space", true), bool_or(c, "use_regex", true));
    } else if (type == "Split") {
      const json& pat = c.at("pattern");
      const bool literal = pat.contains("String");
      const std::string pattern =
          literal ? pat["String"].get<std::string>() : pat.at("Regex").get<std::string>();
      p.add_split(pattern, literal, parse_behavior(str_or(c, "behavior", "Isolated")),
                  bool_or(c, "invert", false));
    } else if (type == "Digits") {
      p.add_digits(bool_or(c, "individual_digits", false));
    } else {
      throw Error(
          fmt::format("tokenizer.json: unsupported pre_tokenizer '{}' for byte-level BPE", type));
    }
  });
  return p;
}

std::vector<std::pair<std::string, std::string>> parse_merges(const json& model) {
  std::vector<std::pair<std::string, std::string>> merges;
  if (!model.contains("merges")) return merges;
  merges.reserve(model["merges"].size());
  for (const json& m : model["merges"]) {
    if (m.is_array() && m.size() == 2) {  // newer files: ["a", "b"]
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else if (m.is_string()) {  // older files: "a b"
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ', 1);
      DHS_CHECK(sp != std::string::npos, "tokenizer.json: bad merge '{}'", s);
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else {
      throw Error(fmt::format("tokenizer.json: bad merge entry {}", m.dump()));
    }
  }
  return merges;
}

// The id TemplateProcessing puts before a single sequence (the BOS), or "".
std::string template_bos(const json& post) {
  std::string bos;
  for_each_component(post, [&](const json& c) {
    if (str_or(c, "type", "") != "TemplateProcessing" || !c.contains("single")) return;
    const json& single = c["single"];
    if (single.is_array() && !single.empty() && single[0].contains("SpecialToken"))
      bos = str_or(single[0]["SpecialToken"], "id", "");
  });
  return bos;
}

// The vocabulary of tokenizer.json: model.vocab plus added tokens, which may have ids past it
// (Llama-3); holes in the id space get placeholder names.
struct HfVocab {
  std::vector<std::string> tokens;
  std::vector<TokenType> types;
  std::vector<AddedToken> added;
};

HfVocab read_hf_vocab(const json& j, const json& model) {
  HfVocab v;
  auto put = [&](int64_t id, const std::string& text, TokenType type) {
    DHS_CHECK(id >= 0 && id < (1 << 24), "tokenizer.json: token id {} out of range", id);
    if (static_cast<size_t>(id) >= v.tokens.size()) {
      v.tokens.resize(id + 1);
      v.types.resize(id + 1, TokenType::Unused);
    }
    v.tokens[id] = text;
    v.types[id] = type;
  };
  for (const auto& [text, id] : model.at("vocab").items())
    put(id.get<int64_t>(), text, TokenType::Normal);
  if (j.contains("added_tokens")) {
    for (const json& a : j["added_tokens"]) {
      AddedToken t;
      t.id = a.at("id").get<int32_t>();
      t.content = a.at("content").get<std::string>();
      t.special = bool_or(a, "special", false);
      t.lstrip = bool_or(a, "lstrip", false);
      t.rstrip = bool_or(a, "rstrip", false);
      put(t.id, t.content, t.special ? TokenType::Control : TokenType::UserDefined);
      v.added.push_back(std::move(t));
    }
  }
  for (size_t i = 0; i < v.tokens.size(); ++i)  // holes in the id space
    if (v.types[i] == TokenType::Unused && v.tokens[i].empty())
      v.tokens[i] = fmt::format("<unused_{}>", i);
  return v;
}

// SentencePiece-style BPE from tokenizer.json: the space rule (a Metaspace pre-tokenizer, or a
// Prepend / Replace normalizer), the unknown token and the byte tokens.
std::unique_ptr<TokenizerBase> sentencepiece_from_hf(const json& model, const json& pre, HfVocab v,
                                                     bool byte_fallback, bool metaspace, bool prepend) {
  SentencePieceSpec spec;
  spec.merges = parse_merges(model);
  spec.added = std::move(v.added);
  spec.byte_fallback = byte_fallback;
  spec.fuse_unk = bool_or(model, "fuse_unk", false);
  if (metaspace) {
    for_each_component(pre, [&](const json& c) {
      const std::string type = str_or(c, "type", "");
      DHS_CHECK(type == "Metaspace",
                "tokenizer.json: unsupported pre_tokenizer '{}' with Metaspace", type);
      DHS_CHECK(str_or(c, "replacement", "\xE2\x96\x81") == "\xE2\x96\x81",
                "tokenizer.json: Metaspace replacement other than U+2581 is not supported");
      // Older files: add_prefix_space; newer: prepend_scheme always / first / never.
      const std::string scheme =
          str_or(c, "prepend_scheme", bool_or(c, "add_prefix_space", true) ? "always" : "never");
      spec.prefix = scheme == "first"   ? SpacePrefix::First
                    : scheme == "never" ? SpacePrefix::Never
                                        : SpacePrefix::Always;
      spec.split_words = bool_or(c, "split", true);
    });
    spec.prefix_before_space = false;
  } else {
    DHS_CHECK(pre.is_null(),
              "tokenizer.json: unsupported pre_tokenizer for SentencePiece-style BPE");
    spec.prefix = prepend ? SpacePrefix::Always : SpacePrefix::Never;
    spec.prefix_before_space = true;
  }
  const std::string unk = str_or(model, "unk_token", "");
  if (!unk.empty()) {
    for (size_t i = 0; i < v.tokens.size(); ++i)
      if (v.tokens[i] == unk) {
        spec.unk_id = static_cast<int32_t>(i);
        if (v.types[i] == TokenType::Control || v.types[i] == TokenType::Normal)
          v.types[i] = TokenType::Unknown;
        break;
      }
  }
  if (byte_fallback) {
    for (size_t i = 0; i < v.tokens.size(); ++i)
      if (v.types[i] == TokenType::Normal && v.tokens[i].size() == 6 &&
          v.tokens[i].starts_with("<0x") && v.tokens[i].ends_with(">"))
        v.types[i] = TokenType::Byte;
  }
  spec.vocab = Vocab(std::move(v.tokens), std::move(v.types));
  return std::make_unique<SentencePieceTokenizer>(std::move(spec));
}

// Special tokens and the chat template from tokenizer_config.json; BOS falls back to what the
// post-processor template puts first.
TokenizerMeta read_hf_meta(const json& j, const std::string& tokenizer_config_path, const TokenizerBase& tok) {
  TokenizerMeta meta;
  const std::string post_bos = template_bos(j.value("post_processor", json()));
  std::string bos = post_bos, eos;
  meta.add_bos = !post_bos.empty();
  if (!tokenizer_config_path.empty()) {
    const json cfg = read_json(tokenizer_config_path);
    if (cfg.contains("bos_token")) bos = token_content(cfg["bos_token"]);
    if (cfg.contains("eos_token")) eos = token_content(cfg["eos_token"]);
    meta.add_bos = bool_or(cfg, "add_bos_token", meta.add_bos);
    if (cfg.contains("chat_template")) {
      const json& ct = cfg["chat_template"];
      if (ct.is_string()) {
        meta.chat_template = ct.get<std::string>();
      } else if (ct.is_array()) {  // named templates: take "default", else the first
        for (const json& t : ct) {
          if (meta.chat_template.empty() || str_or(t, "name", "") == "default")
            meta.chat_template = str_or(t, "template", "");
        }
      }
    }
  }
  if (!bos.empty()) {
    meta.bos_id = tok.token_id(bos);
    DHS_CHECK(meta.bos_id >= 0, "tokenizer: bos token '{}' is not in the vocabulary", bos);
  }
  if (!eos.empty()) {
    meta.eos_id = tok.token_id(eos);
    DHS_CHECK(meta.eos_id >= 0, "tokenizer: eos token '{}' is not in the vocabulary", eos);
  }
  return meta;
}

std::unique_ptr<Tokenizer> load_hf_files(const std::string& tokenizer_json_path,
                                         const std::string& tokenizer_config_path) {
  const json j = read_json(tokenizer_json_path);
  DHS_CHECK(j.contains("model") && j["model"].is_object(), "tokenizer.json: no model in {}",
            tokenizer_json_path);
  const json& model = j["model"];
  const std::string model_type = str_or(model, "type", model.contains("merges") ? "BPE" : "");
  DHS_CHECK(model_type == "BPE", "tokenizer.json: model type '{}' is not supported (only BPE)",
            model_type);
  HfVocab vocab = read_hf_vocab(j, model);

  const json pre = j.value("pre_tokenizer", json());
  const json norm = j.value("normalizer", json());
  const json decoder = j.value("decoder", json());
  const bool byte_level = has_component(pre, "ByteLevel") || has_component(decoder, "ByteLevel");
  const bool byte_fallback = bool_or(model, "byte_fallback", false);
  const bool metaspace = has_component(pre, "Metaspace");
  bool prepend = false, replaces_space = false;
  for_each_component(norm, [&](const json& c) {
    const std::string type = str_or(c, "type", "");
    if (type == "Prepend") {
      prepend = true;
    } else if (type == "Replace") {
      replaces_space = c.contains("pattern") && str_or(c["pattern"], "String", "") == " ";
    } else if (type == "NFC" && byte_level) {
      // Qwen2 declares NFC. Not applied: text is taken to be NFC already, as
      // virtually all text is; other normalizers change tokens and are refused.
    } else {
      throw Error(fmt::format("tokenizer.json: unsupported normalizer '{}'", type));
    }
  });

  std::unique_ptr<TokenizerBase> tok;
  if (byte_level) {
    ByteLevelBpeSpec spec;
    spec.vocab = Vocab(std::move(vocab.tokens), std::move(vocab.types));
    spec.merges = parse_merges(model);
    spec.added = std::move(vocab.added);
    spec.pre = parse_byte_level_pre(pre);
    spec.pre_name = "tokenizer.json";
    spec.ignore_merges = bool_or(model, "ignore_merges", false);
    tok = std::make_unique<ByteLevelBpeTokenizer>(std::move(spec));
  } else if (byte_fallback || metaspace || prepend || replaces_space) {
    tok = sentencepiece_from_hf(model, pre, std::move(vocab), byte_fallback, metaspace, prepend);
  } else {
    throw Error(fmt::format(
        "tokenizer.json: {} is neither byte-level BPE (ByteLevel pre-tokenizer/decoder) nor "
        "SentencePiece-style BPE (byte_fallback, Metaspace or a Prepend normalizer)",
        tokenizer_json_path));
  }
  tok->set_meta(read_hf_meta(j, tokenizer_config_path, *tok));
  return tok;
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_hf_files(const std::string& tokenizer_json_path,
                                                    const std::string& tokenizer_config_path) {
  try {
    return load_hf_files(tokenizer_json_path, tokenizer_config_path);
  } catch (const json::exception& e) {  // a field of the wrong type or missing
    throw Error(
        fmt::format("tokenizer: unexpected content in {}: {}", tokenizer_json_path, e.what()));
  }
}

}  // namespace dhs
