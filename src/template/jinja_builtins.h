// Builtins of the chat-template interpreter: jinja2's filters and tests, the
// Python methods templates call on str/dict/list, and the globals transformers
// provides (range, dict, namespace, raise_exception, strftime_now).
#pragma once
#include <string>
#include <unordered_map>

#include "template/jinja_value.h"

namespace dhs::jinja {

class Interpreter;

// Throw JinjaError for unknown names ("No filter named 'x'.") and bad arguments.
// Filters live in jinja_filters.cpp, the rest in jinja_builtins.cpp.
Value apply_filter(Interpreter& in, const std::string& name, const Value& v, CallArgs& args);
bool has_filter(const std::string& name);
bool apply_test(Interpreter& in, const std::string& name, const Value& v, CallArgs& args);

// The bound method `obj.name` for str, dict, list and tuple values, or
// undefined when the type has no such method.
Value get_method(const Value& obj, const std::string& name);

// Python's printf-style `fmt % args` (args: a tuple, a dict for %(name)s, or one value).
Value percent_format(const std::string& fmt, const Value& args);

// Adds the globals to a scope's variables.
void add_globals(std::unordered_map<std::string, Value>& vars);

}  // namespace dhs::jinja
