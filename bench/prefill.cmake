# Prefill attention benchmark (one layer, Llama-3.1-8B heads, 32k and 128k):
# run beside bench/anchors/sdpa_prefill_anchor.py in the same device call.
add_executable(prefill_bench ${CMAKE_CURRENT_LIST_DIR}/prefill_bench.cu)
target_link_libraries(prefill_bench PRIVATE dhs_cuda)
