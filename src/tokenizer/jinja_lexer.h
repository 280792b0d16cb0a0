// Lexer of the chat-template interpreter: splits a Jinja source into text and
// the tokens inside {{ }} / {% %}, dropping {# #} comments, with jinja2's
// whitespace rules as transformers configures them (trim_blocks, lstrip_blocks,
// "-"/"+" markers, the trailing newline of the source dropped).
#pragma once
#include <cstdint>
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

// Tokenizes the whole source; the last token is Eof.
std::vector<Token> lex(std::string_view source);

}  // namespace dhs::jinja
