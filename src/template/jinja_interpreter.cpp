// Tree-walking evaluator of the chat-template interpreter (see jinja_interpreter.h).
// Expression semantics are Python's, as jinja2 compiles templates to Python:
// `and`/`or` return an operand, `/` is true division, `//` and `%` floor,
// comparisons chain, and operations on undefined raise (except printing it,
// testing it, iterating it and passing it to |default).
#include "template/jinja_interpreter.h"

#include <cmath>
#include <iterator>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"
#include "template/jinja_builtins.h"
#include "template/jinja_text.h"

namespace dhs::jinja {

const Value* Scope::lookup(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent.get()) {
    const auto it = s->vars.find(name);
    if (it != s->vars.end()) return &it->second;
  }
  return nullptr;
}

Interpreter::Interpreter(std::function<std::tm()> clock, RenderLimits limits)
    : clock_(std::move(clock)), limits_(limits) {}

namespace {

[[noreturn]] void located(SourcePos pos, const std::string& msg) {
  throw Error(fmt::format("chat template error at line {}, column {}: {}", pos.line, pos.col, msg));
}

[[noreturn]] void bad_operands(const char* op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  throw JinjaError(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b)));
}

// Python ints do not overflow; ours are 64-bit and say so instead of wrapping.
int64_t add_i(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) throw JinjaError("integer overflow");
  return r;
}
int64_t sub_i(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) throw JinjaError("integer overflow");
  return r;
}
int64_t mul_i(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) throw JinjaError("integer overflow");
  return r;
}

// str * n and list * n, sized before anything is built.
Value repeat(const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    const size_t bytes = checked_mul(static_cast<uint64_t>(n), seq.str().size(), "string repetition");
    check_string_size(bytes, "string repetition");
    std::string out;
    out.reserve(bytes);
    for (int64_t i = 0; i < n && !seq.str().empty(); ++i) out += seq.str();
    return Value::string(std::move(out));
  }
  const auto& items = seq.array().items;
  if (!items.empty() && static_cast<uint64_t>(n) > max_list_items() / items.size())
    fail_list_size("list repetition", max_list_items() + 1);
  std::vector<Value> out;
  out.reserve(items.size() * static_cast<size_t>(items.empty() ? 0 : n));
  for (int64_t i = 0; i < n && !items.empty(); ++i) out.insert(out.end(), items.begin(), items.end());
  return seq.kind() == Kind::Tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

int64_t floor_div(int64_t a, int64_t b) {
  if (b == 0) throw JinjaError("integer division or modulo by zero");
  if (a == INT64_MIN && b == -1) throw JinjaError("integer overflow");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t floor_mod(int64_t a, int64_t b) {
  if (b == 0) throw JinjaError("integer division or modulo by zero");
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

double float_mod(double a, double b) {
  if (b == 0.0) throw JinjaError("float modulo");
  double r = std::fmod(a, b);
  if (r != 0.0 && ((r < 0) != (b < 0))) r += b;
  else if (r == 0.0) r = std::copysign(0.0, b);
  return r;
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::String:
      if (!item.is_string())
        throw JinjaError(fmt::format("'in <string>' requires string as left operand, not {}", type_name(item)));
      return find_sub(container.str(), item.str(), 0) != std::string::npos;
    case Kind::List:
    case Kind::Tuple:
      charge_steps(static_cast<int64_t>(container.array().items.size() / 4 + 1));
      for (const auto& x : container.array().items)
        if (py_eq(x, item)) return true;
      return false;
    case Kind::Dict:
      if (item.kind() == Kind::List || item.is_dict())
        throw JinjaError(fmt::format("unhashable type: '{}'", type_name(item)));
      return container.object().find(item) != nullptr;
    case Kind::Undefined: return false;
    default: throw JinjaError(fmt::format("argument of type '{}' is not iterable", type_name(container)));
  }
}

std::optional<int64_t> slice_bound(const Value& v) {
  if (v.is_none()) return std::nullopt;
  if (!v.is_integral()) throw JinjaError("slice indices must be integers or None or have an __index__ method");
  return v.as_int();
}

// Calls f(i) for i = start, start + step, ... while before stop (Python's slice walk),
// without overflowing on a huge step.
template <class F>
void for_slice(int64_t start, int64_t stop, int64_t step, F&& f) {
  const uint64_t ustep = step > 0 ? static_cast<uint64_t>(step) : static_cast<uint64_t>(-(step + 1)) + 1;
  for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
    f(i);
    const uint64_t room = step > 0 ? static_cast<uint64_t>(stop - i) : static_cast<uint64_t>(i - stop);
    if (room <= ustep) break;
    i += step;
  }
}

}  // namespace

Interpreter::Nest::Nest(Interpreter& in) : in_(in) {
  if (in.depth_ >= in.limits_.max_eval_depth)
    throw JinjaError(fmt::format("template nested more than {} levels deep (statements, expressions and macro calls)",
                                 in.limits_.max_eval_depth));
  ++in.depth_;
  charge_steps(1);
}

std::string Interpreter::render(const TemplateAst& ast, const Value& context) {
  DHS_ASSERT(context.is_dict());
  call_depth_ = 0;
  depth_ = 0;
  loop_iterations_ = 0;
  RenderBudget budget(limits_);
  // Cleanup runs after every value of the render is gone or unreachable: macro
  // closures and namespaces may hold themselves (a macro stored in the scope it
  // closes over, ns.self = ns), so clearing them breaks the cycles.
  struct Cleanup {
    std::vector<ScopePtr>& scopes;
    RenderBudget& budget;
    ~Cleanup() {
      for (auto& s : scopes) s->vars.clear();
      scopes.clear();
      for (auto& ns : budget.namespaces) {
        auto items = std::move(ns->items);
        ns->items.clear();
      }
    }
  } cleanup{closures_, budget};
  const BudgetScope counting(budget);
  auto globals = std::make_shared<Scope>();
  add_globals(globals->vars);
  auto top = std::make_shared<Scope>();
  top->parent = globals;
  for (const auto& [k, v] : context.object().items) top->vars[to_str(k)] = v;
  std::string out;
  exec(ast.body, top, out);
  return out;
}

void Interpreter::append(std::string& out, std::string_view s) {
  if (out.size() + s.size() > limits_.max_output_bytes)
    throw JinjaError(fmt::format("output exceeds {} bytes", limits_.max_output_bytes));
  out += s;
}

Interpreter::Flow Interpreter::exec(const Body& body, const ScopePtr& scope, std::string& out) {
  for (const auto& s : body) {
    Flow f;
    try {
      f = exec_stmt(*s, scope, out);
    } catch (const JinjaError& e) {
      located(s->pos, e.what());
    }
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec_stmt(const Stmt& s, const ScopePtr& scope, std::string& out) {
  const Nest nest(*this);
  switch (s.kind) {
    case StmtKind::Text: append(out, s.text); return Flow::Normal;
    case StmtKind::Print: {
      const Value v = eval(*s.expr, scope);
      if (v.is_string()) append(out, v.str());
      else append(out, to_str(v));
      return Flow::Normal;
    }
    case StmtKind::If:
      for (size_t i = 0; i < s.conds.size(); ++i)
        if (truthy(eval(*s.conds[i], scope))) return exec(s.bodies[i], scope, out);
      return exec(s.else_body, scope, out);
    case StmtKind::For: exec_for(s, scope, out); return Flow::Normal;
    case StmtKind::Set: assign(s.target, eval(*s.expr, scope), *scope, scope); return Flow::Normal;
    case StmtKind::SetBlock: {
      std::string buf;
      exec(s.body, scope, buf);
      assign(s.target, apply_filters(s.filters, Value::string(std::move(buf)), scope), *scope, scope);
      return Flow::Normal;
    }
    case StmtKind::Macro: scope->vars[s.text] = make_macro(s, scope); return Flow::Normal;
    case StmtKind::CallBlock: {
      // The body becomes `caller`, a macro the called macro can invoke.
      const Expr& call = *s.expr;
      Value callee = eval(*call.obj, scope);
      CallArgs args;
      eval_args(call, scope, args);
      args.kw.emplace_back("caller", make_macro(s, scope));
      append(out, to_str(this->call(callee, args)));
      return Flow::Normal;
    }
    case StmtKind::FilterBlock: {
      std::string buf;
      exec(s.body, scope, buf);
      append(out, to_str(apply_filters(s.filters, Value::string(std::move(buf)), scope)));
      return Flow::Normal;
    }
    case StmtKind::With: {
      auto inner = std::make_shared<Scope>();
      inner->parent = scope;
      for (size_t i = 0; i < s.params.size(); ++i) inner->vars[s.params[i]] = eval(*s.defaults[i], scope);
      return exec(s.body, inner, out);
    }
    case StmtKind::Break: return Flow::Break;
    case StmtKind::Continue: return Flow::Continue;
  }
  return Flow::Normal;
}

void Interpreter::exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
  const Value seq = eval(*s.expr, scope);
  std::vector<Value> items = iterate(seq);
  if (s.cond) {  // "for x in xs if cond": filter first, so loop.* counts kept items
    std::vector<Value> kept;
    for (auto& item : items) {
      auto probe = std::make_shared<Scope>();
      probe->parent = scope;
      assign(s.target, item, *probe, probe);
      if (truthy(eval(*s.cond, probe))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    exec(s.else_body, scope, out);
    return;
  }
  const int64_t n = static_cast<int64_t>(items.size());
  // One loop object per loop, updated in place each iteration (jinja2's LoopContext
  // is one object too): building a fresh 12-entry dict was most of an iteration's cost.
  enum { kIndex, kIndex0, kRevindex, kRevindex0, kFirst, kLast, kLength, kDepth, kDepth0, kPrev, kNext, kCycle };
  static constexpr const char* kKeys[] = {"index", "index0", "revindex", "revindex0", "first", "last",
                                          "length", "depth", "depth0", "previtem", "nextitem", "cycle"};
  auto index0 = std::make_shared<int64_t>(0);
  Value loop = Value::dict();
  auto& o = loop.object().items;
  o.reserve(std::size(kKeys));
  for (const char* k : kKeys) o.emplace_back(Value::string(k), Value());
  o[kLength].second = Value::integer(n);
  o[kDepth].second = Value::integer(1);
  o[kDepth0].second = Value::integer(0);
  o[kPrev].second = Value::undefined("there is no previous item");
  o[kCycle].second = Value::function("loop.cycle", [index0](Interpreter&, CallArgs& a) {
    if (a.pos.empty()) throw JinjaError("no items for cycling given");
    return a.pos[static_cast<size_t>(*index0) % a.pos.size()];
  });
  for (int64_t i = 0; i < n; ++i) {
    if (++loop_iterations_ > limits_.max_loop_iterations)
      throw JinjaError(fmt::format("more than {} loop iterations", limits_.max_loop_iterations));
    charge_steps(4);  // a fresh scope: a few allocations
    auto body_scope = std::make_shared<Scope>();
    body_scope->parent = scope;
    assign(s.target, items[i], *body_scope, body_scope);
    *index0 = i;
    o[kIndex].second = Value::integer(i + 1);
    o[kIndex0].second = Value::integer(i);
    o[kRevindex].second = Value::integer(n - i);
    o[kRevindex0].second = Value::integer(n - i - 1);
    o[kFirst].second = Value::boolean(i == 0);
    o[kLast].second = Value::boolean(i == n - 1);
    if (i > 0) o[kPrev].second = items[i - 1];
    o[kNext].second = i + 1 < n ? items[i + 1] : Value::undefined("there is no next item");
    body_scope->vars["loop"] = loop;
    if (exec(s.body, body_scope, out) == Flow::Break) break;
  }
}

void Interpreter::assign(const Target& t, Value v, Scope& scope, const ScopePtr& lookup_from) {
  switch (t.kind) {
    case Target::Kind::Name: scope.vars[t.names[0]] = std::move(v); return;
    case Target::Kind::Tuple: {
      std::vector<Value> parts = iterate(v);
      if (parts.size() < t.names.size())
        throw JinjaError(fmt::format("not enough values to unpack (expected {}, got {})", t.names.size(), parts.size()));
      if (parts.size() > t.names.size())
        throw JinjaError(fmt::format("too many values to unpack (expected {})", t.names.size()));
      for (size_t i = 0; i < parts.size(); ++i) scope.vars[t.names[i]] = std::move(parts[i]);
      return;
    }
    case Target::Kind::NsAttr: {
      const Value* ns = lookup_from->lookup(t.names[0]);
      if (!ns || !ns->is_namespace()) throw JinjaError("cannot assign attribute on non-namespace object");
      ns->object().set(Value::string(t.attr), std::move(v));
      return;
    }
  }
}

Value Interpreter::make_macro(const Stmt& s, const ScopePtr& scope) {
  const Stmt* def = &s;
  ScopePtr closure = scope;
  closures_.push_back(scope);
  const std::string name = s.kind == StmtKind::Macro ? s.text : "caller";
  return Value::function(name, [def, closure, name](Interpreter& in, CallArgs& a) {
    if (in.call_depth_ >= in.limits_.max_call_depth)
      throw JinjaError(fmt::format("macro '{}' nested more than {} calls deep", name, in.limits_.max_call_depth));
    const Nest nest(in);
    if (a.pos.size() > def->params.size())
      throw JinjaError(fmt::format("macro '{}' takes not more than {} argument(s)", name, def->params.size()));
    auto local = std::make_shared<Scope>();
    local->parent = closure;
    std::vector<bool> bound(def->params.size(), false);
    for (size_t i = 0; i < a.pos.size(); ++i) {
      local->vars[def->params[i]] = a.pos[i];
      bound[i] = true;
    }
    for (auto& [k, v] : a.kw) {
      size_t i = 0;
      while (i < def->params.size() && def->params[i] != k) ++i;
      if (i < def->params.size()) {
        if (bound[i]) throw JinjaError(fmt::format("macro '{}' got multiple values for argument '{}'", name, k));
        bound[i] = true;
        local->vars[k] = v;
      } else if (k == "caller") {
        local->vars[k] = v;
      } else {
        throw JinjaError(fmt::format("macro '{}' takes no keyword argument '{}'", name, k));
      }
    }
    for (size_t i = 0; i < def->params.size(); ++i) {
      if (bound[i]) continue;
      local->vars[def->params[i]] = def->defaults[i]
                                        ? in.eval(*def->defaults[i], local)
                                        : Value::undefined(fmt::format("'{}' is undefined", def->params[i]));
    }
    struct DepthGuard {
      int& d;
      explicit DepthGuard(int& depth) : d(depth) { ++d; }
      ~DepthGuard() { --d; }
    } guard(in.call_depth_);
    std::string buf;
    in.exec(def->body, local, buf);
    return Value::string(std::move(buf));
  });
}

Value Interpreter::apply_filters(const std::vector<ExprPtr>& filters, Value v, const ScopePtr& scope) {
  for (const auto& f : filters) {
    CallArgs args;
    eval_args(*f, scope, args);
    v = filter(f->name, v, args);
  }
  return v;
}

Value Interpreter::call(const Value& fn, CallArgs& args) {
  if (fn.is_undefined()) fail_undefined(fn);
  if (!fn.is_function()) throw JinjaError(fmt::format("'{}' object is not callable", type_name(fn)));
  return fn.function().fn(*this, args);
}

Value Interpreter::filter(const std::string& name, const Value& v, CallArgs& args) {
  return apply_filter(*this, name, v, args);
}

bool Interpreter::test(const std::string& name, const Value& v, CallArgs& args) {
  return apply_test(*this, name, v, args);
}

Value Interpreter::get_attr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Kind::Undefined: fail_undefined(obj);
    case Kind::Dict: {
      Value m = get_method(obj, name);
      if (!m.is_undefined()) return m;
      if (const Value* v = obj.object().find(name)) return *v;
      return Value::undefined(fmt::format("'dict object' has no attribute '{}'", name));
    }
    case Kind::Namespace:
      if (const Value* v = obj.object().find(name)) return *v;
      return Value::undefined(fmt::format("'Namespace object' has no attribute '{}'", name));
    case Kind::String:
    case Kind::List:
    case Kind::Tuple: {
      Value m = get_method(obj, name);
      if (!m.is_undefined()) return m;
      break;
    }
    default: break;
  }
  return Value::undefined(fmt::format("'{} object' has no attribute '{}'", type_name(obj), name));
}

Value Interpreter::get_item(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Kind::Undefined: fail_undefined(obj);
    case Kind::Dict:
      if (const Value* v = obj.object().find(key)) return *v;
      break;
    case Kind::List:
    case Kind::Tuple:
    case Kind::String:
      if (key.is_integral()) {
        int64_t i = key.as_int();
        if (obj.is_string()) {
          // Walk to the code point instead of indexing all of them (8 bytes each).
          const std::string& str = obj.str();
          size_t b = 0;
          if (i >= 0) {
            for (int64_t k = 0; k < i && b < str.size(); ++k) utf8_next(str, b);
          } else {
            const uint64_t back = static_cast<uint64_t>(-(i + 1)) + 1;  // -i, even for INT64_MIN
            uint64_t k = 0;
            b = str.size();
            for (; k < back && b > 0; ++k) b = utf8_prev(str, b);
            if (k < back) b = str.size();  // ran out: out of range
          }
          if (b < str.size()) {
            size_t e = b;
            utf8_next(str, e);
            return Value::string(str.substr(b, e - b));
          }
        } else {
          const auto& items = obj.array().items;
          const int64_t n = static_cast<int64_t>(items.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return items[static_cast<size_t>(i)];
        }
        return Value::undefined(fmt::format("{} object has no element {}", type_name(obj), key.as_int()));
      }
      break;
    default: break;
  }
  // jinja2 falls back to attribute lookup for string keys.
  if (key.is_string()) return get_attr(obj, key.str());
  return Value::undefined(fmt::format("'{} object' has no item {}", type_name(obj), repr(key)));
}

void Interpreter::eval_args(const Expr& e, const ScopePtr& scope, CallArgs& args) {
  for (const auto& a : e.items) args.pos.push_back(eval(*a, scope));
  for (const auto& [k, a] : e.kwargs) args.kw.emplace_back(k, eval(*a, scope));
}

Value Interpreter::eval(const Expr& e, const ScopePtr& scope) {
  try {
    const Nest nest(*this);
    return eval_impl(e, scope);
  } catch (const JinjaError& err) {
    located(e.pos, err.what());
  }
}

Value Interpreter::eval_impl(const Expr& e, const ScopePtr& scope) {
  switch (e.kind) {
    case ExprKind::Literal: return e.value;
    case ExprKind::Name: {
      if (const Value* v = scope->lookup(e.name)) return *v;
      return Value::undefined(fmt::format("'{}' is undefined", e.name));
    }
    case ExprKind::List:
    case ExprKind::Tuple: {
      std::vector<Value> items;
      items.reserve(e.items.size());
      for (const auto& x : e.items) items.push_back(eval(*x, scope));
      return e.kind == ExprKind::List ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case ExprKind::Dict: {
      Value d = Value::dict();
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) d.object().set(eval(*e.items[i], scope), eval(*e.items[i + 1], scope));
      return d;
    }
    case ExprKind::GetAttr: return get_attr(eval(*e.obj, scope), e.name);
    case ExprKind::GetItem: {
      Value obj = eval(*e.obj, scope);
      return get_item(obj, eval(*e.items[0], scope));
    }
    case ExprKind::Slice: return eval_slice(e, scope);
    case ExprKind::Call:
    case ExprKind::Filter:
    case ExprKind::Test: return eval_call(e, scope);
    case ExprKind::Not: return Value::boolean(!truthy(eval(*e.obj, scope)));
    case ExprKind::Neg:
    case ExprKind::Pos: {
      const Value v = eval(*e.obj, scope);
      if (v.is_undefined()) fail_undefined(v);
      if (e.kind == ExprKind::Pos && v.is_number()) return v.is_bool() ? Value::integer(v.as_int()) : v;
      if (v.is_integral()) return Value::integer(sub_i(0, v.as_int()));
      if (v.is_float()) return Value::number(-v.as_float());
      throw JinjaError(fmt::format("bad operand type for unary {}: '{}'", e.kind == ExprKind::Neg ? '-' : '+', type_name(v)));
    }
    case ExprKind::Binary: return eval_binary(e, scope);
    case ExprKind::Compare: return eval_compare(e, scope);
    case ExprKind::Cond:
      if (truthy(eval(*e.obj, scope))) return eval(*e.items[0], scope);
      if (e.items[1]) return eval(*e.items[1], scope);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
  }
  return Value();
}

Value Interpreter::eval_call(const Expr& e, const ScopePtr& scope) {
  Value v = eval(*e.obj, scope);
  CallArgs args;
  eval_args(e, scope, args);
  if (e.kind == ExprKind::Call) return call(v, args);
  if (e.kind == ExprKind::Filter) return filter(e.name, v, args);
  return Value::boolean(test(e.name, v, args) != e.negated);
}

Value Interpreter::eval_slice(const Expr& e, const ScopePtr& scope) {
  const Value obj = eval(*e.obj, scope);
  if (obj.is_undefined()) fail_undefined(obj);
  std::optional<int64_t> b, en, st;
  if (e.items[0]) b = slice_bound(eval(*e.items[0], scope));
  if (e.items[1]) en = slice_bound(eval(*e.items[1], scope));
  if (e.items[2]) st = slice_bound(eval(*e.items[2], scope));
  if (!obj.is_string() && !obj.is_array()) throw JinjaError(fmt::format("'{}' object is not subscriptable", type_name(obj)));
  const int64_t len = obj.is_string() ? static_cast<int64_t>(utf8_length(obj.str()))
                                      : static_cast<int64_t>(obj.array().items.size());
  // Python's slice.indices()
  const int64_t step = st.value_or(1);
  if (step == 0) throw JinjaError("slice step cannot be zero");
  const int64_t lower = step < 0 ? -1 : 0, upper = step < 0 ? len - 1 : len;
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) x += len;
    return x < lower ? lower : x > upper ? upper : x;
  };
  const int64_t start = clamp(b, step < 0 ? upper : lower), stop = clamp(en, step < 0 ? lower : upper);
  if (obj.is_string()) {
    // Code points are walked to, not indexed (an index of a long string is 8 bytes per
    // code point); `at` is the byte offset of code point `at_i`.
    const std::string& str = obj.str();
    std::string out;
    int64_t at_i = start;
    size_t at = start >= 0 ? utf8_byte_at(str, start) : 0;
    for_slice(start, stop, step, [&](int64_t i) {
      if (step > 0) {
        for (; at_i < i; ++at_i) utf8_next(str, at);
      } else {
        for (; at_i > i; --at_i) at = utf8_prev(str, at);
      }
      size_t end = at;
      utf8_next(str, end);
      out.append(str, at, end - at);
    });
    return Value::string(std::move(out));
  }
  std::vector<Value> out;
  for_slice(start, stop, step, [&](int64_t i) { out.push_back(obj.array().items[static_cast<size_t>(i)]); });
  return obj.kind() == Kind::Tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

Value Interpreter::eval_binary(const Expr& e, const ScopePtr& scope) {
  const std::string& op = e.name;
  Value a = eval(*e.items[0], scope);
  if (op == "and") return truthy(a) ? eval(*e.items[1], scope) : a;
  if (op == "or") return truthy(a) ? a : eval(*e.items[1], scope);
  const Value b = eval(*e.items[1], scope);
  if (op == "~") {
    std::string s = to_str(a);
    const std::string t = to_str(b);
    check_string_size(s.size() + t.size(), "string concatenation");
    s += t;
    return Value::string(std::move(s));
  }
  const bool ints = a.is_integral() && b.is_integral();
  const bool nums = a.is_number() && b.is_number();
  if (op == "+") {
    if (ints) return Value::integer(add_i(a.as_int(), b.as_int()));
    if (nums) return Value::number(a.as_float() + b.as_float());
    if (a.is_string() && b.is_string()) {
      check_string_size(a.str().size() + b.str().size(), "string concatenation");
      return Value::string(a.str() + b.str());
    }
    if (a.is_array() && a.kind() == b.kind()) {
      check_list_size(a.array().items.size() + b.array().items.size(), "list concatenation");
      std::vector<Value> items = a.array().items;
      items.insert(items.end(), b.array().items.begin(), b.array().items.end());
      return a.kind() == Kind::Tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    bad_operands("+", a, b);
  }
  if (op == "-") {
    if (ints) return Value::integer(sub_i(a.as_int(), b.as_int()));
    if (nums) return Value::number(a.as_float() - b.as_float());
    bad_operands("-", a, b);
  }
  if (op == "*") {
    if (ints) return Value::integer(mul_i(a.as_int(), b.as_int()));
    if (nums) return Value::number(a.as_float() * b.as_float());
    if ((a.is_string() || a.is_array()) && b.is_integral()) return repeat(a, b.as_int());
    if ((b.is_string() || b.is_array()) && a.is_integral()) return repeat(b, a.as_int());
    bad_operands("*", a, b);
  }
  if (op == "/") {
    if (!nums) bad_operands("/", a, b);
    if (b.as_float() == 0.0) throw JinjaError("division by zero");
    return Value::number(a.as_float() / b.as_float());
  }
  if (op == "//") {
    if (ints) return Value::integer(floor_div(a.as_int(), b.as_int()));
    if (!nums) bad_operands("//", a, b);
    if (b.as_float() == 0.0) throw JinjaError("float floor division by zero");
    return Value::number(std::floor(a.as_float() / b.as_float()));
  }
  if (op == "%") {
    if (ints) return Value::integer(floor_mod(a.as_int(), b.as_int()));
    if (nums) return Value::number(float_mod(a.as_float(), b.as_float()));
    if (a.is_string()) return percent_format(a.str(), b);
    bad_operands("%", a, b);
  }
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      int64_t base = a.as_int(), exp = b.as_int(), acc = 1;
      while (exp > 0) {
        if (exp & 1) acc = mul_i(acc, base);
        exp >>= 1;
        if (exp > 0) base = mul_i(base, base);
      }
      return Value::integer(acc);
    }
    if (nums) {
      if (a.as_float() == 0.0 && b.as_float() < 0) throw JinjaError("0.0 cannot be raised to a negative power");
      return Value::number(std::pow(a.as_float(), b.as_float()));
    }
    bad_operands("**", a, b);
  }
  throw JinjaError(fmt::format("unknown operator '{}'", op));
}

Value Interpreter::eval_compare(const Expr& e, const ScopePtr& scope) {
  Value left = eval(*e.obj, scope);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.items[i], scope);
    const std::string& op = e.ops[i];
    bool ok;
    if (op == "==") ok = py_eq(left, right);
    else if (op == "!=") ok = !py_eq(left, right);
    else if (op == "<") ok = py_lt(left, right);
    else if (op == "<=") ok = py_lt(left, right) || py_eq(left, right);
    else if (op == ">") ok = py_lt(right, left);
    else if (op == ">=") ok = py_lt(right, left) || py_eq(left, right);
    else if (op == "in") ok = contains(right, left);
    else ok = !contains(right, left);  // notin
    if (!ok) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

}  // namespace dhs::jinja
