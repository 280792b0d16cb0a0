# Chat-template interpreter: real model templates and expression snippets against
# Python's jinja2 outputs (tests/data/chat_templates/, made by
# scripts/make_chat_template_reference.py), syntax errors, raise_exception, limits.
dhs_test(test_chat_template LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_chat_template.cpp
  LIBS dhs_tokenizer)
target_include_directories(test_chat_template PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
