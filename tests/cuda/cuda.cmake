# CUDA tests (label cuda). Built here for sm_90a and carried to the GPU machine
# (bench/prebuild.sh), which lacks some of the project's -dev packages. Some are
# standalone programs (exit code 77 = skipped: no GPU), some GoogleTest (GTEST_SKIP).

# CMake 3.25 knows no "CUDA20" dialect flag for nvcc (newer CMake does): tell it for the
# CUDA test targets of this directory (the C++20 headers of core/ and kv/ need it).
if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION OR CMAKE_CUDA20_STANDARD_COMPILE_OPTION STREQUAL "")
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()

add_executable(test_decode_attention ${CMAKE_CURRENT_LIST_DIR}/test_decode_attention.cpp)
target_link_libraries(test_decode_attention PRIVATE dhs_cuda dhs_cpu)
add_test(NAME test_decode_attention COMMAND test_decode_attention)
set_tests_properties(test_decode_attention PROPERTIES LABELS cuda SKIP_RETURN_CODE 77)
include(${CMAKE_CURRENT_LIST_DIR}/prefill.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/ops.cmake)
add_executable(test_llama_cuda ${CMAKE_CURRENT_LIST_DIR}/test_llama_cuda.cpp)
target_link_libraries(test_llama_cuda PRIVATE dhs_arch_cuda nlohmann_json::nlohmann_json)
target_include_directories(test_llama_cuda PRIVATE ${CMAKE_CURRENT_LIST_DIR}/..)
add_test(NAME test_llama_cuda COMMAND test_llama_cuda)
set_tests_properties(test_llama_cuda PROPERTIES LABELS cuda SKIP_RETURN_CODE 77
  ENVIRONMENT "DHS_TEST_DATA=${DHS_TEST_DATA};DHS_MODELS_DIR=${DHS_MODELS_DIR}")
# The CUDA backend at serving sizes: batched decode vs solo, the runner's device sampling.
dhs_test(test_cuda_serving LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cuda_serving.cpp
  LIBS dhs_engine dhs_arch_cuda)
