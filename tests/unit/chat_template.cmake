# Chat-template interpreter: real model templates and expression snippets against
# Python's jinja2 outputs (tests/data/chat_templates/, made by
# scripts/make_chat_template_reference.py), syntax errors, raise_exception, limits.
dhs_test(test_chat_template LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_chat_template.cpp
  LIBS dhs_template)
target_include_directories(test_chat_template PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})

# Hostile templates (stack depth, quadratic parsing, unbounded values and loops) end in
# a dhs::Error within a stated time; deep-but-legal ones and long conversations render.
dhs_test(test_jinja_limits LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_jinja_limits.cpp
  LIBS dhs_template)
target_include_directories(test_jinja_limits PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
# A regression here is a crash or a hang: stop a hang long before ctest's default 1500 s.
set_tests_properties(test_jinja_limits PROPERTIES TIMEOUT 300)
