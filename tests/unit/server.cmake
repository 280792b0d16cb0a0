# `dhisparse serve`'s front end (src/server): the protocol layer without a model (unit), the
# in-process server on the default model (e2e).
dhs_test(test_openai_protocol LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_openai_protocol.cpp LIBS dhs_server)
# The in-process server test talks through httplib's client (the pkg-config target is
# directory-scoped, so it is looked up here too).
pkg_check_modules(HTTPLIB_TEST REQUIRED IMPORTED_TARGET cpp-httplib)
dhs_test(test_server LABEL e2e SOURCES ${CMAKE_CURRENT_LIST_DIR}/../e2e/test_server.cpp
  LIBS dhs_server PkgConfig::HTTPLIB_TEST nlohmann_json::nlohmann_json)
