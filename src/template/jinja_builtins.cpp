// Tests, methods and globals of the chat-template interpreter: jinja2 3.1's
// tests.py, CPython's str/dict/list methods (the ones ImmutableSandboxedEnvironment
// allows: nothing that mutates), printf-style "%" formatting, and the globals
// transformers' chat-template environment provides.
#include <algorithm>
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

// Code point index -> byte offset, with Python's clamping of negative/oversized
// indices (walked to: indexing every code point costs 8 bytes each).
size_t cp_to_byte(std::string_view s, const Args& p, size_t i, const char* what) {
  return p.has(i) ? utf8_byte_at(s, p.integer(i, 0, what)) : (i == 1 ? 0 : s.size());
}


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
  if (name == "callable") return v.is_function() || v.is_undefined();  // Undefined defines __call__
  if (name == "lower" || name == "upper") {  // str(value).islower() / .isupper()
    const std::string str = to_str(v);
    bool cased = false;
    size_t i = 0;
    while (i < str.size()) {
      const char32_t c = utf8_next(str, i);
      if (name == "lower" ? py_is_cased_upper(c) : py_is_cased_lower(c)) return false;
      cased = cased || py_is_cased_upper(c) || py_is_cased_lower(c);
    }
    return cased;
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    // value % 2 == 1 / value % 2 == 0 / value % num == 0, with Python's modulo
    const Value n = name == "divisibleby" ? one("divisibleby") : Value::integer(2);
    if (v.is_undefined()) fail_undefined(v);
    if (!v.is_number() || !n.is_number())
      throw JinjaError(fmt::format("unsupported operand type(s) for %: '{}' and '{}'", type_name(v), type_name(n)));
    double r;
    if (v.is_integral() && n.is_integral()) {
      if (n.as_int() == 0) throw JinjaError("integer division or modulo by zero");
      const int64_t m = n.as_int() == -1 ? 0 : v.as_int() % n.as_int();
      r = static_cast<double>((m != 0 && ((m < 0) != (n.as_int() < 0))) ? m + n.as_int() : m);
    } else {
      if (n.as_float() == 0.0) throw JinjaError("float modulo");
      r = std::fmod(v.as_float(), n.as_float());
      if (r != 0.0 && ((r < 0) != (n.as_float() < 0))) r += n.as_float();
    }
    return name == "odd" ? r == 1.0 : r == 0.0;
  }
  if (name == "eq" || name == "equalto" || name == "==" || name == "ne" || name == "!=" || name == "lt" ||
      name == "lessthan" || name == "<" || name == "le" || name == "<=" || name == "gt" || name == "greaterthan" ||
      name == ">" || name == "ge" || name == ">=")
    return compare_test(name, v, one(name.c_str()));
  if (name == "in") {
    CallArgs sub;
    const Value& seq = one("in");
    if (seq.is_string()) return v.is_string() && find_sub(seq.str(), v.str(), 0) != std::string::npos;
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
  if (name == "filter") return v.is_string() && has_filter(v.str());
  if (name == "test") return v.is_string() && is_known_test(v.str());
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

// A method bound to its object. Each call costs a pass over the object: a bound
// method held in a variable and called in a loop never copies the object, so the
// charge is here (strings cost their bytes, containers a step per 4 slots).
void charge_call(const Value& self) {
  if (self.is_string()) charge_bytes(self.str().size());
  else if (self.is_array()) charge_steps(static_cast<int64_t>(self.array().items.size() / 4));
  else if (self.is_dict()) charge_steps(static_cast<int64_t>(self.object().items.size() / 4));
}

Value bound(const Value& self, const std::string& name, Value (*fn)(const Value&, CallArgs&)) {
  return Value::function(name, [self, fn](Interpreter&, CallArgs& a) {
    charge_call(self);
    return fn(self, a);
  });
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
  const size_t b = cp_to_byte(s.str(), p, 1, "start");
  const size_t e = cp_to_byte(s.str(), p, 2, "end");
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
  const size_t b = cp_to_byte(s.str(), p, 1, "start");
  const size_t e = cp_to_byte(s.str(), p, 2, "end");
  size_t pos = std::string::npos;
  if (b <= e) {
    const std::string_view hay = std::string_view(s.str()).substr(b, e - b);
    const size_t r = from_right ? rfind_sub(hay, sub) : find_sub(hay, sub, 0);
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
        const std::string& piece = need_str(x, "sequence item");
        check_string_size(out.size() + (first ? 0 : s.str().size()) + piece.size(), "join");
        if (!first) out += s.str();
        first = false;
        out += piece;
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
      // As Python requires (an empty fill would also pad a huge width with nothing, forever).
      if (utf8_length(fill) != 1) throw JinjaError("The fill character must be exactly one character long");
      const int64_t len = static_cast<int64_t>(utf8_length(self.str()));
      if (mode == 'c') return Value::string(py_center(self.str(), width, fill));
      const char* what = mode == 'l' ? "ljust" : "rjust";
      const uint64_t n_pad = width > len ? static_cast<uint64_t>(width - len) : 0;
      check_string_size(self.str().size() + checked_mul(n_pad, fill.size(), what), what);
      std::string pad;
      pad.reserve(n_pad * fill.size());
      for (uint64_t i = 0; i < n_pad; ++i) pad += fill;
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
      check_string_size(str.size() + static_cast<uint64_t>(width - len), "zfill");
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
    return Value::function(name, [self](Interpreter& in, CallArgs& a) { return apply_filter(in, "items", self, a); });
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

Value percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> pos;
  const bool mapping = args.is_dict();
  if (args.is_tuple()) pos = args.array().items;
  else if (!mapping) pos.push_back(args);
  size_t next = 0;
  bool used_mapping = false;
  auto take = [&]() -> const Value& {
    if (next >= pos.size()) throw JinjaError("not enough arguments for format string");
    return pos[next++];
  };
  std::string out;
  size_t i = 0;
  while (i < fmt.size()) {
    const char ch = fmt[i++];
    if (ch != '%') {
      out += ch;
      continue;
    }
    if (i >= fmt.size()) throw JinjaError("incomplete format");
    Value keyed;
    bool has_key = false;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos) throw JinjaError("incomplete format key");
      if (!mapping) throw JinjaError("format requires a mapping");
      const Value* v = args.object().find(fmt.substr(i + 1, close - i - 1));
      if (!v) throw JinjaError(fmt::format("KeyError: '{}'", fmt.substr(i + 1, close - i - 1)));
      keyed = *v;
      has_key = used_mapping = true;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos) flags += fmt[i++];
    // Width and precision come from the template (or its arguments, with "*"): both
    // size the result, so both are checked before anything is formatted.
    const int64_t max_width = static_cast<int64_t>(max_string_bytes());
    auto number = [&](const char* what) -> std::optional<int64_t> {
      int64_t n = 0;
      if (i < fmt.size() && fmt[i] == '*') {
        ++i;
        const Value& w = take();
        if (!w.is_integral()) throw JinjaError(fmt::format("* wants int {}", what));
        n = w.as_int();
        if (n < 0) {
          if (what[0] == 'p') return 0;  // CPython ignores a negative precision
          flags += '-';                  // and left-justifies for a negative width
          n = n == INT64_MIN ? INT64_MAX : -n;
        }
      } else {
        if (i >= fmt.size() || fmt[i] < '0' || fmt[i] > '9') return std::nullopt;
        while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') n = std::min(n * 10 + (fmt[i++] - '0'), max_width + 1);
      }
      if (n > max_width) fail_string_size("format", static_cast<size_t>(n));
      return n;
    };
    std::optional<int64_t> width = number("width"), prec;
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      prec = number("precision").value_or(0);
    }
    while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) throw JinjaError("incomplete format");
    const char conv = fmt[i++];
    if (conv == '%') {
      out += '%';
      continue;
    }
    const Value v = has_key ? keyed : take();
    std::string body;
    if (conv == 's' || conv == 'r' || conv == 'a') {
      body = conv == 's' ? to_str(v) : repr(v);
      if (prec) body.resize(utf8_byte_at(body, *prec));
      const int64_t len = static_cast<int64_t>(utf8_length(body));
      if (width && *width > len) {
        const std::string pad(static_cast<size_t>(*width - len), ' ');
        body = flags.find('-') != std::string::npos ? body + pad : pad + body;
      }
      check_string_size(out.size() + body.size(), "format");
      out += body;
      continue;
    }
    std::string spec = fmt::format("%{}{}{}", flags, width ? std::to_string(*width) : std::string(),
                                   prec ? fmt::format(".{}", *prec) : std::string());
    // printf into a buffer of the size it asks for (checked), since width and
    // precision may make the text long.
    auto print = [&](auto x) {
      const int n = std::snprintf(nullptr, 0, spec.c_str(), x);
      if (n < 0) throw JinjaError("format: invalid conversion");
      check_string_size(out.size() + static_cast<size_t>(n), "format");
      const size_t at = out.size();
      out.resize(at + static_cast<size_t>(n) + 1);
      std::snprintf(out.data() + at, static_cast<size_t>(n) + 1, spec.c_str(), x);
      out.resize(at + static_cast<size_t>(n));
    };
    if (conv == 'd' || conv == 'i' || conv == 'u' || conv == 'o' || conv == 'x' || conv == 'X' || conv == 'c') {
      int64_t n;
      if (v.is_integral()) {
        n = v.as_int();
      } else if (v.is_float() && (conv == 'd' || conv == 'i' || conv == 'u')) {
        const double d = v.as_float();
        if (std::isnan(d)) throw JinjaError("cannot convert float NaN to integer");
        if (!(d > -9.2e18 && d < 9.2e18)) throw JinjaError("integer overflow");  // Python ints are unbounded
        n = static_cast<int64_t>(d);
      } else {
        throw JinjaError(fmt::format("%{} format: a number is required, not {}", conv, type_name(v)));
      }
      if (conv == 'c') {
        if (n < 0 || n > 0x10FFFF) throw JinjaError("%c arg not in range(0x110000)");
        utf8_append(out, static_cast<char32_t>(n));
        continue;
      }
      spec += std::string("ll") + (conv == 'u' || conv == 'i' ? 'd' : conv);
      print(static_cast<long long>(n));
    } else if (std::string_view("eEfFgG").find(conv) != std::string_view::npos) {
      if (!v.is_number()) throw JinjaError(fmt::format("must be real number, not {}", type_name(v)));
      spec += conv;
      print(v.as_float());
    } else {
      throw JinjaError(fmt::format("unsupported format character '{}'", conv));
    }
  }
  // CPython skips this check when args has __getitem__ (a list, a dict) but is not a tuple or str.
  const bool getitem = mapping || args.kind() == Kind::List;
  if (!used_mapping && !getitem && next < pos.size())
    throw JinjaError("not all arguments converted during string formatting");
  return Value::string(std::move(out));
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
    // strftime is slow per byte and may be retried below with larger buffers; real
    // formats are a dozen bytes ("%d %b %Y").
    if (f.size() > 1024) throw JinjaError("strftime_now format longer than 1024 bytes");
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