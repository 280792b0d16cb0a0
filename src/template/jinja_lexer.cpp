// Lexer of the chat-template interpreter (see jinja_lexer.h). The whitespace
// handling mirrors jinja2's lexer with trim_blocks=True, lstrip_blocks=True:
//  - "{%-", "{{-", "{#-" strip all whitespace before the tag; "-%}", "-}}",
//    "-#}" strip all whitespace after it;
//  - otherwise "%}" and "#}" eat one newline right after them (trim_blocks),
//    "+%}" keeps it;
//  - "{%" and "{#" (not "{{") eat the spaces and tabs before them when only
//    whitespace precedes them on their line (lstrip_blocks), "{%+" keeps them.
// The lexer is a state machine the parser pulls tokens from: in data it finds the
// next tag; inside a tag it makes one token per step. Every byte is looked at a
// bounded number of times, and positions advance incrementally.
#include "template/jinja_lexer.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <deque>

#include <fmt/format.h>

#include "core/error.h"
#include "template/jinja_limits.h"
#include "template/jinja_text.h"

namespace dhs::jinja {

void syntax_error(SourcePos pos, const std::string& msg) {
  throw Error(fmt::format("chat template syntax error at line {}, column {}: {}", pos.line, pos.col, msg));
}

namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || static_cast<unsigned char>(c) >= 0x80;
}
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// \r\n and \r become \n, and one trailing newline is dropped (keep_trailing_newline=False).
std::string normalize_newlines(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

class TokenStream::Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  const Token& cur() {
    fill(1);
    return tokens_.front();
  }
  const Token& peek() {
    fill(2);
    return tokens_.size() > 1 ? tokens_[1] : tokens_.front();
  }
  void advance() {
    fill(2);
    if (tokens_.size() > 1) tokens_.pop_front();
  }

 private:
  std::string src_;
  size_t pos_ = 0;             // data: where the next text starts
  bool line_starting_ = true;  // did the previous tag end by consuming a newline?
  bool done_ = false;          // Eof made
  // Inside a {{ }} / {% %} tag: where it opened, where lexing goes on, open brackets
  // (end tags only count outside (), [], {}).
  bool in_tag_ = false;
  bool tag_is_var_ = false;
  size_t tag_open_ = 0;
  size_t tag_p_ = 0;
  std::vector<char> brackets_;
  // Tokens made and not yet consumed. A deque keeps references to them valid while
  // more are appended.
  std::deque<Token> tokens_;
  // Position of byte offset cursor_off_, for incremental pos_at().
  size_t cursor_off_ = 0;
  SourcePos cursor_;

  void fill(size_t n) {
    while (tokens_.size() < n && !done_) step();
  }

  // Makes zero or more tokens, always moving forward.
  void step() {
    if (in_tag_) {
      lex_tag_token();
      return;
    }
    if (pos_ >= src_.size()) {
      tokens_.push_back(Token{TokenType::Eof, "", 0, 0.0, pos_at(src_.size())});
      done_ = true;
      return;
    }
    const size_t open = find_tag(pos_);
    if (open == std::string::npos) {
      emit_text(src_.substr(pos_), pos_);
      pos_ = src_.size();
      return;
    }
    const char kind = src_[open + 1];
    size_t body = open + 2;
    const char sign = (body < src_.size() && (src_[body] == '-' || src_[body] == '+')) ? src_[body] : 0;
    if (sign) ++body;
    std::string text = src_.substr(pos_, open - pos_);
    const size_t text_at = pos_;
    size_t raw_end = 0;
    if (kind == '%' && is_raw_begin(body, raw_end)) {
      emit_text(control_text(std::move(text), sign, true), text_at);
      lex_raw(open, raw_end);
      return;
    }
    emit_text(control_text(std::move(text), sign, kind != '{'), text_at);
    if (kind == '#') {
      lex_comment(open, body);
      return;
    }
    const bool is_var = kind == '{';
    tokens_.push_back(Token{is_var ? TokenType::VarBegin : TokenType::BlockBegin, "", 0, 0.0, pos_at(open)});
    in_tag_ = true;
    tag_is_var_ = is_var;
    tag_open_ = open;
    tag_p_ = body;
    brackets_.clear();
  }

  // Line and column (in code points) of a byte offset. Tokens ask in source order,
  // so the cursor only walks forward over the bytes in between: linear over the
  // whole source. Asking behind the cursor (an error about an earlier tag) walks
  // back to the line start once.
  SourcePos pos_at(size_t off) {
    off = std::min(off, src_.size());
    if (off < cursor_off_) {
      size_t line_start = off;
      while (line_start > 0 && src_[line_start - 1] != '\n') --line_start;
      SourcePos p;
      p.line = cursor_.line;
      for (size_t i = line_start; i < cursor_off_; ++i) p.line -= src_[i] == '\n' ? 1 : 0;
      for (size_t i = line_start; i < off; ++i)
        if ((static_cast<unsigned char>(src_[i]) & 0xC0) != 0x80) ++p.col;
      return p;
    }
    for (size_t i = cursor_off_; i < off; ++i) {
      if (src_[i] == '\n') {
        ++cursor_.line;
        cursor_.col = 1;
      } else if ((static_cast<unsigned char>(src_[i]) & 0xC0) != 0x80) {
        ++cursor_.col;
      }
    }
    cursor_off_ = off;
    return cursor_;
  }

  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  void emit_text(std::string text, size_t at) {
    if (!text.empty()) tokens_.push_back(Token{TokenType::Text, std::move(text), 0, 0.0, pos_at(at)});
  }

  // Whitespace control for the data before a tag. `lstrip` is false for "{{".
  std::string control_text(std::string text, char sign, bool lstrip) const {
    if (sign == '-') {
      size_t e = text.size();
      while (e > 0 && is_ws(text[e - 1])) --e;
      text.resize(e);
    } else if (sign != '+' && lstrip) {
      const size_t nl = text.rfind('\n');
      const size_t line_at = nl == std::string::npos ? 0 : nl + 1;
      if (line_at > 0 || line_starting_) {
        bool blank = true;
        for (size_t i = line_at; i < text.size(); ++i) blank = blank && is_ws(text[i]);
        if (blank) text.resize(line_at);
      }
    }
    return text;
  }

  // After a tag end at `after`: trim the following whitespace as the end marker asks.
  void finish_tag(size_t after, char marker, bool trim_newline) {
    if (marker == '-') {
      while (after < src_.size() && is_ws(src_[after])) ++after;
    } else if (marker != '+' && trim_newline && after < src_.size() && src_[after] == '\n') {
      ++after;
    }
    line_starting_ = after > 0 && src_[after - 1] == '\n';
    pos_ = after;
  }

  // "{% raw %}" (with optional -/+ markers): returns where its "%}" ends.
  bool is_raw_begin(size_t p, size_t& end) const {
    while (p < src_.size() && is_ws(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    if (p < src_.size() && is_name_char(src_[p])) return false;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    if (src_.compare(p, 3, "-%}") == 0) {
      p += 3;
      while (p < src_.size() && is_ws(src_[p])) ++p;  // "-%}" strips what follows
    } else if (src_.compare(p, 2, "%}") == 0) {
      p += 2;
    } else {
      return false;
    }
    end = p;
    return true;
  }

  void lex_raw(size_t open, size_t body_start) {
    for (size_t i = src_.find("{%", body_start); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t p = i + 2;
      const char sign = (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ? src_[p] : 0;
      if (sign) ++p;
      while (p < src_.size() && is_ws(src_[p])) ++p;
      if (src_.compare(p, 6, "endraw") != 0) continue;
      p += 6;
      while (p < src_.size() && is_ws(src_[p])) ++p;
      char marker = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) marker = src_[p++];
      if (src_.compare(p, 2, "%}") != 0) continue;
      line_starting_ = false;
      emit_text(control_text(src_.substr(body_start, i - body_start), sign, true), body_start);
      finish_tag(p + 2, marker, true);
      return;
    }
    syntax_error(pos_at(open), "Missing end of raw directive");
  }

  void lex_comment(size_t open, size_t body) {
    const size_t close = src_.find("#}", body);
    if (close == std::string::npos) syntax_error(pos_at(open), "Missing end of comment tag");
    const char marker = (close > body && (src_[close - 1] == '-' || src_[close - 1] == '+')) ? src_[close - 1] : 0;
    finish_tag(close + 2, marker, true);
  }

  // One token of the open tag, or its end.
  void lex_tag_token() {
    size_t p = tag_p_;
    while (true) {
      if (p >= src_.size())
        syntax_error(pos_at(tag_open_), tag_is_var_ ? "unexpected end of template, expected '}}'"
                                                    : "unexpected end of template, expected '%}'");
      if (brackets_.empty() && try_tag_end(p, tag_is_var_)) {
        in_tag_ = false;
        return;
      }
      if (!is_ws(src_[p])) break;
      ++p;
    }
    const char c = src_[p];
    const size_t start = p;
    if (is_digit(c)) {
      p = lex_number(p);
    } else if (is_name_start(c)) {
      while (p < src_.size() && is_name_char(src_[p])) ++p;
      tokens_.push_back(Token{TokenType::Name, src_.substr(start, p - start), 0, 0.0, pos_at(start)});
    } else if (c == '\'' || c == '"') {
      p = lex_string(p);
    } else {
      static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                                   "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};
      std::string op;
      for (const char* o : kOps) {
        if (src_.compare(p, std::char_traits<char>::length(o), o) == 0) {
          op = o;
          break;
        }
      }
      if (op.empty()) syntax_error(pos_at(p), fmt::format("unexpected char '{}'", c));
      if (op == "(" || op == "[" || op == "{") {
        // The parser would stop at this depth too; stopping here is cheaper.
        if (brackets_.size() >= static_cast<size_t>(kMaxParseNesting))
          syntax_error(pos_at(p), fmt::format("expression nested too deeply (more than {} brackets)", kMaxParseNesting));
        brackets_.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
      } else if (op == ")" || op == "]" || op == "}") {
        if (brackets_.empty()) syntax_error(pos_at(p), fmt::format("unexpected '{}'", op));
        if (brackets_.back() != op[0])
          syntax_error(pos_at(p), fmt::format("unexpected '{}', expected '{}'", op, brackets_.back()));
        brackets_.pop_back();
      }
      p += op.size();
      tokens_.push_back(Token{TokenType::Op, op, 0, 0.0, pos_at(start)});
    }
    tag_p_ = p;
  }

  bool try_tag_end(size_t p, bool is_var) {
    const char* close = is_var ? "}}" : "%}";
    char marker = 0;
    size_t q = p;
    if (src_[q] == '-' || (!is_var && src_[q] == '+')) marker = src_[q++];
    if (src_.compare(q, 2, close) != 0) return false;
    tokens_.push_back(Token{is_var ? TokenType::VarEnd : TokenType::BlockEnd, "", 0, 0.0, pos_at(p)});
    finish_tag(q + 2, marker, !is_var);
    return true;
  }

  size_t lex_number(size_t p) {
    const size_t start = p;
    auto digits = [&](auto pred) {
      // digits with single underscores between them
      if (p >= src_.size() || !pred(src_[p])) return false;
      while (p < src_.size() && (pred(src_[p]) || (src_[p] == '_' && p + 1 < src_.size() && pred(src_[p + 1])))) ++p;
      return true;
    };
    auto clean = [&](size_t b, size_t e) {
      std::string s;
      for (size_t i = b; i < e; ++i)
        if (src_[i] != '_') s += src_[i];
      return s;
    };
    // Radix prefixes (0x / 0o / 0b), integers only.
    if (src_[p] == '0' && p + 1 < src_.size()) {
      const char r = static_cast<char>(src_[p + 1] | 0x20);
      int base = r == 'x' ? 16 : r == 'o' ? 8 : r == 'b' ? 2 : 0;
      if (base) {
        size_t q = p + 2;
        auto ok = [base](char ch) {
          if (base == 16) return is_digit(ch) || ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f');
          return ch >= '0' && ch < static_cast<char>('0' + base);
        };
        size_t e = q;
        while (e < src_.size() && (ok(src_[e]) || src_[e] == '_')) ++e;
        if (e > q) {
          const std::string s = clean(q, e);
          tokens_.push_back(Token{TokenType::Int, src_.substr(start, e - start),
                                  static_cast<int64_t>(std::strtoull(s.c_str(), nullptr, base)), 0.0, pos_at(start)});
          return e;
        }
      }
    }
    // A number right after "." is an item index (foo.0.1), never a float.
    const bool after_dot = start > 0 && src_[start - 1] == '.';
    digits(is_digit);
    bool is_float = false;
    if (!after_dot) {
      const size_t save = p;
      if (p + 1 < src_.size() && src_[p] == '.' && is_digit(src_[p + 1])) {
        ++p;
        digits(is_digit);
        is_float = true;
      }
      if (p < src_.size() && (src_[p] | 0x20) == 'e') {
        size_t q = p + 1;
        if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
        if (q < src_.size() && is_digit(src_[q])) {
          p = q;
          digits(is_digit);
          is_float = true;
        }
      }
      if (!is_float) p = save;
    }
    const std::string s = clean(start, p);
    if (is_float) {
      tokens_.push_back(Token{TokenType::Float, s, 0, std::strtod(s.c_str(), nullptr), pos_at(start)});
    } else {
      errno = 0;
      const long long v = std::strtoll(s.c_str(), nullptr, 10);
      if (errno == ERANGE) syntax_error(pos_at(start), "integer literal too large");
      tokens_.push_back(Token{TokenType::Int, s, static_cast<int64_t>(v), 0.0, pos_at(start)});
    }
    return p;
  }

  // Python string literal with unicode-escape decoding of backslash sequences.
  size_t lex_string(size_t p) {
    const size_t start = p;
    const char quote = src_[p++];
    std::string out;
    while (true) {
      if (p >= src_.size()) syntax_error(pos_at(start), "unterminated string literal");
      const char c = src_[p];
      if (c == quote) {
        ++p;
        break;
      }
      if (c != '\\') {
        out += c;
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) syntax_error(pos_at(start), "unterminated string literal");
      const char e = src_[p + 1];
      p += 2;
      auto hex = [&](int n) -> char32_t {
        if (p + n > src_.size()) syntax_error(pos_at(start), "truncated escape in string literal");
        char32_t v = 0;
        for (int k = 0; k < n; ++k) {
          const char h = src_[p + k];
          int d = is_digit(h) ? h - '0' : ((h | 0x20) >= 'a' && (h | 0x20) <= 'f') ? (h | 0x20) - 'a' + 10 : -1;
          if (d < 0) syntax_error(pos_at(start), "truncated escape in string literal");
          v = v * 16 + static_cast<char32_t>(d);
        }
        if (v > 0x10FFFF) syntax_error(pos_at(start), "illegal Unicode character in string literal");
        p += n;
        return v;
      };
      switch (e) {
        case '\n': break;  // line continuation
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case 'x': utf8_append(out, hex(2)); break;
        case 'u': utf8_append(out, hex(4)); break;
        case 'U': utf8_append(out, hex(8)); break;
        default:
          if (e >= '0' && e <= '7') {  // octal, up to three digits
            char32_t v = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++k)
              v = v * 8 + static_cast<char32_t>(src_[p++] - '0');
            utf8_append(out, v);
          } else {  // unknown escapes keep their backslash, like Python
            out += '\\';
            out += e;
          }
      }
    }
    tokens_.push_back(Token{TokenType::String, std::move(out), 0, 0.0, pos_at(start)});
    return p;
  }
};

namespace {
std::string checked_source(std::string_view source) {
  if (source.size() > kMaxTemplateBytes)
    throw Error(fmt::format("chat template is {} bytes, more than the limit of {} bytes", source.size(),
                            kMaxTemplateBytes));
  return normalize_newlines(source);
}
}  // namespace

TokenStream::TokenStream(std::string_view source) : lexer_(std::make_unique<Lexer>(checked_source(source))) {}
TokenStream::~TokenStream() = default;
const Token& TokenStream::cur() { return lexer_->cur(); }
const Token& TokenStream::peek() { return lexer_->peek(); }
void TokenStream::advance() { lexer_->advance(); }

std::vector<Token> lex(std::string_view source) {
  TokenStream ts(source);
  std::vector<Token> out;
  while (true) {
    out.push_back(ts.cur());
    if (out.back().type == TokenType::Eof) return out;
    ts.advance();
  }
}

}  // namespace dhs::jinja
