// GGUF v2/v3 reader: mmaps the file, parses header, metadata and tensor infos
// with every count, size and offset bounds-checked (malformed files throw
// dhs::Error with a clear message, never read out of bounds).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"

namespace dhs::gguf {

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7,
  String = 8, Array = 9, U64 = 10, I64 = 11, F64 = 12,
};

// One metadata value. Arrays hold elements of one type; string arrays (vocabularies)
// are materialised as std::vector<std::string>, numeric arrays as the widened vectors.
struct Value {
  ValueType type = ValueType::U8;
  ValueType elem_type = ValueType::U8;  // for arrays
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<std::string>,
               std::vector<int64_t>, std::vector<double>>
      v;

  bool is_array() const { return type == ValueType::Array; }
  // Checked accessors: throw dhs::Error naming `key` if the type does not fit.
  uint64_t as_u64(std::string_view key) const;
  int64_t as_i64(std::string_view key) const;
  double as_f64(std::string_view key) const;
  bool as_bool(std::string_view key) const;
  const std::string& as_string(std::string_view key) const;
  const std::vector<std::string>& as_strings(std::string_view key) const;
  const std::vector<int64_t>& as_ints(std::string_view key) const;    // integer arrays
  const std::vector<double>& as_floats(std::string_view key) const;  // float arrays
};

struct TensorInfo {
  std::string name;
  std::vector<int64_t> ne;  // ggml order: ne[0] is the innermost (contiguous) dimension
  DType type = DType::F32;
  uint64_t offset = 0;      // relative to the data section
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // points into the mapping, n_bytes long

  int64_t n_elems() const;
  // Row-major shape, outermost first (reverse of ne): a [rows, cols] matrix.
  std::vector<int64_t> shape() const;
};

class GgufFile {
 public:
  // Throws dhs::Error for anything malformed.
  static GgufFile open(const std::string& path);
  // Parse from a buffer the caller keeps alive (tests, fuzzing).
  static GgufFile parse(const uint8_t* data, size_t size, std::string name = "<memory>");

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::string& path() const { return path_; }

  const std::map<std::string, Value>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  // Required-key accessors: throw dhs::Error "missing metadata key ..." if absent.
  const Value& at(std::string_view key) const;
  std::string get_string(std::string_view key, std::optional<std::string> def = std::nullopt) const;
  uint64_t get_u64(std::string_view key, std::optional<uint64_t> def = std::nullopt) const;
  double get_f64(std::string_view key, std::optional<double> def = std::nullopt) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;

 private:
  std::shared_ptr<MappedFile> file_;  // null when parsed from memory
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, Value> kv_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace dhs::gguf
