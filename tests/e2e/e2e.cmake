dhs_test(test_reference_logits LABEL e2e SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_reference_logits.cpp LIBS dhs_arch nlohmann_json::nlohmann_json)
dhs_test(test_engine LABEL e2e SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_engine.cpp LIBS dhs_engine nlohmann_json::nlohmann_json)
add_test(NAME test_cli COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/test_cli.sh $<TARGET_FILE:dhisparse> ${DHS_MODELS_DIR}/SmolLM2-135M-Instruct.Q4_1.gguf)
set_tests_properties(test_cli PROPERTIES LABELS e2e SKIP_RETURN_CODE 77)
