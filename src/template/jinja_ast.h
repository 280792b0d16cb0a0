// Syntax tree of the chat-template interpreter: expressions and statements as
// jinja2's parser builds them (same precedence, same node set minus template
// inheritance). Nodes are immutable after parsing; the interpreter walks them.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "template/jinja_lexer.h"
#include "template/jinja_value.h"

namespace dhs::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ExprKind {
  Literal,   // value
  Name,      // name
  List,      // items
  Tuple,     // items
  Dict,      // items as key, value, key, value, ...
  GetAttr,   // obj.name
  GetItem,   // obj[items[0]]
  Slice,     // obj[items[0]:items[1]:items[2]], null parts omitted
  Call,      // obj(items..., kwargs...)
  Filter,    // obj | name(items..., kwargs...); obj is null in {% filter %} blocks
  Test,      // obj is [not] name(items..., kwargs...)
  Not,       // not obj
  Neg,       // -obj
  Pos,       // +obj
  Binary,    // items[0] op items[1]: + - * / // % ** ~ and or
  Compare,   // obj op[0] items[0] op[1] items[1] ...: == != < <= > >= in notin
  Cond,      // items[0] if obj else items[1]; items[1] null when no else
};

struct Expr {
  ExprKind kind;
  SourcePos pos;
  // Levels of the tree below and including this node: the evaluator's recursion
  // depth over it, bounded by kMaxExprDepth at parse time.
  int height = 1;
  std::string name;                 // Name / GetAttr / Filter / Test name; Binary operator
  Value value;                      // Literal
  ExprPtr obj;                      // the operand the node applies to
  std::vector<ExprPtr> items;       // sub-expressions (see ExprKind)
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // Call / Filter / Test keywords
  std::vector<std::string> ops;     // Compare operators
  bool negated = false;             // Test: "is not"
};

// Left side of {% set %} and {% for %}: a name, a tuple of names, or ns.attr.
struct Target {
  enum class Kind { Name, Tuple, NsAttr };
  Kind kind = Kind::Name;
  std::vector<std::string> names;  // Name: 1; Tuple: n; NsAttr: the namespace variable
  std::string attr;                // NsAttr
};

enum class StmtKind {
  Text,         // text
  Print,        // {{ expr }}
  If,           // conds[i] -> bodies[i]; else_body
  For,          // for target in expr [if cond] body [else else_body]
  Set,          // set target = expr
  SetBlock,     // set target [| filters] ... endset
  Macro,        // macro name(params = defaults) body
  CallBlock,    // call[(params)] expr body endcall
  FilterBlock,  // filter filters body endfilter
  With,         // with params = defaults body endwith
  Break,
  Continue,
};

struct Stmt {
  StmtKind kind;
  SourcePos pos;
  std::string text;                 // Text; Macro name
  ExprPtr expr;                     // Print / For iterable / Set value / CallBlock call
  ExprPtr cond;                     // For filter
  Target target;                    // For / Set / SetBlock
  std::vector<ExprPtr> conds;       // If
  std::vector<Body> bodies;         // If
  Body body;
  Body else_body;                   // If / For
  std::vector<std::string> params;  // Macro / CallBlock / With
  std::vector<ExprPtr> defaults;    // parallel to params, null where none
  std::vector<ExprPtr> filters;     // SetBlock / FilterBlock: Filter nodes with null obj
};

struct TemplateAst {
  Body body;
};

}  // namespace dhs::jinja
