# Evaluation workloads: RULER-style task generation (fake token counter, plus the
# SmolLM2 tokenizer from tests/data/tokenizer for real BPE lengths).
dhs_test(test_ruler_tasks LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ruler_tasks.cpp LIBS dhs_eval dhs_tokenizer)
dhs_test(test_budget_trace LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_budget_trace.cpp LIBS dhs_eval)
