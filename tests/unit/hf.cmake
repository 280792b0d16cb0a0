# Hugging Face directories: safetensors container and HfDirSource.
dhs_test(test_safetensors LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_safetensors.cpp LIBS dhs_model)
dhs_test(test_hf_source LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_hf_source.cpp LIBS dhs_model)
