# Tokenizer tests: building blocks (UTF-8, byte map, merges, pre-tokenizer, added
# tokens) and HF `tokenizers` reference ids for SmolLM2 (byte-level BPE, GGUF and
# tokenizer.json) and Mistral (SentencePiece BPE, tokenizer.json and vocab GGUF).
# Data: tests/data/tokenizer/, made by scripts/make_tokenizer_reference.py.
dhs_test(test_tokenizer LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tokenizer_parts.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_tokenizer_reference.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_user_text_guard.cpp
  LIBS dhs_tokenizer)
target_include_directories(test_tokenizer PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
