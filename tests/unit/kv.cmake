dhs_test(test_kv LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_kv.cpp LIBS dhs_kv)
dhs_test(test_bucketed_lru LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_bucketed_lru.cpp LIBS dhs_kv)
dhs_test(test_tiered_kv LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tiered_kv.cpp LIBS dhs_kv)
dhs_test(test_device_budgets LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_device_budgets.cpp LIBS dhs_kv)
