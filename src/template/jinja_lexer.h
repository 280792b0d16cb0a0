// Lexer of the chat-template interpreter: splits a Jinja source into text and
// the tokens inside {{ }} / {% %}, dropping {# #} comments, with jinja2's
// whitespace rules as transformers configures them (trim_blocks, lstrip_blocks,
// "-"/"+" markers, the trailing newline of the source dropped). Tokens are made on
// demand, as jinja2's lexer does, in time linear in the source.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dhs::jinja {

struct SourcePos {
  int line = 1;
  int col = 1;
};

enum class TokenType { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  TokenType type;
  std::string text;  // Text: the data; Name/Op: the spelling; String: the decoded value
  int64_t int_value = 0;
  double float_value = 0.0;
  SourcePos pos;
};

// Throws dhs::Error("chat template syntax error at line L, column C: ...").
[[noreturn]] void syntax_error(SourcePos pos, const std::string& msg);

// The tokens of a source, lexed as the parser asks for them: a hostile template is
// rejected at its first error without tokenizing (and storing) the rest of it.
// Throws dhs::Error for a source over kMaxTemplateBytes and on lexical errors.
class TokenStream {
 public:
  explicit TokenStream(std::string_view source);
  ~TokenStream();
  TokenStream(const TokenStream&) = delete;
  TokenStream& operator=(const TokenStream&) = delete;

  // References stay valid until advance() moves past the token.
  const Token& cur();
  const Token& peek();  // the token after cur(); Eof at the end
  void advance();       // stays on Eof

 private:
  class Lexer;
  std::unique_ptr<Lexer> lexer_;
};

// Tokenizes the whole source; the last token is Eof.
std::vector<Token> lex(std::string_view source);

}  // namespace dhs::jinja
