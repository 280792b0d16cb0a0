// Filters of the chat-template interpreter: jinja2 3.1's filters.py, plus
// transformers' tojson (json.dumps with ensure_ascii=False, no HTML escaping).
// Where jinja2 returns a generator (map, select, unique, reverse, items, batch)
// these return a list; that only shows if a template prints one without |list.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"
#include "template/jinja_args.h"
#include "template/jinja_builtins.h"
#include "template/jinja_interpreter.h"
#include "template/jinja_text.h"

namespace dhs::jinja {
namespace {

// ---------------------------------------------------------------------------
// attribute paths ("a.b.0") as jinja2's make_attrgetter walks them

Value lower_if_str(const Value& v) { return v.is_string() ? Value::string(py_lower(v.str())) : v; }

Value get_path(Interpreter& in, const Value& item, const Value& attribute) {
  if (!attribute.is_string()) return in.get_item(item, attribute);
  const std::string sep = ".";
  Value cur = item;
  for (const auto& part : py_split(attribute.str(), &sep, -1)) {
    // "0" in "items.0.name" is an index (jinja2: int(x) if x.isdigit())
    int64_t idx = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), idx);
    const bool digits = !part.empty() && part[0] != '-' && ec == std::errc() && end == part.data() + part.size();
    cur = in.get_item(cur, digits ? Value::integer(idx) : Value::string(part));
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


// A sort makes about n log2 n comparisons: charge them before starting.
void charge_sort(size_t n) {
  int64_t log2n = 1;
  while ((size_t{1} << log2n) < n) ++log2n;
  charge_steps(static_cast<int64_t>(n) * log2n / 4);
}

// ---------------------------------------------------------------------------
// filters

using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);

Value f_abs(Interpreter&, const Value& v, CallArgs& a) {
  no_args("abs", a);
  if (v.is_integral()) {
    if (v.as_int() == INT64_MIN) throw JinjaError("integer overflow");
    return Value::integer(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  if (v.is_float()) return Value::number(std::fabs(v.as_float()));
  if (v.is_undefined()) fail_undefined(v);
  throw JinjaError(fmt::format("bad operand type for abs(): '{}'", type_name(v)));
}

Value f_attr(Interpreter& in, const Value& v, CallArgs& a) {
  Args p("attr", a, {"name"});
  if (v.is_undefined()) fail_undefined(v);
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
  // fill_with pads the last batch to n items: size it first.
  if (p.has(1)) check_list_size(static_cast<uint64_t>(n), "batch");
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
  return Value::string(py_center(to_str(v), p.integer(0, 80, "width"), " "));
}

Value f_default(Interpreter&, const Value& v, CallArgs& a) {
  Args p("default", a, {"default_value", "boolean"});
  if (v.is_undefined() || (p.flag(1, false) && !truthy(v))) return p.get(0, Value::string(""));
  return v;
}

Value f_dictsort(Interpreter& in, const Value& v, CallArgs& a) {
  Args p("dictsort", a, {"case_sensitive", "by", "reverse"});
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_dict()) throw JinjaError(fmt::format("'{}' object has no attribute 'items'", type_name(v)));
  const std::string by = p.str(1).value_or("key");
  if (by != "key" && by != "value") throw JinjaError("You can only sort by either \"key\" or \"value\"");
  const bool cs = p.flag(0, false), rev = p.flag(2, false);
  // Keys computed once, not per comparison (lowering a long key is linear in it).
  std::vector<std::pair<Value, Value>> keyed;
  for (const auto& [k, x] : v.object().items)
    keyed.emplace_back(sort_key(in, by == "key" ? k : x, Value::none(), cs, false), Value::tuple({k, x}));
  charge_sort(keyed.size());
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return rev ? py_lt(y.first, x.first) : py_lt(x.first, y.first);
  });
  std::vector<Value> items;
  items.reserve(keyed.size());
  for (auto& kv : keyed) items.push_back(std::move(kv.second));
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
  if (v.is_undefined()) fail_undefined(v);  // float(Undefined) raises
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
  if (v.is_undefined()) fail_undefined(v);  // int(Undefined) raises
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

Value f_format(Interpreter&, const Value& v, CallArgs& a) {
  // jinja2: str(value) % (kwargs or args)
  if (!a.kw.empty()) {
    if (!a.pos.empty()) throw JinjaError("can't handle positional and keyword arguments at the same time");
    Value kw = Value::dict();
    for (auto& [k, x] : a.kw) kw.object().set(Value::string(k), x);
    return percent_format(to_str(v), kw);
  }
  return percent_format(to_str(v), Value::tuple(a.pos));
}

Value f_indent(Interpreter&, const Value& v, CallArgs& a) {
  Args p("indent", a, {"width", "first", "blank"});
  if (v.is_undefined()) fail_undefined(v);  // jinja2 appends "\n" to the value itself
  if (!v.is_string()) throw JinjaError(fmt::format("unsupported operand type(s) for +=: '{}' and 'str'", type_name(v)));
  const Value w = p.get(0, Value::integer(4));
  std::string ind;
  if (w.is_string()) {
    ind = w.str();
  } else if (w.is_integral()) {
    const uint64_t width = static_cast<uint64_t>(std::max<int64_t>(0, w.as_int()));
    check_string_size(width, "indent");
    ind.assign(static_cast<size_t>(width), ' ');
  } else {
    throw JinjaError("indent width must be an integer or a string");
  }
  const std::string s = v.str() + "\n";
  const auto lines = py_splitlines(s, false);
  // The indent is repeated on every line: size the result before building it.
  check_string_size(s.size() + checked_mul(lines.size() + 1, ind.size(), "indent"), "indent");
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
    const std::string piece = to_str(p.has(1) ? get_path(in, x, p.get(1, Value::none())) : x);
    check_string_size(out.size() + (first ? 0 : sep.size()) + piece.size(), "join");
    if (!first) out += sep;
    first = false;
    out += piece;
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
  const auto items = truthy(v) ? iterate(v) : std::vector<Value>{};  // jinja2: "if value: for item in value"
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
  if (!truthy(v)) return Value::list();  // jinja2: "if seq: for item in seq"
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
    const std::string& str = v.str();
    std::string out;
    out.reserve(str.size());
    for (size_t e = str.size(); e > 0;) {
      const size_t b = utf8_prev(str, e);
      out.append(str, b, e - b);
      e = b;
    }
    return Value::string(std::move(out));
  }
  auto items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_round(Interpreter&, const Value& v, CallArgs& a) {
  Args p("round", a, {"precision", "method"});
  // Beyond +-400 digits every double rounds to itself or to 0; clamping keeps -prec defined.
  const int64_t prec = std::clamp<int64_t>(p.integer(0, 0, "precision"), -400, 400);
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
  charge_sort(items.size());
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
    else if (ind.is_integral())  // past the size limit every newline would fail anyway
      st.indent = static_cast<int>(std::clamp<int64_t>(ind.as_int(), 0, static_cast<int64_t>(max_string_bytes()) + 1));
    else throw JinjaError("tojson indent must be an integer or a string");
    st.item_sep.resize(1);  // json.dumps: (",", ": ") when indenting
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
    if (k.kind() == Kind::List || k.is_dict()) throw JinjaError(fmt::format("unhashable type: '{}'", type_name(k)));
    charge_steps(static_cast<int64_t>(seen.size() / 4 + 1));  // quadratic: the budget bounds it
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
    {"float", f_float},     {"forceescape", f_escape}, {"format", f_format}, {"indent", f_indent},  {"int", f_int},
    {"items", f_items},     {"join", f_join},       {"last", f_last},         {"length", f_length},
    {"list", f_list},       {"lower", f_lower},     {"map", f_map},           {"max", f_max},
    {"min", f_min},         {"reject", f_reject},   {"rejectattr", f_rejectattr}, {"replace", f_replace},
    {"reverse", f_reverse}, {"round", f_round},     {"safe", f_safe},         {"select", f_select},
    {"selectattr", f_selectattr}, {"sort", f_sort}, {"string", f_string},     {"sum", f_sum},
    {"title", f_title},     {"tojson", f_tojson},   {"trim", f_trim},         {"unique", f_unique},
    {"upper", f_upper},     {"wordcount", f_wordcount},
};


}  // namespace

bool has_filter(const std::string& name) {
  return std::any_of(std::begin(kFilters), std::end(kFilters), [&](const NamedFilter& f) { return name == f.name; });
}


Value apply_filter(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  for (const auto& f : kFilters)
    if (name == f.name) return f.fn(in, v, args);
  throw JinjaError(fmt::format("No filter named '{}'.", name));
}

}  // namespace dhs::jinja
