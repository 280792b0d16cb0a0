# `dhisparse serve`'s front end (src/server): the protocol layer without a model (unit), the
# in-process server on the default model (e2e).
dhs_test(test_openai_protocol LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_openai_protocol.cpp LIBS dhs_server)
