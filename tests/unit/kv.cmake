dhs_test(test_kv LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_kv.cpp LIBS dhs_kv)
