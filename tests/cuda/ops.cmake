# CUDA glue ops and GPU sampling against the CPU reference (label cuda; skip without a GPU).
# The test files also build as plain executables with -DDHS_NO_GTEST (gtest_shim.h), for
# the lent GPU machine, which has no GTest.
dhs_test(test_cuda_ops LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cuda_ops.cu
  LIBS dhs_cuda dhs_cpu dhs_kv dhs_model)
dhs_test(test_cuda_sampling LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cuda_sampling.cu
  LIBS dhs_cuda dhs_engine)
dhs_test(test_page_select LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_page_select.cu
  LIBS dhs_cuda dhs_sparse dhs_kv)
dhs_test(test_draft_seeds LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_draft_seeds.cu
  LIBS dhs_cuda dhs_sparse dhs_kv)
dhs_test(test_reuse_lists LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_reuse_lists.cu
  LIBS dhs_cuda dhs_sparse dhs_kv)
dhs_test(test_gemv LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gemv.cu
  LIBS dhs_cuda)
dhs_test(test_quant_gemv LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_quant_gemv.cu
  LIBS dhs_cuda dhs_model)
dhs_test(test_packed_gemv LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_packed_gemv.cu
  LIBS dhs_cuda dhs_model)
