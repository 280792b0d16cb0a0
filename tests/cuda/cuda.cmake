# CUDA tests (label cuda). Built here for sm_90a and carried to the GPU machine
# (bench/prebuild.sh), which lacks some of the project's -dev packages. One harness for all:
# tests/cuda/gtest_shim.h (GoogleTest here; with -DDHS_NO_GTEST a stand-in with the same
# macros), registered with dhs_test; without a GPU (or a model) every TEST skips (GTEST_SKIP).

# CMake 3.25 knows no "CUDA20" dialect flag for nvcc (newer CMake does): tell it for the
# CUDA test targets of this directory (the C++20 headers of core/ and kv/ need it).
if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION OR CMAKE_CUDA20_STANDARD_COMPILE_OPTION STREQUAL "")
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()

# Decode attention against cpu::attention on awkward shapes, stream launch and graph replay.
dhs_test(test_decode_attention LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_decode_attention.cpp
  LIBS dhs_cuda dhs_cpu)
include(${CMAKE_CURRENT_LIST_DIR}/prefill.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/ops.cmake)
# The default model on the CUDA backend against the CPU backend (skips without the model;
# dhs_test sets DHS_TEST_DATA and DHS_MODELS_DIR).
dhs_test(test_llama_cuda LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_llama_cuda.cpp
  LIBS dhs_arch_cuda nlohmann_json::nlohmann_json)
# Speculative verification on the device: verify rows against decoding one at a time.
dhs_test(test_cuda_verify LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cuda_verify.cpp
  LIBS dhs_engine dhs_arch_cuda)
# The CUDA backend at serving sizes: batched decode vs solo, the runner's device sampling.
dhs_test(test_cuda_serving LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cuda_serving.cpp
  LIBS dhs_engine dhs_arch_cuda)
# The KV hierarchy's device I/O engine (host tier, page recall / evict kernel, copy-engine forms)
# against kv/tier_copy.h, bit-exact, with graph replay and guard pages.
dhs_test(test_page_recall LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_page_recall.cu
  LIBS dhs_cuda dhs_kv)
# The KV hierarchy's recall-ahead read: lists split by tier, attention over HBM and over the
# host tier's mapped pages, LSE merge, against kv/tier_split.h and cpu::attention.
dhs_test(test_tier_split LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tier_split.cu
  LIBS dhs_cuda dhs_cpu dhs_kv)
# The KV hierarchy on the CUDA backend: the default model's greedy tokens with a host tier equal
# all-resident, dense and coverage 0.99, batched under auto budgets.
dhs_test(test_cuda_tiers LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cuda_tiers.cpp
  LIBS dhs_engine dhs_arch_cuda)
# A verify's per-row lists merged into one list with row masks, against kv/page_lists.h.
dhs_test(test_row_union_gpu LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_row_union_gpu.cu
  LIBS dhs_cuda dhs_kv)
# The landing beside the resident part's attention (overlap_landing) against the serial form, random weights.
dhs_test(test_land_overlap LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_land_overlap.cpp
  LIBS dhs_arch_cuda)
# Landing: a layer's late pages copied into HBM in the step, keys rewritten, against kv/tier_land.h.
dhs_test(test_tier_land LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tier_land.cu
  LIBS dhs_cuda dhs_kv)
# The bucketed LRU's victims chosen on the device, against kv/bucketed_lru.h's select_many.
dhs_test(test_lru_select LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_lru_select.cu
  LIBS dhs_cuda dhs_kv)
# The LRU's mirror in HBM (patches applied, a step's reads counted per owner), against kv/lru_mirror.h.
dhs_test(test_lru_mirror LABEL cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_lru_mirror.cu
  LIBS dhs_cuda dhs_kv)
