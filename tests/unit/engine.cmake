dhs_test(test_sampler LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sampler.cpp LIBS dhs_engine)
dhs_test(test_step_runner LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_step_runner.cpp LIBS dhs_engine)
dhs_test(test_step_batch LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_step_batch.cpp LIBS dhs_engine)
dhs_test(test_scheduler LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_scheduler.cpp LIBS dhs_engine)
