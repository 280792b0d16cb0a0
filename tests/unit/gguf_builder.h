// In-test GGUF writer: builds valid files in memory and, through its override fields,
// the malformed variants the reader must reject. Written from the GGUF spec; test-only.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dhs::test {

// Little-endian byte appender.
struct Bytes {
  std::vector<uint8_t> b;

  template <class T>
  Bytes& put(T v) {
    const size_t at = b.size();
    b.resize(at + sizeof(T));
    std::memcpy(b.data() + at, &v, sizeof(T));
    return *this;
  }
  Bytes& u8(uint8_t v) { return put(v); }
  Bytes& u16(uint16_t v) { return put(v); }
  Bytes& u32(uint32_t v) { return put(v); }
  Bytes& u64(uint64_t v) { return put(v); }
  Bytes& i32(int32_t v) { return put(v); }
  Bytes& f32(float v) { return put(v); }
  Bytes& f64(double v) { return put(v); }
  Bytes& str(std::string_view s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& raw(const std::vector<uint8_t>& v) {
    b.insert(b.end(), v.begin(), v.end());
    return *this;
  }
};

// GGUF value type ids (spec numbering).
enum GgufType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

class GgufBuilder {
 public:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type = 0;
    std::vector<uint8_t> data;
    std::optional<uint64_t> offset;  // default: packed after the previous tensor, aligned
    std::optional<uint32_t> n_dims;  // default: ne.size()
  };

  uint32_t magic = 0x46554747;  // "GGUF"
  uint32_t version = 3;
  std::optional<uint64_t> n_tensors;  // override the counts written in the header
  std::optional<uint64_t> n_kv;
  uint64_t alignment = 32;  // used for padding; write general.alignment with kv_u32 yourself

  // Metadata entries, already encoded (key, type, value), written in order.
  GgufBuilder& kv_raw(std::string_view key, uint32_t type, const std::vector<uint8_t>& value) {
    Bytes e;
    e.str(key).u32(type).raw(value);
    kvs_.push_back(std::move(e.b));
    return *this;
  }
  GgufBuilder& kv_u32(std::string_view key, uint32_t v) { return kv_raw(key, kU32, Bytes().u32(v).b); }
  GgufBuilder& kv_string(std::string_view key, std::string_view v) { return kv_raw(key, kString, Bytes().str(v).b); }
  GgufBuilder& kv_array(std::string_view key, uint32_t elem_type, uint64_t count, const std::vector<uint8_t>& elems) {
    return kv_raw(key, kArray, Bytes().u32(elem_type).u64(count).raw(elems).b);
  }

  GgufBuilder& tensor(Tensor t) {
    tensors_.push_back(std::move(t));
    return *this;
  }
  // An F32 tensor of the given shape (ggml order) filled with 0, 1, 2, ...
  GgufBuilder& tensor_f32(std::string name, std::vector<uint64_t> ne) {
    uint64_t n = 1;
    for (uint64_t d : ne) n *= d;
    Bytes data;
    for (uint64_t i = 0; i < n; ++i) data.f32(static_cast<float>(i));
    return tensor({std::move(name), std::move(ne), 0, std::move(data.b), {}, {}});
  }

  std::vector<Tensor>& tensors() { return tensors_; }

  // Byte offset where the data section starts in the last build().
  size_t data_start() const { return data_start_; }

  std::vector<uint8_t> build() {
    Bytes out;
    out.u32(magic).u32(version);
    out.u64(n_tensors.value_or(tensors_.size())).u64(n_kv.value_or(kvs_.size()));
    for (const auto& kv : kvs_) out.raw(kv);
    uint64_t next = 0;
    std::vector<uint64_t> offsets;
    for (const Tensor& t : tensors_) {
      const uint64_t off = t.offset.value_or(next);
      offsets.push_back(off);
      next = align(off + t.data.size());
      out.str(t.name).u32(t.n_dims.value_or(static_cast<uint32_t>(t.ne.size())));
      for (uint64_t d : t.ne) out.u64(d);
      out.u32(t.type).u64(off);
    }
    if (tensors_.empty()) {
      data_start_ = out.b.size();
      return out.b;
    }
    out.b.resize(align(out.b.size()), 0);
    data_start_ = out.b.size();
    // The file ends where the last tensor's data ends (no trailing padding), so every
    // strict prefix of a valid file is invalid. Tensors placed at absurd offsets (to
    // test range checks) get their info written but no data.
    constexpr uint64_t kMaxPlaced = uint64_t{1} << 20;
    auto placed = [&](size_t i) { return offsets[i] <= kMaxPlaced && tensors_[i].data.size() <= kMaxPlaced - offsets[i]; };
    uint64_t end = 0;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (placed(i)) end = std::max(end, offsets[i] + tensors_[i].data.size());
    }
    out.b.resize(data_start_ + end, 0);
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (!placed(i)) continue;
      std::copy(tensors_[i].data.begin(), tensors_[i].data.end(), out.b.begin() + data_start_ + offsets[i]);
    }
    return out.b;
  }

 private:
  uint64_t align(uint64_t x) const { return (x + alignment - 1) / alignment * alignment; }

  std::vector<std::vector<uint8_t>> kvs_;
  std::vector<Tensor> tensors_;
  size_t data_start_ = 0;
};

}  // namespace dhs::test
