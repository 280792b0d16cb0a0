dhs_test(test_cpu_ops LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cpu_ops.cpp LIBS dhs_cpu dhs_model)
dhs_test(test_row_union LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_row_union.cpp LIBS dhs_cpu dhs_kv)
