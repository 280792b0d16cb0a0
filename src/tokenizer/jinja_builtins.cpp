// Builtins of the chat-template interpreter (see jinja_builtins.h). Each filter
// follows jinja2 3.1's filters.py, each method CPython's str/dict/list, and the
// globals transformers' chat-template environment (tojson is transformers'
// json.dumps override: ensure_ascii=False, no HTML escaping).
// Where jinja2 returns a generator (map, select, unique, reverse, items) these
// return a list; that only shows if a template prints one without |list.
#include "tokenizer/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"
#include "tokenizer/jinja_interpreter.h"
#include "tokenizer/jinja_text.h"

namespace dhs::jinja {
namespace {

// Binds call arguments to named parameters the way Python does.
class Args {
 public:
  Args(const char* fn, CallArgs& a, std::initializer_list<const char*> params) : slots_(params.size()) {
    if (a.pos.size() > params.size())
      throw JinjaError(fmt::format("{}() takes at most {} arguments ({} given)", fn, params.size(), a.pos.size()));
    for (size_t i = 0; i < a.pos.size(); ++i) slots_[i] = a.pos[i];
    for (auto& [k, v] : a.kw) {
      size_t i = 0;
      for (const char* p : params) {
        if (k == p) break;
        ++i;
      }
      if (i == params.size()) throw JinjaError(fmt::format("{}() got an unexpected keyword argument '{}'", fn, k));
      if (slots_[i]) throw JinjaError(fmt::format("{}() got multiple values for argument '{}'", fn, k));
      slots_[i] = v;
    }
  }
  bool has(size_t i) const { return slots_[i].has_value() && !slots_[i]->is_none(); }
  Value get(size_t i, Value dflt) const { return slots_[i] ? *slots_[i] : std::move(dflt); }
  std::optional<std::string> str(size_t i) const {
    if (!has(i)) return std::nullopt;
    return to_str(*slots_[i]);
  }
  bool flag(size_t i, bool dflt) const { return slots_[i] ? truthy(*slots_[i]) : dflt; }
  int64_t integer(size_t i, int64_t dflt, const char* what) const {
    if (!has(i)) return dflt;
    if (!slots_[i]->is_integral()) throw JinjaError(fmt::format("{} must be an integer", what));
    return slots_[i]->as_int();
  }

 private:
  std::vector<std::optional<Value>> slots_;
};

void no_args(const char* fn, CallArgs& a) { Args(fn, a, {}); }

const Value& arg0(const char* fn, CallArgs& a) {
  if (a.pos.empty()) throw JinjaError(fmt::format("{}() missing required argument", fn));
  return a.pos[0];
}

std::string need_str(const Value& v, const char* what) {
  if (!v.is_string()) throw JinjaError(fmt::format("{} must be str, not {}", what, type_name(v)));
  return v.str();
}

// ---------------------------------------------------------------------------
// attribute paths ("a.b.0") as jinja2's make_attrgetter walks them

Value lower_if_str(const Value& v) { return v.is_string() ? Value::string(py_lower(v.str())) : v; }

Value get_path(Interpreter& in, const Value& item, const Value& attribute) {
  if (!attribute.is_string()) return in.get_item(item, attribute);
  const std::string sep = ".";
  Value cur = item;
  for (const auto& part : py_split(attribute.str(), &sep, -1)) {
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = in.get_item(cur, digits ? Value::integer(std::stoll(part)) : Value::string(part));
  }
  return cur;
}

// Key for sort/unique/min/max: attribute (comma-separated for sort), lowered
// unless case-sensitive.
Value sort_key(Interpreter& in, const Value& item, const Value& attribute, bool case_sensitive, bool multi) {
  if (attribute.is_none() || attribute.is_undefined()) return case_sensitive ? item : lower_if_str(item);
  if (multi && attribute.is_string() && attribute.str().find(',') != std::string::npos) {
    std::string sep = ",";
    std::vector<Value> parts;
    for (const auto& a : py_split(attribute.str(), &sep, -1)) {
      Value k = get_path(in, item, Value::string(a));
      parts.push_back(case_sensitive ? k : lower_if_str(k));
    }
    return Value::tuple(std::move(parts));
  }
  Value k = get_path(in, item, attribute);
  return case_sensitive ? k : lower_if_str(k);
}

// Python's + for sum().
Value add(const Value& a, const Value& b) {
  if (a.is_integral() && b.is_integral()) {
    int64_t r;
    if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) throw JinjaError("integer overflow");
    return Value::integer(r);
  }
  if (a.is_number() && b.is_number()) return Value::number(a.as_float() + b.as_float());
  if (a.is_array() && a.kind() == b.kind()) {
    std::vector<Value> items = a.array().items;
    items.insert(items.end(), b.array().items.begin(), b.array().items.end());
    return a.kind() == Kind::Tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
  }
  throw JinjaError(fmt::format("unsupported operand type(s) for +: '{}' and '{}'", type_name(a), type_name(b)));
}

// Python's int(str, base) for base 10 (whitespace, sign, single underscores).
std::optional<int64_t> parse_int(std::string_view s, int base) {
  const std::string t = py_strip(s, nullptr, true, true);
  size_t i = 0;
  bool neg = false;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) neg = t[i++] == '-';
  if (base == 16 || base == 8 || base == 2 || base == 0) {
    if (i + 1 < t.size() && t[i] == '0') {
      const char p = static_cast<char>(t[i + 1] | 0x20);
      const int b = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
      if (b && (base == 0 || base == b)) {
        base = b;
        i += 2;
        if (i < t.size() && t[i] == '_') ++i;
      }
    }
    if (base == 0) base = 10;
  }
  if (i >= t.size()) return std::nullopt;
  int64_t v = 0;
  bool prev_digit = false;
  for (; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '_' && prev_digit && i + 1 < t.size() && t[i + 1] != '_') {
      prev_digit = false;
      continue;
    }
    int d = (c >= '0' && c <= '9') ? c - '0' : ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') ? (c | 0x20) - 'a' + 10 : 99;
    if (d >= base) return std::nullopt;
    if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v)) return std::nullopt;
    prev_digit = true;
  }
  return neg ? -v : v;
}

// Python's float(str).
std::optional<double> parse_float(std::string_view s) {
  std::string t = py_strip(s, nullptr, true, true);
  std::string low = py_lower(t);
  std::string_view body = low;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) body.remove_prefix(1);
  if (body == "inf" || body == "infinity" || body == "nan") return std::strtod(low.c_str(), nullptr);
  std::string clean;
  bool digit_before = false;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    const bool digit = c >= '0' && c <= '9';
    if (c == '_') {
      if (!digit_before || i + 1 >= t.size() || !(t[i + 1] >= '0' && t[i + 1] <= '9')) return std::nullopt;
      continue;
    }
    if (!digit && c != '.' && c != 'e' && c != 'E' && c != '+' && c != '-') return std::nullopt;
    clean += c;
    digit_before = digit;
  }
  if (clean.empty()) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return d;
}

std::string str_center(const std::string& s, int64_t width, const std::string& fill = " ") {
  const int64_t len = static_cast<int64_t>(utf8_length(s));
  if (len >= width) return s;
  const int64_t marg = width - len;
  const int64_t left = marg / 2 + (marg & width & 1);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < marg - left; ++i) out += fill;
  return out;
}

// Code point index -> byte offset, with Python's clamping of negative/oversized indices.
size_t cp_to_byte(const std::vector<size_t>& offs, int64_t idx) {
  const int64_t n = static_cast<int64_t>(offs.size()) - 1;
  if (idx < 0) idx = std::max<int64_t>(0, idx + n);
  return offs[static_cast<size_t>(std::min(idx, n))];
}

// ---------------------------------------------------------------------------
// filters

using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);

Value f_abs(Interpreter&, const Value& v, CallArgs& a) {
  no_args("abs", a);
  if (v.is_integral()) return Value::integer(v.as_int() < 0 ? -v.as_int() : v.as_int());
  if (v.is_float()) return Value::number(std::fabs(v.as_float()));
  if (v.is_undefined()) fail_undefined(v);
  throw JinjaError(fmt::format("bad operand type for abs(): '{}'", type_name(v)));
}

Value f_attr(Interpreter& in, const Value& v, CallArgs& a) {
  Args p("attr", a, {"name"});
  const std::string name = to_str(p.get(0, Value::string("")));
  if (v.is_namespace()) return in.get_attr(v, name);
  Value m = get_method(v, name);  // getattr only: dict keys are not attributes
  if (m.is_undefined()) return Value::undefined(fmt::format("'{} object' has no attribute '{}'", type_name(v), name));
  return m;
}

Value f_batch(Interpreter&, const Value& v, CallArgs& a) {
  Args p("batch", a, {"linecount", "fill_with"});
  const int64_t n = p.integer(0, 0, "linecount");
  if (n <= 0) throw JinjaError("batch size must be positive");
  std::vector<Value> out, cur;
  for (auto& x : iterate(v)) {
    cur.push_back(std::move(x));
    if (static_cast<int64_t>(cur.size()) == n) out.push_back(Value::list(std::exchange(cur, {})));
  }
  if (!cur.empty()) {
    if (p.has(1))
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(p.get(1, Value::none()));
    out.push_back(Value::list(std::move(cur)));
  }
  return Value::list(std::move(out));
}

Value f_capitalize(Interpreter&, const Value& v, CallArgs& a) {
  no_args("capitalize", a);
  return Value::string(py_capitalize(to_str(v)));
}

Value f_center(Interpreter&, const Value& v, CallArgs& a) {
  Args p("center", a, {"width"});
  return Value::string(str_center(to_str(v), p.integer(0, 80, "width")));
}

Value f_default(Interpreter&, const Value& v, CallArgs& a) {
  Args p("default", a, {"default_value", "boolean"});
  if (v.is_undefined() || (p.flag(1, false) && !truthy(v))) return p.get(0, Value::string(""));
  return v;
}

Value f_dictsort(Interpreter& in, const Value& v, CallArgs& a) {
  Args p("dictsort", a, {"case_sensitive", "by", "reverse"});
  if (!v.is_dict()) throw JinjaError(fmt::format("'{}' object has no attribute 'items'", type_name(v)));
  const std::string by = p.str(1).value_or("key");
  if (by != "key" && by != "value") throw JinjaError("You can only sort by either \"key\" or \"value\"");
  const bool cs = p.flag(0, false), rev = p.flag(2, false);
  std::vector<Value> items;
  for (const auto& [k, x] : v.object().items) items.push_back(Value::tuple({k, x}));
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    const Value kx = sort_key(in, x.array().items[by == "key" ? 0 : 1], Value::none(), cs, false);
    const Value ky = sort_key(in, y.array().items[by == "key" ? 0 : 1], Value::none(), cs, false);
    return rev ? py_lt(ky, kx) : py_lt(kx, ky);
  });
  return Value::list(std::move(items));
}

Value f_escape(Interpreter&, const Value& v, CallArgs& a) {
  no_args("escape", a);
  return Value::string(html_escape(to_str(v)));
}

Value f_first(Interpreter&, const Value& v, CallArgs& a) {
  no_args("first", a);
  auto items = iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Interpreter&, const Value& v, CallArgs& a) {
  no_args("last", a);
  auto items = iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_float(Interpreter&, const Value& v, CallArgs& a) {
  Args p("float", a, {"default"});
  const Value dflt = p.get(0, Value::number(0.0));
  if (v.is_number()) return Value::number(v.as_float());
  if (v.is_string()) {
    if (auto d = parse_float(v.str())) return Value::number(*d);
  }
  return dflt;
}

Value f_int(Interpreter&, const Value& v, CallArgs& a) {
  Args p("int", a, {"default", "base"});
  const Value dflt = p.get(0, Value::integer(0));
  const int base = static_cast<int>(p.integer(1, 10, "base"));
  if (v.is_integral()) return Value::integer(v.as_int());
  if (v.is_float()) {
    const double d = v.as_float();
    if (std::isnan(d) || std::isinf(d) || std::fabs(d) >= 9.2e18) return dflt;
    return Value::integer(static_cast<int64_t>(d));
  }
  if (v.is_string()) {
    if (auto i = parse_int(v.str(), base)) return Value::integer(*i);
    if (auto d = parse_float(v.str()); d && !std::isnan(*d) && !std::isinf(*d) && std::fabs(*d) < 9.2e18)
      return Value::integer(static_cast<int64_t>(*d));
  }
  return dflt;
}

Value f_indent(Interpreter&, const Value& v, CallArgs& a) {
  Args p("indent", a, {"width", "first", "blank"});
  const Value w = p.get(0, Value::integer(4));
  std::string ind;
  if (w.is_string()) ind = w.str();
  else if (w.is_integral()) ind.assign(static_cast<size_t>(std::max<int64_t>(0, w.as_int())), ' ');
  else throw JinjaError("indent width must be an integer or a string");
  const std::string s = to_str(v) + "\n";
  const auto lines = py_splitlines(s, false);
  std::string rv;
  if (p.flag(2, false)) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + ind;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += ind;
      rv += lines[i];
    }
  }
  if (p.flag(1, false)) rv = ind + rv;
  return Value::string(std::move(rv));
}

Value f_items(Interpreter&, const Value& v, CallArgs& a) {
  no_args("items", a);
  if (v.is_undefined()) return Value::list();
  if (!v.is_dict()) throw JinjaError("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, x] : v.object().items) out.push_back(Value::tuple({k, x}));
  return Value::list(std::move(out));
}

Value f_join(Interpreter& in, const Value& v, CallArgs& a) {
  Args p("join", a, {"d", "attribute"});
  const std::string sep = to_str(p.get(0, Value::string("")));
  std::string out;
  bool first = true;
  for (const auto& x : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += to_str(p.has(1) ? get_path(in, x, p.get(1, Value::none())) : x);
  }
  return Value::string(std::move(out));
}

Value f_length(Interpreter&, const Value& v, CallArgs& a) {
  no_args("length", a);
  return Value::integer(py_len(v));
}

Value f_list(Interpreter&, const Value& v, CallArgs& a) {
  no_args("list", a);
  return Value::list(iterate(v));
}

Value f_lower(Interpreter&, const Value& v, CallArgs& a) {
  no_args("lower", a);
  return Value::string(py_lower(to_str(v)));
}

Value f_upper(Interpreter&, const Value& v, CallArgs& a) {
  no_args("upper", a);
  return Value::string(py_upper(to_str(v)));
}

Value f_map(Interpreter& in, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  const auto items = iterate(v);
  if (a.pos.empty()) {
    std::optional<Value> attribute, dflt;
    for (auto& [k, x] : a.kw) {
      if (k == "attribute") attribute = x;
      else if (k == "default") dflt = x;
      else throw JinjaError(fmt::format("Unexpected keyword argument '{}'", k));
    }
    if (!attribute) throw JinjaError("map requires a filter argument");
    for (const auto& x : items) {
      Value r = get_path(in, x, *attribute);
      if (dflt && r.is_undefined()) r = *dflt;
      out.push_back(std::move(r));
    }
    return Value::list(std::move(out));
  }
  const std::string name = to_str(a.pos[0]);
  for (const auto& x : items) {
    CallArgs sub;
    sub.pos.assign(a.pos.begin() + 1, a.pos.end());
    sub.kw = a.kw;
    out.push_back(in.filter(name, x, sub));
  }
  return Value::list(std::move(out));
}

Value min_max(Interpreter& in, const Value& v, CallArgs& a, bool want_max) {
  Args p(want_max ? "max" : "min", a, {"case_sensitive", "attribute"});
  const auto items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const bool cs = p.flag(0, false);
  const Value attr = p.get(1, Value::none());
  size_t best = 0;
  Value best_key = sort_key(in, items[0], attr, cs, false);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = sort_key(in, items[i], attr, cs, false);
    if (want_max ? py_lt(best_key, k) : py_lt(k, best_key)) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}
Value f_max(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, true); }
Value f_min(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, false); }

// select / reject / selectattr / rejectattr
Value select_impl(Interpreter& in, const Value& v, CallArgs& a, bool attr, bool keep) {
  size_t off = 0;
  Value attribute;
  if (attr) {
    if (a.pos.empty()) throw JinjaError("Missing parameter for attribute name");
    attribute = a.pos[0];
    off = 1;
  }
  const bool has_test = a.pos.size() > off;
  const std::string test = has_test ? to_str(a.pos[off]) : "";
  std::vector<Value> out;
  for (const auto& x : iterate(v)) {
    const Value probe = attr ? get_path(in, x, attribute) : x;
    bool r;
    if (has_test) {
      CallArgs sub;
      sub.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(off + 1), a.pos.end());
      sub.kw = a.kw;
      r = in.test(test, probe, sub);
    } else {
      r = truthy(probe);
    }
    if (r == keep) out.push_back(x);
  }
  return Value::list(std::move(out));
}
Value f_select(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, true); }
Value f_reject(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, false); }
Value f_selectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, true); }
Value f_rejectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, false); }

Value f_replace(Interpreter&, const Value& v, CallArgs& a) {
  Args p("replace", a, {"old", "new", "count"});
  return Value::string(py_replace(to_str(v), to_str(p.get(0, Value::string(""))), to_str(p.get(1, Value::string(""))),
                                  p.integer(2, -1, "count")));
}

Value f_reverse(Interpreter&, const Value& v, CallArgs& a) {
  no_args("reverse", a);
  if (v.is_string()) {
    const auto offs = utf8_offsets(v.str());
    std::string out;
    for (size_t k = offs.size() - 1; k > 0; --k) out += v.str().substr(offs[k - 1], offs[k] - offs[k - 1]);
    return Value::string(std::move(out));
  }
  auto items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_round(Interpreter&, const Value& v, CallArgs& a) {
  Args p("round", a, {"precision", "method"});
  const int64_t prec = p.integer(0, 0, "precision");
  const std::string method = p.str(1).value_or("common");
  if (method != "common" && method != "ceil" && method != "floor")
    throw JinjaError("method must be common, ceil or floor");
  if (!v.is_number()) {
    if (v.is_undefined()) fail_undefined(v);
    throw JinjaError(fmt::format("type {} doesn't define __round__ method", type_name(v)));
  }
  if (method == "common") {
    if (v.is_integral() && prec >= 0) return Value::integer(v.as_int());
    const double x = v.as_float();
    if (std::isnan(x) || std::isinf(x)) return Value::number(x);
    if (prec >= 0) {  // printf rounds the exact binary value half-to-even, as CPython's round does
      char buf[512];
      std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(std::min<int64_t>(prec, 300)), x);
      return Value::number(std::strtod(buf, nullptr));
    }
    const double scale = std::pow(10.0, static_cast<double>(-prec));
    return Value::number(std::nearbyint(x / scale) * scale);
  }
  const double scale = std::pow(10.0, static_cast<double>(prec));
  const double y = v.as_float() * scale;
  return Value::number((method == "ceil" ? std::ceil(y) : std::floor(y)) / scale);
}

Value f_safe(Interpreter&, const Value& v, CallArgs& a) {
  no_args("safe", a);
  return Value::string(to_str(v));
}

Value f_sort(Interpreter& in, const Value& v, CallArgs& a) {
  Args p("sort", a, {"reverse", "case_sensitive", "attribute"});
  const bool rev = p.flag(0, false), cs = p.flag(1, false);
  const Value attr = p.get(2, Value::none());
  auto items = iterate(v);
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& x : items) keyed.emplace_back(sort_key(in, x, attr, cs, true), std::move(x));
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return rev ? py_lt(y.first, x.first) : py_lt(x.first, y.first);
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value::list(std::move(out));
}

Value f_string(Interpreter&, const Value& v, CallArgs& a) {
  no_args("string", a);
  return Value::string(to_str(v));
}

Value f_sum(Interpreter& in, const Value& v, CallArgs& a) {
  Args p("sum", a, {"attribute", "start"});
  Value acc = p.get(1, Value::integer(0));
  for (const auto& x : iterate(v)) acc = add(acc, p.has(0) ? get_path(in, x, p.get(0, Value::none())) : x);
  return acc;
}

Value f_title(Interpreter&, const Value& v, CallArgs& a) {
  no_args("title", a);
  return Value::string(jinja_title(to_str(v)));
}

Value f_tojson(Interpreter&, const Value& v, CallArgs& a) {
  // transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  Args p("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonStyle st;
  st.ensure_ascii = p.flag(0, false);
  if (p.has(1)) {
    const Value& ind = p.get(1, Value::none());
    if (ind.is_string()) st.indent_str = ind.str();
    else if (ind.is_integral()) st.indent = static_cast<int>(std::max<int64_t>(0, ind.as_int()));
    else throw JinjaError("tojson indent must be an integer or a string");
    st.item_sep = ",";
  }
  if (p.has(2)) {
    const Value& seps = p.get(2, Value::none());
    if (!seps.is_array() || seps.array().items.size() != 2) throw JinjaError("tojson separators must be a pair");
    st.item_sep = to_str(seps.array().items[0]);
    st.key_sep = to_str(seps.array().items[1]);
  }
  st.sort_keys = p.flag(3, false);
  return Value::string(to_json(v, st));
}

Value f_trim(Interpreter&, const Value& v, CallArgs& a) {
  Args p("trim", a, {"chars"});
  const auto chars = p.str(0);
  return Value::string(py_strip(to_str(v), chars ? &*chars : nullptr, true, true));
}

Value f_unique(Interpreter& in, const Value& v, CallArgs& a) {
  Args p("unique", a, {"case_sensitive", "attribute"});
  const bool cs = p.flag(0, false);
  const Value attr = p.get(1, Value::none());
  std::vector<Value> seen, out;
  for (auto& x : iterate(v)) {
    Value k = sort_key(in, x, attr, cs, false);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return py_eq(s, k); })) {
      seen.push_back(std::move(k));
      out.push_back(std::move(x));
    }
  }
  return Value::list(std::move(out));
}

Value f_wordcount(Interpreter&, const Value& v, CallArgs& a) {
  no_args("wordcount", a);
  const std::string s = to_str(v);
  int64_t n = 0;
  bool in_word = false;
  size_t i = 0;
  while (i < s.size()) {
    const char32_t c = utf8_next(s, i);
    const bool w = (c < 0x80) ? ((c >= '0' && c <= '9') || c == '_' || py_is_alpha(c))
                              : !is_py_space(c) && !(c >= 0x2000 && c <= 0x206F) && !(c >= 0x3000 && c <= 0x303F);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

struct NamedFilter {
  const char* name;
  FilterFn fn;
};
constexpr NamedFilter kFilters[] = {
    {"abs", f_abs},         {"attr", f_attr},       {"batch", f_batch},       {"capitalize", f_capitalize},
    {"center", f_center},   {"count", f_length},    {"d", f_default},         {"default", f_default},
    {"dictsort", f_dictsort}, {"e", f_escape},      {"escape", f_escape},     {"first", f_first},
    {"float", f_float},     {"forceescape", f_escape}, {"indent", f_indent},  {"int", f_int},
    {"items", f_items},     {"join", f_join},       {"last", f_last},         {"length", f_length},
    {"list", f_list},       {"lower", f_lower},     {"map", f_map},           {"max", f_max},
    {"min", f_min},         {"reject", f_reject},   {"rejectattr", f_rejectattr}, {"replace", f_replace},
    {"reverse", f_reverse}, {"round", f_round},     {"safe", f_safe},         {"select", f_select},
    {"selectattr", f_selectattr}, {"sort", f_sort}, {"string", f_string},     {"sum", f_sum},
    {"title", f_title},     {"tojson", f_tojson},   {"trim", f_trim},         {"unique", f_unique},
    {"upper", f_upper},     {"wordcount", f_wordcount},
};

// ---------------------------------------------------------------------------
// tests

bool is_iterable(const Value& v) {
  return v.is_undefined() || v.is_string() || v.is_array() || v.is_dict();
}

bool compare_test(const std::string& name, const Value& v, const Value& other) {
  if (name == "eq" || name == "equalto" || name == "==") return py_eq(v, other);
  if (name == "ne" || name == "!=") return !py_eq(v, other);
  if (name == "lt" || name == "lessthan" || name == "<") return py_lt(v, other);
  if (name == "le" || name == "<=") return py_lt(v, other) || py_eq(v, other);
  if (name == "gt" || name == "greaterthan" || name == ">") return py_lt(other, v);
  return py_lt(other, v) || py_eq(v, other);  // ge, >=
}

bool has_filter(const std::string& name) {
  return std::any_of(std::begin(kFilters), std::end(kFilters), [&](const NamedFilter& f) { return name == f.name; });
}

bool is_known_test(const std::string& name);

bool run_test(Interpreter& in, const std::string& name, const Value& v, CallArgs& a) {
  auto one = [&](const char* what) -> const Value& {
    if (a.pos.size() != 1 || !a.kw.empty()) throw JinjaError(fmt::format("test '{}' takes one argument", what));
    return a.pos[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return is_iterable(v);
  if (name == "sequence") return v.is_undefined() || v.is_string() || v.is_array() || v.is_dict();
  if (name == "callable") return v.is_function();
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    bool cased = false;
    size_t i = 0;
    while (i < v.str().size()) {
      const char32_t c = utf8_next(v.str(), i);
      if (name == "lower" ? py_is_cased_upper(c) : py_is_cased_lower(c)) return false;
      cased = cased || py_is_cased_upper(c) || py_is_cased_lower(c);
    }
    return cased;
  }
  if (name == "odd" || name == "even") {
    if (!v.is_integral()) throw JinjaError(fmt::format("test '{}' needs an integer", name));
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const Value& n = one("divisibleby");
    if (!v.is_integral() || !n.is_integral()) throw JinjaError("divisibleby needs integers");
    if (n.as_int() == 0) throw JinjaError("integer division or modulo by zero");
    return v.as_int() % n.as_int() == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==" || name == "ne" || name == "!=" || name == "lt" ||
      name == "lessthan" || name == "<" || name == "le" || name == "<=" || name == "gt" || name == "greaterthan" ||
      name == ">" || name == "ge" || name == ">=")
    return compare_test(name, v, one(name.c_str()));
  if (name == "in") {
    CallArgs sub;
    const Value& seq = one("in");
    if (seq.is_string()) return v.is_string() && seq.str().find(v.str()) != std::string::npos;
    if (seq.is_dict()) return seq.object().find(v) != nullptr;
    for (const auto& x : iterate(seq))
      if (py_eq(x, v)) return true;
    return false;
  }
  if (name == "sameas") {
    const Value& o = one("sameas");
    if (v.kind() != o.kind()) return false;
    if (v.identity() || o.identity()) return v.identity() == o.identity();
    return py_eq(v, o);
  }
  if (name == "escaped") return false;
  if (name == "filter") return has_filter(to_str(one("filter")));
  if (name == "test") return is_known_test(to_str(one("test")));
  (void)in;
  throw JinjaError(fmt::format("No test named '{}'.", name));
}

bool is_known_test(const std::string& name) {
  static const char* kTests[] = {"defined", "undefined", "none", "boolean", "true", "false", "integer", "float",
                                 "number", "string", "mapping", "iterable", "sequence", "callable", "lower", "upper",
                                 "odd", "even", "divisibleby", "eq", "equalto", "==", "ne", "!=", "lt", "lessthan",
                                 "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">=", "in", "sameas", "escaped",
                                 "filter", "test"};
  return std::any_of(std::begin(kTests), std::end(kTests), [&](const char* t) { return name == t; });
}

// ---------------------------------------------------------------------------
// methods

Value bound(const Value& self, const std::string& name, Value (*fn)(const Value&, CallArgs&)) {
  return Value::function(name, [self, fn](Interpreter&, CallArgs& a) { return fn(self, a); });
}

Value m_strip_impl(const Value& s, CallArgs& a, bool left, bool right) {
  Args p("strip", a, {"chars"});
  const auto chars = p.str(0);
  return Value::string(py_strip(s.str(), chars ? &*chars : nullptr, left, right));
}

Value m_split_impl(const Value& s, CallArgs& a, bool from_right) {
  Args p("split", a, {"sep", "maxsplit"});
  const auto sep = p.has(0) ? std::optional<std::string>(need_str(p.get(0, Value::none()), "separator")) : std::nullopt;
  const int64_t maxsplit = p.integer(1, -1, "maxsplit");
  const auto parts = from_right ? py_rsplit(s.str(), sep ? &*sep : nullptr, maxsplit)
                                : py_split(s.str(), sep ? &*sep : nullptr, maxsplit);
  std::vector<Value> out;
  for (const auto& x : parts) out.push_back(Value::string(x));
  return Value::list(std::move(out));
}

// startswith/endswith(prefix | tuple of prefixes, start=None, end=None)
Value m_affix_impl(const Value& s, CallArgs& a, bool at_end) {
  Args p(at_end ? "endswith" : "startswith", a, {"prefix", "start", "end"});
  const auto offs = utf8_offsets(s.str());
  const int64_t n = static_cast<int64_t>(offs.size()) - 1;
  const size_t b = cp_to_byte(offs, p.integer(1, 0, "start"));
  const size_t e = cp_to_byte(offs, p.integer(2, n, "end"));
  const std::string_view sub = b <= e ? std::string_view(s.str()).substr(b, e - b) : std::string_view();
  const Value& arg = p.get(0, Value::none());
  std::vector<Value> cands = arg.is_tuple() ? arg.array().items : std::vector<Value>{arg};
  for (const auto& c : cands) {
    const std::string x = need_str(c, at_end ? "endswith argument" : "startswith argument");
    if (b > e) continue;
    if (at_end ? (sub.size() >= x.size() && sub.substr(sub.size() - x.size()) == x) : sub.substr(0, x.size()) == x)
      return Value::boolean(true);
  }
  return Value::boolean(false);
}

Value m_find_impl(const Value& s, CallArgs& a, bool from_right, bool raise) {
  Args p(from_right ? "rfind" : "find", a, {"sub", "start", "end"});
  const std::string sub = need_str(p.get(0, Value::none()), "substring");
  const auto offs = utf8_offsets(s.str());
  const int64_t n = static_cast<int64_t>(offs.size()) - 1;
  const size_t b = cp_to_byte(offs, p.integer(1, 0, "start"));
  const size_t e = cp_to_byte(offs, p.integer(2, n, "end"));
  size_t pos = std::string::npos;
  if (b <= e) {
    const std::string_view hay = std::string_view(s.str()).substr(b, e - b);
    const size_t r = from_right ? hay.rfind(sub) : hay.find(sub);
    if (r != std::string_view::npos) pos = b + r;
  }
  if (pos == std::string::npos) {
    if (raise) throw JinjaError("substring not found");
    return Value::integer(-1);
  }
  return Value::integer(static_cast<int64_t>(utf8_length(std::string_view(s.str()).substr(0, pos))));
}

bool all_cps(const std::string& s, bool (*pred)(char32_t)) {
  if (s.empty()) return false;
  size_t i = 0;
  while (i < s.size())
    if (!pred(utf8_next(s, i))) return false;
  return true;
}
bool cp_digit(char32_t c) { return c >= '0' && c <= '9'; }
bool cp_alnum(char32_t c) { return cp_digit(c) || py_is_alpha(c); }

Value str_method(const Value& self, const std::string& name) {
  using A = CallArgs;
  if (name == "strip") return bound(self, name, [](const Value& s, A& a) { return m_strip_impl(s, a, true, true); });
  if (name == "lstrip") return bound(self, name, [](const Value& s, A& a) { return m_strip_impl(s, a, true, false); });
  if (name == "rstrip") return bound(self, name, [](const Value& s, A& a) { return m_strip_impl(s, a, false, true); });
  if (name == "split") return bound(self, name, [](const Value& s, A& a) { return m_split_impl(s, a, false); });
  if (name == "rsplit") return bound(self, name, [](const Value& s, A& a) { return m_split_impl(s, a, true); });
  if (name == "startswith") return bound(self, name, [](const Value& s, A& a) { return m_affix_impl(s, a, false); });
  if (name == "endswith") return bound(self, name, [](const Value& s, A& a) { return m_affix_impl(s, a, true); });
  if (name == "find") return bound(self, name, [](const Value& s, A& a) { return m_find_impl(s, a, false, false); });
  if (name == "rfind") return bound(self, name, [](const Value& s, A& a) { return m_find_impl(s, a, true, false); });
  if (name == "index") return bound(self, name, [](const Value& s, A& a) { return m_find_impl(s, a, false, true); });
  if (name == "rindex") return bound(self, name, [](const Value& s, A& a) { return m_find_impl(s, a, true, true); });
  if (name == "splitlines")
    return bound(self, name, [](const Value& s, A& a) {
      Args p("splitlines", a, {"keepends"});
      std::vector<Value> out;
      for (const auto& x : py_splitlines(s.str(), p.flag(0, false))) out.push_back(Value::string(x));
      return Value::list(std::move(out));
    });
  if (name == "upper") return bound(self, name, [](const Value& s, A& a) { no_args("upper", a); return Value::string(py_upper(s.str())); });
  if (name == "lower") return bound(self, name, [](const Value& s, A& a) { no_args("lower", a); return Value::string(py_lower(s.str())); });
  if (name == "title") return bound(self, name, [](const Value& s, A& a) { no_args("title", a); return Value::string(py_title(s.str())); });
  if (name == "capitalize")
    return bound(self, name, [](const Value& s, A& a) { no_args("capitalize", a); return Value::string(py_capitalize(s.str())); });
  if (name == "replace")
    return bound(self, name, [](const Value& s, A& a) {
      Args p("replace", a, {"old", "new", "count"});
      return Value::string(py_replace(s.str(), need_str(p.get(0, Value::none()), "old"),
                                      need_str(p.get(1, Value::none()), "new"), p.integer(2, -1, "count")));
    });
  if (name == "count")
    return bound(self, name, [](const Value& s, A& a) {
      return Value::integer(py_count(s.str(), need_str(arg0("count", a), "substring")));
    });
  if (name == "join")
    return bound(self, name, [](const Value& s, A& a) {
      std::string out;
      bool first = true;
      for (const auto& x : iterate(arg0("join", a))) {
        if (!first) out += s.str();
        first = false;
        out += need_str(x, "sequence item");
      }
      return Value::string(std::move(out));
    });
  if (name == "removeprefix" || name == "removesuffix") {
    const bool prefix = name == "removeprefix";
    return Value::function(name, [self, prefix](Interpreter&, A& a) {
      const std::string x = need_str(arg0(prefix ? "removeprefix" : "removesuffix", a), "argument");
      const std::string& s = self.str();
      if (prefix && s.compare(0, x.size(), x) == 0) return Value::string(s.substr(x.size()));
      if (!prefix && s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
        return Value::string(s.substr(0, s.size() - x.size()));
      return self;
    });
  }
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric")
    return bound(self, name, [](const Value& s, A&) { return Value::boolean(all_cps(s.str(), cp_digit)); });
  if (name == "isalpha") return bound(self, name, [](const Value& s, A&) { return Value::boolean(all_cps(s.str(), py_is_alpha)); });
  if (name == "isalnum") return bound(self, name, [](const Value& s, A&) { return Value::boolean(all_cps(s.str(), cp_alnum)); });
  if (name == "isspace") return bound(self, name, [](const Value& s, A&) { return Value::boolean(all_cps(s.str(), is_py_space)); });
  if (name == "islower" || name == "isupper") {
    const bool lower = name == "islower";
    return Value::function(name, [self, lower](Interpreter& in, A& a) {
      no_args(lower ? "islower" : "isupper", a);
      CallArgs none;
      return Value::boolean(in.test(lower ? "lower" : "upper", self, none));
    });
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    const char mode = name[0];
    return Value::function(name, [self, mode](Interpreter&, A& a) {
      Args p("center", a, {"width", "fillchar"});
      const int64_t width = p.integer(0, 0, "width");
      const std::string fill = p.str(1).value_or(" ");
      const int64_t len = static_cast<int64_t>(utf8_length(self.str()));
      if (mode == 'c') return Value::string(str_center(self.str(), width, fill));
      std::string pad;
      for (int64_t i = len; i < width; ++i) pad += fill;
      return Value::string(mode == 'l' ? self.str() + pad : pad + self.str());
    });
  }
  if (name == "zfill")
    return bound(self, name, [](const Value& s, A& a) {
      Args p("zfill", a, {"width"});
      const int64_t width = p.integer(0, 0, "width");
      std::string str = s.str();
      const int64_t len = static_cast<int64_t>(utf8_length(str));
      if (len >= width) return s;
      std::string sign;
      if (!str.empty() && (str[0] == '+' || str[0] == '-')) {
        sign = str.substr(0, 1);
        str = str.substr(1);
      }
      return Value::string(sign + std::string(static_cast<size_t>(width - len), '0') + str);
    });
  if (name == "format") return Value::undefined("str.format() is not supported in chat templates");
  return Value();
}

Value dict_method(const Value& self, const std::string& name) {
  if (name == "items")
    return Value::function(name, [self](Interpreter& in, CallArgs& a) { return f_items(in, self, a); });
  if (name == "keys")
    return Value::function(name, [self](Interpreter&, CallArgs& a) {
      no_args("keys", a);
      return Value::list(iterate(self));
    });
  if (name == "values")
    return Value::function(name, [self](Interpreter&, CallArgs& a) {
      no_args("values", a);
      std::vector<Value> out;
      for (const auto& kv : self.object().items) out.push_back(kv.second);
      return Value::list(std::move(out));
    });
  if (name == "get")
    return Value::function(name, [self](Interpreter&, CallArgs& a) {
      Args p("get", a, {"key", "default"});
      if (const Value* v = self.object().find(p.get(0, Value::none()))) return *v;
      return p.get(1, Value::none());
    });
  static const char* kMutating[] = {"pop", "popitem", "setdefault", "update", "clear"};
  for (const char* m : kMutating)
    if (name == m) return Value::undefined(fmt::format("access to attribute '{}' of 'dict' object is unsafe.", name));
  return Value();
}

Value list_method(const Value& self, const std::string& name) {
  if (name == "index")
    return Value::function(name, [self](Interpreter&, CallArgs& a) {
      const Value& x = arg0("index", a);
      const auto& items = self.array().items;
      for (size_t i = 0; i < items.size(); ++i)
        if (py_eq(items[i], x)) return Value::integer(static_cast<int64_t>(i));
      throw JinjaError(fmt::format("{} is not in list", repr(x)));
    });
  if (name == "count")
    return Value::function(name, [self](Interpreter&, CallArgs& a) {
      const Value& x = arg0("count", a);
      int64_t n = 0;
      for (const auto& y : self.array().items) n += py_eq(x, y) ? 1 : 0;
      return Value::integer(n);
    });
  static const char* kMutating[] = {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear"};
  for (const char* m : kMutating)
    if (name == m)
      return Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type_name(self)));
  return Value();
}

}  // namespace

Value apply_filter(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  for (const auto& f : kFilters)
    if (name == f.name) return f.fn(in, v, args);
  throw JinjaError(fmt::format("No filter named '{}'.", name));
}

bool apply_test(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  return run_test(in, name, v, args);
}

Value get_method(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Kind::String: return str_method(obj, name);
    case Kind::Dict: return dict_method(obj, name);
    case Kind::List:
    case Kind::Tuple: return list_method(obj, name);
    default: return Value();
  }
}

void add_globals(std::unordered_map<std::string, Value>& vars) {
  vars["range"] = Value::function("range", [](Interpreter&, CallArgs& a) {
    if (!a.kw.empty() || a.pos.empty() || a.pos.size() > 3) throw JinjaError("range expected 1 to 3 integer arguments");
    for (const auto& x : a.pos)
      if (!x.is_integral()) throw JinjaError(fmt::format("'{}' object cannot be interpreted as an integer", type_name(x)));
    const int64_t start = a.pos.size() > 1 ? a.pos[0].as_int() : 0;
    const int64_t stop = a.pos.size() > 1 ? a.pos[1].as_int() : a.pos[0].as_int();
    const int64_t step = a.pos.size() > 2 ? a.pos[2].as_int() : 1;
    if (step == 0) throw JinjaError("range() arg 3 must not be zero");
    // jinja2's sandbox refuses ranges over MAX_RANGE items, so templates never need more.
    const long double count = step > 0 ? std::ceil((static_cast<long double>(stop) - start) / step)
                                       : std::ceil((static_cast<long double>(start) - stop) / -step);
    if (count > 100000) throw JinjaError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    std::vector<Value> out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(Value::integer(i));
    return Value::list(std::move(out));
  });
  vars["dict"] = Value::function("dict", [](Interpreter&, CallArgs& a) {
    Value d = Value::dict();
    if (a.pos.size() > 1) throw JinjaError("dict expected at most 1 argument");
    if (!a.pos.empty()) {
      if (!a.pos[0].is_dict()) throw JinjaError("dict() argument must be a mapping");
      d.object().items = a.pos[0].object().items;
    }
    for (auto& [k, v] : a.kw) d.object().set(Value::string(k), v);
    return d;
  });
  vars["namespace"] = Value::function("namespace", [](Interpreter&, CallArgs& a) {
    Value ns = Value::make_namespace();
    if (a.pos.size() > 1) throw JinjaError("namespace expected at most 1 argument");
    if (!a.pos.empty()) {
      if (!a.pos[0].is_dict()) throw JinjaError("namespace() argument must be a mapping");
      ns.object().items = a.pos[0].object().items;
    }
    for (auto& [k, v] : a.kw) ns.object().set(Value::string(k), v);
    return ns;
  });
  vars["joiner"] = Value::function("joiner", [](Interpreter&, CallArgs& a) {
    Args p("joiner", a, {"sep"});
    auto used = std::make_shared<bool>(false);
    const std::string sep = p.str(0).value_or(", ");
    return Value::function("joiner", [used, sep](Interpreter&, CallArgs&) {
      if (!*used) {
        *used = true;
        return Value::string("");
      }
      return Value::string(sep);
    });
  });
  vars["raise_exception"] = Value::function("raise_exception", [](Interpreter&, CallArgs& a) -> Value {
    const std::string msg = a.pos.empty() ? std::string() : to_str(a.pos[0]);
    throw Error(fmt::format("chat template raised an exception: {}", msg));
  });
  vars["strftime_now"] = Value::function("strftime_now", [](Interpreter& in, CallArgs& a) {
    const std::string f = need_str(arg0("strftime_now", a), "format");
    if (f.empty()) return Value::string("");
    std::tm tm = in.now();
    std::tm norm = tm;
    timegm(&norm);  // fills tm_wday / tm_yday from the date
    tm.tm_wday = norm.tm_wday;
    tm.tm_yday = norm.tm_yday;
    std::string buf(256, '\0');
    for (int tries = 0; tries < 8; ++tries) {
      const size_t n = std::strftime(buf.data(), buf.size(), f.c_str(), &tm);
      if (n > 0) return Value::string(buf.substr(0, n));
      buf.resize(buf.size() * 4);
    }
    return Value::string("");
  });
}

}  // namespace dhs::jinja
