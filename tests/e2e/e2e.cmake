dhs_test(test_reference_logits LABEL e2e SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_reference_logits.cpp LIBS dhs_arch nlohmann_json::nlohmann_json)
