# The `dhisparse serve` end-to-end suite (pytest + the openai client, tests/serve/), on the
# CPU build: about 7 minutes on 2 cores. RUN_SERIAL: its time bounds (slow clients dropped
# within 25 s, the fuzz within 300 s) assume it does not share the cores with other tests.
# Included from tests/CMakeLists.txt.
add_test(NAME test_serve COMMAND bash ${CMAKE_SOURCE_DIR}/scripts/test_serve.sh $<TARGET_FILE:dhisparse>)
set_tests_properties(test_serve PROPERTIES LABELS e2e SKIP_RETURN_CODE 77 RUN_SERIAL TRUE TIMEOUT 1800
  ENVIRONMENT "DHS_MODEL=${DHS_MODELS_DIR}/SmolLM2-135M-Instruct.Q4_1.gguf")
