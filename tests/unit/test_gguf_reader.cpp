// GGUF reader tests: valid files round-trip every value type, and malformed files
// (built with GgufBuilder) all throw dhs::Error naming the file and the problem.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/error.h"
#include "gguf_builder.h"
#include "model/dequant.h"
#include "model/gguf_file.h"
#include "test_paths.h"

namespace dhs::gguf {
namespace {

using test::Bytes;
using test::GgufBuilder;
using namespace test;  // GgufType ids

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
constexpr uint32_t kTypeF32 = 0, kTypeQ4_0 = 2, kTypeQ8_0 = 8;

GgufFile parse(const std::vector<uint8_t>& b) { return GgufFile::parse(b.data(), b.size(), "bad.gguf"); }

// Parsing must throw dhs::Error whose message names the file and contains `needle`.
void expect_error(const std::vector<uint8_t>& b, std::string_view needle) {
  try {
    parse(b);
    ADD_FAILURE() << "expected dhs::Error mentioning '" << needle << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg;
    EXPECT_NE(msg.find("bad.gguf"), std::string::npos) << "message does not name the file: " << msg;
  }
}

// A small valid file: every scalar value type, string/int/float/bool arrays, and three
// tensors (F32 2-D, Q8_0, F32 4-D).
GgufBuilder valid_builder() {
  GgufBuilder g;
  g.kv_string("general.architecture", "llama");
  g.kv_u32("llama.block_count", 30);
  g.kv_raw("k.u8", kU8, Bytes().u8(200).b);
  g.kv_raw("k.i8", kI8, Bytes().u8(0xFE).b);  // -2
  g.kv_raw("k.u16", kU16, Bytes().u16(60000).b);
  g.kv_raw("k.i16", kI16, Bytes().u16(0x8000).b);  // -32768
  g.kv_raw("k.i32", kI32, Bytes().i32(-123456).b);
  g.kv_raw("k.f32", kF32, Bytes().f32(0.5f).b);
  g.kv_raw("k.bool", kBool, Bytes().u8(1).b);
  g.kv_raw("k.u64", kU64, Bytes().u64(kU64Max).b);
  g.kv_raw("k.i64", kI64, Bytes().u64(static_cast<uint64_t>(-5)).b);
  g.kv_raw("k.f64", kF64, Bytes().f64(1e-300).b);
  g.kv_array("k.strings", kString, 3, Bytes().str("a").str("").str("xyz").b);
  g.kv_array("k.ints", kI32, 2, Bytes().i32(-1).i32(7).b);
  g.kv_array("k.floats", kF32, 2, Bytes().f32(1.5f).f32(-2.f).b);
  g.kv_array("k.bools", kBool, 2, Bytes().u8(0).u8(1).b);
  g.kv_array("k.empty", kString, 0, {});
  g.tensor_f32("a.weight", {4, 2});
  Bytes q8;  // one Q8_0 block: d = 1.0 (fp16 0x3c00), q = 0..31
  q8.u16(0x3c00);
  for (int i = 0; i < 32; ++i) q8.u8(static_cast<uint8_t>(i));
  g.tensor({"b.weight", {32}, kTypeQ8_0, q8.b, {}, {}});
  g.tensor_f32("c.weight", {1, 2, 1, 3});
  return g;
}

// ---- valid files ------------------------------------------------------------------

TEST(GgufReader, ParsesEveryValueType) {
  GgufBuilder g = valid_builder();
  const std::vector<uint8_t> b = g.build();
  const GgufFile f = GgufFile::parse(b.data(), b.size());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.metadata().size(), 17u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_u64("llama.block_count"), 30u);
  EXPECT_EQ(f.at("k.u8").as_u64("k.u8"), 200u);
  EXPECT_EQ(f.at("k.i8").as_i64("k.i8"), -2);
  EXPECT_EQ(f.at("k.u16").as_u64("k.u16"), 60000u);
  EXPECT_EQ(f.at("k.i16").as_i64("k.i16"), -32768);
  EXPECT_EQ(f.at("k.i32").as_i64("k.i32"), -123456);
  EXPECT_EQ(f.at("k.f32").as_f64("k.f32"), 0.5);
  EXPECT_TRUE(f.at("k.bool").as_bool("k.bool"));
  EXPECT_EQ(f.at("k.u64").as_u64("k.u64"), kU64Max);
  EXPECT_EQ(f.at("k.i64").as_i64("k.i64"), -5);
  EXPECT_EQ(f.get_f64("k.f64"), 1e-300);
  EXPECT_EQ(f.at("k.strings").as_strings("k.strings"), (std::vector<std::string>{"a", "", "xyz"}));
  EXPECT_EQ(f.at("k.ints").as_ints("k.ints"), (std::vector<int64_t>{-1, 7}));
  EXPECT_EQ(f.at("k.floats").as_floats("k.floats"), (std::vector<double>{1.5, -2.0}));
  EXPECT_EQ(f.at("k.bools").as_ints("k.bools"), (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(f.at("k.empty").as_strings("k.empty").empty());
  EXPECT_TRUE(f.at("k.ints").is_array());
  EXPECT_EQ(f.at("k.ints").elem_type, ValueType::I32);
  EXPECT_EQ(f.at("k.u16").type, ValueType::U16);
}

TEST(GgufReader, TensorInfosAndData) {
  GgufBuilder g = valid_builder();
  const std::vector<uint8_t> b = g.build();
  const GgufFile f = GgufFile::parse(b.data(), b.size());
  ASSERT_EQ(f.tensors().size(), 3u);
  const TensorInfo* a = f.find_tensor("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->ne, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(a->shape(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(a->n_elems(), 8);
  EXPECT_EQ(a->n_bytes, 32u);
  EXPECT_EQ(a->offset, 0u);
  EXPECT_EQ(a->data, b.data() + g.data_start());
  float x[8];
  dequantize_row(a->type, a->data, x, 8);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(x[i], static_cast<float>(i));

  const TensorInfo* q = f.find_tensor("b.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, DType::Q8_0);
  EXPECT_EQ(q->n_bytes, 34u);
  EXPECT_EQ(q->offset, 32u);  // 32 bytes of a.weight, already aligned
  EXPECT_EQ(q->data - b.data(), static_cast<ptrdiff_t>(g.data_start() + 32));

  const TensorInfo* c = f.find_tensor("c.weight");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->offset, 96u);  // 32 + 34 rounded up to 32
  EXPECT_EQ(c->shape(), (std::vector<int64_t>{3, 1, 2, 1}));
  EXPECT_EQ(f.find_tensor("missing"), nullptr);
  EXPECT_EQ(g.data_start() % 32, 0u);
}

TEST(GgufReader, AccessorsCheckTypesAndDefaults) {
  GgufBuilder g = valid_builder();
  const std::vector<uint8_t> b = g.build();
  const GgufFile f = GgufFile::parse(b.data(), b.size(), "valid.gguf");
  EXPECT_EQ(f.find("nope"), nullptr);
  EXPECT_EQ(f.get_u64("nope", 7), 7u);
  EXPECT_EQ(f.get_string("nope", "dflt"), "dflt");
  EXPECT_EQ(f.get_f64("nope", 2.5), 2.5);
  EXPECT_EQ(f.get_f64("llama.block_count"), 30.0);  // integers widen to double
  try {
    f.get_u64("nope");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing metadata key 'nope'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("valid.gguf"), std::string::npos) << e.what();
  }
  try {
    f.get_u64("general.architecture");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("valid.gguf: metadata key 'general.architecture' has type string"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(f.get_string("llama.block_count"), Error);
  EXPECT_THROW(f.at("k.i64").as_u64("k.i64"), Error);     // negative
  EXPECT_THROW(f.at("k.u64").as_i64("k.u64"), Error);     // > INT64_MAX
  EXPECT_THROW(f.at("k.ints").as_strings("k.ints"), Error);
  EXPECT_THROW(f.at("k.strings").as_ints("k.strings"), Error);
  EXPECT_THROW(f.at("k.ints").as_u64("k.ints"), Error);
  EXPECT_THROW(f.at("k.f32").as_bool("k.f32"), Error);
  EXPECT_THROW(f.at("k.floats").as_ints("k.floats"), Error);
}

TEST(GgufReader, Version2AndCustomAlignment) {
  GgufBuilder g;
  g.version = 2;
  g.alignment = 64;
  g.kv_u32("general.alignment", 64);
  g.tensor_f32("x", {3});
  g.tensor_f32("y", {5});
  const std::vector<uint8_t> b = g.build();
  const GgufFile f = GgufFile::parse(b.data(), b.size());
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(g.data_start() % 64, 0u);
  EXPECT_EQ(f.find_tensor("y")->offset, 64u);
  EXPECT_EQ(f.find_tensor("y")->data, b.data() + g.data_start() + 64);
}

TEST(GgufReader, NoTensorsNeedsNoPadding) {
  GgufBuilder g;
  g.kv_u32("a", 1);
  const std::vector<uint8_t> b = g.build();
  ASSERT_NE(b.size() % 32, 0u);
  const GgufFile f = GgufFile::parse(b.data(), b.size());
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(f.get_u64("a"), 1u);
}

TEST(GgufReader, OpenKeepsMappingAlive) {
  GgufBuilder g = valid_builder();
  const std::vector<uint8_t> b = g.build();
  const std::string path =
      (std::filesystem::temp_directory_path() / ("dhs_gguf_test_" + std::to_string(::getpid()) + ".gguf")).string();
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  }
  std::optional<GgufFile> moved;
  {
    GgufFile f = GgufFile::open(path);
    EXPECT_EQ(f.path(), path);
    moved.emplace(std::move(f));
  }
  std::filesystem::remove(path);  // the mapping outlives the directory entry
  const TensorInfo* c = moved->find_tensor("c.weight");
  ASSERT_NE(c, nullptr);
  float x[6];
  dequantize_row(c->type, c->data, x, 6);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(x[i], static_cast<float>(i));
  EXPECT_THROW(GgufFile::open(path), Error);  // now gone
}

// ---- malformed files --------------------------------------------------------------

TEST(GgufMalformed, EveryTruncationThrows) {
  GgufBuilder g = valid_builder();
  const std::vector<uint8_t> b = g.build();
  ASSERT_NO_THROW(parse(b));
  for (size_t len = 0; len < b.size(); ++len) {
    // A fresh copy of exactly `len` bytes so ASan catches any read past the prefix.
    const std::vector<uint8_t> prefix(b.begin(), b.begin() + static_cast<ptrdiff_t>(len));
    EXPECT_THROW(GgufFile::parse(prefix.data(), prefix.size(), "bad.gguf"), Error) << "prefix length " << len;
  }
}

TEST(GgufMalformed, EmptyAndTinyFiles) {
  expect_error({}, "not a GGUF file");
  expect_error({'G', 'G'}, "not a GGUF file");
  EXPECT_THROW(GgufFile::parse(nullptr, 0, "bad.gguf"), Error);
}

TEST(GgufMalformed, WrongMagic) {
  GgufBuilder g = valid_builder();
  g.magic = 0x4655474c;  // "LGUF"
  expect_error(g.build(), "bad magic");
}

TEST(GgufMalformed, Version1) {
  GgufBuilder g = valid_builder();
  g.version = 1;
  expect_error(g.build(), "version 1 is not supported");
}

TEST(GgufMalformed, Version4AndUp) {
  for (uint32_t v : {0u, 4u, 5u, 0xFFFFFFFFu}) {
    GgufBuilder g = valid_builder();
    g.version = v;
    expect_error(g.build(), "unsupported GGUF version " + std::to_string(v));
  }
}

TEST(GgufMalformed, BigEndianFile) {
  GgufBuilder g = valid_builder();
  g.version = 0x03000000;
  expect_error(g.build(), "big-endian");
}

TEST(GgufMalformed, NKvOutOfRange) {
  for (uint64_t n : {kU64Max, uint64_t{1} << 40, uint64_t{100000}}) {
    GgufBuilder g = valid_builder();
    g.n_kv = n;
    expect_error(g.build(), "n_kv " + std::to_string(n));
  }
  GgufBuilder g = valid_builder();  // one more than present: runs into the tensor infos
  g.n_kv = 18;
  EXPECT_THROW(parse(g.build()), Error);
}

TEST(GgufMalformed, NTensorsOutOfRange) {
  for (uint64_t n : {kU64Max, uint64_t{1} << 40, uint64_t{100000}}) {
    GgufBuilder g = valid_builder();
    g.n_tensors = n;
    expect_error(g.build(), "n_tensors " + std::to_string(n));
  }
  GgufBuilder g = valid_builder();
  g.n_tensors = 4;  // one more than present: parses tensor data as a tensor info
  EXPECT_THROW(parse(g.build()), Error);
}

TEST(GgufMalformed, KeyLengthOutOfRange) {
  GgufBuilder g = valid_builder();
  std::vector<uint8_t> b = g.build();
  // The first key length sits right after the 24-byte header.
  for (uint64_t len : {kU64Max, uint64_t{1} << 32, uint64_t{b.size()}}) {
    std::memcpy(b.data() + 24, &len, 8);
    expect_error(b, "string length " + std::to_string(len));
  }
}

TEST(GgufMalformed, KeyTooLongOrEmpty) {
  GgufBuilder g;
  g.kv_u32(std::string(65536, 'k'), 1);
  expect_error(g.build(), "exceeds the limit of 65535");
  GgufBuilder e;
  e.kv_u32("", 1);
  expect_error(e.build(), "empty key");
}

TEST(GgufMalformed, StringValueLengthOutOfRange) {
  GgufBuilder g;
  g.kv_raw("general.name", kString, Bytes().u64(kU64Max - 3).raw({'a', 'b'}).b);
  expect_error(g.build(), "general.name");
  GgufBuilder h;
  h.kv_raw("general.name", kString, Bytes().u64(3).raw({'a', 'b'}).b);  // one byte short
  expect_error(h.build(), "string length 3 exceeds the 2 bytes left");
}

TEST(GgufMalformed, ArrayLengthOutOfRange) {
  for (uint64_t n : {kU64Max, uint64_t{1} << 61, uint64_t{1000}}) {
    GgufBuilder g;
    g.kv_array("tokenizer.ggml.token_type", kI32, n, Bytes().i32(1).i32(2).b);
    expect_error(g.build(), "array length " + std::to_string(n));
  }
  // String arrays: each element needs at least its 8-byte length.
  GgufBuilder s;
  s.kv_array("tokenizer.ggml.tokens", kString, 4, Bytes().str("a").str("b").b);
  expect_error(s.build(), "array length 4");
}

TEST(GgufMalformed, StringArrayElementTruncated) {
  GgufBuilder g;
  g.kv_array("tokenizer.ggml.tokens", kString, 2, Bytes().str("a").u64(1000).raw({'b', 'c'}).b);
  expect_error(g.build(), "tokenizer.ggml.tokens");
}

TEST(GgufMalformed, NestedArray) {
  GgufBuilder g;
  g.kv_array("k", kArray, 1, Bytes().u32(kU8).u64(1).u8(1).b);
  expect_error(g.build(), "nested arrays");
}

TEST(GgufMalformed, UnknownValueType) {
  for (uint32_t t : {13u, 100u, 0xFFFFFFFFu}) {
    GgufBuilder g;
    g.kv_raw("general.thing", t, Bytes().u64(0).b);
    expect_error(g.build(), "unknown value type " + std::to_string(t));
  }
}

TEST(GgufMalformed, UnknownArrayElementType) {
  GgufBuilder g;
  g.kv_array("k", 13, 1, Bytes().u64(0).b);
  expect_error(g.build(), "unknown array element type 13");
}

TEST(GgufMalformed, BoolNotZeroOrOne) {
  GgufBuilder g;
  g.kv_raw("tokenizer.ggml.add_bos_token", kBool, Bytes().u8(2).b);
  expect_error(g.build(), "bool value 2");
}

TEST(GgufMalformed, U64ArrayElementBeyondInt64) {
  GgufBuilder g;
  g.kv_array("k", kU64, 1, Bytes().u64(kU64Max).b);
  expect_error(g.build(), "does not fit in int64");
}

TEST(GgufMalformed, DuplicateKeys) {
  GgufBuilder g = valid_builder();
  g.kv_u32("llama.block_count", 31);
  expect_error(g.build(), "duplicate metadata key 'llama.block_count'");
}

TEST(GgufMalformed, NDimsOutOfRange) {
  for (uint32_t n : {0u, 5u, 0xFFFFFFFFu}) {
    GgufBuilder g = valid_builder();
    g.tensors()[0].n_dims = n;
    expect_error(g.build(), "n_dims " + std::to_string(n) + " out of range");
  }
}

TEST(GgufMalformed, ZeroDimension) {
  GgufBuilder g = valid_builder();
  g.tensors()[2].ne = {1, 2, 0, 3};
  expect_error(g.build(), "ne[2] is 0");
}

TEST(GgufMalformed, HugeDimension) {
  GgufBuilder g = valid_builder();
  g.tensors()[0].ne = {4, uint64_t{1} << 63};
  expect_error(g.build(), "ne[1] = 9223372036854775808 does not fit in int64");
}

TEST(GgufMalformed, ElementCountOverflow) {
  GgufBuilder g = valid_builder();
  g.tensors()[0].ne = {uint64_t{1} << 32, uint64_t{1} << 31};
  expect_error(g.build(), "element count overflows int64");
}

TEST(GgufMalformed, ByteSizeOverflow) {
  // 2^61 F32 elements fit in int64 but 2^63 bytes do not.
  GgufBuilder g = valid_builder();
  g.tensors()[0].ne = {uint64_t{1} << 31, uint64_t{1} << 30};
  expect_error(g.build(), "byte size overflows");
}

TEST(GgufMalformed, UnknownTensorType) {
  for (uint32_t t : {4u, 5u, 31u, 1000u}) {  // 4, 5: retired Q4_2 / Q4_3
    GgufBuilder g = valid_builder();
    g.tensors()[0].type = t;
    expect_error(g.build(), "unknown tensor type " + std::to_string(t));
  }
}

TEST(GgufMalformed, RowNotMultipleOfBlock) {
  GgufBuilder g = valid_builder();
  g.tensors()[1].ne = {16, 2};  // Q8_0: 32-element blocks; still 34 bytes of data
  expect_error(g.build(), "ne[0] = 16 is not a multiple of the Q8_0 block size 32");
  GgufBuilder h = valid_builder();
  h.tensors()[1].type = kTypeQ4_0;  // keep ne 32 but the type's block is fine: control
  EXPECT_NO_THROW(parse(h.build()));
}

TEST(GgufMalformed, TensorNameTooLongOrEmpty) {
  GgufBuilder g = valid_builder();
  g.tensors()[0].name = std::string(65, 'n');
  expect_error(g.build(), "exceeds the limit of 64");
  GgufBuilder h = valid_builder();
  h.tensors()[0].name = "";
  expect_error(h.build(), "empty name");
}

TEST(GgufMalformed, MisalignedOffset) {
  GgufBuilder g = valid_builder();
  g.tensors()[1].offset = 40;
  expect_error(g.build(), "data offset 40 is not a multiple of the alignment 32");
}

TEST(GgufMalformed, BadAlignmentValue) {
  for (uint32_t a : {0u, 3u, 48u, 0xFFFFFFFFu}) {
    GgufBuilder g = valid_builder();
    g.kv_u32("general.alignment", a);
    expect_error(g.build(), "general.alignment " + std::to_string(a) + " must be a non-zero power of two");
  }
}

TEST(GgufMalformed, AlignmentWrongType) {
  GgufBuilder g = valid_builder();
  g.kv_string("general.alignment", "32");
  expect_error(g.build(), "general.alignment has type string");
  GgufBuilder h = valid_builder();
  h.kv_raw("general.alignment", kI32, Bytes().i32(-32).b);
  expect_error(h.build(), "general.alignment -32 must be a non-zero power of two");
}

TEST(GgufMalformed, TensorDataPastEof) {
  GgufBuilder g = valid_builder();
  g.tensors()[2].ne = {1, 2, 1, 4};  // 32 bytes declared, 24 written
  expect_error(g.build(), "tensor 'c.weight' data [96, +32)");
  GgufBuilder h = valid_builder();
  h.tensors()[1].offset = uint64_t{1} << 40;
  expect_error(h.build(), "extends past the end of the file");
  GgufBuilder k = valid_builder();
  k.tensors()[1].offset = kU64Max - 31;  // aligned, but offset + size wraps around
  expect_error(k.build(), "extends past the end of the file");
}

TEST(GgufMalformed, DataSectionPastEof) {
  // Tensor infos end mid-way to the next alignment boundary and the file ends there.
  GgufBuilder g;
  g.tensor_f32("x", {1});
  std::vector<uint8_t> b = g.build();
  // 24-byte header + 33-byte tensor info = 57, padded to 64.
  ASSERT_EQ(g.data_start(), 64u);
  b.resize(60);  // cut inside the padding
  expect_error(b, "data section would start at offset");
}

TEST(GgufMalformed, OverlappingTensors) {
  GgufBuilder g = valid_builder();
  g.tensors()[1].offset = 0;  // b.weight [0, 34) overlaps a.weight [0, 32)
  expect_error(g.build(), "overlap");
  GgufBuilder h = valid_builder();
  h.tensors()[0].ne = {4, 3};  // a.weight grows to [0, 48) into b.weight at 32
  h.tensors()[0].data.resize(48);
  h.tensors()[1].offset = 32;
  h.tensors()[2].offset = 96;
  expect_error(h.build(), "tensors 'a.weight' [0, 48) and 'b.weight' [32, 66) overlap");
}

TEST(GgufMalformed, DuplicateTensorNames) {
  GgufBuilder g = valid_builder();
  g.tensors()[2].name = "a.weight";
  expect_error(g.build(), "duplicate tensor name 'a.weight'");
}

// ---- the real default model ----------------------------------------------------------

TEST(GgufModel, DefaultModelMetadataAndTensors) {
  const std::string path = test::default_model_path();
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << "default model not found at " << path << " (run scripts/fetch_model.sh)";
  }
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_u64("llama.block_count"), 30u);
  EXPECT_EQ(f.get_u64("llama.embedding_length"), 576u);
  EXPECT_EQ(f.at("tokenizer.ggml.tokens").as_strings("tokenizer.ggml.tokens").size(), 49152u);
  EXPECT_EQ(f.at("tokenizer.ggml.token_type").as_ints("tokenizer.ggml.token_type").size(), 49152u);
  ASSERT_FALSE(f.tensors().empty());
  const TensorInfo* emb = f.find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->shape(), (std::vector<int64_t>{49152, 576}));

  std::vector<float> row;
  for (const TensorInfo& t : f.tensors()) {
    ASSERT_TRUE(dequant_supported(t.type)) << t.name << " has type " << dtype_traits(t.type).name;
    const int64_t n_cols = t.ne[0];
    const int64_t n_rows = t.n_elems() / n_cols;
    const size_t row_bytes = dtype_row_bytes(t.type, n_cols);
    ASSERT_EQ(row_bytes * static_cast<size_t>(n_rows), t.n_bytes) << t.name;
    row.resize(static_cast<size_t>(n_cols));
    int64_t n_bad = 0;
    for (int64_t r = 0; r < n_rows; ++r) {
      dequantize_row(t.type, t.data + static_cast<size_t>(r) * row_bytes, row.data(), n_cols);
      for (float v : row) n_bad += std::isfinite(v) ? 0 : 1;
    }
    EXPECT_EQ(n_bad, 0) << t.name << ": non-finite values";
  }
}

}  // namespace
}  // namespace dhs::gguf
