// Argument binding for the chat-template builtins (filters in jinja_filters.cpp,
// tests, methods and globals in jinja_builtins.cpp): Python's rules for
// positional and keyword arguments, with its error messages.
#pragma once
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "template/jinja_value.h"

namespace dhs::jinja {

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

inline void no_args(const char* fn, CallArgs& a) { Args(fn, a, {}); }

inline const Value& arg0(const char* fn, CallArgs& a) {
  if (a.pos.empty()) throw JinjaError(fmt::format("{}() missing required argument", fn));
  return a.pos[0];
}

inline std::string need_str(const Value& v, const char* what) {
  if (!v.is_string()) throw JinjaError(fmt::format("{} must be str, not {}", what, type_name(v)));
  return v.str();
}

}  // namespace dhs::jinja
