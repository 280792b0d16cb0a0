// Values of the chat-template interpreter: Python's object model reduced to what
// chat templates see (None, bool, int, float, str, list, tuple, dict, jinja2's
// namespace, callables) plus jinja2's default Undefined. str(), repr(), ==, <
// and json.dumps() follow CPython, because outputs must match jinja2 byte for byte.
// Copies and new values count against the running render's budget (jinja_limits.h).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "template/jinja_limits.h"

namespace dhs::jinja {

class Interpreter;
class Value;
struct Array;
struct Object;
struct Function;

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Tuple, Dict, Namespace, Function };

// Arguments of a call, Python-style: positional then keyword.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

using NativeFn = std::function<Value(Interpreter&, CallArgs&)>;

class Value {
 public:
  Value() = default;  // undefined, with no name
  // A copy costs its bytes in the running render's budget (a string copies its text);
  // moves are free. Values are copied freely (scope lookups, arguments), so this is
  // where a template that re-reads a huge string in a loop runs out of budget.
  Value(const Value& o) : kind_(o.charge_copy()), v_(o.v_) {}
  Value& operator=(const Value& o) {
    if (this != &o) {
      kind_ = o.charge_copy();
      v_ = o.v_;
    }
    return *this;
  }
  Value(Value&&) noexcept = default;
  Value& operator=(Value&&) noexcept = default;
  ~Value() = default;
  // why: the message jinja2 would raise when the value is used ("'foo' is undefined").
  static Value undefined(std::string why);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double d);
  static Value string(std::string s);
  static Value list(std::vector<Value> items = {});
  static Value tuple(std::vector<Value> items);
  static Value dict();
  static Value make_namespace();
  static Value function(std::string name, NativeFn fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }  // not bool
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const { return kind_ == Kind::Bool || kind_ == Kind::Int || kind_ == Kind::Float; }
  bool is_integral() const { return kind_ == Kind::Bool || kind_ == Kind::Int; }  // Python int (bool included)
  bool is_string() const { return kind_ == Kind::String; }
  bool is_array() const { return kind_ == Kind::List || kind_ == Kind::Tuple; }
  bool is_tuple() const { return kind_ == Kind::Tuple; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_namespace() const { return kind_ == Kind::Namespace; }
  bool is_function() const { return kind_ == Kind::Function; }
  // Holds a shared container (list, tuple, dict, namespace or callable).
  bool is_shared() const { return kind_ >= Kind::List; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const;   // bool or int
  double as_float() const;  // bool, int or float
  const std::string& str() const { return std::get<std::string>(v_); }  // string, or undefined's why
  Array& array() const { return *std::get<std::shared_ptr<Array>>(v_); }
  Object& object() const { return *std::get<std::shared_ptr<Object>>(v_); }
  Function& function() const { return *std::get<std::shared_ptr<Function>>(v_); }
  // Identity, for namespaces and functions (Python's `is`).
  const void* identity() const;

 private:
  Kind charge_copy() const {
    if (RenderBudget* b = t_render_budget) {
      const auto* s = std::get_if<std::string>(&v_);
      b->bytes(static_cast<int64_t>(sizeof(Value) + (s ? s->size() : 0)));
    }
    return kind_;
  }

  Kind kind_ = Kind::Undefined;
  // Undefined keeps its message in the string alternative (empty by default).
  std::variant<std::string, bool, int64_t, double, std::shared_ptr<Array>, std::shared_ptr<Object>,
               std::shared_ptr<Function>>
      v_;
};

// Containers destroy what they hold iteratively (see release_nested in
// jinja_value.cpp): a list nested a million levels deep, built by a loop, would
// otherwise recurse once per level in its destructor and overflow the stack.
struct Array {
  std::vector<Value> items;
  Array() = default;
  explicit Array(std::vector<Value> v) : items(std::move(v)) {}
  Array(const Array&) = delete;
  Array& operator=(const Array&) = delete;
  ~Array();
};

// A dict (or namespace): insertion-ordered like Python's. Lookup is linear,
// which is fine for chat messages and tool schemas (a handful of keys); it is
// charged to the render's step budget so that a huge dict cannot make it quadratic for free.
struct Object {
  std::vector<std::pair<Value, Value>> items;
  Object() = default;
  Object(const Object&) = delete;
  Object& operator=(const Object&) = delete;
  ~Object();
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);
};

struct Function {
  std::string name;
  NativeFn fn;
};

bool truthy(const Value& v);          // Python bool(); undefined is false
std::string to_str(const Value& v);   // Python str(); undefined is ""
std::string repr(const Value& v);     // Python repr()
std::string type_name(const Value& v);  // Python type name, for error messages
std::string float_repr(double d);     // Python repr(float)
bool py_eq(const Value& a, const Value& b);
bool py_lt(const Value& a, const Value& b);  // throws JinjaError on unorderable types
// The items a for loop, list() or join see: list/tuple items, dict keys, the
// code points of a string, nothing for undefined. Throws on other types.
std::vector<Value> iterate(const Value& v);
// len(); throws on types without a length.
int64_t py_len(const Value& v);
// Raises jinja2's UndefinedError for an operation on undefined.
[[noreturn]] void fail_undefined(const Value& v);

struct JsonStyle {
  int indent = -1;                 // < 0: one line
  std::string indent_str;          // used instead of spaces when set (json.dumps(indent="\t"))
  std::string item_sep = ", ";     // json.dumps separators; (",", ": ") when indenting
  std::string key_sep = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;       // transformers' tojson default
};
// json.dumps(v); throws JinjaError for values JSON cannot hold (undefined, callables).
std::string to_json(const Value& v, const JsonStyle& style);
Value from_json(const nlohmann::ordered_json& j);

}  // namespace dhs::jinja
