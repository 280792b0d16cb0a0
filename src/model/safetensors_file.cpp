#include "model/safetensors_file.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dhs::safetensors {

namespace {

using json = nlohmann::json;

struct ElemTypeRow {
  ElemType type;
  std::string_view name;
  int64_t size;
};

constexpr ElemTypeRow kElemTypes[] = {
    {ElemType::F64, "F64", 8},   {ElemType::F32, "F32", 4}, {ElemType::F16, "F16", 2},
    {ElemType::BF16, "BF16", 2}, {ElemType::I64, "I64", 8}, {ElemType::I32, "I32", 4},
    {ElemType::I16, "I16", 2},   {ElemType::I8, "I8", 1},   {ElemType::U8, "U8", 1},
};

const ElemTypeRow& row_of(ElemType t) {
  const auto i = static_cast<size_t>(t);
  DHS_ASSERT(i < std::size(kElemTypes) && kElemTypes[i].type == t);  // table in enum order
  return kElemTypes[i];
}

std::optional<ElemType> parse_elem_type(std::string_view s) {
  for (const auto& r : kElemTypes)
    if (r.name == s) return r.type;
  return std::nullopt;
}

// A non-negative JSON integer that fits in int64 (shape dims and offsets must be).
std::optional<uint64_t> as_count(const json& v) {
  if (!v.is_number_unsigned()) return std::nullopt;
  uint64_t x = v.get<uint64_t>();
  if (x > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
  return x;
}

TensorInfo parse_entry(const std::string& where, const std::string& name, const json& e,
                       const uint8_t* data_section, uint64_t data_size) {
  auto fail = [&](std::string_view what) {
    return Error(fmt::format("safetensors '{}': tensor '{}': {}", where, name, what));
  };
  if (name.empty()) throw fail("empty tensor name");
  if (!e.is_object()) throw fail("header entry is not a JSON object");

  TensorInfo t;
  t.name = name;

  auto it = e.find("dtype");
  if (it == e.end() || !it->is_string()) throw fail("missing or non-string \"dtype\"");
  auto type = parse_elem_type(it->get_ref<const std::string&>());
  if (!type)
    throw fail(fmt::format("unknown dtype '{}' (known: F64 F32 F16 BF16 I64 I32 I16 I8 U8)",
                           it->get_ref<const std::string&>()));
  t.type = *type;

  it = e.find("shape");
  if (it == e.end() || !it->is_array()) throw fail("missing or non-array \"shape\"");
  // NOTE: the element count is computed in uint64 with overflow checks: a header
  // can claim dims whose product wraps around and then "matches" a tiny byte range.
  uint64_t n_elems = 1;
  bool overflow = false;
  for (const auto& d : *it) {
    auto dim = as_count(d);
    if (!dim) throw fail(fmt::format("shape entry {} is not a non-negative integer", d.dump()));
    t.shape.push_back(static_cast<int64_t>(*dim));
    overflow |= __builtin_mul_overflow(n_elems, *dim, &n_elems);
  }
  uint64_t n_bytes = 0;
  overflow |= __builtin_mul_overflow(n_elems, static_cast<uint64_t>(elem_type_size(t.type)),
                                     &n_bytes);
  if (overflow) throw fail(fmt::format("shape {} overflows", it->dump()));

  it = e.find("data_offsets");
  if (it == e.end() || !it->is_array() || it->size() != 2)
    throw fail("\"data_offsets\" must be an array of two integers");
  auto begin = as_count((*it)[0]);
  auto end = as_count((*it)[1]);
  if (!begin || !end)
    throw fail(fmt::format("data_offsets {} are not non-negative integers", it->dump()));
  if (*begin > *end) throw fail(fmt::format("data_offsets begin {} > end {}", *begin, *end));
  if (*end > data_size)
    throw fail(fmt::format("data_offsets end {} is past the data section ({} bytes)", *end,
                           data_size));
  t.begin = *begin;
  t.end = *end;
  if (t.n_bytes() != n_bytes)
    throw fail(fmt::format("byte range is {} bytes but shape {} of {} needs {}", t.n_bytes(),
                           json(t.shape).dump(), elem_type_name(t.type), n_bytes));
  t.data = data_section + t.begin;
  return t;
}

}  // namespace

std::string_view elem_type_name(ElemType t) { return row_of(t).name; }
int64_t elem_type_size(ElemType t) { return row_of(t).size; }

std::optional<DType> elem_type_dtype(ElemType t) {
  switch (t) {
    case ElemType::F64: return DType::F64;
    case ElemType::F32: return DType::F32;
    case ElemType::F16: return DType::F16;
    case ElemType::BF16: return DType::BF16;
    case ElemType::I64: return DType::I64;
    case ElemType::I32: return DType::I32;
    case ElemType::I16: return DType::I16;
    case ElemType::I8: return DType::I8;
    case ElemType::U8: return std::nullopt;
  }
  return std::nullopt;
}

bool is_weight_type(ElemType t) {
  return t == ElemType::F32 || t == ElemType::F16 || t == ElemType::BF16;
}

int64_t TensorInfo::n_elems() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;  // cannot overflow: checked at parse time
  return n;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto file = std::make_shared<MappedFile>(MappedFile::open(path));
  SafetensorsFile f = parse(file->data(), file->size(), path);
  f.file_ = std::move(file);
  return f;
}

SafetensorsFile SafetensorsFile::parse(const uint8_t* data, size_t size, std::string name) {
  auto fail = [&](std::string_view what) {
    return Error(fmt::format("safetensors '{}': {}", name, what));
  };
  if (size < 8)
    throw fail(fmt::format("truncated: {} bytes, too small for the 8-byte header length", size));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];  // little-endian
  if (header_len > kMaxHeaderBytes)
    throw fail(fmt::format("header length {} exceeds the {} byte limit", header_len,
                           kMaxHeaderBytes));
  if (header_len > size - 8)
    throw fail(fmt::format("header length {} runs past the end of the file ({} bytes)",
                           header_len, size));

  const char* header_begin = reinterpret_cast<const char*>(data + 8);
  json header;
  try {
    header = json::parse(header_begin, header_begin + header_len);
  } catch (const json::exception& e) {
    throw fail(fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!header.is_object()) throw fail("header is not a JSON object");

  SafetensorsFile f;
  f.path_ = name;
  const uint8_t* data_section = data + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) throw fail("\"__metadata__\" is not a JSON object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          throw fail(fmt::format("\"__metadata__\" value of '{}' is not a string", mk));
        f.metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    f.tensors_.push_back(parse_entry(name, key, value, data_section, data_size));
  }

  // No two tensors may share bytes. Sort the ranges by start; a non-empty range
  // that starts before the furthest end seen so far overlaps an earlier one.
  std::vector<const TensorInfo*> by_begin;
  for (const auto& t : f.tensors_) by_begin.push_back(&t);
  std::sort(by_begin.begin(), by_begin.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  const TensorInfo* furthest = nullptr;
  for (const TensorInfo* t : by_begin) {
    if (t->n_bytes() == 0) continue;
    if (furthest != nullptr && t->begin < furthest->end)
      throw fail(fmt::format("tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", furthest->name,
                             furthest->begin, furthest->end, t->name, t->begin, t->end));
    if (furthest == nullptr || t->end > furthest->end) furthest = t;
  }

  for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_.emplace(f.tensors_[i].name, i);
  return f;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace dhs::safetensors
