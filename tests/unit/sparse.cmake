dhs_test(test_sparse_summary LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sparse_summary.cpp LIBS dhs_sparse dhs_cpu)
dhs_test(test_sparse_policy LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sparse_policy.cpp LIBS dhs_sparse dhs_cpu)
dhs_test(test_key_basis LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_key_basis.cpp LIBS dhs_sparse dhs_cpu)
dhs_test(test_reselect_schedule LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_reselect_schedule.cpp LIBS dhs_sparse dhs_cpu)
