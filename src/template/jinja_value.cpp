// Values of the chat-template interpreter (see jinja_value.h): construction,
// Python's str/repr/==/<, len and iteration, json.dumps and JSON import, and the
// render budget's bookkeeping (jinja_limits.h).
#include "template/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include <fmt/format.h>

#include "template/jinja_text.h"

namespace dhs::jinja {

constinit thread_local RenderBudget* t_render_budget = nullptr;

void RenderBudget::fail_steps() const {
  throw JinjaError(fmt::format("template exceeded its budget of {} evaluation steps", limits_.max_steps));
}
void RenderBudget::fail_bytes() const {
  throw JinjaError(fmt::format("template exceeded its budget of {} MiB of values created or copied",
                               limits_.max_work_bytes >> 20));
}
void fail_string_size(const char* what, size_t n) {
  throw JinjaError(fmt::format("{}: result of {} bytes exceeds the limit of {} bytes", what, n, max_string_bytes()));
}
void fail_list_size(const char* what, size_t n) {
  throw JinjaError(fmt::format("{}: result of {} items exceeds the limit of {} items", what, n, max_list_items()));
}

namespace {

// Shared containers met while a container is destroyed. The outermost destructor
// drains them one at a time, so nested containers die in a loop, not by recursion.
thread_local std::vector<Value>* t_dying = nullptr;

void release_nested(std::vector<Value>& held) noexcept {
  if (t_dying) {  // an outer destructor is draining: hand the containers over
    for (auto& v : held)
      if (v.is_shared()) t_dying->push_back(std::move(v));
    return;
  }
  std::vector<Value> dying;
  for (auto& v : held)
    if (v.is_shared()) dying.push_back(std::move(v));
  if (dying.empty()) return;
  t_dying = &dying;
  while (!dying.empty()) {
    // The last reference dies at the end of this block; its destructor pushes its own
    // containers onto `dying` instead of destroying them here.
    Value v = std::move(dying.back());
    dying.pop_back();
  }
  t_dying = nullptr;
}

}  // namespace

Array::~Array() { release_nested(items); }

Object::~Object() {
  std::vector<Value> held;
  for (auto& [k, v] : items) {
    if (k.is_shared()) held.push_back(std::move(k));
    if (v.is_shared()) held.push_back(std::move(v));
  }
  release_nested(held);
}

Value Value::undefined(std::string why) {
  Value v;
  v.v_ = std::move(why);
  return v;
}
Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::Bool;
  v.v_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::Int;
  v.v_ = i;
  return v;
}
Value Value::number(double d) {
  Value v;
  v.kind_ = Kind::Float;
  v.v_ = d;
  return v;
}
Value Value::string(std::string s) {
  if (RenderBudget* b = t_render_budget) {
    if (s.size() > b->limits().max_output_bytes) fail_string_size("string", s.size());
    b->bytes(static_cast<int64_t>(s.size()));
  }
  Value v;
  v.kind_ = Kind::String;
  v.v_ = std::move(s);
  return v;
}
Value Value::list(std::vector<Value> items) {
  Value v;
  if (RenderBudget* b = t_render_budget) {
    if (items.size() > b->limits().max_list_items) fail_list_size("list", items.size());
    b->bytes(static_cast<int64_t>(items.size() * sizeof(Value)));
  }
  v.kind_ = Kind::List;
  v.v_ = std::make_shared<Array>(std::move(items));
  return v;
}
Value Value::tuple(std::vector<Value> items) {
  Value v = list(std::move(items));
  v.kind_ = Kind::Tuple;
  return v;
}
Value Value::dict() {
  Value v;
  v.kind_ = Kind::Dict;
  v.v_ = std::make_shared<Object>();
  return v;
}
Value Value::make_namespace() {
  Value v = dict();
  v.kind_ = Kind::Namespace;
  if (RenderBudget* b = t_render_budget) b->namespaces.push_back(std::get<std::shared_ptr<Object>>(v.v_));
  return v;
}
Value Value::function(std::string name, NativeFn fn) {
  Value v;
  v.kind_ = Kind::Function;
  v.v_ = std::make_shared<Function>(Function{std::move(name), std::move(fn)});
  return v;
}

int64_t Value::as_int() const {
  if (kind_ == Kind::Bool) return std::get<bool>(v_) ? 1 : 0;
  return std::get<int64_t>(v_);
}

double Value::as_float() const {
  if (kind_ == Kind::Float) return std::get<double>(v_);
  return static_cast<double>(as_int());
}

const void* Value::identity() const {
  switch (kind_) {
    case Kind::List:
    case Kind::Tuple: return std::get<std::shared_ptr<Array>>(v_).get();
    case Kind::Dict:
    case Kind::Namespace: return std::get<std::shared_ptr<Object>>(v_).get();
    case Kind::Function: return std::get<std::shared_ptr<Function>>(v_).get();
    default: return nullptr;
  }
}

namespace {
// A step is about the cost of evaluating one expression node (~25 ns): some 4 key comparisons.
void charge_scan(size_t n) { charge_steps(static_cast<int64_t>(n / 4 + 1)); }
}  // namespace

const Value* Object::find(const Value& key) const {
  charge_scan(items.size());
  for (const auto& [k, v] : items)
    if (py_eq(k, key)) return &v;
  return nullptr;
}

const Value* Object::find(std::string_view key) const {
  charge_scan(items.size());
  for (const auto& [k, v] : items)
    if (k.is_string() && k.str() == key) return &v;
  return nullptr;
}

void Object::set(Value key, Value value) {
  charge_scan(items.size());
  charge_bytes(2 * sizeof(Value));
  for (auto& [k, v] : items) {
    if (py_eq(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return v.as_bool();
    case Kind::Int: return v.as_int() != 0;
    case Kind::Float: return v.as_float() != 0.0;
    case Kind::String: return !v.str().empty();
    case Kind::List:
    case Kind::Tuple: return !v.array().items.empty();
    case Kind::Dict: return !v.object().items.empty();
    case Kind::Namespace:
    case Kind::Function: return true;
  }
  return false;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, then CPython's layout: positional when the
  // decimal exponent is in [-4, 16), scientific otherwise.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string_view sci(buf, res.ptr - buf);
  std::string out;
  if (sci.front() == '-') {
    out += '-';
    sci.remove_prefix(1);
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e))
    if (c != '.') digits += c;
  int exp10 = 0;
  std::from_chars(sci.data() + e + 1 + (sci[e + 1] == '+' ? 1 : 0), sci.data() + sci.size(), exp10);
  const int decpt = exp10 + 1;  // value = 0.<digits> * 10^decpt
  const int n = static_cast<int>(digits.size());
  if (decpt > 16 || decpt < -3) {
    out += digits[0];
    if (n > 1) (out += '.') += digits.substr(1);
    out += fmt::format("e{}{:02d}", exp10 < 0 ? '-' : '+', std::abs(exp10));
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (decpt >= n) {
    out += digits;
    out.append(static_cast<size_t>(decpt - n), '0');
    out += ".0";
  } else {
    out += digits.substr(0, decpt);
    out += '.';
    out += digits.substr(decpt);
  }
  return out;
}

namespace {

// Values nest at most this deep (JSON input, lists built by a template); the
// recursive walks below would otherwise run off the stack.
constexpr int kMaxValueDepth = 512;

void check_depth(int depth) {
  if (depth > kMaxValueDepth) throw JinjaError(fmt::format("value nested more than {} levels deep", kMaxValueDepth));
}

void append_repr(std::string& out, const Value& v, int depth);

void append_str(std::string& out, const Value& v, int depth) {
  check_depth(depth);
  check_growth(out, "str()");  // each piece is bounded, so checking between pieces suffices
  switch (v.kind()) {
    case Kind::Undefined: return;
    case Kind::None: out += "None"; return;
    case Kind::Bool: out += v.as_bool() ? "True" : "False"; return;
    case Kind::Int: out += std::to_string(v.as_int()); return;
    case Kind::Float: out += float_repr(v.as_float()); return;
    case Kind::String:
      check_string_size(out.size() + v.str().size(), "str()");
      out += v.str();
      return;
    case Kind::List:
    case Kind::Tuple: {
      const auto& items = v.array().items;
      out += v.kind() == Kind::List ? '[' : '(';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        append_repr(out, items[i], depth + 1);
      }
      if (v.kind() == Kind::Tuple && items.size() == 1) out += ',';
      out += v.kind() == Kind::List ? ']' : ')';
      return;
    }
    case Kind::Dict:
    case Kind::Namespace: {
      if (v.is_namespace()) out += "<Namespace ";
      out += '{';
      bool first = true;
      for (const auto& [k, x] : v.object().items) {
        if (!first) out += ", ";
        first = false;
        append_repr(out, k, depth + 1);
        out += ": ";
        append_repr(out, x, depth + 1);
      }
      out += '}';
      if (v.is_namespace()) out += '>';
      return;
    }
    case Kind::Function: out += fmt::format("<function {}>", v.function().name); return;
  }
}

void append_repr(std::string& out, const Value& v, int depth) {
  if (v.is_string()) {
    check_string_size(out.size() + v.str().size(), "repr()");
    out += py_str_repr(v.str());
  }
  else if (v.is_undefined()) out += "Undefined";
  else append_str(out, v, depth);
}

bool eq_at(const Value& a, const Value& b, int depth);
bool lt_at(const Value& a, const Value& b, int depth);

}  // namespace

std::string to_str(const Value& v) {
  if (v.is_string()) return v.str();
  std::string out;
  append_str(out, v, 0);
  return out;
}

std::string repr(const Value& v) {
  std::string out;
  append_repr(out, v, 0);
  return out;
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return "list";
    case Kind::Tuple: return "tuple";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "Namespace";
    case Kind::Function: return "function";
  }
  return "object";
}

bool py_eq(const Value& a, const Value& b) { return eq_at(a, b, 0); }
bool py_lt(const Value& a, const Value& b) { return lt_at(a, b, 0); }

namespace {

bool eq_at(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    return a.as_float() == b.as_float();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String:
      // Equal lengths compare byte by byte: about a step per 16 bytes of memcmp.
      if (a.str().size() == b.str().size()) charge_bytes(a.str().size() / 16);
      return a.str() == b.str();
    case Kind::List:
    case Kind::Tuple: {
      const auto& x = a.array().items;
      const auto& y = b.array().items;
      if (x.size() != y.size()) return false;
      charge_steps(static_cast<int64_t>(x.size() / 4 + 1));
      for (size_t i = 0; i < x.size(); ++i)
        if (!eq_at(x[i], y[i], depth + 1)) return false;
      return true;
    }
    case Kind::Dict: {
      const auto& x = a.object().items;
      if (x.size() != b.object().items.size()) return false;
      for (const auto& [k, v] : x) {
        const Value* other = b.object().find(k);
        if (!other || !eq_at(v, *other, depth + 1)) return false;
      }
      return true;
    }
    default: return a.identity() == b.identity();
  }
}

bool lt_at(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() < b.as_int();
    return a.as_float() < b.as_float();
  }
  if (a.is_string() && b.is_string()) {  // UTF-8 order is code point order
    charge_bytes(std::min(a.str().size(), b.str().size()) / 16);
    return a.str() < b.str();
  }
  if (a.is_array() && a.kind() == b.kind()) {
    const auto& x = a.array().items;
    const auto& y = b.array().items;
    charge_steps(static_cast<int64_t>(std::min(x.size(), y.size()) / 4 + 1));
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!eq_at(x[i], y[i], depth + 1)) return lt_at(x[i], y[i], depth + 1);
    return x.size() < y.size();
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  throw JinjaError(fmt::format("'<' not supported between instances of '{}' and '{}'", type_name(a),
                               type_name(b)));
}

}  // namespace

void fail_undefined(const Value& v) {
  throw JinjaError(v.str().empty() ? std::string("undefined value") : v.str());
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return {};
    case Kind::List:
    case Kind::Tuple: return v.array().items;
    case Kind::Dict: {
      std::vector<Value> keys;
      keys.reserve(v.object().items.size());
      for (const auto& kv : v.object().items) keys.push_back(kv.first);
      return keys;
    }
    case Kind::String: {
      // Checked before the offsets (8 bytes per code point) and the values (48) exist.
      check_list_size(utf8_length(v.str()), "iterating a string");
      std::vector<Value> chars;
      const auto offs = utf8_offsets(v.str());
      chars.reserve(offs.size() - 1);
      for (size_t k = 0; k + 1 < offs.size(); ++k)
        chars.push_back(Value::string(v.str().substr(offs[k], offs[k + 1] - offs[k])));
      return chars;
    }
    default: throw JinjaError(fmt::format("'{}' object is not iterable", type_name(v)));
  }
}

int64_t py_len(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return 0;
    case Kind::String: return static_cast<int64_t>(utf8_length(v.str()));
    case Kind::List:
    case Kind::Tuple: return static_cast<int64_t>(v.array().items.size());
    case Kind::Dict: return static_cast<int64_t>(v.object().items.size());
    default: throw JinjaError(fmt::format("object of type '{}' has no len()", type_name(v)));
  }
}

namespace {

std::string json_key(const Value& k) {
  switch (k.kind()) {
    case Kind::String: return k.str();
    case Kind::Int: return std::to_string(k.as_int());
    case Kind::Bool: return k.as_bool() ? "true" : "false";
    case Kind::None: return "null";
    case Kind::Float: return float_repr(k.as_float());
    default:
      throw JinjaError(fmt::format("keys must be str, int, float, bool or None, not {}", type_name(k)));
  }
}

void dump_json(std::string& out, const Value& v, const JsonStyle& st, int level) {
  check_depth(level);
  check_growth(out, "tojson");  // the pieces between checks are bounded
  const bool pretty = st.indent >= 0 || !st.indent_str.empty();
  auto newline = [&](int lvl) {
    // The indent comes from the template (tojson(indent=10**9)): size it before writing.
    const size_t unit = st.indent_str.empty() ? static_cast<size_t>(st.indent) : st.indent_str.size();
    check_string_size(out.size() + 1 + checked_mul(static_cast<size_t>(lvl), unit, "tojson"), "tojson");
    out += '\n';
    for (int i = 0; i < lvl; ++i) {
      if (!st.indent_str.empty()) out += st.indent_str;
      else out.append(static_cast<size_t>(st.indent), ' ');
    }
  };
  switch (v.kind()) {
    case Kind::None: out += "null"; return;
    case Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Kind::Int: out += std::to_string(v.as_int()); return;
    case Kind::Float: {
      const double d = v.as_float();
      if (std::isnan(d)) out += "NaN";
      else if (std::isinf(d)) out += d > 0 ? "Infinity" : "-Infinity";
      else out += float_repr(d);
      return;
    }
    case Kind::String: json_quote(out, v.str(), st.ensure_ascii); return;
    case Kind::List:
    case Kind::Tuple: {
      const auto& items = v.array().items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) {
          check_string_size(out.size() + st.item_sep.size(), "tojson");
          out += st.item_sep;
        }
        if (pretty) newline(level + 1);
        dump_json(out, items[i], st, level + 1);
      }
      if (pretty) newline(level);
      out += ']';
      return;
    }
    case Kind::Dict: {
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& kv : v.object().items) items.push_back(&kv);
      if (items.empty()) {
        out += "{}";
        return;
      }
      if (st.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return py_lt(a->first, b->first); });
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) {
          check_string_size(out.size() + st.item_sep.size(), "tojson");
          out += st.item_sep;
        }
        if (pretty) newline(level + 1);
        json_quote(out, json_key(items[i]->first), st.ensure_ascii);
        check_string_size(out.size() + st.key_sep.size(), "tojson");
        out += st.key_sep;
        dump_json(out, items[i]->second, st, level + 1);
      }
      if (pretty) newline(level);
      out += '}';
      return;
    }
    default:
      throw JinjaError(fmt::format("Object of type {} is not JSON serializable", type_name(v)));
  }
}

}  // namespace

std::string to_json(const Value& v, const JsonStyle& style) {
  std::string out;
  dump_json(out, v, style, 0);
  return out;
}

namespace {

Value from_json_at(const nlohmann::ordered_json& j, int depth) {
  check_depth(depth);
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null: return Value::none();
    case T::boolean: return Value::boolean(j.get<bool>());
    case T::number_integer: return Value::integer(j.get<int64_t>());
    case T::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::number(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case T::number_float: return Value::number(j.get<double>());
    case T::string: return Value::string(j.get<std::string>());
    case T::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(from_json_at(x, depth + 1));
      return Value::list(std::move(items));
    }
    case T::object: {
      Value d = Value::dict();
      for (const auto& [k, x] : j.items()) d.object().items.emplace_back(Value::string(k), from_json_at(x, depth + 1));
      return d;
    }
    default: throw JinjaError("unsupported JSON value in chat template context");
  }
}

}  // namespace

Value from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }

}  // namespace dhs::jinja
