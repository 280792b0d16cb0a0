# Tiny random Llama-3.1 / Qwen2 / Qwen3 HF checkpoints vs a NumPy reference
# (data: tests/data/tiny_models, made by scripts/make_tiny_models.py).
dhs_test(test_tiny_models LABEL e2e SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tiny_models.cpp LIBS dhs_arch nlohmann_json::nlohmann_json)
