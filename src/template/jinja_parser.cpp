// Parser of the chat-template interpreter (see jinja_parser.h). Recursive
// descent in the order of jinja2's parser: condexpr > or > and > not > compare
// > + - > ~ > * / // % > ** > unary, where filters and tests bind at the unary
// level ("a + b | trim" trims b; "not x is defined" negates the test).
// Three limits (jinja_limits.h) keep the recursion of the parser and of the
// evaluator after it bounded: statement nesting, the parser's recursion inside an
// expression, and the height of each expression tree, which left-associative
// chains ("1+1+1...", "a|f|f|f...", "a.b.c...") grow without any recursion.
#include "template/jinja_parser.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "template/jinja_limits.h"

namespace dhs::jinja {
namespace {

class Parser {
 public:
  explicit Parser(std::string_view source) : toks_(source) {}

  std::unique_ptr<TemplateAst> run() {
    auto t = std::make_unique<TemplateAst>();
    std::string end;
    t->body = parse_body({}, end);
    return t;
  }

 private:
  TokenStream toks_;
  int depth_ = 0;       // parser recursion inside an expression
  int stmt_depth_ = 0;  // nesting of block statements
  int loop_depth_ = 0;  // for break/continue checks

  // --- token helpers -------------------------------------------------------
  const Token& cur() { return toks_.cur(); }
  const Token& peek() { return toks_.peek(); }
  void advance() { toks_.advance(); }
  bool is_op(const char* op) { return cur().type == TokenType::Op && cur().text == op; }
  bool is_name(const char* n) { return cur().type == TokenType::Name && cur().text == n; }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::Text: return "template data";
      case TokenType::VarBegin: return "begin of print statement";
      case TokenType::VarEnd: return "end of print statement";
      case TokenType::BlockBegin: return "begin of statement block";
      case TokenType::BlockEnd: return "end of statement block";
      case TokenType::Eof: return "end of template";
      case TokenType::String: return "string";
      default: return t.text;
    }
  }
  [[noreturn]] void fail(const std::string& msg) { syntax_error(cur().pos, msg); }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(fmt::format("expected '{}', got '{}'", op, describe(cur())));
    advance();
  }
  std::string expect_name() {
    if (cur().type != TokenType::Name) fail(fmt::format("expected name, got '{}'", describe(cur())));
    std::string n = cur().text;
    advance();
    return n;
  }
  void expect_block_end() {
    if (cur().type != TokenType::BlockEnd)
      fail(fmt::format("expected end of statement block, got '{}'", describe(cur())));
    advance();
  }
  ExprPtr node(ExprKind k, SourcePos pos) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->pos = pos;
    return e;
  }
  StmtPtr stmt(StmtKind k, SourcePos pos) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->pos = pos;
    return s;
  }
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxParseNesting)
        p.fail(fmt::format("expression nested too deeply (more than {} levels)", kMaxParseNesting));
    }
    ~DepthGuard() { --p.depth_; }
  };
  struct StmtDepthGuard {
    Parser& p;
    StmtDepthGuard(Parser& parser, SourcePos pos) : p(parser) {
      if (++p.stmt_depth_ > kMaxStmtDepth)
        syntax_error(pos, fmt::format("statements nested too deeply (more than {} levels)", kMaxStmtDepth));
    }
    ~StmtDepthGuard() { --p.stmt_depth_; }
  };
  // Call once a node's children are in place: records its height and rejects trees
  // taller than the evaluator may recurse.
  static ExprPtr seal(ExprPtr e) {
    int h = 0;
    if (e->obj) h = e->obj->height;
    for (const auto& x : e->items)
      if (x) h = std::max(h, x->height);
    for (const auto& kv : e->kwargs)
      if (kv.second) h = std::max(h, kv.second->height);
    e->height = h + 1;
    if (e->height > kMaxExprDepth)
      syntax_error(e->pos, fmt::format("expression nested too deeply (more than {} levels)", kMaxExprDepth));
    return e;
  }

  // --- statements ----------------------------------------------------------
  // Parses until one of `ends` opens a block tag; consumes "{%" and the end
  // name and reports it in `which`. The caller parses the rest of that tag.
  Body parse_body(std::initializer_list<const char*> ends, std::string& which) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == TokenType::Eof) {
        if (ends.size() != 0) {
          std::string want;
          for (const char* e : ends) want += fmt::format("{}'{}'", want.empty() ? "" : " or ", e);
          fail("unexpected end of template, expected " + want);
        }
        return body;
      }
      if (t.type == TokenType::Text) {
        auto s = stmt(StmtKind::Text, t.pos);
        s->text = t.text;
        body.push_back(std::move(s));
        advance();
      } else if (t.type == TokenType::VarBegin) {
        auto s = stmt(StmtKind::Print, t.pos);
        advance();
        s->expr = parse_tuple(false, true, {}, false);
        if (cur().type != TokenType::VarEnd) fail(fmt::format("expected '}}}}', got '{}'", describe(cur())));
        advance();
        body.push_back(std::move(s));
      } else if (t.type == TokenType::BlockBegin) {
        const Token& name = peek();
        if (name.type != TokenType::Name) syntax_error(name.pos, "tag name expected");
        for (const char* e : ends) {
          if (name.text == e) {
            which = e;
            advance();
            advance();
            return body;
          }
        }
        advance();
        parse_statement(body);
      } else {
        fail(fmt::format("unexpected '{}'", describe(t)));
      }
    }
  }

  void parse_statement(Body& out) {
    const SourcePos pos = cur().pos;
    const StmtDepthGuard guard(*this, pos);
    const std::string tag = expect_name();
    std::string end;
    if (tag == "if") {
      auto s = stmt(StmtKind::If, pos);
      s->conds.push_back(parse_tuple(false, false, {}, false));
      expect_block_end();
      while (true) {
        s->bodies.push_back(parse_body({"elif", "else", "endif"}, end));
        if (end == "elif") {
          s->conds.push_back(parse_tuple(false, false, {}, false));
          expect_block_end();
          continue;
        }
        if (end == "else") {
          expect_block_end();
          s->else_body = parse_body({"endif"}, end);
        }
        expect_block_end();
        break;
      }
      out.push_back(std::move(s));
    } else if (tag == "for") {
      auto s = stmt(StmtKind::For, pos);
      s->target = parse_target(false, "in");
      if (!is_name("in")) fail(fmt::format("expected 'in', got '{}'", describe(cur())));
      advance();
      s->expr = parse_tuple(false, false, {"recursive"}, false);
      if (is_name("if")) {
        advance();
        s->cond = parse_expression();
      }
      if (is_name("recursive")) fail("recursive for loops are not supported");
      expect_block_end();
      ++loop_depth_;
      s->body = parse_body({"endfor", "else"}, end);
      --loop_depth_;
      if (end == "else") {
        expect_block_end();
        s->else_body = parse_body({"endfor"}, end);
      }
      expect_block_end();
      out.push_back(std::move(s));
    } else if (tag == "set") {
      Target target = parse_target(true, nullptr);
      if (is_op("=")) {
        auto s = stmt(StmtKind::Set, pos);
        s->target = std::move(target);
        advance();
        s->expr = parse_tuple(false, true, {}, false);
        expect_block_end();
        out.push_back(std::move(s));
      } else {
        auto s = stmt(StmtKind::SetBlock, pos);
        if (target.kind != Target::Kind::Name) fail("block assignment needs a single name");
        s->target = std::move(target);
        while (is_op("|")) {
          advance();
          s->filters.push_back(parse_filter(nullptr));
        }
        expect_block_end();
        s->body = parse_body({"endset"}, end);
        expect_block_end();
        out.push_back(std::move(s));
      }
    } else if (tag == "macro") {
      auto s = stmt(StmtKind::Macro, pos);
      s->text = expect_name();
      parse_signature(*s);
      expect_block_end();
      const int saved = loop_depth_;
      loop_depth_ = 0;
      s->body = parse_body({"endmacro"}, end);
      loop_depth_ = saved;
      if (cur().type == TokenType::Name) advance();  // {% endmacro name %}
      expect_block_end();
      out.push_back(std::move(s));
    } else if (tag == "call") {
      auto s = stmt(StmtKind::CallBlock, pos);
      if (is_op("(")) parse_signature(*s);
      s->expr = parse_expression();
      if (s->expr->kind != ExprKind::Call) syntax_error(s->expr->pos, "expected call");
      expect_block_end();
      const int saved = loop_depth_;
      loop_depth_ = 0;
      s->body = parse_body({"endcall"}, end);
      loop_depth_ = saved;
      expect_block_end();
      out.push_back(std::move(s));
    } else if (tag == "filter") {
      auto s = stmt(StmtKind::FilterBlock, pos);
      s->filters.push_back(parse_filter(nullptr));
      while (is_op("|")) {
        advance();
        s->filters.push_back(parse_filter(nullptr));
      }
      expect_block_end();
      s->body = parse_body({"endfilter"}, end);
      expect_block_end();
      out.push_back(std::move(s));
    } else if (tag == "with") {
      auto s = stmt(StmtKind::With, pos);
      while (cur().type != TokenType::BlockEnd) {
        if (!s->params.empty()) expect_op(",");
        s->params.push_back(expect_name());
        expect_op("=");
        s->defaults.push_back(parse_expression());
      }
      expect_block_end();
      s->body = parse_body({"endwith"}, end);
      expect_block_end();
      out.push_back(std::move(s));
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) syntax_error(pos, fmt::format("'{}' outside of a loop", tag));
      out.push_back(stmt(tag == "break" ? StmtKind::Break : StmtKind::Continue, pos));
      expect_block_end();
    } else if (tag == "generation") {
      // transformers' AssistantTracker tag: marks assistant text for training
      // masks. It renders its body as a call block does, so in a scope of its own.
      auto s = stmt(StmtKind::With, pos);
      expect_block_end();
      s->body = parse_body({"endgeneration"}, end);
      expect_block_end();
      out.push_back(std::move(s));
    } else if (tag == "block" || tag == "extends" || tag == "include" || tag == "import" || tag == "from") {
      syntax_error(pos, fmt::format("'{}' is not supported in chat templates", tag));
    } else {
      syntax_error(pos, fmt::format("Encountered unknown tag '{}'", tag));
    }
  }

  // (a, b=default, ...) of a macro or a call block.
  void parse_signature(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      if (is_op(")")) break;
      s.params.push_back(expect_name());
      if (is_op("=")) {
        advance();
        s.defaults.push_back(parse_expression());
      } else {
        s.defaults.push_back(nullptr);
      }
    }
    advance();
  }

  // A name, "a, b" / "(a, b)", or (set only) "ns.attr".
  Target parse_target(bool with_namespace, const char* end_name) {
    Target t;
    const bool paren = is_op("(");
    if (paren) advance();
    t.names.push_back(expect_name());
    if (with_namespace && !paren && is_op(".")) {
      advance();
      t.kind = Target::Kind::NsAttr;
      t.attr = expect_name();
      return t;
    }
    while (is_op(",")) {
      t.kind = Target::Kind::Tuple;
      advance();
      if ((end_name && is_name(end_name)) || is_op("=") || is_op(")")) break;
      t.names.push_back(expect_name());
    }
    if (paren) {
      expect_op(")");
      t.kind = Target::Kind::Tuple;
    }
    return t;
  }

  // --- expressions ---------------------------------------------------------
  ExprPtr parse_expression() { return parse_condexpr(); }

  bool is_tuple_end(std::initializer_list<const char*> extra_end) {
    if (cur().type == TokenType::VarEnd || cur().type == TokenType::BlockEnd || is_op(")")) return true;
    for (const char* e : extra_end)
      if (is_name(e)) return true;
    return false;
  }

  ExprPtr parse_tuple(bool /*simplified*/, bool with_condexpr, std::initializer_list<const char*> extra_end,
                      bool explicit_parens) {
    const SourcePos pos = cur().pos;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(with_condexpr ? parse_condexpr() : parse_or());
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) fail(fmt::format("Expected an expression, got '{}'", describe(cur())));
    }
    auto e = node(ExprKind::Tuple, pos);
    e->items = std::move(args);
    return seal(std::move(e));
  }

  ExprPtr parse_condexpr() {
    DepthGuard guard(*this);
    ExprPtr expr1 = parse_or();
    while (is_name("if")) {
      const SourcePos pos = cur().pos;
      advance();
      auto e = node(ExprKind::Cond, pos);
      e->obj = parse_or();
      e->items.push_back(std::move(expr1));
      if (is_name("else")) {
        advance();
        e->items.push_back(parse_condexpr());
      } else {
        e->items.push_back(nullptr);
      }
      expr1 = seal(std::move(e));
    }
    return expr1;
  }

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, SourcePos pos) {
    auto e = node(ExprKind::Binary, pos);
    e->name = op;
    e->items.push_back(std::move(l));
    e->items.push_back(std::move(r));
    return seal(std::move(e));
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const SourcePos pos = cur().pos;
      advance();
      left = binary("or", std::move(left), parse_and(), pos);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const SourcePos pos = cur().pos;
      advance();
      left = binary("and", std::move(left), parse_not(), pos);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      auto e = node(ExprKind::Not, cur().pos);
      advance();
      e->obj = parse_not();
      return seal(std::move(e));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const SourcePos pos = cur().pos;
    ExprPtr expr = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == TokenType::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        advance();
      } else if (is_name("in")) {
        op = "in";
        advance();
      } else if (is_name("not") && peek().type == TokenType::Name && peek().text == "in") {
        op = "notin";
        advance();
        advance();
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(ExprKind::Compare, pos);
        cmp->obj = std::move(expr);
      }
      cmp->ops.push_back(op);
      cmp->items.push_back(parse_math1());
    }
    return cmp ? seal(std::move(cmp)) : std::move(expr);
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const SourcePos pos = cur().pos;
      const std::string op = cur().text;
      advance();
      left = binary(op, std::move(left), parse_concat(), pos);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const SourcePos pos = cur().pos;
      advance();
      left = binary("~", std::move(left), parse_math2(), pos);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const SourcePos pos = cur().pos;
      const std::string op = cur().text;
      advance();
      left = binary(op, std::move(left), parse_pow(), pos);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const SourcePos pos = cur().pos;
      advance();
      left = binary("**", std::move(left), parse_unary(true), pos);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = node(is_op("-") ? ExprKind::Neg : ExprKind::Pos, cur().pos);
      advance();
      e->obj = parse_unary(false);
      e = seal(std::move(e));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    ExprPtr e;
    switch (t.type) {
      case TokenType::Name:
        if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
          e = node(ExprKind::Literal, t.pos);
          e->value = Value::boolean(t.text == "true" || t.text == "True");
        } else if (t.text == "none" || t.text == "None") {
          e = node(ExprKind::Literal, t.pos);
          e->value = Value::none();
        } else {
          e = node(ExprKind::Name, t.pos);
          e->name = t.text;
        }
        advance();
        return e;
      case TokenType::String: {
        e = node(ExprKind::Literal, t.pos);
        std::string s;
        while (cur().type == TokenType::String) {  // adjacent literals concatenate
          s += cur().text;
          advance();
        }
        e->value = Value::string(std::move(s));
        return e;
      }
      case TokenType::Int:
        e = node(ExprKind::Literal, t.pos);
        e->value = Value::integer(t.int_value);
        advance();
        return e;
      case TokenType::Float:
        e = node(ExprKind::Literal, t.pos);
        e->value = Value::number(t.float_value);
        advance();
        return e;
      case TokenType::Op:
        if (t.text == "(") {
          advance();
          e = parse_tuple(false, true, {}, true);
          expect_op(")");
          return e;
        }
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        break;
      default: break;
    }
    fail(fmt::format("unexpected '{}'", describe(t)));
  }

  ExprPtr parse_list() {
    auto e = node(ExprKind::List, cur().pos);
    expect_op("[");
    while (!is_op("]")) {
      if (!e->items.empty()) expect_op(",");
      if (is_op("]")) break;
      e->items.push_back(parse_expression());
    }
    advance();
    return seal(std::move(e));
  }

  ExprPtr parse_dict() {
    auto e = node(ExprKind::Dict, cur().pos);
    expect_op("{");
    while (!is_op("}")) {
      if (!e->items.empty()) expect_op(",");
      if (is_op("}")) break;
      e->items.push_back(parse_expression());
      expect_op(":");
      e->items.push_back(parse_expression());
    }
    advance();
    return seal(std::move(e));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".") || is_op("[")) e = parse_subscript(std::move(e));
      else if (is_op("(")) e = parse_call(std::move(e));
      else return e;
    }
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        advance();
        e = parse_filter(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    const SourcePos pos = cur().pos;
    if (is_op(".")) {
      advance();
      if (cur().type == TokenType::Name) {
        auto e = node(ExprKind::GetAttr, pos);
        e->obj = std::move(obj);
        e->name = cur().text;
        advance();
        return seal(std::move(e));
      }
      if (cur().type != TokenType::Int) fail("expected name or number");
      auto e = node(ExprKind::GetItem, pos);
      e->obj = std::move(obj);
      auto lit = node(ExprKind::Literal, cur().pos);
      lit->value = Value::integer(cur().int_value);
      e->items.push_back(std::move(lit));
      advance();
      return seal(std::move(e));
    }
    expect_op("[");
    std::vector<ExprPtr> args;
    ExprPtr slice;
    while (!is_op("]")) {
      if (!args.empty() || slice) expect_op(",");
      ExprPtr start;
      if (!is_op(":")) {
        start = parse_expression();
        if (!is_op(":")) {
          args.push_back(std::move(start));
          continue;
        }
      }
      // a slice: [start]:[stop][:[step]]
      if (slice || !args.empty()) fail("multi-dimensional subscripts are not supported");
      slice = node(ExprKind::Slice, pos);
      slice->obj = std::move(obj);
      advance();  // ':'
      slice->items.push_back(std::move(start));
      slice->items.push_back((is_op(":") || is_op("]") || is_op(",")) ? nullptr : parse_expression());
      if (is_op(":")) {
        advance();
        slice->items.push_back((is_op("]") || is_op(",")) ? nullptr : parse_expression());
      } else {
        slice->items.push_back(nullptr);
      }
    }
    advance();  // ']'
    if (slice) {
      if (!args.empty()) fail("multi-dimensional subscripts are not supported");
      return seal(std::move(slice));
    }
    if (args.empty()) fail("expected subscript expression");
    auto e = node(ExprKind::GetItem, pos);
    e->obj = std::move(obj);
    if (args.size() == 1) {
      e->items.push_back(std::move(args[0]));
    } else {
      auto tup = node(ExprKind::Tuple, pos);
      tup->items = std::move(args);
      e->items.push_back(seal(std::move(tup)));
    }
    return seal(std::move(e));
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool require_comma = false;
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
      if (cur().type == TokenType::Name && peek().type == TokenType::Op && peek().text == "=") {
        std::string key = cur().text;
        advance();
        advance();
        e.kwargs.emplace_back(std::move(key), parse_expression());
      } else {
        if (!e.kwargs.empty()) fail("invalid syntax for function call expression");
        e.items.push_back(parse_expression());
      }
      require_comma = true;
    }
    advance();
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = node(ExprKind::Call, cur().pos);
    e->obj = std::move(callee);
    parse_call_args(*e);
    return seal(std::move(e));
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (is_op(".")) {
      advance();
      name += "." + expect_name();
    }
    return name;
  }

  // After "|" (or the first filter of a {% filter %} block): name[(args)].
  ExprPtr parse_filter(ExprPtr obj) {
    auto e = node(ExprKind::Filter, cur().pos);
    e->obj = std::move(obj);
    e->name = dotted_name();
    if (is_op("(")) parse_call_args(*e);
    return seal(std::move(e));
  }

  ExprPtr parse_test(ExprPtr obj) {
    auto e = node(ExprKind::Test, cur().pos);
    advance();  // "is"
    if (is_name("not")) {
      advance();
      e->negated = true;
    }
    e->obj = std::move(obj);
    e->name = dotted_name();
    const Token& t = cur();
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((t.type == TokenType::Name || t.type == TokenType::String || t.type == TokenType::Int ||
                t.type == TokenType::Float || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("You cannot chain multiple tests with is");
      e->items.push_back(parse_postfix(parse_primary()));
    }
    return seal(std::move(e));
  }
};

}  // namespace

std::unique_ptr<TemplateAst> parse_template(std::string_view source) { return Parser(source).run(); }

}  // namespace dhs::jinja
