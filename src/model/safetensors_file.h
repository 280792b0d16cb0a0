// safetensors reader: mmaps one file, parses its JSON header and checks every
// length, offset, shape and byte count against the file (malformed files throw
// dhs::Error naming the file and tensor, never read out of bounds). HfDirSource
// builds on it; this layer knows nothing of model architectures.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"

namespace dhs::safetensors {

// The format caps the JSON header at 100 MB (as the reference implementation does);
// anything larger is a corrupt length field, not a real header.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Element types the reader accepts. Only F32/F16/BF16 are weight types; the
// integer and F64 types parse (tokenizer-side or auxiliary tensors use them) so a
// file carrying them still opens, but loaders reject them for weights.
enum class ElemType { F64, F32, F16, BF16, I64, I32, I16, I8, U8 };

std::string_view elem_type_name(ElemType t);
int64_t elem_type_size(ElemType t);
// The engine's DType for t; nullopt for U8 (no engine type).
std::optional<DType> elem_type_dtype(ElemType t);
// Whether t can hold model weights (F32, F16, BF16).
bool is_weight_type(ElemType t);

struct TensorInfo {
  std::string name;
  ElemType type = ElemType::F32;
  std::vector<int64_t> shape;  // row-major, outermost first
  uint64_t begin = 0;          // byte range [begin, end) relative to the data section
  uint64_t end = 0;
  // Points into the mapping, n_bytes() long. NOTE: not necessarily aligned to the
  // element size (the header length need not be a multiple of 8).
  const uint8_t* data = nullptr;

  uint64_t n_bytes() const { return end - begin; }
  int64_t n_elems() const;
};

class SafetensorsFile {
 public:
  // Throws dhs::Error for anything malformed or unreadable.
  static SafetensorsFile open(const std::string& path);
  // Parse from a buffer the caller keeps alive (tests, fuzzing); `name` is used in errors.
  static SafetensorsFile parse(const uint8_t* data, size_t size, std::string name = "<memory>");

  const std::string& path() const { return path_; }
  // The optional "__metadata__" string map.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Every tensor of the header, sorted by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(std::string_view name) const;

 private:
  std::shared_ptr<MappedFile> file_;  // null when parsed from memory
  std::string path_;
  std::map<std::string, std::string> metadata_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
};

}  // namespace dhs::safetensors
