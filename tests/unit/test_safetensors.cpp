// SafetensorsFile: valid files parse with exact shapes/offsets/data; every
// malformed header throws dhs::Error naming the file (and tensor where there is one).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/safetensors_file.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using dhs::safetensors::ElemType;
using dhs::safetensors::SafetensorsFile;

// --- a tiny safetensors writer (test-only) ---

// 8-byte little-endian header length, header, data.
std::string st_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

struct StTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// Tensors laid out back to back in the given order; header space-padded to 8 bytes.
std::string st_build(const std::vector<StTensor>& tensors, const json& metadata = nullptr) {
  json header = json::object();
  std::string data;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  if (!metadata.is_null()) header["__metadata__"] = metadata;
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  return st_bytes(h, data);
}

template <typename T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

SafetensorsFile parse(const std::string& bytes, const std::string& name = "t.safetensors") {
  return SafetensorsFile::parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                name);
}

// Runs f, expects dhs::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no dhs::Error thrown; expected one mentioning '" << parts.front() << "'";
  } catch (const dhs::Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg;
  }
}

// A header with one entry `entry` for tensor "w", plus `data_len` zero bytes of data.
std::string one_entry(const json& entry, size_t data_len) {
  json h = {{"w", entry}};
  return st_bytes(h.dump(), std::string(data_len, '\0'));
}

// --- valid files ---

TEST(Safetensors, ParsesShapesOffsetsDataAndMetadata) {
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<uint16_t> b = {0x3c00, 0x4000, 0x4200, 0x4400};  // fp16 1, 2, 3, 4
  std::vector<uint16_t> c = {0x3f80};                          // bf16 1.0, scalar
  std::vector<int32_t> d = {7, -7};
  std::string bytes = st_build({{"a", "F32", {2, 3}, raw(a)},
                                {"b", "F16", {4}, raw(b)},
                                {"c", "BF16", {}, raw(c)},
                                {"d", "I32", {2}, raw(d)},
                                {"e", "U8", {0, 5}, ""}},
                               {{"format", "pt"}});
  auto f = parse(bytes);
  ASSERT_EQ(f.tensors().size(), 5u);
  EXPECT_EQ(f.metadata().at("format"), "pt");

  const auto* ta = f.find("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->type, ElemType::F32);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ta->begin, 0u);
  EXPECT_EQ(ta->end, 24u);
  EXPECT_EQ(ta->n_elems(), 6);
  std::vector<float> back(6);
  std::memcpy(back.data(), ta->data, 24);
  EXPECT_EQ(back, a);

  const auto* tb = f.find("b");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->type, ElemType::F16);
  EXPECT_EQ(tb->begin, 24u);
  EXPECT_EQ(std::memcmp(tb->data, b.data(), 8), 0);

  const auto* tc = f.find("c");
  ASSERT_NE(tc, nullptr);
  EXPECT_EQ(tc->type, ElemType::BF16);
  EXPECT_TRUE(tc->shape.empty());
  EXPECT_EQ(tc->n_elems(), 1);
  EXPECT_EQ(tc->n_bytes(), 2u);

  const auto* td = f.find("d");
  ASSERT_NE(td, nullptr);
  EXPECT_EQ(td->type, ElemType::I32);
  EXPECT_FALSE(dhs::safetensors::is_weight_type(td->type));
  EXPECT_EQ(dhs::safetensors::elem_type_dtype(td->type), dhs::DType::I32);

  const auto* te = f.find("e");
  ASSERT_NE(te, nullptr);
  EXPECT_EQ(te->n_elems(), 0);
  EXPECT_EQ(te->n_bytes(), 0u);
  EXPECT_FALSE(dhs::safetensors::elem_type_dtype(te->type).has_value());

  EXPECT_EQ(f.find("missing"), nullptr);
}

TEST(Safetensors, EmptyHeaderAndUnpaddedHeader) {
  EXPECT_TRUE(parse(st_bytes("{}", "")).tensors().empty());
  // Header length not a multiple of 8: data pointers are unaligned but valid.
  std::vector<float> a = {3.5f};
  json h = {{"x", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}}};
  std::string hs = h.dump() + " ";
  if (hs.size() % 8 == 0) hs += " ";
  std::string bytes = st_bytes(hs, raw(a));  // parse() does not copy: keep the buffer
  auto f = parse(bytes);
  float v = 0;
  std::memcpy(&v, f.find("x")->data, 4);
  EXPECT_EQ(v, 3.5f);
}

TEST(Safetensors, OpenFromFile) {
  fs::path p =
      fs::temp_directory_path() / ("dhs_st_" + std::to_string(::getpid()) + ".safetensors");
  std::vector<float> a = {1, 2};
  {
    std::ofstream out(p, std::ios::binary);
    std::string bytes = st_build({{"w", "F32", {2}, raw(a)}});
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  auto f = SafetensorsFile::open(p.string());
  EXPECT_EQ(f.path(), p.string());
  ASSERT_NE(f.find("w"), nullptr);
  float v[2];
  std::memcpy(v, f.find("w")->data, 8);
  EXPECT_EQ(v[1], 2.0f);
  // The mapping outlives moves of the file object.
  SafetensorsFile g = std::move(f);
  std::memcpy(v, g.find("w")->data, 8);
  EXPECT_EQ(v[0], 1.0f);

  // An empty file is a truncated file, reported with its path.
  { std::ofstream out(p, std::ios::binary | std::ios::trunc); }
  expect_error([&] { SafetensorsFile::open(p.string()); }, {p.string(), "truncated"});
  fs::remove(p);
  expect_error([&] { SafetensorsFile::open(p.string()); }, {"cannot open", p.string()});
}

// --- malformed files ---

TEST(SafetensorsMalformed, TruncatedHeaderLength) {
  expect_error([] { parse(std::string("\x05\x00\x00", 3)); }, {"t.safetensors", "truncated"});
}

TEST(SafetensorsMalformed, HeaderLengthBeyondFile) {
  std::string bytes = st_bytes("{}", "");
  bytes[0] = 100;  // claims 100 header bytes, file has 2
  expect_error([&] { parse(bytes); }, {"t.safetensors", "header length 100", "past the end"});
}

TEST(SafetensorsMalformed, HeaderLengthOverLimit) {
  std::string bytes = st_bytes("{}", "");
  bytes[7] = 0x01;  // 2^56 + 2
  expect_error([&] { parse(bytes); }, {"exceeds", "100000000"});
}

TEST(SafetensorsMalformed, BadJson) {
  expect_error([] { parse(st_bytes("{\"w\": {\"dtype\": ", "")); }, {"t.safetensors", "not valid JSON"});
  expect_error([] { parse(st_bytes("[1, 2]", "")); }, {"not a JSON object"});
}

TEST(SafetensorsMalformed, OffsetsPastEof) {
  json e = {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}};
  expect_error([&] { parse(one_entry(e, 12)); },
               {"t.safetensors", "'w'", "end 16 is past the data section (12 bytes)"});
}

TEST(SafetensorsMalformed, BeginAfterEnd) {
  json e = {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {8, 4}}};
  expect_error([&] { parse(one_entry(e, 16)); }, {"'w'", "begin 8 > end 4"});
}

TEST(SafetensorsMalformed, SizeMismatch) {
  json e = {{"dtype", "F16"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}};
  expect_error([&] { parse(one_entry(e, 24)); }, {"'w'", "24 bytes", "needs 12"});
}

TEST(SafetensorsMalformed, OverlappingRanges) {
  json h = {{"a", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}}},
            {"b", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {12, 20}}}}};
  expect_error([&] { parse(st_bytes(h.dump(), std::string(20, '\0'))); },
               {"t.safetensors", "'a'", "'b'", "overlap"});
  // Identical ranges overlap too; touching ranges and empty ranges do not.
  json same = {{"a", {{"dtype", "I32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}},
               {"b", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}}};
  expect_error([&] { parse(st_bytes(same.dump(), std::string(4, '\0'))); }, {"overlap"});
  json ok = {{"a", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}},
             {"b", {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {2, 2}}}},
             {"c", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {4, 8}}}}};
  EXPECT_EQ(parse(st_bytes(ok.dump(), std::string(8, '\0'))).tensors().size(), 3u);
}

TEST(SafetensorsMalformed, UnknownDtype) {
  json e = {{"dtype", "F8_E4M3"}, {"shape", {4}}, {"data_offsets", {0, 4}}};
  expect_error([&] { parse(one_entry(e, 4)); }, {"t.safetensors", "'w'", "unknown dtype 'F8_E4M3'"});
  json e2 = {{"shape", {4}}, {"data_offsets", {0, 4}}};
  expect_error([&] { parse(one_entry(e2, 4)); }, {"'w'", "dtype"});
}

TEST(SafetensorsMalformed, BadShapes) {
  json neg = {{"dtype", "F32"}, {"shape", {-1, 4}}, {"data_offsets", {0, 0}}};
  expect_error([&] { parse(one_entry(neg, 0)); }, {"'w'", "shape entry -1"});
  json frac = {{"dtype", "F32"}, {"shape", {1.5}}, {"data_offsets", {0, 0}}};
  expect_error([&] { parse(one_entry(frac, 0)); }, {"'w'", "not a non-negative integer"});
  json notarr = {{"dtype", "F32"}, {"shape", 4}, {"data_offsets", {0, 16}}};
  expect_error([&] { parse(one_entry(notarr, 16)); }, {"'w'", "shape"});
  // 2^32 * 2^32 wraps to 0 in 64 bits; must not pass as an empty tensor.
  json wrap = {{"dtype", "U8"}, {"shape", {4294967296LL, 4294967296LL}}, {"data_offsets", {0, 0}}};
  expect_error([&] { parse(one_entry(wrap, 0)); }, {"'w'", "overflows"});
  json huge = {{"dtype", "U8"}, {"shape", {9223372036854775808ULL}}, {"data_offsets", {0, 0}}};
  expect_error([&] { parse(one_entry(huge, 0)); }, {"'w'", "shape entry"});
}

TEST(SafetensorsMalformed, BadOffsets) {
  json three = {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4, 8}}};
  expect_error([&] { parse(one_entry(three, 8)); }, {"'w'", "two integers"});
  json neg = {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {-4, 0}}};
  expect_error([&] { parse(one_entry(neg, 8)); }, {"'w'", "not non-negative integers"});
  expect_error([&] { parse(one_entry(json::array({1, 2}), 8)); }, {"'w'", "not a JSON object"});
}

TEST(SafetensorsMalformed, BadMetadata) {
  json h = {{"__metadata__", {{"format", 1}}}};
  expect_error([&] { parse(st_bytes(h.dump(), "")); }, {"__metadata__", "'format'", "not a string"});
  json h2 = {{"__metadata__", "pt"}};
  expect_error([&] { parse(st_bytes(h2.dump(), "")); }, {"__metadata__"});
}

}  // namespace
