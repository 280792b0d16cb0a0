// User text rendered into a chat template is read as text: Tokenizer::guard_text breaks every
// special-token spelling in it, encode_guarded parses special tokens only where the template
// wrote them. On every kind of tokenizer the engine loads: byte-level BPE from GGUF (the
// default model) and from tokenizer.json (SmolLM2, a Llama-3 layout), SentencePiece BPE from
// tokenizer.json and from a vocab GGUF (Mistral).
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/gguf_file.h"
#include "test_paths.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/tokenizer.h"

namespace dhs {
namespace {

std::string data(const std::string& rel) { return test::data_dir() + "/tokenizer/" + rel; }

struct Named {
  std::string name;
  std::function<std::unique_ptr<Tokenizer>()> make;
};

std::vector<Named> tokenizers() {
  return {
      {"smollm2_gguf",
       [] {
         if (!std::filesystem::exists(test::default_model_path())) return std::unique_ptr<Tokenizer>{};
         return Tokenizer::from_gguf(gguf::GgufFile::open(test::default_model_path()));
       }},
      {"smollm2_json", [] { return Tokenizer::from_hf_files(data("smollm2/tokenizer.json"), data("smollm2/tokenizer_config.json")); }},
      {"llama3_json", [] { return Tokenizer::from_hf_files(data("synthetic_llama3/tokenizer.json"), ""); }},
      {"mistral_json", [] { return Tokenizer::from_hf_files(data("mistral/tokenizer.json"), data("mistral/tokenizer_config.json")); }},
      {"mistral_gguf", [] { return Tokenizer::from_gguf(gguf::GgufFile::open(data("mistral/vocab.gguf"))); }},
  };
}

// Special tokens that encode(parse_special) turns into their own id: what a user could forge.
std::vector<std::pair<int32_t, std::string>> parsed_specials(const Tokenizer& tok) {
  std::vector<std::pair<int32_t, std::string>> out;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (!tok.is_special(id)) continue;
    const std::string t = tok.token_text(id);
    if (!t.empty() && tok.encode(t, true) == std::vector<int32_t>{id}) out.emplace_back(id, t);
  }
  return out;
}

size_t count_specials(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  size_t n = 0;
  for (int32_t id : ids) n += tok.is_special(id) ? 1 : 0;
  return n;
}

class UserTextGuard : public ::testing::TestWithParam<size_t> {};

TEST_P(UserTextGuard, SpecialSpellingsInUserTextStayText) {
  const Named nt = tokenizers()[GetParam()];
  const auto tok = nt.make();
  if (!tok) GTEST_SKIP() << nt.name << ": default model missing (run scripts/fetch_model.sh)";
  const auto specials = parsed_specials(*tok);
  ASSERT_GE(specials.size(), 1u) << nt.name << " has no parsed special token to test with";
  // The template's own markup around the user's text: the first and last special tokens.
  const std::string open = specials.front().second, close = specials.back().second;
  // SentencePiece layouts that prefix a space to every text piece ("always") do so after a
  // special token for any text: what a benign "z" gets, user text gets too.
  const std::string z_decoded = tok->decode(tok->encode(open + "z" + close, true));
  ASSERT_TRUE(z_decoded == open + "z" + close || z_decoded == open + " z" + close) << z_decoded;
  const std::string gap = z_decoded == open + "z" + close ? "" : " ";
  for (const auto& [id, t] : specials) {
    for (const std::string& user : {t, "a" + t + "b", " " + t + t + "\n" + t, "x <" + t + "> y"}) {
      SCOPED_TRACE(nt.name + ": user text '" + user + "'");
      // Today's way (render, then encode with special parsing) forges the token: the test means something.
      ASSERT_GT(count_specials(*tok, tok->encode(open + user + close, true)), 2u);
      const std::vector<int32_t> ids = tok->encode_guarded(open + tok->guard_text(user) + close);
      ASSERT_GE(ids.size(), 3u);
      EXPECT_EQ(ids.front(), specials.front().first);
      EXPECT_EQ(ids.back(), specials.back().first);
      EXPECT_EQ(count_specials(*tok, ids), 2u) << "a special token came from user text";
      // Nothing lost or added: the guard is gone, the user's bytes are all there.
      EXPECT_EQ(tok->decode(ids), open + gap + user + close);
      // Byte-level BPE encodes text pieces independently of where they sit: the middle is
      // exactly the user text encoded without special parsing.
      if (tok->kind() == TokenizerKind::ByteLevelBpe) {
        const std::vector<int32_t> mid(ids.begin() + 1, ids.end() - 1);
        EXPECT_EQ(mid, tok->encode(user, false));
      }
    }
  }
}

TEST_P(UserTextGuard, TextWithoutSpecialsIsUnchanged) {
  const Named nt = tokenizers()[GetParam()];
  const auto tok = nt.make();
  if (!tok) GTEST_SKIP() << nt.name << ": default model missing (run scripts/fetch_model.sh)";
  const auto specials = parsed_specials(*tok);
  ASSERT_GE(specials.size(), 1u);
  const std::string sp = specials.front().second;
  for (const std::string& user : {std::string("What is the capital of France?"), std::string(" leading space"),
                                  std::string("Écris 日本語 😀 <not|special> <|im"), std::string("")}) {
    SCOPED_TRACE(nt.name + ": '" + user + "'");
    EXPECT_EQ(tok->guard_text(user), user);
    // With no special spelling in user text, the guarded path equals today's.
    const std::string rendered = sp + "user\n" + user + sp + "\n";
    EXPECT_EQ(tok->encode_guarded(rendered), tok->encode(rendered, true));
    EXPECT_EQ(tok->encode_guarded(user), tok->encode(user, true));
  }
}

INSTANTIATE_TEST_SUITE_P(AllKinds, UserTextGuard, ::testing::Range<size_t>(0, 5),
                         [](const auto& info) { return tokenizers()[info.param].name; });

// The guard character itself typed by a user survives the round trip, next to guards.
TEST(UserTextGuardChar, LiteralGuardCharacterRoundTrips) {
  const auto tok = Tokenizer::from_hf_files(data("smollm2/tokenizer.json"), data("smollm2/tokenizer_config.json"));
  const std::string g(AddedTokenMatcher::kGuard);
  for (const std::string& user : {g, g + g, g + "<|im_end|>" + g, "<|im_end|>" + g + "<|im_start|>", "a" + g + "b"}) {
    SCOPED_TRACE(user);
    const std::string guarded = tok->guard_text(user);
    EXPECT_EQ(AddedTokenMatcher::unguard(guarded), user);
    const auto ids = tok->encode_guarded("<|im_start|>" + guarded + "<|im_end|>");
    EXPECT_EQ(tok->decode(ids), "<|im_start|>" + user + "<|im_end|>");
    EXPECT_EQ(count_specials(*tok, ids), 2u);
  }
}

}  // namespace
}  // namespace dhs
