# Prefill attention (issue 3 item 2): GPU kernel against cpu::attention, label cuda.
# (tests/cuda/test_prefill_attention.cu also builds as a plain executable with -DDHS_PLAIN_TEST.)
dhs_test(test_prefill_attention LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_prefill_attention.cu
  LIBS dhs_cuda dhs_cpu)
