// GGUF v2/v3 reader (see gguf_file.h). One forward pass over the buffer through a
// bounds-checked Cursor; every count is checked against the bytes that could back it
// before anything is allocated, so a hostile header cannot make us reserve gigabytes.
#include "model/gguf_file.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

#include "core/error.h"

namespace dhs::gguf {

static_assert(std::endian::native == std::endian::little,
              "the reader memcpys little-endian fields; a big-endian host needs byte swaps");

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;          // GGML_MAX_DIMS
constexpr uint64_t kMaxTensorName = 64;   // the spec's limit on tensor names
constexpr uint64_t kMaxKeyLen = 65535;    // the spec's limit on metadata keys
// Smallest possible encodings, used to cap counts by the bytes left in the file.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;              // key len, 1-byte key, type, u8 value
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;  // name len, name, n_dims, ne[0], type, offset
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

std::string_view type_name(ValueType t) {
  switch (t) {
    case ValueType::U8: return "u8";
    case ValueType::I8: return "i8";
    case ValueType::U16: return "u16";
    case ValueType::I16: return "i16";
    case ValueType::U32: return "u32";
    case ValueType::I32: return "i32";
    case ValueType::F32: return "f32";
    case ValueType::Bool: return "bool";
    case ValueType::String: return "string";
    case ValueType::Array: return "array";
    case ValueType::U64: return "u64";
    case ValueType::I64: return "i64";
    case ValueType::F64: return "f64";
  }
  return "unknown";
}

bool value_type_known(uint32_t raw) { return raw <= static_cast<uint32_t>(ValueType::F64); }

// Encoded size of a scalar value type; 0 for String/Array (variable length).
uint64_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::Bool: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    case ValueType::String: case ValueType::Array: return 0;
  }
  return 0;
}

bool is_unsigned(ValueType t) {
  return t == ValueType::U8 || t == ValueType::U16 || t == ValueType::U32 || t == ValueType::U64;
}
bool is_signed(ValueType t) {
  return t == ValueType::I8 || t == ValueType::I16 || t == ValueType::I32 || t == ValueType::I64;
}
bool is_float(ValueType t) { return t == ValueType::F32 || t == ValueType::F64; }

// Bounds-checked little-endian reader over [data, data + size).
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& file)
      : data_(data), size_(size), file_(file) {}

  size_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  const std::string& file() const { return file_; }

  void need(uint64_t n, std::string_view what) const {
    DHS_CHECK(n <= left(), "{}: truncated file: {} at offset {} needs {} bytes, only {} left",
              file_, what, pos_, n, left());
  }

  template <class T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  // A GGUF string: u64 length, then that many bytes (no terminator).
  std::string read_string(std::string_view what, uint64_t max_len) {
    const size_t at = pos_;
    const uint64_t len = read<uint64_t>(what);
    DHS_CHECK(len <= left(), "{}: {} at offset {}: string length {} exceeds the {} bytes left in the file",
              file_, what, at, len, left());
    DHS_CHECK(len <= max_len, "{}: {} at offset {}: string length {} exceeds the limit of {}", file_,
              what, at, len, max_len);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& file_;
};

// Reads one scalar of type t as the Value variant (integers widened, floats as double).
// `what` names the field for error messages.
Value read_scalar(Cursor& c, ValueType t, std::string_view what) {
  Value v;
  v.type = t;
  switch (t) {
    case ValueType::U8: v.v = uint64_t{c.read<uint8_t>(what)}; break;
    case ValueType::U16: v.v = uint64_t{c.read<uint16_t>(what)}; break;
    case ValueType::U32: v.v = uint64_t{c.read<uint32_t>(what)}; break;
    case ValueType::U64: v.v = c.read<uint64_t>(what); break;
    case ValueType::I8: v.v = int64_t{c.read<int8_t>(what)}; break;
    case ValueType::I16: v.v = int64_t{c.read<int16_t>(what)}; break;
    case ValueType::I32: v.v = int64_t{c.read<int32_t>(what)}; break;
    case ValueType::I64: v.v = c.read<int64_t>(what); break;
    case ValueType::F32: v.v = double{c.read<float>(what)}; break;
    case ValueType::F64: v.v = c.read<double>(what); break;
    case ValueType::Bool: {
      const size_t at = c.pos();
      const uint8_t b = c.read<uint8_t>(what);
      DHS_CHECK(b <= 1, "{}: {} at offset {}: bool value {} is neither 0 nor 1", c.file(), what, at, b);
      v.v = b != 0;
      break;
    }
    case ValueType::String: v.v = c.read_string(what, std::numeric_limits<uint64_t>::max()); break;
    case ValueType::Array: DHS_ASSERT(false && "arrays are read by read_array");
  }
  return v;
}

Value read_array(Cursor& c, const std::string& key) {
  const std::string what = fmt::format("metadata key '{}'", key);
  const size_t at = c.pos();
  const uint32_t raw_elem = c.read<uint32_t>(what + " array element type");
  DHS_CHECK(value_type_known(raw_elem), "{}: {} at offset {}: unknown array element type {}", c.file(),
            what, at, raw_elem);
  const auto elem = static_cast<ValueType>(raw_elem);
  // Nested arrays are legal GGUF but no model uses them and Value cannot hold them.
  DHS_CHECK(elem != ValueType::Array, "{}: {}: nested arrays are not supported", c.file(), what);
  const size_t count_at = c.pos();
  const uint64_t count = c.read<uint64_t>(what + " array length");
  const uint64_t min_elem = elem == ValueType::String ? 8 : scalar_size(elem);
  DHS_CHECK(count <= c.left() / min_elem,
            "{}: {} at offset {}: array length {} exceeds what the {} bytes left in the file can hold",
            c.file(), what, count_at, count, c.left());

  Value v;
  v.type = ValueType::Array;
  v.elem_type = elem;
  const std::string elem_what = what + " array element";
  const auto n = static_cast<size_t>(count);
  if (elem == ValueType::String) {
    std::vector<std::string> out;
    out.reserve(n);
    for (size_t i = 0; i < n; ++i) out.push_back(c.read_string(elem_what, std::numeric_limits<uint64_t>::max()));
    v.v = std::move(out);
  } else if (is_float(elem)) {
    std::vector<double> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = std::get<double>(read_scalar(c, elem, elem_what).v);
    v.v = std::move(out);
  } else {
    // Integer and bool arrays widen to int64 (bools as 0/1).
    std::vector<int64_t> out(n);
    for (size_t i = 0; i < n; ++i) {
      const size_t elem_at = c.pos();
      const Value e = read_scalar(c, elem, elem_what);
      if (const auto* u = std::get_if<uint64_t>(&e.v)) {
        DHS_CHECK(*u <= static_cast<uint64_t>(kI64Max),
                  "{}: {} at offset {}: u64 element {} does not fit in int64", c.file(), elem_what, elem_at, *u);
        out[i] = static_cast<int64_t>(*u);
      } else if (const auto* s = std::get_if<int64_t>(&e.v)) {
        out[i] = *s;
      } else {
        out[i] = std::get<bool>(e.v) ? 1 : 0;
      }
    }
    v.v = std::move(out);
  }
  return v;
}

// Rounds x up to a multiple of the power of two a; throws on overflow.
uint64_t align_up(uint64_t x, uint64_t a, const std::string& file) {
  DHS_CHECK(x <= std::numeric_limits<uint64_t>::max() - (a - 1),
            "{}: offset {} overflows when aligned to {}", file, x, a);
  return (x + a - 1) & ~(a - 1);
}

[[noreturn]] void type_mismatch(std::string_view key, const Value& v, std::string_view expected) {
  if (v.is_array()) {
    throw Error(fmt::format("metadata key '{}' is an array of {}, expected {}", key, type_name(v.elem_type),
                            expected));
  }
  throw Error(fmt::format("metadata key '{}' has type {}, expected {}", key, type_name(v.type), expected));
}

}  // namespace

// ---- Value -------------------------------------------------------------------------

uint64_t Value::as_u64(std::string_view key) const {
  if (!is_array()) {
    if (const auto* u = std::get_if<uint64_t>(&v)) return *u;
    if (const auto* s = std::get_if<int64_t>(&v)) {
      DHS_CHECK(*s >= 0, "metadata key '{}' = {} is negative, expected an unsigned integer", key, *s);
      return static_cast<uint64_t>(*s);
    }
  }
  type_mismatch(key, *this, "an unsigned integer");
}

int64_t Value::as_i64(std::string_view key) const {
  if (!is_array()) {
    if (const auto* s = std::get_if<int64_t>(&v)) return *s;
    if (const auto* u = std::get_if<uint64_t>(&v)) {
      DHS_CHECK(*u <= static_cast<uint64_t>(kI64Max), "metadata key '{}' = {} does not fit in int64", key, *u);
      return static_cast<int64_t>(*u);
    }
  }
  type_mismatch(key, *this, "an integer");
}

double Value::as_f64(std::string_view key) const {
  if (!is_array()) {
    if (const auto* d = std::get_if<double>(&v)) return *d;
    if (const auto* u = std::get_if<uint64_t>(&v)) return static_cast<double>(*u);
    if (const auto* s = std::get_if<int64_t>(&v)) return static_cast<double>(*s);
  }
  type_mismatch(key, *this, "a number");
}

bool Value::as_bool(std::string_view key) const {
  if (const auto* b = std::get_if<bool>(&v)) return *b;
  type_mismatch(key, *this, "a bool");
}

const std::string& Value::as_string(std::string_view key) const {
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  type_mismatch(key, *this, "a string");
}

const std::vector<std::string>& Value::as_strings(std::string_view key) const {
  if (const auto* s = std::get_if<std::vector<std::string>>(&v)) return *s;
  type_mismatch(key, *this, "an array of strings");
}

const std::vector<int64_t>& Value::as_ints(std::string_view key) const {
  if (const auto* s = std::get_if<std::vector<int64_t>>(&v)) return *s;
  type_mismatch(key, *this, "an array of integers");
}

const std::vector<double>& Value::as_floats(std::string_view key) const {
  if (const auto* s = std::get_if<std::vector<double>>(&v)) return *s;
  type_mismatch(key, *this, "an array of floats");
}

// ---- TensorInfo --------------------------------------------------------------------

int64_t TensorInfo::n_elems() const {
  // The reader has already checked that this product fits in int64.
  return std::accumulate(ne.begin(), ne.end(), int64_t{1}, std::multiplies<>());
}

std::vector<int64_t> TensorInfo::shape() const { return {ne.rbegin(), ne.rend()}; }

// ---- GgufFile ----------------------------------------------------------------------

GgufFile GgufFile::open(const std::string& path) {
  auto mapped = std::make_shared<MappedFile>(MappedFile::open(path));
  GgufFile f = parse(mapped->data(), mapped->size(), path);
  f.file_ = std::move(mapped);  // tensor data pointers point into this mapping
  return f;
}

GgufFile GgufFile::parse(const uint8_t* data, size_t size, std::string name) {
  GgufFile f;
  f.path_ = std::move(name);
  const std::string& file = f.path_;
  DHS_CHECK(data != nullptr || size == 0, "{}: null buffer of size {}", file, size);
  Cursor c(data, size, file);

  // Header.
  DHS_CHECK(size >= 4, "{}: not a GGUF file: only {} bytes", file, size);
  const uint32_t magic = c.read<uint32_t>("magic");
  DHS_CHECK(magic == kMagic, "{}: not a GGUF file: bad magic {:02x} {:02x} {:02x} {:02x} (expected 'GGUF')",
            file, data[0], data[1], data[2], data[3]);
  const uint32_t version = c.read<uint32_t>("version");
  DHS_CHECK(version != 1,
            "{}: GGUF version 1 is not supported (it uses 32-bit counts); re-convert the model to v3", file);
  const uint32_t swapped = __builtin_bswap32(version);
  DHS_CHECK(!(swapped == 2 || swapped == 3),
            "{}: GGUF version field reads {:#x}: a big-endian file; only little-endian GGUF is supported",
            file, version);
  DHS_CHECK(version == 2 || version == 3, "{}: unsupported GGUF version {} (supported: 2, 3)", file, version);
  f.version_ = version;

  const size_t n_tensors_at = c.pos();
  const uint64_t n_tensors = c.read<uint64_t>("n_tensors");
  const size_t n_kv_at = c.pos();
  const uint64_t n_kv = c.read<uint64_t>("n_kv");
  DHS_CHECK(n_kv <= c.left() / kMinKvBytes,
            "{}: n_kv {} at offset {} is impossible: {} bytes left, a key/value needs at least {}", file, n_kv,
            n_kv_at, c.left(), kMinKvBytes);
  DHS_CHECK(n_tensors <= c.left() / kMinTensorInfoBytes,
            "{}: n_tensors {} at offset {} is impossible: {} bytes left, a tensor info needs at least {}", file,
            n_tensors, n_tensors_at, c.left(), kMinTensorInfoBytes);

  // Metadata.
  for (uint64_t i = 0; i < n_kv; ++i) {
    const size_t key_at = c.pos();
    std::string key = c.read_string(fmt::format("key of metadata entry #{}", i), kMaxKeyLen);
    DHS_CHECK(!key.empty(), "{}: metadata entry #{} at offset {} has an empty key", file, i, key_at);
    DHS_CHECK(!f.kv_.contains(key), "{}: duplicate metadata key '{}' at offset {}", file, key, key_at);
    const size_t type_at = c.pos();
    const uint32_t raw_type = c.read<uint32_t>(fmt::format("value type of metadata key '{}'", key));
    DHS_CHECK(value_type_known(raw_type), "{}: metadata key '{}' at offset {}: unknown value type {}", file, key,
              type_at, raw_type);
    const auto type = static_cast<ValueType>(raw_type);
    Value v = type == ValueType::Array
                  ? read_array(c, key)
                  : read_scalar(c, type, fmt::format("metadata key '{}'", key));
    f.kv_.emplace(std::move(key), std::move(v));
  }

  if (const Value* a = f.find("general.alignment")) {
    DHS_CHECK(!a->is_array() && (is_unsigned(a->type) || is_signed(a->type)),
              "{}: general.alignment has type {}, expected an unsigned integer", file,
              a->is_array() ? "array" : type_name(a->type));
    const auto* neg = std::get_if<int64_t>(&a->v);
    DHS_CHECK(neg == nullptr || *neg >= 0, "{}: general.alignment {} must be a non-zero power of two", file,
              neg ? *neg : 0);
    const uint64_t align = a->as_u64("general.alignment");
    DHS_CHECK(align != 0 && std::has_single_bit(align),
              "{}: general.alignment {} must be a non-zero power of two", file, align);
    f.alignment_ = align;
  } else {
    f.alignment_ = kDefaultAlignment;
  }

  // Tensor infos.
  f.tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    const size_t name_at = c.pos();
    t.name = c.read_string(fmt::format("name of tensor #{}", i), kMaxTensorName);
    DHS_CHECK(!t.name.empty(), "{}: tensor #{} at offset {} has an empty name", file, i, name_at);
    DHS_CHECK(!f.tensor_index_.contains(t.name), "{}: duplicate tensor name '{}' at offset {}", file, t.name,
              name_at);
    const std::string what = fmt::format("tensor '{}'", t.name);

    const uint32_t n_dims = c.read<uint32_t>(what + " n_dims");
    DHS_CHECK(n_dims >= 1 && n_dims <= kMaxDims, "{}: {}: n_dims {} out of range [1, {}]", file, what, n_dims,
              kMaxDims);
    int64_t n_elems = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = c.read<uint64_t>(what + " dimension");
      DHS_CHECK(ne > 0, "{}: {}: ne[{}] is 0", file, what, d);
      DHS_CHECK(ne <= static_cast<uint64_t>(kI64Max), "{}: {}: ne[{}] = {} does not fit in int64", file, what,
                d, ne);
      t.ne.push_back(static_cast<int64_t>(ne));
      DHS_CHECK(!__builtin_mul_overflow(n_elems, t.ne.back(), &n_elems),
                "{}: {}: element count overflows int64 (ne[{}] = {})", file, what, d, ne);
    }

    const size_t type_at = c.pos();
    const uint32_t raw_type = c.read<uint32_t>(what + " type");
    DHS_CHECK(dtype_known(raw_type), "{}: {} at offset {}: unknown tensor type {}", file, what, type_at,
              raw_type);
    t.type = static_cast<DType>(raw_type);
    const DTypeTraits tr = dtype_traits(t.type);
    DHS_CHECK(t.ne[0] % tr.block_elems == 0, "{}: {}: ne[0] = {} is not a multiple of the {} block size {}",
              file, what, t.ne[0], tr.name, tr.block_elems);
    // NOTE: ne[0] / block_elems * block_bytes <= ne[0] * 4 fits; the product with the row count may not.
    const int64_t row_bytes = t.ne[0] / tr.block_elems * tr.block_bytes;
    int64_t n_bytes = 0;
    DHS_CHECK(!__builtin_mul_overflow(row_bytes, n_elems / t.ne[0], &n_bytes),
              "{}: {}: byte size overflows ({} elements of {})", file, what, n_elems, tr.name);
    t.n_bytes = static_cast<uint64_t>(n_bytes);
    t.offset = c.read<uint64_t>(what + " offset");
    DHS_CHECK(t.offset % f.alignment_ == 0, "{}: {}: data offset {} is not a multiple of the alignment {}", file,
              what, t.offset, f.alignment_);

    f.tensor_index_.emplace(t.name, f.tensors_.size());
    f.tensors_.push_back(std::move(t));
  }

  // Data section: starts at the next multiple of the alignment. A file without tensors
  // may end right after its tensor infos (no padding).
  if (f.tensors_.empty()) return f;
  const uint64_t data_start = align_up(c.pos(), f.alignment_, file);
  DHS_CHECK(data_start <= size, "{}: data section would start at offset {}, past the end of the file ({} bytes)",
            file, data_start, size);
  const uint64_t data_size = size - data_start;
  for (TensorInfo& t : f.tensors_) {
    DHS_CHECK(t.offset <= data_size && t.n_bytes <= data_size - t.offset,
              "{}: tensor '{}' data [{}, +{}) at file offset {} extends past the end of the file ({} bytes)",
              file, t.name, t.offset, t.n_bytes, data_start + std::min(t.offset, data_size), size);
    t.data = data + data_start + t.offset;
  }

  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(f.tensors_.size());
  for (const TensorInfo& t : f.tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1];
    const TensorInfo& cur = *by_offset[i];
    DHS_CHECK(prev.offset + prev.n_bytes <= cur.offset,
              "{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", file, prev.name, prev.offset,
              prev.offset + prev.n_bytes, cur.name, cur.offset, cur.offset + cur.n_bytes);
  }
  return f;
}

const Value* GgufFile::find(std::string_view key) const {
  const auto it = kv_.find(std::string(key));
  return it == kv_.end() ? nullptr : &it->second;
}

const Value& GgufFile::at(std::string_view key) const {
  const Value* v = find(key);
  DHS_CHECK(v != nullptr, "{}: missing metadata key '{}'", path_, key);
  return *v;
}

namespace {
// Runs a Value accessor, prefixing any error with the file name (Value does not know it).
template <class F>
auto naming_file(const std::string& path, F&& get) {
  try {
    return get();
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", path, e.what()));
  }
}
}  // namespace

std::string GgufFile::get_string(std::string_view key, std::optional<std::string> def) const {
  const Value* v = find(key);
  if (v == nullptr && def) return *def;
  const Value& value = at(key);
  return naming_file(path_, [&] { return value.as_string(key); });
}

uint64_t GgufFile::get_u64(std::string_view key, std::optional<uint64_t> def) const {
  const Value* v = find(key);
  if (v == nullptr && def) return *def;
  const Value& value = at(key);
  return naming_file(path_, [&] { return value.as_u64(key); });
}

double GgufFile::get_f64(std::string_view key, std::optional<double> def) const {
  const Value* v = find(key);
  if (v == nullptr && def) return *def;
  const Value& value = at(key);
  return naming_file(path_, [&] { return value.as_f64(key); });
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace dhs::gguf
