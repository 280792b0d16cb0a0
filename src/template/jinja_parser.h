// Parser of the chat-template interpreter: tokens -> syntax tree, with jinja2's
// grammar and operator precedence (see jinja_ast.h for the nodes).
#pragma once
#include <memory>
#include <string_view>

#include "template/jinja_ast.h"

namespace dhs::jinja {

// Parses a template; throws dhs::Error with line and column on a syntax error.
std::unique_ptr<TemplateAst> parse_template(std::string_view source);

}  // namespace dhs::jinja
