// Tree-walking evaluator of the chat-template interpreter: runs a parsed
// template against a context with jinja2's scoping (a for-loop body and a
// macro get their own scope, if-blocks do not; namespace() carries values out
// of loops) and bounded work: nesting depth, macro call depth, loop iterations,
// evaluation steps, bytes of values and output size (see jinja_limits.h).
#pragma once
#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "template/jinja_ast.h"
#include "template/jinja_limits.h"
#include "template/jinja_value.h"

namespace dhs::jinja {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
  const Value* lookup(const std::string& name) const;
};
using ScopePtr = std::shared_ptr<Scope>;

class Interpreter {
 public:
  // clock: what strftime_now() formats (local time in production, pinned in tests).
  Interpreter(std::function<std::tm()> clock, RenderLimits limits = {});

  // Renders `ast` with the variables of `context` (a dict). Throws dhs::Error.
  std::string render(const TemplateAst& ast, const Value& context);

  // For builtins: call a callable value, apply a filter or test by name.
  Value call(const Value& fn, CallArgs& args);
  Value filter(const std::string& name, const Value& v, CallArgs& args);
  bool test(const std::string& name, const Value& v, CallArgs& args);
  std::tm now() const { return clock_(); }
  // Python attribute / item access with jinja2's fallbacks (getattr then item, and back).
  Value get_attr(const Value& obj, const std::string& name);
  Value get_item(const Value& obj, const Value& key);

 private:
  enum class Flow { Normal, Break, Continue };

  // Counts one level of native recursion (a statement, an expression node, a macro
  // call) and one evaluation step; throws JinjaError past max_eval_depth.
  class Nest {
   public:
    explicit Nest(Interpreter& in);
    ~Nest() { --in_.depth_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    Interpreter& in_;
  };

  Flow exec(const Body& body, const ScopePtr& scope, std::string& out);
  Flow exec_stmt(const Stmt& s, const ScopePtr& scope, std::string& out);
  void exec_for(const Stmt& s, const ScopePtr& scope, std::string& out);
  void assign(const Target& t, Value v, Scope& scope, const ScopePtr& lookup_from);
  Value make_macro(const Stmt& s, const ScopePtr& scope);
  Value eval(const Expr& e, const ScopePtr& scope);
  Value eval_impl(const Expr& e, const ScopePtr& scope);
  // Kept out of eval_impl so that its locals do not widen every recursion frame.
  Value eval_binary(const Expr& e, const ScopePtr& scope);
  Value eval_compare(const Expr& e, const ScopePtr& scope);
  Value eval_slice(const Expr& e, const ScopePtr& scope);
  Value eval_call(const Expr& e, const ScopePtr& scope);
  void eval_args(const Expr& e, const ScopePtr& scope, CallArgs& args);
  Value apply_filters(const std::vector<ExprPtr>& filters, Value v, const ScopePtr& scope);
  void append(std::string& out, std::string_view s);

  std::function<std::tm()> clock_;
  RenderLimits limits_;
  int call_depth_ = 0;
  int depth_ = 0;  // see Nest
  int64_t loop_iterations_ = 0;
  // Scopes captured by macros. A macro stored in the scope it closes over is a
  // shared_ptr cycle; render() clears these scopes at the end to break it.
  std::vector<ScopePtr> closures_;
};

}  // namespace dhs::jinja
