# Prefill attention (issue 3 item 2): GPU kernel against cpu::attention, label cuda.
# (Through gtest_shim.h, like the other tests of this folder: -DDHS_NO_GTEST builds it without GTest.)
dhs_test(test_prefill_attention LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_prefill_attention.cu
  LIBS dhs_cuda dhs_cpu)
