// Tokenizers against Hugging Face `tokenizers` reference ids (tests/data/tokenizer/,
// made by scripts/make_tokenizer_reference.py): SmolLM2's byte-level BPE from the
// default model's GGUF and from tokenizer.json, a synthetic Llama-3-layout
// tokenizer.json, Mistral's SentencePiece BPE from tokenizer.json (legacy and
// Metaspace layouts) and from a vocab-only GGUF. Also round trips, streaming decode,
// special-token metadata and encode speed.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "core/utf8.h"
#include "model/gguf_file.h"
#include "test_paths.h"
#include "tokenizer/byte_unicode.h"
#include "tokenizer/tokenizer.h"

namespace dhs {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::string data(const std::string& rel) { return test::data_dir() + "/tokenizer/" + rel; }

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "missing test data " << path << " (run scripts/make_tokenizer_reference.py)";
  return json::parse(in);
}

struct Case {
  std::string text, decoded;
  std::vector<int32_t> ids, ids_plain, ids_metaspace;
};

std::vector<Case> load_cases(const std::string& path) {
  std::vector<Case> cases;
  const json j = read_json(path);
  for (const json& c : j.at("cases")) {
    Case k;
    k.text = c.at("text");
    k.decoded = c.at("decoded");
    k.ids = c.at("ids").get<std::vector<int32_t>>();
    k.ids_plain = c.at("ids_plain").get<std::vector<int32_t>>();
    if (c.contains("ids_metaspace"))
      k.ids_metaspace = c["ids_metaspace"].get<std::vector<int32_t>>();
    cases.push_back(std::move(k));
  }
  EXPECT_GE(cases.size(), 40u);
  return cases;
}

// Ids with and without special-token parsing, HF's decode, and decode(encode(x)) == x
// for plain text.
void expect_reference(const Tokenizer& tok, const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    SCOPED_TRACE("text: \"" + c.text + "\"");
    EXPECT_EQ(tok.encode(c.text, true), c.ids);
    EXPECT_EQ(tok.encode(c.text, false), c.ids_plain);
    EXPECT_EQ(tok.decode(c.ids), c.decoded);
    EXPECT_EQ(tok.decode(c.ids_plain), c.text);
  }
}

// Ids pushed one at a time: every chunk is valid UTF-8 and together they are the text.
void expect_streaming(const Tokenizer& tok, const std::vector<Case>& cases) {
  int n_multibyte = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE("text: \"" + c.text + "\"");
    StreamDecoder sd(tok, /*skip_special=*/false);
    std::string all;
    for (int32_t id : c.ids_plain) {
      const std::string chunk = sd.push(id);
      EXPECT_TRUE(utf8::is_valid(chunk));
      all += chunk;
    }
    all += sd.flush();
    EXPECT_EQ(all, c.text);
    n_multibyte += !std::all_of(c.text.begin(), c.text.end(), [](char ch) { return ch > 0; });
  }
  EXPECT_GE(n_multibyte, 10);  // the corpus has CJK, emoji, accents
}

// ~100 KB of varied text: the corpus repeated, with a counter so words vary.
std::string big_text(const std::vector<Case>& cases) {
  std::string s;
  if (cases.empty()) return s;
  for (int i = 0; s.size() < 100 * 1024; ++i) {
    for (const Case& c : cases) {
      if (c.text.find("<") != std::string::npos) continue;
      s += c.text;
      s += " " + std::to_string(i * 7919) + "\n";
    }
  }
  return s;
}

double seconds_to_encode(const Tokenizer& tok, const std::string& text) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok.encode(text, false);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(tok.decode(ids), text);
  std::printf("  encode %zu bytes -> %zu tokens: %.1f ms (%s)\n", text.size(), ids.size(), s * 1e3,
              tok.kind_name().c_str());
  return s;
}

// ---- SmolLM2: byte-level BPE ------------------------------------------------------

std::unique_ptr<Tokenizer> smollm2_from_gguf() {
  const gguf::GgufFile f = gguf::GgufFile::open(test::default_model_path());
  return Tokenizer::from_gguf(f);
}

#define SKIP_WITHOUT_MODEL()                                     \
  if (!fs::exists(test::default_model_path()))                   \
  GTEST_SKIP() << "default model " << test::default_model_path() \
               << " not present (scripts/fetch_model.sh downloads it)"

void expect_smollm2_meta(const Tokenizer& tok) {
  EXPECT_EQ(tok.kind(), TokenizerKind::ByteLevelBpe);
  EXPECT_EQ(tok.vocab_size(), 49152);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_FALSE(tok.add_bos());
  EXPECT_EQ(tok.token_id("<|im_end|>"), 2);
  EXPECT_EQ(tok.token_text(1), "<|im_start|>");
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_FALSE(tok.is_special(tok.token_id("hello")));
  EXPECT_EQ(tok.stop_ids(), (std::vector<int32_t>{2, 0}));  // <|im_end|>, <|endoftext|>
  EXPECT_TRUE(tok.chat_template().starts_with("{% for message in messages %}"));
  EXPECT_EQ(tok.decode({1, 19556, 2}, /*skip_special=*/true), "Hello");
}

TEST(TokenizerSmolLM2, GgufMatchesHfReference) {
  SKIP_WITHOUT_MODEL();
  const auto tok = smollm2_from_gguf();
  EXPECT_EQ(tok->kind_name(), "byte-level BPE (smollm)");
  expect_smollm2_meta(*tok);
  expect_reference(*tok, load_cases(data("smollm2/reference.json")));
}

TEST(TokenizerSmolLM2, TokenizerJsonMatchesHfReference) {
  const auto tok = Tokenizer::from_hf_files(data("smollm2/tokenizer.json"),
                                            data("smollm2/tokenizer_config.json"));
  expect_smollm2_meta(*tok);
  expect_reference(*tok, load_cases(data("smollm2/reference.json")));
}

TEST(TokenizerSmolLM2, StreamingDecode) {
  const auto tok = Tokenizer::from_hf_files(data("smollm2/tokenizer.json"), "");
  expect_streaming(*tok, load_cases(data("smollm2/reference.json")));
  // A special token is dropped by a skipping stream, and bytes split across tokens wait.
  StreamDecoder sd(*tok);
  EXPECT_EQ(sd.push(1), "");
  std::string out;
  for (int32_t id : tok->encode("\xF0\x9F\xA4\x96!")) out += sd.push(id);
  EXPECT_EQ(out + sd.flush(), "\xF0\x9F\xA4\x96!");
}

TEST(TokenizerSmolLM2, FlushReplacesIncompleteCharacter) {
  const auto tok = Tokenizer::from_hf_files(data("smollm2/tokenizer.json"), "");
  // The first byte of a 4-byte emoji on its own, as byte-level tokens allow.
  const int32_t lead = tok->token_id("\xC3\xB0");  // GPT-2 character of byte 0xF0
  ASSERT_GE(lead, 0);
  StreamDecoder sd(*tok);
  EXPECT_EQ(sd.push(lead), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");
}

TEST(TokenizerSmolLM2, Encodes100KBFast) {
  const auto tok = Tokenizer::from_hf_files(data("smollm2/tokenizer.json"), "");
  const std::vector<Case> cases = load_cases(data("smollm2/reference.json"));
  EXPECT_LT(seconds_to_encode(*tok, big_text(cases)), 1.0);
  // One 100 KB word (no spaces): the merge loop must not be quadratic.
  std::string word;
  for (int i = 0; word.size() < 100 * 1024; ++i) word += "abcdefghij"[i * 7 % 10];
  EXPECT_LT(seconds_to_encode(*tok, word), 1.0);
}

// ---- Llama-3 layout (synthetic vocabulary) -----------------------------------------

TEST(TokenizerLlama3Layout, SplitRegexIgnoreMergesAndTemplateBos) {
  // Split(Llama-3 regex) + ByteLevel(no regex), ignore_merges, "a b" merges, a
  // non-special added token, BOS from the TemplateProcessing post-processor.
  const auto tok = Tokenizer::from_hf_files(data("synthetic_llama3/tokenizer.json"), "");
  EXPECT_EQ(tok->kind(), TokenizerKind::ByteLevelBpe);
  EXPECT_EQ(tok->bos_id(), tok->token_id("<|begin_of_text|>"));
  EXPECT_TRUE(tok->add_bos());
  EXPECT_FALSE(tok->is_special(tok->token_id("<tool>")));
  expect_reference(*tok, load_cases(data("synthetic_llama3/reference.json")));
}

// ---- Mistral: SentencePiece BPE ---------------------------------------------------

void expect_mistral_meta(const Tokenizer& tok) {
  EXPECT_EQ(tok.kind(), TokenizerKind::SentencePieceBpe);
  EXPECT_EQ(tok.vocab_size(), 32000);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_EQ(tok.stop_ids(), std::vector<int32_t>{2});
  EXPECT_TRUE(tok.is_special(0));  // <unk>
  // Byte fallback tokens decode to their byte; BOS is skipped, then the prefix space.
  EXPECT_EQ(tok.decode({1, tok.token_id("\xE2\x96\x81Hello"), tok.token_id("<0x21>")}, true),
            "Hello!");
}

TEST(TokenizerMistral, TokenizerJsonMatchesHfReference) {
  const auto tok = Tokenizer::from_hf_files(data("mistral/tokenizer.json"),
                                            data("mistral/tokenizer_config.json"));
  expect_mistral_meta(*tok);
  expect_reference(*tok, load_cases(data("mistral/reference.json")));
}

TEST(TokenizerMistral, MetaspaceLayoutMatchesHfReference) {
  // The same vocabulary the newer way: no normalizer, Metaspace(prepend_scheme first).
  json j = read_json(data("mistral/tokenizer.json"));
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"},
                        {"replacement", "\xE2\x96\x81"},
                        {"prepend_scheme", "first"},
                        {"split", false}};
  j["decoder"] = {{"type", "Metaspace"},
                  {"replacement", "\xE2\x96\x81"},
                  {"prepend_scheme", "first"},
                  {"split", false}};
  const fs::path path =
      fs::temp_directory_path() / ("dhs_metaspace_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << j.dump();
  const auto tok = Tokenizer::from_hf_files(path.string(), "");
  fs::remove(path);
  for (const Case& c : load_cases(data("mistral/reference.json"))) {
    SCOPED_TRACE("text: \"" + c.text + "\"");
    EXPECT_EQ(tok->encode(c.text, true), c.ids_metaspace);
  }
}

TEST(TokenizerMistral, VocabGgufMatchesHfReference) {
  // GGUF has scores, not merges: ranking merges by score must give the same ids.
  const gguf::GgufFile f = gguf::GgufFile::open(data("mistral/vocab.gguf"));
  const auto tok = Tokenizer::from_gguf(f);
  expect_mistral_meta(*tok);
  expect_reference(*tok, load_cases(data("mistral/reference.json")));
}

TEST(TokenizerMistral, StreamingDecodeAndSpeed) {
  const auto tok = Tokenizer::from_hf_files(data("mistral/tokenizer.json"), "");
  const std::vector<Case> cases = load_cases(data("mistral/reference.json"));
  expect_streaming(*tok, cases);
  EXPECT_LT(seconds_to_encode(*tok, big_text(cases)), 1.0);
}

// ---- arbitrary bytes -------------------------------------------------------------

// Random bytes, invalid UTF-8 included, survive encode/decode: byte-level BPE spells
// every byte (SmolLM2's vocabulary lacks a few, which are dropped as HF drops them),
// SentencePiece falls back to <0xNN> tokens.
TEST(TokenizerBytes, RandomBytesRoundTrip) {
  const auto smol = Tokenizer::from_hf_files(data("smollm2/tokenizer.json"), "");
  const auto mistral = Tokenizer::from_hf_files(data("mistral/tokenizer.json"), "");
  std::vector<unsigned char> spelled;
  for (int b = 0; b < 256; ++b)
    if (smol->token_id(byte_to_unicode(static_cast<unsigned char>(b))) >= 0) spelled.push_back(b);
  EXPECT_EQ(spelled.size(), 235u);
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::string any, spellable;
    for (int i = 0, n = static_cast<int>(rng() % 40); i < n; ++i) {
      any += static_cast<char>(rng() % 256);
      spellable += static_cast<char>(spelled[rng() % spelled.size()]);
    }
    EXPECT_EQ(smol->decode(smol->encode(spellable)), spellable);
    EXPECT_EQ(mistral->decode(mistral->encode(any, false)), any);
  }
}

// ---- errors ------------------------------------------------------------------------

TEST(TokenizerErrors, MissingOrUnsupportedFiles) {
  EXPECT_THROW(Tokenizer::from_hf_files(data("no/such/tokenizer.json"), ""), Error);
  const fs::path path =
      fs::temp_directory_path() / ("dhs_wordpiece_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}})";
  try {
    Tokenizer::from_hf_files(path.string(), "");
    ADD_FAILURE() << "expected dhs::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("WordPiece"), std::string::npos) << e.what();
  }
  // A field of the wrong type is a dhs::Error too, not a JSON library exception.
  std::ofstream(path, std::ios::trunc) << R"({"model": {"type": "BPE", "vocab": {"a": "zero"}}})";
  EXPECT_THROW(Tokenizer::from_hf_files(path.string(), ""), Error);
  fs::remove(path);
}

TEST(TokenizerErrors, OutOfRangeIdThrows) {
  const auto tok = Tokenizer::from_hf_files(data("smollm2/tokenizer.json"), "");
  EXPECT_THROW(tok->decode({49152}), Error);
  EXPECT_THROW(tok->decode({-1}), Error);
}

}  // namespace
}  // namespace dhs
